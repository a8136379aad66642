//! An MCP server written with `rmcp`'s server side, served over streamable HTTP on loopback:
//! `add` (read-only), `fail` (an error result), `note` (not safe to retry), `retire`, which
//! takes a tool off the list and tells the client the list changed, and `book` (not safe to
//! retry) and `reserve` (idempotent), which ask the client which seat (an elicitation) and
//! answer with what they were told.

use std::sync::{Arc, Mutex};

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientResult, Content, CreateElicitationRequest,
    CreateElicitationRequestParams, ElicitationSchema, ErrorData, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerInfo, ServerRequest, Tool, ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServerHandler;
use serde_json::{json, Value};

/// A call the server received: the tool, its arguments and the idempotency key in `_meta`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Received {
    pub(crate) tool: String,
    pub(crate) arguments: Value,
    pub(crate) idempotency_key: Option<String>,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Log {
    pub(crate) calls: Arc<Mutex<Vec<Received>>>,
    pub(crate) retired: Arc<Mutex<Vec<String>>>,
    /// The answers to the seat questions, as the client sent them.
    pub(crate) answers: Arc<Mutex<Vec<Value>>>,
    /// Told after each answer is logged.
    pub(crate) answered: Arc<tokio::sync::Notify>,
}

impl Log {
    pub(crate) fn calls(&self) -> Vec<Received> {
        self.calls
            .lock()
            .map(|calls| calls.clone())
            .unwrap_or_default()
    }

    /// The tools taken off the list.
    fn retired(&self) -> Vec<String> {
        self.retired
            .lock()
            .map(|retired| retired.clone())
            .unwrap_or_default()
    }
}

#[derive(Clone)]
struct TestServer {
    log: Log,
}

fn schema(value: Value) -> Arc<serde_json::Map<String, Value>> {
    match value {
        Value::Object(map) => Arc::new(map),
        _ => Arc::default(),
    }
}

fn tools() -> Vec<Tool> {
    let numbers = json!({
        "type": "object",
        "properties": { "a": { "type": "integer" }, "b": { "type": "integer" } },
        "required": ["a", "b"]
    });
    let text = |field: &str| json!({ "type": "object", "properties": { field: { "type": "string" } }, "required": [field] });
    vec![
        Tool::new("add", "Adds two integers.", schema(numbers))
            .annotate(ToolAnnotations::new().read_only(true)),
        Tool::new("fail", "Always fails.", schema(text("reason"))),
        Tool::new("note", "Writes a note.", schema(text("note"))),
        Tool::new("retire", "Takes a tool off the list.", schema(text("tool"))),
        Tool::new("book", "Books a seat.", schema(text("flight"))),
        Tool::new("reserve", "Reserves a seat.", schema(text("flight")))
            .annotate(ToolAnnotations::new().idempotent(true)),
    ]
}

impl ServerHandler for TestServer {
    fn get_info(&self) -> ServerInfo {
        ServerInfo {
            capabilities: ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
            ..ServerInfo::default()
        }
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let retired = self.log.retired();
        let offered = tools()
            .into_iter()
            .filter(|tool| !retired.iter().any(|name| name == tool.name.as_ref()))
            .collect();
        Ok(ListToolsResult::with_all_items(offered))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let arguments = Value::Object(request.arguments.clone().unwrap_or_default());
        // rmcp hands a request's `_meta` to the handler in its context.
        let idempotency_key = context
            .meta
            .0
            .get("dormant/idempotency_key")
            .and_then(Value::as_str)
            .map(str::to_string);
        if let Ok(mut calls) = self.log.calls.lock() {
            calls.push(Received {
                tool: request.name.to_string(),
                arguments: arguments.clone(),
                idempotency_key,
            });
        }
        let retired = self.log.retired();
        if retired.iter().any(|name| name == request.name.as_ref()) {
            return Err(ErrorData::invalid_params(
                format!("unknown tool {}", request.name),
                None,
            ));
        }
        match request.name.as_ref() {
            "add" => {
                let sum =
                    arguments["a"].as_i64().unwrap_or(0) + arguments["b"].as_i64().unwrap_or(0);
                let mut result = CallToolResult::success(vec![Content::text(sum.to_string())]);
                result.structured_content = Some(json!({ "sum": sum }));
                Ok(result)
            }
            "fail" => Ok(CallToolResult::error(vec![Content::text(format!(
                "failed: {}",
                arguments["reason"].as_str().unwrap_or_default()
            ))])),
            "note" => Ok(CallToolResult::success(vec![Content::text("noted")])),
            "book" | "reserve" => self.ask_seat(&context, &arguments).await,
            "retire" => {
                let tool = arguments["tool"].as_str().unwrap_or_default().to_string();
                if let Ok(mut retired) = self.log.retired.lock() {
                    retired.push(tool);
                }
                let _ = context.peer.notify_tool_list_changed().await;
                Ok(CallToolResult::success(vec![Content::text("retired")]))
            }
            other => Err(ErrorData::invalid_params(
                format!("unknown tool {other}"),
                None,
            )),
        }
    }
}

