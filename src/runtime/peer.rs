//! The in-process API on a node that does not own the session: the call is sent to the owner
//! through the [`Peers`](crate::peer::Peers) transport, and the owner serves it here with
//! [`Runtime::serve_peer`]. See [`crate::peer`].

use super::Runtime;
use crate::error::Error;
use crate::ids::SessionId;
use crate::peer::{may_forward, owned_elsewhere, PeerAnswer, PeerCall, PeerFailure};
use crate::remote::RemoteError;
use crate::session::{RunOutcome, RunStarted};
use crate::submit::{Submit, SubmitOutcome};

/// What a call answers, read from the owner's [`PeerAnswer`].
pub(super) trait FromPeer: Sized {
    fn from_peer(answer: PeerAnswer) -> Option<Self>;
}

impl FromPeer for RunOutcome {
    fn from_peer(answer: PeerAnswer) -> Option<Self> {
        match answer {
            PeerAnswer::Ran(outcome) => Some(outcome),
            _ => None,
        }
    }
}

impl FromPeer for RunStarted {
    fn from_peer(answer: PeerAnswer) -> Option<Self> {
        match answer {
            PeerAnswer::Started(started) => Some(started),
            _ => None,
        }
    }
}

impl FromPeer for SubmitOutcome {
    fn from_peer(answer: PeerAnswer) -> Option<Self> {
        match answer {
            PeerAnswer::Submitted(outcome) => Some(outcome),
            _ => None,
        }
    }
}

impl FromPeer for () {
    fn from_peer(answer: PeerAnswer) -> Option<Self> {
        matches!(answer, PeerAnswer::Stopped).then_some(())
    }
}

impl Runtime {
    /// `here`, this node's answer; or, if it was refused because another live node owns
    /// `id`'s tree and a peer transport is configured, the owner's answer to `call`. `agent`:
    /// the agent the call names, to give an `agent_mismatch` back whole.
    pub(super) async fn or_owner<T: FromPeer>(
        &self,
        id: &SessionId,
        here: Result<T, Error>,
        agent: Option<&str>,
        call: impl FnOnce() -> PeerCall,
    ) -> Result<T, Error> {
        let error = match here {
            Ok(answer) => return Ok(answer),
            Err(error) => error,
        };
        let Some(peers) = self.inner.shared.peers.as_ref() else {
            return Err(error);
        };
        if !owned_elsewhere(&error) || !may_forward() {
            return Err(error);
        }
        let owner = match self.owner_of(id).await {
            Ok(Some(owner)) if owner.address.is_some() => owner,
            // Nobody else owns it (any more), or it cannot be reached: this node's answer
            // stands, and a retry is served here.
            _ => return Err(error),
        };
        let endpoint = owner.address.clone().unwrap_or_default();
        tracing::debug!(session = %id, node = %owner.node, %endpoint, "runtime.forwarded");
        match peers.call(&owner, &call()).await.map_err(Error::Remote)? {
            PeerAnswer::Failed(failure) => Err(failure.into_error(id, agent, &endpoint)),
            answer => T::from_peer(answer).ok_or_else(|| {
                Error::Remote(RemoteError::Protocol {
                    endpoint,
                    reason: "the owner answered another kind of call".to_string(),
                })
            }),
        }
    }

    /// Interrupts or aborts `id`'s tree where it is owned.
    pub(super) async fn stop(&self, id: &SessionId, abort: bool) -> Result<(), Error> {
        let here = self.stop_tree(id, abort).await;
        self.or_owner(id, here, None, || PeerCall::Stop {
            session: id.clone(),
            abort,
        })
        .await
    }

    /// Whether `key` is this node's [`PeerKey`](crate::peer::PeerKey) (compared in constant
    /// time; a store without one takes no calls from peers). A transport checks it before it
    /// reads a call, so that a caller without the key learns nothing of what it sent.
    pub fn accepts_peer_key(&self, key: &str) -> bool {
        self.store()
            .peer_key()
            .is_some_and(|ours| ours.matches(key))
    }

    /// Serves a call another node sent because this one owns the session's tree
    /// ([`crate::peer`]), here and never further: a session this node does not own (any
    /// more) answers `session_unavailable`, which the caller returns as is. `key` is the
    /// caller's proof that it is a peer: this node's [`PeerKey`](crate::peer::PeerKey).
    ///
    /// # Errors
    /// [`Error::PeerRefused`] for a key that is not this node's (or a store that has none:
    /// it takes no calls from peers), [`Error::ShutDown`]. Every other failure is the call's
    /// answer, [`PeerAnswer::Failed`].
    pub async fn serve_peer(&self, key: &str, call: PeerCall) -> Result<PeerAnswer, Error> {
        self.ensure_open()?;
        if !self.accepts_peer_key(key) {
            return Err(Error::PeerRefused);
        }
        let answer = match call {
            PeerCall::Execute {
                session,
                agent,
                message,
            } => self
                .execute_here(&session, &agent, message)
                .await
                .map(PeerAnswer::Ran),
            PeerCall::Start {
                session,
                agent,
                message,
                new_only,
                remote_parent,
            } => self
                .start_here(&session, &agent, message, new_only, remote_parent)
                .await
                .map(PeerAnswer::Started),
            PeerCall::Submit { envelope } => match Submit::from_json(&envelope) {
                Ok(submit) => self.submit_here(submit).await.map(PeerAnswer::Submitted),
                Err(reason) => Ok(PeerAnswer::Submitted(SubmitOutcome::InvalidRequest {
                    reason,
                })),
            },
            PeerCall::Resume {
                session,
                wait: true,
            } => self.resume_here(&session).await.map(PeerAnswer::Ran),
            PeerCall::Resume {
                session,
                wait: false,
            } => self
                .start_resume_here(&session)
                .await
                .map(PeerAnswer::Started),
            PeerCall::Stop { session, abort } => self
                .stop_tree(&session, abort)
                .await
                .map(|()| PeerAnswer::Stopped),
        };
        Ok(answer.unwrap_or_else(|error| PeerAnswer::Failed(PeerFailure::of(&error))))
    }
}
