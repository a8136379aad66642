//! A model-based property test of the lease and deadline protocol (issue 18): three runtimes
//! ("nodes") share one in-memory fake of a shared store, whose lease table follows PgStore's
//! rules (a take or takeover raises the epoch; a lease is held while it is not given up and
//! its owner's liveness, renewed by the node as a whole, has not expired by the fake
//! database's clock; a lease whose owner is not live may be taken over; a commit is written
//! only while its node holds its tree's lease at the epoch it took, checked atomically with
//! the write). Random sequences of operations
//! start sessions, submit answers and resume at any node, fire deadlines, move the clock,
//! pause nodes (a paused node stops renewing, so its liveness expires while its memory stays),
//! let them continue, and evict. Then every node continues and every session is driven to its
//! end through its owner.
//!
//! What must hold, whatever the sequence: a lease's epoch only grows; no commit is written
//! for a lease at an epoch older than one already written; each session's tool that is not
//! safe to retry runs at most once; an answer a node acknowledged is its call's result, once;
//! and every session completes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use dormant::cluster::leases::{LeaseOwner, Leases, PeerKey};
use dormant::store::{Batch, Entry, Error as StoreError, Store, Tree};
use dormant::MemoryStore;
use dormant::{
    AgentDefinition, ManualClock, Message, ModelReply, Runtime, ScriptedLlm, SessionId, Status,
    ToolCall, ToolDefinition, ToolError,
};
use dormant::{Submit, SubmitOutcome};
use proptest::prelude::*;
use serde_json::json;

const NODES: usize = 3;
const SESSIONS: usize = 3;
const TTL_MS: u64 = 1_000;
const EDIT_TIMEOUT_MS: u64 = 1_500;
/// Longer than any operation takes (they wait on no real time): past it, one is stuck.
const HANG: std::time::Duration = std::time::Duration::from_secs(3);

/// One lease row.
#[derive(Clone, Debug)]
struct Row {
    owner: usize,
    epoch: i64,
    /// `u64::MAX` from its take until it is given up.
    expires_at: u64,
}

/// The lease table and the nodes' liveness, behind one lock.
#[derive(Default)]
struct Table {
    rows: HashMap<String, Row>,
    /// Until when each node is live (its row in `dormant_nodes`).
    live_until: HashMap<usize, u64>,
}

impl Table {
    /// Whether `row` is held: not given up, and its owner live.
    fn held(&self, row: &Row, now: u64) -> bool {
        row.expires_at > now && self.live_until.get(&row.owner).is_some_and(|t| *t > now)
    }
}

/// The fake database: the data (a memory store) and the lease table, behind one lock, so a
/// commit's fence and its write are atomic as in a PostgreSQL transaction.
struct FakeDb {
    data: MemoryStore,
    clock: ManualClock,
    leases: tokio::sync::Mutex<Table>,
    /// The highest epoch a commit was written at, per lease.
    written: parking_lot::Mutex<HashMap<String, i64>>,
    /// A violation seen by the fake itself.
    violations: parking_lot::Mutex<Vec<String>>,
}

impl FakeDb {
    fn now(&self) -> u64 {
        dormant::types::Clock::now_ms(&self.clock)
    }
}

/// What one node holds: lease → (epoch, sessions), and session → (lease, the epoch it
/// joined at).
#[derive(Default)]
struct Held {
    leases: HashMap<String, (i64, HashSet<String>)>,
    sessions: HashMap<String, (String, i64)>,
}

/// One node's view of the fake database.
struct FakeNode {
    index: usize,
    db: Arc<FakeDb>,
    held: parking_lot::Mutex<Held>,
    /// Until when this node is live by its own reckoning (its last renewal's).
    live_until: parking_lot::Mutex<u64>,
}

impl FakeNode {
    /// Keeps this node live; if its liveness had expired, forgets every lease it held.
    async fn renew(&self) {
        let now = self.db.now();
        let mut table = self.db.leases.lock().await;
        let live = table.live_until.entry(self.index).or_default();
        if *live <= now {
            self.held.lock().leases.clear();
        }
        *live = now + TTL_MS;
        *self.live_until.lock() = now + TTL_MS;
    }

    /// Whether this node may have stopped being live, by its own reckoning.
    fn lapsed(&self) -> bool {
        self.db.now() >= *self.live_until.lock()
    }

