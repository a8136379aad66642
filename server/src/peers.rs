//! Calls between the nodes of one cluster ([`dormant::peer`]): [`HttpPeers`] sends a
//! [`PeerCall`] to the node that owns the session's tree (`POST /peer` at its advertised
//! address, with its key from the shared store) and follows a session's stream there
//! (`POST /peer/follow`); [`serve`] and [`follow`] answer them here. Not client routes: a
//! call carries the node's key, not a session token, and is served by the runtime itself,
//! here and never further. The agent server's own routes call the runtime, which routes each
//! call to its owner through this transport.

use std::time::Duration;

use async_trait::async_trait;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use dormant::peer::{LeaseOwner, PeerAnswer, PeerCall, PeerEvent, PeerEvents, Peers};
use dormant::remote::RemoteError;
use dormant::SessionId;
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};

use crate::client::HttpClient;
use crate::error::ApiError;
use crate::remote::{refusal, unreachable};
use crate::state::AppState;

/// The header a peer call carries the owner's key in.
pub const PEER_KEY: &str = "x-dormant-peer-key";

/// The route a node serves its peers' calls at.
pub(crate) const PEER_ROUTE: &str = "/peer";

/// The route a node serves its peers' follows at.
pub(crate) const FOLLOW_ROUTE: &str = "/peer/follow";

/// The body of `POST /peer/follow`: whose stream, from which chunk.
#[derive(Debug, Serialize, Deserialize)]
struct Follow {
    session: SessionId,
    from: u64,
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
        let endpoint = owner.address.clone().unwrap_or_default();
        let body = Follow {
            session: session.clone(),
            from,
        };
        let response = self.post(owner, FOLLOW_ROUTE, &body).await?;
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

/// The caller's key, if it is this node's: a caller without it is refused whatever it sent,
/// and learns nothing of how its body would have been read.
fn peer_key<'h>(state: &AppState, headers: &'h HeaderMap) -> Result<&'h str, ApiError> {
    let key = headers
        .get(PEER_KEY)
        .and_then(|key| key.to_str().ok())
        .unwrap_or_default();
    if !state.runtime.accepts_peer_key(key) {
        return Err(ApiError::from(dormant::Error::PeerRefused));
    }
    Ok(key)
}

/// A body that is no call: 400.
fn unreadable(what: &str, error: &serde_json::Error) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_request",
        format!("not a peer {what}: {error}"),
    )
}

/// `POST /peer`: a call from another node of the cluster, answered 200 with its
/// [`PeerAnswer`] (a failure of the call included), 403 `peer_refused` without this node's
/// key, 400 for a body that is no call. The key is checked first.
pub(crate) async fn serve(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let key = peer_key(&state, &headers)?;
    let call: PeerCall =
        serde_json::from_slice(&body).map_err(|error| unreadable("call", &error))?;
    let answer = state.runtime.serve_peer(key, call).await?;
    Ok(Json(answer).into_response())
}

/// `POST /peer/follow`: another node follows a session's stream here, where it runs: 200 with
/// one JSON [`PeerEvent`] a line, as the chunks and deltas come, until the caller hangs up
/// (or the stream fails here, which its last event says). 403 and 400 as `POST /peer`.
pub(crate) async fn follow(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let key = peer_key(&state, &headers)?;
    let Follow { session, from } =
        serde_json::from_slice(&body).map_err(|error| unreadable("follow", &error))?;
    let events = state.runtime.serve_peer_follow(key, &session, from)?;
    let lines = events.map(|event| {
        let mut line = serde_json::to_vec(&event).unwrap_or_default();
        line.push(b'\n');
        Ok::<_, std::convert::Infallible>(Bytes::from(line))
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response())
}
