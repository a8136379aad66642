//! The persistence boundary: a byte-level, transactional key-value [`Store`] with named trees.
//!
//! Sessions never talk to sled directly. The typed layout (which key holds what, and how values
//! are encoded) is the runtime's own (`store/schema.rs`); a backend only has to apply a
//! [`Batch`] atomically and durably, and to read keys and prefixes back.
//! [`SledStore`] is the embedded default; [`MemoryStore`](crate::MemoryStore) is for unit
//! tests.
//!
//! Public as the implementer's room of a store: the [`Store`] trait and what it speaks
//! ([`Batch`], [`Op`], [`Tree`], [`CommitKind`], [`Entry`], [`Error`], [`Damage`]), and the
//! built-in backends' options ([`Durability`], [`SledStoreBuilder`], [`SledError`], and with
//! `postgres` the PostgreSQL store's builder and settings). The backends themselves are at the
//! crate root.

mod damage;
pub(crate) mod directory;
#[cfg(feature = "fjall")]
pub(crate) mod fjall;
pub(crate) mod group_thread;
#[cfg(all(unix, feature = "journal"))]
pub(crate) mod journal;
pub(crate) mod keyspace;
pub(crate) mod mark;
// Test tooling, like `crate::testkit::scenario`: only with the `test-util` feature, and
// public through `dormant::testkit` alone.
#[cfg(feature = "test-util")]
pub(crate) mod delegating;
#[cfg(feature = "test-util")]
pub(crate) mod faulty;
pub(crate) mod memory;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
// The stored layout is the runtime's own, not part of the store interface: public only for
// this crate's integration tests and benches, which write raw stored values (a garbled
// snapshot in tests/bad_input.rs, a version byte in tests/submit_contract.rs, deadline index
// entries in benches/hitl.rs), and hidden from the docs. Its error is `SchemaError` here.
#[doc(hidden)]
pub mod schema;
pub(crate) mod sled;
#[cfg(test)]
mod wait;

use std::fmt::Debug;
use std::path::{Path, PathBuf};

pub use self::damage::Damage;
#[cfg(all(unix, feature = "journal"))]
pub use self::journal::JournalStoreBuilder;
#[cfg(feature = "postgres")]
pub use self::postgres::{PgSetting, PgStoreBuilder, DEFAULT_LEASE_TTL};
/// Why a stored value could not be read back (in [`crate::Error::Schema`]).
pub use self::schema::Error as SchemaError;
pub(crate) use self::sled::SledStore;
pub use self::sled::{Durability, SledError, SledStoreBuilder};

/// The named key spaces of the store. [`SledStore`] keeps them all in one sled tree, each as a
/// key range of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Tree {
    /// Session id → the session's record as of its first commit (with a format version). Only
    /// the fields that never change (its root, parent, agent) are read from it; the current
    /// record is in the newest [`Tree::Log`] entry.
    Sessions,
    /// (session id, chunk end, log seq) → what one commit appended to the session: its
    /// messages, its run record (when the run changed), its stream chunks and the session's
    /// record after the commit, in one entry, so a step costs one write here however many
    /// messages and chunks it has. Append-only.
    Log,
    /// (session id, tool call id) → pending client-tool entry.
    Pending,
    /// (deadline, session id, tool call id) → nothing; ordered by deadline.
    Deadlines,
    /// (root session id, tool call id, owner) → the owning sub-agent session id, or where a
    /// remote child's tree has the call (a root's own calls have no entry: its pending entry
    /// stands for it). One entry per owner: several sessions of a tree may wait on one call id.
    /// Stores written before hold (root session id, tool call id) entries, read and moved by
    /// the runtime.
    Ownership,
    /// (root session id, tool call id) → completion time.
    Tombstones,
    /// (completion time, root session id, tool call id) → nothing. No longer written: the
    /// reaper walks [`Tree::Tombstones`] itself. Entries left by stores written before are
    /// deleted by the reaper.
    TombstoneExpiry,
    /// (parent session id, tool call id) → the sub-agent call's child entry.
    Children,
    /// (parent session id, name) → a persistent sub-agent as its parent knows it.
    Companions,
    /// Remote child session id → a remote sub-agent its parent let go (wrote off, aborted or
    /// interrupted) whose server did not answer the stop: stopped there once it answers.
    RemoteOrphans,
}

