//! Just enough of the W3C WebDriver protocol (plain HTTP and JSON) to drive Debian's
//! Chromium through chromedriver: open a page and a second window, find, click, type, run a
//! script, wait for a condition. reqwest is already here for the other tests, and these are
//! a dozen JSON calls; fantoccini (with default-features = false) would add 15 crates to the
//! build, among them mozilla's `webdriver` types with `icu_segmenter` and its data, `time`
//! and `cookie`, on a machine where build time is the scarce thing.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use serde_json::{json, Value};

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// chromedriver on a free loopback port, killed when dropped.
pub(crate) struct Driver {
    child: Child,
    pub(crate) url: String,
}

impl Driver {
    pub(crate) async fn start(binary: &str) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        // Its own process group: chromedriver starts Chromium, which a failed test must not
        // leave running; dropping the driver kills the whole group.
        let mut child = Command::new(binary)
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot run {binary}"))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let driver = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        // Ready when it says so on stdout. The reader drains the rest, so chromedriver never
        // blocks on a full pipe; at its end it drops the sender, which tells a waiter that
        // chromedriver exited before it was ready.
        let (ready, started) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let mut ready = Some(ready);
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.contains("started successfully") {
                    if let Some(ready) = ready.take() {
                        let _ = ready.send(());
                    }
                }
            }
        });
        started
            .await
            .context("chromedriver exited before it was ready")?;
        Ok(driver)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One browser session (a headless Chromium).
pub(crate) struct Browser {
    http: reqwest::Client,
    base: String,
}

