//! The `checkpoints`, `state_at` and `fork` ops: a session's checkpoints, the session at one,
//! and a fork of it (an addition to the format; docs/scenario-format.md).

use super::expect::Observed;
use super::format::{CheckpointSpec, LastSpec};
use crate::error::Error;
use crate::runtime::Runtime;
use crate::types::checkpoint::{CheckpointId, ForkOptions};
use crate::types::ids::SessionId;

/// The checkpoint `spec` names among `session`'s: its id, the last, or the last (or first)
/// that matches.
async fn resolve(
    runtime: &Runtime,
    session: &SessionId,
    spec: &CheckpointSpec,
) -> Result<CheckpointId, Error> {
    if let CheckpointSpec::Id(id) = spec {
        return Ok(CheckpointId(*id));
    }
    let checkpoints = runtime.checkpoints(session).await?;
    let matches = |checkpoint: &&crate::types::Checkpoint| match spec {
        CheckpointSpec::Id(_) | CheckpointSpec::Last(LastSpec::Last) => true,
        CheckpointSpec::Matching(wanted) => {
            wanted
                .status
                .is_none_or(|status| status == checkpoint.status)
                && wanted
                    .open_call
                    .as_ref()
                    .is_none_or(|call| checkpoint.open_calls.iter().any(|open| &open.id == call))
        }
    };
    let first = matches!(spec, CheckpointSpec::Matching(wanted) if wanted.first);
    let found = if first {
        checkpoints.iter().find(matches)
    } else {
        checkpoints.iter().rev().find(matches)
    };
    // No match: an id no checkpoint has, so that the op reports `unknown_checkpoint`.
    Ok(found.map_or(CheckpointId(u64::MAX), |checkpoint| checkpoint.id))
}

/// `checkpoints`.
pub(super) async fn list(runtime: &Runtime, session: &SessionId) -> Observed {
    Observed::Checkpoints(runtime.checkpoints(session).await.map_err(Error::from))
}

/// `state_at`.
pub(super) async fn state_at(
    runtime: &Runtime,
    session: &SessionId,
    spec: &CheckpointSpec,
) -> Observed {
    let past = match resolve(runtime, session, spec).await {
        Ok(checkpoint) => runtime
            .state_at(session, checkpoint)
            .await
            .map_err(Error::from),
        Err(error) => Err(error),
    };
    Observed::Past(past)
}

/// `fork`, with the options the step gave.
pub(super) async fn fork(
    runtime: &Runtime,
    source: &SessionId,
    spec: &CheckpointSpec,
    options: ForkOptions,
) -> Observed {
    let forked = match resolve(runtime, source, spec).await {
        Ok(checkpoint) => runtime.fork(source, checkpoint, options).await.map(drop),
        Err(error) => Err(error),
    };
    Observed::Done(forked)
}