    fn leave(&self, held: &mut Held, session: &str, lease: &str, at: i64) -> Option<i64> {
        let (epoch, sessions) = held.leases.get_mut(lease)?;
        if *epoch != at {
            return None;
        }
        sessions.remove(session);
        let epoch = *epoch;
        if sessions.is_empty() {
            held.leases.remove(lease);
            return Some(epoch);
        }
        None
    }
}

impl std::fmt::Debug for FakeNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FakeNode({})", self.index)
    }
}

#[async_trait::async_trait]
impl Store for FakeNode {
    async fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        let table = self.db.leases.lock().await;
        if let Some(lease) = batch.session() {
            let writer = batch.writer().unwrap_or(lease);
            let epoch = {
                let held = self.held.lock();
                match held.sessions.get(writer) {
                    Some((joined, at)) if joined == lease => Some(*at),
                    _ => held.leases.get(lease).map(|(epoch, _)| *epoch),
                }
            };
            let now = self.db.now();
            let valid = matches!((table.rows.get(lease), epoch),
                (Some(row), Some(epoch)) if row.owner == self.index && row.epoch == epoch && table.held(row, now));
            if !valid {
                if let Some(epoch) = epoch {
                    let mut held = self.held.lock();
                    if held.leases.get(lease).is_some_and(|(e, _)| *e == epoch) {
                        held.leases.remove(lease);
                    }
                }
                return Err(StoreError::LeaseLost {
                    session: lease.to_string(),
                });
            }
            let epoch = epoch.unwrap_or_default();
            let mut written = self.db.written.lock();
            let highest = written.entry(lease.to_string()).or_insert(epoch);
            if epoch < *highest {
                self.db.violations.lock().push(format!(
                    "node {} wrote {lease} at epoch {epoch} after epoch {highest}",
                    self.index
                ));
            }
            *highest = epoch.max(*highest);
        }
        let written = self.db.data.commit(batch).await;
        drop(table);
        written
    }

    async fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.db.data.get(tree, key).await
    }

    async fn scan_prefix(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<Entry>, StoreError> {
        self.db.data.scan_prefix(tree, prefix).await
    }

    async fn scan_prefix_rev(
        &self,
        tree: Tree,
        prefix: &[u8],
        limit: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        self.db.data.scan_prefix_rev(tree, prefix, limit).await
    }

    async fn scan_range(
        &self,
        tree: Tree,
        from: &[u8],
        to: &[u8],
        limit: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        self.db.data.scan_range(tree, from, to, limit).await
    }

    async fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn size_on_disk(&self) -> Result<u64, StoreError> {
        Ok(0)
    }

    fn is_shared(&self) -> bool {
        true
    }
}

#[async_trait::async_trait]
impl Leases for FakeNode {
    fn is_shared(&self) -> bool {
        true
    }

    async fn acquire(&self, session: &str, lease: &str) -> Result<(), StoreError> {
        if self.lapsed() {
            self.renew().await;
        }
        let mut table = self.db.leases.lock().await;
        let now = self.db.now();
        let mut held = self.held.lock();
        if !held.leases.contains_key(lease) {
            let epoch = match table.rows.get(lease) {
                Some(row) if row.owner != self.index && table.held(row, now) => {
                    return Err(StoreError::LeaseHeld {
                        session: lease.to_string(),
                        owner: format!("node-{}", row.owner),
                    });
                }
                Some(row) => row.epoch + 1,
                None => 1,
            };
            if let Some(row) = table.rows.get(lease) {
                if epoch <= row.epoch {
                    self.db
                        .violations
                        .lock()
                        .push(format!("{lease}: epoch {epoch} after {}", row.epoch));
                }
            }
            table.rows.insert(
                lease.to_string(),
                Row {
                    owner: self.index,
                    epoch,
                    expires_at: u64::MAX,
                },
            );
            held.leases
                .insert(lease.to_string(), (epoch, HashSet::new()));
        }
        let mut epoch = 0;
        if let Some((at, sessions)) = held.leases.get_mut(lease) {
            sessions.insert(session.to_string());
            epoch = *at;
        }
        let before = held
            .sessions
            .insert(session.to_string(), (lease.to_string(), epoch));
        if let Some((before, at)) = before.filter(|before| before.0 != lease || before.1 != epoch) {
            if let Some(epoch) = self.leave(&mut held, session, &before, at) {
                release_row(&mut table, &before, self.index, epoch, now);
            }
        }
        Ok(())
    }

