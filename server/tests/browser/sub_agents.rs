//! A sub-agent's calls answered in the page, through to the end of the run: the demo's
//! `research ` hands the plan to a local sub-agent, `delegate ` to the demo agent of a second
//! `dormant-server` process (`--delegate-to`). The root waits as `suspended_awaiting_children`
//! (and a remote child's answered call is no longer listed at all): the page resumes whenever
//! nothing in the tree still waits, whatever the status word.

use crate::common::binary::Binary;
use crate::{plan, setup};

const KEY_VAR: &str = "DORMANT_TEST_BROWSER_REMOTE_KEY";
const KEY: &str = "a-remote-key-of-at-least-16-chars";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_answers_a_local_sub_agents_client_tool_and_approval_to_the_end(
) -> anyhow::Result<()> {
    let Some(opened) = setup::browser().await? else {
        return Ok(());
    };
    let browser = &opened.browser;
    let server = Binary::start(&opened.dir.path().join("store"), "127.0.0.1:0", &[])?;
    browser.goto(&format!("{}/", server.base)).await?;
    browser
        .type_into("#message", "research weather in Porto")
        .await?;
    browser.click("#send").await?;
    browser
        .wait_for_text("#log", "-sub-research-1 started")
        .await?;

    let child = r#"[data-session-id$="-sub-research-1"]"#;
    // Its call is shown nested under the sub-agent that asked, which says what started it.
    let group = r#"#pending section.subagent[data-session-id$="-sub-research-1"]"#;
    browser
        .wait_for(&format!(r#"{group} form[data-tool-call-id="ask_user-1"]"#))
        .await?;
    browser
        .wait_for_text(group, "(started by research-1)")
        .await?;
    plan::answer_and_approve(browser, child, 1, "Porto in the sun").await?;
    browser
        .wait_for_text(
            "#log",
            "The sub-agent answered: Published \"Porto in the sun\"",
        )
        .await?;
    browser.wait_for_text("#log", "run completed").await?;
    browser.wait_for_text("#status", "run completed").await?;
    opened.close().await?;
    drop(server);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_answers_a_remote_sub_agents_client_tool_and_approval_to_the_end(
) -> anyhow::Result<()> {
    let Some(opened) = setup::browser().await? else {
        return Ok(());
    };
    let browser = &opened.browser;
    let env = [(KEY_VAR, KEY)];
    // The README's two-server demo: the remote takes an operator's key, the parent sends it.
    let remote = Binary::start_with_env(
        &opened.dir.path().join("remote"),
        "127.0.0.1:0",
        &["--api-key-env", KEY_VAR],
        &env,
    )?;
    let parent = Binary::start_with_env(
        &opened.dir.path().join("parent"),
        "127.0.0.1:0",
        &["--delegate-to", &remote.base, "--remote-key-env", KEY_VAR],
        &env,
    )?;
    browser.goto(&format!("{}/", parent.base)).await?;
    browser
        .type_into("#message", "delegate weather in Porto")
        .await?;
    browser.click("#send").await?;
    browser
        .wait_for_text("#log", "-sub-delegate-1 started")
        .await?;

    let child = r#"[data-session-id$="-sub-delegate-1"]"#;
    plan::answer_and_approve(browser, child, 1, "Porto in the sun").await?;
    browser
        .wait_for_text(
            "#log",
            "The remote agent answered: Published \"Porto in the sun\"",
        )
        .await?;
    browser.wait_for_text("#log", "run completed").await?;
    browser.wait_for_text("#status", "run completed").await?;
    opened.close().await?;
    drop(parent);
    drop(remote);
    Ok(())
}
