//! Calls between the nodes of one cluster ([`dormant::peer`]): [`HttpPeers`] sends a
//! [`PeerCall`] of the in-process API to the node that owns the session (`POST /peer` at its
//! advertised address, with its key from the shared store), and [`serve`] answers one here.
//! Not a client route: a call carries the node's key, not a session token, and is served by
//! the runtime itself, here and never further.

use std::time::Duration;

use async_trait::async_trait;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use dormant::peer::{PeerAnswer, PeerCall, Peers};
use dormant::remote::RemoteError;
use dormant::store::LeaseOwner;

use crate::error::ApiError;
use crate::forward::FORWARDED;
use crate::remote::{refusal, unreachable};
use crate::server::AppState;

/// The header a peer call carries the owner's key in.
pub const PEER_KEY: &str = "x-dormant-peer-key";

/// The route a node serves its peers' calls at.
pub(crate) const PEER_ROUTE: &str = "/peer";

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
///     .store(Arc::new(store))
///     .peers(Arc::new(dormant_server::HttpPeers::new()))
///     .build()?;
/// # let _ = runtime; Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct HttpPeers {
    client: reqwest::Client,
}

impl Default for HttpPeers {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpPeers {
    /// A transport that connects within 2 s and then waits as long as the call takes (a
    /// forwarded `execute_on` answers when its run settles).
    pub fn new() -> Self {
        Self {
            client: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(2))
                .build()
                .unwrap_or_default(),
        }
    }
}

#[async_trait]
impl Peers for HttpPeers {
    async fn call(&self, owner: &LeaseOwner, call: &PeerCall) -> Result<PeerAnswer, RemoteError> {
        let endpoint = owner.address.as_deref().unwrap_or_default();
        let url = format!("{}{PEER_ROUTE}", endpoint.trim_end_matches('/'));
        let key = owner.key.as_ref().map_or("", |key| key.as_str());
        let response = self
            .client
            .post(url)
            .header(PEER_KEY, key)
            .header(FORWARDED, "1")
            .json(call)
            .send()
            .await
            .map_err(|error| unreachable(endpoint, &error))?;
        if !response.status().is_success() {
            return Err(refusal(endpoint, response).await);
        }
        response
            .json::<PeerAnswer>()
            .await
            .map_err(|error| RemoteError::Protocol {
                endpoint: endpoint.to_string(),
                reason: error.to_string(),
            })
    }
}

/// `POST /peer`: a call from another node of the cluster, answered 200 with its
/// [`PeerAnswer`] (a failure of the call included), 403 `peer_refused` without this node's
/// key, 400 for a body that is no call. The key is checked first: a caller without it is
/// refused whatever it sent, and learns nothing of how its body would have been read.
pub(crate) async fn serve(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let key = headers
        .get(PEER_KEY)
        .and_then(|key| key.to_str().ok())
        .unwrap_or_default();
    if !state.runtime.accepts_peer_key(key) {
        return ApiError::from(dormant::Error::PeerRefused).into_response();
    }
    let call: PeerCall = match serde_json::from_slice(&body) {
        Ok(call) => call,
        Err(error) => {
            return ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                format!("not a peer call: {error}"),
            )
            .into_response()
        }
    };
    match state.runtime.serve_peer(key, call).await {
        Ok(answer) => Json(answer).into_response(),
        Err(error) => ApiError::from(error).into_response(),
    }
}
