//! What a parent holds of its sub-agent calls: the entries not yet settled ([`ChildCalls`]),
//! a child to start and where it comes from, and what a child reports back. Data only: the
//! handlers that change them are `impl Session` in children.rs and companions.rs, which import
//! this file as the core (core.rs) does.

use std::collections::HashMap;

use super::{ChildCall, ChildState, RemoteDrive};
use crate::remote::RemoteChild;
use crate::types::ids::SessionId;
use crate::types::message::ToolOutcome;
use crate::types::stream::Chunk;

/// Where a child comes from: what its record needs to know about its parent.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ChildOrigin {
    pub(crate) parent: SessionId,
    pub(crate) root: SessionId,
    pub(crate) tool_call_id: String,
    pub(crate) depth: u32,
}

/// A child to start (or re-attach to, if it exists).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ChildStart {
    pub(crate) origin: ChildOrigin,
    pub(crate) child: SessionId,
    pub(crate) agent: String,
    pub(crate) message: String,
    pub(crate) kind: ChildKind,
}

/// What a start means for a child that exists already.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChildKind {
    /// One call, one child: an existing child is re-attached to (its result is reported).
    Ephemeral,
    /// A persistent companion: re-attached to if this call started its current turn, else
    /// given a new turn; `fresh` starts it over (it failed or was terminated).
    Companion { fresh: bool },
}

/// What recovery reconciles of a session just loaded (see `Session::children_to_reconcile`, children.rs).
#[derive(Debug, Default)]
pub(crate) struct ToReconcile {
    /// Children of this process, by the call that waits on each: inspected in the background.
    pub(crate) inspect: Vec<(String, SessionId)>,
    /// Remote children: watched.
    pub(crate) watch: Vec<RemoteDrive>,
}

/// A parent's sub-agent calls that have not become tool results yet, keyed by call id.
#[derive(Debug, Default, Clone)]
pub(crate) struct ChildCalls {
    pub(super) by_id: HashMap<String, ChildCall>,
    /// Every remote child recorded since this session was loaded, kept after its entry goes:
    /// a transition that removes an entry may also ask for the child to be stopped, and the
    /// actor needs to know where it lives when it runs that effect.
    pub(super) remotes: HashMap<SessionId, RemoteChild>,
}

impl ChildCalls {
    pub(crate) fn from_entries(entries: Vec<ChildCall>) -> Self {
        let remotes = entries
            .iter()
            .filter_map(|call| Some((call.child.clone(), call.remote.clone()?)))
            .collect();
        Self {
            by_id: entries
                .into_iter()
                .map(|call| (call.tool_call_id.clone(), call))
                .collect(),
            remotes,
        }
    }

    /// Where remote child `child` lives, if it is one this session recorded.
    pub(crate) fn remote_of(&self, child: &SessionId) -> Option<&RemoteChild> {
        self.remotes.get(child)
    }

    pub(crate) fn get(&self, id: &str) -> Option<&ChildCall> {
        self.by_id.get(id)
    }

    pub(super) fn get_mut(&mut self, id: &str) -> Option<&mut ChildCall> {
        self.by_id.get_mut(id)
    }

    pub(super) fn insert(&mut self, entry: ChildCall) {
        if let Some(remote) = &entry.remote {
            self.remotes.insert(entry.child.clone(), remote.clone());
        }
        self.by_id.insert(entry.tool_call_id.clone(), entry);
    }

    /// The calls that wait on `child`, in call order (several may wait on one companion).
    pub(super) fn calls_on(&self, child: &SessionId) -> Vec<String> {
        self.in_order()
            .into_iter()
            .filter(|call| &call.child == child)
            .map(|call| call.tool_call_id.clone())
            .collect()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Whether some child has not finished.
    pub(crate) fn any_unfinished(&self) -> bool {
        self.by_id.values().any(|call| !call.state.is_finished())
    }

    /// Whether a child not finished waits on anything but its parent's resume: one running,
    /// interrupted, or suspended on calls to answer. A remote child suspended on none waits
    /// for that resume alone (its server need not resume it by itself, as a child of this
    /// runtime with `auto_resume` does).
    pub(crate) fn any_waiting_on_others(&self) -> bool {
        self.by_id.values().any(|call| match &call.state {
            ChildState::Finished(_) => false,
            ChildState::Suspended { waiting } => !waiting.is_empty() || call.remote.is_none(),
            ChildState::Running | ChildState::Interrupted { .. } => true,
        })
    }

    pub(super) fn in_order(&self) -> Vec<&ChildCall> {
        let mut calls: Vec<&ChildCall> = self.by_id.values().collect();
        calls.sort_by_key(|call| call.position);
        calls
    }

    /// The calls suspended children wait on, in call order.
    pub(crate) fn waiting_below(&self) -> Vec<String> {
        self.in_order()
            .into_iter()
            .filter_map(|call| match &call.state {
                ChildState::Suspended { waiting } => Some(waiting.iter().cloned()),
                _ => None,
            })
            .flatten()
            .collect()
    }

    /// Calls whose child was last known running: what recovery must reconcile.
    pub(crate) fn running(&self) -> Vec<(String, SessionId)> {
        self.in_order()
            .into_iter()
            .filter(|call| call.state == ChildState::Running)
            .map(|call| (call.tool_call_id.clone(), call.child.clone()))
            .collect()
    }

    /// Every entry, in call order.
    pub(crate) fn entries(&self) -> Vec<ChildCall> {
        self.in_order().into_iter().cloned().collect()
    }
}

/// One child's report, as the parent applies it: the call, the report, and the child's
/// stream chunks not yet forwarded.
#[derive(Debug, Clone)]
pub(crate) struct ReportedChild {
    pub(crate) tool_call_id: String,
    pub(crate) report: ChildReport,
    pub(crate) chunks: Vec<Chunk>,
}

/// What a child tells its parent when its run settles (or when the parent wakes it).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ChildReport {
    /// It ended: its result or error is the parent's tool result.
    Finished(ToolOutcome),
    /// It waits on these calls (its own and its descendants').
    Suspended(Vec<String>),
    /// Its run was cut by a crash of its actor; waking it continues the run.
    Crashed,
    /// It was interrupted (by request): an error for the call that waited on it, but a
    /// companion keeps its conversation (a new message continues it).
    Interrupted(String),
}
