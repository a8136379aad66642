//! Interrupting or aborting a whole tree: the caller walks it, so the call returns only once
//! every session below has stopped.

use std::collections::{HashSet, VecDeque};

use super::Runtime;
use crate::engine::actor::SessionMsg;
use crate::error::Error;
use crate::types::ids::SessionId;

impl Runtime {
    /// Stops `root` and then, level by level, every child each stopped session asked to stop
    /// (whatever their depth, evicted or not: a message activates them). Each session answers
    /// once its stop is durable and hands back its own children, so when the walk ends no
    /// session of the tree is running and none of its calls is pending. The walk runs here,
    /// outside every actor, so no session ever waits on another.
    ///
    /// A session below the root whose stop fails does not end the walk: the others are
    /// stopped still, and the call fails with the first such error once they are.
    ///
    /// Then every session that still owns a call under `root` is stopped too (and the
    /// sessions below it): a root's stop forgets its children before they are stopped, so
    /// a walk cut short (a crash, a child's stop that failed) left them waiting, their calls
    /// open and unknown to their parent. Interrupting the root again finds them here.
    pub(super) async fn stop_tree(&self, root: &SessionId, abort: bool) -> Result<(), Error> {
        self.ensure_open()?;
        self.session(root).await?;
        let mut queue = VecDeque::from([(root.clone(), abort, None)]);
        let mut stopped = HashSet::new();
        let mut failed = None;
        loop {
            self.walk(root, &mut queue, &mut stopped, &mut failed)
                .await?;
            let store = self.inner.shared.store.as_ref();
            let left = crate::store::schema::sessions_under(store, root).await?;
            let orphans: Vec<_> = left
                .into_iter()
                .filter(|session| !stopped.contains(session))
                .collect();
            if orphans.is_empty() {
                break;
            }
            for orphan in orphans {
                tracing::warn!(%root, session = %orphan, "session.orphan_stopped");
                queue.push_back((orphan, abort, None));
            }
        }
        // Every session this side could stop is stopped; a remote that could not be told, or
        // a session whose stop failed, is the caller's to retry.
        failed.map_or(Ok(()), Err)
    }

    /// Stops every session in `queue` and the children each hands back, once each.
    async fn walk(
        &self,
        root: &SessionId,
        queue: &mut VecDeque<crate::engine::actor::StopTarget>,
        stopped: &mut HashSet<SessionId>,
        failed: &mut Option<Error>,
    ) -> Result<(), Error> {
        while let Some((id, abort, remote)) = queue.pop_front() {
            if !stopped.insert(id.clone()) {
                continue;
            }
            if let Some(remote) = remote {
                // The remote walks the child's own tree before it answers.
                let shared = &self.inner.shared;
                match crate::remote::stop_remote(shared, &id, &remote, abort).await {
                    Ok(()) => crate::remote::forget_orphan(shared, &id).await,
                    Err(error) => {
                        tracing::warn!(child = %id, endpoint = %remote.endpoint, error = %crate::types::Untrusted(&error), "remote_subagent.stop_failed");
                        // This side let it go: it is stopped there once the remote answers.
                        crate::engine::actor::orphan(shared, id.clone(), remote, abort).await;
                        failed.get_or_insert(Error::Remote(error));
                    }
                }
                continue;
            }
            let (reply, answer) = tokio::sync::oneshot::channel();
            self.inner.host.send(
                id.clone(),
                SessionMsg::Stop {
                    abort,
                    reply: Some(reply),
                },
            );
            let stopped = answer.await.unwrap_or_else(|_| Err(self.lost_reply(&id)));
            match stopped {
                Ok(children) => queue.extend(children),
                Err(error) if &id == root => return Err(error),
                // A child whose start never happened (it was refused): nothing to stop.
                Err(Error::UnknownSession(_)) => {}
                Err(error) => {
                    tracing::warn!(%root, session = %id, %error, "session.stop_failed");
                    failed.get_or_insert(error);
                }
            }
        }
        Ok(())
    }
}