impl Tree {
    /// Every tree, in a fixed order (backends open them all at start).
    pub const ALL: [Tree; 10] = [
        Tree::Sessions,
        Tree::Log,
        Tree::Pending,
        Tree::Deadlines,
        Tree::Ownership,
        Tree::Tombstones,
        Tree::TombstoneExpiry,
        Tree::Children,
        Tree::Companions,
        Tree::RemoteOrphans,
    ];

    /// The tree's name (in debug output and documentation).
    pub fn name(self) -> &'static str {
        match self {
            Tree::Sessions => "sessions",
            Tree::Log => "log",
            Tree::Pending => "pending",
            Tree::Deadlines => "deadlines",
            Tree::Ownership => "ownership",
            Tree::Tombstones => "tombstones",
            Tree::TombstoneExpiry => "tombstone_expiry",
            Tree::Children => "children",
            Tree::Companions => "companions",
            Tree::RemoteOrphans => "remote_orphans",
        }
    }
}

/// Which step of a session a commit records (the session core decides it).
///
/// Backends ignore it: a batch is applied the same whatever its kind. It labels the batch for
/// whatever wraps a store, such as the `FaultyStore` of the `test-util` feature, which fails a chosen kind of commit to open
/// a chosen crash window (the scenarios' `crash_before`): a step's tool calls and its tool
/// results write the same trees, so the batch's keys alone would not tell them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CommitKind {
    /// A new run: the session, the user message and the run record.
    RunStart,
    /// Commit #1 of a step: the model's reply with its tool calls, before anything runs.
    ToolCalls,
    /// Commit #2 of a step: tool results, step count and state changes.
    ToolResults,
    /// The end of a run (completed, failed, interrupted) without tool results.
    RunEnd,
    /// Anything else (a submitted answer, an interrupt flag, a timeout).
    Other,
}

/// One write of a [`Batch`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Set `key` in `tree` to `value`.
    Put {
        /// The tree written.
        tree: Tree,
        /// The key.
        key: Vec<u8>,
        /// The new value.
        value: Vec<u8>,
    },
    /// Remove `key` from `tree` (no error if absent).
    Delete {
        /// The tree written.
        tree: Tree,
        /// The key.
        key: Vec<u8>,
    },
}

/// Writes that land together or not at all.
#[derive(Clone, Debug)]
pub struct Batch {
    kind: CommitKind,
    ops: Vec<Op>,
    session: Option<std::sync::Arc<str>>,
    writer: Option<std::sync::Arc<str>>,
}

impl Batch {
    /// An empty batch of the given kind.
    pub fn new(kind: CommitKind) -> Self {
        Self {
            kind,
            ops: Vec::new(),
            session: None,
            writer: None,
        }
    }

    /// Marks the batch as a commit of `session`: a store shared by several nodes writes it
    /// only while this process holds the session's lease
    /// ([`Leases::acquire`](crate::cluster::leases::Leases::acquire)), in the same transaction as it
    /// checks that (fencing).
    #[must_use]
    pub fn for_session(mut self, session: impl Into<std::sync::Arc<str>>) -> Self {
        self.session = Some(session.into());
        self
    }

    /// The session the batch is a commit of, if it is one (the lease that fences it).
    pub fn session(&self) -> Option<&str> {
        self.session.as_deref()
    }

    /// Names the session whose actor wrote the batch, when it is not the one whose lease
    /// fences it (a sub-agent writes under its tree's lease): a shared store checks the
    /// lease at the epoch that session took it at, so an actor whose node lost the lease and
    /// took it again later, its memory stale, cannot write.
    #[must_use]
    pub fn written_by(mut self, session: impl Into<std::sync::Arc<str>>) -> Self {
        self.writer = Some(session.into());
        self
    }

    /// The session whose actor wrote the batch: [`Batch::written_by`], else
    /// [`Batch::session`].
    pub fn writer(&self) -> Option<&str> {
        self.writer.as_deref().or(self.session.as_deref())
    }

    /// Adds a put.
    pub fn put(&mut self, tree: Tree, key: Vec<u8>, value: Vec<u8>) {
        self.ops.push(Op::Put { tree, key, value });
    }

    /// Adds a delete.
    pub fn delete(&mut self, tree: Tree, key: Vec<u8>) {
        self.ops.push(Op::Delete { tree, key });
    }

    /// Which step this commit records (a label: backends ignore it).
    pub fn kind(&self) -> CommitKind {
        self.kind
    }

    /// The writes, in order.
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// Whether the batch writes nothing.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Total bytes of keys and values (for metrics and benches).
    pub fn byte_len(&self) -> usize {
        self.ops
            .iter()
            .map(|op| match op {
                Op::Put { key, value, .. } => key.len() + value.len(),
                Op::Delete { key, .. } => key.len(),
            })
            .sum()
    }
}

