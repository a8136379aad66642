//! The skills part of a system prompt: what the model sees before it loads anything.

use std::fmt::Write as _;

use super::{Skill, SkillMetadata};

/// The guardrail: a model that sees names in a list tends to call them as tools.
const GUARDRAIL: &str = "Skills are packaged instructions for specialised tasks. A skill is \
NOT a tool: never call a skill by its name. To use a skill, call the `load_skill` tool with \
its name; it returns the skill's instructions and the files it bundles, which you read with \
the `read_skill_file` tool. Load a skill only when its description matches the task.";

/// The `## Skills` section of a system prompt: a guardrail, one `<skill>` line per skill, and
/// the bodies of the `preloaded` skills under `### Active Skills`. An empty string when there
/// is no skill at all, so that an agent without skills gets no section.
///
/// The output depends only on the set of skills, not on their order: the same skills give the
/// same bytes, which keeps a provider's prompt cache warm. Skills are sorted by name; a
/// preloaded skill is also listed, with `loaded="true"`; a name given twice keeps its first
/// entry in sort order (a preloaded skill's description wins). Names and descriptions are
/// XML-escaped, and a description's line breaks become spaces so each skill is one line.
///
/// ```
/// use dormant::skills::{catalog_fragment, Skill, SkillMetadata};
///
/// assert_eq!(catalog_fragment(&[], &[]), "");
/// let text = catalog_fragment(&[SkillMetadata::new("pdf", "Fills <PDF> forms.")], &[]);
/// assert!(text.starts_with("## Skills\n"));
/// assert!(text.contains("<skill name=\"pdf\">Fills &lt;PDF&gt; forms.</skill>"));
/// ```
pub fn catalog_fragment(skills: &[SkillMetadata], preloaded: &[Skill]) -> String {
    let mut active: Vec<&Skill> = preloaded.iter().collect();
    active.sort_by(|a, b| {
        (&a.name, &a.description, &a.body).cmp(&(&b.name, &b.description, &b.body))
    });
    active.dedup_by(|later, first| later.name == first.name);

    // (name, description, loaded): preloaded entries sort first among equal names, so they
    // are the ones dedup keeps.
    let mut listed: Vec<(&str, &str, bool)> = skills
        .iter()
        .map(|skill| (skill.name.as_str(), skill.description.as_str(), false))
        .chain(
            active
                .iter()
                .map(|skill| (skill.name.as_str(), skill.description.as_str(), true)),
        )
        .collect();
    if listed.is_empty() {
        return String::new();
    }
    listed.sort_by(|a, b| (a.0, !a.2, a.1).cmp(&(b.0, !b.2, b.1)));
    listed.dedup_by(|later, first| later.0 == first.0);

    let mut out = format!("## Skills\n\n{GUARDRAIL}\n\n<available_skills>\n");
    for (name, description, loaded) in listed {
        let loaded = if loaded { " loaded=\"true\"" } else { "" };
        let description = description.split_whitespace().collect::<Vec<_>>().join(" ");
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "<skill name=\"{}\"{loaded}>{}</skill>",
            escape(name),
            escape(&description)
        );
    }
    out.push_str("</available_skills>\n");

    if !active.is_empty() {
        out.push_str(
            "\n### Active Skills\n\nThese skills are already loaded: follow their instructions \
             without calling `load_skill` for them.\n",
        );
        for skill in active {
            let _ = write!(out, "\n#### {}\n\n{}\n", skill.name, skill.body.trim());
        }
    }
    out
}

/// Escapes the characters that would end a tag or an attribute early.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skill(name: &str, description: &str, body: &str) -> Skill {
        Skill {
            name: name.into(),
            description: description.into(),
            body: body.into(),
            resources: Vec::new(),
        }
    }

    #[test]
    fn no_skills_give_an_empty_fragment() {
        assert_eq!(catalog_fragment(&[], &[]), "");
    }

    #[test]
    fn the_fragment_is_exactly_this() {
        let text = catalog_fragment(
            &[
                SkillMetadata::new("zeta", "Last\n  one."),
                SkillMetadata::new("pdf", "Fills \"PDF\" forms & <more>."),
            ],
            &[skill(
                "pdf",
                "Fills \"PDF\" forms & <more>.",
                "\n# PDF\n\nSteps.\n\n",
            )],
        );
        let expected = format!(
            "## Skills\n\n{GUARDRAIL}\n\n<available_skills>\n\
             <skill name=\"pdf\" loaded=\"true\">Fills &quot;PDF&quot; forms &amp; &lt;more&gt;.</skill>\n\
             <skill name=\"zeta\">Last one.</skill>\n\
             </available_skills>\n\
             \n### Active Skills\n\nThese skills are already loaded: follow their instructions \
             without calling `load_skill` for them.\n\
             \n#### pdf\n\n# PDF\n\nSteps.\n"
        );
        assert_eq!(text, expected);
    }

    #[test]
    fn the_guardrail_says_skills_are_not_tools() {
        let text = catalog_fragment(&[SkillMetadata::new("a", "A.")], &[]);
        assert!(text.contains("NOT a tool"));
        assert!(text.contains("`load_skill`"));
        assert!(text.contains("`read_skill_file`"));
        assert!(!text.contains("### Active Skills"));
    }

    #[test]
    fn the_same_skills_in_any_order_give_the_same_bytes() {
        let a = SkillMetadata::new("a", "A.");
        let b = SkillMetadata::new("b", "B.");
        let c = SkillMetadata::new("c", "C.");
        let (pa, pc) = (skill("a", "A.", "Body a."), skill("c", "C.", "Body c."));
        let one = catalog_fragment(
            &[a.clone(), b.clone(), c.clone()],
            &[pa.clone(), pc.clone()],
        );
        let two = catalog_fragment(&[c, a, b], &[pc, pa]);
        assert_eq!(one, two);
        let a_line = one.find("<skill name=\"a\"").expect("a listed");
        let b_line = one.find("<skill name=\"b\"").expect("b listed");
        assert!(a_line < b_line);
        assert!(one.find("#### a").expect("a active") < one.find("#### c").expect("c active"));
    }

    #[test]
    fn preloaded_skills_are_marked_listed_and_listed_once() {
        let text = catalog_fragment(
            &[SkillMetadata::new("a", "A."), SkillMetadata::new("a", "A.")],
            &[skill("b", "B.", "Body b."), skill("b", "B.", "Body b.")],
        );
        assert_eq!(text.matches("<skill name=\"a\">A.</skill>").count(), 1);
        assert_eq!(
            text.matches("<skill name=\"b\" loaded=\"true\">B.</skill>")
                .count(),
            1
        );
        assert_eq!(text.matches("#### b").count(), 1);
    }

    #[test]
    fn duplicate_names_resolve_the_same_way_in_any_order() {
        let x = SkillMetadata::new("a", "X.");
        let y = SkillMetadata::new("a", "Y.");
        assert_eq!(
            catalog_fragment(&[x.clone(), y.clone()], &[]),
            catalog_fragment(&[y, x], &[])
        );
    }
}
