//! An MCP server's questions during a call (elicitations), and the calls that wait for their
//! answers.
//!
//! A server asks by sending `elicitation/create` on the connection while the call is in
//! flight. MCP does not say which call a question is for (on stdio nothing in the request
//! relates it to one), so it goes to the one call in flight on that connection that is not
//! already waiting for an answer; when there are several it is refused, and the server's tool
//! sees the error. The question goes to the call's handler, which makes it an `input` call of
//! the session ([`ToolContext::ask`](crate::definition::ToolContext::ask)) and parks the call
//! here, its request still open, until the session runs the tool again with the answer (or
//! closes the question, or `input_timeout` passes).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use rmcp::model::{CreateElicitationRequestParams, CreateElicitationResult, ElicitationAction};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::definition::{InputAnswer, InputRequest, ToolError};

/// What a call in flight hears: a question from the server, that it was sent again (to a
/// restarted server, which asks its questions again), or its end.
pub(super) enum Event {
    Asked(Question),
    Resent,
    Done(Result<Value, ToolError>),
}

/// A server's question, with the way back to it.
pub(super) struct Question {
    pub(super) request: InputRequest,
    reply: oneshot::Sender<CreateElicitationResult>,
}

impl Question {
    /// Sends the person's answer to the server.
    pub(super) fn answer(self, answer: &InputAnswer) {
        let result = match answer {
            InputAnswer::Accepted { content } => CreateElicitationResult {
                action: ElicitationAction::Accept,
                content: Some(content.clone()),
            },
            InputAnswer::Declined { .. } => CreateElicitationResult {
                action: ElicitationAction::Decline,
                content: None,
            },
        };
        // The server may have given up on it meanwhile: nobody waits for the reply then.
        let _ = self.reply.send(result);
    }
}

/// One call in flight on a connection: where its questions go, and whether one is open (its
/// timeout does not run while a person is asked).
pub(super) struct Asker {
    events: mpsc::UnboundedSender<Event>,
    open: AtomicUsize,
    /// When the last question was answered (or dropped).
    last_answer: Mutex<Option<Instant>>,
}

impl Asker {
    pub(super) fn new(events: mpsc::UnboundedSender<Event>) -> Arc<Self> {
        Arc::new(Self {
            events,
            open: AtomicUsize::new(0),
            last_answer: Mutex::new(None),
        })
    }

    /// When a call sent at `sent` times out after `timeout`, counting from its last answer;
    /// `None` while a question is open.
    pub(super) fn deadline(&self, sent: Instant, timeout: Duration) -> Option<Instant> {
        if self.open.load(Ordering::Acquire) > 0 {
            return None;
        }
        let from = self.last_answer.lock().map_or(sent, |at| at.max(sent));
        Some(from + timeout)
    }

    /// Ends the call: its handler hears the outcome (if it still listens).
    pub(super) fn done(&self, outcome: Result<Value, ToolError>) {
        let _ = self.events.send(Event::Done(outcome));
    }

    /// The call is sent again: its handler answers the questions asked again from the start.
    pub(super) fn resent(&self) {
        let _ = self.events.send(Event::Resent);
    }
}

/// The calls in flight on one connection, each under the number it was registered with.
type OnConnection = Vec<(u64, Arc<Asker>)>;

/// The calls in flight, by connection, so a question finds its call.
#[derive(Default)]
pub(super) struct InFlight {
    calls: Mutex<HashMap<u64, OnConnection>>,
    next: AtomicU64,
}

/// A call's place in [`InFlight`], given up when dropped.
pub(super) struct Registered {
    in_flight: Weak<InFlight>,
    connection: u64,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let Some(in_flight) = self.in_flight.upgrade() else {
            return;
        };
        let mut calls = in_flight.calls.lock();
        if let Some(list) = calls.get_mut(&self.connection) {
            list.retain(|(id, _)| *id != self.id);
            if list.is_empty() {
                calls.remove(&self.connection);
            }
        }
    }
}

impl InFlight {
    /// Records that `asker`'s call is in flight on `connection` until the guard is dropped.
    pub(super) fn register(self: &Arc<Self>, connection: u64, asker: &Arc<Asker>) -> Registered {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.calls
            .lock()
            .entry(connection)
            .or_default()
            .push((id, Arc::clone(asker)));
        Registered {
            in_flight: Arc::downgrade(self),
            connection,
            id,
        }
    }

