//! Process limits set at start: the descriptor limit (nginx `worker_rlimit_nofile`).

/// Descriptor limits before and after [`raise_nofile`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NofileLimits {
    /// Soft limit the process started with.
    pub before: u64,
    /// Soft limit now in effect.
    pub soft: u64,
    /// Hard limit (the most the soft limit can be raised to without privileges).
    pub hard: u64,
}

/// Raise `RLIMIT_NOFILE`'s soft limit to its hard limit. Every client connection costs one
/// descriptor and every proxied request usually a second one upstream; the common default soft
/// limit of 1024 would otherwise run out long before `max_connections`.
// `rlim_t` is u64 on Linux but not on every platform libc supports: keep the casts.
#[allow(clippy::unnecessary_cast)]
pub fn raise_nofile() -> std::io::Result<NofileLimits> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let before = lim.rlim_cur as u64;
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        lim = raised;
    }
    Ok(NofileLimits {
        before,
        soft: lim.rlim_cur as u64,
        hard: lim.rlim_max as u64,
    })
}