impl TestServer {
    /// Asks the client which seat, and books it.
    async fn ask_seat(
        &self,
        context: &RequestContext<RoleServer>,
        arguments: &Value,
    ) -> Result<CallToolResult, ErrorData> {
        let requested_schema: ElicitationSchema = serde_json::from_value(json!({
            "type": "object",
            "properties": { "seat": { "type": "string" } },
            "required": ["seat"]
        }))
        .map_err(|error| ErrorData::internal_error(error.to_string(), None))?;
        let flight = arguments["flight"].as_str().unwrap_or_default();
        let question = CreateElicitationRequestParams::FormElicitationParams {
            meta: None,
            message: format!("Which seat on {flight}?"),
            requested_schema,
        };
        // The raw request: rmcp's helper for it needs a feature this test does not build.
        let request = ServerRequest::CreateElicitationRequest(CreateElicitationRequest {
            method: Default::default(),
            params: question,
            extensions: Default::default(),
        });
        let answer = match context.peer.send_request(request).await {
            Ok(ClientResult::CreateElicitationResult(answer)) => answer,
            Ok(_) => return Err(ErrorData::internal_error("not an elicitation result", None)),
            Err(error) => return Err(ErrorData::internal_error(error.to_string(), None)),
        };
        let answer = serde_json::to_value(&answer)
            .map_err(|error| ErrorData::internal_error(error.to_string(), None))?;
        if let Ok(mut answers) = self.log.answers.lock() {
            answers.push(answer.clone());
        }
        self.log.answered.notify_one();
        let text = match answer["content"]["seat"].as_str() {
            Some(seat) if answer["action"] == "accept" => format!("booked {seat} on {flight}"),
            _ => format!("not booked: {}", answer["action"]),
        };
        Ok(CallToolResult::success(vec![Content::text(text)]))
    }
}

/// The server's HTTP side, which a test may replace by a fresh one, as a restart would: the
/// sessions of the old one are gone (rmcp answers a request of an unknown session with 401).
type Service = StreamableHttpService<TestServer, LocalSessionManager>;

fn fresh(log: &Log) -> Service {
    let server = TestServer { log: log.clone() };
    StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    )
}

/// A served server: its MCP URL, what it received, and a way to restart it.
pub(crate) struct Served {
    pub(crate) url: String,
    pub(crate) log: Log,
    #[allow(dead_code)] // Not every test binary that includes the server restarts it.
    current: Arc<Mutex<Service>>,
}

impl Served {
    /// Forgets every session, as a restarted server would.
    #[allow(dead_code)] // Not every test binary that includes the server restarts it.
    pub(crate) fn restart(&self) {
        if let Ok(mut current) = self.current.lock() {
            *current = fresh(&self.log);
        }
    }
}

async fn forward(
    axum::extract::State(current): axum::extract::State<Arc<Mutex<Service>>>,
    request: axum::extract::Request,
) -> axum::response::Response {
    let service = current
        .lock()
        .map(|service| service.clone())
        .map_err(|_| ());
    let Ok(mut service) = service else {
        return axum::response::Response::default();
    };
    match tower_service::Service::call(&mut service, request).await {
        Ok(response) => response.map(axum::body::Body::new),
        Err(never) => match never {},
    }
}

/// Serves the server on a loopback port.
pub(crate) async fn serve() -> anyhow::Result<Served> {
    let log = Log::default();
    let current = Arc::new(Mutex::new(fresh(&log)));
    let router = axum::Router::new()
        .route("/mcp", axum::routing::any(forward))
        .with_state(Arc::clone(&current));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(Served {
        url: format!("http://{address}/mcp"),
        log,
        current,
    })
}
