//! Going on after a suspension (resume, with its barrier), and ending one early (interrupt,
//! abort, a new message over pending calls).

use super::core::{CallSlot, Phase, Session};
use super::suspend::answer_outcome;
use super::{
    Answer, ChildState, Effect, ErrorCode, Observation, PendingCall, RunError, RunOutcome, Status,
    Transition,
};
use crate::error::Error;
use crate::hooks::HookEvent;
use crate::ids::RunId;
use crate::message::{ToolCall, ToolOutcome};
use crate::schema::IndexWrite;
use crate::store::CommitKind;

/// What a resume did.
#[derive(Debug)]
pub(crate) enum Resumed {
    /// A new run started; its transition must be performed.
    Started(Box<Transition>),
    /// Some call of the suspension still waits (the barrier): nothing ran.
    StillWaiting(RunOutcome),
}

impl Session {
    /// Continues a suspended or interrupted run as the new run `run_id`.
    ///
    /// # Errors
    /// [`Error::Aborted`] for an aborted session, [`Error::AlreadyRunning`] while a run is in
    /// progress, [`Error::NotResumable`] for a session whose last run completed or failed.
    pub(crate) fn resume(&mut self, run_id: RunId, now: u64) -> Result<Resumed, Error> {
        if self.record.aborted {
            return Err(Error::Aborted(self.record.id.clone()));
        }
        match self.record.status {
            Status::Running => Err(Error::AlreadyRunning(self.record.id.clone())),
            Status::SuspendedClientTool | Status::SuspendedAwaitingChildren => {
                if self.pending.any_waiting(now) {
                    return Ok(Resumed::StillWaiting(self.outcome(now)));
                }
                let asleep = self.children_to_wake();
                if !asleep.is_empty() {
                    // The cascade: each child resumes (or reports what it still waits on), and
                    // this session goes on once all have reported.
                    self.phase = Phase::AwaitingChildren {
                        waking: asleep.iter().map(|(call, _)| call.clone()).collect(),
                    };
                    return Ok(Resumed::Started(Box::new(Transition {
                        commit: None,
                        effects: vec![Effect::WakeChildren(asleep)],
                    })));
                }
                Ok(Resumed::Started(Box::new(self.drain(run_id, now))))
            }
            Status::Interrupted => {
                let previous = self.current_run_id();
                let crashed = self
                    .run
                    .as_ref()
                    .and_then(|run| run.error.as_ref())
                    .is_some_and(|error| error.code == ErrorCode::Crashed);
                let mut effects = Vec::new();
                self.start_run(run_id, Some(previous), now);
                effects.push(self.resumed_hook(run_id, previous));
                if crashed {
                    return Ok(Resumed::Started(Box::new(
                        self.retry_cut_calls(run_id, now, effects),
                    )));
                }
                self.close_dangling_calls(
                    "interrupted: the run stopped before this call returned",
                    now,
                    &mut effects,
                );
                self.begin_step(run_id, now, &mut effects);
                Ok(Resumed::Started(Box::new(self.finish(
                    CommitKind::RunStart,
                    now,
                    effects,
                ))))
            }
            status @ (Status::Completed | Status::Failed) => Err(Error::NotResumable {
                session: self.record.id.clone(),
                status,
            }),
        }
    }

    /// At-most-once across crashes: the calls a crash cut (committed by commit #1, without a
    /// result) run again only if their tool is `safe_to_retry`; any other server call gets a
    /// `tool_durability_error` result the model can act on. Client and approval calls never
    /// reached anyone outside (their pending entries were part of the lost commit #2), so they
    /// become pending now.
    fn retry_cut_calls(&mut self, run_id: RunId, now: u64, mut effects: Vec<Effect>) -> Transition {
        let cut = self.dangling_calls();
        if cut.is_empty() {
            self.begin_step(run_id, now, &mut effects);
            return self.finish(CommitKind::RunStart, now, effects);
        }
        let mut parallel = Vec::new();
        let mut sequential = Vec::new();
        let mut slots = Vec::with_capacity(cut.len());
        for call in &cut {
            let slot = match self.classify(call) {
                CallSlot::Dispatched if self.safe_to_retry(call) => {
                    if self.finishes_run(call) {
                        sequential.push(call.clone());
                    } else {
                        parallel.push(call.clone());
                    }
                    CallSlot::Dispatched
                }
                CallSlot::Dispatched => CallSlot::Ready {
                    outcome: ToolOutcome::Error(format!(
                        "tool_durability_error: the process stopped while {} (call {}) was running, so it may or may not have taken effect. It is not marked safe to retry, so it was not run again: check whether its effect happened before calling it again.",
                        call.name, call.id
                    )),
                    reported: false,
                },
                other => other,
            };
            slots.push(slot);
        }
        let step = self.record.steps_in_run;
        self.dispatch(
            CommitKind::RunStart,
            run_id,
            step,
            cut,
            slots,
            parallel,
            sequential,
            now,
            effects,
        )
    }

