//! The ownership router: every submit goes through it. It checks the root, looks up which
//! session owns the call (one keyed read: the cost does not grow with the number of calls
//! pending under the root), and forwards the answer to that session, activating it if it was
//! evicted. The owner answers the caller directly, so a router shard is busy for two reads per
//! submit; shards are keyed by root so one root's submits stay in order.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use dormant_actors::{ActorContext, Host, VirtualActor};
use tokio::sync::oneshot;

use crate::actor::{host_error, SessionActor, SessionMsg};
use crate::error::Error;
use crate::ids::SessionId;
use crate::schema;
use crate::session::Submission;
use crate::shared::Shared;
use crate::submit::SubmitOutcome;

/// How many router actors share the submits (by hash of the root id).
pub(crate) const ROUTER_SHARDS: u16 = 8;

/// The key of one router shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Shard(u16);

impl Shard {
    pub(crate) fn of(root: &SessionId) -> Self {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        root.hash(&mut hasher);
        Self(u16::try_from(hasher.finish() % u64::from(ROUTER_SHARDS)).unwrap_or(0))
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "router-{}", self.0)
    }
}

/// A submit on its way to the owner of the call.
#[derive(Debug)]
pub(crate) struct Route {
    pub(crate) root: SessionId,
    pub(crate) tool_call_id: String,
    pub(crate) submission: Submission,
    pub(crate) reply: oneshot::Sender<Result<SubmitOutcome, Error>>,
}

/// The router's behaviour; its shards keep no state.
#[derive(Debug)]
pub(crate) struct RouterActor {
    pub(crate) shared: Arc<Shared>,
    pub(crate) sessions: Host<SessionActor>,
}

impl VirtualActor for RouterActor {
    type Key = Shard;
    type Msg = Route;
    type State = ();
    type Error = std::convert::Infallible;

    async fn activate(&self, _shard: &Shard) -> Result<(), Self::Error> {
        Ok(())
    }

    async fn handle(&self, _ctx: &ActorContext<Self>, route: Route, _state: &mut ()) {
        match self.owner(&route.root, &route.tool_call_id) {
            Ok(Ok(owner)) => self.sessions.send(
                owner,
                SessionMsg::Submit {
                    root: route.root,
                    tool_call_id: route.tool_call_id,
                    submission: route.submission,
                    reply: route.reply,
                },
            ),
            Ok(Err(outcome)) => {
                if outcome == SubmitOutcome::UnknownToolCall {
                    tracing::warn!(session = %route.root, tool_call_id = %route.tool_call_id, "client_tool.submit_unknown");
                }
                let _ = route.reply.send(Ok(outcome));
            }
            Err(error) => {
                let _ = route.reply.send(Err(error));
            }
        }
    }

    fn reject(&self, _host: &Host<Self>, route: Route, error: dormant_actors::Error) {
        let _ = route.reply.send(Err(host_error(error)));
    }
}

impl RouterActor {
    /// The session that owns the call, or the outcome to answer at once.
    fn owner(
        &self,
        root: &SessionId,
        call: &str,
    ) -> Result<Result<SessionId, SubmitOutcome>, Error> {
        let store = self.shared.store.as_ref();
        let Some(lineage) = schema::load_lineage(store, root)? else {
            return Ok(Err(SubmitOutcome::UnknownToolCall));
        };
        if lineage.parent.is_some() {
            return Ok(Err(SubmitOutcome::InvalidRequest {
                reason: format!(
                    "{root} is a sub-agent session; submit against its root session {}",
                    lineage.root
                ),
            }));
        }
        if let Some(owner) = schema::owner(store, root, call)? {
            return Ok(Ok(owner));
        }
        // A root's own calls have no ownership entry: their pending entry is the proof.
        if schema::has_pending(store, root, call)? {
            return Ok(Ok(root.clone()));
        }
        Ok(Err(self.shared.settled_call_outcome(root, call)?))
    }
}
