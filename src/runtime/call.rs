//! The one way a call that acts on a session is served: [`Runtime::routed`] routes it by its
//! tree's lease (`route.rs`) and [`Runtime::call`] serves it there, here or on the owner
//! through the [`Peers`](crate::cluster::peer::Peers) transport. The owner serves a peer's call with
//! [`Runtime::serve_peer`]: the same call, with [`Route::Here`]. See [`crate::cluster::peer`].

use tokio::sync::oneshot;

use super::route::{self, Route};
use super::Runtime;
use crate::cluster::leases::LeaseOwner;
use crate::cluster::peer::{PeerAnswer, PeerCall, PeerEvent, PeerFailure, SubmitResumed};
use crate::engine::actor::{Reply, SessionMsg};
use crate::error::Error;
use crate::remote::RemoteError;
use crate::session::submit::{Limits, Submit, SubmitOutcome};
use crate::session::{RunOutcome, RunStarted};
use crate::types::ids::SessionId;

/// What a call answers, read from a [`PeerAnswer`].
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

impl FromPeer for SubmitResumed {
    fn from_peer(answer: PeerAnswer) -> Option<Self> {
        match answer {
            PeerAnswer::SubmittedAndResumed(resumed) => Some(resumed),
            _ => None,
        }
    }
}

impl FromPeer for () {
    fn from_peer(answer: PeerAnswer) -> Option<Self> {
        matches!(answer, PeerAnswer::Stopped).then_some(())
    }
}

impl FromPeer for bool {
    fn from_peer(answer: PeerAnswer) -> Option<Self> {
        match answer {
            PeerAnswer::Settled { settled } => Some(settled),
            _ => None,
        }
    }
}

impl Runtime {
    /// `call`, routed once by its tree's lease and served there. Served here and refused
    /// because another node took the tree meanwhile, or sent to an owner remembered from a
    /// moment ago that refused it or did not answer (nothing was done either way), it is
    /// routed once more, after a fresh look at the lease table.
    pub(super) async fn routed<T: FromPeer>(&self, call: PeerCall) -> Result<T, Error> {
        self.ensure_open()?;
        let shared = &self.inner.shared;
        // A submit naming no valid session is answered here, as any node would.
        let Some(session) = call.session() else {
            return self.call(call, Route::Here).await;
        };
        let first = route::route(shared, &session, false).await?;
        let may_again = match &first {
            Route::Here => route::may_route(shared),
            Route::Owner(owned) => owned.remembered,
        };
        // Kept to send again if the first route was wrong.
        let again = may_again.then(|| call.clone());
        let (error, here) = match (self.call(call, first.clone()).await, &first) {
            (Err(error), Route::Here) if route::owned_elsewhere(&error) => (error, true),
            (Err(error), Route::Owner(owned)) if route::refused_there(&error) => {
                shared.owners.forget(owned.root.as_str());
                (error, false)
            }
            (answer, _) => return answer.map_err(|error| route::unavailable(&session, error)),
        };
        let Some(call) = again else {
            return Err(route::unavailable(&session, error));
        };
        match route::route(shared, &session, true).await? {
            owner @ Route::Owner(_) => self.call(call, owner).await,
            // Refused here again, it would be refused the same way.
            Route::Here if here => Err(route::unavailable(&session, error)),
            Route::Here => self.call(call, Route::Here).await,
        }
    }

    /// Serves `call` where `route` says: here, or on the tree's owner.
    pub(super) async fn call<T: FromPeer>(&self, call: PeerCall, route: Route) -> Result<T, Error> {
        match route {
            Route::Here => {
                let answer = self.here(call).await?;
                expect(answer, "this node")
            }
            Route::Owner(owned) => match call.session() {
                Some(session) => self.send(&owned.owner, &session, call).await,
                // Routed by a session it names: never without one.
                None => expect(self.here(call).await?, "this node"),
            },
        }
    }

    /// Serves `call` on this node.
    pub(super) async fn here(&self, call: PeerCall) -> Result<PeerAnswer, Error> {
        self.ensure_open()?;
        match call {
            PeerCall::Execute {
                session,
                agent,
                message,
            } => {
                let agent = self.agent(&agent)?;
                self.ask(&session, |reply| SessionMsg::Execute {
                    agent,
                    message,
                    reply: Reply::Settled(reply),
                    new_only: false,
                    remote_parent: None,
                })
                .await
                .map(PeerAnswer::Ran)
            }
            PeerCall::Start {
                session,
                agent,
                message,
                new_only,
                remote_parent,
            } => {
                let agent = self.agent(&agent)?;
                self.ask(&session, |reply| SessionMsg::Execute {
                    agent,
                    message,
                    reply: Reply::Started(reply),
                    new_only,
                    remote_parent,
                })
                .await
                .map(PeerAnswer::Started)
            }
            PeerCall::Submit { submit } => {
                self.submit_here(submit).await.map(PeerAnswer::Submitted)
            }
            PeerCall::SubmitAndResume { submit } => {
                // On a task of its own: a caller that gives up once the answer is on its way
                // (a request's timeout, a client gone) must not leave it accepted and the
                // resume never asked for; the one who answered may have no other way to
                // move the run.
                let runtime = self.clone();
                tokio::spawn(async move { runtime.submit_then_resume(submit).await })
                    .await
                    .map_err(|_| Error::ShutDown)?
            }
            PeerCall::Resume {
                session,
                wait: true,
            } => {
                self.session(&session).await?;
                self.ask(&session, |reply| SessionMsg::Resume {
                    reply: Some(Reply::Settled(reply)),
                })
                .await
                .map(PeerAnswer::Ran)
            }
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
            PeerCall::WaitSettled { session, tree } => {
                if tree {
                    self.wait_tree_settled_here(&session).await;
                } else {
                    self.wait_settled_here(&session).await;
                }
                Ok(PeerAnswer::Settled { settled: true })
            }
            PeerCall::IsSettled { session } => {
                let settled = self.is_settled_here(&session).await;
                Ok(PeerAnswer::Settled { settled })
            }
        }
    }