    fn release_session(&self, session: &str) {
        // The database's side runs in the background, as PgStore's does.
        let mut held = self.held.lock();
        let Some((lease, at)) = held.sessions.remove(session) else {
            return;
        };
        let Some(epoch) = self.leave(&mut held, session, &lease, at) else {
            return;
        };
        let (db, index) = (Arc::clone(&self.db), self.index);
        tokio::spawn(async move {
            let mut table = db.leases.lock().await;
            let now = db.now();
            release_row(&mut table, &lease, index, epoch, now);
        });
    }

    fn holds_current(&self, session: &str) -> bool {
        if self.lapsed() {
            return false;
        }
        let held = self.held.lock();
        held.sessions
            .get(session)
            .is_some_and(|(lease, at)| held.leases.get(lease).is_some_and(|(epoch, _)| epoch == at))
    }

    fn holds(&self, lease: &str) -> bool {
        !self.lapsed() && self.held.lock().leases.contains_key(lease)
    }

    async fn owner(&self, lease: &str) -> Result<Option<LeaseOwner>, StoreError> {
        let table = self.db.leases.lock().await;
        let now = self.db.now();
        Ok(table
            .rows
            .get(lease)
            .filter(|row| row.owner != self.index && table.held(row, now))
            .map(|row| LeaseOwner {
                node: format!("node-{}", row.owner),
                address: None,
                key: None,
            }))
    }

    fn peer_key(&self) -> Option<PeerKey> {
        None
    }
}

/// `call`'s answer; a call that never returns fails the case.
async fn bounded<T>(
    what: &str,
    call: impl std::future::Future<Output = T>,
) -> Result<T, TestCaseError> {
    tokio::time::timeout(HANG, call)
        .await
        .map_err(|_| TestCaseError::fail(format!("{what} never returned")))
}

fn release_row(table: &mut Table, lease: &str, owner: usize, epoch: i64, now: u64) {
    if let Some(row) = table.rows.get_mut(lease) {
        if row.owner == owner && row.epoch == epoch {
            row.expires_at = now.saturating_sub(1);
        }
    }
}

/// A lead that delegates to a helper, which asks the client for an edit (with a deadline),
/// then runs `apply` (not safe to retry; its runs are counted per session) and ends.
fn node_runtime(store: Arc<FakeNode>, clock: ManualClock, applied: Arc<Applied>) -> Runtime {
    let lead = AgentDefinition::builder("lead")
        .tool(ToolDefinition::sub_agent("ask", "helper"))
        .build()
        .unwrap_or_else(|error| panic!("lead: {error}"));
    let helper = AgentDefinition::builder("helper")
        .tool(ToolDefinition::client("edit").timeout_ms(EDIT_TIMEOUT_MS))
        .tool(ToolDefinition::server("apply", move |_input, ctx| {
            let applied = Arc::clone(&applied);
            async move {
                applied.count(ctx.session_id().as_str());
                Ok::<_, ToolError>(json!({ "applied": true }))
            }
        }))
        .build()
        .unwrap_or_else(|error| panic!("helper: {error}"));
    let llm = ScriptedLlm::new()
        .script(
            "lead",
            vec![
                ModelReply::tool_calls(vec![ToolCall::new(
                    "c1",
                    "ask",
                    json!({ "message": "edit" }),
                )]),
                ModelReply::text("lead done"),
            ],
        )
        .script(
            "helper",
            vec![
                ModelReply::tool_calls(vec![ToolCall::new("e1", "edit", json!({}))]),
                ModelReply::tool_calls(vec![ToolCall::new("a1", "apply", json!({}))]),
                ModelReply::text("helper done"),
            ],
        );
    Runtime::builder()
        .shared_store(store)
        .clock(Arc::new(clock))
        .llm(Arc::new(llm))
        .agent(lead)
        .agent(helper)
        .background_deadlines(false)
        .build()
        .unwrap_or_else(|error| panic!("runtime: {error}"))
}

/// Runs of `apply`, per session.
#[derive(Default)]
struct Applied(parking_lot::Mutex<HashMap<String, usize>>);

impl Applied {
    fn count(&self, session: &str) {
        *self.0.lock().entry(session.to_string()).or_default() += 1;
    }
}

