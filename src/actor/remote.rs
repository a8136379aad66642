//! The session actor's side of remote sub-agents: each start, wake or watch of a remote child
//! runs as a driver task beside the actor (`remote/driver.rs`), whose report comes back as a
//! message and is fed to the core like a local child's. The actor never waits on a remote.

use std::sync::Arc;

use dormant_actors::ActorContext;

use super::{Loaded, SessionActor, SessionMsg, SessionState};
use crate::ids::SessionId;
use crate::remote::{drive, stop_remote, Drive, Driven, RemoteChild};
use crate::session::Input;

impl SessionActor {
    /// Drives the remote child of call `call`, if the call's child is remote; `false` for a
    /// local child (the caller sends it the message instead).
    pub(super) fn drive_remote(
        &self,
        ctx: &ActorContext<Self>,
        state: &mut SessionState,
        call: &str,
        how: Drive,
    ) -> bool {
        let Loaded::Present(session) = &state.loaded else {
            return false;
        };
        let Some((child, remote, forwarded)) = session.remote_child(call) else {
            return false;
        };
        let Some(host) = ctx.host() else {
            return true;
        };
        let shared = Arc::clone(&self.shared);
        let parent = ctx.key().clone();
        let tool_call_id = call.to_string();
        // Work in progress until it reports: the session is not settled meanwhile (a caller
        // waiting for the tree to settle waits for the remote too), nor evicted.
        state.remote_drivers += 1;
        tokio::spawn(async move {
            let driven = drive(shared, child, remote, forwarded, how).await;
            host.send(
                parent,
                SessionMsg::RemoteReport {
                    tool_call_id,
                    driven,
                },
            );
        });
        true
    }

    /// The remote children among `children`, by id, with where they live.
    pub(super) fn remote_among(
        state: &SessionState,
        children: &[SessionId],
    ) -> Vec<(SessionId, RemoteChild)> {
        let Loaded::Present(session) = &state.loaded else {
            return Vec::new();
        };
        session.remote_children(children)
    }

    /// Stops remote children in the background (a parent stopping the children its run no
    /// longer waits for; a caller walking the tree stops them itself and waits).
    pub(super) fn stop_remotes(&self, remotes: Vec<(SessionId, RemoteChild)>, abort: bool) {
        for (child, remote) in remotes {
            let shared = Arc::clone(&self.shared);
            tokio::spawn(async move {
                if let Err(error) = stop_remote(&shared, &child, &remote, abort).await {
                    tracing::warn!(%child, endpoint = %remote.endpoint, error = %crate::Untrusted(&error), "remote_subagent.stop_failed");
                    orphan(&shared, child, remote, abort).await;
                }
            });
        }
    }

    /// A remote child's driver finished.
    pub(super) async fn remote_reported(
        &self,
        ctx: &ActorContext<Self>,
        state: &mut SessionState,
        tool_call_id: String,
        driven: Driven,
    ) {
        state.remote_drivers = state.remote_drivers.saturating_sub(1);
        let input = match driven {
            Driven::Report(report) => Some(Input::RemoteReported {
                tool_call_id,
                report: report.report,
                chunks: report.chunks,
                calls: report.calls,
                as_of: report.as_of,
                watch: report.watch,
            }),
            Driven::Unreachable(error) => Some(Input::RemoteUnreachable {
                tool_call_id,
                reason: error.to_string(),
            }),
            Driven::Nothing => None,
        };
        if let Some(input) = input {
            if matches!(self.present(ctx.key(), state).await, Ok(Some(_))) {
                self.feed(ctx, state, input).await;
            }
        }
        self.answer_settle_waiters_if_idle(state);
    }

    /// An answer for a call under the remote child of `tool_call_id` was accepted at the
    /// remote: learn where the child stands now (it may have gone on by itself).
    pub(super) async fn remote_answered(
        &self,
        ctx: &ActorContext<Self>,
        state: &mut SessionState,
        tool_call_id: String,
    ) {
        let unfinished = match self.present(ctx.key(), state).await {
            Ok(Some(session)) => session.children_entry_unfinished(&tool_call_id),
            Ok(None) | Err(_) => false,
        };
        if unfinished {
            self.drive_remote(ctx, state, &tool_call_id, Drive::Watch);
        }
    }
}

/// Records a remote child whose server did not answer its stop, to be stopped once it does.
pub(crate) async fn orphan(
    shared: &crate::shared::Shared,
    child: SessionId,
    remote: RemoteChild,
    abort: bool,
) {
    let orphan = crate::remote::RemoteOrphan {
        child,
        endpoint: remote.endpoint,
        abort,
        since_ms: shared.clock.now_ms(),
    };
    if let Err(error) = crate::remote::record_orphan(shared, orphan).await {
        tracing::error!(%error, "remote_subagent.orphan_not_recorded");
    }
}
