//! The host: a table of keys to actors, with activation, passivation, LRU eviction and a
//! crash-loop breaker.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use tokio::sync::Notify;

use crate::cell::{load, send_user, CellTask, Envelope, Running};
use crate::clock::{Clock, SystemClock};
use crate::error::{Error, HostError};
use crate::mailbox::CellRef;
use crate::slot::{Phase, Slot};
use crate::VirtualActor;

/// Tuning of a [`Host`].
#[derive(Clone, Debug)]
pub struct HostConfig {
    /// Most actors resident at once; past it the least recently used idle ones are evicted.
    /// `None`: no limit.
    pub max_resident: Option<usize>,
    /// Passivate actors that received nothing for this long (checked by
    /// [`Host::passivate_idle`], which a background task calls when this is set).
    pub idle_after_ms: Option<u64>,
    /// Crashes within [`crash_window_ms`](Self::crash_window_ms) that mark a key failed.
    pub max_crashes: u32,
    /// The supervision window.
    pub crash_window_ms: u64,
}

impl Default for HostConfig {
    fn default() -> Self {
        Self {
            max_resident: None,
            idle_after_ms: None,
            max_crashes: 3,
            crash_window_ms: 60_000,
        }
    }
}

/// Counters of a host's life so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct HostStats {
    /// Actors started (first activations and re-activations).
    pub activations: u64,
    /// Actors that stopped after a passivation or eviction.
    pub passivations: u64,
    /// Activations that failed.
    pub activation_failures: u64,
    /// Panics caught in handlers.
    pub crashes: u64,
    /// Actors resident now (starting, live or stopping).
    pub resident: usize,
    /// The most actors resident at once.
    pub peak_resident: usize,
    /// How many times the table was scanned for actors to evict past the limit.
    pub eviction_scans: u64,
}

/// A handle that does not keep a host alive (see [`Host::downgrade`]), for behaviours that
/// must reach another host without forming a reference cycle.
pub struct WeakHost<A: VirtualActor> {
    inner: std::sync::Weak<Inner<A>>,
}

impl<A: VirtualActor> Clone for WeakHost<A> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<A: VirtualActor> fmt::Debug for WeakHost<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeakHost").finish_non_exhaustive()
    }
}

impl<A: VirtualActor> WeakHost<A> {
    /// The host, if it still exists.
    pub fn upgrade(&self) -> Option<Host<A>> {
        self.inner.upgrade().map(Host::from_inner)
    }
}

/// A handle to a virtual-actor host; cheap to clone.
pub struct Host<A: VirtualActor> {
    inner: Arc<Inner<A>>,
}

impl<A: VirtualActor> Clone for Host<A> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<A: VirtualActor> fmt::Debug for Host<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Host")
            .field("behaviour", &self.inner.behaviour)
            .field("config", &self.inner.config)
            .field("stats", &self.stats())
            .finish()
    }
}

pub(crate) struct Inner<A: VirtualActor> {
    behaviour: Arc<A>,
    config: HostConfig,
    clock: Arc<dyn Clock>,
    slots: DashMap<A::Key, Slot<A>>,
    failed: DashMap<A::Key, HostError<A>>,
    /// Keys in `failed`, so the hot path skips that lookup while nothing has failed.
    failed_count: AtomicUsize,
    next_generation: AtomicU64,
    use_counter: AtomicU64,
    resident: AtomicUsize,
    peak_resident: AtomicUsize,
    activations: AtomicU64,
    passivations: AtomicU64,
    activation_failures: AtomicU64,
    crashes: AtomicU64,
    evicting: AtomicBool,
    /// Activations over the limit since the last scan for actors to evict, and how many
    /// actors were resident at that scan (see [`Inner::evict_least_recently_used`]).
    over_limit_since_scan: AtomicUsize,
    resident_at_scan: AtomicUsize,
    eviction_scans: AtomicU64,
    shut_down: AtomicBool,
    /// Woken whenever an actor stops, so callers can wait for a key to settle.
    stopped: Notify,
}

