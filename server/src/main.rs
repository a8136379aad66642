//! `dormant-server`: dormant over HTTP and SSE, on an embedded sled store.
//!
//! ```text
//! dormant-server --listen 127.0.0.1:8080 --store DIR --demo --allow-unauthenticated
//! dormant-server inspect --store DIR
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "otel")]
mod otel_export;
mod startup_key;

use clap::{Args, Parser, Subcommand};
use dormant::{Runtime, SledStore};
use dormant_server::{Auth, HttpClient, HttpRemoteAgents, Server, ServerConfig};

/// Serves dormant sessions over HTTP and SSE, with a page at `/` where a person answers
/// client tools and approvals. `dormant-server inspect --store DIR` reports a stopped store.
#[derive(Debug, Parser)]
#[command(version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: Serve,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Reports what a stopped store holds: sessions, status, pending calls (kind, approval id,
    /// deadline), runs and the last messages. Only reads.
    Inspect {
        /// The store directory.
        #[arg(long)]
        store: PathBuf,
        /// How many of each session's last messages to show.
        #[arg(long, default_value_t = 5)]
        messages: usize,
        /// Open a damaged store read-only and report what is left of it (the exit status
        /// stays non-zero), instead of refusing it.
        #[arg(long)]
        salvage: bool,
    },
}

