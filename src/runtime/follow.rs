//! Following a session's stream: stored chunks, then live ones, without gaps or repeats. A
//! session another node runs is followed where it runs, through the peers transport (its
//! live chunks and deltas are sent there); without one, or once the owner's stream ends (it
//! went away), from the store: read a quarter second after the last new chunk, then less and
//! less often while nothing comes, down to every 4 s.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tokio::sync::{broadcast, oneshot};

use futures::StreamExt;

use super::route::{self, Route};
use crate::cluster::peer::{PeerEvent, PeerEvents, PeerFailure};
use crate::engine::shared::Shared;
use crate::error::Error;
use crate::store::schema;
use crate::types::ids::SessionId;
use crate::types::stream::{Chunk, StreamEvent};

/// How many live chunks a slow follower may fall behind before it re-reads from the store.
/// Small on purpose: the channel allocates all of it up front, per followed session.
const LIVE_BUFFER: usize = 64;

/// How soon a follower of a session another node runs first reads its new chunks from the
/// store; it waits twice as long after each read that found none, up to
/// [`READ_ELSEWHERE_AT_MOST`], and again this soon after one that found some.
const READ_ELSEWHERE_FIRST: Duration = Duration::from_millis(250);

/// The longest a follower of a session another node runs waits between two reads.
const READ_ELSEWHERE_AT_MOST: Duration = Duration::from_secs(4);

struct Follower {
    shared: Arc<Shared>,
    session: SessionId,
    next: u64,
    buffered: VecDeque<Chunk>,
    /// Where the next page of stored chunks begins, while a history read a page at a time
    /// has more (a page is a few dozen commits': a long history is never held whole).
    stored: Option<schema::ChunkPage>,
    live: broadcast::Receiver<StreamEvent>,
    with_deltas: bool,
    started: bool,
    failed: bool,
    /// How long to wait for a live chunk before reading the store, when the session runs
    /// elsewhere.
    read_every: Duration,
}

pub(super) fn follow(
    shared: Arc<Shared>,
    session: SessionId,
    from: u64,
) -> impl Stream<Item = Result<Chunk, Error>> + Send + 'static {
    follow_routed(shared, session, from, false, None).filter_map(|event| async move {
        match event {
            Ok(StreamEvent::Chunk(chunk)) => Some(Ok(chunk)),
            Ok(StreamEvent::Delta(_)) => None,
            Err(error) => Some(Err(error)),
        }
    })
}

/// The session's stream where it runs: from the node that owns its tree, if another does and
/// its transport follows; else here. With `settled`, the owner is asked to end the stream at
/// the session's next settle, and the chunk count it then tells goes there; a follow that
/// learns none (here, or a transport that does not) drops it.
pub(super) fn follow_routed(
    shared: Arc<Shared>,
    session: SessionId,
    from: u64,
    with_deltas: bool,
    settled: Option<oneshot::Sender<u64>>,
) -> impl Stream<Item = Result<StreamEvent, Error>> + Send + 'static {
    futures::stream::once(async move {
        let owner = match route::route(&shared, &session, false).await {
            Ok(Route::Owner(owned)) => Some(owned.owner),
            // Here, or the route could not be read: the store says what there is.
            Ok(Route::Here) | Err(_) => None,
        };
        let events = match (owner, shared.peers.as_ref()) {
            (Some(owner), Some(peers)) => {
                match follow_owner(peers.as_ref(), &owner, &session, from, settled).await {
                    Ok(events) => events.map(|(events, settled)| {
                        (events, settled, owner.address.unwrap_or_default())
                    }),
                    Err(error) => {
                        tracing::debug!(%session, %error, "runtime.follow_owner_unreachable");
                        None
                    }
                }
            }
            _ => None,
        };
        match events {
            Some((events, settled, endpoint)) => {
                let owner = Owner {
                    events,
                    endpoint,
                    next: from,
                    with_deltas,
                    settled,
                };
                futures::future::Either::Left(from_owner(shared, session, owner))
            }
            None => {
                futures::future::Either::Right(follow_events(shared, session, from, with_deltas))
            }
        }
    })
    .flatten()
}

