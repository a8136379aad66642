//! Skills on disk, in the Agent Skills layout: `<root>/<name>/SKILL.md` plus optional
//! `references/`, `scripts/` and `assets/` folders.

use std::collections::BTreeSet;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;

use super::front_matter::{self, FrontMatter};
use super::name::validate_description;
use super::{
    path, range, validate_skill_name, Error, ReadRange, Skill, SkillMetadata, SkillProvider,
};

/// The file that makes a folder a skill.
const SKILL_FILE: &str = "SKILL.md";

/// The folders whose files a skill exposes (Level 3). Anything else in the skill's folder,
/// `SKILL.md` included, is not readable as a resource.
const RESOURCE_DIRS: [&str; 3] = ["references", "scripts", "assets"];

/// A [`SkillProvider`] over folders on disk. Each root holds one folder per skill:
///
/// ```text
/// <root>/pdf/SKILL.md              front matter (name, description) and instructions
/// <root>/pdf/references/forms.md   files the model may read, also under scripts/ and assets/
/// ```
///
/// `SKILL.md` starts with YAML front matter between `---` lines. `name` must equal the
/// folder's name, `description` is required (plain, quoted or a `>`/`|` block), and other
/// keys (`license`, `allowed-tools`, `metadata`, ...) are ignored.
///
/// Every call reads the disk again, with no cache: an edited skill shows on the next call,
/// and listing costs one read of each `SKILL.md`. The work runs in
/// [`tokio::task::spawn_blocking`], so the futures must be awaited on a Tokio runtime.
///
/// - A skill whose `SKILL.md` is broken is left out of [`list`](SkillProvider::list) with a
///   warning, so it cannot hide the others; [`get`](SkillProvider::get) reports why.
/// - When two roots have a skill of the same name, the first root's wins, even if broken.
/// - A missing root is skipped, so that an optional folder can be configured before it exists.
/// - The roots and the skill folders in them are trusted configuration and may be symlinks.
///   Inside a skill, symlinks are refused (`SKILL.md`) or left out (resources), so a skill
///   cannot expose a file outside its folder.
///
/// ```
/// use dormant::skills::{FsSkills, ReadRange, SkillProvider};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let root = tempfile::tempdir()?;
/// std::fs::create_dir_all(root.path().join("pdf/references"))?;
/// std::fs::write(
///     root.path().join("pdf/SKILL.md"),
///     "---\nname: pdf\ndescription: Fills PDF forms.\n---\n\nRead references/forms.md.\n",
/// )?;
/// std::fs::write(root.path().join("pdf/references/forms.md"), "one\ntwo\nthree\n")?;
///
/// let skills = FsSkills::new([root.path()]);
/// assert_eq!(skills.list().await?[0].description, "Fills PDF forms.");
/// let skill = skills.get("pdf").await?.ok_or("no pdf skill")?;
/// assert_eq!(skill.resources, ["references/forms.md"]);
/// let lines = skills.read_resource("pdf", "references/forms.md", Some(ReadRange::lines(2, 3)));
/// assert_eq!(lines.await?.as_deref(), Some("two\nthree"));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct FsSkills {
    roots: Arc<[PathBuf]>,
}

impl FsSkills {
    /// A provider over `roots`, searched in order. Nothing is read until the first call.
    pub fn new(roots: impl IntoIterator<Item = impl Into<PathBuf>>) -> Self {
        Self {
            roots: roots.into_iter().map(Into::into).collect(),
        }
    }

    /// The roots, in search order.
    ///
    /// ```
    /// use std::path::PathBuf;
    /// use dormant::skills::FsSkills;
    ///
    /// let skills = FsSkills::new(["/srv/skills", "/home/me/.skills"]);
    /// assert_eq!(skills.roots()[0], PathBuf::from("/srv/skills"));
    /// ```
    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }
}

