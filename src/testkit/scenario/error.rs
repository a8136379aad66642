//! Why a scenario file could not be run at all (as opposed to a step that failed, which a
//! [`FileReport`](super::FileReport) records).

use std::path::PathBuf;

/// A scenario file that could not be read, parsed or set up. Every variant names the file;
/// format errors also name the JSON path (`steps[0].expect.stauts`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file (or a directory given to run) could not be read.
    #[error("{}: cannot read: {source}", .file.display())]
    Read {
        /// The file or directory.
        file: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid JSON, has an unknown field or op, a value of the wrong type, or
    /// names an agent or tool it does not define.
    #[error("{}: {path}: {message}", .file.display())]
    Format {
        /// The file.
        file: PathBuf,
        /// The JSON path of the offending value (`.` for the whole document).
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// The runtime refused one of the file's top-level agents (a refusal meant as a test is a
    /// `define` step instead).
    #[error("{}: {path}: the runtime refused the agent: {source}", .file.display())]
    Agent {
        /// The file.
        file: PathBuf,
        /// The JSON path of the agent (`agents[1]`).
        path: String,
        /// The refusal.
        #[source]
        source: Box<crate::BuildError>,
    },
    /// The temporary directory for the file's store could not be created.
    #[error("{}: cannot create a temporary directory: {source}", .file.display())]
    TempDir {
        /// The file.
        file: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A directory given to run holds no `*.json` file: a mistyped or emptied directory must
    /// not pass as "nothing failed".
    #[error("{}: no *.json scenario files in this directory", .file.display())]
    NoScenarios {
        /// The directory.
        file: PathBuf,
    },
    /// The file marks agents `remote`, and the runner was given no [`RemoteHost`](super::RemoteHost)
    /// to serve them (`dormant-server`'s tests run those files), or it could not serve them.
    #[error("{}: remote agents: {reason}", .file.display())]
    Remote {
        /// The file.
        file: PathBuf,
        /// Why.
        reason: String,
    },
    /// The store or the runtime could not be opened for the file.
    #[error("{}: cannot open the runtime: {source}", .file.display())]
    Runtime {
        /// The file.
        file: PathBuf,
        /// Why the runtime could not be built.
        #[source]
        source: Box<crate::BuildError>,
    },
}

impl Error {
    /// The file the error is about.
    pub fn file(&self) -> &std::path::Path {
        match self {
            Error::Read { file, .. }
            | Error::Format { file, .. }
            | Error::Agent { file, .. }
            | Error::TempDir { file, .. }
            | Error::NoScenarios { file }
            | Error::Remote { file, .. }
            | Error::Runtime { file, .. } => file,
        }
    }
}
