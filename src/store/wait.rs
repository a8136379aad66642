//! Tests only: `.wait()` runs a future to its end on the calling thread.
//!
//! The store's reads are `async` for backends across a network; the embedded ones answer at
//! once, so a synchronous unit test (or a plain thread standing in for a reader) waits on them
//! with `futures::executor::block_on` instead of starting a tokio runtime.

use std::future::Future;

pub(crate) trait Wait: Future + Sized {
    fn wait(self) -> Self::Output {
        futures::executor::block_on(self)
    }
}

impl<F: Future> Wait for F {}
