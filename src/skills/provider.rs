//! The provider trait and what it returns, one level of disclosure per method.

use std::fmt;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::{Error, ReadRange};

/// Level 1: what the model always sees of a skill, in the system prompt.
///
/// ```
/// use dormant::skills::SkillMetadata;
///
/// let meta = SkillMetadata::new("pdf", "Fills PDF forms.");
/// assert_eq!(meta.name, "pdf");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SkillMetadata {
    /// The skill's name, valid by [`validate_skill_name`](super::validate_skill_name).
    pub name: String,
    /// When to use the skill: the model decides from this alone whether to load it.
    pub description: String,
}

impl SkillMetadata {
    /// Metadata with this name and description.
    pub fn new(name: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
        }
    }
}

/// Level 2: a loaded skill, its instructions and the files it bundles.
///
/// ```
/// use dormant::skills::Skill;
///
/// let skill = Skill {
///     name: "pdf".into(),
///     description: "Fills PDF forms.".into(),
///     body: "Read references/forms.md first.".into(),
///     resources: vec!["references/forms.md".into()],
/// };
/// assert_eq!(skill.metadata().name, "pdf");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Skill {
    /// The skill's name.
    pub name: String,
    /// When to use it.
    pub description: String,
    /// The instructions: the Markdown after the front matter.
    pub body: String,
    /// The files the model may read (Level 3), as sorted relative paths with `/`, such as
    /// `"references/api.md"`.
    pub resources: Vec<String>,
}

impl Skill {
    /// Its Level 1 part.
    pub fn metadata(&self) -> SkillMetadata {
        SkillMetadata::new(&self.name, &self.description)
    }
}

/// Where skills come from. Each method is one level of progressive disclosure: the catalog
/// (names and descriptions) goes into every prompt, a skill's body only once the model loads
/// it, and its files only when the model reads them.
///
/// The futures are `'static` so that a caller can hold them across an await without
/// borrowing the provider; implementations clone what they need (an `Arc`, the name) into
/// them. [`BoxFuture`] is re-exported by this crate (`dormant::llm::BoxFuture`).
///
/// ```
/// use std::sync::Arc;
/// use dormant::llm::BoxFuture;
/// use dormant::skills::{Error, ReadRange, Skill, SkillMetadata, SkillProvider};
///
/// /// Knows no skill.
/// struct NoSkills;
///
/// impl SkillProvider for NoSkills {
///     fn list(&self) -> BoxFuture<'static, Result<Vec<SkillMetadata>, Error>> {
///         Box::pin(async { Ok(Vec::new()) })
///     }
///     fn get(&self, _name: &str) -> BoxFuture<'static, Result<Option<Skill>, Error>> {
///         Box::pin(async { Ok(None) })
///     }
///     fn read_resource(
///         &self,
///         _name: &str,
///         _path: &str,
///         _range: Option<ReadRange>,
///     ) -> BoxFuture<'static, Result<Option<String>, Error>> {
///         Box::pin(async { Ok(None) })
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let provider: Arc<dyn SkillProvider> = Arc::new(NoSkills);
/// assert!(provider.list().await?.is_empty());
/// assert_eq!(format!("{provider:?}"), "SkillProvider");
/// # Ok(()) }
/// ```
pub trait SkillProvider: Send + Sync + 'static {
    /// Level 1: every skill's name and description, sorted by name.
    ///
    /// # Errors
    ///
    /// When the provider cannot list at all. A single broken skill is left out instead, so
    /// that it cannot hide the others.
    fn list(&self) -> BoxFuture<'static, Result<Vec<SkillMetadata>, Error>>;

    /// Level 2: the skill called `name`, or `None` if there is none.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSkillName`] for a name no skill can have, [`Error::InvalidSkillFile`]
    /// for a skill that exists but is broken, and [`Error::Io`] when the source fails.
    fn get(&self, name: &str) -> BoxFuture<'static, Result<Option<Skill>, Error>>;

    /// Level 3: the text of the file at `path` (relative to the skill, with `/`) in the skill
    /// called `name`, all of it or the lines in `range`. `None` when the skill or the file
    /// does not exist.
    ///
    /// # Errors
    ///
    /// [`Error::PathEscapesSkill`] for a path that could leave the skill,
    /// [`Error::InvalidRange`] for a range that selects no line, [`Error::NotUtf8`] for a
    /// file that is not text, and the errors of [`SkillProvider::get`].
    fn read_resource(
        &self,
        name: &str,
        path: &str,
        range: Option<ReadRange>,
    ) -> BoxFuture<'static, Result<Option<String>, Error>>;
}

/// Lets a struct holding an `Arc<dyn SkillProvider>` derive `Debug`.
impl fmt::Debug for dyn SkillProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SkillProvider")
    }
}