#[derive(Debug, Args)]
struct Serve {
    /// The address to listen on. Keep it on loopback unless a proxy in front authenticates
    /// and terminates TLS.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The store: a sled directory (created if missing), or a PostgreSQL URL
    /// (`postgres://user@host:port/db`) that several nodes share, each session owned by one
    /// of them at a time. The key that signs session tokens is kept beside a sled store, in
    /// DIR.token-key, so tokens survive a restart; nodes on PostgreSQL share one
    /// (--token-key-file).
    #[arg(long)]
    store: Option<PathBuf>,
    /// The file that holds the key signing session tokens, created on a new store's first
    /// start. Every node sharing a PostgreSQL store must use the same key, so that any node
    /// accepts a token: a node whose key is not the one recorded in the database (its
    /// fingerprint, never the key) refuses to start.
    #[arg(long, value_name = "FILE")]
    token_key_file: Option<PathBuf>,
    /// Start with a new token key where the store already exists and its key file is missing,
    /// or make this node's key the one every node on a PostgreSQL store must use. Every token
    /// issued under the old key is refused from then on. Without it the server refuses to
    /// start in both cases.
    #[arg(long)]
    new_token_key: bool,
    /// This node's name among the nodes sharing a PostgreSQL store (default: its --advertise
    /// URL, else the address it is reached at, with the port a `:0` was given). Each node's
    /// must be its own.
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
    /// How long a node's lease on a session lasts unless renewed, in milliseconds (PostgreSQL
    /// store): a node that dies is taken over within it. It renews every quarter of it, so
    /// a node paused for longer than three quarters of it may lose its sessions to the others.
    #[arg(long, default_value_t = 2_500)]
    lease_ttl_ms: u64,
    /// The URL other nodes sharing a PostgreSQL store forward this node's sessions' requests
    /// to (default: http:// and the address it listens on; for 0.0.0.0 or [::], which no
    /// other node can reach, the machine's name and the port).
    #[arg(long, value_name = "URL")]
    advertise: Option<String>,
    /// Serve the demo agent (`demo`): a server tool, a client tool the browser answers and an
    /// approval-gated tool, on a keyword-driven model that needs no API key, or on a real one
    /// when OPENAI_BASE_URL or OPENAI_API_KEY is set (with OPENAI_MODEL): any
    /// OpenAI-compatible server (OpenAI, vLLM, llama.cpp, Ollama, OpenRouter).
    #[arg(long)]
    demo: bool,
    /// Let anyone start sessions (each session is still reached only with its token). Say so
    /// explicitly: without it, or --api-key-env, the server refuses to start.
    #[arg(long)]
    allow_unauthenticated: bool,
    /// The environment variable that holds an API key: a request that sends it
    /// (`x-api-key: KEY`) may start sessions, choose their ids and act on every session.
    #[arg(long, value_name = "NAME")]
    api_key_env: Option<String>,
    /// The largest request body in bytes (413 past it, before it is read).
    #[arg(long, default_value_t = dormant_server_default_body())]
    max_body_bytes: usize,
    /// How long a request may take to be answered, in milliseconds (408 past it).
    #[arg(long, default_value_t = 30_000)]
    request_timeout_ms: u64,
    /// How long a client may take to send a request's line and headers, in milliseconds: past
    /// it the connection is closed (on an idle keep-alive connection, it bounds the wait for
    /// the next request too).
    #[arg(long, default_value_t = dormant_server::DEFAULT_HEADER_READ_TIMEOUT.as_millis() as u64)]
    header_read_timeout_ms: u64,
    /// The most connections open at once. Past it new connections wait, unaccepted, until one
    /// closes, while the open ones are served as before. Lowered to fit the limit on open
    /// files (which the server raises to its hard limit at start), keeping an eighth of it
    /// for the store and outgoing calls.
    #[arg(long, default_value_t = dormant_server::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// How long a stream may stay without a chunk before the server ends it, in milliseconds.
    #[arg(long, default_value_t = 600_000)]
    sse_idle_timeout_ms: u64,
    /// An origin allowed to call the server from its pages (CORS); repeat for several. None
    /// by default.
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    cors_origins: Vec<String>,
    /// How long a client tool or approval waits for its answer, in milliseconds.
    #[arg(long, default_value_t = 10 * 60 * 1000)]
    client_tool_timeout_ms: u64,
    /// The most session actors kept in memory; idle ones past it are evicted.
    #[arg(long)]
    max_resident: Option<usize>,
    /// The base URL of another dormant server: the demo agent gains a `delegate` tool that
    /// hands a message starting with `delegate ` to that server's demo agent (a remote
    /// sub-agent; its client tool and approval are answered here, at the root).
    #[arg(long, value_name = "URL")]
    delegate_to: Option<String>,
    /// The environment variable that holds the API key this server sends (`x-api-key`) to
    /// the servers its remote sub-agents live on (their --api-key-env).
    #[arg(long, value_name = "NAME")]
    remote_key_env: Option<String>,
    /// How long a remote sub-agent's server may stay unreachable (a restart, a deploy) before
    /// its parent writes the child off as `remote_subagent_lost`, in milliseconds. Meanwhile
    /// the tree waits, visibly, and the parent tries again by itself.
    #[arg(long, default_value_t = 10 * 60 * 1000)]
    remote_patience_ms: u64,
    /// The longest wait between two tries of an unreachable remote, in milliseconds.
    #[arg(long, default_value_t = 30 * 1000)]
    remote_max_retry_wait_ms: u64,
}

