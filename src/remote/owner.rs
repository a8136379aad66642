//! The ownership entry of a call that lives on a remote: written on the local root by the
//! session that holds the remote child, when the child reports that it waits on the call, and
//! cleared when it no longer does. A submit at the root finds it with the same keyed read as
//! a local sub-agent's entry, and goes straight to the remote: no actor of this process is
//! involved in accepting the answer, as the remote makes it durable.

use serde::{Deserialize, Serialize};

use super::RemoteCall;
use crate::types::ids::SessionId;

/// Where a call under a local root lives when a remote child's tree owns it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct RemoteOwner {
    /// The local session whose call runs the remote child.
    pub(crate) via: SessionId,
    /// That call.
    pub(crate) parent_call: String,
    /// The remote's base URL.
    pub(crate) endpoint: String,
    /// The remote child: the root of the call's tree on the remote, where it is submitted.
    pub(crate) remote_root: SessionId,
    /// The call as the remote lists it.
    pub(crate) call: RemoteCall,
}

/// An ownership entry as stored: a local session's id (a plain string, as entries have always
/// been), or a remote owner (a map).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub(crate) enum Owner {
    /// A session of this runtime.
    Local(SessionId),
    /// A remote child's tree.
    Remote(Box<RemoteOwner>),
}
