//! The naming rules a skill must follow, checked the same way for every provider.

use super::Error;

/// The tool names the skill layer gives the model: one loads a skill, one reads a file in it.
/// Skill names cannot contain `_`, so no skill can be mistaken for one of these.
///
/// ```
/// use dormant::skills::{validate_skill_name, RESERVED_TOOL_NAMES};
///
/// for tool in RESERVED_TOOL_NAMES {
///     assert!(validate_skill_name(tool).is_err());
/// }
/// ```
pub const RESERVED_TOOL_NAMES: [&str; 2] = ["load_skill", "read_skill_file"];

/// The longest skill name, in characters, as the Agent Skills format allows.
const MAX_NAME_LEN: usize = 64;

/// The longest description, in characters, as the Agent Skills format allows: every
/// description is in every prompt, so it has to stay short.
const MAX_DESCRIPTION_LEN: usize = 1024;

/// Checks a skill name: 1 to 64 characters from `a-z`, `0-9` and `-`.
///
/// The name doubles as a folder name and as an argument the model types, so it has no
/// upper case, spaces or path separators.
///
/// # Errors
///
/// [`Error::InvalidSkillName`] saying which rule the name breaks.
///
/// ```
/// use dormant::skills::validate_skill_name;
///
/// assert!(validate_skill_name("pdf-forms").is_ok());
/// assert!(validate_skill_name("PDF").is_err());
/// assert!(validate_skill_name("").is_err());
/// ```
pub fn validate_skill_name(name: &str) -> Result<(), Error> {
    let invalid = |reason| {
        Err(Error::InvalidSkillName {
            name: name.to_owned(),
            reason,
        })
    };
    if name.is_empty() {
        return invalid("is empty");
    }
    // Every allowed character is ASCII, so the byte length is the character count here.
    if name.len() > MAX_NAME_LEN {
        return invalid("is longer than 64 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return invalid("may only contain a-z, 0-9 and -");
    }
    Ok(())
}

/// Checks a description: not blank, at most 1024 characters.
pub(crate) fn validate_description(skill: &str, description: &str) -> Result<(), Error> {
    let invalid = |reason| {
        Err(Error::InvalidDescription {
            skill: skill.to_owned(),
            reason,
        })
    };
    if description.trim().is_empty() {
        return invalid("description is empty");
    }
    if description.chars().count() > MAX_DESCRIPTION_LEN {
        return invalid("description is longer than 1024 characters");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowercase_digits_and_hyphens_are_valid_names() {
        for name in ["a", "pdf", "pdf-forms", "v2", "0", "-", &"a".repeat(64)] {
            assert_eq!(validate_skill_name(name), Ok(()), "{name}");
        }
    }

    #[test]
    fn names_with_other_characters_or_lengths_are_refused() {
        let too_long = "a".repeat(65);
        for name in [
            "",
            "Pdf",
            "pdf_forms",
            "pdf forms",
            "pdf.md",
            "../x",
            "a/b",
            "é",
            &too_long,
        ] {
            let error = validate_skill_name(name).expect_err(name);
            assert_eq!(error.code(), "invalid_skill_name", "{name}");
        }
    }

    #[test]
    fn reserved_tool_names_are_not_valid_skill_names() {
        for tool in RESERVED_TOOL_NAMES {
            assert!(validate_skill_name(tool).is_err(), "{tool}");
        }
    }

    #[test]
    fn descriptions_must_be_non_blank_and_short() {
        assert_eq!(validate_description("a", "Does a."), Ok(()));
        assert!(validate_description("a", " \n").is_err());
        assert!(validate_description("a", &"x".repeat(1025)).is_err());
        assert_eq!(validate_description("a", &"é".repeat(1024)), Ok(()));
    }
}
