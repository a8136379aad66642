//! An answer, the resume it allows and the stream of the run that resume starts, in one call
//! (dormant-server's `POST /submit-tool-result?resume=true&stream=true`). On a node that does
//! not own the session's tree it is one round trip to the owner
//! ([`Peers::submit_and_follow`](crate::cluster::peer::Peers::submit_and_follow)), where
//! [`Runtime::submit_and_resume`] and [`Runtime::follow_live_to_settle`] take two; here, or
//! through a transport (or to an owner) that cannot, it is those two.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use futures::stream::BoxStream;
use futures::StreamExt;
use tokio::sync::oneshot;

use super::call::expect;
use super::route::{self, Owned, Route};
use super::Runtime;
use crate::cluster::peer::{PeerCall, PeerEvent, PeerFailure, SubmitResumed};
use crate::error::Error;
use crate::remote::RemoteError;
use crate::session::submit::Submit;
use crate::session::RunStarted;
use crate::types::ids::SessionId;
use crate::types::stream::StreamEvent;

/// What [`Runtime::submit_resume_and_follow`] answers: the answer's outcome and its resume's,
/// and the resumed run's stream.
pub struct SubmitFollowed {
    /// As [`Runtime::submit_and_resume`] answers.
    pub answer: SubmitResumed,
    /// For a resume that started a run (or woke sub-agents): the session's stream from the
    /// resume's first chunk to its next settle. `None` when nothing runs: the answer was not
    /// accepted, the resume was refused, or it found calls still waiting.
    pub follow: Option<FollowToSettle>,
}

/// A session's stream up to its next settle, as [`Runtime::follow_live_to_settle`] gives it.
pub struct FollowToSettle {
    /// The chunks and deltas.
    pub events: BoxStream<'static, Result<StreamEvent, Error>>,
    /// The session's chunk count once settled (`None` if it cannot be read): every chunk
    /// below it was given before this is ready.
    pub settled: Pin<Box<dyn Future<Output = Option<u64>> + Send>>,
}

impl fmt::Debug for SubmitFollowed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubmitFollowed")
            .field("answer", &self.answer)
            .field("follow", &self.follow.is_some())
            .finish()
    }
}

impl fmt::Debug for FollowToSettle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FollowToSettle").finish_non_exhaustive()
    }
}

/// What the one call to the owner came to.
enum OnOwner {
    /// Answered there.
    Answered(SubmitFollowed),
    /// Not sent, or refused there before anything was done and worth a fresh route: the two
    /// calls make it, routed afresh.
    Routed(Submit),
}

impl Runtime {
    // dormant-server's plumbing, as `submit_and_resume` is.
    #[doc(hidden)]
    /// [`Runtime::submit_and_resume`] and, for a resume that started a run,
    /// [`Runtime::follow_live_to_settle`] from its first chunk: one call to the node that owns
    /// the session's tree when its transport can ([`crate::cluster::peer::Peers::submit_and_follow`]).
    ///
    /// # Errors
    /// As [`Runtime::submit_and_resume`].
    pub async fn submit_resume_and_follow(&self, submit: Submit) -> Result<SubmitFollowed, Error> {
        self.ensure_open()?;
        let submit = match self.submit_on_owner(submit).await? {
            OnOwner::Answered(followed) => return Ok(followed),
            OnOwner::Routed(submit) => submit,
        };
        let session = submit.session_id.parse::<SessionId>().ok();
        let answer = self.submit_and_resume(submit).await?;
        let follow = session.zip(run_started(&answer)).map(|(session, from)| {
            let (events, settled) = self.follow_live_to_settle(&session, from);
            FollowToSettle {
                events: events.boxed(),
                settled: Box::pin(settled),
            }
        });
        Ok(SubmitFollowed { answer, follow })
    }

