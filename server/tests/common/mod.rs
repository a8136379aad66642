//! A server on a loopback port for the tests, and the client calls they make.
#![allow(dead_code, unreachable_pub)]

pub mod a2a_peer;
pub mod binary;
pub mod gated;
pub mod nested;
pub mod processes;

use std::sync::Arc;

use anyhow::Context;
use dormant::store::Store;
use dormant::{Runtime, SledStore};
use dormant_server::{Auth, Closing, Server, ServerConfig};
use futures::StreamExt;
use reqwest::{Response, StatusCode};
use serde_json::{json, Value};

/// A server in this process, on 127.0.0.1 and a free port.
pub struct TestServer {
    pub base: String,
    pub http: reqwest::Client,
    pub runtime: Runtime,
    pub closing: Closing,
    served: tokio::task::JoinHandle<()>,
}

/// A runtime with the demo agent on `store`; deadlines fire only when a test sweeps them.
pub fn demo_runtime(store: Arc<dyn Store>) -> anyhow::Result<Runtime> {
    let builder = Runtime::builder().store(store).background_deadlines(false);
    Ok(dormant_server::demo::configure(builder)?.build()?)
}

/// The demo agent on a temporary sled store, served unauthenticated with `config`.
pub async fn demo_server(config: ServerConfig) -> anyhow::Result<TestServer> {
    let runtime = demo_runtime(Arc::new(SledStore::temporary()?))?;
    serve(runtime, Auth::allow_unauthenticated(), config).await
}

pub async fn serve(
    runtime: Runtime,
    auth: Auth,
    config: ServerConfig,
) -> anyhow::Result<TestServer> {
    let server = Server::new(runtime.clone(), auth).config(config);
    let closing = server.closing();
    let app = server.router()?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let stop = closing.clone();
    let served = tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.closed().await })
            .await;
    });
    Ok(TestServer {
        base,
        http: reqwest::Client::new(),
        runtime,
        closing,
        served,
    })
}

/// A session the server started: its id and token.
#[derive(Clone, Debug)]
pub struct Session {
    pub id: String,
    pub token: String,
    pub started: Value,
}

impl TestServer {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// POSTs JSON, with a bearer token if given.
    pub async fn post(
        &self,
        path: &str,
        token: Option<&str>,
        body: &Value,
    ) -> anyhow::Result<Response> {
        let mut request = self.http.post(self.url(path)).json(body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        Ok(request.send().await?)
    }

    /// GETs, with a bearer token if given.
    pub async fn get(&self, path: &str, token: Option<&str>) -> anyhow::Result<Response> {
        let mut request = self.http.get(self.url(path));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        Ok(request.send().await?)
    }

    /// Starts a session of the demo agent.
    pub async fn start(&self, message: &str) -> anyhow::Result<Session> {
        let response = self
            .post(
                "/start",
                None,
                &json!({ "agent": "demo", "message": message }),
            )
            .await?;
        let (status, started) = answer(response).await?;
        anyhow::ensure!(
            status == StatusCode::ACCEPTED,
            "start answered {status}: {started}"
        );
        Ok(Session {
            id: text(&started, "session_id")?,
            token: text(&started, "token")?,
            started,
        })
    }

    /// The session's status.
    pub async fn status(&self, session: &Session) -> anyhow::Result<Value> {
        let response = self
            .get(
                &format!("/status?session_id={}", session.id),
                Some(&session.token),
            )
            .await?;
        let (status, body) = answer(response).await?;
        anyhow::ensure!(status == StatusCode::OK, "status answered {status}: {body}");
        Ok(body)
    }

    /// Submits an envelope with the session's token.
    pub async fn submit(
        &self,
        session: &Session,
        envelope: &Value,
    ) -> anyhow::Result<(StatusCode, Value)> {
        answer(
            self.post("/submit-tool-result", Some(&session.token), envelope)
                .await?,
        )
        .await
    }

    /// Resumes the session.
    pub async fn resume(&self, session: &Session) -> anyhow::Result<(StatusCode, Value)> {
        let body = json!({ "session_id": session.id });
        answer(self.post("/resume", Some(&session.token), &body).await?).await
    }

    /// Reads the session's stream from `from` until it ends (the run settles), returning its
    /// events as (id, event name, data).
    pub async fn events(&self, session: &Session, query: &str) -> anyhow::Result<Vec<Event>> {
        let path = format!(
            "/sse?session_id={}&token={}{query}",
            session.id, session.token
        );
        let response = self.get(&path, None).await?;
        anyhow::ensure!(
            response.status() == StatusCode::OK,
            "sse answered {}",
            response.status()
        );
        read_events(response, usize::MAX).await
    }

    /// Stops serving: streams end, requests in flight are answered.
    pub async fn stop(self) -> anyhow::Result<Runtime> {
        self.closing.close();
        self.served.await?;
        Ok(self.runtime)
    }
}

/// One server-sent event.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub id: Option<u64>,
    pub name: String,
    pub data: Value,
    /// The `retry` field, if the event carries one.
    pub retry: Option<u64>,
}

