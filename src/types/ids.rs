//! Identifiers: newtypes with private fields, `Display`/`FromStr`, and serde through strings.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The longest session id accepted, in bytes (ids are keys in every tree of the store).
pub const MAX_SESSION_ID_LEN: usize = 512;

/// The identity of a session: server-issued (a uuid v7) or chosen by the caller.
///
/// ```
/// use dormant::SessionId;
/// let id: SessionId = "support-42".parse()?;
/// assert_eq!(id.as_str(), "support-42");
/// assert!("".parse::<SessionId>().is_err());
/// # Ok::<(), dormant::types::InvalidId>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(Arc<str>);

/// Why a string is not a valid id.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidId {
    /// The id is empty.
    #[error("an id may not be empty")]
    Empty,
    /// The id is longer than [`MAX_SESSION_ID_LEN`].
    #[error("an id may be at most {MAX_SESSION_ID_LEN} bytes, this one has {0}")]
    TooLong(usize),
    /// The id holds a control character.
    #[error("an id may not contain control characters")]
    ControlCharacter,
}

impl SessionId {
    /// A new server-issued id: a uuid v7, so ids sort by creation time.
    pub fn generate() -> Self {
        Self(Arc::from(uuid::Uuid::now_v7().to_string()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id's shared text (a reference count, no copy).
    pub(crate) fn shared(&self) -> Arc<str> {
        Arc::clone(&self.0)
    }

    /// The id of the ephemeral sub-agent that tool call `tool_call_id` of this session starts.
    pub fn ephemeral_child(&self, tool_call_id: &str) -> Self {
        Self(Arc::from(format!("{}-sub-{tool_call_id}", self.0)))
    }

    /// The id of this session's persistent sub-agent `name`.
    pub fn persistent_child(&self, name: &str) -> Self {
        Self(Arc::from(format!("{}-agent-{name}", self.0)))
    }
}

impl FromStr for SessionId {
    type Err = InvalidId;

    fn from_str(text: &str) -> Result<Self, InvalidId> {
        if text.is_empty() {
            return Err(InvalidId::Empty);
        }
        if text.len() > MAX_SESSION_ID_LEN {
            return Err(InvalidId::TooLong(text.len()));
        }
        if text.chars().any(char::is_control) {
            return Err(InvalidId::ControlCharacter);
        }
        Ok(Self(Arc::from(text)))
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionId({})", self.0)
    }
}

impl Serialize for SessionId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for SessionId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The identity of one run (one `execute` or `resume`): a uuid v7.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RunId(uuid::Uuid);

impl RunId {
    /// The run id of an outcome of a session that has had no run yet (the nil uuid).
    pub const NONE: RunId = RunId(uuid::Uuid::nil());

    /// A new run id.
    pub fn generate() -> Self {
        Self(uuid::Uuid::now_v7())
    }

    /// Its 16 bytes (what a run's trace and span ids are derived from, with the `otel`
    /// feature).
    pub fn as_bytes(&self) -> &[u8; 16] {
        self.0.as_bytes()
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RunId({})", self.0)
    }
}

impl FromStr for RunId {
    type Err = uuid::Error;

    fn from_str(text: &str) -> Result<Self, uuid::Error> {
        text.parse().map(Self)
    }
}
