//! Skills with progressive disclosure, after the Agent Skills format: folders of instructions
//! and files that the model loads only when a task calls for them.
//!
//! A skill is disclosed in three levels, one [`SkillProvider`] method each:
//!
//! 1. [`list`](SkillProvider::list): every skill's name and description. They go into the
//!    system prompt through [`catalog_fragment`], so the model knows what exists.
//! 2. [`get`](SkillProvider::get): one skill's instructions and the list of its files, which
//!    the model asks for with the `load_skill` tool.
//! 3. [`read_resource`](SkillProvider::read_resource): one file, or some of its lines, which
//!    the model asks for with the `read_skill_file` tool.
//!
//! # Layout
//!
//! - `provider.rs`: [`SkillProvider`], [`SkillMetadata`] and [`Skill`].
//! - `fs.rs`: [`FsSkills`], skills on disk (`<root>/<name>/SKILL.md`); `front_matter.rs`
//!   reads a `SKILL.md`.
//! - `in_code.rs`: [`InCodeSkills`] and [`SkillDefinition`], skills built in code.
//! - `name.rs`: [`validate_skill_name`] and [`RESERVED_TOOL_NAMES`]; `path.rs`: the lexical
//!   guard on resource paths; `range.rs`: [`ReadRange`].
//! - `catalog.rs`: [`catalog_fragment`], the prompt section.
//! - `tools.rs`: the `load_skill` and `read_skill_file` tools an agent with skills gains.
//! - `error.rs`: [`Error`], whose messages start with a stable code.
//!
//! # Example
//!
//! ```
//! use dormant::skills::{catalog_fragment, InCodeSkills, SkillDefinition, SkillProvider};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), dormant::skills::Error> {
//! let skills = InCodeSkills::new([
//!     SkillDefinition::new("pdf", "Fills PDF forms.", "Read references/forms.md first.")
//!         .resource("references/forms.md", "# Forms"),
//! ])?;
//! let prompt = catalog_fragment(&skills.list().await?, &[]);
//! assert!(prompt.contains("<skill name=\"pdf\">Fills PDF forms.</skill>"));
//! let pdf = skills.get("pdf").await?.ok_or(dormant::skills::Error::SkillNotFound {
//!     name: "pdf".into(),
//! })?;
//! assert_eq!(pdf.resources, ["references/forms.md"]);
//! # Ok(()) }
//! ```

mod catalog;
mod error;
mod front_matter;
mod fs;
mod in_code;
mod name;
mod path;
mod prompt;
mod provider;
mod range;
mod tools;

pub use catalog::catalog_fragment;
pub use error::Error;
pub use fs::FsSkills;
pub use in_code::{InCodeSkills, SkillDefinition};
pub use name::{validate_skill_name, RESERVED_TOOL_NAMES};
pub(crate) use prompt::{LastSection, PromptSkills};
pub use provider::{Skill, SkillMetadata, SkillProvider};
pub use range::ReadRange;
pub(crate) use tools::skill_tools;
pub use tools::{LOAD_SKILL, READ_SKILL_FILE};
