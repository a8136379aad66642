//! What a session's records hold of remote sub-agents: whom a remote child belongs to, where a
//! remote child lives, and when its parent looks at it by itself. The transport and the driver
//! are `crate::remote`; these are here, below the records (record.rs), which store them.

use serde::{Deserialize, Serialize};

use crate::types::ids::SessionId;

/// What an endpoint that speaks A2A starts with (`a2a+http://…`, `a2a+https://…`): the
/// protocol named in the endpoint recorded with the child, so a transport knows it from the
/// record alone, after any crash ([`ToolDefinition::a2a_agent`](crate::ToolDefinition::a2a_agent)).
pub const A2A_SCHEME: &str = "a2a+";

/// The A2A agent's URL, for an endpoint that speaks A2A ([`A2A_SCHEME`]).
///
/// ```
/// use dormant::remote::a2a_url;
/// assert_eq!(a2a_url("a2a+http://127.0.0.1:9999"), Some("http://127.0.0.1:9999"));
/// assert_eq!(a2a_url("http://127.0.0.1:8080"), None);
/// ```
pub fn a2a_url(endpoint: &str) -> Option<&str> {
    endpoint.strip_prefix(A2A_SCHEME)
}

/// Whom a remote child belongs to: sent with its start by the parent's server, and recorded
/// with the child on the remote, which then gives it a local child's rules (its parent starts
/// its turns; answers for its calls are given at the root, which forwards them).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteParent {
    /// The parent session (on the parent's server).
    pub parent: SessionId,
    /// The root of the parent's tree (on the parent's server), where its calls are answered.
    pub root: SessionId,
    /// The W3C `traceparent` of the parent's run that made the call (its `invoke_agent` span,
    /// with the `otel` feature; the remote protocol carries it in the header of that name):
    /// the child's runs link to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

/// Where a remote child lives, recorded in its parent's child entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteChild {
    /// The base URL of the dormant server that hosts it.
    pub endpoint: String,
    /// The agent it runs there.
    pub agent: String,
}

/// When a parent looks at a remote child by itself, with nobody asking it to, and why. The
/// look is an entry of the parent's deadline index, so it survives a restart like any
/// deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteLook {
    /// When (the parent's clock, ms).
    pub at_ms: u64,
    /// Why.
    pub why: LookReason,
}

/// Why a parent looks at a remote child by itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LookReason {
    /// The first of the calls the child waits on falls due at `due_ms` (the remote's clock):
    /// a timeout there settles the child (and with `auto_resume` it goes on), and the parent
    /// learns of it by looking then. While the child still waits past it (the two clocks
    /// differ, the remote's scheduler is late), it looks again after a growing wait.
    Deadline {
        /// The remote's clock, ms.
        due_ms: u64,
    },
    /// The remote has not answered since `since_ms` (the parent's clock): try again, and
    /// with `wake`, resume the child as a resume of the parent asked.
    Unreachable {
        /// The parent's clock, ms.
        since_ms: u64,
        /// A resume of the parent still has to reach the child.
        wake: bool,
    },
}
