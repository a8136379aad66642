//! The test's own delegating store, which can plant a realistic bug: it acknowledges a commit
//! but drops one of its writes. The model must report the divergence, which is how the test's
//! power is itself tested (`DORMANT_MODEL_PLANT=lost-answer` or `kept-deadline`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dormant::store::Store;
use dormant::store::{Batch, Error, Op, Tree};
use dormant::testkit::{Delegate, DelegatingStore};

/// Which bug the store plants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plant {
    /// No bug: a plain delegation.
    None,
    /// A submit's accepted answer (its pending entry rewritten) is acknowledged but not
    /// written; the deadline entry's removal beside it lands.
    LostAnswer,
    /// A deadline entry's removal is acknowledged but not done: the index keeps an entry for
    /// a call that is no longer waiting.
    KeptDeadline,
}

impl Plant {
    /// Reads `DORMANT_MODEL_PLANT` (unset: no bug).
    pub(crate) fn from_env() -> anyhow::Result<Self> {
        match std::env::var("DORMANT_MODEL_PLANT") {
            Err(_) => Ok(Plant::None),
            Ok(name) => Self::parse(&name),
        }
    }

    /// Parses a plant's name.
    pub(crate) fn parse(name: &str) -> anyhow::Result<Self> {
        match name {
            "" | "none" => Ok(Plant::None),
            "lost-answer" => Ok(Plant::LostAnswer),
            "kept-deadline" => Ok(Plant::KeptDeadline),
            other => anyhow::bail!("unknown plant {other:?} (lost-answer, kept-deadline)"),
        }
    }
}

/// When the plant fires: at the `nth` eligible commit, once. Shared across restarts, so that
/// a new runtime on the same store does not fire it again.
#[derive(Debug)]
pub(crate) struct Trigger {
    plant: Plant,
    nth: u64,
    seen: AtomicU64,
}

impl Trigger {
    /// Fires `plant` at its `nth` eligible commit.
    pub(crate) fn new(plant: Plant, nth: u64) -> Arc<Self> {
        Arc::new(Self {
            plant,
            nth,
            seen: AtomicU64::new(0),
        })
    }

    /// The batch to write instead of `batch`.
    fn rewrite(&self, batch: Batch) -> Batch {
        let drop_at = match self.plant {
            Plant::None => None,
            Plant::LostAnswer => {
                // A submit's commit: the pending entry rewritten, its deadline entry removed.
                let answer = batch.ops().iter().position(|op| {
                    matches!(
                        op,
                        Op::Put {
                            tree: Tree::Pending,
                            ..
                        }
                    )
                });
                let unarmed = batch.ops().iter().any(|op| {
                    matches!(
                        op,
                        Op::Delete {
                            tree: Tree::Deadlines,
                            ..
                        }
                    )
                });
                answer.filter(|_| unarmed && batch.ops().len() == 2)
            }
            Plant::KeptDeadline => batch.ops().iter().position(|op| {
                matches!(
                    op,
                    Op::Delete {
                        tree: Tree::Deadlines,
                        ..
                    }
                )
            }),
        };
        let Some(drop_at) = drop_at else {
            return batch;
        };
        if self.seen.fetch_add(1, Ordering::SeqCst) + 1 != self.nth {
            return batch;
        }
        let mut planted = Batch::new(batch.kind());
        if let Some(session) = batch.session() {
            planted = planted.for_session(session.to_string());
        }
        if let Some(writer) = batch.writer() {
            planted = planted.written_by(writer.to_string());
        }
        for (index, op) in batch.ops().iter().enumerate() {
            match op {
                _ if index == drop_at => {}
                Op::Put { tree, key, value } => planted.put(*tree, key.clone(), value.clone()),
                Op::Delete { tree, key } => planted.delete(*tree, key.clone()),
            }
        }
        planted
    }
}

/// Rewrites each commit as its [`Trigger`] says, on its way through a [`DelegatingStore`].
#[derive(Debug)]
pub(crate) struct Planting(Arc<Trigger>);

#[async_trait::async_trait]
impl Delegate for Planting {
    async fn commit(&self, inner: &dyn Store, batch: Batch) -> Result<(), Error> {
        inner.commit(self.0.rewrite(batch)).await
    }
}

/// `inner`, with the bug `trigger` plants.
pub(crate) fn plant_store(
    inner: Arc<dyn Store>,
    trigger: Arc<Trigger>,
) -> DelegatingStore<Planting> {
    DelegatingStore::wrap(inner, Planting(trigger))
}
