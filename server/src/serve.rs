//! Serving a router on a listener with bounds a slow or hostile client cannot get around: a
//! time limit on reading a request's headers, and a cap on open connections that stays within
//! the process's limit on open files.
//!
//! `axum::serve` (axum 0.8) gives hyper no timer, so hyper's header-read timeout never runs:
//! a client that sends its headers a byte a second holds its connection, and its file
//! descriptor, for as long as it likes. Nor does it bound how many connections are open, so
//! enough such clients use up the process's descriptors and the server stops accepting anyone.
//!
//! A cap alone would only move the choke point: slow clients that fill it keep everyone else
//! waiting in the backlog until the timeout cuts them. So at the cap, a new connection is
//! served in place of the one that has waited longest for a request (still reading its
//! headers, or idle between two): a client that is sending a request or being answered (a
//! stream included) is never cut, and a slow client holds its place only until enough others
//! arrive.

use std::future::{Future, IntoFuture};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::serve::Listener;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{watch, Semaphore};

use crate::fd_limit;

/// How long a client may take to send a request's line and headers (30 s, hyper's own
/// default): past it the connection is closed. On an idle keep-alive connection it bounds the
/// wait for the next request too.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The most connections served at once by default. At the cap, a new connection takes the
/// place of the open one that has waited longest for a request (reading its headers, or idle
/// between two); when every open one is being answered, new ones wait in the listener's
/// backlog. It is lowered further to fit the process's limit on open files.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// Serves `app` on `listener`: each connection over HTTP/1.1 with a bound on how long its
/// request headers take to arrive ([`Serve::header_read_timeout`]), and no more connections
/// at once than [`Serve::max_connections`]. What the `dormant-server` binary serves with; a
/// daemon that mounts [`router`](crate::router) in its own app serves that app with it in
/// place of `axum::serve`, which (in axum 0.8) bounds neither. It serves the router as it is,
/// over HTTP/1.1 without upgrades, and adds no `ConnectInfo` to requests. Set `TCP_NODELAY`
/// on the accepted sockets, as the binary does (below): a stream's events are small writes,
/// and without it each one written after another waits for the client's delayed ACK (40 ms
/// on Linux).
///
/// ```no_run
/// use std::time::Duration;
/// use dormant_server::{Auth, Server};
/// # async fn run(runtime: dormant::Runtime) -> Result<(), Box<dyn std::error::Error>> {
/// let server = Server::new(runtime.clone(), Auth::allow_unauthenticated());
/// let closing = server.closing();
/// let app = server.router()?;
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
/// let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
///     let _ = tcp.set_nodelay(true);
/// });
/// dormant_server::serve(listener, app)
///     .header_read_timeout(Duration::from_secs(10))
///     .max_connections(1024)
///     .with_graceful_shutdown(async move {
///         let _ = tokio::signal::ctrl_c().await;
///         closing.close();
///     })
///     .await?;
/// runtime.shutdown().await?;
/// # Ok(()) }
/// ```
pub fn serve<L: Listener>(listener: L, app: Router) -> Serve<L> {
    Serve {
        listener,
        app,
        header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
        max_connections: DEFAULT_MAX_CONNECTIONS,
        connections: Connections::default(),
        shutdown: Box::pin(std::future::pending()),
    }
}

/// A server being set up by [`serve`]; `.await` it to serve until the shutdown signal (or
/// forever without one).
#[must_use = "a Serve does nothing until it is awaited"]
pub struct Serve<L> {
    listener: L,
    app: Router,
    header_read_timeout: Duration,
    max_connections: usize,
    connections: Connections,
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl<L> std::fmt::Debug for Serve<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Serve")
            .field("header_read_timeout", &self.header_read_timeout)
            .field("max_connections", &self.max_connections)
            .field("connections", &self.connections)
            .finish_non_exhaustive()
    }
}

impl<L: Listener> Serve<L> {
    /// How long a client may take to send a request's line and headers before its connection
    /// is closed (default [`DEFAULT_HEADER_READ_TIMEOUT`]). The clock starts when the server
    /// starts waiting for a request: at the connection's start, and after each answer on a
    /// keep-alive connection. A request's body is bounded by the router's
    /// [`request_timeout`](crate::ServerConfig::request_timeout) instead.
    pub fn header_read_timeout(mut self, timeout: Duration) -> Self {
        self.header_read_timeout = timeout;
        self
    }

    /// The most connections open at once (default [`DEFAULT_MAX_CONNECTIONS`], at least 1).
    /// At the cap, the open connection that has waited longest for a request (reading its
    /// headers, or idle between two) is closed to make room for a new one; while every open
    /// one is being answered, new ones wait in the listener's backlog. Lowered to what the
    /// process's limit on open files allows after a reserve for the store, the logs and
    /// outgoing calls (an eighth of the limit, at least 64).
    pub fn max_connections(mut self, max: usize) -> Self {
        self.max_connections = max.max(1);
        self
    }

