//! What a test's code logs, captured as text: a `tracing` subscriber for the test's thread
//! that writes formatted lines (spans and fields as a daemon's log shows them) into a buffer.

use std::io::Write;
use std::sync::Arc;

use parking_lot::Mutex;
use tracing::subscriber::DefaultGuard;

/// The lines logged on this thread while its guard lives, at a level and above. Clones share
/// one buffer.
///
/// ```
/// let (logs, guard) = dormant::testkit::CapturedLogs::start(tracing::Level::INFO);
/// let span = tracing::info_span!("run", session = "s-1");
/// span.in_scope(|| tracing::info!("model.called"));
/// drop(guard);
/// let text = logs.text()?;
/// assert!(text.contains("run{session=\"s-1\"}:"), "{text}");
/// assert!(text.contains("model.called"), "{text}");
/// # Ok::<(), std::string::FromUtf8Error>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

impl CapturedLogs {
    /// Captures what this thread logs at `level` and above (without colours) until the guard
    /// is dropped. A current-thread tokio runtime runs its tasks on this thread, so they are
    /// captured too.
    pub fn start(level: tracing::Level) -> (Self, DefaultGuard) {
        let logs = Self::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(level)
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    /// Everything captured so far.
    ///
    /// # Errors
    /// A line that is not UTF-8 (the fmt layer writes none).
    pub fn text(&self) -> Result<String, std::string::FromUtf8Error> {
        String::from_utf8(self.0.lock().clone())
    }
}

impl Write for CapturedLogs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