impl SkillProvider for FsSkills {
    fn list(&self) -> BoxFuture<'static, Result<Vec<SkillMetadata>, Error>> {
        let roots = Arc::clone(&self.roots);
        Box::pin(blocking(move || list(&roots)))
    }

    fn get(&self, name: &str) -> BoxFuture<'static, Result<Option<Skill>, Error>> {
        let roots = Arc::clone(&self.roots);
        let name = name.to_owned();
        Box::pin(blocking(move || get(&roots, &name)))
    }

    fn read_resource(
        &self,
        name: &str,
        path: &str,
        range: Option<ReadRange>,
    ) -> BoxFuture<'static, Result<Option<String>, Error>> {
        let roots = Arc::clone(&self.roots);
        let (name, path) = (name.to_owned(), path.to_owned());
        Box::pin(blocking(move || read(&roots, &name, &path, range)))
    }
}

/// Runs file system work off the async threads: `std::fs` blocks, and tokio's `fs` feature
/// (which would do the same thing) is not enabled.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| Error::TaskFailed {
            message: error.to_string(),
        })?
}

fn list(roots: &[PathBuf]) -> Result<Vec<SkillMetadata>, Error> {
    let mut seen = BTreeSet::new();
    let mut skills = Vec::new();
    for root in roots {
        let entries = match fs::read_dir(root) {
            Ok(entries) => entries,
            Err(error) if error.kind() == ErrorKind::NotFound => {
                tracing::debug!(root = %root.display(), "skills.root_missing");
                continue;
            }
            Err(error) => return Err(Error::io(root, &error)),
        };
        for entry in entries {
            let entry = entry.map_err(|error| Error::io(root, &error))?;
            let Ok(name) = entry.file_name().into_string() else {
                tracing::warn!(path = %entry.path().display(), "skills.name_not_utf8");
                continue;
            };
            let dir = entry.path();
            // A folder without SKILL.md (or a plain file) in a root is not a skill at all.
            if !has_skill_file(&dir) || !seen.insert(name.clone()) {
                continue;
            }
            match load(&dir, &name) {
                Ok(skill) => skills.push(SkillMetadata::new(skill.name, skill.description)),
                Err(error) => tracing::warn!(skill = %name, %error, "skills.skipped"),
            }
        }
    }
    skills.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(skills)
}

fn get(roots: &[PathBuf], name: &str) -> Result<Option<Skill>, Error> {
    validate_skill_name(name)?;
    let Some(dir) = locate(roots, name) else {
        return Ok(None);
    };
    let skill = load(&dir, name)?;
    Ok(Some(Skill {
        name: skill.name,
        description: skill.description,
        body: skill.body,
        resources: resources(&dir)?,
    }))
}

fn read(
    roots: &[PathBuf],
    name: &str,
    path: &str,
    range: Option<ReadRange>,
) -> Result<Option<String>, Error> {
    validate_skill_name(name)?;
    let segments = path::segments(name, path)?;
    if segments.len() < 2 || !RESOURCE_DIRS.contains(&segments[0]) {
        return Err(Error::PathEscapesSkill {
            skill: name.to_owned(),
            path: path.to_owned(),
            reason: "is not under references/, scripts/ or assets/",
        });
    }
    let Some(dir) = locate(roots, name) else {
        return Ok(None);
    };
    // A broken skill is broken for every level, as `get` reports it.
    load(&dir, name)?;
    let mut file = dir.clone();
    for (index, segment) in segments.iter().enumerate() {
        file.push(segment);
        let meta = match fs::symlink_metadata(&file) {
            Ok(meta) => meta,
            Err(error) if error.kind() == ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(Error::io(&file, &error)),
        };
        // Checking each component without following links is what keeps the read inside
        // the skill: the lexical check alone cannot see a link in the tree.
        if meta.file_type().is_symlink() {
            return Err(Error::PathEscapesSkill {
                skill: name.to_owned(),
                path: path.to_owned(),
                reason: "goes through a symlink",
            });
        }
        let last = index + 1 == segments.len();
        if (last && !meta.is_file()) || (!last && !meta.is_dir()) {
            return Ok(None);
        }
    }
    if !file.starts_with(&dir) {
        return Err(Error::PathEscapesSkill {
            skill: name.to_owned(),
            path: path.to_owned(),
            reason: "is outside the skill's folder",
        });
    }
    let bytes = fs::read(&file).map_err(|error| Error::io(&file, &error))?;
    let text = String::from_utf8(bytes).map_err(|_| Error::NotUtf8 { path: file })?;
    range::select(text, range).map(Some)
}