#[derive(Clone, Debug)]
enum Op {
    Start { session: usize, node: usize },
    Submit { session: usize, node: usize },
    Resume { session: usize, node: usize },
    Sweep { node: usize },
    Advance { ms: u64 },
    Pause { node: usize },
    Continue { node: usize },
    Evict { node: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let session = 0..SESSIONS;
    let node = 0..NODES;
    prop_oneof![
        3 => (session.clone(), node.clone()).prop_map(|(session, node)| Op::Start { session, node }),
        5 => (session.clone(), node.clone()).prop_map(|(session, node)| Op::Submit { session, node }),
        2 => (session, node.clone()).prop_map(|(session, node)| Op::Resume { session, node }),
        2 => node.clone().prop_map(|node| Op::Sweep { node }),
        3 => (0..(TTL_MS * 2 / 3)).prop_map(|ms| Op::Advance { ms }),
        1 => node.clone().prop_map(|node| Op::Pause { node }),
        1 => node.clone().prop_map(|node| Op::Continue { node }),
        1 => node.prop_map(|node| Op::Evict { node }),
    ]
}

struct Cluster {
    clock: ManualClock,
    db: Arc<FakeDb>,
    stores: Vec<Arc<FakeNode>>,
    runtimes: Vec<Runtime>,
    paused: Vec<bool>,
    applied: Arc<Applied>,
    /// Answers a node acknowledged (`accepted`), per session.
    accepted: HashMap<usize, usize>,
    started: HashSet<usize>,
}

fn root(session: usize) -> SessionId {
    format!("root-{session}")
        .parse()
        .unwrap_or_else(|error| panic!("id: {error}"))
}

impl Cluster {
    fn new() -> Self {
        let clock = ManualClock::new(1_000);
        let db = Arc::new(FakeDb {
            data: MemoryStore::new(),
            clock: clock.clone(),
            leases: tokio::sync::Mutex::new(Table {
                rows: HashMap::new(),
                // Every node joins live, as PgStore's open registers it.
                live_until: (0..NODES).map(|node| (node, 1_000 + TTL_MS)).collect(),
            }),
            written: parking_lot::Mutex::new(HashMap::new()),
            violations: parking_lot::Mutex::new(Vec::new()),
        });
        let applied = Arc::new(Applied::default());
        let stores: Vec<Arc<FakeNode>> = (0..NODES)
            .map(|index| {
                Arc::new(FakeNode {
                    index,
                    db: Arc::clone(&db),
                    held: parking_lot::Mutex::new(Held::default()),
                    live_until: parking_lot::Mutex::new(1_000 + TTL_MS),
                })
            })
            .collect();
        let runtimes = stores
            .iter()
            .map(|store| node_runtime(Arc::clone(store), clock.clone(), Arc::clone(&applied)))
            .collect();
        Self {
            clock,
            db,
            stores,
            runtimes,
            paused: vec![false; NODES],
            applied,
            accepted: HashMap::new(),
            started: HashSet::new(),
        }
    }

    /// The node a paused one is not: a paused process does nothing.
    fn live(&self, node: usize) -> Option<&Runtime> {
        (!self.paused[node]).then(|| &self.runtimes[node])
    }

    /// Applies `op`; a call that never returns (a session waiting forever for a message that
    /// was lost, say) fails the case.
    async fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        tokio::time::timeout(HANG, self.apply_unbounded(op))
            .await
            .map_err(|_| TestCaseError::fail(format!("{op:?} never returned")))
    }

    async fn apply_unbounded(&mut self, op: &Op) {
        match *op {
            Op::Start { session, node } => {
                if self.started.contains(&session) {
                    return;
                }
                if let Some(runtime) = self.live(node) {
                    if runtime
                        .execute_on(&root(session), "lead", "go")
                        .await
                        .is_ok()
                    {
                        self.started.insert(session);
                    }
                }
            }
            Op::Submit { session, node } => {
                let Some(runtime) = self.live(node) else {
                    return;
                };
                let answer = Submit::result(root(session).as_str(), "e1", json!({ "node": node }));
                if let Ok(SubmitOutcome::Accepted) = runtime.submit_tool_result(answer).await {
                    *self.accepted.entry(session).or_default() += 1;
                }
            }
            Op::Resume { session, node } => {
                if let Some(runtime) = self.live(node) {
                    let _ = runtime.resume(&root(session)).await;
                }
            }
            Op::Sweep { node } => {
                if let Some(runtime) = self.live(node) {
                    let _ = runtime.sweep_deadlines().await;
                }
            }
            Op::Advance { ms } => {
                // Live nodes renew as their background renewal would (every third of the
                // time to live, and no step is longer than two thirds); paused ones do not.
                self.renew_live().await;
                self.clock.advance(ms);
                self.renew_live().await;
            }
            Op::Pause { node } => self.paused[node] = true,
            Op::Continue { node } => self.paused[node] = false,
            Op::Evict { node } => {
                if let Some(runtime) = self.live(node) {
                    runtime.evict_all().await;
                }
            }
        }
    }