/// The first key after every key that starts with `prefix` (`None` when there is none: the
/// prefix is empty or all `0xff`).
pub(crate) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let last = prefix.iter().rposition(|&byte| byte != 0xff)?;
    let mut end = prefix[..=last].to_vec();
    end[last] += 1;
    Some(end)
}

/// A key and its value, as read back from a tree.
pub type Entry = (Vec<u8>, Vec<u8>);

/// Errors of a store backend.
///
/// The variants are the failures a caller acts on and any backend can have: a full disk (retry
/// once space is freed), a store another holder has locked, a closed store. Everything else a
/// backend reports is [`Error::Backend`], which carries the backend's own error: for
/// [`SledStore`] a [`SledError`] (sled's own errors, a store of an older layout), for
/// `FaultyStore` an `InjectedFault`. A caller that needs one finds it with
/// [`Error::downcast_ref`].
///
/// Every message is complete on its own and each error is printed once by a reporter that
/// prints the whole chain (such as `anyhow`'s `{:#}`): [`Error::Backend`] is transparent (its
/// message is the backend error's, and its [`source`](std::error::Error::source) is the
/// backend error's source, if any), and no other variant reports a source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The backend failed in a way no other variant names. Its message is the backend error's
    /// own (for the sled backend, `sled: …`, `store i/o: …`, or the refusal of an older
    /// layout).
    #[error(transparent)]
    Backend(Box<dyn std::error::Error + Send + Sync + 'static>),
    /// The device that holds the store is full, or the disk quota is exhausted (`ENOSPC`,
    /// `EDQUOT`). Nothing of the failed commit was acknowledged, and what the store shows
    /// is what is on disk. It is [retryable](Error::is_retryable): once space is freed,
    /// the same store commits again, without being reopened. While the disk stays full, reads
    /// can fail with it too (see [`SledStore`]).
    #[error("cannot write to {}: {kind}; its commits fail until space is freed, then succeed again", location(.path.as_deref()))]
    StorageFull {
        /// The store directory (`None` for a temporary store).
        path: Option<PathBuf>,
        /// [`StorageFull`](std::io::ErrorKind::StorageFull) or
        /// [`QuotaExceeded`](std::io::ErrorKind::QuotaExceeded).
        kind: std::io::ErrorKind,
    },
    /// The store directory is locked by another open store: another process, or another
    /// [`SledStore`] of this process that was not dropped or closed. Reported after waiting
    /// half a second for the lock.
    #[error("store directory {} is in use by another process (or by another open SledStore in this process)", .path.display())]
    Locked {
        /// The store directory.
        path: PathBuf,
    },
    /// The store was closed, or its flusher thread is gone.
    #[error("store is closed")]
    Closed,
    /// This process no longer owns the session it wrote for: its lease on a shared store
    /// expired (a pause, a partition) and another node may have taken it over. Nothing of the
    /// commit was written. Not retryable here: the session lives on where its lease is.
    #[error(
        "the lease on session {session} is lost: another node may own it now; nothing was written"
    )]
    LeaseLost {
        /// The session.
        session: String,
    },
    /// Another live node owns the session (its lease has not expired).
    #[error("session {session} is owned by node {owner} (its lease has not expired)")]
    LeaseHeld {
        /// The session.
        session: String,
        /// The node that holds its lease.
        owner: String,
    },
    /// The store's files hold less than it acknowledged (see [`Damage`]): it refuses to open
    /// rather than serve what is left as if it were all. Not retryable: opening it to salvage
    /// ([`SledStoreBuilder::salvage`]) shows what is left, read-only.
    #[error("{} is damaged: {damage}; it refuses to open (open it to salvage, read-only, to see what is left)", location(.path.as_deref()))]
    Damaged {
        /// The store directory (`None` for a temporary store).
        path: Option<PathBuf>,
        /// What it lost.
        damage: Damage,
    },
    /// The store was opened read-only, to salvage what a damage left: it takes no commit.
    #[error("{} was opened read-only to salvage what is left of it: it takes no commit", location(.path.as_deref()))]
    ReadOnly {
        /// The store directory (`None` for a temporary store).
        path: Option<PathBuf>,
    },
}