fn dormant_server_default_body() -> usize {
    dormant_server::ServerConfig::default().body_limit()
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colours only for a person's terminal, not into a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("dormant-server: cannot start tokio: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Some(Command::Inspect {
                store,
                messages,
                salvage,
            }) => {
                let mut out = std::io::stdout().lock();
                let options = dormant_server::inspect::Options { messages, salvage };
                dormant_server::inspect::inspect(&store, &mut out, options)
                    .await
                    .map_err(|error| error.to_string())
            }
            None => serve(cli.serve).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("dormant-server: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The demo agent on a real model when `OPENAI_BASE_URL` or `OPENAI_API_KEY` is set (with
/// `OPENAI_MODEL`): any OpenAI-compatible server. Otherwise the keyword-driven demo model.
#[cfg(feature = "openai")]
fn real_model(builder: dormant::RuntimeBuilder) -> Result<dormant::RuntimeBuilder, String> {
    let wanted = ["OPENAI_BASE_URL", "OPENAI_API_KEY"]
        .iter()
        .any(|name| std::env::var_os(name).is_some());
    if !wanted {
        return Ok(builder);
    }
    // Checked here, not at the first run: the demo agent names no model of its own.
    let model = std::env::var("OPENAI_MODEL")
        .ok()
        .filter(|model| !model.is_empty())
        .ok_or("OPENAI_BASE_URL or OPENAI_API_KEY is set: OPENAI_MODEL must name the model to serve the demo agent on (unset both to serve the keyword-driven demo model)")?;
    let adapter = dormant::OpenAiAdapter::from_env()
        .map_err(|error| format!("OPENAI_* environment: {error}"))?;
    // The model only: the base URL may carry credentials.
    tracing::warn!(%model, "the demo agent runs on a real model (OPENAI_* is set): each run costs what the provider charges");
    Ok(builder.llm(Arc::new(adapter)))
}

#[cfg(not(feature = "openai"))]
fn real_model(builder: dormant::RuntimeBuilder) -> Result<dormant::RuntimeBuilder, String> {
    if std::env::var_os("OPENAI_BASE_URL").is_some() {
        tracing::warn!("OPENAI_BASE_URL is set, but this build has no `openai` feature: serving the keyword-driven demo model");
    }
    Ok(builder)
}

async fn serve(args: Serve) -> Result<(), String> {
    let store_dir = args.store.clone().ok_or(
        "--store DIR is required: the sled store the sessions live in (or a postgres:// URL)",
    )?;
    if !args.demo {
        return Err("no agents to serve: run with --demo (a daemon with its own agents mounts dormant_server::router instead)".into());
    }
    let auth = match (&args.api_key_env, args.allow_unauthenticated) {
        (Some(name), _) => api_key_auth(name)?,
        (None, true) => {
            tracing::warn!("--allow-unauthenticated: anyone who reaches {} may start sessions (each session still needs its token)", args.listen);
            Auth::allow_unauthenticated()
        }
        // Refused before anything is opened or written (the store, its token key).
        (None, false) => return Err("no authentication configured: pass --api-key-env NAME (callers send that variable's key in x-api-key), or --allow-unauthenticated for a loopback demo".into()),
    };
    // Before the first connection: a soft limit of 1,024 (or 256) open files under a hard one
    // of a million would stop the server after a few hundred slow clients.
    match dormant_server::raise_fd_limit() {
        Ok(limit) if limit.before != limit.now => {
            tracing::info!(before = ?limit.before, now = ?limit.now, "server.fd_limit_raised");
        }
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, "server.fd_limit_not_raised"),
    }
    if args.header_read_timeout_ms == 0 {
        return Err("--header-read-timeout-ms must be at least 1".into());
    }
    // Bound before the store opens: a node on a shared store advertises its address.
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|error| format!("cannot listen on {}: {error}", args.listen))?;
    let address = listener.local_addr().map_err(|error| error.to_string())?;
    let advertised = args
        .advertise
        .clone()
        .unwrap_or_else(|| format!("http://{address}"));
    let opened = open_store(&store_dir, &args, address, advertised).await?;
    // A URL may carry a password: name only the kind of store.
    let store_label = if store_dir.to_string_lossy().contains("://") {
        "postgresql".to_string()
    } else {
        store_dir.display().to_string()
    };
    let key = startup_key::load(
        &opened.key_path,
        &store_label,
        opened.existed,
        args.new_token_key,
    )?;
    #[cfg(feature = "postgres")]
    if let Some(shared) = &opened.shared {
        startup_key::agree(shared, &key, &opened.key_path, args.new_token_key).await?;
    }
    let mut builder = Runtime::builder()
        .store(opened.store)
        .client_tool_timeout_ms(args.client_tool_timeout_ms);
    // A store several nodes share keeps their leases: who owns which tree.
    #[cfg(feature = "postgres")]
    if let Some(shared) = &opened.shared {
        builder = builder.leases(Arc::clone(shared) as Arc<dyn dormant::cluster::leases::Leases>);
    }
    if let Some(max) = args.max_resident {
        builder = builder.max_resident(max);
    }
    let remote_key = match &args.remote_key_env {
        Some(name) => Some(
            std::env::var(name)
                .map_err(|_| format!("--remote-key-env {name}: the variable is not set"))?,
        ),
        None => None,
    };
    let remote_policy = dormant::remote::RemotePolicy {
        patience: std::time::Duration::from_millis(args.remote_patience_ms),
        max_retry_wait: std::time::Duration::from_millis(args.remote_max_retry_wait_ms),
        ..dormant::remote::RemotePolicy::default()
    };
    // One client for every call to another server (remote sub-agents, peer nodes): one pool
    // of connections and one TLS configuration.
    let client = HttpClient::new();
    let builder = builder
        .remote_agents(Arc::new(HttpRemoteAgents::with_client(
            client.clone(),
            remote_key,
        )))
        .remote_policy(remote_policy)
        // On a shared store, a call for a session another node owns is sent to that node.
        .peers(Arc::new(dormant_server::HttpPeers::with_client(client)));
    let builder = match &args.delegate_to {
        Some(endpoint) => dormant_server::demo::configure_delegating(builder, endpoint),
        None => dormant_server::demo::configure(builder),
    }
    .map_err(|error| error.to_string())?;
    // OTLP export when the standard OTEL_EXPORTER_OTLP_* variables ask for it.
    #[cfg(feature = "otel")]
    let export = otel_export::Export::from_env()?;
    #[cfg(feature = "otel")]
    let builder = match export.as_ref().and_then(otel_export::Export::telemetry) {
        Some(telemetry) => builder.telemetry(telemetry),
        None => builder,
    };
    let runtime = real_model(builder)?
        .build()
        .map_err(|error| error.to_string())?;
    #[cfg(feature = "otel")]
    if let Some(export) = &export {
        export.observe(&runtime);
        tracing::info!("otel.exporting");
    }
    let config = ServerConfig::default()
        .max_body_bytes(args.max_body_bytes)
        .request_timeout(Duration::from_millis(args.request_timeout_ms))
        .sse_idle_timeout(Duration::from_millis(args.sse_idle_timeout_ms))
        .cors_origins(args.cors_origins)
        // The demo agent's page says what it understands.
        .page_placeholder("Ask something, e.g. weather in Porto");
    let server = Server::new(runtime.clone(), auth)
        .config(config)
        .token_key(key);
    let closing = server.closing();
    let app = match server.router() {
        Ok(app) => app,
        Err(error) => {
            let _ = runtime.shutdown().await;
            return Err(error.to_string());
        }
    };
    // An SSE event is a small write: send it at once, not after Nagle's wait for an ACK.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        if let Err(error) = tcp.set_nodelay(true) {
            tracing::debug!(%error, "server.nodelay_failed");
        }
    });
    // The line a script (or a test) waits for before it connects.
    println!("dormant-server listening on http://{address}");
    tracing::info!(%address, store = %store_label, "server.listening");
    let served = dormant_server::serve(listener, app)
        .header_read_timeout(Duration::from_millis(args.header_read_timeout_ms))
        .max_connections(args.max_connections)
        .with_graceful_shutdown(async move {
            shutdown_signal().await;
            tracing::info!("server.shutting_down");
            closing.close();
        })
        .await;
    // Streams have ended and requests are answered: stop the sessions and flush the store.
    let stopped = runtime.shutdown().await;
    #[cfg(feature = "otel")]
    if let Some(export) = export {
        // The exporters block while they flush: off the runtime's workers.
        let _ = tokio::task::spawn_blocking(move || export.shutdown()).await;
    }
    served.map_err(|error| error.to_string())?;
    stopped.map_err(|error| error.to_string())?;
    tracing::info!("server.stopped");
    Ok(())
}

