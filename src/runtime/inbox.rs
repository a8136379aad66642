//! The inbox ([`Runtime::inbox`]): every call that waits for a person, across sessions, read
//! from the deadline index (every waiting call has a deadline), never from a scan of the
//! sessions.

use std::collections::HashMap;

use super::read_error::ReadError;
use super::Runtime;
use crate::store::schema;
use crate::types::ids::SessionId;
use crate::types::inbox::{Inbox, InboxCursor, InboxFilter, InboxItem};
use crate::types::record::PendingKind;

/// Index entries read for one page, at most, per item asked for: a filter that matches few
/// calls answers a short page with a cursor rather than reading the whole index at once.
const ENTRIES_PER_ITEM: usize = 8;

/// Index entries read at once.
const ENTRIES_AT_ONCE: usize = 256;

impl Runtime {
    /// How many calls wait for an answer now, across every session and sub-agent of the
    /// store: client tools, approvals, tools' questions and reconciliations not yet answered,
    /// their deadlines not passed. A read of every pending call (the calls answered but not yet resumed
    /// included, which it leaves out), so it costs what there is; the inbox lists them.
    ///
    /// ```
    /// # async fn demo(runtime: dormant::Runtime) -> Result<(), dormant::ReadError> {
    /// println!("{} calls wait for a person", runtime.waiting_calls().await?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A store failure, or a pending call that does not read.
    pub async fn waiting_calls(&self) -> Result<u64, ReadError> {
        self.ensure_open()?;
        let now = self.now_ms();
        self.read(schema::count_waiting(self.store(), now, ENTRIES_AT_ONCE).await)
    }

    /// Up to `limit` (at least one) calls that wait for a person (client tools, approvals and
    /// reconciliations, of every
    /// session and sub-agent), soonest deadline first, that `filter` keeps, from `after` (a
    /// previous page's [`Inbox::next`]) on. Read from the deadline index, so a page costs
    /// what it lists, whatever the number of sessions; with a filter that keeps few calls,
    /// a page may hold fewer than `limit` with a cursor to read on from.
    ///
    /// ```
    /// # async fn demo(runtime: dormant::Runtime) -> Result<(), dormant::ReadError> {
    /// use dormant::types::InboxFilter;
    /// let mut page = runtime.inbox(&InboxFilter::all().agent("editor"), None, 50).await?;
    /// loop {
    ///     for call in &page.items {
    ///         println!("{} waits on {} (answer at {})", call.session, call.tool_name, call.root);
    ///     }
    ///     let Some(next) = page.next.take() else { break };
    ///     page = runtime.inbox(&InboxFilter::all().agent("editor"), Some(&next), 50).await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A store failure, a stored value that does not read, or a cursor this runtime did not
    /// make ([`ReadError::BadCursor`]).
    pub async fn inbox(
        &self,
        filter: &InboxFilter,
        after: Option<&InboxCursor>,
        limit: usize,
    ) -> Result<Inbox, ReadError> {
        self.ensure_open()?;
        // A page of none would hand back the cursor it was given, for ever.
        let limit = limit.max(1);
        let store = self.store();
        let mut from = match after {
            Some(cursor) => Some(decode_cursor(&cursor.0)?),
            None => None,
        };
        let now = self.now_ms();
        let mut items = Vec::new();
        let mut budget = limit.saturating_mul(ENTRIES_PER_ITEM).max(ENTRIES_AT_ONCE);
        // The root and agent of each session met, read once a page.
        let mut places: HashMap<SessionId, Option<(SessionId, String)>> = HashMap::new();
        while items.len() < limit && budget > 0 {
            let batch = budget.min(ENTRIES_AT_ONCE);
            let entries =
                self.read(schema::deadlines_after(store, from.as_deref(), batch).await)?;
            let ended = entries.len() < batch;
            budget -= entries.len();
            let mut read_all = true;
            for (key, _, session, call) in entries {
                from = Some(key);
                let Some(pending) =
                    self.read(schema::pending_call(store, &session, &call).await)?
                else {
                    continue; // a deadline of another kind (a remote child's next look)
                };
                // Answered, or past its deadline (the sweep that records the timeout may not
                // have run yet): it no longer waits for a person.
                if !pending.is_waiting(now)
                    || filter.kind.is_some_and(|kind| kind != pending.kind)
                    || filter
                        .tool
                        .as_ref()
                        .is_some_and(|tool| *tool != pending.tool_name)
                {
                    continue;
                }
                if !places.contains_key(&session) {
                    let place = self
                        .read(schema::load_lineage(store, &session).await)?
                        .map(|lineage| (lineage.root, lineage.agent));
                    places.insert(session.clone(), place);
                }
                let Some(Some((root, agent))) = places.get(&session) else {
                    continue;
                };
                if filter.agent.as_ref().is_some_and(|wanted| wanted != agent) {
                    continue;
                }
                let tool = self
                    .tool_info(agent, &pending.tool_name)
                    .unwrap_or_default();
                let question = pending.question();
                items.push(InboxItem {
                    kind: pending.kind,
                    approval_id: (pending.kind == PendingKind::Approval)
                        .then(|| pending.approval_id()),
                    binding: pending.binding.clone(),
                    session: session.clone(),
                    root: root.clone(),
                    agent: agent.clone(),
                    tool_call_id: pending.tool_call_id,
                    tool_name: pending.tool_name,
                    description: tool.description,
                    input_schema: tool.input_schema,
                    output_schema: tool.output_schema,
                    editable: tool.editable,
                    input: pending.input,
                    since_ms: pending.requested_at_ms,
                    deadline_at_ms: pending.deadline_at_ms,
                    idempotency_key: pending.idempotency_key,
                    question,
                    request: pending.request,
                });
                if items.len() == limit {
                    read_all = false;
                    break;
                }
            }
            if ended && read_all {
                from = None;
                break;
            }
        }
        Ok(Inbox {
            items,
            next: from.map(|key| InboxCursor(encode_cursor(&key))),
        })
    }
}

/// A cursor: the last index key read, in hex.
fn encode_cursor(key: &[u8]) -> String {
    key.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn decode_cursor(text: &str) -> Result<Vec<u8>, ReadError> {
    let bad = || ReadError::BadCursor(crate::types::Untrusted(text).to_string());
    if text.len() % 2 != 0 || text.len() > 4_096 {
        return Err(bad());
    }
    (0..text.len())
        .step_by(2)
        .map(|at| {
            text.get(at..at + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .ok_or_else(bad)
        })
        .collect()
}
