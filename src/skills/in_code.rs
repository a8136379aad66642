//! Skills defined in code: for tests, and for agents that ship their skills in the binary.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::{self, BoxFuture};

use super::name::validate_description;
use super::{
    path, range, validate_skill_name, Error, ReadRange, Skill, SkillMetadata, SkillProvider,
};

/// One skill written in code: a name, a description, the instructions, and the files it
/// bundles (relative path to text).
///
/// ```
/// use dormant::skills::SkillDefinition;
///
/// let pdf = SkillDefinition::new("pdf", "Fills PDF forms.", "Read references/forms.md.")
///     .resource("references/forms.md", "# Forms\n...");
/// assert_eq!(pdf.name(), "pdf");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkillDefinition {
    name: String,
    description: String,
    body: String,
    resources: BTreeMap<String, String>,
}

impl SkillDefinition {
    /// A skill without files. The name and description are checked by [`InCodeSkills::new`].
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        body: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            body: body.into(),
            resources: BTreeMap::new(),
        }
    }

    /// Adds a file at `path` (relative, with `/`, such as `"references/api.md"`); a second
    /// file at the same path replaces the first. The path is checked by [`InCodeSkills::new`].
    pub fn resource(mut self, path: impl Into<String>, text: impl Into<String>) -> Self {
        self.resources.insert(path.into(), text.into());
        self
    }

    /// The skill's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn to_skill(&self) -> Skill {
        Skill {
            name: self.name.clone(),
            description: self.description.clone(),
            body: self.body.clone(),
            resources: self.resources.keys().cloned().collect(),
        }
    }
}

/// A [`SkillProvider`] over skills defined in code, checked once when built. Cloning is cheap.
///
/// ```
/// use dormant::skills::{InCodeSkills, ReadRange, SkillDefinition, SkillProvider};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dormant::skills::Error> {
/// let skills = InCodeSkills::new([SkillDefinition::new("pdf", "Fills PDF forms.", "Steps.")
///     .resource("references/forms.md", "one\ntwo\nthree")])?;
/// assert_eq!(skills.list().await?[0].name, "pdf");
/// let text = skills.read_resource("pdf", "references/forms.md", Some(ReadRange::lines(2, 2)));
/// assert_eq!(text.await?.as_deref(), Some("two"));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct InCodeSkills {
    skills: Arc<BTreeMap<String, SkillDefinition>>,
}

impl InCodeSkills {
    /// Checks and keeps `definitions`. Descriptions are trimmed, as a `SKILL.md`'s are.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSkillName`], [`Error::InvalidDescription`], [`Error::DuplicateSkill`],
    /// and for a resource path [`Error::PathEscapesSkill`] (absolute or with `..`) or
    /// [`Error::InvalidResourcePath`] (empty, or not in normal form such as `"./a"`).
    ///
    /// ```
    /// use dormant::skills::{InCodeSkills, SkillDefinition};
    ///
    /// let twice = [SkillDefinition::new("a", "A.", ""), SkillDefinition::new("a", "B.", "")];
    /// assert_eq!(InCodeSkills::new(twice).unwrap_err().code(), "duplicate_skill");
    /// let escaping = SkillDefinition::new("a", "A.", "").resource("../x", "");
    /// assert_eq!(InCodeSkills::new([escaping]).unwrap_err().code(), "path_escapes_skill");
    /// ```
    pub fn new(definitions: impl IntoIterator<Item = SkillDefinition>) -> Result<Self, Error> {
        let mut skills = BTreeMap::new();
        for mut definition in definitions {
            validate_skill_name(&definition.name)?;
            definition.description = definition.description.trim().to_owned();
            validate_description(&definition.name, &definition.description)?;
            for resource in definition.resources.keys() {
                // One spelling per file, so that `resources` lists what a read finds.
                if path::normalize(&definition.name, resource)? != *resource {
                    return Err(Error::InvalidResourcePath {
                        skill: definition.name.clone(),
                        path: resource.clone(),
                        reason: "is not in normal form (no ., no empty segments)",
                    });
                }
            }
            if skills.contains_key(&definition.name) {
                return Err(Error::DuplicateSkill {
                    name: definition.name,
                });
            }
            skills.insert(definition.name.clone(), definition);
        }
        Ok(Self {
            skills: Arc::new(skills),
        })
    }

    fn read(
        &self,
        name: &str,
        path: &str,
        range: Option<ReadRange>,
    ) -> Result<Option<String>, Error> {
        validate_skill_name(name)?;
        let path = path::normalize(name, path)?;
        let Some(text) = self
            .skills
            .get(name)
            .and_then(|skill| skill.resources.get(&path))
        else {
            return Ok(None);
        };
        range::select(text.clone(), range).map(Some)
    }
}

