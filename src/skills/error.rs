//! What can go wrong when listing, loading or reading a skill.

use std::path::PathBuf;

/// Why a skill operation failed. Each message starts with a stable snake_case code (see
/// [`Error::code`]) so that a tool can hand it to the model and a test can match on it.
///
/// A skill or file that does not exist is not an error for a [`SkillProvider`]: it answers
/// `None`. [`Error::SkillNotFound`] and [`Error::ResourceNotFound`] are for the layer above
/// (the `load_skill` and `read_skill_file` tools) to report that `None`.
///
/// [`SkillProvider`]: super::SkillProvider
///
/// ```
/// use dormant::skills::{validate_skill_name, Error};
///
/// let error = validate_skill_name("Bad_Name").unwrap_err();
/// assert_eq!(error.code(), "invalid_skill_name");
/// assert!(error.to_string().starts_with("invalid_skill_name: "));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No skill has this name.
    #[error("skill_not_found: no skill named {name:?}")]
    SkillNotFound {
        /// The name asked for.
        name: String,
    },
    /// A skill name breaks the naming rule (see [`validate_skill_name`]).
    ///
    /// [`validate_skill_name`]: super::validate_skill_name
    #[error("invalid_skill_name: {name:?} {reason}")]
    InvalidSkillName {
        /// The name given.
        name: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// A skill's description is empty or too long.
    #[error("invalid_description: skill {skill:?}: {reason}")]
    InvalidDescription {
        /// The skill.
        skill: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// Two in-code skills share a name.
    #[error("duplicate_skill: more than one skill is named {name:?}")]
    DuplicateSkill {
        /// The shared name.
        name: String,
    },
    /// A resource path would leave the skill's folder: absolute, with a `..` component, a
    /// symlink, or outside the folders a skill may expose.
    #[error("path_escapes_skill: skill {skill:?}: {path:?} {reason}")]
    PathEscapesSkill {
        /// The skill.
        skill: String,
        /// The path asked for.
        path: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A resource path that stays inside the skill but is not in normal form (empty, `.`
    /// or empty components), given when an in-code skill is defined.
    #[error("invalid_resource_path: skill {skill:?}: {path:?} {reason}")]
    InvalidResourcePath {
        /// The skill.
        skill: String,
        /// The path given.
        path: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// The skill has no file at this path.
    #[error("resource_not_found: skill {skill:?} has no file {path:?}")]
    ResourceNotFound {
        /// The skill.
        skill: String,
        /// The path asked for.
        path: String,
    },
    /// A [`ReadRange`](super::ReadRange) that selects no line of the file.
    #[error("invalid_range: {reason}")]
    InvalidRange {
        /// What is wrong with it.
        reason: String,
    },
    /// A `SKILL.md` without valid front matter, or whose `name` differs from its folder.
    #[error("invalid_skill_file: {}: {reason}", path.display())]
    InvalidSkillFile {
        /// The `SKILL.md` file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A resource file that is not UTF-8 text.
    #[error("not_utf8: {} is not utf-8 text", path.display())]
    NotUtf8 {
        /// The file.
        path: PathBuf,
    },
    /// The file system failed.
    #[error("io: {}: {message}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The kind of failure, kept so that callers can tell `PermissionDenied` apart.
        kind: std::io::ErrorKind,
        /// The operating system's message.
        message: String,
    },
    /// The blocking task that did the file system work did not finish (the runtime is
    /// shutting down, or the task panicked).
    #[error("task_failed: {message}")]
    TaskFailed {
        /// What the runtime reported.
        message: String,
    },
}

impl Error {
    /// The stable code the message starts with, such as `"skill_not_found"`.
    ///
    /// ```
    /// use dormant::skills::Error;
    ///
    /// let error = Error::SkillNotFound { name: "pdf".into() };
    /// assert_eq!(error.code(), "skill_not_found");
    /// ```
    pub fn code(&self) -> &'static str {
        match self {
            Self::SkillNotFound { .. } => "skill_not_found",
            Self::InvalidSkillName { .. } => "invalid_skill_name",
            Self::InvalidDescription { .. } => "invalid_description",
            Self::DuplicateSkill { .. } => "duplicate_skill",
            Self::PathEscapesSkill { .. } => "path_escapes_skill",
            Self::InvalidResourcePath { .. } => "invalid_resource_path",
            Self::ResourceNotFound { .. } => "resource_not_found",
            Self::InvalidRange { .. } => "invalid_range",
            Self::InvalidSkillFile { .. } => "invalid_skill_file",
            Self::NotUtf8 { .. } => "not_utf8",
            Self::Io { .. } => "io",
            Self::TaskFailed { .. } => "task_failed",
        }
    }

    /// Keeps an [`std::io::Error`] as data, since `io::Error` is neither `Clone` nor `Eq`.
    pub(crate) fn io(path: impl Into<PathBuf>, error: &std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            kind: error.kind(),
            message: error.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_starts_with_its_code() {
        let errors = [
            Error::SkillNotFound { name: "a".into() },
            Error::InvalidSkillName {
                name: "A".into(),
                reason: "r",
            },
            Error::InvalidDescription {
                skill: "a".into(),
                reason: "r",
            },
            Error::DuplicateSkill { name: "a".into() },
            Error::PathEscapesSkill {
                skill: "a".into(),
                path: "../x".into(),
                reason: "r",
            },
            Error::InvalidResourcePath {
                skill: "a".into(),
                path: "".into(),
                reason: "r",
            },
            Error::ResourceNotFound {
                skill: "a".into(),
                path: "x".into(),
            },
            Error::InvalidRange { reason: "r".into() },
            Error::InvalidSkillFile {
                path: "a/SKILL.md".into(),
                reason: "r".into(),
            },
            Error::NotUtf8 { path: "x".into() },
            Error::io("x", &std::io::Error::other("boom")),
            Error::TaskFailed {
                message: "m".into(),
            },
        ];
        for error in errors {
            let text = error.to_string();
            assert!(
                text.starts_with(&format!("{}: ", error.code())),
                "{text} does not start with {}",
                error.code()
            );
        }
    }
}
