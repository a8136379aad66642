//! Routing of calls between nodes, with a fake lease table and a fake transport (no
//! database): a call is routed once, before anything is activated, by its tree's lease; a call
//! routed to another node is sent there and never activated here; a call routed here whose
//! activation is refused because another node took the tree meanwhile (`LeaseHeld`, carried
//! typed through the actor host) is routed once more, to that owner.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use dormant::cluster::leases::{LeaseOwner, Leases, PeerKey};
use dormant::cluster::peer::{PeerAnswer, PeerCall, PeerFailure, Peers};
use dormant::remote::RemoteError;
use dormant::store::Error as StoreError;
use dormant::{
    AgentDefinition, Error, ManualClock, MemoryStore, ModelReply, Runtime, ScriptedLlm, SessionId,
};

/// The lease table as another node holds every tree: each take is refused, and the owner is
/// known once `known_after` lookups have been made (before that, nobody seems to hold it:
/// the race between a route and an activation).
#[derive(Debug)]
struct HeldElsewhere {
    known_after: usize,
    lookups: AtomicUsize,
    takes: AtomicUsize,
}

impl HeldElsewhere {
    fn new(known_after: usize) -> Arc<Self> {
        Arc::new(Self {
            known_after,
            lookups: AtomicUsize::new(0),
            takes: AtomicUsize::new(0),
        })
    }
}

#[async_trait::async_trait]
impl Leases for HeldElsewhere {
    fn is_shared(&self) -> bool {
        true
    }

    async fn acquire(&self, _session: &str, lease: &str) -> Result<(), StoreError> {
        self.takes.fetch_add(1, Ordering::SeqCst);
        Err(StoreError::LeaseHeld {
            session: lease.to_string(),
            owner: "a".into(),
        })
    }

    fn release_session(&self, _session: &str) {}

    fn holds_current(&self, _session: &str) -> bool {
        false
    }

    fn holds(&self, _lease: &str) -> bool {
        false
    }

    async fn owner(&self, _lease: &str) -> Result<Option<LeaseOwner>, StoreError> {
        let lookup = self.lookups.fetch_add(1, Ordering::SeqCst);
        Ok((lookup >= self.known_after).then(node_a))
    }

    fn peer_key(&self) -> Option<PeerKey> {
        Some(PeerKey::new("b-key"))
    }
}

/// Node A as the lease table names it.
fn node_a() -> LeaseOwner {
    LeaseOwner {
        node: "a".into(),
        address: Some("fake://a".into()),
        key: Some(PeerKey::new("a-key")),
    }
}

/// Node A as the transport sees it: it records the calls it is sent and answers that the
/// session is running there (or, `down`, does not answer).
#[derive(Debug, Default)]
struct NodeA {
    calls: parking_lot::Mutex<Vec<PeerCall>>,
    down: bool,
}

#[async_trait::async_trait]
impl Peers for NodeA {
    async fn call(&self, owner: &LeaseOwner, call: &PeerCall) -> Result<PeerAnswer, RemoteError> {
        assert_eq!(owner.node, "a");
        self.calls.lock().push(call.clone());
        if self.down {
            return Err(RemoteError::Unreachable {
                endpoint: "fake://a".into(),
                reason: "connection refused".into(),
            });
        }
        Ok(PeerAnswer::Failed(PeerFailure::of(&Error::AlreadyRunning(
            call.session().unwrap_or_else(SessionId::generate),
        ))))
    }
}

fn greeter() -> anyhow::Result<AgentDefinition> {
    Ok(AgentDefinition::builder("greeter").build()?)
}

/// A store that holds session `s1` (written by a runtime alone on it, since shut down), as
/// the database node A wrote it holds it for B.
async fn store_with_s1() -> anyhow::Result<Arc<MemoryStore>> {
    let store = Arc::new(MemoryStore::new());
    let llm = ScriptedLlm::new().script("greeter", vec![ModelReply::text("hello")]);
    let alone = Runtime::builder()
        .store(Arc::clone(&store) as Arc<dyn dormant::store::Store>)
        .llm(Arc::new(llm))
        .agent(greeter()?)
        .build()?;
    alone.execute_on(&"s1".parse()?, "greeter", "hi").await?;
    alone.shutdown().await?;
    Ok(store)
}

fn node_b(
    store: Arc<MemoryStore>,
    leases: Arc<HeldElsewhere>,
    peers: Option<Arc<NodeA>>,
) -> anyhow::Result<Runtime> {
    let mut builder = Runtime::builder()
        .store(store)
        .leases(leases)
        .agent(greeter()?);
    if let Some(peers) = peers {
        builder = builder.peers(peers);
    }
    Ok(builder.build()?)
}

