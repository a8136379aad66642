//! A store that forwards every call to another and lets a test see, hold up or fail each one
//! on the way: the one wrapper the tests build on, instead of a hand-written `Store` each.

use std::fmt;
use std::sync::Arc;

use super::{Batch, Entry, Error, Store, Tree};

/// A call of a [`Store`] on its way through a [`DelegatingStore`], as [`Delegate::before`]
/// sees it.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum Call<'a> {
    /// [`Store::commit`].
    Commit(&'a Batch),
    /// [`Store::get`].
    Get {
        /// The tree read.
        tree: Tree,
        /// The key.
        key: &'a [u8],
    },
    /// [`Store::scan_prefix`].
    ScanPrefix {
        /// The tree read.
        tree: Tree,
        /// The prefix.
        prefix: &'a [u8],
    },
    /// [`Store::scan_prefix_rev`].
    ScanPrefixRev {
        /// The tree read.
        tree: Tree,
        /// The prefix.
        prefix: &'a [u8],
        /// The most entries.
        limit: usize,
    },
    /// [`Store::scan_range`].
    ScanRange {
        /// The tree read.
        tree: Tree,
        /// The first key.
        from: &'a [u8],
        /// The key after the last.
        to: &'a [u8],
        /// The most entries.
        limit: usize,
    },
    /// [`Store::flush`].
    Flush,
    /// [`Store::close`].
    Close,
    /// [`Store::size_on_disk`].
    SizeOnDisk,
}

impl Call<'_> {
    /// The tree the call reads, if it is a read.
    pub fn tree(&self) -> Option<Tree> {
        match self {
            Call::Get { tree, .. }
            | Call::ScanPrefix { tree, .. }
            | Call::ScanPrefixRev { tree, .. }
            | Call::ScanRange { tree, .. } => Some(*tree),
            Call::Commit(_) | Call::Flush | Call::Close | Call::SizeOnDisk => None,
        }
    }
}

/// What a [`DelegatingStore`] does besides forwarding. Every method has a default that only
/// forwards, so a test writes the one it needs: count calls or hold them up in
/// [`Delegate::before`], fail them by returning an error there, or replace a commit.
#[async_trait::async_trait]
pub trait Delegate: Send + Sync + fmt::Debug + 'static {
    /// Runs before each async call reaches the inner store; an error is the call's answer and
    /// the inner store never sees it. The default lets every call through.
    ///
    /// # Errors
    /// The error the call answers instead.
    async fn before(&self, call: Call<'_>) -> Result<(), Error> {
        let _ = call;
        Ok(())
    }

    /// Commits `batch` to `inner`, after [`Delegate::before`] let it through. The default
    /// forwards it.
    ///
    /// # Errors
    /// The inner store's, or the one the delegate makes up.
    async fn commit(&self, inner: &dyn Store, batch: Batch) -> Result<(), Error> {
        inner.commit(batch).await
    }

    /// [`Store::release`] of the wrapper. The default releases `inner`.
    fn release(&self, inner: &Arc<dyn Store>) {
        inner.release();
    }

    /// [`Store::is_shared`] of the wrapper. The default is `inner`'s.
    fn is_shared(&self, inner: &dyn Store) -> bool {
        inner.is_shared()
    }
}

/// Lets every call through untouched.
#[derive(Clone, Copy, Debug, Default)]
pub struct Forward;

impl Delegate for Forward {}

/// A [`Store`] that forwards to an inner store through a [`Delegate`], which can count, delay
/// or fail each call. Test tooling: only with the `test-util` feature.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
/// use dormant::MemoryStore;
/// use dormant::store::{Batch, CommitKind, Error, Store, Tree};
/// use dormant::testkit::{Call, Delegate, DelegatingStore};
///
/// /// Counts the reads of the log tree.
/// #[derive(Debug, Default)]
/// struct LogReads(AtomicUsize);
///
/// #[async_trait::async_trait]
/// impl Delegate for LogReads {
///     async fn before(&self, call: Call<'_>) -> Result<(), Error> {
///         if call.tree() == Some(Tree::Log) {
///             self.0.fetch_add(1, Ordering::SeqCst);
///         }
///         Ok(())
///     }
/// }
///
/// # futures::executor::block_on(async {
/// let store = DelegatingStore::wrap(Arc::new(MemoryStore::new()), LogReads::default());
/// store.commit(Batch::new(CommitKind::Other)).await?;
/// store.scan_prefix(Tree::Log, b"s1").await?;
/// assert_eq!(store.delegate().0.load(Ordering::SeqCst), 1);
/// # Ok::<(), Error>(()) })?;
/// # Ok::<(), Error>(())
/// ```
pub struct DelegatingStore<D = Forward> {
    inner: Arc<dyn Store>,
    delegate: D,
}

impl<D: fmt::Debug> fmt::Debug for DelegatingStore<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DelegatingStore")
            .field("inner", &self.inner)
            .field("delegate", &self.delegate)
            .finish()
    }
}

impl<D: Delegate> DelegatingStore<D> {
    /// Wraps `inner`, with `delegate` around each call.
    pub fn wrap(inner: Arc<dyn Store>, delegate: D) -> Self {
        Self { inner, delegate }
    }

    /// The delegate (to read what it counted, or to change what it does next).
    pub fn delegate(&self) -> &D {
        &self.delegate
    }

    /// The store calls are forwarded to.
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }
}

#[async_trait::async_trait]
impl<D: Delegate> Store for DelegatingStore<D> {
    async fn commit(&self, batch: Batch) -> Result<(), Error> {
        self.delegate.before(Call::Commit(&batch)).await?;
        self.delegate.commit(self.inner.as_ref(), batch).await
    }

    async fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        self.delegate.before(Call::Get { tree, key }).await?;
        self.inner.get(tree, key).await
    }

    async fn scan_prefix(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<Entry>, Error> {
        self.delegate
            .before(Call::ScanPrefix { tree, prefix })
            .await?;
        self.inner.scan_prefix(tree, prefix).await
    }

    async fn scan_prefix_rev(
        &self,
        tree: Tree,
        prefix: &[u8],
        limit: usize,
    ) -> Result<Vec<Entry>, Error> {
        let call = Call::ScanPrefixRev {
            tree,
            prefix,
            limit,
        };
        self.delegate.before(call).await?;
        self.inner.scan_prefix_rev(tree, prefix, limit).await
    }

    async fn scan_range(
        &self,
        tree: Tree,
        from: &[u8],
        to: &[u8],
        limit: usize,
    ) -> Result<Vec<Entry>, Error> {
        let call = Call::ScanRange {
            tree,
            from,
            to,
            limit,
        };
        self.delegate.before(call).await?;
        self.inner.scan_range(tree, from, to, limit).await
    }

    async fn flush(&self) -> Result<(), Error> {
        self.delegate.before(Call::Flush).await?;
        self.inner.flush().await
    }

    async fn close(&self) -> Result<(), Error> {
        self.delegate.before(Call::Close).await?;
        self.inner.close().await
    }

    fn release(&self) {
        self.delegate.release(&self.inner);
    }

    fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    fn is_shared(&self) -> bool {
        self.delegate.is_shared(self.inner.as_ref())
    }

    async fn size_on_disk(&self) -> Result<u64, Error> {
        self.delegate.before(Call::SizeOnDisk).await?;
        self.inner.size_on_disk().await
    }

    fn degraded(&self) -> Option<String> {
        self.inner.degraded()
    }
}
