//! Building the router: the state every handler shares, the layers, and the switch that
//! ends streams when the server shuts down.

use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::Router;
use dormant::Runtime;
use tokio::sync::watch;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tracing::Instrument as _;

use crate::auth::Auth;
use crate::config::ServerConfig;
use crate::error::{ApiError, ServerError};
use crate::metrics::HttpMetrics;
use crate::state::{AppState, Shared};
use crate::token::TokenKey;
use crate::{a2a, agui, approval_routes, body, ops, page, routes, session_token, sse};

/// Tells a server's streams that it is shutting down: each sends a last `end` event
/// (`reason: shutdown`) and closes, so a graceful shutdown is not held up by open streams.
/// Clients reconnect with `Last-Event-ID` once the server is back.
#[derive(Clone, Debug)]
pub struct Closing(Arc<watch::Sender<bool>>);

impl Closing {
    /// Ends every stream of the server; new ones are refused with 503.
    pub fn close(&self) {
        self.0.send_replace(true);
    }

    /// Waits until [`Closing::close`] is called (for `with_graceful_shutdown`).
    pub async fn closed(&self) {
        let mut closed = self.0.subscribe();
        let _ = closed.wait_for(|closed| *closed).await;
    }

    /// Whether [`Closing::close`] was called.
    pub fn is_closed(&self) -> bool {
        *self.0.borrow()
    }
}

/// A server under construction: the runtime, how callers are authenticated, its limits and
/// the key of its session tokens.
///
/// Give it a key that outlives the process, [`Server::token_key_file`] (as below): without
/// one, tokens are signed with a random key of this process, and every token a client holds
/// is refused (401) after a restart.
///
/// ```no_run
/// use dormant_server::{Auth, Server, ServerConfig};
/// # async fn serve(runtime: dormant::Runtime) -> Result<(), Box<dyn std::error::Error>> {
/// let server = Server::new(runtime.clone(), Auth::allow_unauthenticated())
///     .config(ServerConfig::default())
///     // Kept beside the store: tokens stay valid across restarts.
///     .token_key_file("sessions.token-key");
/// let closing = server.closing();
/// let app = server.router()?;
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
/// dormant_server::serve(listener, app)
///     .with_graceful_shutdown(async move {
///         let _ = tokio::signal::ctrl_c().await;
///         closing.close();
///     })
///     .await?;
/// runtime.shutdown().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Server {
    runtime: Runtime,
    auth: Auth,
    config: ServerConfig,
    key: Option<TokenKey>,
    key_file: Option<PathBuf>,
    closing: Closing,
}

impl Server {
    /// A server over `runtime`, authenticating with `auth`. Give it a durable token key with
    /// [`Server::token_key_file`] (or [`Server::token_key`]): its default key lives only as
    /// long as the process, and so do the tokens it signs.
    pub fn new(runtime: Runtime, auth: Auth) -> Self {
        Self {
            runtime,
            auth,
            config: ServerConfig::default(),
            key: None,
            key_file: None,
            closing: Closing(Arc::new(watch::channel(false).0)),
        }
    }

    /// Its limits and options.
    pub fn config(mut self, config: ServerConfig) -> Self {
        self.config = config;
        self
    }

    /// The key its session tokens are signed with (default: a random key for this process,
    /// so tokens die with it). See [`Server::token_key_file`] for one kept in a file.
    pub fn token_key(mut self, key: TokenKey) -> Self {
        self.key = Some(key);
        self
    }