impl<A: VirtualActor> Host<A> {
    /// A host on the system clock. Must be called inside a tokio runtime.
    pub fn new(behaviour: A, config: HostConfig) -> Self {
        Self::with_clock(behaviour, config, Arc::new(SystemClock))
    }

    /// A host whose idle and crash windows read `clock`.
    pub fn with_clock(behaviour: A, config: HostConfig, clock: Arc<dyn Clock>) -> Self {
        let inner = Arc::new(Inner {
            behaviour: Arc::new(behaviour),
            config,
            clock,
            slots: DashMap::new(),
            failed: DashMap::new(),
            failed_count: AtomicUsize::new(0),
            next_generation: AtomicU64::new(1),
            use_counter: AtomicU64::new(0),
            resident: AtomicUsize::new(0),
            peak_resident: AtomicUsize::new(0),
            activations: AtomicU64::new(0),
            passivations: AtomicU64::new(0),
            activation_failures: AtomicU64::new(0),
            crashes: AtomicU64::new(0),
            evicting: AtomicBool::new(false),
            over_limit_since_scan: AtomicUsize::new(0),
            resident_at_scan: AtomicUsize::new(0),
            eviction_scans: AtomicU64::new(0),
            shut_down: AtomicBool::new(false),
            stopped: Notify::new(),
        });
        if let Some(idle) = inner.config.idle_after_ms {
            spawn_idle_sweeper(Arc::downgrade(&inner), idle);
        }
        Self { inner }
    }

    pub(crate) fn from_inner(inner: Arc<Inner<A>>) -> Self {
        Self { inner }
    }

    /// A handle that does not keep the host alive.
    pub fn downgrade(&self) -> WeakHost<A> {
        WeakHost {
            inner: Arc::downgrade(&self.inner),
        }
    }

    /// The behaviour shared by every actor of this host.
    pub fn behaviour(&self) -> &A {
        &self.inner.behaviour
    }

    /// Delivers `msg` to the actor of `key`, activating it first if needed. Never waits: a
    /// message for an actor that is starting or stopping is buffered in order.
    ///
    /// A message that cannot be delivered (the key failed, the host is shut down, activation
    /// failed) is handed to [`VirtualActor::reject`].
    pub fn send(&self, key: A::Key, msg: A::Msg) {
        self.inner.send(key, msg);
    }

    /// Asks the actor of `key` to stop. Returns at once; see [`Host::evict_and_wait`].
    /// An actor with work in flight refuses and stays.
    pub fn evict(&self, key: &A::Key) {
        self.inner.request_stop(key, false);
    }

    /// Asks the actor of `key` to stop and waits until it has stopped or refused.
    pub async fn evict_and_wait(&self, key: &A::Key) {
        self.inner.request_stop(key, false);
        self.inner.wait_settled(key).await;
    }

    /// Asks every resident actor to stop and waits until each has stopped or refused.
    pub async fn evict_all(&self) {
        let keys = self.inner.live_keys();
        for key in &keys {
            self.inner.request_stop(key, false);
        }
        for key in &keys {
            self.inner.wait_settled(key).await;
        }
    }

    /// Passivates every live actor idle for at least [`HostConfig::idle_after_ms`] (by the
    /// host's clock); returns how many were asked to stop.
    pub fn passivate_idle(&self) -> usize {
        self.inner.passivate_idle()
    }

    /// Whether an actor for `key` is resident (starting, live or stopping).
    pub fn is_resident(&self, key: &A::Key) -> bool {
        self.inner.slots.contains_key(key)
    }

    /// The keys that have an actor (live, starting or stopping) right now.
    pub fn resident_keys(&self) -> Vec<A::Key> {
        self.inner
            .slots
            .iter()
            .map(|slot| slot.key().clone())
            .collect()
    }

    /// The error a failed key answers with, if it is marked failed.
    pub fn failure(&self, key: &A::Key) -> Option<HostError<A>> {
        self.inner
            .failed
            .get(key)
            .map(|entry| entry.value().clone())
    }

