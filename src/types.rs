//! The vocabulary every other room speaks: identifiers, the conversation, what a session
//! stores and reports, usage, the codes of tool errors, the clock, and the bounds on what
//! comes in from outside. Imports nothing of the crate outside this folder.

pub mod clock;
pub mod hooks;
pub mod ids;
pub mod message;
pub(crate) mod nesting;
pub(crate) mod panic;
pub mod record;
pub mod remote;
pub mod stream;
pub mod tool_error;
pub(crate) mod untrusted;
pub mod usage;
