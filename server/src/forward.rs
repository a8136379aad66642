//! Any node answers any request: on a store several nodes share, a request for a session
//! whose tree another live node owns is sent on to that node (its address from the
//! membership table, [`dormant::Runtime::owner_of`]) and its answer returned as is, streams
//! included. A request is tried here first: an answer marked [`OwnedElsewhere`] (the session
//! could not be activated here, or its stream lives on the owner) is what sends it on. A
//! forwarded request carries [`FORWARDED`] and is never sent on again, so two nodes that
//! disagree for a moment answer 503 rather than bounce it between them; nothing was written
//! here either way.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use dormant::SessionId;

use crate::error::ApiError;
use crate::server::AppState;

/// The header a forwarded request carries (the name of the node that sent it on).
pub const FORWARDED: &str = "x-dormant-forwarded";

/// Marks an answer given because another node owns the session's tree.
#[derive(Clone, Debug)]
pub(crate) struct OwnedElsewhere(pub(crate) SessionId);

/// The client that sends requests on to their owners.
pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap_or_default()
}

/// The layer: tries the request here, and sends it on to the owner of the session if the
/// answer says another node owns it.
pub(crate) async fn to_owner(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    // A request's runtime calls are served here, never sent on one by one: this layer sends
    // the whole request on instead (one hop, not one per call), and a request another node
    // sent here is never sent on again.
    if request.headers().contains_key(FORWARDED) {
        return dormant::peer::here_only(next.run(request)).await;
    }
    let (parts, body) = request.into_parts();
    // The body is kept to be sent on; its length was checked against the cap already.
    let body = match axum::body::to_bytes(body, state.config.max_body_bytes).await {
        Ok(body) => body,
        Err(_) => {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                format!("the body is over {} bytes", state.config.max_body_bytes),
            )
            .into_response()
        }
    };
    let (method, uri, headers) = (
        parts.method.clone(),
        parts.uri.clone(),
        parts.headers.clone(),
    );
    let response =
        dormant::peer::here_only(next.run(Request::from_parts(parts, Body::from(body.clone()))))
            .await;
    let Some(OwnedElsewhere(session)) = response.extensions().get::<OwnedElsewhere>().cloned()
    else {
        return response;
    };
    let owner = match state.runtime.owner_of(&session).await {
        Ok(Some(owner)) => owner,
        // Nobody else owns it (any more): the answer stands, and a retry is served here.
        Ok(None) | Err(_) => return response,
    };
    let Some(address) = owner.address else {
        return response;
    };
    tracing::debug!(%session, node = %owner.node, %address, "server.forwarded");
    match send_on(&state.peers, &address, method, &uri, &headers, body).await {
        Ok(answer) => answer,
        Err(error) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "owner_unreachable",
            format!(
                "session {session} is owned by node {} at {address}, which did not answer: {error}",
                owner.node
            ),
        )
        .into_response(),
    }
}

/// Sends the request to `address` and returns its answer, body streamed.
async fn send_on(
    client: &reqwest::Client,
    address: &str,
    method: Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, reqwest::Error> {
    let path = uri.path_and_query().map_or("/", |path| path.as_str());
    let url = format!("{}{path}", address.trim_end_matches('/'));
    let mut request = client.request(method, url).body(body);
    for (name, value) in headers {
        if !hop_by_hop(name) && name != header::HOST && name != header::CONTENT_LENGTH {
            request = request.header(name, value);
        }
    }
    let answer = request.header(FORWARDED, "1").send().await?;
    let mut response = Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        if !hop_by_hop(name) {
            response = response.header(name, value);
        }
    }
    Ok(response
        .body(Body::from_stream(answer.bytes_stream()))
        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response()))
}

/// Headers that describe one connection, not the request: never sent on.
fn hop_by_hop(name: &HeaderName) -> bool {
    [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::TE,
        header::TRAILER,
        header::UPGRADE,
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
    ]
    .contains(name)
        || name.as_str() == "keep-alive"
}
