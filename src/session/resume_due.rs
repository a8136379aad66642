//! A session's resume-due entry fell due: the automatic resume a crash (or anything else)
//! kept from running goes on now, or the entry, stale, goes. See `schema::RESUME_DUE`.

use super::apply_cx::ApplyCx;
use super::core::Session;
use crate::error::Error;
use crate::store::schema;
use crate::store::CommitKind;
use crate::types::ids::RunId;

impl Session {
    /// Resumes as the run `run_id` if the runtime still owes this session an automatic
    /// resume: it is idle, and [`Session::owes_itself_a_resume`]. The resume removes the
    /// entry. A session at work (the resume already under way, say) is left alone; any other
    /// removes the entry and stays as it is.
    ///
    /// # Errors
    /// As [`Session::resume`] (an aborted session is never suspended, so none in practice).
    pub(super) fn resume_due(&mut self, cx: &mut ApplyCx, run_id: RunId) -> Result<(), Error> {
        if self.is_busy() {
            return Ok(());
        }
        if self.owes_itself_a_resume(cx.now) {
            return self.resume(cx, run_id);
        }
        cx.staged.index.push(schema::resume_due_write(false));
        self.finish_entries(cx, CommitKind::Other);
        Ok(())
    }
}