fn has_skill_file(dir: &Path) -> bool {
    fs::symlink_metadata(dir.join(SKILL_FILE)).is_ok()
}

/// The folder of the skill `name`: the first root that has `<name>/SKILL.md`, valid or not.
/// `name` is valid, so joining it cannot leave the root.
fn locate(roots: &[PathBuf], name: &str) -> Option<PathBuf> {
    roots
        .iter()
        .map(|root| root.join(name))
        .find(|dir| has_skill_file(dir))
}

/// Reads and checks `dir/SKILL.md` for the skill `name`.
fn load(dir: &Path, name: &str) -> Result<FrontMatter, Error> {
    let path = dir.join(SKILL_FILE);
    let invalid = |reason: String| Error::InvalidSkillFile {
        path: path.clone(),
        reason,
    };
    let meta = fs::symlink_metadata(&path).map_err(|error| Error::io(&path, &error))?;
    if meta.file_type().is_symlink() {
        return Err(invalid("is a symlink".to_owned()));
    }
    if !meta.is_file() {
        return Err(invalid("is not a file".to_owned()));
    }
    let bytes = fs::read(&path).map_err(|error| Error::io(&path, &error))?;
    let text = String::from_utf8(bytes).map_err(|_| invalid("is not utf-8 text".to_owned()))?;
    let skill = front_matter::parse(&text).map_err(invalid)?;
    validate_skill_name(&skill.name).map_err(|error| invalid(error.to_string()))?;
    if skill.name != name {
        return Err(invalid(format!(
            "name {:?} does not match its folder {name:?}",
            skill.name
        )));
    }
    validate_description(name, &skill.description).map_err(|error| invalid(error.to_string()))?;
    Ok(skill)
}

/// The files under the skill's resource folders, as sorted relative paths with `/`.
fn resources(dir: &Path) -> Result<Vec<String>, Error> {
    let mut found = Vec::new();
    for sub in RESOURCE_DIRS {
        let path = dir.join(sub);
        match fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => walk(&path, sub, &mut found)?,
            Ok(_) => {}
            Err(error) if error.kind() == ErrorKind::NotFound => {}
            Err(error) => return Err(Error::io(&path, &error)),
        }
    }
    found.sort();
    Ok(found)
}