impl Error {
    /// The same error again, for each commit that waited on one failed group (store errors
    /// are not `Clone`: a backend's own error keeps its type where it can, else its text).
    pub(crate) fn duplicate(&self) -> Error {
        match self {
            Error::Backend(backend) => match backend.downcast_ref::<SledError>() {
                Some(sled) => sled.duplicate().into(),
                // Another backend's error (fjall's, say) keeps its text.
                None => Error::backend(backend.to_string()),
            },
            Error::StorageFull { path, kind } => Error::StorageFull {
                path: path.clone(),
                kind: *kind,
            },
            Error::Locked { path } => Error::Locked { path: path.clone() },
            Error::Closed => Error::Closed,
            Error::LeaseLost { session } => Error::LeaseLost {
                session: session.clone(),
            },
            Error::LeaseHeld { session, owner } => Error::LeaseHeld {
                session: session.clone(),
                owner: owner.clone(),
            },
            Error::Damaged { path, damage } => Error::Damaged {
                path: path.clone(),
                damage: damage.clone(),
            },
            Error::ReadOnly { path } => Error::ReadOnly { path: path.clone() },
        }
    }

    /// A backend's own error, as [`Error::Backend`]. A `String` or `&str` becomes an error
    /// with that text.
    pub fn backend(error: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        Error::Backend(error.into())
    }

    /// The backend's own error, if this is an [`Error::Backend`] carrying an `E`: for example
    /// a [`SledError`] (`error.downcast_ref::<SledError>()`) or an `InjectedFault` (feature `test-util`).
    pub fn downcast_ref<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            Error::Backend(error) => error.downcast_ref(),
            _ => None,
        }
    }

    /// Whether the failure is temporary: the same call can succeed later, once the condition
    /// the error names has cleared, with nothing to repair first. A commit that failed so was
    /// not acknowledged, and the store stays usable as it is: it need not be reopened.
    ///
    /// True for [`Error::StorageFull`] (retry once space is freed) and [`Error::Locked`]
    /// (open again once the other holder has closed the store). Every other error is not
    /// known to clear by itself.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::StorageFull { .. } | Error::Locked { .. })
    }
}

/// How [`Error::StorageFull`] names the store.
fn location(path: Option<&Path>) -> String {
    match path {
        Some(path) => format!("store directory {}", path.display()),
        None => "the temporary store".to_owned(),
    }
}