    /// Signs session tokens with the key kept in `path`, created there (mode 0600) on the
    /// first start ([`TokenKey::load_or_create`], when [`Server::router`] is called), so that
    /// tokens stay valid across restarts. Keep the file with the store: a store whose key is
    /// lost keeps its sessions, but every token issued for them is refused (a key created
    /// here is logged, `server.token_key_created`; the binary goes further and refuses to
    /// start without `--new-token-key` when the store already existed).
    pub fn token_key_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.key_file = Some(path.into());
        self
    }

    /// The switch that ends its streams (see [`Closing`]).
    pub fn closing(&self) -> Closing {
        self.closing.clone()
    }

    /// The routes.
    ///
    /// # Errors
    /// [`ServerError::AuthNotConfigured`] without a hook or an explicit
    /// [`Auth::allow_unauthenticated`]; [`ServerError::InvalidConfig`];
    /// [`ServerError::TokenKey`] for a key file that cannot be read or created; a failed
    /// random key.
    pub fn router(self) -> Result<Router, ServerError> {
        if !self.auth.is_configured() {
            return Err(ServerError::AuthNotConfigured);
        }
        self.config.check()?;
        let key = match (self.key, self.key_file) {
            (Some(key), _) => key,
            (None, Some(path)) => {
                let found = TokenKey::load(&path).map_err(|source| ServerError::TokenKey {
                    path: path.clone(),
                    source,
                })?;
                match found {
                    Some(key) => key,
                    None => {
                        // Said out loud: on a first start this is expected, but a file lost
                        // beside a store in use makes every token issued so far invalid.
                        tracing::warn!(file = %path.display(), "server.token_key_created: no token key in this file: a new one is created; tokens signed with an earlier key are refused");
                        TokenKey::load_or_create(&path)
                            .map_err(|source| ServerError::TokenKey { path, source })?
                    }
                }
            }
            (None, None) => {
                tracing::warn!("server.token_key_ephemeral: session tokens are signed with a key of this process and stop working when it restarts (Server::token_key_file keeps one)");
                TokenKey::random().map_err(|error| ServerError::InvalidConfig {
                    setting: "token_key",
                    reason: format!("no random key: {error}"),
                })?
            }
        };
        let cors = cors(&self.config.cors_origins)?;
        let page = self.config.page;
        // The one list of routes. Those that read a body carry the layer that checks its
        // declared length before a byte is read (body.rs); the metrics count by these paths.
        let limit = self.config.max_body_bytes;
        let with_body = || {
            middleware::from_fn(move |request: Request, next: Next| {
                body::length_checked(limit, request, next)
            })
        };
        let mut table: Vec<(&'static str, MethodRouter<AppState>)> = vec![
            ("/start", post(routes::start).route_layer(with_body())),
            ("/resume", post(routes::resume).route_layer(with_body())),
            (
                "/submit-tool-result",
                post(routes::submit).route_layer(with_body()),
            ),
            (
                "/interrupt",
                post(routes::interrupt).route_layer(with_body()),
            ),
            ("/abort", post(routes::abort).route_layer(with_body())),
            ("/status", get(routes::status)),
            ("/runs", get(routes::runs)),
            ("/messages", get(routes::messages)),
            ("/checkpoints", get(routes::checkpoints)),
            ("/state", get(routes::state_at)),
            ("/fork", post(routes::fork).route_layer(with_body())),
            ("/inbox", get(routes::inbox)),
            ("/ag-ui", post(agui::run).route_layer(with_body())),
            ("/a2a", post(a2a::rpc).route_layer(with_body())),
            ("/.well-known/agent-card.json", get(a2a::card)),
            (
                "/a2a/{agent}",
                post(a2a::agent_rpc).route_layer(with_body()),
            ),
            (
                "/a2a/{agent}/.well-known/agent-card.json",
                get(a2a::agent_card),
            ),
            (
                "/approval-token",
                post(approval_routes::issue).route_layer(with_body()),
            ),
            (
                "/approval",
                // Only the decision has a body (a GET with the layer would need a length).
                get(approval_routes::show)
                    .merge(post(approval_routes::decide).route_layer(with_body())),
            ),
            (
                "/token",
                post(session_token::token).route_layer(with_body()),
            ),
            ("/sse", get(sse::stream)),
            ("/healthz", get(ops::healthz)),
            ("/metrics", get(ops::metrics)),
            (
                crate::peers::PEER_ROUTE,
                post(crate::peer_routes::serve).route_layer(with_body()),
            ),
            (
                crate::peers::FOLLOW_ROUTE,
                post(crate::peer_routes::follow).route_layer(with_body()),
            ),
            (
                crate::peers::SUBMIT_FOLLOW_ROUTE,
                post(crate::peer_routes::submit_follow).route_layer(with_body()),
            ),
        ];
        if page {
            table.push(("/", get(page::index)));
            for (path, script) in page::SCRIPTS {
                table.push((path, get(move || page::script(script))));
            }
        }
        let metrics = HttpMetrics::new(table.iter().map(|(path, _)| *path).collect());
        let state = AppState(Arc::new(Shared {
            runtime: self.runtime,
            auth: self.auth,
            key: Arc::new(key),
            config: Arc::new(self.config),
            closing: self.closing.0.subscribe(),
            metrics: Arc::new(metrics),
            a2a_answering: parking_lot::Mutex::default(),
        }));
        let router = table
            .into_iter()
            .fold(Router::new(), |router, (path, route)| {
                router.route(path, route)
            });
        let router = router
            .fallback(not_found)
            .method_not_allowed_fallback(method_not_allowed);
        let router = router.layer(middleware::from_fn_with_state(state.clone(), front));
        let router = match cors {
            Some(cors) => router.layer(cors),
            None => router,
        };
        Ok(router.with_state(state))
    }
}

