//! One MCP server kept connected: started (or connected to), its tools listed, restarted with
//! backoff when it goes away, its list read again when it says the list changed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use rmcp::model::{
    ClientCapabilities, ClientInfo, ClientRequest, CreateElicitationRequestParams,
    CreateElicitationResult, ElicitationAction, ElicitationCapability, FormElicitationCapability,
    Implementation, PingRequest, Tool,
};
use rmcp::service::{
    NotificationContext, Peer, PeerRequestOptions, RequestContext, RunningService,
};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use tokio::sync::{oneshot, watch, Notify};

use super::questions::{InFlight, ParkedCalls};
use super::server::{McpServer, Transport, FIRST_BACKOFF};
use super::shared::{Live, Shared};
use super::McpError;
use crate::definition::ToolDefinition;

/// How long a connection must have lasted for the backoff to start again from
/// [`FIRST_BACKOFF`]: a server that dies right after each start is started less and less often.
const STABLE: Duration = Duration::from_secs(10);

/// How long a connection a call found broken has to answer a ping before it is dropped.
const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// A connected MCP server and its tools. Cheap to clone; the server is stopped (a stdio
/// server killed) once every clone and every [`ToolDefinition`] made from it is dropped.
#[derive(Clone, Debug)]
pub struct McpTools {
    shared: Arc<Shared>,
}

/// What the server may ask of dormant: that its tool list be read again, and a person's input
/// for a call in flight on this connection (an elicitation, in form mode).
struct Handler {
    list_changed: Arc<Notify>,
    in_flight: Arc<InFlight>,
    /// The connection's number ([`Live::number`]).
    connection: u64,
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientInfo {
        ClientInfo {
            meta: None,
            protocol_version: Default::default(),
            capabilities: ClientCapabilities {
                elicitation: Some(ElicitationCapability {
                    form: Some(FormElicitationCapability {
                        schema_validation: Some(true),
                    }),
                    url: None,
                }),
                ..ClientCapabilities::default()
            },
            client_info: Implementation {
                name: "dormant".to_string(),
                title: None,
                version: env!("CARGO_PKG_VERSION").to_string(),
                description: None,
                icons: None,
                website_url: None,
            },
        }
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.list_changed.notify_one();
    }

    async fn create_elicitation(
        &self,
        request: CreateElicitationRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateElicitationResult, rmcp::ErrorData> {
        // A question the server cancels stops waiting here (the session's input call stays
        // until answered or expired; its answer then reaches nobody).
        tokio::select! {
            answer = self.in_flight.ask(self.connection, request) => answer,
            () = context.ct.cancelled() => Ok(CreateElicitationResult {
                action: ElicitationAction::Cancel,
                content: None,
            }),
        }
    }
}

type Running = RunningService<RoleClient, Handler>;

impl McpTools {
    /// Starts (or connects to) the server, completes MCP's handshake and lists its tools; from
    /// then on keeps it running in the background.
    ///
    /// # Errors
    /// [`McpError::Connect`] if the server cannot be started or reached within its
    /// [`McpServer::connect_timeout`], [`McpError::Request`] if it does not list its tools.
    pub async fn connect(server: McpServer) -> Result<Self, McpError> {
        let list_changed = Arc::new(Notify::new());
        let in_flight = Arc::new(InFlight::default());
        let running = connect_once(&server, &list_changed, &in_flight, 0).await?;
        let tools = list_tools(&server, running.peer()).await?;
        let (stop, stopped) = oneshot::channel();
        let reconnect = Arc::new(Notify::new());
        let broken = Arc::new(AtomicU64::new(0));
        let shared = Arc::new(Shared {
            live: watch::Sender::new(Some(Live {
                number: 0,
                peer: running.peer().clone(),
            })),
            reconnect: Arc::clone(&reconnect),
            broken: Arc::clone(&broken),
            tools: RwLock::new(tools),
            list_generation: watch::Sender::new(0),
            in_flight: Arc::clone(&in_flight),
            parked: Arc::new(ParkedCalls::default()),
            _stop: stop,
            server,
        });
        tokio::spawn(supervise(
            Arc::downgrade(&shared),
            running,
            Signals {
                list_changed,
                reconnect,
                broken,
                stopped,
                in_flight,
            },
        ));
        Ok(Self { shared })
    }

