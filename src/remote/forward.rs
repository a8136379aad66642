//! A submit made at a local root for a call a remote child's tree owns: forwarded to the
//! remote's root, and its outcome returned as is. Nothing is stored on this side: the remote
//! makes the answer durable (`accepted` means it did), and the parent learns the rest from
//! the child's status, as it would from a local child's report.

use dormant_actors::Host;

use super::RemoteOwner;
use crate::engine::actor::{SessionActor, SessionMsg};
use crate::engine::shared::Shared;
use crate::error::Error;
use crate::session::submit::{Submit, SubmitAnswer, SubmitOutcome};
use crate::session::Submission;
use crate::types::ids::SessionId;

/// Forwards `submission` for the call `owner` describes to its remote (naming the session
/// there that made the call when the submitter did: `owner_session`), and tells the session
/// holding the remote child that an answer was accepted there, or had been (the remote may go
/// on by itself: the parent follows it).
pub(crate) async fn forward(
    shared: &Shared,
    host: &Host<SessionActor>,
    root: &SessionId,
    owner: RemoteOwner,
    submission: Submission,
    owner_session: Option<String>,
) -> Result<SubmitOutcome, Error> {
    let transport = shared
        .remote
        .clone()
        .ok_or(Error::Remote(super::RemoteError::NoTransport))?;
    let (submission, question) = submission.into_parts();
    let submit = Submit {
        session_id: owner.remote_root.to_string(),
        tool_call_id: owner.call.tool_call_id.clone(),
        question,
        answer: submit_answer(submission),
        // The remote child takes answers only through the root it was started under.
        via_root: Some(root.to_string()),
        owner_session_id: owner_session,
    };
    let outcome = transport
        .submit(&owner.endpoint, &submit)
        .await
        .map_err(|error| {
            tracing::warn!(endpoint = %owner.endpoint, remote_root = %owner.remote_root, tool_call_id = %crate::types::Untrusted(&submit.tool_call_id), error = %crate::types::Untrusted(&error), "remote_subagent.submit_failed");
            Error::Remote(error)
        })?;
    tracing::debug!(endpoint = %owner.endpoint, tool_call_id = %crate::types::Untrusted(&submit.tool_call_id), outcome = outcome.code(), "remote_subagent.submitted");
    // Accepted, or answered before (a person who saw the call still listed here after a
    // crash): either way the child may have gone on, and the watch tells.
    if matches!(
        outcome,
        SubmitOutcome::Accepted | SubmitOutcome::AlreadyCompleted
    ) {
        host.send(
            owner.via,
            SessionMsg::RemoteAnswered {
                tool_call_id: owner.parent_call,
            },
        );
    }
    Ok(outcome)
}

/// The answer a submit carries for `submission` (the question it names, if any, is carried
/// beside it).
fn submit_answer(submission: Submission) -> SubmitAnswer {
    match submission {
        Submission::Result(value) => SubmitAnswer::Result(value),
        Submission::Error(text) => SubmitAnswer::Error(text),
        Submission::Approval {
            approved,
            approval_id,
            reason,
            edited_input,
            binding,
        } => SubmitAnswer::Approval {
            approval_id,
            approved,
            reason,
            edited_input,
            binding,
        },
        Submission::Reconcile(reconciled) => SubmitAnswer::Reconcile(reconciled),
        Submission::Question { answer, .. } => submit_answer(*answer),
    }
}