    /// Drains every answer of the suspension into tool results, in call order, and runs the
    /// approved tools: one continuation that sees all results, once.
    pub(super) fn drain(&mut self, run_id: RunId, now: u64) -> Transition {
        let previous = self
            .record
            .suspension
            .as_ref()
            .map_or_else(|| self.current_run_id(), |suspension| suspension.run_id);
        self.start_run(run_id, Some(previous), now);
        let mut effects = vec![self.resumed_hook(run_id, previous)];
        let pending = self.pending.take_in_order();
        let mut calls = Vec::with_capacity(pending.len());
        let mut slots = Vec::with_capacity(pending.len());
        let mut positions = Vec::with_capacity(pending.len());
        let mut parallel = Vec::new();
        let mut sequential = Vec::new();
        for entry in self.children.entries() {
            positions.push(entry.position);
            calls.push(ToolCall::new(
                entry.tool_call_id.clone(),
                entry.tool_name.clone(),
                serde_json::Value::Null,
            ));
            slots.push(CallSlot::Ready {
                outcome: self.adopt_child(run_id, &entry.tool_call_id, now),
                reported: false,
            });
        }
        for entry in &pending {
            positions.push(entry.position);
            let call = ToolCall::new(
                entry.tool_call_id.clone(),
                entry.tool_name.clone(),
                entry.input.clone(),
            );
            let slot = match (&entry.answer, answer_outcome(entry)) {
                (Some(Answer::Approved), _) => {
                    if self.finishes_run(&call) {
                        sequential.push(call.clone());
                    } else {
                        parallel.push(call.clone());
                    }
                    CallSlot::Dispatched
                }
                // Only a timeout was reported when it happened; answers are reported now.
                (Some(answer), Some(outcome)) => CallSlot::Ready {
                    outcome,
                    reported: *answer == Answer::TimedOut,
                },
                // Expired but not yet swept: the deadline is authoritative.
                _ => {
                    effects.push(Effect::Observe(Observation::TimedOut {
                        tool_call_id: entry.tool_call_id.clone(),
                        lag_ms: now.saturating_sub(entry.deadline_at_ms),
                    }));
                    let mut expired = entry.clone();
                    expired.answer = Some(Answer::TimedOut);
                    CallSlot::Ready {
                        outcome: answer_outcome(&expired)
                            .unwrap_or_else(|| ToolOutcome::Error("client_tool_timeout".into())),
                        reported: false,
                    }
                }
            };
            calls.push(call);
            slots.push(slot);
        }
        for entry in &pending {
            self.complete(entry, now);
        }
        // Children and own calls interleave in the model's reply: restore call order.
        let mut ordered: Vec<(u32, (ToolCall, CallSlot))> = positions
            .into_iter()
            .zip(calls.into_iter().zip(slots))
            .collect();
        ordered.sort_by_key(|(position, _)| *position);
        let (calls, slots): (Vec<ToolCall>, Vec<CallSlot>) =
            ordered.into_iter().map(|(_, pair)| pair).unzip();
        let step = self.record.steps_in_run;
        self.dispatch(
            CommitKind::RunStart,
            run_id,
            step,
            calls,
            slots,
            parallel,
            sequential,
            now,
            effects,
        )
    }

    /// Removes a finished call's entry and ownership and leaves a tombstone on the root, so a
    /// duplicate submit answers `already_completed` for the retention period.
    fn complete(&mut self, entry: &PendingCall, now: u64) {
        self.unindex(entry);
        self.staged.index.push(IndexWrite::PutTombstone {
            root: self.record.root.clone(),
            call: entry.tool_call_id.clone(),
            at: now,
        });
    }

    fn resumed_hook(&self, run_id: RunId, previous: RunId) -> Effect {
        Effect::Hook(HookEvent::AgentResumed {
            session: self.record.id.clone(),
            run_id,
            previous_run_id: previous,
        })
    }

    /// A new message over pending calls closes each one: answers are kept, unanswered calls get
    /// `client_tool_abandoned`, and all are tombstoned.
    pub(super) fn abandon_pending(&mut self, now: u64, effects: &mut Vec<Effect>) {
        if self.pending.is_empty() && self.children.is_empty() {
            return;
        }
        let abandoned = self.close_pending(
            now,
            effects,
            "client_tool_abandoned: approved, but a new message arrived before the tool ran",
            Some("client_tool_abandoned: a new message arrived before this call was answered"),
        );
        if abandoned > 0 {
            effects.push(Effect::Observe(Observation::Abandoned { count: abandoned }));
        }
        self.record.suspension = None;
    }

