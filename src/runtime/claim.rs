//! One store, one runtime. Two runtimes of one process on the same store would each take a
//! submit for the same call as `accepted` and each run the resume that follows, so an
//! approval-gated tool would run twice: building the second is refused. (Two processes cannot
//! share a sled directory at all: sled locks it.)

use std::sync::Arc;

use parking_lot::Mutex;

use super::build_error::BuildError;
use crate::store::Store;

/// The stores a runtime of this process holds, by address.
static CLAIMED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// A runtime's hold on its store, released when dropped.
#[derive(Debug)]
pub(super) struct StoreClaim {
    address: usize,
}

impl StoreClaim {
    /// Claims `store` for one runtime.
    ///
    /// # Errors
    /// [`BuildError::StoreInUse`] while another runtime of this process holds it.
    pub(super) fn take(store: &Arc<dyn Store>) -> Result<Self, BuildError> {
        let address = Arc::as_ptr(store).cast::<()>() as usize;
        let mut claimed = CLAIMED.lock();
        if claimed.contains(&address) {
            return Err(BuildError::StoreInUse);
        }
        claimed.push(address);
        Ok(Self { address })
    }
}

impl Drop for StoreClaim {
    fn drop(&mut self) {
        CLAIMED.lock().retain(|address| *address != self.address);
    }
}
