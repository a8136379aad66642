//! The sled backend's own failures, which reach callers inside [`Error::Backend`].

use std::io;

use crate::store::Error;

/// A failure of the sled backend that none of [`Error`]'s own variants names: sled's errors,
/// a file operation of the power-loss sync, a store of an older layout. It reaches a caller
/// as [`Error::Backend`]; find it with [`Error::downcast_ref`]:
///
/// ```no_run
/// use dormant::SledStore;
/// use dormant::store::SledError;
///
/// match SledStore::open("/var/lib/my-agent/store") {
///     Err(error) => match error.downcast_ref::<SledError>() {
///         Some(SledError::OldLayout { tree }) => eprintln!("an older store (tree {tree})"),
///         _ => eprintln!("{error}"),
///     },
///     Ok(store) => println!("opened {store:?}"),
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SledError {
    /// The embedded database failed.
    #[error("sled: {0}")]
    Sled(::sled::Error),
    /// A file operation (the power-loss sync) failed.
    #[error("store i/o: {0}")]
    Io(io::Error),
    /// The store directory was written by an older dormant whose layout this build cannot
    /// read.
    #[error("the store was written by an older dormant (it has a non-empty `{tree}` tree); this build keeps every record in the one `records` tree and cannot read it: open a new store directory")]
    OldLayout {
        /// A sled tree of an earlier layout found in the store.
        tree: String,
    },
}

impl SledError {
    /// A copy, for every commit that waited on the same failed flush (`io::Error` is not
    /// `Clone`: a copy keeps its kind and text).
    pub(in crate::store) fn duplicate(&self) -> SledError {
        match self {
            SledError::Sled(error) => SledError::Sled(error.clone()),
            SledError::Io(error) => SledError::Io(io::Error::new(error.kind(), error.to_string())),
            SledError::OldLayout { tree } => SledError::OldLayout { tree: tree.clone() },
        }
    }

    /// The I/O error's kind, if the failure is one (sled's or a file operation's).
    pub(super) fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            SledError::Sled(::sled::Error::Io(error)) | SledError::Io(error) => Some(error.kind()),
            _ => None,
        }
    }
}

// Written by hand rather than with `#[from]`, which would also make the wrapped error the
// `source` and have it printed twice (see [`Error`]).
impl From<SledError> for Error {
    fn from(error: SledError) -> Self {
        Error::Backend(Box::new(error))
    }
}

/// Only sled's own code makes a `sled::Error`, so this conversion is the sled backend's.
impl From<::sled::Error> for Error {
    fn from(error: ::sled::Error) -> Self {
        SledError::Sled(error).into()
    }
}

/// A file operation's failure, as [`SledError::Io`]. Not a `From` impl: a conversion of every
/// `io::Error` into the sled backend's error would apply in every backend's code.
pub(super) fn io_error(error: io::Error) -> Error {
    SledError::Io(error).into()
}
