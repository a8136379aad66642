//! Where a streaming adapter hands the pieces of a reply as they arrive.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::types::stream::DeltaKind;

type Publish = dyn Fn(u32, DeltaKind) + Send + Sync;

/// Takes the deltas of one model call to the session's live followers. Cheap to clone; an
/// adapter that does not stream never touches it. Sending costs a map lookup when nobody
/// follows the session, and never blocks.
///
/// ```
/// use dormant::llm::DeltaSink;
/// let sink = DeltaSink::discard();
/// sink.text("Hel");
/// sink.text("lo");
/// ```
#[derive(Clone, Default)]
pub struct DeltaSink {
    publish: Option<Arc<Publish>>,
    next: Arc<AtomicU32>,
}

impl DeltaSink {
    /// A sink that drops everything (a request built outside a runtime).
    pub fn discard() -> Self {
        Self::default()
    }

    /// A sink that calls `publish` with each delta's index and content.
    pub(crate) fn new(publish: impl Fn(u32, DeltaKind) + Send + Sync + 'static) -> Self {
        Self {
            publish: Some(Arc::new(publish)),
            next: Arc::default(),
        }
    }

    /// Sends more of the reply's text. Empty text is not sent.
    pub fn text(&self, text: impl Into<String>) {
        let text = text.into();
        if !text.is_empty() {
            self.send(DeltaKind::TextDelta { text });
        }
    }

    /// Sends a fragment of the tool call at `position` (its id and name when known).
    pub fn tool_call(
        &self,
        position: u32,
        id: Option<String>,
        name: Option<String>,
        arguments: impl Into<String>,
    ) {
        self.send(DeltaKind::ToolCallDelta {
            position,
            id,
            name,
            arguments: arguments.into(),
        });
    }

    /// Whether deltas go anywhere: an adapter may skip building them when they do not.
    pub fn is_connected(&self) -> bool {
        self.publish.is_some()
    }

    fn send(&self, kind: DeltaKind) {
        if let Some(publish) = &self.publish {
            publish(self.next.fetch_add(1, Ordering::Relaxed), kind);
        }
    }
}

impl fmt::Debug for DeltaSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeltaSink")
            .field("connected", &self.is_connected())
            .field("sent", &self.next.load(Ordering::Relaxed))
            .finish()
    }
}