/// What every request goes through first, in one layer (each layer costs a boxed future and
/// a clone of the routes per request): a span with its method and path (not its query, which
/// may carry a session token), a bound on how long it takes to be answered (408), and the
/// metrics. A body's declared length is checked by the routes that read one
/// ([`body::length_checked`]).
async fn front(
    axum::extract::State(state): axum::extract::State<AppState>,
    request: axum::extract::Request,
    next: Next,
) -> Response {
    let span = tracing::info_span!(
        "request",
        method = %request.method(),
        path = %dormant::types::Untrusted(request.uri().path())
    );
    async move {
        let route = state.metrics.route_of(request.uri().path());
        let started = std::time::Instant::now();
        let response = answer_in_time(&state, request, next).await;
        let elapsed = started.elapsed();
        tracing::debug!(
            status = response.status().as_u16(),
            latency_us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
            "server.answered"
        );
        state.metrics.request(route, response.status(), elapsed);
        response
    }
    .instrument(span)
    .await
}

/// The answer, or 408 once the request took longer than the configured timeout.
async fn answer_in_time(state: &AppState, request: axum::extract::Request, next: Next) -> Response {
    // A peer's call may wait for a run to settle, as the in-process call it stands for does.
    let limit = if request.uri().path() == crate::peers::PEER_ROUTE {
        std::time::Duration::MAX
    } else {
        state.config.request_timeout
    };
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            format!(
                "the request took longer than {} ms; a submit may still have been accepted (a retry answers already_completed)",
                state.config.request_timeout.as_millis()
            ),
        )
        .into_response(),
    }
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}

async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "{method} is not a method of {} (each route takes GET or POST alone)",
            uri.path()
        ),
    )
}

fn cors(origins: &[String]) -> Result<Option<CorsLayer>, ServerError> {
    if origins.is_empty() {
        return Ok(None);
    }
    let origins = origins
        .iter()
        .map(|origin| {
            if origin.trim() == "*" {
                // Refused rather than taken for "any origin": fail closed, and a wildcard
                // would let every site's pages call this server with a token they hold.
                return Err(ServerError::InvalidConfig {
                    setting: "cors_origins",
                    reason: "\"*\" is no origin: list each origin allowed (https://app.example)"
                        .into(),
                });
            }
            HeaderValue::from_str(origin).map_err(|_| ServerError::InvalidConfig {
                setting: "cors_origins",
                reason: format!("{origin:?} is not a valid origin"),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(origins))
            .allow_methods([Method::GET, Method::POST])
            .allow_headers([
                axum::http::header::CONTENT_TYPE,
                axum::http::header::AUTHORIZATION,
                HeaderName::from_static("last-event-id"),
                // The built-in API key's header (`Auth::api_key`).
                HeaderName::from_static("x-api-key"),
            ]),
    ))
}