/// The store `--store` names, opened.
struct Opened {
    store: Arc<dyn dormant::store::Store>,
    /// Where the token key is kept.
    key_path: PathBuf,
    /// Whether the store existed before this start (so tokens may have been issued).
    existed: bool,
    /// The store, when several nodes share it.
    #[cfg(feature = "postgres")]
    shared: Option<Arc<dormant::PgStore>>,
}

/// Opens the store `--store` names.
async fn open_store(
    store: &Path,
    args: &Serve,
    address: std::net::SocketAddr,
    advertised: String,
) -> Result<Opened, String> {
    let text = store.to_string_lossy();
    if text.starts_with("postgres://") || text.starts_with("postgresql://") {
        return open_postgres(&text, args, address, advertised).await;
    }
    // Looked at before sled creates it: a directory with something in it is a store that
    // was used.
    let existed = std::fs::read_dir(store).is_ok_and(|mut entries| entries.next().is_some());
    let sled = SledStore::open(store).map_err(|error| error.to_string())?;
    let key_path = args.token_key_file.clone().unwrap_or_else(|| {
        let mut name = store.as_os_str().to_os_string();
        name.push(".token-key");
        PathBuf::from(name)
    });
    Ok(Opened {
        store: Arc::new(sled),
        key_path,
        existed,
        #[cfg(feature = "postgres")]
        shared: None,
    })
}

