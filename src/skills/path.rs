//! The lexical guard on resource paths, shared by every provider: a path that could name
//! something outside its skill is refused before any lookup, so the check does not depend
//! on what happens to exist on disk.

use std::path::{Component, Path};

use super::Error;

/// Splits a relative resource path into its segments, dropping empty and `.` segments.
///
/// # Errors
///
/// [`Error::PathEscapesSkill`] for an absolute path, a `..` component or a backslash (a
/// separator on Windows, refused everywhere so the rule is the same on every system), and
/// [`Error::InvalidResourcePath`] for a path that names no file.
pub(crate) fn segments<'a>(skill: &str, path: &'a str) -> Result<Vec<&'a str>, Error> {
    let escapes = |reason| Error::PathEscapesSkill {
        skill: skill.to_owned(),
        path: path.to_owned(),
        reason,
    };
    if path.contains('\\') {
        return Err(escapes("contains a backslash"));
    }
    // `Path` knows the platform's roots and prefixes (`C:` on Windows) that a `/` test misses.
    let absolute = path.starts_with('/')
        || Path::new(path)
            .components()
            .any(|c| matches!(c, Component::RootDir | Component::Prefix(_)));
    if absolute {
        return Err(escapes("is absolute"));
    }
    let segments: Vec<&str> = path
        .split('/')
        .filter(|segment| !segment.is_empty() && *segment != ".")
        .collect();
    if segments.contains(&"..") {
        return Err(escapes("has a .. component"));
    }
    if path.contains('\0') {
        return Err(Error::InvalidResourcePath {
            skill: skill.to_owned(),
            path: path.to_owned(),
            reason: "contains a nul byte",
        });
    }
    if segments.is_empty() {
        return Err(Error::InvalidResourcePath {
            skill: skill.to_owned(),
            path: path.to_owned(),
            reason: "names no file",
        });
    }
    Ok(segments)
}

/// The canonical spelling of a resource path: its segments joined by `/`.
///
/// # Errors
///
/// As [`segments`].
pub(crate) fn normalize(skill: &str, path: &str) -> Result<String, Error> {
    Ok(segments(skill, path)?.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_normalized() {
        for (given, normal) in [
            ("references/api.md", "references/api.md"),
            ("./references//api.md", "references/api.md"),
            ("a", "a"),
            ("a/./b/", "a/b"),
        ] {
            assert_eq!(normalize("s", given).as_deref(), Ok(normal), "{given}");
        }
    }

    #[test]
    fn paths_that_leave_the_skill_are_refused() {
        for path in [
            "../x",
            "/etc/passwd",
            "references/../../x",
            "references/..",
            "..",
            "a\\..\\b",
        ] {
            let error = segments("s", path).expect_err(path);
            assert_eq!(error.code(), "path_escapes_skill", "{path}");
        }
    }

    #[test]
    fn paths_that_name_no_file_are_refused() {
        for path in ["", ".", "./", ".//.", "a\0b"] {
            let error = segments("s", path).expect_err(path);
            assert_eq!(error.code(), "invalid_resource_path", "{path:?}");
        }
    }
}
