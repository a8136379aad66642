//! The process's limit on open files (`RLIMIT_NOFILE`): raised from its soft value to its
//! hard one at start, and the share of it connections may take.
//!
//! Through rustix's safe wrappers of `getrlimit`/`setrlimit` (already in the build under
//! tempfile), since the workspace forbids `unsafe` and libc's are unsafe to call.

/// The limit on open files before and after [`raise_fd_limit`]. `None` is unlimited (or, on a
/// platform without such limits, unknown).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdLimit {
    /// The soft limit it found.
    pub before: Option<u64>,
    /// The soft limit in force now.
    pub now: Option<u64>,
    /// The hard limit, which only a privileged process may raise.
    pub hard: Option<u64>,
}

/// Raises the process's soft limit on open files to its hard limit. Many systems start a
/// process with a soft limit of 1,024 (or 256) under a hard one of a million: a server left at
/// the soft one runs out of descriptors after a few hundred slow clients. The `dormant-server`
/// binary calls it at start; a daemon serving the router may call it too, or raise the limit
/// itself (`ulimit -n`, systemd's `LimitNOFILE=`).
///
/// # Errors
/// The system refused the new limit (the limit in force is unchanged).
pub fn raise_fd_limit() -> std::io::Result<FdLimit> {
    imp::raise()
}

/// How many connections the limit on open files leaves room for, after a reserve for the
/// store, the logs and outgoing calls: an eighth of the limit, at least 64. `None` when
/// unlimited or unknown.
pub(crate) fn connection_room() -> Option<u64> {
    let limit = imp::soft()?;
    Some(limit.saturating_sub((limit / 8).max(64)))
}

#[cfg(unix)]
mod imp {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

    use super::FdLimit;

    /// macOS refuses an unlimited soft limit on open files; its per-process ceiling is
    /// `OPEN_MAX`, 10,240, unless raised with sysctl.
    const FALLBACK: u64 = 10_240;

    pub(super) fn soft() -> Option<u64> {
        getrlimit(Resource::Nofile).current
    }

    pub(super) fn raise() -> std::io::Result<FdLimit> {
        let found = getrlimit(Resource::Nofile);
        let mut limit = FdLimit {
            before: found.current,
            now: found.current,
            hard: found.maximum,
        };
        let Some(current) = found.current else {
            return Ok(limit);
        };
        if found.maximum.is_some_and(|hard| hard <= current) {
            return Ok(limit);
        }
        let raise_to = |target: Option<u64>| {
            setrlimit(
                Resource::Nofile,
                Rlimit {
                    current: target,
                    maximum: found.maximum,
                },
            )
        };
        match raise_to(found.maximum) {
            Ok(()) => {}
            Err(error) => {
                let fallback = found.maximum.map_or(FALLBACK, |hard| hard.min(FALLBACK));
                if fallback <= current || raise_to(Some(fallback)).is_err() {
                    return Err(error.into());
                }
            }
        }
        limit.now = getrlimit(Resource::Nofile).current;
        Ok(limit)
    }
}

#[cfg(not(unix))]
mod imp {
    use super::FdLimit;

    pub(super) fn soft() -> Option<u64> {
        None
    }

    pub(super) fn raise() -> std::io::Result<FdLimit> {
        Ok(FdLimit {
            before: None,
            now: None,
            hard: None,
        })
    }
}
