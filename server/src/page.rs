//! The page at `/`: plain HTML and JavaScript with no build step (`page/index.html`,
//! `page/page.js`), compiled into the binary. A strict Content-Security-Policy allows only
//! its own script and this server.

use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse};

use crate::server::AppState;

const INDEX: &str = include_str!("../page/index.html");
const SCRIPT: &str = include_str!("../page/page.js");
const POLICY: &str = "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `GET /`: the page, with the agent it starts sessions of.
pub(crate) async fn index(State(state): State<AppState>) -> impl IntoResponse {
    let page = INDEX.replace("{{AGENT}}", &escape(&state.config.page_agent));
    (
        [
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        Html(page),
    )
}

/// `GET /page.js`.
pub(crate) async fn script() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        SCRIPT,
    )
}

/// HTML-escapes a text for an attribute or element.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}
