//! The open-files limit, and the connection cap it allows.

/// File descriptors kept free of connections when the cap is derived from the open-files
/// limit: what the process keeps open besides (an engine's model and tokenizer files, a
/// control API and its clients, a trace exporter, the runtime's own), and connections
/// being closed to make room.
pub const FD_RESERVE: u64 = 128;

/// The connection cap in effect: `requested`, lowered to the open-files limit minus
/// [`FD_RESERVE`] (at least 1) when that is smaller, since accepting past the limit fails
/// and a server out of descriptors cannot open anything else either.
pub fn effective_cap(requested: usize, open_files_limit: Option<u64>) -> usize {
    match open_files_limit {
        Some(limit) => {
            let room = limit.saturating_sub(FD_RESERVE).max(1);
            requested.min(usize::try_from(room).unwrap_or(usize::MAX))
        }
        None => requested,
    }
}

/// The soft open-files limit of this process, if it has one.
pub fn open_files_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit only writes the struct it is given.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0
            && rl.rlim_cur != libc::RLIM_INFINITY
        {
            return Some(rl.rlim_cur);
        }
        None
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// Raises the soft open-files limit to the hard limit, as Go's runtime does at start: the
/// soft limit is often 1024 while the hard one allows far more, and an unprivileged
/// process may raise its own soft limit that far. Returns the soft limit afterwards.
pub fn raise_open_files_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit only read and write the struct they are given.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) == 0 && rl.rlim_cur < rl.rlim_max {
                let raised = libc::rlimit {
                    rlim_cur: rl.rlim_max,
                    rlim_max: rl.rlim_max,
                };
                // Refused on some systems (macOS beyond OPEN_MAX): the old limit stays.
                let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &raised);
            }
        }
    }
    open_files_limit()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_room_under_the_open_files_limit() {
        assert_eq!(effective_cap(4096, None), 4096);
        assert_eq!(effective_cap(4096, Some(1 << 20)), 4096);
        assert_eq!(effective_cap(4096, Some(1024)), 1024 - FD_RESERVE as usize);
        assert_eq!(effective_cap(100, Some(1024)), 100);
        assert_eq!(effective_cap(4096, Some(10)), 1, "never zero");
    }
}
