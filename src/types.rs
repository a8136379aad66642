//! The vocabulary every other room speaks: identifiers, the conversation, what a session
//! stores and reports, usage, the codes of tool errors, the clock, and the bounds on what
//! comes in from outside. Imports nothing of the crate outside this folder.
//!
//! Public as the vocabulary beyond the crate root's front door: the records and stream
//! details the [`Runtime`](crate::Runtime)'s reads return, usage, hooks' events, the codes.

pub(crate) mod checkpoint;
pub(crate) mod clock;
pub(crate) mod fork_origin;
pub(crate) mod hooks;
pub(crate) mod ids;
pub(crate) mod inbox;
pub(crate) mod message;
pub(crate) mod nesting;
pub(crate) mod panic;
pub(crate) mod record;
pub(crate) mod remote;
pub(crate) mod stream;
pub(crate) mod tool_error;
pub(crate) mod untrusted;
pub(crate) mod usage;

// The vocabulary beyond the front door, one path a name: the files above are this room's
// layout, not its API. What a daemon author uses every day (`SessionId`, `RunId`, `Message`,
// `ToolCall`, `Status`, `PendingKind`, `Chunk`, `StreamEvent`, `Hooks`, the clocks) is
// re-exported at the crate root instead, and a remote parent's or child's record in `remote`.
pub use self::checkpoint::{
    Checkpoint, CheckpointId, Compaction, ForkAnswer, ForkError, ForkOptions, ForkOrigin,
    PastState, Retention, StateAt,
};
pub use self::clock::Clock;
pub use self::hooks::{HookEvent, NoHooks};
pub use self::ids::{InvalidId, MAX_SESSION_ID_LEN};
pub use self::inbox::{Inbox, InboxCursor, InboxFilter, InboxItem, ToolInfo};
pub use self::message::ToolOutcome;
pub use self::record::{
    Answer, ChildCall, ChildState, Companion, CompanionStatus, ErrorCode, PendingCall, RunError,
    RunRecord, SessionRecord, Suspension,
};
pub use self::stream::{ChunkKind, Delta, DeltaKind};
pub use self::tool_error::ToolErrorCode;
pub use self::untrusted::{Untrusted, UNTRUSTED_LOG_BYTES};
pub use self::usage::{RunUsage, Usage, UsageEntry};