    /// Clears a key's failed mark, so its next message activates it again.
    pub fn clear_failure(&self, key: &A::Key) {
        if self.inner.failed.remove(key).is_some() {
            self.inner.failed_count.fetch_sub(1, Ordering::Release);
        }
    }

    /// The host's counters.
    pub fn stats(&self) -> HostStats {
        let inner = &self.inner;
        HostStats {
            activations: inner.activations.load(Ordering::Relaxed),
            passivations: inner.passivations.load(Ordering::Relaxed),
            activation_failures: inner.activation_failures.load(Ordering::Relaxed),
            crashes: inner.crashes.load(Ordering::Relaxed),
            resident: inner.resident.load(Ordering::Relaxed),
            peak_resident: inner.peak_resident.load(Ordering::Relaxed),
            eviction_scans: inner.eviction_scans.load(Ordering::Relaxed),
        }
    }

    /// Stops every actor (busy or not) and waits for them; later messages are rejected with
    /// [`Error::ShutDown`]. Behaviours keep their state durable, so nothing is lost but work in
    /// flight, which the behaviour must be able to recover on its next activation.
    pub async fn shutdown(&self) {
        self.inner.shut_down.store(true, Ordering::SeqCst);
        loop {
            let keys = self.inner.live_keys();
            let settling: Vec<A::Key> = self
                .inner
                .slots
                .iter()
                .map(|slot| slot.key().clone())
                .collect();
            if settling.is_empty() {
                break;
            }
            for key in &keys {
                self.inner.request_stop(key, true);
            }
            for key in &settling {
                self.inner.wait_settled(key).await;
            }
        }
    }
}

impl<A: VirtualActor> Drop for Inner<A> {
    /// The last handle on the host is gone without a shutdown: its actors are stopped, so that
    /// their tasks end and their state goes, rather than wait for messages nobody can send
    /// (each cell holds its own mailbox, so it would never see it close).
    fn drop(&mut self) {
        for slot in self.slots.iter() {
            if let Phase::Live { actor } | Phase::Stopping { actor, .. } = &slot.phase {
                actor.stop();
            }
        }
    }
}