    async fn renew_live(&self) {
        for (node, store) in self.stores.iter().enumerate() {
            if !self.paused[node] {
                store.renew().await;
            }
        }
    }

    /// Every node continues; each session is driven to its end through its owner (or any
    /// node, when none owns it).
    async fn finish(&mut self) -> Result<(), TestCaseError> {
        self.paused = vec![false; NODES];
        for session in 0..SESSIONS {
            let id = root(session);
            if !self.started.contains(&session) {
                bounded(
                    "the last start",
                    self.runtimes[session % NODES].execute_on(&id, "lead", "go"),
                )
                .await?
                .map_err(|error| TestCaseError::fail(format!("start {id}: {error}")))?;
                self.started.insert(session);
            }
            let mut done = false;
            for _ in 0..12 {
                self.renew_live().await;
                let node = self.owner(&id).await;
                let runtime = &self.runtimes[node];
                if runtime.status(&id).await.ok() == Some(Status::Completed) {
                    done = true;
                    break;
                }
                // The deadline answers the call nobody answered.
                self.clock.advance(EDIT_TIMEOUT_MS / 2);
                self.renew_live().await;
                let _ = bounded(
                    &format!("a sweep on node {node}"),
                    runtime.sweep_deadlines(),
                )
                .await?;
                let _ =
                    bounded(&format!("resume({id}) on node {node}"), runtime.resume(&id)).await?;
            }
            prop_assert!(done, "{id} did not complete");
        }
        Ok(())
    }

    /// The node that owns `id`'s tree, or node 0 if none does.
    async fn owner(&self, id: &SessionId) -> usize {
        for (node, runtime) in self.runtimes.iter().enumerate() {
            if let Ok(Some(owner)) = runtime.owner_of(id).await {
                return owner
                    .node
                    .strip_prefix("node-")
                    .and_then(|index| index.parse().ok())
                    .unwrap_or(node);
            }
        }
        0
    }

    async fn check(&self) -> Result<(), TestCaseError> {
        let violations = self.db.violations.lock().clone();
        prop_assert!(violations.is_empty(), "{violations:?}");
        let applied = self.applied.0.lock().clone();
        for (session, runs) in &applied {
            prop_assert!(*runs <= 1, "apply ran {runs} times in {session}");
        }
        for session in 0..SESSIONS {
            let child = root(session).ephemeral_child("c1");
            let messages = self.runtimes[0]
                .messages(&child)
                .await
                .map_err(|error| TestCaseError::fail(format!("{child}: {error}")))?;
            let results: Vec<String> = messages
                .iter()
                .filter(|message| {
                    matches!(message, Message::Tool { tool_call_id, .. } if tool_call_id == "e1")
                })
                .map(|message| format!("{message:?}"))
                .collect();
            prop_assert_eq!(results.len(), 1, "{} has one result for e1", child);
            let accepted = self.accepted.get(&session).copied().unwrap_or_default();
            prop_assert!(accepted <= 1, "{accepted} answers accepted for {child}");
            if accepted == 1 {
                prop_assert!(
                    !results[0].contains("client_tool_timeout"),
                    "{child}: the acknowledged answer is the result: {}",
                    results[0]
                );
            }
        }
        Ok(())
    }

    async fn shutdown(self) {
        for runtime in self.runtimes {
            let _ = runtime.shutdown().await;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn one_writer_per_tree_whatever_the_pauses_expiries_and_takeovers(
        ops in proptest::collection::vec(op(), 1..60)
    ) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|error| TestCaseError::fail(error.to_string()))?;
        runtime.block_on(async {
            let mut cluster = Cluster::new();
            for op in &ops {
                cluster.apply(op).await?;
            }
            tokio::time::timeout(HANG * 4, cluster.finish())
                .await
                .map_err(|_| TestCaseError::fail("driving the sessions to their end never returned"))??;
            let checked = cluster.check().await;
            cluster.shutdown().await;
            checked
        })?;
    }
}
