//! A submit on the node that owns its tree: checked, and handed to the session that waits on
//! the call (found by the router), or to the remote child's tree that has it.

use tokio::sync::oneshot;

use super::Runtime;
use crate::engine::actor::SessionMsg;
use crate::engine::router;
use crate::error::Error;
use crate::remote::Owner;
use crate::session::submit::{Checked, Submit, SubmitOutcome};
use crate::types::ids::SessionId;

impl Runtime {
    /// [`Runtime::submit_tool_result`] on this node.
    pub(super) async fn submit_here(&self, submit: Submit) -> Result<SubmitOutcome, Error> {
        self.ensure_open()?;
        let limits = self.limits();
        let Checked {
            root,
            tool_call_id,
            submission,
            via_root,
            owner: named,
        } = match submit.check(limits) {
            Ok(checked) => checked,
            Err(outcome) => return Ok(outcome),
        };
        let hint = router::Hint::of(&submission, named.as_deref());
        let shared = &self.inner.shared;
        let via = via_root.as_ref();
        let owners = match router::owners(shared, &root, &tool_call_id, hint, via).await? {
            Ok(owners) => owners,
            Err(outcome) => return Ok(outcome),
        };
        // Offered in the router's order while an owner says it has its answer already (see
        // `router.rs`); one owner is the usual case, and the answer is then not copied.
        let last = owners.len().saturating_sub(1);
        let mut outcome = SubmitOutcome::AlreadyCompleted;
        let mut submission = Some(submission);
        for (index, owner) in owners.into_iter().enumerate() {
            let offered = if index == last {
                submission.take()
            } else {
                submission.clone()
            };
            let Some(offered) = offered else {
                break;
            };
            outcome = self
                .submit_to(owner, &root, &tool_call_id, offered, named.as_deref())
                .await?;
            if outcome != SubmitOutcome::AlreadyCompleted {
                break;
            }
        }
        Ok(outcome)
    }

    /// Hands a submit to one owner of its call: a session here, or a remote child's tree.
    async fn submit_to(
        &self,
        owner: Owner,
        root: &SessionId,
        tool_call_id: &str,
        submission: crate::session::Submission,
        named: Option<&str>,
    ) -> Result<SubmitOutcome, Error> {
        let owner = match owner {
            Owner::Local(owner) => owner,
            Owner::Remote(owner) => {
                // The remote chooses among its own sessions by the name only if it is one of
                // them (a submitter may name the remote child by its id here).
                let named = named
                    .filter(|name| *name == owner.call.owner)
                    .map(str::to_string);
                return crate::remote::forward(
                    &self.inner.shared,
                    &self.inner.host,
                    root,
                    *owner,
                    submission,
                    named,
                )
                .await;
            }
        };
        let (reply, answer) = oneshot::channel();
        self.inner.host.send(
            owner.clone(),
            SessionMsg::Submit {
                root: root.clone(),
                tool_call_id: tool_call_id.to_string(),
                submission,
                reply,
            },
        );
        answer.await.map_err(|_| self.lost_reply(&owner))?
    }
}
