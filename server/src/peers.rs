//! Calls between the nodes of one cluster ([`dormant::cluster::peer`]): [`HttpPeers`] sends a
//! [`PeerCall`] to the node that owns the session's tree (`POST /peer` at its advertised
//! address, with its key from the shared store), follows a session's stream there
//! (`POST /peer/follow`), or does both for an answer, its resume and the run that resume
//! starts (`POST /peer/submit-follow`); peer_routes.rs answers them there. The agent server's
//! own routes call the runtime, which routes each call to its owner through this transport.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use dormant::cluster::leases::LeaseOwner;
use dormant::cluster::peer::{PeerAnswer, PeerCall, PeerEvent, PeerEvents, Peers};
use dormant::remote::RemoteError;
use dormant::{SessionId, Submit};
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};

use crate::client::HttpClient;
use crate::remote::{refusal, unreachable};

/// The header a peer call carries the owner's key in.
pub const PEER_KEY: &str = "x-dormant-peer-key";

/// The route a node serves its peers' calls at.
pub(crate) const PEER_ROUTE: &str = "/peer";

/// The route a node serves its peers' follows at.
pub(crate) const FOLLOW_ROUTE: &str = "/peer/follow";

/// The route a node serves its peers' answers with their follows at (a node of an earlier
/// version answers 404, and its peers make the two calls instead).
pub(crate) const SUBMIT_FOLLOW_ROUTE: &str = "/peer/submit-follow";

/// The header of a follow's answer that ends at the session's settle, as `to_settle` asked
/// (a node of an earlier version answers without it, and follows open-ended).
pub(crate) const FOLLOW_TO_SETTLE: &str = "x-dormant-follow-to-settle";

/// The body of `POST /peer/follow`: whose stream, from which chunk, and whether it ends at the
/// session's next settle (with a `settled` event; absent, false: a node of an earlier
/// version asks without it).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Follow {
    pub(crate) session: SessionId,
    pub(crate) from: u64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) to_settle: bool,
}

/// The [`Peers`] transport over HTTP: give it to every node's runtime
/// (`RuntimeBuilder::peers`) and serve each node's router at the address it advertises.
///
/// ```no_run
/// # use std::sync::Arc;
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = dormant::PgStore::builder("postgres://postgres@127.0.0.1/postgres")
///     .advertise("http://10.0.0.7:8080")
///     .connect()
///     .await?;
/// let runtime = dormant::Runtime::builder()
///     .shared_store(Arc::new(store))
///     .peers(Arc::new(dormant_server::HttpPeers::new()))
///     .build()?;
/// # let _ = runtime; Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct HttpPeers {
    client: HttpClient,
}

impl Default for HttpPeers {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpPeers {
    /// A transport that connects within 2 s and then waits as long as the call takes (a
    /// routed `execute_on` answers when its run settles).
    pub fn new() -> Self {
        Self::with_client(HttpClient::with_connect_timeout(Duration::from_secs(2)))
    }

    /// A transport on `client`, shared with the process's other outgoing calls (its
    /// connections and TLS configuration), waiting as long as each call takes.
    pub fn with_client(client: HttpClient) -> Self {
        Self { client }
    }

    /// Posts `body` to `path` at `owner`'s address with its key; a response that is not a
    /// success is the owner's refusal.
    async fn post(
        &self,
        owner: &LeaseOwner,
        path: &str,
        body: &impl Serialize,
    ) -> Result<reqwest::Response, RemoteError> {
        let endpoint = owner.address.as_deref().unwrap_or_default();
        let url = format!("{}{path}", endpoint.trim_end_matches('/'));
        let key = owner.key.as_ref().map_or("", |key| key.as_str());
        let response = self
            .client
            .reqwest()
            .post(url)
            .header(PEER_KEY, key)
            .json(body)
            .send()
            .await
            .map_err(|error| unreachable(endpoint, &error))?;
        if !response.status().is_success() {
            return Err(refusal(endpoint, response).await);
        }
        Ok(response)
    }
}

#[async_trait]
impl Peers for HttpPeers {
    async fn call(&self, owner: &LeaseOwner, call: &PeerCall) -> Result<PeerAnswer, RemoteError> {
        let endpoint = owner.address.as_deref().unwrap_or_default();
        self.post(owner, PEER_ROUTE, call)
            .await?
            .json::<PeerAnswer>()
            .await
            .map_err(|error| RemoteError::Protocol {
                endpoint: endpoint.to_string(),
                reason: error.to_string(),
            })
    }

