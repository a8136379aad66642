//! Agents marked `"remote": true` live on a second runtime, served over HTTP on a loopback
//! port by a [`RemoteHost`] the caller gives (`dormant-server`'s tests give one; this crate
//! has no HTTP server). A `sub_agent` tool naming a remote agent becomes a remote sub-agent
//! tool, so a nested-suspension scenario runs across the boundary by marking its child
//! remote. `restart` restarts both runtimes; the remote comes back on the same port, where
//! its children's entries say it lives.

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::remote::RemoteAgents;
use crate::runtime::Runtime;

/// Serves a runtime over HTTP for the scenario runner, and reaches what it serves.
pub trait RemoteHost: Send + Sync + fmt::Debug {
    /// Serves `runtime` on 127.0.0.1:`port` (0: any free port) until the answer is stopped.
    fn serve(&self, runtime: Runtime, port: u16) -> BoxFuture<'static, Result<Served, String>>;

    /// The transport the local runtime reaches the served one with (its credentials
    /// included).
    fn transport(&self) -> Arc<dyn RemoteAgents>;
}

/// A runtime being served.
pub struct Served {
    /// Its base URL.
    pub endpoint: String,
    /// Its port (the same again after a restart).
    pub port: u16,
    /// Stops serving (the runtime itself is shut down by the runner).
    pub stop: Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send + Sync>,
}

impl fmt::Debug for Served {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Served")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}