impl Browser {
    pub(crate) async fn open(
        driver: &Driver,
        chromium: &str,
        profile: &std::path::Path,
    ) -> anyhow::Result<Self> {
        let http = reqwest::Client::new();
        let capabilities = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                    "--no-first-run", "--window-size=1000,900",
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
        } } });
        let created: Value = http
            .post(format!("{}/session", driver.url))
            .json(&capabilities)
            .send()
            .await?
            .json()
            .await?;
        let id = created["value"]["sessionId"]
            .as_str()
            .with_context(|| format!("no browser session: {created}"))?;
        let browser = Self {
            base: format!("{}/session/{id}", driver.url),
            http,
        };
        let limit = u64::try_from(WAIT_LIMIT.as_millis()).unwrap_or(u64::MAX);
        browser
            .command(
                reqwest::Method::POST,
                "/timeouts",
                json!({ "script": limit }),
            )
            .await?;
        Ok(browser)
    }

    async fn command(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Value,
    ) -> anyhow::Result<Value> {
        let request = self.http.request(method, format!("{}{path}", self.base));
        let request = if body.is_null() {
            request
        } else {
            request.json(&body)
        };
        let answer: Value = request.send().await?.json().await?;
        if let Some(error) = answer["value"]["error"].as_str() {
            anyhow::bail!("webdriver {path}: {error}: {}", answer["value"]["message"]);
        }
        Ok(answer["value"].clone())
    }

    pub(crate) async fn goto(&self, url: &str) -> anyhow::Result<()> {
        self.command(reqwest::Method::POST, "/url", json!({ "url": url }))
            .await?;
        Ok(())
    }

    /// Opens a new window (same profile, so the same localStorage) and returns its handle;
    /// commands still go to the current one until [`Browser::switch_to`].
    pub(crate) async fn new_window(&self) -> anyhow::Result<String> {
        let opened = self
            .command(
                reqwest::Method::POST,
                "/window/new",
                json!({ "type": "window" }),
            )
            .await?;
        opened["handle"]
            .as_str()
            .map(str::to_string)
            .with_context(|| format!("no window handle in {opened}"))
    }

    /// The current window's handle.
    pub(crate) async fn window(&self) -> anyhow::Result<String> {
        let handle = self
            .command(reqwest::Method::GET, "/window", Value::Null)
            .await?;
        handle
            .as_str()
            .map(str::to_string)
            .with_context(|| format!("no window handle in {handle}"))
    }

    /// Sends the next commands to the window `handle`.
    pub(crate) async fn switch_to(&self, handle: &str) -> anyhow::Result<()> {
        self.command(
            reqwest::Method::POST,
            "/window",
            json!({ "handle": handle }),
        )
        .await?;
        Ok(())
    }

    pub(crate) async fn refresh(&self) -> anyhow::Result<()> {
        self.command(reqwest::Method::POST, "/refresh", json!({}))
            .await?;
        Ok(())
    }

    /// Runs `script` in the page and returns what it returns.
    pub(crate) async fn script(&self, script: &str, args: Value) -> anyhow::Result<Value> {
        self.execute("/execute/sync", script, args).await
    }

    /// Runs `script` in the page until it calls its last argument, and returns what it was
    /// given. The session's script timeout bounds the wait.
    pub(crate) async fn script_async(&self, script: &str, args: Value) -> anyhow::Result<Value> {
        self.execute("/execute/async", script, args).await
    }

    async fn execute(&self, path: &str, script: &str, args: Value) -> anyhow::Result<Value> {
        let body = json!({ "script": script, "args": args });
        self.command(reqwest::Method::POST, path, body).await
    }

    async fn find(&self, css: &str) -> anyhow::Result<String> {
        let found = self
            .command(
                reqwest::Method::POST,
                "/element",
                json!({ "using": "css selector", "value": css }),
            )
            .await?;
        found[ELEMENT]
            .as_str()
            .map(str::to_string)
            .context("no element id")
    }

    pub(crate) async fn click(&self, css: &str) -> anyhow::Result<()> {
        let element = self.find(css).await?;
        self.command(
            reqwest::Method::POST,
            &format!("/element/{element}/click"),
            json!({}),
        )
        .await?;
        Ok(())
    }

    pub(crate) async fn type_into(&self, css: &str, text: &str) -> anyhow::Result<()> {
        let element = self.find(css).await?;
        self.command(
            reqwest::Method::POST,
            &format!("/element/{element}/value"),
            json!({ "text": text }),
        )
        .await?;
        Ok(())
    }

    /// Writes a PNG of the window to `path` (WebDriver answers it in base64).
    pub(crate) async fn screenshot(&self, path: &std::path::Path) -> anyhow::Result<()> {
        let shot = self
            .command(reqwest::Method::GET, "/screenshot", Value::Null)
            .await?;
        let text = shot.as_str().context("a screenshot is a base64 string")?;
        std::fs::write(path, decode_base64(text)?)?;
        Ok(())
    }

    /// Empties a text field (a prefilled one, before `type_into`).
    pub(crate) async fn clear(&self, css: &str) -> anyhow::Result<()> {
        let element = self.find(css).await?;
        self.command(
            reqwest::Method::POST,
            &format!("/element/{element}/clear"),
            json!({}),
        )
        .await?;
        Ok(())
    }

    /// Waits until `css` matches an element (the page renders as events arrive).
    pub(crate) async fn wait_for(&self, css: &str) -> anyhow::Result<()> {
        self.wait_in_page(css, None).await
    }

    /// Waits until the text of `css` contains `text`.
    pub(crate) async fn wait_for_text(&self, css: &str, text: &str) -> anyhow::Result<()> {
        self.wait_in_page(css, Some(text)).await
    }

    /// Waits in the page itself: a MutationObserver answers as soon as the DOM holds `css`
    /// (with `text` in it, if given), so nothing polls. The session's script timeout bounds
    /// the wait; on failure the error says what the page showed.
    async fn wait_in_page(&self, css: &str, text: Option<&str>) -> anyhow::Result<()> {
        let waited = self.script_async(WAIT_IN_PAGE, json!([css, text])).await;
        if let Err(error) = waited {
            let shown = match self.text("body").await {
                Ok(shown) => shown,
                Err(unread) => format!("(the page could not be read: {unread:#})"),
            };
            let what = match text {
                Some(text) => format!("{css} to show {text:?}"),
                None => css.to_string(),
            };
            return Err(error.context(format!("waiting for {what}; the page shows:\n{shown}")));
        }
        Ok(())
    }

    pub(crate) async fn text(&self, css: &str) -> anyhow::Result<String> {
        let script = "const e = document.querySelector(arguments[0]); return e ? e.innerText : '';";
        Ok(self
            .script(script, json!([css]))
            .await?
            .as_str()
            .unwrap_or_default()
            .to_string())
    }

    pub(crate) async fn close(self) -> anyhow::Result<()> {
        self.command(reqwest::Method::DELETE, "", Value::Null)
            .await?;
        Ok(())
    }
}

/// The script of [`Browser::wait_in_page`]: resolves (calls WebDriver's callback, the last
/// argument) once the condition holds, checking at once and then at every DOM change.
const WAIT_IN_PAGE: &str = r#"
const [css, text, done] = arguments;
const holds = () => {
  const element = document.querySelector(css);
  return element !== null && (text === null || element.textContent.includes(text));
};
if (holds()) { done(true); return; }
const observer = new MutationObserver(() => {
  if (holds()) { observer.disconnect(); done(true); }
});
observer.observe(document, { subtree: true, childList: true, characterData: true, attributes: true });
"#;

/// How long [`Browser::wait_in_page`] waits before the page's script times out.
const WAIT_LIMIT: Duration = Duration::from_secs(20);

/// Standard base64 (with padding, as WebDriver sends a screenshot) to bytes.
fn decode_base64(text: &str) -> anyhow::Result<Vec<u8>> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let mut bits = 0u32;
    let mut count = 0;
    for byte in text
        .bytes()
        .filter(|byte| !byte.is_ascii_whitespace() && *byte != b'=')
    {
        let value = ALPHABET
            .iter()
            .position(|letter| *letter == byte)
            .context("not base64")?;
        bits = (bits << 6) | u32::try_from(value)?;
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push(u8::try_from((bits >> count) & 0xff)?);
        }
    }
    Ok(out)
}