/// Collects the regular files under `dir`, whose path relative to the skill is `relative`.
/// Symlinks are left out, as a read would refuse them; that also rules out cycles.
fn walk(dir: &Path, relative: &str, found: &mut Vec<String>) -> Result<(), Error> {
    let entries = fs::read_dir(dir).map_err(|error| Error::io(dir, &error))?;
    for entry in entries {
        let entry = entry.map_err(|error| Error::io(dir, &error))?;
        let Ok(name) = entry.file_name().into_string() else {
            tracing::warn!(path = %entry.path().display(), "skills.resource_name_not_utf8");
            continue;
        };
        let kind = entry
            .file_type()
            .map_err(|error| Error::io(entry.path(), &error))?;
        let path = format!("{relative}/{name}");
        if kind.is_dir() {
            walk(&entry.path(), &path, found)?;
        } else if kind.is_file() {
            found.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `text` at `root/relative`, creating the folders on the way.
    fn write(root: &Path, relative: &str, text: &str) -> anyhow::Result<()> {
        let path = root.join(relative);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(path, text)?;
        Ok(())
    }

    fn skill_file(name: &str, description: &str, body: &str) -> String {
        format!("---\nname: {name}\ndescription: {description}\n---\n\n{body}")
    }

    /// A root with two good skills, two broken ones, a folder that is no skill and a file.
    fn root() -> anyhow::Result<tempfile::TempDir> {
        let root = tempfile::tempdir()?;
        let dir = root.path();
        write(dir, "zeta/SKILL.md", &skill_file("zeta", "Last.", "Z."))?;
        write(
            dir,
            "pdf/SKILL.md",
            &skill_file(
                "pdf",
                ">\n  Fills PDF\n  forms.",
                "# PDF\nRead the reference.\n",
            ),
        )?;
        write(dir, "pdf/references/forms.md", "one\ntwo\nthree\nfour\n")?;
        write(dir, "pdf/references/deep/fields.md", "fields")?;
        write(dir, "pdf/scripts/fill.py", "print('fill')\n")?;
        write(dir, "pdf/assets/logo.txt", "logo")?;
        write(dir, "pdf/notes.txt", "not a resource")?;
        write(dir, "broken/SKILL.md", "# no front matter\n")?;
        write(dir, "mismatch/SKILL.md", &skill_file("other", "D.", ""))?;
        write(dir, "not-a-skill/readme.md", "no SKILL.md here")?;
        write(dir, "README.md", "a file in the root")?;
        Ok(root)
    }

    #[tokio::test]
    async fn list_is_sorted_and_skips_broken_skills() -> anyhow::Result<()> {
        let root = root()?;
        let list = FsSkills::new([root.path()]).list().await?;
        assert_eq!(
            list,
            vec![
                SkillMetadata::new("pdf", "Fills PDF forms."),
                SkillMetadata::new("zeta", "Last.")
            ]
        );
        Ok(())
    }

    #[tokio::test]
    async fn get_of_a_broken_skill_says_why() -> anyhow::Result<()> {
        let root = root()?;
        let skills = FsSkills::new([root.path()]);
        for (name, reason) in [("broken", "does not start"), ("mismatch", "does not match")] {
            let error = skills.get(name).await.expect_err(name);
            assert_eq!(error.code(), "invalid_skill_file", "{name}");
            assert!(error.to_string().contains(reason), "{error}");
        }
        Ok(())
    }

    #[tokio::test]
    async fn get_returns_the_body_and_the_resources() -> anyhow::Result<()> {
        let root = root()?;
        let skill = FsSkills::new([root.path()])
            .get("pdf")
            .await?
            .expect("pdf exists");
        assert_eq!(skill.body, "# PDF\nRead the reference.\n");
        assert_eq!(
            skill.resources,
            [
                "assets/logo.txt",
                "references/deep/fields.md",
                "references/forms.md",
                "scripts/fill.py"
            ]
        );
        Ok(())
    }

    #[tokio::test]
    async fn read_resource_reads_all_or_a_range() -> anyhow::Result<()> {
        let root = root()?;
        let skills = FsSkills::new([root.path()]);
        let full = skills
            .read_resource("pdf", "references/forms.md", None)
            .await?;
        assert_eq!(full.as_deref(), Some("one\ntwo\nthree\nfour\n"));
        let ranged = skills
            .read_resource("pdf", "references/forms.md", Some(ReadRange::lines(2, 3)))
            .await?;
        assert_eq!(ranged.as_deref(), Some("two\nthree"));
        let nested = skills
            .read_resource("pdf", "references/deep/fields.md", None)
            .await?;
        assert_eq!(nested.as_deref(), Some("fields"));
        let error = skills
            .read_resource("pdf", "references/forms.md", Some(ReadRange::from_line(9)))
            .await
            .expect_err("past the end");
        assert_eq!(error.code(), "invalid_range");
        Ok(())
    }

    #[tokio::test]
    async fn unknown_skills_and_files_are_none() -> anyhow::Result<()> {
        let root = root()?;
        let skills = FsSkills::new([root.path()]);
        assert_eq!(skills.get("nope").await?, None);
        assert_eq!(skills.get("not-a-skill").await?, None);
        assert_eq!(
            skills
                .read_resource("nope", "references/a.md", None)
                .await?,
            None
        );
        assert_eq!(
            skills
                .read_resource("pdf", "references/none.md", None)
                .await?,
            None
        );
        assert_eq!(
            skills.read_resource("pdf", "references/deep", None).await?,
            None
        );
        assert_eq!(
            skills
                .read_resource("pdf", "references/forms.md/x", None)
                .await?,
            None
        );
        Ok(())
    }

    #[tokio::test]
    async fn paths_that_leave_the_resource_folders_are_refused() -> anyhow::Result<()> {
        let root = root()?;
        let skills = FsSkills::new([root.path()]);
        for path in [
            "../zeta/SKILL.md",
            "/etc/passwd",
            "references/../../zeta/SKILL.md",
            "SKILL.md",
            "notes.txt",
            "references",
        ] {
            let error = skills
                .read_resource("pdf", path, None)
                .await
                .expect_err(path);
            assert_eq!(error.code(), "path_escapes_skill", "{path}");
        }
        let error = skills
            .read_resource("..", "references/forms.md", None)
            .await
            .expect_err("invalid name");
        assert_eq!(error.code(), "invalid_skill_name");
        Ok(())
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn symlinks_inside_a_skill_are_refused_and_not_listed() -> anyhow::Result<()> {
        use std::os::unix::fs::symlink;

        let root = root()?;
        let outside = tempfile::tempdir()?;
        write(outside.path(), "secret.md", "secret")?;
        let pdf = root.path().join("pdf");
        symlink(
            outside.path().join("secret.md"),
            pdf.join("references/link.md"),
        )?;
        symlink(outside.path(), pdf.join("references/linked"))?;
        symlink(outside.path(), pdf.join("scripts/loop"))?;
        let skills = FsSkills::new([root.path()]);

        for path in ["references/link.md", "references/linked/secret.md"] {
            let error = skills
                .read_resource("pdf", path, None)
                .await
                .expect_err(path);
            assert_eq!(error.code(), "path_escapes_skill", "{path}");
        }
        let skill = skills.get("pdf").await?.expect("pdf exists");
        assert!(
            skill.resources.iter().all(|path| !path.contains("link")),
            "{:?}",
            skill.resources
        );

        write(outside.path(), "SKILL.md", &skill_file("linked", "D.", ""))?;
        fs::create_dir(root.path().join("linked"))?;
        symlink(
            outside.path().join("SKILL.md"),
            root.path().join("linked/SKILL.md"),
        )?;
        let error = skills.get("linked").await.expect_err("symlinked SKILL.md");
        assert_eq!(error.code(), "invalid_skill_file");
        Ok(())
    }

    #[tokio::test]
    async fn the_first_root_wins_and_missing_roots_are_skipped() -> anyhow::Result<()> {
        let first = tempfile::tempdir()?;
        let second = tempfile::tempdir()?;
        write(first.path(), "a/SKILL.md", &skill_file("a", "First.", "1"))?;
        write(first.path(), "b/SKILL.md", "broken")?;
        write(
            second.path(),
            "a/SKILL.md",
            &skill_file("a", "Second.", "2"),
        )?;
        write(second.path(), "b/SKILL.md", &skill_file("b", "Hidden.", ""))?;
        write(second.path(), "c/SKILL.md", &skill_file("c", "Third.", ""))?;
        let missing = first.path().join("missing");
        let skills = FsSkills::new([missing.as_path(), first.path(), second.path()]);

        let list = skills.list().await?;
        assert_eq!(
            list,
            vec![
                SkillMetadata::new("a", "First."),
                SkillMetadata::new("c", "Third.")
            ]
        );
        assert_eq!(
            skills.get("a").await?.map(|skill| skill.body).as_deref(),
            Some("1")
        );
        assert_eq!(
            skills.get("b").await.expect_err("shadowed").code(),
            "invalid_skill_file"
        );
        Ok(())
    }

    #[tokio::test]
    async fn edits_show_on_the_next_call() -> anyhow::Result<()> {
        let root = root()?;
        let skills = FsSkills::new([root.path()]);
        assert_eq!(skills.list().await?.len(), 2);
        write(
            root.path(),
            "new/SKILL.md",
            &skill_file("new", "Fresh.", ""),
        )?;
        assert_eq!(skills.list().await?.len(), 3);
        Ok(())
    }

    #[tokio::test]
    async fn a_file_that_is_not_utf8_is_an_error() -> anyhow::Result<()> {
        let root = root()?;
        fs::write(
            root.path().join("pdf/assets/logo.png"),
            [0x89, b'P', 0xff, 0xfe],
        )?;
        let error = FsSkills::new([root.path()])
            .read_resource("pdf", "assets/logo.png", None)
            .await
            .expect_err("binary");
        assert_eq!(error.code(), "not_utf8");
        Ok(())
    }
}