#[cfg(feature = "postgres")]
async fn open_postgres(
    url: &str,
    args: &Serve,
    address: std::net::SocketAddr,
    advertised: String,
) -> Result<Opened, String> {
    let key_path = args.token_key_file.clone().ok_or(
        "--store postgres://… needs --token-key-file FILE: every node sharing the database must sign session tokens with the same key",
    )?;
    // Every node's name and address must be its own: two nodes of one name share one row of
    // liveness and take each other's sessions; a node that advertises 0.0.0.0 is sent its
    // sessions' calls by nobody but itself.
    let (advertised, reached_at) = match (&args.advertise, address.ip().is_unspecified()) {
        (None, true) => {
            let reached_at = by_machine_name(address, machine_name())
                .ok_or_else(|| format!(
                    "--listen {} is no address another node can reach, and this machine's name cannot be read: give --advertise URL (http://this-host:{})",
                    args.listen,
                    address.port()
                ))?;
            tracing::info!(advertised = %reached_at, "server.advertised_by_machine_name");
            (format!("http://{reached_at}"), reached_at)
        }
        (Some(url), _) => (advertised, url.clone()),
        (None, false) => (advertised, address.to_string()),
    };
    // The address it is reached at (a port 0 chosen), or the URL it advertises.
    let node = args.node_name.clone().unwrap_or(reached_at);
    let store = dormant::PgStore::builder(url)
        .node(node.clone())
        .lease_ttl(Duration::from_millis(args.lease_ttl_ms))
        .advertise(advertised)
        .connect()
        .await
        .map_err(|error| format!("PostgreSQL store: {error}"))?;
    tracing::info!(%node, "server.postgres_store");
    let existed = startup_key::existed(&store).await?;
    let store = Arc::new(store);
    Ok(Opened {
        store: Arc::clone(&store) as Arc<dyn dormant::store::Store>,
        key_path,
        existed,
        shared: Some(store),
    })
}

/// This machine's name (a container's hostname, which resolves on its network), if it can be
/// read.
#[cfg(feature = "postgres")]
fn machine_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty())
}

/// `host:port` for a node that listens on every interface at `address`, by the machine's
/// `name`.
#[cfg(feature = "postgres")]
fn by_machine_name(address: std::net::SocketAddr, name: Option<String>) -> Option<String> {
    name.map(|name| format!("{name}:{}", address.port()))
}

#[cfg(not(feature = "postgres"))]
async fn open_postgres(
    _url: &str,
    _args: &Serve,
    _address: std::net::SocketAddr,
    _advertised: String,
) -> Result<Opened, String> {
    Err("this build has no `postgres` feature: --store takes a sled directory".into())
}

/// An API key from the environment: `x-api-key` equal to it makes an operator.
fn api_key_auth(name: &str) -> Result<Auth, String> {
    let key = std::env::var(name)
        .map_err(|_| format!("--api-key-env {name}: the variable is not set"))?;
    if key.len() < 16 {
        return Err(format!(
            "--api-key-env {name}: the key must be at least 16 characters"
        ));
    }
    Ok(Auth::api_key(key))
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
