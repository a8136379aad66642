//! The state every handler shares. It imports none of the handlers: they import it, and
//! the router (server.rs) builds it.

use std::sync::Arc;

use dormant::Runtime;
use tokio::sync::watch;

use crate::auth::Auth;
use crate::config::ServerConfig;
use crate::metrics::HttpMetrics;
use crate::token::TokenKey;

/// What every handler reaches. One `Arc`: a request clones it several times (each layer and
/// handler takes its own, a stream keeps one), and one shared count costs less to move
/// between the cores than the seven of its parts.
#[derive(Clone, Debug)]
pub(crate) struct AppState(pub(crate) Arc<Shared>);

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// What [`AppState`] shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) runtime: Runtime,
    pub(crate) auth: Auth,
    pub(crate) key: Arc<TokenKey>,
    pub(crate) config: Arc<ServerConfig>,
    pub(crate) closing: watch::Receiver<bool>,
    pub(crate) metrics: Arc<HttpMetrics>,
    /// The A2A contexts whose follow-up message is being applied (its answers recorded, the
    /// resume they lead to not started yet): their task reads as working meanwhile, not as
    /// one the next message must resume. How many such messages each has in flight.
    pub(crate) a2a_answering:
        parking_lot::Mutex<std::collections::HashMap<dormant::SessionId, usize>>,
}
