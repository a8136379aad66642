//! The demo agent's plan walked in the page, for whichever session of the tree runs it: the
//! person answers `ask_user` in its card, then approves `publish`.

use crate::webdriver::Browser;

/// Answers the `ask_user` call numbered `turn` of the session the CSS attribute selector
/// `owner` picks (e.g. `[data-session-id$="-sub-research-1"]`) with `title`, then approves
/// its `publish`. Returns once the approve click is made.
pub(crate) async fn answer_and_approve(
    browser: &Browser,
    owner: &str,
    turn: u32,
    title: &str,
) -> anyhow::Result<()> {
    let ask = format!(r#"form{owner}[data-tool-call-id="ask_user-{turn}"]"#);
    browser.wait_for_text(&ask, "What title").await?;
    // A form from the tool's output schema, also for a remote sub-agent's call: its server's
    // status describes its tools, and the root's status passes that on.
    browser
        .type_into(&format!("{ask} input[name=answer]"), title)
        .await?;
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