    /// An answer, then the resume of its session once the answer is in: accepted now, or
    /// earlier (`already_completed`: a retry of a request whose resume may never have been
    /// asked for; a resume with nothing to do answers at once).
    async fn submit_then_resume(&self, submit: Submit) -> Result<PeerAnswer, Error> {
        let session = submit.session_id.parse::<SessionId>().ok();
        let outcome = self.submit_here(submit).await?;
        let answered = matches!(
            outcome,
            SubmitOutcome::Accepted | SubmitOutcome::AlreadyCompleted
        );
        let resumed = match session {
            Some(session) if answered => Some(
                self.start_resume_here(&session)
                    .await
                    .map_err(|error| PeerFailure::of(&error)),
            ),
            _ => None,
        };
        Ok(PeerAnswer::SubmittedAndResumed(SubmitResumed {
            outcome,
            resumed,
        }))
    }

    /// [`Runtime::start_resume`] on this node.
    async fn start_resume_here(&self, session: &SessionId) -> Result<RunStarted, Error> {
        self.session(session).await?;
        self.ask(session, |reply| SessionMsg::Resume {
            reply: Some(Reply::Started(reply)),
        })
        .await
    }

    /// Sends `call` for `session` to the node that owns its tree, and reads its answer as
    /// this call's.
    async fn send<T: FromPeer>(
        &self,
        owner: &LeaseOwner,
        session: &SessionId,
        call: PeerCall,
    ) -> Result<T, Error> {
        let (Some(peers), Some(endpoint)) = (self.inner.shared.peers.as_ref(), &owner.address)
        else {
            return Err(Error::SessionUnavailable {
                session: session.clone(),
                reason: format!(
                    "its tree is owned by node {}, which this node cannot reach",
                    owner.node
                ),
            });
        };
        // What the owner would refuse unread is refused here, so what is sent is always an
        // envelope it can read.
        if let PeerCall::Submit { submit } | PeerCall::SubmitAndResume { submit } = &call {
            if let Some(outcome) = submit.refusal(self.limits()) {
                let answer = match call {
                    PeerCall::SubmitAndResume { submit } => {
                        submit.discard();
                        PeerAnswer::SubmittedAndResumed(SubmitResumed {
                            outcome,
                            resumed: None,
                        })
                    }
                    other => {
                        if let PeerCall::Submit { submit } = other {
                            submit.discard();
                        }
                        PeerAnswer::Submitted(outcome)
                    }
                };
                return expect(answer, "this node");
            }
        }
        tracing::debug!(%session, node = %owner.node, %endpoint, "runtime.forwarded");
        match peers.call(owner, &call).await {
            Ok(PeerAnswer::Failed(failure)) => {
                Err(failure.into_error(session, call.agent(), endpoint))
            }
            Ok(answer) => expect(answer, endpoint),
            Err(RemoteError::Unreachable { reason, .. }) => Err(Error::OwnerUnreachable {
                session: session.clone(),
                node: owner.node.clone(),
                endpoint: endpoint.clone(),
                reason,
            }),
            Err(other) => Err(Error::Remote(other)),
        }
    }

    /// A peer's call is served only while this runtime is open, and only with this node's
    /// key.
    pub(super) fn admit_peer(&self, key: &str) -> Result<(), Error> {
        self.ensure_open()?;
        if !self.accepts_peer_key(key) {
            return Err(Error::PeerRefused);
        }
        Ok(())
    }

    /// What a submit is checked against.
    pub(super) fn limits(&self) -> Limits {
        Limits {
            max_json_depth: self.inner.shared.policy.max_json_depth,
            max_result_bytes: self.inner.max_result_bytes,
        }
    }

    // dormant-server's plumbing: its `POST /peer`, `/peer/follow` and `/peer/submit-follow`
    // routes answer other nodes with these. Public for that crate, hidden from a daemon
    // author's docs.
    #[doc(hidden)]
    /// Whether `key` is this node's [`PeerKey`](crate::cluster::PeerKey) (compared in constant
    /// time; a node alone on its store takes no calls from peers). A transport checks it
    /// before it reads a call, so that a caller without the key learns nothing of what it
    /// sent.
    pub fn accepts_peer_key(&self, key: &str) -> bool {
        self.inner
            .shared
            .leases
            .peer_key()
            .is_some_and(|ours| ours.matches(key))
    }

