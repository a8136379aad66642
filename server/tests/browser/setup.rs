//! What every browser test needs: Debian's Chromium and chromedriver (or a loud skip), one
//! browser at a time (the machines running these have few cores), and a profile of its own.

use std::io::Write;
use std::path::Path;

use tokio::sync::{Mutex, MutexGuard};

use crate::webdriver::{Browser, Driver};

pub(crate) const CHROMIUM: &str = "/usr/bin/chromium";
pub(crate) const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Held by the test whose browser runs.
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

/// A headless Chromium with a fresh profile, and the temporary directory that holds it (and
/// anything else the test keeps there, such as a store). Closed by [`Opened::close`].
pub(crate) struct Opened {
    pub(crate) browser: Browser,
    pub(crate) dir: tempfile::TempDir,
    driver: Driver,
    _turn: MutexGuard<'static, ()>,
}

impl Opened {
    pub(crate) async fn close(self) -> anyhow::Result<()> {
        self.browser.close().await?;
        drop(self.driver);
        Ok(())
    }
}

/// Opens a browser, or `None` when Chromium or chromedriver is missing: the test then says it
/// was skipped and how to install them, and passes, unless `DORMANT_REQUIRE_BROWSER` is set to
/// anything but `0` (CI sets it to 1).
pub(crate) async fn browser() -> anyhow::Result<Option<Opened>> {
    if !Path::new(CHROMIUM).exists() || !Path::new(CHROMEDRIVER).exists() {
        // Straight to the stderr stream, not eprintln!: the test harness captures (and hides)
        // what a passing test prints, and a skip must not pass unnoticed.
        let _ = writeln!(
            std::io::stderr(),
            "\n\n*** SKIPPED: the browser test needs {CHROMIUM} and {CHROMEDRIVER}: \
             apt-get install chromium chromium-driver ***\n\n"
        );
        anyhow::ensure!(
            std::env::var("DORMANT_REQUIRE_BROWSER")
                .map_or(true, |value| value.is_empty() || value == "0"),
            "DORMANT_REQUIRE_BROWSER is set and Chromium or chromedriver is missing \
             (apt-get install chromium chromium-driver)"
        );
        return Ok(None);
    }
    let turn = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir()?;
    let driver = Driver::start(CHROMEDRIVER).await?;
    let browser = Browser::open(&driver, CHROMIUM, &dir.path().join("profile")).await?;
    Ok(Some(Opened {
        browser,
        dir,
        driver,
        _turn: turn,
    }))
}