impl SkillProvider for InCodeSkills {
    fn list(&self) -> BoxFuture<'static, Result<Vec<SkillMetadata>, Error>> {
        let list = self
            .skills
            .values()
            .map(|skill| SkillMetadata::new(&skill.name, &skill.description))
            .collect();
        Box::pin(future::ready(Ok(list)))
    }

    fn get(&self, name: &str) -> BoxFuture<'static, Result<Option<Skill>, Error>> {
        let skill = validate_skill_name(name)
            .map(|()| self.skills.get(name).map(SkillDefinition::to_skill));
        Box::pin(future::ready(skill))
    }

    fn read_resource(
        &self,
        name: &str,
        path: &str,
        range: Option<ReadRange>,
    ) -> BoxFuture<'static, Result<Option<String>, Error>> {
        Box::pin(future::ready(self.read(name, path, range)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skills() -> InCodeSkills {
        InCodeSkills::new([
            SkillDefinition::new("zeta", "Last.", "Z body."),
            SkillDefinition::new("pdf", "  Fills PDF forms.\n", "Read the forms reference.")
                .resource("scripts/fill.py", "print('fill')\n")
                .resource("references/forms.md", "one\ntwo\nthree\n"),
        ])
        .expect("valid skills")
    }

    #[tokio::test]
    async fn list_is_sorted_by_name_with_trimmed_descriptions() -> Result<(), Error> {
        let list = skills().list().await?;
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
    async fn get_returns_the_body_and_sorted_resources() -> Result<(), Error> {
        let skill = skills().get("pdf").await?.expect("pdf exists");
        assert_eq!(skill.body, "Read the forms reference.");
        assert_eq!(skill.resources, ["references/forms.md", "scripts/fill.py"]);
        assert_eq!(skills().get("nope").await?, None);
        Ok(())
    }

    #[tokio::test]
    async fn read_resource_reads_all_or_a_range() -> Result<(), Error> {
        let skills = skills();
        let full = skills
            .read_resource("pdf", "references/forms.md", None)
            .await?;
        assert_eq!(full.as_deref(), Some("one\ntwo\nthree\n"));
        let ranged = skills
            .read_resource(
                "pdf",
                "./references/forms.md",
                Some(ReadRange::from_line(2)),
            )
            .await?;
        assert_eq!(ranged.as_deref(), Some("two\nthree"));
        Ok(())
    }

    #[tokio::test]
    async fn unknown_skills_and_files_are_none() -> Result<(), Error> {
        let skills = skills();
        assert_eq!(
            skills
                .read_resource("nope", "references/forms.md", None)
                .await?,
            None
        );
        assert_eq!(
            skills
                .read_resource("pdf", "references/none.md", None)
                .await?,
            None
        );
        Ok(())
    }

    #[tokio::test]
    async fn traversal_and_bad_ranges_are_errors() {
        let skills = skills();
        for path in ["../x", "/etc/passwd", "references/../../x"] {
            let error = skills
                .read_resource("pdf", path, None)
                .await
                .expect_err(path);
            assert_eq!(error.code(), "path_escapes_skill", "{path}");
        }
        let error = skills
            .read_resource("pdf", "references/forms.md", Some(ReadRange::lines(9, 10)))
            .await
            .expect_err("past the end");
        assert_eq!(error.code(), "invalid_range");
        let error = skills.get("../pdf").await.expect_err("invalid name");
        assert_eq!(error.code(), "invalid_skill_name");
    }

    #[test]
    fn invalid_definitions_are_refused() {
        for (definition, code) in [
            (SkillDefinition::new("Bad", "d", ""), "invalid_skill_name"),
            (SkillDefinition::new("a", " ", ""), "invalid_description"),
            (
                SkillDefinition::new("a", "d", "").resource("/abs", ""),
                "path_escapes_skill",
            ),
            (
                SkillDefinition::new("a", "d", "").resource("references/../../x", ""),
                "path_escapes_skill",
            ),
            (
                SkillDefinition::new("a", "d", "").resource("./a", ""),
                "invalid_resource_path",
            ),
            (
                SkillDefinition::new("a", "d", "").resource("", ""),
                "invalid_resource_path",
            ),
        ] {
            let error = InCodeSkills::new([definition.clone()]).expect_err("invalid");
            assert_eq!(error.code(), code, "{definition:?}");
        }
        let twice = [
            SkillDefinition::new("a", "d", ""),
            SkillDefinition::new("a", "d", ""),
        ];
        let error = InCodeSkills::new(twice).expect_err("duplicate");
        assert_eq!(error.code(), "duplicate_skill");
    }
}
