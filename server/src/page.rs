//! The page at `/`: plain HTML and JavaScript with no build step (`page/index.html`,
//! `page/page.js`), compiled into the binary. A strict Content-Security-Policy allows only
//! its own script and this server.
//!
//! Every path the page uses is relative to its own URL, so a daemon may nest the router under
//! a prefix (`Router::nest("/agents", …)`): the page at `/agents` loads `./agents/page.js`, and
//! the script resolves each route beside itself.

use axum::extract::{OriginalUri, State};
use axum::http::header;
use axum::response::{Html, IntoResponse};

use crate::state::AppState;

const INDEX: &str = include_str!("../page/index.html");

/// The page's scripts, by the path each is served at: the form generator, the cards of
/// waiting calls, the conversation, the inbox, an approval opened by its link on another
/// device (loaded in this order).
pub(crate) const SCRIPTS: [(&str, &str); 5] = [
    ("/form.js", include_str!("../page/form.js")),
    ("/cards.js", include_str!("../page/cards.js")),
    ("/page.js", include_str!("../page/page.js")),
    ("/inbox.js", include_str!("../page/inbox.js")),
    ("/device.js", include_str!("../page/device.js")),
];
const POLICY: &str = "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `GET /`: the page, with the agent it starts sessions of.
pub(crate) async fn index(
    State(state): State<AppState>,
    OriginalUri(uri): OriginalUri,
) -> impl IntoResponse {
    let page = INDEX
        .replace("{{AGENT}}", &escape(&state.config.page_agent))
        .replace("{{TITLE}}", &escape(&state.config.page_title))
        .replace("{{PLACEHOLDER}}", &escape(&state.config.page_placeholder))
        .replace("{{BASE}}", &escape(&base(uri.path())));
    (
        [
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        Html(page),
    )
}

/// `GET /page.js` and the other [`SCRIPTS`].
pub(crate) async fn script(text: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        text,
    )
}

/// Where the routes are, relative to the page at `path` (the path the browser asked for, with
/// any prefix the router is nested under): a URL that ends in `/` resolves a relative path
/// beside itself, one that does not (`/agents`, as `Router::nest("/agents", …)` serves it)
/// against its parent, so the last segment is named again. Always starts with `./`, so that
/// a segment with a colon is never read as a URL scheme.
fn base(path: &str) -> String {
    match path.rsplit('/').next() {
        Some(last) if !last.is_empty() => format!("./{last}/"),
        _ => "./".to_string(),
    }
}

/// HTML-escapes a text for an attribute or element.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

#[cfg(test)]
mod tests {
    use super::base;

    #[test]
    fn the_routes_are_found_beside_the_page_wherever_it_is_mounted() {
        assert_eq!(base("/"), "./");
        assert_eq!(base(""), "./");
        assert_eq!(base("/agents/"), "./");
        assert_eq!(base("/agents"), "./agents/");
        assert_eq!(base("/team/a:b"), "./a:b/");
    }
}