/// The owner's stream, to its next settle when `settled` asks it (the sender kept for the
/// count, when the transport does that), else open-ended.
async fn follow_owner(
    peers: &dyn crate::cluster::peer::Peers,
    owner: &crate::cluster::leases::LeaseOwner,
    session: &SessionId,
    from: u64,
    settled: Option<oneshot::Sender<u64>>,
) -> Result<Option<(PeerEvents, Option<oneshot::Sender<u64>>)>, crate::remote::RemoteError> {
    if settled.is_some() {
        if let Some(events) = peers.follow_to_settle(owner, session, from).await? {
            return Ok(Some((events, settled)));
        }
    }
    Ok(peers
        .follow(owner, session, from)
        .await?
        .map(|events| (events, None)))
}

/// `events`, the owner's stream of `session` from `from` to its next settle (whose chunk
/// count goes to `settled`), as [`follow_routed`] gives it: with its deltas, and followed here
/// from the store if the owner's stream ends first.
pub(super) fn follow_owner_to_settle(
    shared: Arc<Shared>,
    session: SessionId,
    events: PeerEvents,
    endpoint: String,
    from: u64,
    settled: oneshot::Sender<u64>,
) -> impl Stream<Item = Result<StreamEvent, Error>> + Send + 'static {
    let owner = Owner {
        events,
        endpoint,
        next: from,
        with_deltas: true,
        settled: Some(settled),
    };
    from_owner(shared, session, owner)
}

/// A stream followed on the node that runs the session.
struct Owner {
    events: PeerEvents,
    endpoint: String,
    /// The next chunk to give.
    next: u64,
    with_deltas: bool,
    /// Where the session's chunk count goes when the owner says it settled.
    settled: Option<oneshot::Sender<u64>>,
}

/// What a follower of the owner's stream does next.
enum FromOwner {
    /// Reads the owner's stream.
    Owner(Owner),
    /// The owner's stream ended (it went away): followed here from where it stopped.
    Here(std::pin::Pin<Box<dyn Stream<Item = Result<StreamEvent, Error>> + Send>>),
    /// The owner said its stream failed: nothing follows.
    Done,
    /// The owner said the session settled: nothing follows, and the stream stays open until
    /// its reader, told the count, ends it.
    Settled,
}

/// The owner's stream of `session`, then (if it ends before the follower does: the owner
/// went away or shut down) the stream here, from the next chunk on.
fn from_owner(
    shared: Arc<Shared>,
    session: SessionId,
    owner: Owner,
) -> impl Stream<Item = Result<StreamEvent, Error>> + Send + 'static {
    futures::stream::unfold(FromOwner::Owner(owner), move |mut state| {
        let (shared, session) = (Arc::clone(&shared), session.clone());
        async move {
            loop {
                match state {
                    FromOwner::Done => return None,
                    FromOwner::Settled => std::future::pending::<()>().await,
                    FromOwner::Here(mut here) => {
                        let next = here.next().await?;
                        return Some((next, FromOwner::Here(here)));
                    }
                    FromOwner::Owner(mut owner) => match owner.events.next().await {
                        Some(Ok(PeerEvent::Chunk(chunk))) => {
                            if chunk.seq < owner.next {
                                state = FromOwner::Owner(owner);
                                continue;
                            }
                            owner.next = chunk.seq + 1;
                            return Some((Ok(StreamEvent::Chunk(chunk)), FromOwner::Owner(owner)));
                        }
                        Some(Ok(PeerEvent::Delta(delta))) if owner.with_deltas => {
                            return Some((Ok(StreamEvent::Delta(delta)), FromOwner::Owner(owner)));
                        }
                        Some(Ok(PeerEvent::Failed(failure))) if failure.code != "shut_down" => {
                            let error = failure.into_error(&session, None, &owner.endpoint);
                            return Some((Err(error), FromOwner::Done));
                        }
                        // Settled there, every chunk before it given: nothing more comes.
                        // The stream stays open rather than end (an end says the follow
                        // broke off); its reader ends it with the count it was told.
                        Some(Ok(PeerEvent::Settled { chunks })) => {
                            if let Some(settled) = owner.settled.take() {
                                let _ = settled.send(chunks);
                            }
                            state = FromOwner::Settled;
                        }
                        // A delta nobody asked for: the next event.
                        Some(Ok(PeerEvent::Delta(_))) => state = FromOwner::Owner(owner),
                        // The owner went away, or shuts down: the store has the rest.
                        Some(Ok(_) | Err(_)) | None => {
                            tracing::debug!(%session, endpoint = %owner.endpoint, "runtime.follow_owner_ended");
                            let here = follow_events(
                                Arc::clone(&shared),
                                session.clone(),
                                owner.next,
                                owner.with_deltas,
                            );
                            state = FromOwner::Here(Box::pin(here));
                        }
                    },
                }
            }
        }
    })
}

