//! Drives one remote child for its parent: starts (or resumes) it, follows its stream until
//! its run settles, and says where it stands, as a local child's report would. It runs as a
//! task beside the parent's actor, which it never blocks; the parent's core decides what the
//! report means, exactly as for a local child.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};

use super::{RemoteAgents, RemoteCall, RemoteChild, RemoteError, RemoteStart, RemoteStatus};
use crate::engine::shared::Shared;
use crate::session::{report_of, ChildReport, RunOutcome, Status};
use crate::types::ids::SessionId;
use crate::types::message::ToolOutcome;
use crate::types::panic::panic_text;
use crate::types::stream::Chunk;
use crate::types::tool_error::ToolErrorCode;

/// What the driver does before it follows the child.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Drive {
    /// Create the child with its first message, as the child of `parent` (or find it, after
    /// a crash).
    Start {
        message: String,
        parent: super::RemoteParent,
    },
    /// Resume it: the parent's resume cascades down.
    Wake,
    /// Follow it to where it stands, for a parent that waits for that (it could not reach
    /// the child before: a step or a resume waits on it).
    Follow,
    /// Only learn where it stands (an answer was accepted there, a deadline passed there, or
    /// recovery re-attaches): nobody waits for this report.
    Watch,
}

/// What a driver found.
#[derive(Debug)]
pub(crate) enum Driven {
    /// Where the child stands.
    Report(DriveReport),
    /// The remote did not answer (after the policy's tries): for the parent to try again
    /// later, until its patience runs out.
    Unreachable(RemoteError),
    /// A watch that learned nothing.
    Nothing,
}

/// Where the remote child stands, for its parent's core.
#[derive(Debug)]
pub(crate) struct DriveReport {
    pub(crate) report: ChildReport,
    /// Its chunks from the parent's `forwarded` on, to copy into the parent's stream.
    pub(crate) chunks: Vec<Chunk>,
    /// The calls its tree lists (for a suspended child): waiting, answered or expired.
    pub(crate) calls: Vec<RemoteCall>,
    /// How far the child's stream went when its status was read: a report older than what
    /// the parent already copied is stale (two drivers of one child may report out of
    /// order), and is dropped. `u64::MAX` for a failure, which always counts.
    pub(crate) as_of: u64,
    /// From a watch (nobody asked the child to go on): it must not stand for the answer to a
    /// start or a wake the parent waits for, whose own driver reports.
    pub(crate) watch: bool,
}

/// Drives the remote child `child` of a parent's call; never fails. A start that the remote
/// never answers is the call's tool error `remote_subagent_failed`; a child the remote no
/// longer knows, `remote_subagent_lost`; a remote that does not answer later, or answers
/// with another failure, is [`Driven::Unreachable`], for the parent to try again (and, past
/// its patience, to write the child off and stop it there). A watch that could not learn
/// anything is [`Driven::Nothing`]. A driver that panics (a transport's bug) counts as a remote
/// that did not answer: its parent is told, rather than left waiting on the driver for good.
pub(crate) async fn drive(
    shared: Arc<Shared>,
    child: SessionId,
    remote: RemoteChild,
    forwarded: u64,
    how: Drive,
) -> Driven {
    let (endpoint, starting) = (remote.endpoint.clone(), matches!(how, Drive::Start { .. }));
    let driven = AssertUnwindSafe(drive_unguarded(
        shared,
        child.clone(),
        remote,
        forwarded,
        how,
    ))
    .catch_unwind()
    .await;
    driven.unwrap_or_else(|panic| {
        let error = RemoteError::Unreachable {
            endpoint,
            reason: format!("its driver panicked: {}", panic_text(panic.as_ref())),
        };
        if starting {
            Driven::Report(failed(ToolErrorCode::RemoteSubAgentFailed, &error))
        } else {
            unreachable(&child, error)
        }
    })
}