    /// The server's tools, as the agent's tools: named as the server names them (after
    /// [`McpServer::prefix`]), with their descriptions and input schemas, `safe_to_retry` as
    /// [`McpServer::retry`] says. Read again after the server says its list changed.
    pub fn definitions(&self) -> Vec<ToolDefinition> {
        self.shared
            .tools
            .read()
            .iter()
            .map(|tool| super::call::definition(&self.shared, tool))
            .collect()
    }

    /// The server's tool names, as it lists them.
    pub fn tool_names(&self) -> Vec<String> {
        let tools = self.shared.tools.read();
        tools.iter().map(|tool| tool.name.to_string()).collect()
    }

    /// Waits until the server's list is read again after it said the list changed; then
    /// [`McpTools::definitions`] has the new list (define the agent again with it).
    pub async fn list_changed(&self) {
        let mut generation = self.shared.list_generation.subscribe();
        // Only a change after this call: the one seen now is marked seen.
        generation.borrow_and_update();
        // The sender lives in `shared`, which `self` holds: the wait cannot fail.
        let _ = generation.changed().await;
    }

    /// The server's name.
    pub fn server_name(&self) -> &str {
        &self.shared.server.name
    }
}

/// What the supervisor listens for besides the connection's end.
struct Signals {
    list_changed: Arc<Notify>,
    reconnect: Arc<Notify>,
    broken: Arc<AtomicU64>,
    /// Closed with the last handle: the server is stopped.
    stopped: oneshot::Receiver<()>,
    /// Where each new connection's questions go.
    in_flight: Arc<InFlight>,
}

/// Keeps the server running until the last handle is dropped: waits for the connection to
/// end (or a call to find it broken), starts it again with backoff, and reads the list again
/// when the server says it changed.
async fn supervise(shared: std::sync::Weak<Shared>, mut running: Running, mut signals: Signals) {
    let mut number = 0;
    let mut backoff = FIRST_BACKOFF;
    loop {
        let connected_at = tokio::time::Instant::now();
        let peer = running.peer().clone();
        let cancel = running.cancellation_token();
        let mut ended = std::pin::pin!(running.waiting());
        loop {
            tokio::select! {
                _ = &mut signals.stopped => {
                    cancel.cancel();
                    let _ = ended.await;
                    return;
                }
                () = signals.list_changed.notified() => {
                    let Some(shared) = shared.upgrade() else { return };
                    reread_list(&shared, &peer).await;
                }
                () = signals.reconnect.notified() => {
                    // A call's word about a connection already replaced is stale; and one
                    // failed request (a proxy's error page, a reset) is not a lost session:
                    // the connection is dropped, with every call in flight on it, only if it
                    // does not answer a ping either.
                    let about_this = signals.broken.load(Ordering::Acquire) == number + 1;
                    if !about_this || answers_ping(&peer).await {
                        continue;
                    }
                    cancel.cancel();
                    let _ = ended.await;
                    break;
                }
                _ = &mut ended => break,
            }
        }
        let Some(server) = shared.upgrade().map(|shared| {
            shared.live.send_replace(None);
            shared.server.clone()
        }) else {
            return;
        };
        if connected_at.elapsed() >= STABLE {
            backoff = FIRST_BACKOFF;
        }
        tracing::warn!(server = %server.name, "MCP server went away; starting it again");
        running = loop {
            tokio::select! {
                _ = &mut signals.stopped => return,
                () = tokio::time::sleep(backoff) => {}
            }
            let attempt = connect_once(
                &server,
                &signals.list_changed,
                &signals.in_flight,
                number + 1,
            )
            .await;
            backoff = (backoff * 2).min(server.max_backoff);
            match attempt {
                Ok(running) => break running,
                Err(error) => {
                    tracing::warn!(%error, retry_in_ms = backoff.as_millis() as u64, "MCP server could not be started again");
                }
            }
        };
        let Some(shared) = shared.upgrade() else {
            return;
        };
        // Its list may have changed while it was down.
        reread_list(&shared, running.peer()).await;
        number += 1;
        shared.live.send_replace(Some(Live {
            number,
            peer: running.peer().clone(),
        }));
        tracing::info!(server = %server.name, "MCP server started again");
    }
}

/// Whether the connection answers a ping within a few seconds.
async fn answers_ping(peer: &Peer<RoleClient>) -> bool {
    let ping = ClientRequest::PingRequest(PingRequest {
        method: Default::default(),
        extensions: Default::default(),
    });
    let options = PeerRequestOptions {
        timeout: Some(PING_TIMEOUT),
        meta: None,
    };
    match peer.send_request_with_option(ping, options).await {
        Ok(handle) => {
            let answer = tokio::time::timeout(PING_TIMEOUT * 2, handle.await_response()).await;
            matches!(answer, Ok(Ok(_)))
        }
        Err(_) => false,
    }
}

/// Reads the server's list again and tells those waiting for a change.
async fn reread_list(shared: &Shared, peer: &Peer<RoleClient>) {
    match list_tools(&shared.server, peer).await {
        Ok(tools) => {
            *shared.tools.write() = tools;
            shared
                .list_generation
                .send_modify(|generation| *generation += 1);
            tracing::info!(server = %shared.server.name, "MCP server's tool list read");
        }
        Err(error) => tracing::warn!(%error, "MCP server's tool list could not be read"),
    }
}

/// Starts or connects to the server and completes the handshake, within the connect timeout.
/// `number` is the connection's: its questions go to the calls in flight on it.
async fn connect_once(
    server: &McpServer,
    list_changed: &Arc<Notify>,
    in_flight: &Arc<InFlight>,
    number: u64,
) -> Result<Running, McpError> {
    let handler = Handler {
        list_changed: Arc::clone(list_changed),
        in_flight: Arc::clone(in_flight),
        connection: number,
    };
    let failed = |reason: String| McpError::Connect {
        server: server.name.clone(),
        reason,
    };
    let connecting = async {
        match &server.transport {
            Transport::Stdio { program, args, env } => {
                let mut command = tokio::process::Command::new(program);
                command.args(args).envs(env.iter().map(|(k, v)| (k, v)));
                let transport = TokioChildProcess::new(command).map_err(|error| {
                    failed(format!("{program:?} could not be started: {error}"))
                })?;
                handler
                    .serve(transport)
                    .await
                    .map_err(|error| failed(error.to_string()))
            }
            Transport::Http { url, headers } => {
                let client = reqwest::Client::builder()
                    .default_headers(headers.clone())
                    .build()
                    .map_err(|error| failed(error.to_string()))?;
                let config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
                let transport = StreamableHttpClientTransport::with_client(client, config);
                handler
                    .serve(transport)
                    .await
                    .map_err(|error| failed(error.to_string()))
            }
        }
    };
    tokio::time::timeout(server.connect_timeout, connecting)
        .await
        .map_err(|_| failed(format!("no handshake within {:?}", server.connect_timeout)))?
}

/// The server's whole tool list (every page).
async fn list_tools(server: &McpServer, peer: &Peer<RoleClient>) -> Result<Vec<Tool>, McpError> {
    let listing = peer.list_all_tools();
    match tokio::time::timeout(server.connect_timeout, listing).await {
        Ok(Ok(tools)) => Ok(tools),
        Ok(Err(error)) => Err(McpError::Request {
            server: server.name.clone(),
            request: "tools/list",
            reason: error.to_string(),
        }),
        Err(_) => Err(McpError::Request {
            server: server.name.clone(),
            request: "tools/list",
            reason: format!("no answer within {:?}", server.connect_timeout),
        }),
    }
}
