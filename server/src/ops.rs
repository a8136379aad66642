//! `GET /healthz` and `GET /metrics`: for whoever operates the server (no session data, so
//! no token; put them behind your proxy's rules if they must not be public).

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

use crate::state::AppState;

/// 200 while the server serves; 503 once it is shutting down (a load balancer stops sending).
pub(crate) async fn healthz(State(state): State<AppState>) -> impl IntoResponse {
    if *state.closing.borrow() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "shutting_down" })),
        );
    }
    let stats = state.runtime.stats();
    // Still serving (reads, streams, what needs no commit), but not whole: say so.
    if let Some(reason) = state.runtime.store_degraded() {
        return (
            StatusCode::OK,
            Json(json!({
                "status": "degraded",
                "reason": reason,
                "resident_sessions": stats.host.resident,
            })),
        );
    }
    (
        StatusCode::OK,
        Json(json!({ "status": "ok", "resident_sessions": stats.host.resident })),
    )
}

/// The Prometheus text format.
pub(crate) async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let text = state
        .metrics
        .render(&state.runtime.stats(), &state.runtime.client_tool_stats());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
}