/// The owner's side of a peer's follow: the stream here as [`PeerEvent`]s, ending after the
/// first failure (sent as [`PeerEvent::Failed`]).
pub(super) fn serve_follow(
    shared: Arc<Shared>,
    session: SessionId,
    from: u64,
) -> impl Stream<Item = PeerEvent> + Send + 'static {
    follow_events(shared, session, from, true).scan(false, |failed, event| {
        let event = match event {
            _ if *failed => None,
            Ok(StreamEvent::Chunk(chunk)) => Some(PeerEvent::Chunk(chunk)),
            Ok(StreamEvent::Delta(delta)) => Some(PeerEvent::Delta(delta)),
            Err(error) => {
                *failed = true;
                Some(PeerEvent::Failed(PeerFailure::of(&error)))
            }
        };
        futures::future::ready(event)
    })
}

/// `events` (a follow from `from`) until `settled` says how many chunks the session has once
/// settled and every one of them was given: then [`PeerEvent::Settled`], and the end. A
/// `settled` that cannot tell (`None`) ends the stream there, with no such event.
pub(super) fn to_settle(
    events: impl Stream<Item = PeerEvent> + Send + 'static,
    from: u64,
    settled: impl std::future::Future<Output = Option<u64>> + Send + 'static,
) -> impl Stream<Item = PeerEvent> + Send + 'static {
    let state = ToSettle {
        events: Box::pin(events),
        settled: Some(Box::pin(settled)),
        chunks: None,
        next: from,
        ended: false,
    };
    futures::stream::unfold(state, |mut state| async move {
        loop {
            if state.ended {
                return None;
            }
            if let Some(chunks) = state.chunks.filter(|chunks| state.next >= *chunks) {
                state.ended = true;
                return Some((PeerEvent::Settled { chunks }, state));
            }
            let event = match state.settled.as_mut() {
                Some(settled) => tokio::select! {
                    // The chunks first: the settle is told only after them.
                    biased;
                    event = state.events.next() => event,
                    chunks = settled => {
                        state.settled = None;
                        match chunks {
                            Some(chunks) => state.chunks = Some(chunks),
                            None => state.ended = true,
                        }
                        continue;
                    }
                },
                None => state.events.next().await,
            };
            match event {
                Some(PeerEvent::Chunk(chunk)) => {
                    state.next = state.next.max(chunk.seq + 1);
                    return Some((PeerEvent::Chunk(chunk), state));
                }
                Some(PeerEvent::Failed(failure)) => {
                    state.ended = true;
                    return Some((PeerEvent::Failed(failure), state));
                }
                Some(event) => return Some((event, state)),
                None => return None,
            }
        }
    })
}

/// [`to_settle`]'s state.
struct ToSettle {
    events: std::pin::Pin<Box<dyn Stream<Item = PeerEvent> + Send>>,
    settled: Option<std::pin::Pin<Box<dyn std::future::Future<Output = Option<u64>> + Send>>>,
    /// The session's chunk count once settled, when known.
    chunks: Option<u64>,
    /// The next chunk to give.
    next: u64,
    ended: bool,
}

