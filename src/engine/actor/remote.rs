//! The session actor's side of remote sub-agents: each start, wake or watch of a remote child
//! runs as a driver task beside the actor (`remote/driver.rs`), whose report comes back as a
//! message and is fed to the core like a local child's. The core decides which children are
//! remote and hands over all a driver needs ([`RemoteDrive`]); the actor never waits on a
//! remote.

use std::sync::Arc;

use dormant_actors::ActorContext;

use super::outside::Ticket;
use super::{SessionActor, SessionMsg, SessionState};
use crate::remote::{drive, stop_remote, Drive, Driven, RemoteChild};
use crate::session::{Input, RemoteDrive};
use crate::types::ids::SessionId;

impl SessionActor {
    /// Runs a drive of a remote child as a task beside the actor; its report comes back as a
    /// message.
    pub(super) fn drive_remote(
        &self,
        ctx: &ActorContext<Self>,
        state: &mut SessionState,
        remote: RemoteDrive,
    ) {
        let Some(host) = ctx.host() else {
            return;
        };
        let watch = remote.how == Drive::Watch;
        if watch {
            // A watch of this child in flight: this one runs after it reports (a child that
            // works a while, as an A2A agent may, keeps one watch, not one per look).
            if let Some(next) = state.remote_watches.get_mut(&remote.call) {
                *next = Some(remote);
                return;
            }
            state.remote_watches.insert(remote.call.clone(), None);
        }
        let shared = Arc::clone(&self.shared);
        let parent = ctx.key().clone();
        // Work in progress until it reports: the session is not settled meanwhile (a caller
        // waiting for the tree to settle waits for the remote too), nor evicted.
        let ticket = state.outside.start();
        tokio::spawn(async move {
            let RemoteDrive {
                call,
                child,
                remote,
                forwarded,
                how,
            } = remote;
            let driven = drive(shared, child, remote, forwarded, how).await;
            host.send(
                parent,
                SessionMsg::RemoteReport {
                    tool_call_id: call,
                    driven,
                    watch,
                    ticket,
                },
            );
        });
    }

    /// Stops remote children in the background (a parent stopping the children its run no
    /// longer waits for; a caller walking the tree stops them itself and waits).
    ///
    /// Each stop is work in progress until its remote answered (or it was recorded as an
    /// orphan, to be stopped once it does), as a driver is: a caller told the session settled
    /// finds the child stopped, not still waiting on its server.
    pub(super) fn stop_remotes(
        &self,
        ctx: &ActorContext<Self>,
        state: &mut SessionState,
        remotes: Vec<(SessionId, RemoteChild)>,
        abort: bool,
    ) {
        // Without its host (the runtime is going away) the stops still run; nobody is told.
        let host = ctx.host();
        for (child, remote) in remotes {
            let shared = Arc::clone(&self.shared);
            let told = host.clone().map(|host| StopDone {
                host,
                parent: ctx.key().clone(),
                ticket: Some(state.outside.start()),
            });
            tokio::spawn(async move {
                // Told when dropped: at the end, or if the transport panicked.
                let _told = told;
                match stop_remote(&shared, &child, &remote, abort).await {
                    Ok(()) => crate::remote::forget_orphan(&shared, &child).await,
                    Err(error) => {
                        tracing::warn!(%child, endpoint = %remote.endpoint, error = %crate::types::Untrusted(&error), "remote_subagent.stop_failed");
                        orphan(&shared, child, remote, abort).await;
                    }
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
}

/// Tells a session that one of its stops of a remote child is done, when dropped: the stop's
/// task ended, however it ended, so the session is never left at work for it.
struct StopDone {
    host: dormant_actors::Host<SessionActor>,
    parent: SessionId,
    /// Taken when dropped.
    ticket: Option<Ticket>,
}

impl Drop for StopDone {
    fn drop(&mut self) {
        let Some(ticket) = self.ticket.take() else {
            return;
        };
        // Nothing to feed the core: the stop is done.
        let stopped = SessionMsg::RemoteReport {
            tool_call_id: String::new(),
            driven: Driven::Nothing,
            watch: false,
            ticket,
        };
        self.host.send(self.parent.clone(), stopped);
    }
}

/// Records a remote child whose server did not answer its stop, to be stopped once it does.
pub(crate) async fn orphan(
    shared: &crate::engine::shared::Shared,
    child: SessionId,
    remote: RemoteChild,
    abort: bool,
) {
    let orphan = crate::remote::RemoteOrphan {
        child,
        endpoint: remote.endpoint,
        abort,
        since_ms: shared.clock.now_ms(),
        held_until_ms: None,
        refusals: 0,
    };
    if let Err(error) = crate::remote::record_orphan(shared, orphan).await {
        tracing::error!(%error, "remote_subagent.orphan_not_recorded");
    }
}
