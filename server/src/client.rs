//! [`HttpClient`]: the one HTTP client a process's outgoing calls share, the remote
//! sub-agents' ([`HttpRemoteAgents`](crate::HttpRemoteAgents)) and the cluster's
//! ([`HttpPeers`](crate::HttpPeers)), so that they share one connection pool and one TLS
//! configuration rather than building one each.

use std::time::Duration;

/// How long connecting to another server may take, unless configured otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// An HTTP client for the calls a server makes to other servers. Cloning it shares it (its
/// pool of connections, its TLS configuration): build one, and give clones to
/// [`HttpRemoteAgents::with_client`](crate::HttpRemoteAgents::with_client) and
/// [`HttpPeers::with_client`](crate::HttpPeers::with_client).
///
/// ```
/// use dormant_server::{HttpClient, HttpPeers, HttpRemoteAgents};
///
/// let client = HttpClient::new();
/// let remote = HttpRemoteAgents::with_client(client.clone(), Some("operator-secret".into()));
/// let peers = HttpPeers::with_client(client);
/// # let _ = (remote, peers);
/// ```
#[derive(Clone, Debug, Default)]
pub struct HttpClient {
    inner: reqwest::Client,
}

impl HttpClient {
    /// A client that gives up connecting after [`DEFAULT_CONNECT_TIMEOUT`].
    pub fn new() -> Self {
        Self::with_connect_timeout(DEFAULT_CONNECT_TIMEOUT)
    }

    /// A client that gives up connecting after `timeout` (a request's own time is bounded by
    /// the transport that sends it).
    pub fn with_connect_timeout(timeout: Duration) -> Self {
        let inner = reqwest::Client::builder()
            .connect_timeout(timeout)
            .build()
            // Building fails only where the TLS backend cannot start; a default client then
            // fails each call with a typed `Unreachable` rather than the server at start.
            .unwrap_or_default();
        Self { inner }
    }

    /// A client configured in full by the caller (TLS roots, proxies, pool limits), as a
    /// `reqwest` client of the version this crate uses.
    pub fn from_reqwest(client: reqwest::Client) -> Self {
        Self { inner: client }
    }

    /// The client itself, for a transport's requests.
    pub(crate) fn reqwest(&self) -> &reqwest::Client {
        &self.inner
    }
}
