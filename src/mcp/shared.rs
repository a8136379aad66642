//! What an MCP server's tools and its supervisor share: the connection in use (numbered, so a
//! call can wait for a newer one), the tool list as last read, and the word of a call that
//! found the connection broken.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use rmcp::model::Tool;
use rmcp::service::Peer;
use rmcp::RoleClient;
use tokio::sync::{oneshot, watch, Notify};

use super::questions::{InFlight, ParkedCalls};
use super::server::McpServer;

/// What the tools' handlers and the supervisor share.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) server: McpServer,
    /// The connection in use; `None` while the server is down.
    pub(super) live: watch::Sender<Option<Live>>,
    /// Told when a call found the connection broken (an HTTP server that lost its session
    /// keeps the client's worker running): the supervisor drops it and connects again.
    pub(super) reconnect: Arc<Notify>,
    /// One more than the highest number of a connection a call found broken (0: none): the
    /// supervisor acts on a notification only for the connection it has, not for one it has
    /// already replaced (the highest is kept, so a late word about an old one loses nothing).
    pub(super) broken: Arc<AtomicU64>,
    /// The server's tools as last listed.
    pub(super) tools: RwLock<Vec<Tool>>,
    /// Bumped each time the list is read again.
    pub(super) list_generation: watch::Sender<u64>,
    /// The calls in flight, for the server's questions to find theirs.
    pub(super) in_flight: Arc<InFlight>,
    /// The calls whose question waits for a person.
    pub(super) parked: Arc<ParkedCalls>,
    /// Dropped with the last handle: the supervisor stops the server.
    pub(super) _stop: oneshot::Sender<()>,
}

/// A connection in use: its number (each new connection's is one more) and its peer.
#[derive(Clone, Debug)]
pub(super) struct Live {
    pub(super) number: u64,
    pub(super) peer: Peer<RoleClient>,
}

impl Shared {
    /// A working connection newer than connection `newer_than` (any, if `None`), once the
    /// server is up, waiting at most the server's connect timeout.
    pub(super) async fn connection(&self, newer_than: Option<u64>) -> Option<Live> {
        let mut live = self.live.subscribe();
        let usable = |live: &Option<Live>| {
            live.as_ref().is_some_and(|live| {
                !live.peer.is_transport_closed()
                    && newer_than.is_none_or(|number| live.number > number)
            })
        };
        let wait = async {
            live.wait_for(usable)
                .await
                .ok()
                .and_then(|live| live.clone())
        };
        tokio::time::timeout(self.server.connect_timeout, wait)
            .await
            .ok()
            .flatten()
    }

    /// A call found connection `number` broken: it is dropped and made again (if it is still
    /// the one in use).
    pub(super) fn broken(&self, number: u64) {
        self.broken
            .fetch_max(number.saturating_add(1), Ordering::AcqRel);
        self.reconnect.notify_one();
    }
}