    // dormant-server's plumbing: its `POST /peer`, `/peer/follow` and `/peer/submit-follow`
    // routes answer other nodes with these. Public for that crate, hidden from a daemon
    // author's docs.
    #[doc(hidden)]
    /// Serves a call another node routed here because this one owns the session's tree
    /// ([`crate::cluster::peer`]): the call, served here and never further. A session this node does
    /// not own (any more) answers `session_unavailable`, which the caller returns as is.
    /// `key` is the caller's proof that it is a peer: this node's
    /// [`PeerKey`](crate::cluster::PeerKey).
    ///
    /// # Errors
    /// [`Error::PeerRefused`] for a key that is not this node's (or a node alone on its
    /// store: it takes no calls from peers), [`Error::ShutDown`]. Every other failure is the
    /// call's answer, [`PeerAnswer::Failed`].
    pub async fn serve_peer(&self, key: &str, call: PeerCall) -> Result<PeerAnswer, Error> {
        self.admit_peer(key)?;
        Ok(self
            .here(call)
            .await
            .unwrap_or_else(|error| PeerAnswer::Failed(PeerFailure::of(&error))))
    }

    // dormant-server's plumbing: its `POST /peer`, `/peer/follow` and `/peer/submit-follow`
    // routes answer other nodes with these. Public for that crate, hidden from a daemon
    // author's docs.
    #[doc(hidden)]
    /// Serves a peer's follow of `session` from `from` ([`Peers::follow`](crate::cluster::peer::Peers::follow)):
    /// [`Runtime::follow_live`] here, as [`PeerEvent`]s, never sent further. A session this
    /// node no longer runs is followed from the store, as any follower here would.
    ///
    /// # Errors
    /// As [`Runtime::serve_peer`].
    pub fn serve_peer_follow(
        &self,
        key: &str,
        session: &SessionId,
        from: u64,
    ) -> Result<impl futures::Stream<Item = PeerEvent> + Send + 'static, Error> {
        self.admit_peer(key)?;
        Ok(super::follow::serve_follow(
            std::sync::Arc::clone(&self.inner.shared),
            session.clone(),
            from,
        ))
    }

    #[doc(hidden)]
    /// [`Runtime::serve_peer_follow`] up to the session's next settle
    /// ([`Peers::follow_to_settle`](crate::cluster::peer::Peers::follow_to_settle)): once it
    /// settles here and every chunk before was sent, a last [`PeerEvent::Settled`] ends the
    /// stream. A settle this node cannot tell (the session's record did not read) ends it
    /// with no such event, and the follower waits for the settle by a call of its own.
    ///
    /// # Errors
    /// As [`Runtime::serve_peer`].
    pub fn serve_peer_follow_to_settle(
        &self,
        key: &str,
        session: &SessionId,
        from: u64,
    ) -> Result<impl futures::Stream<Item = PeerEvent> + Send + 'static, Error> {
        self.admit_peer(key)?;
        Ok(self.follow_to_settle_here(session, from))
    }

    /// The owner's side of a follow to the settle (its caller has checked the peer's key):
    /// the stream here as [`PeerEvent`]s, then [`PeerEvent::Settled`].
    pub(super) fn follow_to_settle_here(
        &self,
        session: &SessionId,
        from: u64,
    ) -> impl futures::Stream<Item = PeerEvent> + Send + 'static {
        let events = super::follow::serve_follow(
            std::sync::Arc::clone(&self.inner.shared),
            session.clone(),
            from,
        );
        let runtime = self.clone();
        let id = session.clone();
        // Here and never further, as every peer call is served: a node that no longer owns
        // the tree tells the settle it sees, and its follower goes on from the store.
        let settled = async move {
            runtime.wait_settled_here(&id).await;
            runtime.chunk_count(&id).await
        };
        super::follow::to_settle(events, from, settled)
    }

    /// Sends the session `id` the message `request` builds around a reply channel, and
    /// waits for the reply.
    pub(super) async fn ask<T>(
        &self,
        id: &SessionId,
        request: impl FnOnce(oneshot::Sender<Result<T, Error>>) -> SessionMsg,
    ) -> Result<T, Error> {
        let (reply, answer) = oneshot::channel();
        self.inner.host.send(id.clone(), request(reply));
        answer.await.map_err(|_| self.lost_reply(id))?
    }
}

/// The answer as what the call asked for; another kind is the owner's protocol error (a
/// local call always answers its own kind).
pub(super) fn expect<T: FromPeer>(answer: PeerAnswer, endpoint: &str) -> Result<T, Error> {
    T::from_peer(answer).ok_or_else(|| {
        Error::Remote(RemoteError::Protocol {
            endpoint: endpoint.to_string(),
            reason: "the owner answered another kind of call".to_string(),
        })
    })
}
