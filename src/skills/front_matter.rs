//! The `SKILL.md` format: YAML front matter between `---` lines, then the Markdown body.

use yaml_rust2::{Yaml, YamlLoader};

/// What a `SKILL.md` says. Keys other than `name` and `description` (`license`,
/// `allowed-tools`, `metadata`, ...) are ignored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FrontMatter {
    pub(crate) name: String,
    pub(crate) description: String,
    pub(crate) body: String,
}

/// Splits a `SKILL.md` into its front matter and body.
///
/// # Errors
///
/// Why the text is not a skill file, as a lowercase sentence for
/// [`Error::InvalidSkillFile`](super::Error::InvalidSkillFile). Names and descriptions are
/// returned as written; the caller checks them against the naming rules.
pub(crate) fn parse(text: &str) -> Result<FrontMatter, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let (yaml, body) = split(text)?;
    let documents = YamlLoader::load_from_str(yaml)
        .map_err(|error| format!("front matter is not valid yaml: {error}"))?;
    let Some(document @ Yaml::Hash(_)) = documents.first() else {
        return Err("front matter is not a yaml mapping".to_owned());
    };
    Ok(FrontMatter {
        name: field(document, "name")?,
        description: field(document, "description")?,
        // The blank line after the closing `---` is layout, not content.
        body: body.trim_start_matches(['\r', '\n']).to_owned(),
    })
}

/// The YAML between the opening and closing `---` lines, and the text after them.
fn split(text: &str) -> Result<(&str, &str), String> {
    let mut lines = text.split_inclusive('\n');
    let opening = lines.next().unwrap_or_default();
    if opening.trim_end() != "---" {
        return Err("does not start with a --- front matter line".to_owned());
    }
    let yaml_start = opening.len();
    let mut offset = yaml_start;
    for line in lines {
        if line.trim_end() == "---" {
            return Ok((&text[yaml_start..offset], &text[offset + line.len()..]));
        }
        offset += line.len();
    }
    Err("front matter is not closed by a --- line".to_owned())
}

/// A required scalar field, trimmed: a folded (`>`) or literal (`|`) block ends in a newline.
fn field(document: &Yaml, key: &str) -> Result<String, String> {
    let text = match &document[key] {
        Yaml::String(text) | Yaml::Real(text) => text.clone(),
        // A name such as `404` or `true` is a valid skill name that YAML reads as a number
        // or a boolean; its text is what the folder is called.
        Yaml::Integer(number) => number.to_string(),
        Yaml::Boolean(flag) => flag.to_string(),
        Yaml::BadValue | Yaml::Null => return Err(format!("front matter has no {key}")),
        Yaml::Array(_) | Yaml::Hash(_) | Yaml::Alias(_) => {
            return Err(format!("front matter {key} is not a string"))
        }
    };
    let text = text.trim();
    if text.is_empty() {
        return Err(format!("front matter has an empty {key}"));
    }
    Ok(text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> FrontMatter {
        parse(text).expect("valid skill file")
    }

    #[test]
    fn plain_front_matter_is_read() {
        let skill =
            parsed("---\nname: pdf\ndescription: Fills PDF forms.\n---\n\n# PDF\n\nUse it.\n");
        assert_eq!(skill.name, "pdf");
        assert_eq!(skill.description, "Fills PDF forms.");
        assert_eq!(skill.body, "# PDF\n\nUse it.\n");
    }

    #[test]
    fn quoted_values_are_unquoted() {
        let skill =
            parsed("---\nname: \"pdf\"\ndescription: 'Use when: a form needs filling.'\n---\nbody");
        assert_eq!(skill.name, "pdf");
        assert_eq!(skill.description, "Use when: a form needs filling.");
        assert_eq!(skill.body, "body");
    }

    #[test]
    fn folded_and_literal_block_descriptions_are_read() {
        let folded =
            parsed("---\nname: a\ndescription: >\n  Fills forms\n  and signs them.\n---\n");
        assert_eq!(folded.description, "Fills forms and signs them.");
        let literal = parsed("---\nname: a\ndescription: |\n  Line one.\n  Line two.\n---\n");
        assert_eq!(literal.description, "Line one.\nLine two.");
        assert_eq!(literal.body, "");
    }

    #[test]
    fn extra_keys_crlf_and_a_bom_are_accepted() {
        let text = "\u{feff}---\r\nname: a\r\ndescription: D.\r\nlicense: MIT\r\nallowed-tools: [Read, Bash]\r\nmetadata:\r\n  version: 1\r\n---\r\n\r\nBody\r\n";
        let skill = parsed(text);
        assert_eq!(
            (skill.name.as_str(), skill.description.as_str()),
            ("a", "D.")
        );
        assert_eq!(skill.body, "Body\r\n");
    }

    #[test]
    fn a_numeric_name_keeps_its_text() {
        assert_eq!(parsed("---\nname: 404\ndescription: d\n---\n").name, "404");
    }

    #[test]
    fn missing_or_broken_front_matter_is_refused() {
        for (text, reason) in [
            ("# Just markdown\n", "does not start"),
            ("", "does not start"),
            ("---\nname: a\ndescription: d\n", "not closed"),
            ("---\ndescription: d\n---\n", "no name"),
            ("---\nname: a\n---\n", "no description"),
            (
                "---\nname: a\ndescription: \"\"\n---\n",
                "empty description",
            ),
            (
                "---\nname: [a]\ndescription: d\n---\n",
                "name is not a string",
            ),
            ("---\n- a\n- b\n---\n", "not a yaml mapping"),
            ("---\n---\n", "not a yaml mapping"),
            (
                "---\nname: a\ndescription: Use when: x\n---\n",
                "not valid yaml",
            ),
        ] {
            let error = parse(text).expect_err(text);
            assert!(error.contains(reason), "{text:?}: {error}");
        }
    }
}
