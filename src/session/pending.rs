//! A session's pending calls, keyed by call id so a submit costs the same however many calls
//! wait; call order is restored from each entry's position when the calls are drained. Each
//! entry is boxed: a map allocates room for several entries at once (four slots for the first),
//! and a resident suspended session usually waits on one call, so the slots hold pointers,
//! not entries of a few hundred bytes each.

use std::collections::HashMap;

use super::PendingCall;

/// The calls of a session that wait outside the runtime (or are answered and wait for a
/// resume).
#[derive(Debug, Default, Clone)]
pub(crate) struct PendingCalls {
    by_id: HashMap<String, Box<PendingCall>>,
}

impl PendingCalls {
    pub(crate) fn from_entries(entries: Vec<PendingCall>) -> Self {
        Self {
            by_id: entries
                .into_iter()
                .map(|call| (call.tool_call_id.clone(), Box::new(call)))
                .collect(),
        }
    }

    pub(crate) fn get(&self, id: &str) -> Option<&PendingCall> {
        self.by_id.get(id).map(|call| &**call)
    }

    pub(crate) fn get_mut(&mut self, id: &str) -> Option<&mut PendingCall> {
        self.by_id.get_mut(id).map(|call| &mut **call)
    }

    pub(crate) fn remove(&mut self, id: &str) -> Option<PendingCall> {
        self.by_id.remove(id).map(|call| *call)
    }

    pub(crate) fn insert(&mut self, call: PendingCall) {
        self.by_id.insert(call.tool_call_id.clone(), Box::new(call));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Whether any call still waits for an answer at `now`.
    pub(crate) fn any_waiting(&self, now: u64) -> bool {
        self.by_id.values().any(|call| call.is_waiting(now))
    }

    /// Ids of the calls that still wait at `now`, in call order.
    pub(crate) fn waiting_ids(&self, now: u64) -> Vec<String> {
        let mut waiting: Vec<&PendingCall> = self
            .by_id
            .values()
            .map(|call| &**call)
            .filter(|call| call.is_waiting(now))
            .collect();
        waiting.sort_by_key(|call| call.position);
        waiting
            .into_iter()
            .map(|call| call.tool_call_id.clone())
            .collect()
    }

    /// Ids of every call, in call order.
    pub(crate) fn ids(&self) -> Vec<String> {
        let mut calls: Vec<&PendingCall> = self.by_id.values().map(|call| &**call).collect();
        calls.sort_by_key(|call| call.position);
        calls
            .into_iter()
            .map(|call| call.tool_call_id.clone())
            .collect()
    }

    /// Every call, in call order (copies: the entries stay until each call's result is
    /// recorded).
    pub(crate) fn in_order(&self) -> Vec<PendingCall> {
        let mut calls: Vec<PendingCall> =
            self.by_id.values().map(|call| (**call).clone()).collect();
        calls.sort_by_key(|call| call.position);
        calls
    }

    /// Removes and returns the calls that match `which`, in call order.
    pub(crate) fn take_where(&mut self, which: impl Fn(&PendingCall) -> bool) -> Vec<PendingCall> {
        let ids: Vec<String> = self
            .by_id
            .values()
            .filter(|call| which(call))
            .map(|call| call.tool_call_id.clone())
            .collect();
        let mut taken: Vec<PendingCall> = ids.iter().filter_map(|id| self.remove(id)).collect();
        taken.sort_by_key(|call| call.position);
        taken
    }
}