/// A transactional, durable key-value store with named trees.
///
/// Implementations must make [`Store::commit`] atomic (after a crash, all of a batch or none of
/// it is visible) and durable at their configured level before it returns.
///
/// Reads are `async` too, so that a backend across a network (a database server) can wait for
/// its answer without holding a thread; an embedded one ([`SledStore`], [`MemoryStore`](crate::MemoryStore))
/// answers at once. A read sees every commit acknowledged before it began.
#[async_trait::async_trait]
pub trait Store: Send + Sync + Debug + 'static {
    /// Applies every write of `batch` atomically; returns once the batch is durable.
    ///
    /// # Errors
    /// A backend failure; then nothing of the batch may be acknowledged.
    /// [`Error::is_retryable`] tells whether the same commit can succeed later (on a full
    /// disk, once space is freed).
    async fn commit(&self, batch: Batch) -> Result<(), Error>;

    /// Reads one key.
    ///
    /// # Errors
    /// A backend failure.
    async fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, Error>;

    /// Reads every entry whose key starts with `prefix`, in key order.
    ///
    /// # Errors
    /// A backend failure.
    async fn scan_prefix(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<Entry>, Error>;

    /// Reads up to `limit` entries whose key starts with `prefix`, last key first.
    ///
    /// # Errors
    /// A backend failure.
    async fn scan_prefix_rev(
        &self,
        tree: Tree,
        prefix: &[u8],
        limit: usize,
    ) -> Result<Vec<Entry>, Error>;

    /// Reads up to `limit` entries with `from <= key < to`, in key order.
    ///
    /// # Errors
    /// A backend failure.
    async fn scan_range(
        &self,
        tree: Tree,
        from: &[u8],
        to: &[u8],
        limit: usize,
    ) -> Result<Vec<Entry>, Error>;

    /// Makes everything committed so far durable (used by graceful shutdown).
    ///
    /// # Errors
    /// A backend failure.
    async fn flush(&self) -> Result<(), Error>;

    /// Makes everything committed durable and releases the backend (its files and locks),
    /// even if other handles on the store remain; they fail with [`Error::Closed`] from then
    /// on. The default only flushes.
    ///
    /// # Errors
    /// The final flush failed.
    async fn close(&self) -> Result<(), Error> {
        self.flush().await
    }

    /// Releases the backend (its files and locks) now, from synchronous code: a drop. It
    /// waits for a write in progress, not for queued ones, which fail; it needs no final
    /// flush of its own, since every acknowledged commit is durable already. Other handles
    /// fail with [`Error::Closed`] from then on. A runtime dropped without
    /// [`shutdown`](crate::Runtime::shutdown) calls this on a store nobody else holds. The
    /// default does nothing.
    fn release(&self) {}

    /// Whether [`Store::close`] or [`Store::release`] has closed the store: then every call
    /// fails with [`Error::Closed`]. Answered from memory, without a round trip, so that
    /// synchronous code (building a runtime) can refuse a closed store at once. The default
    /// is `false`: a store that is never closed.
    fn is_closed(&self) -> bool {
        false
    }

    /// Whether other processes write this store too (a database several nodes share), so
    /// that a commit is written only under the lease of its tree, which the store keeps
    /// beside its data: such a store is given to a runtime with its leases
    /// ([`RuntimeBuilder::shared_store`](crate::RuntimeBuilder::shared_store)). The default
    /// is `false`: a store this process uses alone.
    fn is_shared(&self) -> bool {
        false
    }

    /// Bytes the store occupies on disk (0 for memory).
    ///
    /// # Errors
    /// A backend failure.
    async fn size_on_disk(&self) -> Result<u64, Error>;

    /// Why the store cannot take commits now, as far as it knows (the last commit found the
    /// disk full, say), until one succeeds again; `None` while it can. What a health check
    /// reports: reads may go on meanwhile.
    fn degraded(&self) -> Option<String> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::InjectedFault;

    /// An error reporter that prints the whole chain (`anyhow`'s `{:#}`) shows a wrapped
    /// error's text once.
    #[test]
    fn a_wrapped_error_is_printed_once_in_its_chain() {
        let sled = Error::from(SledError::Sled(::sled::Error::Unsupported(
            "the reason".into(),
        )));
        let sled_io = Error::from(SledError::Io(std::io::Error::other("the reason")));
        let io = Error::backend(std::io::Error::other("the reason"));
        for error in [sled, sled_io, io] {
            let shown = format!("{:#}", anyhow::Error::from(error));
            assert_eq!(shown.matches("the reason").count(), 1, "{shown}");
        }
        // A backend error with a source of its own keeps it in the chain, once.
        #[derive(Debug, thiserror::Error)]
        #[error("connection lost")]
        struct Lost(#[source] std::io::Error);
        let lost = Error::backend(Lost(std::io::Error::other("the reason")));
        assert_eq!(
            format!("{:#}", anyhow::Error::from(lost)),
            "connection lost: the reason"
        );
    }

    #[test]
    fn a_full_disk_is_named_and_retryable_and_other_errors_are_not() {
        let full = Error::StorageFull {
            path: Some(PathBuf::from("/srv/agent-store")),
            kind: std::io::ErrorKind::StorageFull,
        };
        assert_eq!(
            format!("{:#}", anyhow::Error::from(full)),
            "cannot write to store directory /srv/agent-store: no storage space; its commits \
             fail until space is freed, then succeed again"
        );
        let quota = Error::StorageFull {
            path: None,
            kind: std::io::ErrorKind::QuotaExceeded,
        };
        assert!(quota.is_retryable());
        assert_eq!(
            quota.to_string(),
            "cannot write to the temporary store: quota exceeded; its commits fail until space \
             is freed, then succeed again"
        );
        for error in [
            Error::Closed,
            Error::backend(std::io::Error::other("broken")),
            Error::from(SledError::Io(std::io::Error::other("broken"))),
            Error::from(SledError::Sled(::sled::Error::Unsupported("broken".into()))),
            Error::backend(InjectedFault {
                kind: CommitKind::Other,
            }),
        ] {
            assert!(!error.is_retryable(), "{error}");
        }
    }

    /// A backend's own error is in the message, and a caller finds it by its type.
    #[test]
    fn a_backend_error_keeps_its_text_and_its_type() {
        let error = Error::backend(InjectedFault {
            kind: CommitKind::ToolResults,
        });
        assert_eq!(
            error.to_string(),
            "injected fault: commit of kind ToolResults failed as if the process died"
        );
        assert_eq!(
            error.downcast_ref::<InjectedFault>(),
            Some(&InjectedFault {
                kind: CommitKind::ToolResults
            })
        );
        assert!(error.downcast_ref::<SledError>().is_none());
        assert!(Error::Closed.downcast_ref::<InjectedFault>().is_none());
        assert_eq!(Error::backend("no route").to_string(), "no route");
    }
}