async fn drive_unguarded(
    shared: Arc<Shared>,
    child: SessionId,
    remote: RemoteChild,
    forwarded: u64,
    how: Drive,
) -> Driven {
    let Some(transport) = shared.remote.clone() else {
        return Driven::Report(failed(
            ToolErrorCode::RemoteSubAgentFailed,
            &RemoteError::NoTransport,
        ));
    };
    let driver = Driver {
        shared: &shared,
        transport: transport.as_ref(),
        endpoint: &remote.endpoint,
        child: &child,
    };
    match &how {
        Drive::Start { message, parent } => {
            let started = driver
                .retrying(|| {
                    transport.start(&remote.endpoint, &remote.agent, &child, message, parent)
                })
                .await;
            match started {
                Ok(RemoteStart::Started) => {
                    tracing::info!(%child, endpoint = %remote.endpoint, "remote_subagent.started");
                }
                Ok(RemoteStart::Existed) => {
                    tracing::info!(%child, endpoint = %remote.endpoint, "remote_subagent.reattached");
                }
                Err(error) => {
                    return Driven::Report(failed(ToolErrorCode::RemoteSubAgentFailed, &error))
                }
            }
        }
        Drive::Wake => {
            let resumed = driver
                .retrying(|| transport.resume(&remote.endpoint, &child))
                .await;
            if matches!(resumed, Ok(()) | Err(RemoteError::Refused { .. })) {
                // Its parent wants it going again: a stop recorded for it earlier (an
                // interrupt that could not reach it) is stale.
                crate::remote::forget_orphan_if_recorded(&shared, &child).await;
            }
            match resumed {
                Ok(()) => {}
                Err(error) if error.is_not_found() => {
                    return Driven::Report(failed(ToolErrorCode::RemoteSubAgentLost, &error))
                }
                Err(error) if error.is_retryable() => return unreachable(&child, error),
                // Nothing to resume (it completed, or still waits): its status says which.
                Err(RemoteError::Refused { .. }) => {}
                Err(RemoteError::NoTransport) => {
                    return Driven::Report(failed(
                        ToolErrorCode::RemoteSubAgentLost,
                        &RemoteError::NoTransport,
                    ))
                }
                // An answer this side cannot read: as for its status below.
                Err(error) => return unreachable(&child, error),
            }
        }
        Drive::Follow | Drive::Watch => {}
    }
    let watch = how == Drive::Watch;
    match driver.follow(forwarded).await {
        Ok((status, chunks)) => {
            let as_of = status.chunk_count;
            let (report, calls) = report_of_status(&child, status);
            Driven::Report(DriveReport {
                report,
                chunks,
                calls,
                as_of,
                watch,
            })
        }
        // A watch only informs: a child never started (the parent crashed before its start:
        // the replayed call starts it), or a remote out of reach for now, is left for the
        // next resume to wake (or the next look), which learns where the child stands.
        Err(error) if watch => {
            tracing::info!(%child, endpoint = %remote.endpoint, error = %crate::types::Untrusted(&error), "remote_subagent.watch_failed");
            Driven::Nothing
        }
        // A child the remote no longer knows is lost; nothing is left there to stop.
        Err(error) if error.is_not_found() => {
            Driven::Report(failed(ToolErrorCode::RemoteSubAgentLost, &error))
        }
        Err(RemoteError::NoTransport) => Driven::Report(failed(
            ToolErrorCode::RemoteSubAgentLost,
            &RemoteError::NoTransport,
        )),
        // Any other failure (a 500, a refusal of this node's credentials, a status this side
        // cannot read, as from a newer remote) is tried again, as a remote that does not
        // answer is, until the runtime's patience runs out: then the child is written off
        // and recorded to be stopped there. Written off at once, it was left running on the
        // remote, its model calls and effects going on for nobody.
        Err(error) => unreachable(&child, error),
    }
}

fn unreachable(child: &SessionId, error: RemoteError) -> Driven {
    tracing::warn!(%child, error = %crate::types::Untrusted(&error), "remote_subagent.unreachable");
    Driven::Unreachable(error)
}

/// Interrupts (or aborts) a remote child, retrying a remote that does not answer.
pub(crate) async fn stop_remote(
    shared: &Shared,
    child: &SessionId,
    remote: &RemoteChild,
    abort: bool,
) -> Result<(), RemoteError> {
    let transport = shared.remote.clone().ok_or(RemoteError::NoTransport)?;
    let driver = Driver {
        shared,
        transport: transport.as_ref(),
        endpoint: &remote.endpoint,
        child,
    };
    match driver
        .retrying(|| transport.stop(&remote.endpoint, child, abort))
        .await
    {
        // Never started there (its start failed): nothing to stop.
        Err(error) if error.is_not_found() => Ok(()),
        other => other,
    }
}

struct Driver<'a> {
    shared: &'a Shared,
    transport: &'a dyn RemoteAgents,
    endpoint: &'a str,
    child: &'a SessionId,
}