impl<A: VirtualActor> Inner<A> {
    pub(crate) fn config(&self) -> &HostConfig {
        &self.config
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    pub(crate) fn record_crash(&self) {
        self.crashes.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn mark_failed(&self, key: A::Key, error: HostError<A>) {
        if self.failed.insert(key, error).is_none() {
            self.failed_count.fetch_add(1, Ordering::Release);
        }
    }

    fn touch(&self, slot: &Slot<A>) {
        let tick = self.use_counter.fetch_add(1, Ordering::Relaxed);
        slot.last_use.store(tick, Ordering::Relaxed);
        slot.last_use_ms
            .store(self.clock.now_ms(), Ordering::Relaxed);
    }

    fn send(self: &Arc<Self>, key: A::Key, msg: A::Msg) {
        if self.shut_down.load(Ordering::Acquire) {
            self.behaviour
                .reject(&Host::from_inner(Arc::clone(self)), msg, Error::ShutDown);
            return;
        }
        if self.failed_count.load(Ordering::Acquire) > 0 {
            if let Some(error) = self.failed.get(&key) {
                let error = error.value().clone();
                self.behaviour
                    .reject(&Host::from_inner(Arc::clone(self)), msg, error);
                return;
            }
        }
        // Fast path under the shard's read lock: a stop request needs the write lock, so a
        // message handed to a live actor here is always ahead of its passivation envelope.
        let msg = match self.slots.get(&key) {
            Some(slot) => match &slot.phase {
                Phase::Live { actor } => {
                    self.touch(&slot);
                    match send_user(actor, msg) {
                        Ok(()) => return,
                        Err(msg) => msg,
                    }
                }
                _ => msg,
            },
            None => msg,
        };
        self.send_slow(key, msg);
    }

    fn send_slow(self: &Arc<Self>, key: A::Key, msg: A::Msg) {
        match self.slots.entry(key.clone()) {
            Entry::Occupied(mut occupied) => {
                let slot = occupied.get_mut();
                self.touch(slot);
                match &mut slot.phase {
                    Phase::Live { actor } => {
                        if let Err(msg) = send_user(actor, msg) {
                            // The actor died without the host noticing yet; its termination
                            // handler will re-activate the key with whatever is queued.
                            slot.phase = Phase::Stopping {
                                actor: actor.clone(),
                                queue: vec![msg],
                            };
                        }
                    }
                    Phase::Starting { queue } | Phase::Stopping { queue, .. } => queue.push(msg),
                }
            }
            Entry::Vacant(vacant) => {
                let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
                let tick = self.use_counter.fetch_add(1, Ordering::Relaxed);
                vacant.insert(Slot {
                    generation,
                    phase: Phase::Starting { queue: vec![msg] },
                    last_use: AtomicU64::new(tick),
                    last_use_ms: AtomicU64::new(self.clock.now_ms()),
                });
                let resident = self.resident.fetch_add(1, Ordering::Relaxed) + 1;
                self.peak_resident.fetch_max(resident, Ordering::Relaxed);
                self.spawn_activation(key, generation);
                if self.config.max_resident.is_some_and(|max| resident > max) {
                    self.evict_least_recently_used();
                }
            }
        }
    }

    /// Starts the task of `key`'s next actor: it loads the state, then serves the mailbox
    /// until the actor is stopped.
    fn spawn_activation(self: &Arc<Self>, key: A::Key, generation: u64) {
        let host = Arc::clone(self);
        tokio::spawn(CellTask::Activating(Box::pin(
            host.activate(key, generation),
        )));
    }

    /// Loads `key`'s state and makes its actor live; `None` when the activation failed (the
    /// messages that waited for it are rejected).
    async fn activate(self: Arc<Self>, key: A::Key, generation: u64) -> Option<Running<A>> {
        match load(&*self.behaviour, &key).await {
            Ok(state) => {
                self.activations.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%key, generation, "actor.activated");
                // A resident actor must not keep its host alive: its task reaches it weakly.
                let (running, actor) = Running::new(
                    Arc::clone(&self.behaviour),
                    Arc::downgrade(&self),
                    (key.clone(), generation),
                    state,
                );
                self.go_live(&key, generation, actor);
                Some(running)
            }
            Err(error) => {
                self.activation_failures.fetch_add(1, Ordering::Relaxed);
                let refused = error
                    .activation_error()
                    .is_some_and(|error| self.behaviour.is_refusal(error));
                if refused {
                    tracing::debug!(%key, %error, "actor.activation_refused");
                } else {
                    tracing::warn!(%key, %error, "actor.activation_failed");
                }
                let queue = match self
                    .slots
                    .remove_if(&key, |_, slot| slot.generation == generation)
                {
                    Some((_, slot)) => match slot.phase {
                        Phase::Starting { queue } => queue,
                        _ => Vec::new(),
                    },
                    None => Vec::new(),
                };
                self.resident.fetch_sub(1, Ordering::Relaxed);
                self.stopped.notify_waiters();
                for msg in queue {
                    self.behaviour
                        .reject(&Host::from_inner(Arc::clone(&self)), msg, error.clone());
                }
                None
            }
        }
    }

    /// Hands the buffered messages to a freshly started actor, in order, under the write lock so
    /// no concurrent sender can overtake them.
    fn go_live(&self, key: &A::Key, generation: u64, actor: CellRef<Envelope<A::Msg>>) {
        let Some(mut slot) = self.slots.get_mut(key) else {
            actor.stop();
            return;
        };
        if slot.generation != generation {
            actor.stop();
            return;
        }
        let queue = match &mut slot.phase {
            Phase::Starting { queue } => std::mem::take(queue),
            _ => Vec::new(),
        };
        let mut undelivered = Vec::new();
        for msg in queue {
            if let Err(msg) = send_user(&actor, msg) {
                undelivered.push(msg);
            }
        }
        slot.phase = if undelivered.is_empty() {
            Phase::Live { actor }
        } else {
            Phase::Stopping {
                actor,
                queue: undelivered,
            }
        };
        drop(slot);
        // A shutdown or eviction may be waiting for this key to leave `Starting`.
        self.stopped.notify_waiters();
    }

    /// Stops routing to the actor of `key` and queues a passivation envelope behind its mailbox.
    pub(crate) fn request_stop(&self, key: &A::Key, force: bool) {
        let Some(mut slot) = self.slots.get_mut(key) else {
            return;
        };
        let generation = slot.generation;
        let phase = std::mem::replace(&mut slot.phase, Phase::Starting { queue: Vec::new() });
        slot.phase = match phase {
            Phase::Live { actor } => {
                let sent = actor.send(Envelope::Passivate { generation, force });
                if sent.is_err() {
                    tracing::debug!(%key, "actor.stop_requested_on_dead_actor");
                }
                Phase::Stopping {
                    actor,
                    queue: Vec::new(),
                }
            }
            Phase::Stopping { actor, queue } if force => {
                let _ = actor.send(Envelope::Passivate { generation, force });
                Phase::Stopping { actor, queue }
            }
            other => other,
        };
    }

    /// The actor refused to stop (it is busy): route to it again, buffered messages first.
    pub(crate) fn cancel_stop(&self, key: &A::Key, generation: u64) {
        let Some(mut slot) = self.slots.get_mut(key) else {
            return;
        };
        if slot.generation != generation {
            return;
        }
        let phase = std::mem::replace(&mut slot.phase, Phase::Starting { queue: Vec::new() });
        slot.phase = match phase {
            Phase::Stopping { actor, queue } => {
                let mut undelivered = Vec::new();
                for msg in queue {
                    if let Err(msg) = send_user(&actor, msg) {
                        undelivered.push(msg);
                    }
                }
                if undelivered.is_empty() {
                    Phase::Live { actor }
                } else {
                    Phase::Stopping {
                        actor,
                        queue: undelivered,
                    }
                }
            }
            other => other,
        };
        drop(slot);
        self.stopped.notify_waiters();
    }

    /// An actor's task ended: forget it, or start its successor for the messages it left
    /// unhandled (`unhandled`, first) and those that arrived while it was stopping.
    pub(crate) fn on_stopped(
        self: &Arc<Self>,
        key: A::Key,
        generation: u64,
        mut unhandled: Vec<A::Msg>,
    ) {
        let mut restart = None;
        if let Entry::Occupied(mut occupied) = self.slots.entry(key.clone()) {
            if occupied.get().generation == generation {
                let slot = occupied.get_mut();
                let mut queue = std::mem::take(&mut unhandled);
                if let Phase::Stopping { queue: arrived, .. } = &mut slot.phase {
                    queue.append(arrived);
                }
                self.passivations.fetch_add(1, Ordering::Relaxed);
                if queue.is_empty() || self.shut_down.load(Ordering::Acquire) {
                    occupied.remove();
                    self.resident.fetch_sub(1, Ordering::Relaxed);
                    tracing::debug!(%key, generation, "actor.passivated");
                    if !self.shut_down.load(Ordering::Acquire) {
                        self.behaviour.passivated(&key);
                    }
                    for msg in queue {
                        self.behaviour.reject(
                            &Host::from_inner(Arc::clone(self)),
                            msg,
                            Error::ShutDown,
                        );
                    }
                } else {
                    let next = self.next_generation.fetch_add(1, Ordering::Relaxed);
                    slot.generation = next;
                    slot.phase = Phase::Starting { queue };
                    restart = Some(next);
                }
            }
        }
        if let Some(next) = restart {
            self.spawn_activation(key.clone(), next);
        }
        // The key has another actor by now (or none): they go to it as any message would.
        for msg in unhandled {
            self.send(key.clone(), msg);
        }
        self.stopped.notify_waiters();
    }

    fn live_keys(&self) -> Vec<A::Key> {
        self.slots
            .iter()
            .filter(|slot| slot.is_live())
            .map(|slot| slot.key().clone())
            .collect()
    }

    /// Waits until `key` has no actor, or a live one (one that refused to stop).
    async fn wait_settled(&self, key: &A::Key) {
        loop {
            let notified = self.stopped.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let settled = match self.slots.get(key) {
                None => true,
                Some(slot) => slot.is_live(),
            };
            if settled {
                return;
            }
            notified.await;
        }
    }

    fn passivate_idle(&self) -> usize {
        let Some(idle_after) = self.config.idle_after_ms else {
            return 0;
        };
        let now = self.clock.now_ms();
        let idle: Vec<A::Key> = self
            .slots
            .iter()
            .filter(|slot| {
                slot.is_live()
                    && now.saturating_sub(slot.last_use_ms.load(Ordering::Relaxed)) >= idle_after
            })
            .map(|slot| slot.key().clone())
            .collect();
        for key in &idle {
            self.request_stop(key, false);
        }
        idle.len()
    }

    /// Whether more actors are resident than the limit allows. Eviction runs when an actor
    /// starts and skips those busy then, so an actor that goes idle while this holds is
    /// stopped by its cell; without that, a burst of busy actors (a fan-out of children)
    /// would stay resident past the limit once idle.
    pub(crate) fn over_limit(&self) -> bool {
        self.config
            .max_resident
            .is_some_and(|max| self.resident.load(Ordering::Relaxed) > max)
    }

    /// Evicts the least recently used live actors, down to nine tenths of the limit, so that
    /// the scan of the table is paid once per batch of evictions rather than once per actor.
    ///
    /// While the actors over the limit are busy (a fan-out of thousands of children), a scan
    /// stops none of them, and scanning again at every activation cost a pass over the whole
    /// table each time: a fifth of the CPU of a 10,000-child fan-out. So while more actors
    /// are resident than at the last scan (its stops have not brought the count down), the
    /// next scan waits for a tenth of the limit of activations; a busy actor that goes idle
    /// meanwhile stops itself (its cell sees [`over_limit`](Self::over_limit)).
    fn evict_least_recently_used(&self) {
        let Some(max) = self.config.max_resident else {
            return;
        };
        let resident = self.resident.load(Ordering::Relaxed);
        let since = self.over_limit_since_scan.fetch_add(1, Ordering::Relaxed) + 1;
        if resident > self.resident_at_scan.load(Ordering::Relaxed) && since < (max / 10).max(1) {
            return;
        }
        if self.evicting.swap(true, Ordering::AcqRel) {
            return;
        }
        self.over_limit_since_scan.store(0, Ordering::Relaxed);
        self.resident_at_scan.store(resident, Ordering::Relaxed);
        self.eviction_scans.fetch_add(1, Ordering::Relaxed);
        let target = max - max / 10;
        let excess = resident.saturating_sub(target);
        if excess > 0 {
            let mut candidates: Vec<(u64, A::Key)> = self
                .slots
                .iter()
                .filter(|slot| slot.is_live())
                .map(|slot| (slot.last_use.load(Ordering::Relaxed), slot.key().clone()))
                .collect();
            let count = excess.min(candidates.len());
            if count > 0 && count < candidates.len() {
                candidates.select_nth_unstable_by_key(count - 1, |(tick, _)| *tick);
            }
            for (_, key) in candidates.into_iter().take(count) {
                self.request_stop(&key, false);
            }
        }
        self.evicting.store(false, Ordering::Release);
    }
}

fn spawn_idle_sweeper<A: VirtualActor>(host: std::sync::Weak<Inner<A>>, idle_after_ms: u64) {
    let period = Duration::from_millis((idle_after_ms / 2).max(10));
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let Some(host) = host.upgrade() else { return };
            if host.shut_down.load(Ordering::Acquire) {
                return;
            }
            host.passivate_idle();
        }
    });
}