    /// The one call, when another node owns the session's tree and the transport makes it.
    async fn submit_on_owner(&self, submit: Submit) -> Result<OnOwner, Error> {
        let shared = &self.inner.shared;
        let (Some(peers), Ok(session)) = (shared.peers.as_ref(), submit.session_id.parse()) else {
            return Ok(OnOwner::Routed(submit));
        };
        // A submit the owner would refuse unread is answered here, by the routed call.
        if submit.refusal(self.limits()).is_some() {
            return Ok(OnOwner::Routed(submit));
        }
        let Route::Owner(owned) = route::route(shared, &session, false).await? else {
            return Ok(OnOwner::Routed(submit));
        };
        let Some(endpoint) = owned.owner.address.clone() else {
            return Ok(OnOwner::Routed(submit));
        };
        tracing::debug!(%session, node = %owned.owner.node, %endpoint, "runtime.forwarded_with_follow");
        let answered = match peers.submit_and_follow(&owned.owner, &submit).await {
            Ok(None) => return Ok(OnOwner::Routed(submit)),
            Ok(Some(mut events)) => match events.next().await {
                Some(Ok(PeerEvent::SubmittedAndResumed(answer))) => Ok((answer, events)),
                Some(Ok(PeerEvent::Failed(failure))) => {
                    Err(failure.into_error(&session, None, &endpoint))
                }
                Some(Err(RemoteError::Unreachable { reason, .. })) => {
                    Err(self.owner_unreachable(&session, &owned, &endpoint, reason))
                }
                None => Err(self.owner_unreachable(
                    &session,
                    &owned,
                    &endpoint,
                    "the owner's stream ended before its answer".to_string(),
                )),
                Some(Ok(_)) => Err(Error::Remote(RemoteError::Protocol {
                    endpoint: endpoint.clone(),
                    reason: "the owner's stream did not begin with its answer".to_string(),
                })),
                Some(Err(other)) => Err(Error::Remote(other)),
            },
            Err(RemoteError::Unreachable { reason, .. }) => {
                Err(self.owner_unreachable(&session, &owned, &endpoint, reason))
            }
            Err(other) => Err(Error::Remote(other)),
        };
        let (answer, events) = match answered {
            Ok(answered) => answered,
            // Nothing was done there: the owner remembered from a moment ago may have
            // changed, so the routed calls look again (as `Runtime::routed` does).
            Err(error) if route::refused_there(&error) => {
                shared.owners.forget(owned.root.as_str());
                if !owned.remembered {
                    return Err(error);
                }
                return Ok(OnOwner::Routed(submit));
            }
            Err(error) => return Err(error),
        };
        drop(submit);
        let follow = run_started(&answer).map(|from| {
            let (tell, told) = oneshot::channel();
            let events = super::follow::follow_owner_to_settle(
                std::sync::Arc::clone(shared),
                session.clone(),
                events,
                endpoint,
                from,
                tell,
            );
            FollowToSettle {
                events: events.boxed(),
                settled: Box::pin(self.settle_told(&session, told)),
            }
        });
        Ok(OnOwner::Answered(SubmitFollowed { answer, follow }))
    }

    fn owner_unreachable(
        &self,
        session: &SessionId,
        owned: &Owned,
        endpoint: &str,
        reason: String,
    ) -> Error {
        Error::OwnerUnreachable {
            session: session.clone(),
            node: owned.owner.node.clone(),
            endpoint: endpoint.to_string(),
            reason,
        }
    }

    // dormant-server's plumbing: its `POST /peer/submit-follow` route answers other nodes with
    // it.
    #[doc(hidden)]
    /// Serves a peer's [`crate::cluster::peer::Peers::submit_and_follow`]: the answer and its
    /// resume here ([`PeerCall::SubmitAndResume`], as [`Runtime::serve_peer`] serves it), as a
    /// first event, then, for a resume that started a run,
    /// [`Runtime::serve_peer_follow_to_settle`] from its first chunk. A call that failed is
    /// one [`PeerEvent::Failed`].
    ///
    /// # Errors
    /// As [`Runtime::serve_peer`].
    pub fn serve_peer_submit_follow(
        &self,
        key: &str,
        submit: Submit,
    ) -> Result<impl futures::Stream<Item = PeerEvent> + Send + 'static, Error> {
        self.admit_peer(key)?;
        let runtime = self.clone();
        let session = submit.session_id.parse::<SessionId>().ok();
        let events = async move {
            let answered = runtime.here(PeerCall::SubmitAndResume { submit }).await;
            let answer = match answered.and_then(|answer| expect(answer, "this node")) {
                Ok(answer) => answer,
                Err(error) => return failed(&error),
            };
            let follow = session
                .zip(run_started(&answer))
                .map(|(session, from)| runtime.follow_to_settle_here(&session, from));
            futures::stream::once(async move { PeerEvent::SubmittedAndResumed(answer) })
                .chain(futures::stream::iter(follow).flatten())
                .boxed()
        };
        Ok(futures::stream::once(events).flatten())
    }
}

/// Where the run the answer's resume started begins, if it started one to follow.
fn run_started(answer: &SubmitResumed) -> Option<u64> {
    match &answer.resumed {
        Some(Ok(RunStarted {
            from_seq,
            settled: false,
            ..
        })) => Some(*from_seq),
        _ => None,
    }
}

/// A stream of one failure.
fn failed(error: &Error) -> BoxStream<'static, PeerEvent> {
    let failure = PeerFailure::of(error);
    futures::stream::once(async move { PeerEvent::Failed(failure) }).boxed()
}
