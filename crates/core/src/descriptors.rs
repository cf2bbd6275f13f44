//! Open descriptors never reach a sandbox.
//!
//! Rust opens everything close-on-exec, but the daemon may inherit descriptors
//! that are not (a supervisor's log pipe, a wrapper script's redirections), and C
//! code may open some. A descriptor passed on to a sandbox's server or `exec`
//! code would let untrusted code read or write what root opened, so every one
//! past stdin, stdout and stderr is marked close-on-exec: once when the daemon
//! starts, and again in every contained child just before it runs its program.

/// Marks every descriptor from 3 up close-on-exec. Only async-signal-safe
/// system calls and no allocation, so it may run between fork and exec.
pub fn close_on_exec_from_3() -> std::io::Result<()> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets descriptor flags.
    let done = unsafe {
        nix::libc::syscall(nix::libc::SYS_close_range, 3u32, u32::MAX, nix::libc::CLOSE_RANGE_CLOEXEC)
    };
    if done == 0 {
        return Ok(());
    }
    // Kernels before 5.11: one descriptor at a time, up to the open-files limit.
    let limit = match nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE) {
        Ok((soft, _)) => soft.min(1 << 20) as i32,
        Err(_) => 1024,
    };
    for fd in 3..limit {
        // SAFETY: fcntl on a descriptor that may not be open only fails with EBADF.
        unsafe {
            let flags = nix::libc::fcntl(fd, nix::libc::F_GETFD);
            if flags >= 0 {
                nix::libc::fcntl(fd, nix::libc::F_SETFD, flags | nix::libc::FD_CLOEXEC);
            }
        }
    }
    Ok(())
}

/// Lifts the soft limit on open files to the hard one: the listeners' caps
/// assume thousands of descriptors, and the usual soft default is 1024.
pub fn raise_descriptor_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::warn!(soft, hard, error = %e, "could not raise the open-files limit");
            }
        }
        _ => {}
    }
}