/// The stored chunks from `from` on, then the live ones, with the live deltas of model calls
/// in between when `with_deltas`.
pub(super) fn follow_events(
    shared: Arc<Shared>,
    session: SessionId,
    from: u64,
    with_deltas: bool,
) -> impl Stream<Item = Result<StreamEvent, Error>> + Send + 'static {
    // Subscribe before reading the store: a chunk committed in between is then in both, and
    // the sequence numbers drop the copy.
    let live = shared
        .streams
        .entry(session.clone())
        .or_insert_with(|| broadcast::channel(LIVE_BUFFER).0)
        .subscribe();
    let follower = Follower {
        shared,
        session,
        next: from,
        buffered: VecDeque::new(),
        stored: None,
        live,
        with_deltas,
        started: false,
        failed: false,
        read_every: READ_ELSEWHERE_FIRST,
    };
    futures::stream::unfold(follower, |mut follower| async move {
        if follower.failed {
            return None;
        }
        if !follower.started {
            follower.started = true;
            if let Err(error) = follower.refill().await {
                follower.failed = true;
                return Some((Err(error), follower));
            }
        }
        loop {
            while let Some(chunk) = follower.buffered.pop_front() {
                if chunk.seq >= follower.next {
                    follower.next = chunk.seq + 1;
                    return Some((Ok(StreamEvent::Chunk(chunk)), follower));
                }
            }
            if follower.stored.is_some() {
                // The store's next page of a history read a page at a time.
                if let Err(error) = follower.refill().await {
                    follower.failed = true;
                    return Some((Err(error), follower));
                }
                continue;
            }
            let received = if follower.fed_elsewhere() {
                // The session runs on another node (a store several nodes share): its live
                // chunks are sent there, so read them from the store now and then.
                match tokio::time::timeout(follower.read_every, follower.live.recv()).await {
                    Ok(received) => received,
                    Err(_) => {
                        if let Err(error) = follower.refill().await {
                            follower.failed = true;
                            return Some((Err(error), follower));
                        }
                        follower.read_every = if follower.buffered.is_empty() {
                            (follower.read_every * 2).min(READ_ELSEWHERE_AT_MOST)
                        } else {
                            READ_ELSEWHERE_FIRST
                        };
                        continue;
                    }
                }
            } else {
                follower.live.recv().await
            };
            match received {
                // Deltas are live only, and shown in place: after the chunks committed before
                // the model call, before the step's own. A follower that is elsewhere (it read
                // the step's reply from the store already) drops them.
                Ok(StreamEvent::Delta(delta))
                    if follower.with_deltas && delta.after_seq == follower.next =>
                {
                    return Some((Ok(StreamEvent::Delta(delta)), follower));
                }
                Ok(StreamEvent::Delta(_)) => continue,
                Ok(StreamEvent::Chunk(chunk)) if chunk.seq < follower.next => continue,
                Ok(StreamEvent::Chunk(chunk)) if chunk.seq == follower.next => {
                    follower.next += 1;
                    return Some((Ok(StreamEvent::Chunk(chunk)), follower));
                }
                // A gap (chunks published before we subscribed) or a lag: the store has them.
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                    if let Err(error) = follower.refill().await {
                        follower.failed = true;
                        return Some((Err(error), follower));
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}

impl Drop for Follower {
    /// The last follower of a session takes its live channel with it, so a session that was
    /// followed once does not keep a buffer until shutdown.
    fn drop(&mut self) {
        self.shared
            .streams
            .remove_if(&self.session, |_, sender| sender.receiver_count() <= 1);
    }
}

impl Follower {
    /// Whether the session's live chunks are sent on another node: the store is shared and
    /// this node does not hold the session now (in memory, no round trip).
    fn fed_elsewhere(&self) -> bool {
        let leases = self.shared.leases.as_ref();
        leases.is_shared() && !leases.holds_current(self.session.as_str())
    }

    /// Reads the next page of stored chunks: where the last page stopped, or the page that
    /// holds the next chunk to send.
    async fn refill(&mut self) -> Result<(), Error> {
        let page = match self.stored.take() {
            Some(schema::ChunkPage::After { key, from }) => schema::ChunkPage::After {
                key,
                from: from.max(self.next),
            },
            _ => schema::ChunkPage::First(self.next),
        };
        let (stored, next) =
            schema::load_chunk_page(self.shared.store.as_ref(), &self.session, &page).await?;
        self.buffered.extend(stored);
        self.stored = next;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use futures::{FutureExt, StreamExt};
    use tokio::sync::{mpsc, oneshot};

    use super::to_settle;
    use crate::cluster::peer::{PeerEvent, PeerFailure};
    use crate::types::ids::RunId;
    use crate::types::stream::{Chunk, ChunkKind};

    fn chunk(seq: u64) -> PeerEvent {
        PeerEvent::Chunk(Chunk {
            seq,
            run_id: RunId::generate(),
            at_ms: seq,
            kind: ChunkKind::Text {
                text: format!("c{seq}"),
            },
        })
    }

    fn seqs(events: &[PeerEvent]) -> Vec<String> {
        events
            .iter()
            .map(|event| match event {
                PeerEvent::Chunk(chunk) => chunk.seq.to_string(),
                PeerEvent::Settled { chunks } => format!("settled {chunks}"),
                _ => "other".to_string(),
            })
            .collect()
    }

    /// A settle told before its last chunks arrived waits for them: the follower that reads
    /// `settled` has every chunk before it.
    #[tokio::test]
    async fn the_settle_comes_after_every_chunk_before_it() {
        let (chunks, events) = mpsc::unbounded_channel();
        let (tell, told) = oneshot::channel();
        let stream = to_settle(tokio_stream_of(events), 2, async move { told.await.ok() });
        let mut stream = std::pin::pin!(stream);
        let _ = chunks.send(chunk(2));
        let mut seen = vec![stream.next().await];
        let _ = tell.send(5);
        // Settled at 5, with chunks 3 and 4 still to come: nothing to give yet.
        assert!(stream.next().now_or_never().is_none(), "waits for chunk 3");
        let _ = chunks.send(chunk(3));
        seen.push(stream.next().await);
        assert!(stream.next().now_or_never().is_none(), "waits for chunk 4");
        let _ = chunks.send(chunk(4));
        seen.push(stream.next().await);
        seen.push(stream.next().await);
        seen.push(stream.next().await);
        let seen: Vec<PeerEvent> = seen.into_iter().flatten().collect();
        assert_eq!(seqs(&seen), ["2", "3", "4", "settled 5"]);
        drop(chunks);
    }

    /// Settled with nothing more to give: at once; a settle it cannot tell ends it untold; a
    /// failure ends it.
    #[tokio::test]
    async fn a_settle_already_reached_or_unknown_or_a_failure_ends_the_stream() {
        let settled = to_settle(futures::stream::pending(), 3, async { Some(3) });
        let seen: Vec<PeerEvent> = settled.collect().await;
        assert_eq!(seqs(&seen), ["settled 3"]);

        let unknown = to_settle(futures::stream::pending(), 0, async { None });
        let seen: Vec<PeerEvent> = unknown.collect().await;
        assert!(seen.is_empty(), "{seen:?}");

        let failure = PeerEvent::Failed(PeerFailure::of(&crate::Error::ShutDown));
        let failed = to_settle(
            futures::stream::iter([failure, chunk(0)]),
            0,
            std::future::pending(),
        );
        let seen: Vec<PeerEvent> = failed.collect().await;
        assert_eq!(seqs(&seen), ["other"]);
    }

    fn tokio_stream_of(
        mut events: mpsc::UnboundedReceiver<PeerEvent>,
    ) -> impl futures::Stream<Item = PeerEvent> + Send + 'static {
        futures::stream::poll_fn(move |cx| events.poll_recv(cx))
    }
}