    async fn follow(
        &self,
        owner: &LeaseOwner,
        session: &SessionId,
        from: u64,
    ) -> Result<Option<PeerEvents>, RemoteError> {
        self.follow_on(owner, session, from, false).await
    }

    async fn follow_to_settle(
        &self,
        owner: &LeaseOwner,
        session: &SessionId,
        from: u64,
    ) -> Result<Option<PeerEvents>, RemoteError> {
        self.follow_on(owner, session, from, true).await
    }

    async fn submit_and_follow(
        &self,
        owner: &LeaseOwner,
        submit: &Submit,
    ) -> Result<Option<PeerEvents>, RemoteError> {
        let endpoint = owner.address.clone().unwrap_or_default();
        // The call `PeerCall::SubmitAndResume` is on the wire, without a copy of the submit
        // to wrap (its envelope is written from it).
        let call = serde_json::json!({ "call": "submit_and_resume", "envelope": submit.to_json() });
        match self.post(owner, SUBMIT_FOLLOW_ROUTE, &call).await {
            Ok(response) => Ok(Some(events(endpoint, response.bytes_stream()).boxed())),
            // An owner of an earlier version: the runtime makes the two calls.
            Err(RemoteError::Refused { status: 404, .. }) => Ok(None),
            Err(other) => Err(other),
        }
    }
}

impl HttpPeers {
    /// The owner's stream; `None` when it was asked `to_settle` and did not say it ends there
    /// (a node of an earlier version): the runtime then follows open-ended and waits for the
    /// settle by a call.
    async fn follow_on(
        &self,
        owner: &LeaseOwner,
        session: &SessionId,
        from: u64,
        to_settle: bool,
    ) -> Result<Option<PeerEvents>, RemoteError> {
        let endpoint = owner.address.clone().unwrap_or_default();
        let body = Follow {
            session: session.clone(),
            from,
            to_settle,
        };
        let response = self.post(owner, FOLLOW_ROUTE, &body).await?;
        if to_settle && !response.headers().contains_key(FOLLOW_TO_SETTLE) {
            return Ok(None);
        }
        Ok(Some(events(endpoint, response.bytes_stream()).boxed()))
    }
}

/// The events of a follow's body: one JSON [`PeerEvent`] a line.
fn events(
    endpoint: String,
    body: impl Stream<Item = Result<Bytes, reqwest::Error>> + Send + 'static,
) -> impl Stream<Item = Result<PeerEvent, RemoteError>> + Send + 'static {
    let reader = Lines {
        endpoint,
        body: Box::pin(body),
        buffer: Vec::new(),
    };
    futures::stream::unfold(reader, |mut reader| async move {
        let event = reader.next().await?;
        Some((event, reader))
    })
}

/// Reads a body line by line.
struct Lines {
    endpoint: String,
    body: std::pin::Pin<Box<dyn Stream<Item = Result<Bytes, reqwest::Error>> + Send>>,
    buffer: Vec<u8>,
}

impl Lines {
    /// The next event; `None` at the end of the body (or after a failure).
    async fn next(&mut self) -> Option<Result<PeerEvent, RemoteError>> {
        loop {
            if let Some(end) = self.buffer.iter().position(|byte| *byte == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                return Some(serde_json::from_slice(&line).map_err(|error| {
                    RemoteError::Protocol {
                        endpoint: self.endpoint.clone(),
                        reason: format!("a followed stream's event: {error}"),
                    }
                }));
            }
            match self.body.next().await? {
                Ok(bytes) => self.buffer.extend_from_slice(&bytes),
                Err(error) => return Some(Err(unreachable(&self.endpoint, &error))),
            }
        }
    }
}