impl Driver<'_> {
    /// Runs `call` until it succeeds, fails for good, or the policy's tries are spent.
    async fn retrying<T, F, Fut>(&self, mut call: F) -> Result<T, RemoteError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, RemoteError>>,
    {
        let policy = self.shared.remote_policy;
        let mut wait = policy.backoff;
        let mut tries = 0;
        loop {
            tries += 1;
            match call().await {
                Err(error) if error.is_retryable() && tries < policy.attempts => {
                    tracing::warn!(child = %self.child, endpoint = self.endpoint, error = %crate::types::Untrusted(&error), tries, "remote_subagent.retrying");
                    tokio::time::sleep(wait).await;
                    wait = wait.saturating_mul(2);
                }
                other => return other,
            }
        }
    }

    /// Follows the child until no run of it is in progress: its status then, and its chunks
    /// from `from` up to that status.
    async fn follow(&self, from: u64) -> Result<(RemoteStatus, Vec<Chunk>), RemoteError> {
        let mut chunks: Vec<Chunk> = Vec::new();
        let mut next = from;
        loop {
            let mut status = self
                .retrying(|| self.transport.status(self.endpoint, self.child, next))
                .await?;
            // The chunks the status carries (read after it): no stream needed for those.
            for chunk in std::mem::take(&mut status.chunks) {
                if chunk.seq >= next {
                    // Saturating: a remote's numbers are not trusted to stay short of the end.
                    next = chunk.seq.saturating_add(1);
                    chunks.push(chunk);
                }
            }
            let running = status.status == Status::Running;
            if !running && !status.settled {
                // Still waking its own children: ask again (the status waits a while itself).
                continue;
            }
            if !running && next >= status.chunk_count {
                return Ok((status, chunks));
            }
            let stream = self
                .retrying(|| self.transport.chunks(self.endpoint, self.child, next))
                .await?;
            let before = next;
            let settled_run = status.run_id.filter(|_| running);
            let end = status.chunk_count;
            let mut stream = std::pin::pin!(stream);
            while let Some(chunk) = stream.next().await {
                let chunk = match chunk {
                    Ok(chunk) => chunk,
                    // A stream that broke, or ended on an error of its own, says nothing of
                    // the child: its status, read again, does.
                    Err(error) => {
                        tracing::debug!(child = %self.child, error = %crate::types::Untrusted(&error), "remote_subagent.stream_broke");
                        break;
                    }
                };
                if chunk.seq < next {
                    continue;
                }
                next = chunk.seq.saturating_add(1);
                let settles = chunk.kind.settles_run();
                let run = chunk.run_id;
                chunks.push(chunk);
                match settled_run {
                    Some(current) if settles && run == current => break,
                    Some(_) => {}
                    None if next >= end => break,
                    None => {}
                }
            }
            if next == before {
                // The stream ended with nothing new (the remote closed an idle one, or it
                // broke): its status is read again, after a wait. A child that stays quiet
                // is not lost while its status answers: a long tool, or a sub-agent of its own
                // whose chunks come only when it reports, keeps it quiet for as long as it runs.
                tokio::time::sleep(self.shared.remote_policy.backoff).await;
            }
        }
    }
}

/// What a remote child's status means to its parent, by the rules of a local child's report.
/// The calls are every call the remote listed (those still waiting are routed at the root;
/// the others tell the parent when to look at the child again).
fn report_of_status(child: &SessionId, status: RemoteStatus) -> (ChildReport, Vec<RemoteCall>) {
    let calls = status.pending;
    let outcome = RunOutcome {
        session_id: child.clone(),
        run_id: status.run_id.unwrap_or(crate::types::ids::RunId::NONE),
        turn: 0,
        status: status.status,
        text: status.text,
        output: status.output,
        error: status.error,
        pending: calls
            .iter()
            .filter(|call| call.waiting)
            .map(|call| call.tool_call_id.clone())
            .collect(),
    };
    let report = match report_of(&outcome, status.aborted) {
        // A remote child that ended failed is the remote kind of failure.
        Some(ChildReport::Finished(ToolOutcome::Error(text))) => {
            ChildReport::Finished(ToolOutcome::Error(remote_failure(text)))
        }
        Some(report) => report,
        None => ChildReport::Crashed,
    };
    (report, calls)
}

/// `sub_agent_failed: …` as `remote_subagent_failed: …` (any other text as it is).
fn remote_failure(text: String) -> String {
    match text.strip_prefix(ToolErrorCode::SubAgentFailed.as_str()) {
        Some(rest) => format!("{}{rest}", ToolErrorCode::RemoteSubAgentFailed.as_str()),
        None => text,
    }
}

fn failed(code: ToolErrorCode, error: &RemoteError) -> DriveReport {
    tracing::warn!(code = code.as_str(), error = %crate::types::Untrusted(&error), "remote_subagent.failed");
    DriveReport {
        report: ChildReport::Finished(ToolOutcome::from(code.with(error))),
        chunks: Vec::new(),
        calls: Vec::new(),
        as_of: u64::MAX,
        watch: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{ErrorCode, RunError};

    fn status(status: Status, error: Option<RunError>) -> RemoteStatus {
        RemoteStatus {
            status,
            run_id: None,
            aborted: false,
            chunk_count: 3,
            text: Some("done".into()),
            output: None,
            error,
            pending: Vec::new(),
            settled: true,
            chunks: Vec::new(),
        }
    }

    #[test]
    fn a_remote_child_reports_as_a_local_one_with_remote_failure_codes() -> Result<(), String> {
        let child: SessionId = "p-sub-d1".parse().map_err(|error| format!("{error}"))?;
        let (report, _) = report_of_status(&child, status(Status::Completed, None));
        assert_eq!(
            report,
            ChildReport::Finished(ToolOutcome::Result("done".into()))
        );
        let failure = RunError {
            code: ErrorCode::ModelError,
            message: "boom".into(),
        };
        let (report, _) = report_of_status(&child, status(Status::Failed, Some(failure)));
        let ChildReport::Finished(ToolOutcome::Error(text)) = report else {
            return Err(format!("{report:?}"));
        };
        assert_eq!(
            ToolErrorCode::of(&text),
            Some(ToolErrorCode::RemoteSubAgentFailed),
            "{text}"
        );
        assert!(text.contains("model_error: boom"), "{text}");
        Ok(())
    }
}