    /// Takes a question the server sent on `connection` to the call it is for, and waits for
    /// the answer: a server's question is refused when no call, or more than one, is in flight
    /// there; a question nobody answers (the call gave up on it) is cancelled.
    pub(super) async fn ask(
        &self,
        connection: u64,
        params: CreateElicitationRequestParams,
    ) -> Result<CreateElicitationResult, rmcp::ErrorData> {
        let request = match params {
            CreateElicitationRequestParams::FormElicitationParams {
                message,
                requested_schema,
                ..
            } => InputRequest {
                message,
                schema: serde_json::to_value(requested_schema).ok(),
            },
            CreateElicitationRequestParams::UrlElicitationParams { .. } => {
                return Err(rmcp::ErrorData::invalid_request(
                    "dormant answers form elicitations only (it did not declare the url mode)",
                    None,
                ))
            }
        };
        // A call whose question waits for a person is blocked on it: the new question is
        // another call's.
        let asker = {
            let calls = self.calls.lock();
            let askers: Vec<&Arc<Asker>> = calls
                .get(&connection)
                .into_iter()
                .flatten()
                .map(|(_, asker)| asker)
                .filter(|asker| asker.open.load(Ordering::Acquire) == 0)
                .collect();
            match askers.as_slice() {
                [asker] => Arc::clone(asker),
                [] => {
                    return Err(rmcp::ErrorData::invalid_request(
                        "dormant has no call in flight on this connection that could ask",
                        None,
                    ))
                }
                several => {
                    return Err(rmcp::ErrorData::invalid_request(
                        format!(
                            "dormant has {} calls in flight on this connection and MCP does not say which one asks: the question cannot be routed",
                            several.len()
                        ),
                        None,
                    ))
                }
            }
        };
        let (reply, replied) = oneshot::channel();
        let _open = OpenQuestion::new(asker.clone());
        let sent = asker
            .events
            .send(Event::Asked(Question { request, reply }))
            .is_ok();
        let answer = if sent { replied.await.ok() } else { None };
        Ok(answer.unwrap_or(CreateElicitationResult {
            action: ElicitationAction::Cancel,
            content: None,
        }))
    }
}

/// A question open for a call: its timeout does not run until the question is answered, or
/// dropped (the server cancelled it, or the connection ended).
struct OpenQuestion(Arc<Asker>);

impl OpenQuestion {
    fn new(asker: Arc<Asker>) -> Self {
        asker.open.fetch_add(1, Ordering::AcqRel);
        Self(asker)
    }
}

impl Drop for OpenQuestion {
    fn drop(&mut self) {
        *self.0.last_answer.lock() = Some(Instant::now());
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A call whose question waits for a person: its request open, its events still coming.
pub(super) struct Parked {
    pub(super) events: mpsc::UnboundedReceiver<Event>,
    pub(super) question: Question,
    /// How many questions it had asked, this one included.
    pub(super) asked: usize,
    serial: u64,
    /// Drops it once its time is up.
    _expiry: Expiry,
}

/// A parked call's expiry, called off when the call is taken, replaced or dropped with the
/// tools.
struct Expiry(tokio::task::JoinHandle<()>);

impl Drop for Expiry {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The parked calls, by idempotency key.
#[derive(Default)]
pub(super) struct ParkedCalls {
    calls: Mutex<HashMap<String, Parked>>,
    next: AtomicU64,
}

impl std::fmt::Debug for ParkedCalls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParkedCalls")
            .field("calls", &self.calls.lock().len())
            .finish()
    }
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let calls = self.calls.lock();
        f.debug_struct("InFlight")
            .field("calls", &calls.values().map(Vec::len).sum::<usize>())
            .finish()
    }
}

impl ParkedCalls {
    /// Parks a call under `key` for at most `timeout`: then it is dropped, its question
    /// cancelled (the server decides what its tool does), and an answer that comes later
    /// finds the call gone.
    pub(super) fn park(
        self: &Arc<Self>,
        key: &str,
        events: mpsc::UnboundedReceiver<Event>,
        question: Question,
        asked: usize,
        timeout: Duration,
    ) {
        let serial = self.next.fetch_add(1, Ordering::Relaxed);
        // Held until it is in: the expiry takes the lock to drop it.
        let mut parked_calls = self.calls.lock();
        let calls = Arc::downgrade(self);
        let expiring = key.to_string();
        let expiry = tokio::spawn(async move {
            let key = expiring;
            tokio::time::sleep(timeout).await;
            let Some(calls) = calls.upgrade() else { return };
            let mut calls = calls.calls.lock();
            if calls
                .get(&key)
                .is_some_and(|parked| parked.serial == serial)
            {
                tracing::info!(idempotency_key = %key, "MCP call that asked for input given up: no answer in time");
                calls.remove(&key);
            }
        });
        let parked = Parked {
            events,
            question,
            asked,
            serial,
            _expiry: Expiry(expiry),
        };
        parked_calls.insert(key.to_string(), parked);
    }

    /// The call parked under `key`, taken out.
    pub(super) fn take(&self, key: &str) -> Option<Parked> {
        self.calls.lock().remove(key)
    }
}
