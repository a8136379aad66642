//! The demo agent's plan walked in the page, for whichever session of the tree runs it: the
//! person answers `ask_user` in its card, then approves `publish`.

use crate::webdriver::Browser;

/// How the page asks for `ask_user`'s answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Form {
    /// A form generated from the tool's output schema (a tool this server defines).
    Generated,
    /// The raw-JSON fallback (a remote sub-agent's call: its server's tools are not known).
    RawJson,
}

/// Answers the `ask_user` call numbered `turn` of the session the CSS attribute selector
/// `owner` picks (e.g. `[data-session-id$="-sub-research-1"]`) with `title`, then approves
/// its `publish`. Returns once the approve click is made.
pub(crate) async fn answer_and_approve(
    browser: &Browser,
    owner: &str,
    turn: u32,
    title: &str,
    form: Form,
) -> anyhow::Result<()> {
    let ask = format!(r#"form{owner}[data-tool-call-id="ask_user-{turn}"]"#);
    browser.wait_for_text(&ask, "What title").await?;
    match form {
        Form::Generated => {
            browser
                .type_into(&format!("{ask} input[name=answer]"), title)
                .await?;
        }
        Form::RawJson => {
            let field = format!("{ask} textarea[name=result]");
            browser.clear(&field).await?;
            let answer = serde_json::json!({ "answer": title }).to_string();
            browser.type_into(&field, &answer).await?;
        }
    }
    browser
        .click(&format!(r#"{ask} button[data-action="submit"]"#))
        .await?;
    browser.wait_for_text(&ask, "sent").await?;
    // The page resumes the tree by itself once nothing waits; the run stops at the gate.
    let approval =
        format!(r#"form{owner}[data-kind="approval"][data-tool-call-id="publish-{turn}"]"#);
    browser.wait_for_text(&approval, title).await?;
    browser
        .click(&format!(r#"{approval} button[data-action="approve"]"#))
        .await?;
    browser.wait_for_text(&approval, "sent").await?;
    Ok(())
}