    /// Stops accepting connections once `signal` completes, lets each open one finish the
    /// request it is answering, and returns when all have closed.
    pub fn with_graceful_shutdown<F>(mut self, signal: F) -> Self
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.shutdown = Box::pin(signal);
        self
    }

    /// The count of its open connections, to watch from elsewhere.
    pub fn connections(&self) -> Connections {
        self.connections.clone()
    }

    /// Serves until the shutdown signal, then drains the open connections.
    async fn run(self) {
        let Self {
            mut listener,
            app,
            header_read_timeout,
            max_connections,
            connections,
            shutdown,
        } = self;
        let cap = fitted_cap(max_connections);
        connections.0.cap.store(cap, Ordering::Relaxed);
        let slots = Arc::new(Semaphore::new(cap));
        let open = Arc::new(OpenConnections::default());
        // Each connection's task holds a receiver of both channels: `stop` says "shut down
        // gracefully", and once every receiver of `done` is dropped, every connection ended.
        let (stop, stopping) = watch::channel(false);
        let (done, running) = watch::channel(());
        let mut shutdown = pin!(shutdown);
        loop {
            let (io, _peer) = tokio::select! {
                accepted = listener.accept() => accepted,
                () = &mut shutdown => break,
            };
            // A slot for it: at the cap, the connection that has waited longest for a request
            // makes room. While every open one is being answered, this one waits for a slot
            // (the others behind it in the kernel's backlog, unaccepted, cost this process
            // nothing).
            let slot = match Arc::clone(&slots).try_acquire_owned() {
                Ok(slot) => Ok(slot),
                Err(_) => {
                    open.shed_longest_waiting();
                    tokio::select! {
                        slot = Arc::clone(&slots).acquire_owned() => slot,
                        () = &mut shutdown => break,
                    }
                }
            };
            let Ok(slot) = slot else { break };
            connections.opened();
            let (id, activity) = open.add();
            let service = tracked(app.clone(), Arc::clone(&activity));
            let mut stopping = stopping.clone();
            let running = running.clone();
            let connections = connections.clone();
            let open = Arc::clone(&open);
            tokio::spawn(async move {
                let mut builder = hyper::server::conn::http1::Builder::new();
                builder
                    .timer(TokioTimer::new())
                    .header_read_timeout(header_read_timeout);
                let mut connection = pin!(builder.serve_connection(TokioIo::new(io), service));
                let mut stopped = false;
                loop {
                    tokio::select! {
                        served = connection.as_mut() => {
                            if let Err(error) = served {
                                // A header-read timeout, a reset, a malformed request: the
                                // client's doing, and no event the operator must see.
                                tracing::trace!(%error, "server.connection_ended");
                            }
                            break;
                        }
                        _ = stopping.changed(), if !stopped => {
                            stopped = true;
                            connection.as_mut().graceful_shutdown();
                        }
                        // Made room for a new connection: dropping it closes the socket.
                        () = activity.shed.notified() => {
                            // A request may have come in since it was chosen: it is answered,
                            // and the connection may be chosen again once it waits.
                            if activity.answering.load(Ordering::Acquire) > 0 {
                                activity.shedding.store(false, Ordering::Release);
                                continue;
                            }
                            tracing::debug!("server.connection_shed");
                            break;
                        }
                    }
                }
                open.remove(id);
                connections.closed();
                drop((slot, running));
            });
        }
        drop(listener);
        // Every connection winds down: the idle ones close at once, a request in progress is
        // answered first (a stream is ended by the server's `Closing`).
        let _ = stop.send(true);
        drop((stopping, running));
        done.closed().await;
    }
}

impl<L: Listener> IntoFuture for Serve<L> {
    type Output = std::io::Result<()>;
    type IntoFuture = Pin<Box<dyn Future<Output = std::io::Result<()>> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            self.run().await;
            Ok(())
        })
    }
}

/// The connections being served, with what each is doing: what the accept loop needs to
/// choose one to close at the cap.
#[derive(Debug, Default)]
struct OpenConnections {
    next: AtomicU64,
    by_id: parking_lot::Mutex<std::collections::HashMap<u64, Arc<Activity>>>,
}

impl OpenConnections {
    fn add(&self) -> (u64, Arc<Activity>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let activity = Arc::new(Activity::default());
        self.by_id.lock().insert(id, Arc::clone(&activity));
        (id, activity)
    }

    fn remove(&self, id: u64) {
        self.by_id.lock().remove(&id);
    }

    /// Closes the connection that has waited longest for a request, if one waits (each is
    /// asked once: one that is closing already is not chosen again).
    fn shed_longest_waiting(&self) {
        let by_id = self.by_id.lock();
        let longest = by_id
            .values()
            .filter(|activity| activity.waiting())
            .min_by_key(|activity| *activity.waiting_since.lock());
        if let Some(activity) = longest {
            activity.shedding.store(true, Ordering::Release);
            activity.shed.notify_one();
        }
    }
}

