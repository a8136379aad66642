//! Children's reports on their way to a parent, gathered so that the parent records many in
//! one commit.
//!
//! Each report a child sends is applied by its parent, and each application is a commit the
//! parent's actor waits for before its next message. A parent with 10,000 children took
//! 10,000 commits one after another to hear that they had all suspended (and as many again on
//! the way back), one group flush each: the fan-in was serial on the parent, however many
//! cores and however fast the store's groups (issue 30 measured 28 s for 10,000 children).
//!
//! So a report goes into the parent's queue here, and only the first report into an empty
//! queue sends the parent a message (a nudge); the parent takes everything queued when it
//! handles the nudge and applies it as one input, one commit. Reports queued after the take
//! find the queue empty and nudge again, so none waits for a nudge that never comes. Like a
//! message in a mailbox, a queued report is not durable: a crash loses it, and the parent's
//! recovery asks its children where they stand.

use std::collections::HashSet;

use dashmap::DashMap;

use crate::session::ChildReport;
use crate::types::ids::SessionId;

/// At most this many reports are applied in one commit: a larger fan-in is taken in turns,
/// so that one commit (and the parent's actor) is never held for long.
pub(crate) const MOST_PER_COMMIT: usize = 512;

/// One child's report: the call it answers, and where the child stands.
pub(crate) type Report = (String, ChildReport);

/// The reports waiting for each parent (see the module's documentation).
#[derive(Debug, Default)]
pub(crate) struct Reports {
    waiting: DashMap<SessionId, Vec<Report>>,
    /// How many times in a row each parent took reports it could not record.
    unrecorded: DashMap<SessionId, u32>,
}

/// How many times in a row a parent may take reports it cannot record before they are let
/// go (with the reconciliation of its children left to its next activation).
pub(crate) const MOST_UNRECORDED: u32 = 8;

impl Reports {
    /// Queues a report for `parent`; true when the parent must be nudged (its queue was
    /// empty, so no nudge is on its way).
    pub(crate) fn push(&self, parent: SessionId, report: Report) -> bool {
        let mut queue = self.waiting.entry(parent).or_default();
        queue.push(report);
        queue.len() == 1
    }

    /// Takes up to [`MOST_PER_COMMIT`] of the reports waiting for `parent`, oldest first, and
    /// whether more are left (the caller nudges the parent again for them).
    pub(crate) fn take(&self, parent: &SessionId) -> (Vec<Report>, bool) {
        let Some(mut queue) = self.waiting.get_mut(parent) else {
            return (Vec::new(), false);
        };
        if queue.len() <= MOST_PER_COMMIT {
            let taken = std::mem::take(&mut *queue);
            drop(queue);
            // Removed only if still empty: a report may have come in since the lock was let go.
            self.waiting.remove_if(parent, |_, queue| queue.is_empty());
            return (taken, false);
        }
        let rest = queue.split_off(MOST_PER_COMMIT);
        let taken = std::mem::replace(&mut *queue, rest);
        (taken, true)
    }

    /// Puts `reports`, taken for `parent` but not recorded (its commit failed), back in front
    /// of its queue, and answers how many times in a row that happened (the caller nudges the
    /// parent again, later each time); `None` after [`MOST_UNRECORDED`] times: the reports
    /// are let go instead.
    pub(crate) fn requeue(&self, parent: SessionId, mut reports: Vec<Report>) -> Option<u32> {
        let times = {
            let mut times = self.unrecorded.entry(parent.clone()).or_default();
            *times += 1;
            *times
        };
        if times > MOST_UNRECORDED {
            self.unrecorded.remove(&parent);
            tracing::error!(%parent, reports = reports.len(), "subagent.reports_unrecordable");
            return None;
        }
        let mut queue = self.waiting.entry(parent).or_default();
        reports.append(&mut queue);
        *queue = reports;
        Some(times)
    }

    /// Drops the reports waiting for `parent` from the children of `calls`, which it wakes:
    /// each answers its wake with where it stands then, and a report from before (one its
    /// commit failed to record, queued again) must not be taken for that answer, which would
    /// end the parent's resume while the child still goes on.
    pub(crate) fn superseded(&self, parent: &SessionId, calls: &HashSet<&str>) {
        if let Some(mut queue) = self.waiting.get_mut(parent) {
            queue.retain(|(call, _)| !calls.contains(call.as_str()));
        }
        self.waiting.remove_if(parent, |_, queue| queue.is_empty());
    }

    /// `parent` recorded the reports it took.
    pub(crate) fn recorded(&self, parent: &SessionId) {
        self.unrecorded.remove(parent);
    }

    /// Drops every report waiting for `parent`: it cannot hear them (its actor cannot be
    /// activated), as a report sent to it as a message would have been dropped.
    pub(crate) fn drop_all(&self, parent: &SessionId) {
        if let Some((_, dropped)) = self.waiting.remove(parent) {
            tracing::warn!(%parent, reports = dropped.len(), "subagent.reports_undeliverable");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::message::ToolOutcome;

    fn report(call: usize) -> Report {
        (
            format!("call-{call}"),
            ChildReport::Finished(ToolOutcome::Result(serde_json::json!(call))),
        )
    }

    #[test]
    fn only_a_report_into_an_empty_queue_nudges_and_a_take_empties_it() {
        let reports = Reports::default();
        let parent: SessionId = SessionId::generate();
        assert!(reports.push(parent.clone(), report(0)));
        assert!(!reports.push(parent.clone(), report(1)));
        let (taken, more) = reports.take(&parent);
        assert_eq!(taken.len(), 2);
        assert!(!more);
        assert_eq!(taken[0].0, "call-0");
        // Taken: the next report finds the queue empty, and nudges.
        assert!(reports.push(parent.clone(), report(2)));
        assert_eq!(reports.take(&parent).0.len(), 1);
        assert_eq!(reports.take(&parent), (Vec::new(), false));
        assert!(reports.waiting.is_empty(), "an empty queue is not kept");
    }

    #[test]
    fn a_wake_drops_the_reports_of_the_children_it_wakes_and_keeps_the_others() {
        let reports = Reports::default();
        let parent: SessionId = SessionId::generate();
        for call in 0..3 {
            reports.push(parent.clone(), report(call));
        }
        reports.superseded(&parent, &HashSet::from(["call-0", "call-2"]));
        let (kept, _) = reports.take(&parent);
        assert_eq!(kept, vec![report(1)]);
        reports.push(parent.clone(), report(4));
        reports.superseded(&parent, &HashSet::from(["call-4"]));
        assert!(reports.waiting.is_empty(), "an emptied queue is not kept");
        assert!(reports.push(parent, report(5)), "the next report nudges");
    }

    #[test]
    fn a_large_fan_in_is_taken_in_turns_oldest_first() {
        let reports = Reports::default();
        let parent: SessionId = SessionId::generate();
        for call in 0..MOST_PER_COMMIT + 3 {
            reports.push(parent.clone(), report(call));
        }
        let (first, more) = reports.take(&parent);
        assert_eq!(first.len(), MOST_PER_COMMIT);
        assert!(more, "the caller is told to nudge again");
        assert_eq!(first[0].0, "call-0");
        let (rest, more) = reports.take(&parent);
        assert_eq!(rest.len(), 3);
        assert!(!more);
        assert_eq!(rest[0].0, format!("call-{MOST_PER_COMMIT}"));
    }
}
