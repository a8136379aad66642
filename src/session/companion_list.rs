//! A parent's companions, by name: the data the core keeps of them. The handlers of the
//! `companion__*` calls are `impl Session` in companions.rs.

use std::collections::HashMap;

use super::{Companion, CompanionStatus};
use crate::types::ids::SessionId;

/// A parent's companions, by name.
#[derive(Debug, Default, Clone)]
pub(crate) struct Companions {
    pub(super) by_name: HashMap<String, Companion>,
}

impl Companions {
    pub(crate) fn from_entries(entries: Vec<Companion>) -> Self {
        Self {
            by_name: entries
                .into_iter()
                .map(|companion| (companion.name.clone(), companion))
                .collect(),
        }
    }

    /// The companion whose current turn `call` started.
    pub(crate) fn by_turn_call(&self, call: &str) -> Option<&Companion> {
        self.by_name
            .values()
            .find(|companion| companion.turn_call == call)
    }

    /// Every companion, by name.
    pub(crate) fn in_order(&self) -> Vec<&Companion> {
        let mut all: Vec<&Companion> = self.by_name.values().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Companions last known running: what recovery must reconcile, keyed by turn call.
    pub(crate) fn running(&self) -> Vec<(String, SessionId)> {
        self.in_order()
            .into_iter()
            .filter(|companion| companion.status == CompanionStatus::Running)
            .map(|companion| (companion.turn_call.clone(), companion.child.clone()))
            .collect()
    }
}
