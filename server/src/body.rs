//! What comes in: a body needs a `Content-Length` within the cap (checked before a byte of it
//! is read), JSON content, and JSON no deeper than the limit.

use axum::extract::{FromRequest, Request};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE, TRANSFER_ENCODING};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::error::Category;
use serde_json::Value;

use crate::error::ApiError;
use crate::state::AppState;

/// The layer of a route that reads its body (the route table, server.rs, gives it to each
/// such route): the body must say its length (411 otherwise, chunked bodies included) and
/// stay within the cap (413), checked before a byte of it is read. Any other request is
/// answered (404, 405, or a GET's answer) without its body read, so its length is not its
/// concern.
pub(crate) async fn length_checked(limit: usize, request: Request, next: Next) -> Response {
    match check_length(&request, limit) {
        Ok(()) => next.run(request).await,
        Err(refused) => refused.into_response(),
    }
}

fn check_length(request: &Request, limit: usize) -> Result<(), ApiError> {
    let headers = request.headers();
    let declared = headers
        .get(CONTENT_LENGTH)
        .filter(|_| !headers.contains_key(TRANSFER_ENCODING))
        .map(|value| {
            value
                .to_str()
                .ok()
                .and_then(|text| text.parse::<u64>().ok())
        });
    match declared {
        // A chunked body says no length up front: it is refused as one with none.
        None => Err(ApiError::new(
            StatusCode::LENGTH_REQUIRED,
            "length_required",
            "a request body needs a Content-Length header (chunked bodies are not accepted)",
        )),
        Some(None) => Err(ApiError::invalid("Content-Length is not a number")),
        Some(Some(length)) if length > limit as u64 => Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the body is {length} bytes; the limit is {limit}"),
        )
        .with(serde_json::json!({ "size": length, "limit": limit }))),
        Some(Some(_)) => Ok(()),
    }
}

/// A JSON body: `Content-Type: application/json`, at most the cap, nested at most the depth
/// limit, of type `T` (unknown fields refused where `T` says so).
#[derive(Debug)]
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, ApiError> {
        let (parts, body) = request.into_parts();
        Self::read(&parts.headers, body, state).await
    }
}

impl<T: DeserializeOwned> JsonBody<T> {
    /// Reads the body of a request whose `headers` its handler keeps (as an extractor of
    /// the headers would copy them).
    pub(crate) async fn read(
        headers: &HeaderMap,
        body: axum::body::Body,
        state: &AppState,
    ) -> Result<Self, ApiError> {
        let bytes = json_bytes(headers, body, state).await?;
        // serde reads a struct from an array too; a request is an object with named fields.
        if bytes.iter().find(|byte| !byte.is_ascii_whitespace()) != Some(&b'{') {
            return Err(ApiError::invalid("the body must be a JSON object"));
        }
        // Straight into `T`, with no `Value` built first.
        from_checked(&bytes).map(JsonBody).map_err(refused)
    }
}

/// Why a body was refused: not JSON at all, or JSON of the wrong shape.
fn refused(error: serde_json::Error) -> ApiError {
    match error.classify() {
        Category::Data => ApiError::invalid(format!("malformed request: {error}")),
        Category::Io | Category::Syntax | Category::Eof => {
            ApiError::invalid(format!("the body is not valid JSON: {error}"))
        }
    }
}

/// The body as a JSON value, checked as [`JsonBody`] says.
pub(crate) async fn json_value(
    headers: &HeaderMap,
    body: axum::body::Body,
    state: &AppState,
) -> Result<Value, ApiError> {
    let bytes = json_bytes(headers, body, state).await?;
    // Any JSON is a `Value`: only "not valid JSON" can come of it.
    from_checked(&bytes).map_err(refused)
}

/// The bytes of a JSON body: JSON content, within the cap, nested no deeper than the depth
/// limit (measured on the bytes, before anything is built: a deep document costs no
/// recursion at all).
async fn json_bytes(
    headers: &HeaderMap,
    body: axum::body::Body,
    state: &AppState,
) -> Result<axum::body::Bytes, ApiError> {
    let is_json = headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"));
    if !is_json {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "the body must be JSON (Content-Type: application/json)",
        ));
    }
    let limit = state.config.max_body_bytes;
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|error| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the body could not be read within {limit} bytes: {error}"),
        )
    })?;
    // One level more than a value may nest: the envelope's object around a submitted result.
    let max_depth = state.config.max_json_depth + 1;
    if let Some(depth) = too_deep(&bytes, max_depth) {
        return Err(ApiError::invalid(format!(
            "the body nests deeper than {max_depth} arrays and objects (at least {depth})"
        )));
    }
    Ok(bytes)
}

/// `T` from JSON whose depth [`json_bytes`] bounded: serde_json's own limit (127 levels, one
/// short of the runtime's default 128) is off, so a result the runtime takes in process is
/// taken here too.
fn from_checked<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, serde_json::Error> {
    let mut parser = serde_json::Deserializer::from_slice(bytes);
    parser.disable_recursion_limit();
    let value = T::deserialize(&mut parser)?;
    parser.end()?;
    Ok(value)
}

/// The depth past the limit, if the document's brackets go that deep (strings skipped).
fn too_deep(bytes: &[u8], max_depth: usize) -> Option<usize> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &byte in bytes {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max_depth {
                    return Some(depth);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_is_counted_outside_strings_only() {
        let deep = format!("{}{}", "[".repeat(129), "]".repeat(129));
        assert_eq!(too_deep(deep.as_bytes(), 128), Some(129));
        let ok = format!("{}{}", "[".repeat(128), "]".repeat(128));
        assert_eq!(too_deep(ok.as_bytes(), 128), None);
        // Past serde_json's own limit of 127 levels: parsed all the same.
        assert!(from_checked::<Value>(ok.as_bytes()).is_ok());
        let quoted = format!("{{\"a\": \"{}\\\"{}\"}}", "[".repeat(500), "{".repeat(500));
        assert_eq!(too_deep(quoted.as_bytes(), 2), None);
        assert!(from_checked::<Value>(quoted.as_bytes()).is_ok());
        assert!(from_checked::<Value>(b"{\"a\": [1, 2").is_err());
    }
}

/// The one `{…}` segment of a route's path (an agent's name, say); one that is not UTF-8
/// once decoded is a typed 400 like a malformed body, not axum's plain-text answer.
#[derive(Debug)]
pub(crate) struct Segment(pub(crate) String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Segment {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        axum::extract::Path::<String>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(segment)| Segment(segment))
            .map_err(|error| ApiError::invalid(format!("malformed path: {}", error.body_text())))
    }
}

/// Query parameters of type `T`; malformed ones are a typed 400 like a malformed body.
#[derive(Debug)]
pub(crate) struct Params<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> axum::extract::FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::try_from_uri(&parts.uri)
            .map(|axum::extract::Query(params)| Params(params))
            .map_err(|error| ApiError::invalid(format!("malformed query: {}", error.body_text())))
    }
}