/// Reads up to `limit` events of an SSE response (all of them until it ends by default),
/// leaving out the live-only `delta` events: whether a stream sees a step's deltas depends on
/// whether it was caught up when the model wrote (tests/deltas.rs reads them on purpose).
pub async fn read_events(response: Response, limit: usize) -> anyhow::Result<Vec<Event>> {
    let mut reader = EventReader::new(response);
    let mut events = Vec::new();
    while events.len() < limit {
        match reader.next().await? {
            Some(event) if event.name == "delta" => {}
            Some(event) => events.push(event),
            None => break,
        }
    }
    Ok(events)
}

/// Reads an SSE response one event at a time.
pub struct EventReader {
    body: std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<Vec<u8>>> + Send>>,
    buffer: String,
}

impl EventReader {
    pub fn new(response: Response) -> Self {
        Self {
            body: Box::pin(
                response
                    .bytes_stream()
                    .map(|bytes| bytes.map(|bytes| bytes.to_vec())),
            ),
            buffer: String::new(),
        }
    }

    /// The next event (keep-alives and a `retry` field alone skipped); `None` at the end.
    pub async fn next(&mut self) -> anyhow::Result<Option<Event>> {
        loop {
            while let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                if let Some(event) = parse_event(&block)? {
                    return Ok(Some(event));
                }
            }
            let Some(bytes) = self.body.next().await else {
                return Ok(None);
            };
            self.buffer.push_str(std::str::from_utf8(&bytes?)?);
        }
    }
}

fn parse_event(block: &str) -> anyhow::Result<Option<Event>> {
    let (mut id, mut name, mut data, mut retry) = (None, None, String::new(), None);
    for line in block.lines() {
        if let Some(value) = line.strip_prefix("retry:") {
            retry = Some(value.trim().parse()?);
        } else if let Some(value) = line.strip_prefix("id:") {
            id = Some(value.trim().parse()?);
        } else if let Some(value) = line.strip_prefix("event:") {
            name = Some(value.trim().to_string());
        } else if let Some(value) = line.strip_prefix("data:") {
            data.push_str(value.trim_start());
        }
    }
    // A keep-alive comment has no event.
    let Some(name) = name else { return Ok(None) };
    Ok(Some(Event {
        id,
        name,
        data: serde_json::from_str(&data).with_context(|| format!("event data {data:?}"))?,
        retry,
    }))
}

/// The status and JSON body of a response.
pub async fn answer(response: Response) -> anyhow::Result<(StatusCode, Value)> {
    let status = response.status();
    let body = response.text().await?;
    let value = serde_json::from_str(&body)
        .with_context(|| format!("{status}: body {body:?} is not JSON"))?;
    Ok((status, value))
}

pub fn text(value: &Value, field: &str) -> anyhow::Result<String> {
    value[field]
        .as_str()
        .map(str::to_string)
        .with_context(|| format!("no {field} in {value}"))
}

/// The pending call of `kind` the session's status lists.
pub fn pending<'a>(status: &'a Value, kind: &str) -> anyhow::Result<&'a Value> {
    status["pending"]
        .as_array()
        .and_then(|calls| calls.iter().find(|call| call["kind"] == kind))
        .with_context(|| format!("no pending {kind} call in {status}"))
}
