//! The engine that runs the core: the session actor on the `dormant-actors` host, the
//! deadline scheduler, the router of submits, the tool runner, and what they share.

pub(crate) mod actor;
pub(crate) mod deadlines;
pub(crate) mod dispatch;
pub(crate) mod landing;
pub(crate) mod metrics;
pub(crate) mod router;
pub(crate) mod scheduler;
pub(crate) mod shared;