    /// Records every answered pending call as its result (tombstoned: duplicates answer
    /// `already_completed`), so an accepted answer is never lost. Unanswered calls are closed
    /// with `unanswered` (tombstoned too), or, without it, dropped: their entries go and a late
    /// submit answers `unknown_tool_call`. Returns how many were unanswered.
    fn close_pending(
        &mut self,
        now: u64,
        effects: &mut Vec<Effect>,
        approved: &str,
        unanswered: Option<&str>,
    ) -> usize {
        let run_id = self.current_run_id();
        let mut count = 0;
        // Children the run will not wait for are stopped (aborted when abandoned or aborted);
        // those that finished are recorded like answered calls.
        let abort_children = unanswered.is_some() || self.record.aborted;
        let finished = if self.is_busy() {
            // A step in progress still waits for its children; they are stopped, not dropped.
            Vec::new()
        } else {
            self.release_children(abort_children, effects)
        };
        for entry in finished {
            let outcome = match (&entry.state, unanswered) {
                (ChildState::Finished(_), _) => self.adopt_child(run_id, &entry.tool_call_id, now),
                (_, Some(_)) => {
                    count += 1;
                    self.adopt_child(run_id, &entry.tool_call_id, now);
                    ToolOutcome::Error(
                        "sub_agent_abandoned: a new message arrived before the child finished"
                            .into(),
                    )
                }
                (_, None) => {
                    count += 1;
                    self.drop_child(&entry.tool_call_id);
                    continue;
                }
            };
            let call = ToolCall::new(
                entry.tool_call_id.clone(),
                entry.tool_name.clone(),
                serde_json::Value::Null,
            );
            self.record_outcome(
                run_id,
                call,
                outcome,
                false,
                Default::default(),
                now,
                effects,
            );
        }
        for entry in self.pending.take_in_order() {
            let (outcome, reported) = match (&entry.answer, answer_outcome(&entry)) {
                (Some(Answer::Approved), _) => (ToolOutcome::Error(approved.into()), false),
                (Some(answer), Some(outcome)) => (outcome, *answer == Answer::TimedOut),
                _ => {
                    count += 1;
                    match unanswered {
                        Some(text) => (ToolOutcome::Error(text.into()), false),
                        None => {
                            self.unindex(&entry);
                            continue;
                        }
                    }
                }
            };
            let call = ToolCall::new(
                entry.tool_call_id.clone(),
                entry.tool_name.clone(),
                entry.input.clone(),
            );
            self.record_outcome(
                run_id,
                call,
                outcome,
                reported,
                Default::default(),
                now,
                effects,
            );
            self.complete(&entry, now);
        }
        count
    }

    /// A durable interrupt: a suspended run ends `interrupted` at once. Its answered calls keep
    /// their answers (recorded as results); its unanswered calls and their ownership are
    /// cleared, so late submits answer `unknown_tool_call`. A running run stops at the top of
    /// its next step.
    pub(crate) fn interrupt(&mut self, now: u64) -> Transition {
        match self.record.status {
            Status::SuspendedClientTool | Status::SuspendedAwaitingChildren => {
                let mut effects = Vec::new();
                let count = self.close_pending(
                    now,
                    &mut effects,
                    "interrupted: approved, but the run was interrupted before the tool ran",
                    None,
                );
                effects.push(Effect::Observe(Observation::Aborted { count }));
                self.record.suspension = None;
                let error = RunError {
                    code: ErrorCode::Interrupted,
                    message: "interrupted by request while waiting".into(),
                };
                self.end_run(Status::Interrupted, Some(error), now, &mut effects);
                self.finish(CommitKind::Other, now, effects)
            }
            Status::Running => {
                self.record.interrupt_requested = true;
                let mut effects = Vec::new();
                self.stop_live_children(false, &mut effects);
                self.finish(CommitKind::Other, now, effects)
            }
            _ => Transition::default(),
        }
    }

    /// A terminal abort: a suspended or interrupted run fails, its unanswered calls are dropped
    /// (answered ones are recorded), and the session never runs again. A session whose last
    /// run already completed or failed keeps that run as it was.
    pub(crate) fn abort(&mut self, now: u64) -> Transition {
        if self.record.aborted {
            return Transition::default();
        }
        self.record.aborted = true;
        let mut effects = Vec::new();
        let count = self.close_pending(
            now,
            &mut effects,
            "aborted: approved, but the session was aborted before the tool ran",
            None,
        );
        if count > 0 {
            effects.push(Effect::Observe(Observation::Aborted { count }));
        }
        self.terminate_companions(&mut effects);
        self.record.suspension = None;
        match self.record.status {
            // Honoured at the top of the next step, once the children stopped.
            Status::Running => self.stop_live_children(true, &mut effects),
            // A run that stopped and could go on (suspended, or interrupted) ends here.
            Status::SuspendedClientTool
            | Status::SuspendedAwaitingChildren
            | Status::Interrupted => {
                let error = RunError {
                    code: ErrorCode::Aborted,
                    message: "aborted: the session was aborted".into(),
                };
                self.end_run(Status::Failed, Some(error), now, &mut effects);
            }
            // A run that already ended keeps its record and its one `run_end`: the abort only
            // refuses what would come next.
            Status::Completed | Status::Failed => {}
        }
        self.finish(CommitKind::Other, now, effects)
    }
}