#[tokio::test]
async fn a_call_for_a_tree_another_node_owns_is_sent_there_and_nothing_is_activated_here(
) -> anyhow::Result<()> {
    let leases = HeldElsewhere::new(0);
    let a = Arc::new(NodeA::default());
    let b = node_b(
        store_with_s1().await?,
        Arc::clone(&leases),
        Some(Arc::clone(&a)),
    )?;
    let id: SessionId = "s1".parse()?;

    let answer = b.execute_on(&id, "greeter", "hi").await;

    assert!(
        matches!(&answer, Err(Error::AlreadyRunning(session)) if *session == id),
        "A's answer is B's: {answer:?}"
    );
    assert_eq!(a.calls.lock().len(), 1, "one call, sent once");
    assert_eq!(leases.takes.load(Ordering::SeqCst), 0, "no activation here");
    assert_eq!(leases.lookups.load(Ordering::SeqCst), 1, "one lookup");
    assert!(!b.is_resident(&id));
    b.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn a_call_that_loses_the_race_for_its_tree_is_routed_once_more_to_the_owner(
) -> anyhow::Result<()> {
    // The first lookup finds no owner, so the call is served here; its activation is refused
    // the lease (another node took it meanwhile), and the second lookup names the owner.
    let leases = HeldElsewhere::new(1);
    let a = Arc::new(NodeA::default());
    let b = node_b(
        store_with_s1().await?,
        Arc::clone(&leases),
        Some(Arc::clone(&a)),
    )?;
    let id: SessionId = "s1".parse()?;

    let answer = b.execute_on(&id, "greeter", "hi").await;

    assert!(
        matches!(&answer, Err(Error::AlreadyRunning(session)) if *session == id),
        "A's answer is B's: {answer:?}"
    );
    let calls = a.calls.lock().clone();
    assert_eq!(calls.len(), 1, "sent once: {calls:?}");
    assert!(
        matches!(&calls[0], PeerCall::Execute { session, message, .. } if *session == id && message == "hi"),
        "{calls:?}"
    );
    assert_eq!(
        leases.takes.load(Ordering::SeqCst),
        1,
        "one activation here"
    );
    assert_eq!(
        leases.lookups.load(Ordering::SeqCst),
        2,
        "routed twice, no more"
    );
    b.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn a_new_session_another_node_starts_first_is_routed_there_after_its_start_is_refused(
) -> anyhow::Result<()> {
    // Not written yet: served here without a look at the lease table; the start is refused
    // the lease (the other node took it), and the look then finds the owner.
    let leases = HeldElsewhere::new(0);
    let a = Arc::new(NodeA::default());
    let b = node_b(
        Arc::new(MemoryStore::new()),
        Arc::clone(&leases),
        Some(Arc::clone(&a)),
    )?;
    let id: SessionId = "s2".parse()?;

    let answer = b.start_on(&id, "greeter", "hi").await;

    assert!(
        matches!(&answer, Err(Error::AlreadyRunning(session)) if *session == id),
        "{answer:?}"
    );
    assert_eq!(a.calls.lock().len(), 1);
    assert_eq!(leases.takes.load(Ordering::SeqCst), 1);
    assert_eq!(leases.lookups.load(Ordering::SeqCst), 1);
    b.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn without_a_transport_a_call_for_a_tree_another_node_owns_is_unavailable_here(
) -> anyhow::Result<()> {
    let leases = HeldElsewhere::new(0);
    let b = node_b(store_with_s1().await?, Arc::clone(&leases), None)?;
    let id: SessionId = "s1".parse()?;

    let answer = b.execute_on(&id, "greeter", "hi").await;

    assert!(
        matches!(&answer, Err(Error::SessionUnavailable { session, reason }) if *session == id && reason.contains("owned by node a")),
        "{answer:?}"
    );
    assert_eq!(
        leases.lookups.load(Ordering::SeqCst),
        0,
        "nothing to route by"
    );
    b.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn an_owner_that_does_not_answer_makes_the_call_retryable_and_nothing_is_written_here(
) -> anyhow::Result<()> {
    let leases = HeldElsewhere::new(0);
    let a = Arc::new(NodeA {
        down: true,
        ..NodeA::default()
    });
    let b = node_b(
        store_with_s1().await?,
        Arc::clone(&leases),
        Some(Arc::clone(&a)),
    )?;
    let id: SessionId = "s1".parse()?;

    let answer = b.execute_on(&id, "greeter", "hi").await;

    match answer {
        Err(error @ Error::OwnerUnreachable { .. }) => {
            assert_eq!(error.code(), "owner_unreachable");
            assert!(
                error.to_string().contains("owned by node a at fake://a"),
                "{error}"
            );
        }
        other => anyhow::bail!("expected the owner unreachable, got {other:?}"),
    }
    assert_eq!(leases.takes.load(Ordering::SeqCst), 0, "no activation here");
    b.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn a_call_a_peer_routed_here_is_served_here_and_never_sent_further() -> anyhow::Result<()> {
    let leases = HeldElsewhere::new(0);
    let a = Arc::new(NodeA::default());
    let b = node_b(
        Arc::new(MemoryStore::new()),
        Arc::clone(&leases),
        Some(Arc::clone(&a)),
    )?;
    let id: SessionId = "s1".parse()?;
    let call = PeerCall::Stop {
        session: id.clone(),
        abort: false,
    };

    assert!(matches!(
        b.serve_peer("not-the-key", call.clone()).await,
        Err(Error::PeerRefused)
    ));
    let answer = b.serve_peer("b-key", call).await?;

    // The session is unknown here, and that is the answer: nothing is sent on.
    assert!(
        matches!(&answer, PeerAnswer::Failed(failure) if failure.code == "unknown_session"),
        "{answer:?}"
    );
    assert!(a.calls.lock().is_empty());
    assert_eq!(leases.lookups.load(Ordering::SeqCst), 0);
    b.shutdown().await?;
    Ok(())
}

/// The lease table as it changes: node `a` holds every tree at the first lookup, node `c` at
/// every later one.
#[derive(Debug, Default)]
struct Moved {
    lookups: AtomicUsize,
}

#[async_trait::async_trait]
impl Leases for Moved {
    fn is_shared(&self) -> bool {
        true
    }

    async fn acquire(&self, _session: &str, lease: &str) -> Result<(), StoreError> {
        Err(StoreError::LeaseHeld {
            session: lease.to_string(),
            owner: "c".into(),
        })
    }

    fn release_session(&self, _session: &str) {}

    fn holds_current(&self, _session: &str) -> bool {
        false
    }

    fn holds(&self, _lease: &str) -> bool {
        false
    }

    async fn owner(&self, _lease: &str) -> Result<Option<LeaseOwner>, StoreError> {
        let node = match self.lookups.fetch_add(1, Ordering::SeqCst) {
            0 => "a",
            _ => "c",
        };
        Ok(Some(LeaseOwner {
            node: node.into(),
            address: Some(format!("fake://{node}")),
            key: None,
        }))
    }

    fn peer_key(&self) -> Option<PeerKey> {
        None
    }
}

/// Nodes `a` (which runs every session at its first call, and owns nothing after) and `c`
/// (which runs every session), as the transport sees them: the nodes called, in order.
#[derive(Debug, Default)]
struct AThenC {
    called: parking_lot::Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl Peers for AThenC {
    async fn call(&self, owner: &LeaseOwner, call: &PeerCall) -> Result<PeerAnswer, RemoteError> {
        let first = !self.called.lock().contains(&owner.node);
        self.called.lock().push(owner.node.clone());
        let session = call.session().unwrap_or_else(SessionId::generate);
        let error = match owner.node.as_str() {
            "a" if !first => Error::SessionUnavailable {
                session,
                reason: "its tree is owned by node c".into(),
            },
            _ => Error::AlreadyRunning(session),
        };
        Ok(PeerAnswer::Failed(PeerFailure::of(&error)))
    }
}

/// Node B on a store that holds `s1`, with the lease table `Moved` and the nodes `AThenC`, on
/// a clock moved by hand.
async fn node_b_moved(clock: &ManualClock) -> anyhow::Result<(Runtime, Arc<Moved>, Arc<AThenC>)> {
    let leases = Arc::new(Moved::default());
    let nodes = Arc::new(AThenC::default());
    let b = Runtime::builder()
        .store(store_with_s1().await?)
        .leases(Arc::clone(&leases) as Arc<dyn Leases>)
        .peers(Arc::clone(&nodes) as Arc<dyn Peers>)
        .clock(Arc::new(clock.clone()))
        .agent(greeter()?)
        .build()?;
    Ok((b, leases, nodes))
}

#[tokio::test]
async fn an_owner_remembered_from_a_moment_ago_that_refused_the_call_is_looked_up_again(
) -> anyhow::Result<()> {
    let clock = ManualClock::new(0);
    let (b, leases, nodes) = node_b_moved(&clock).await?;
    let id: SessionId = "s1".parse()?;

    // Looked up now, A answers (its run is in progress), and B remembers it for a moment.
    let first = b.execute_on(&id, "greeter", "hi").await;
    assert!(matches!(&first, Err(Error::AlreadyRunning(_))), "{first:?}");
    // The tree moved to C meanwhile: A, remembered, refuses, and B looks again and sends the
    // call to C. (A refusal by an owner looked up for the call itself is its answer: two
    // nodes disagree for a moment, and a retry finds the owner.)
    clock.advance(999);
    let second = b.execute_on(&id, "greeter", "hi").await;
    assert!(
        matches!(&second, Err(Error::AlreadyRunning(session)) if *session == id),
        "{second:?}"
    );
    assert_eq!(*nodes.called.lock(), ["a", "a", "c"]);
    assert_eq!(leases.lookups.load(Ordering::SeqCst), 2);
    b.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn an_owner_looked_up_a_second_ago_or_more_is_looked_up_again_before_the_call_is_sent(
) -> anyhow::Result<()> {
    let clock = ManualClock::new(0);
    let (b, leases, nodes) = node_b_moved(&clock).await?;
    let id: SessionId = "s1".parse()?;

    let first = b.execute_on(&id, "greeter", "hi").await;
    assert!(matches!(&first, Err(Error::AlreadyRunning(_))), "{first:?}");
    // A second later, what B remembered is stale: it looks again, finds C, and sends the call
    // there only.
    clock.advance(1_000);
    let second = b.execute_on(&id, "greeter", "hi").await;
    assert!(
        matches!(&second, Err(Error::AlreadyRunning(session)) if *session == id),
        "{second:?}"
    );
    assert_eq!(*nodes.called.lock(), ["a", "c"]);
    assert_eq!(leases.lookups.load(Ordering::SeqCst), 2);
    b.shutdown().await?;
    Ok(())
}

/// The lease table as this node holds every tree, until a commit finds the lease lost: from
/// then on node `a` owns it.
#[derive(Debug, Default)]
struct HeldHereThenLost;

#[async_trait::async_trait]
impl Leases for HeldHereThenLost {
    fn is_shared(&self) -> bool {
        true
    }

    async fn acquire(&self, _session: &str, _lease: &str) -> Result<(), StoreError> {
        Ok(())
    }

    fn release_session(&self, _session: &str) {}

    fn holds_current(&self, _session: &str) -> bool {
        true
    }

    fn holds(&self, _lease: &str) -> bool {
        false
    }

    async fn owner(&self, _lease: &str) -> Result<Option<LeaseOwner>, StoreError> {
        Ok(Some(node_a()))
    }

    fn peer_key(&self) -> Option<PeerKey> {
        Some(PeerKey::new("b-key"))
    }
}

/// Fences every commit of a run after its first, as a store does once another node took the
/// tree: the run's start lands, the commit of the model's reply finds the lease lost.
#[derive(Debug, Default)]
struct FencedAfterTheStart {
    commits: AtomicUsize,
}

#[async_trait::async_trait]
impl dormant::testkit::Delegate for FencedAfterTheStart {
    async fn before(&self, call: dormant::testkit::Call<'_>) -> Result<(), StoreError> {
        if let dormant::testkit::Call::Commit(_) = call {
            if self.commits.fetch_add(1, Ordering::SeqCst) > 0 {
                return Err(StoreError::LeaseLost {
                    session: "s1".into(),
                });
            }
        }
        Ok(())
    }
}

/// A lease lost after the run's first commit landed is not "nothing written": the call is not
/// sent to the node that took the tree over (it would run the message a second time there),
/// and its caller learns that its run was cut (`run_cut`: resume, do not send it again).
#[tokio::test]
async fn a_lease_lost_after_the_run_began_does_not_send_the_message_again() -> anyhow::Result<()> {
    let store = dormant::testkit::DelegatingStore::wrap(
        Arc::new(MemoryStore::new()),
        FencedAfterTheStart::default(),
    );
    let a = Arc::new(NodeA::default());
    let llm = ScriptedLlm::new().script("greeter", vec![ModelReply::text("hello")]);
    let b = Runtime::builder()
        .store(Arc::new(store))
        .leases(Arc::new(HeldHereThenLost))
        .peers(Arc::clone(&a) as Arc<dyn Peers>)
        .llm(Arc::new(llm))
        .clock(Arc::new(ManualClock::new(0)))
        .agent(greeter()?)
        .build()?;
    let id: SessionId = "s1".parse()?;

    let answer = b.execute_on(&id, "greeter", "hi").await;

    let calls = a.calls.lock().clone();
    assert!(calls.is_empty(), "the message was sent again: {calls:?}");
    assert!(
        matches!(&answer, Err(Error::RunCut { session, .. }) if *session == id),
        "{answer:?}"
    );
    b.shutdown().await?;
    Ok(())
}