/// What one connection is doing.
#[derive(Debug)]
struct Activity {
    /// Requests being answered (an answer counts until its body has been sent or dropped).
    answering: AtomicUsize,
    /// Since when it has waited for a request: it opened, or its last answer ended.
    waiting_since: parking_lot::Mutex<std::time::Instant>,
    /// Asked to close (to make room); it is not chosen again.
    shedding: std::sync::atomic::AtomicBool,
    /// Closes it.
    shed: tokio::sync::Notify,
}

impl Default for Activity {
    fn default() -> Self {
        Self {
            answering: AtomicUsize::new(0),
            waiting_since: parking_lot::Mutex::new(std::time::Instant::now()),
            shedding: std::sync::atomic::AtomicBool::new(false),
            shed: tokio::sync::Notify::new(),
        }
    }
}

impl Activity {
    fn waiting(&self) -> bool {
        self.answering.load(Ordering::Acquire) == 0 && !self.shedding.load(Ordering::Acquire)
    }
}

/// Counts a request as being answered from its call until its answer's body is done.
struct Answering(Arc<Activity>);

impl Answering {
    fn begin(activity: Arc<Activity>) -> Self {
        activity.answering.fetch_add(1, Ordering::AcqRel);
        Self(activity)
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        *self.0.waiting_since.lock() = std::time::Instant::now();
        self.0.answering.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `app` as one connection's hyper service, counting the requests it answers.
fn tracked(
    app: Router,
    activity: Arc<Activity>,
) -> impl hyper::service::Service<
    hyper::Request<hyper::body::Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = impl Future<Output = Result<axum::response::Response, std::convert::Infallible>> + Send,
> + Clone {
    hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
        let answering = Answering::begin(Arc::clone(&activity));
        let mut app = app.clone();
        async move {
            // A Router is always ready (its `poll_ready` does nothing), as `axum::serve`
            // relies on too.
            let response = tower_service::Service::call(&mut app, request).await?;
            Ok(response.map(|body| {
                axum::body::Body::new(CountedBody {
                    inner: body,
                    _answering: answering,
                })
            }))
        }
    })
}

/// An answer's body that keeps its request counted as being answered until it is done.
struct CountedBody {
    inner: axum::body::Body,
    _answering: Answering,
}

impl http_body::Body for CountedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The cap that fits the process's limit on open files (which the binary raised to its
/// ceiling at start), so that connections alone never take the descriptors the store, the
/// logs and outgoing calls need.
fn fitted_cap(wanted: usize) -> usize {
    let Some(room) = fd_limit::connection_room() else {
        return wanted;
    };
    let room = usize::try_from(room).unwrap_or(usize::MAX).max(1);
    if room < wanted {
        tracing::warn!(
            wanted,
            cap = room,
            "server.connection_cap_lowered: the limit on open files leaves room for fewer connections (raise it: ulimit -n)"
        );
        room
    } else {
        wanted
    }
}

/// The connections a [`Serve`] has open, counted as they open and close.
#[derive(Clone, Debug, Default)]
pub struct Connections(Arc<Counts>);

#[derive(Debug, Default)]
struct Counts {
    open: AtomicUsize,
    peak: AtomicUsize,
    accepted: AtomicU64,
    cap: AtomicUsize,
    /// Told of every connection that opens or closes ([`Connections::wait_until`]).
    changed: watch::Sender<()>,
}

impl Connections {
    /// How many are open now.
    pub fn open(&self) -> usize {
        self.0.open.load(Ordering::Acquire)
    }

    /// The most that were open at once.
    pub fn peak(&self) -> usize {
        self.0.peak.load(Ordering::Acquire)
    }

    /// How many were accepted in all.
    pub fn accepted(&self) -> u64 {
        self.0.accepted.load(Ordering::Acquire)
    }

    /// The cap in force (0 until the server starts): [`Serve::max_connections`], lowered to
    /// fit the limit on open files.
    pub fn cap(&self) -> usize {
        self.0.cap.load(Ordering::Acquire)
    }

    /// Returns once `condition` holds of the counts, looking again each time a connection
    /// opens or closes (to wait for a server to drain, say).
    pub async fn wait_until(&self, condition: impl Fn(&Self) -> bool) {
        // Subscribed before the first look: a change between the look and the wait is seen.
        let mut changed = self.0.changed.subscribe();
        while !condition(self) {
            if changed.changed().await.is_err() {
                return;
            }
        }
    }

    fn opened(&self) {
        let open = self.0.open.fetch_add(1, Ordering::AcqRel) + 1;
        self.0.peak.fetch_max(open, Ordering::AcqRel);
        self.0.accepted.fetch_add(1, Ordering::AcqRel);
        self.0.changed.send_replace(());
    }

    fn closed(&self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
        self.0.changed.send_replace(());
    }
}
