//! A process held by a pidfd: its end is seen the moment it happens, whoever
//! reaps it, and a signal sent through it never reaches another process.
//!
//! The daemon stops servers it did not start: after a restart a sandbox's
//! server is a child of pid 1, which may reap it seconds later (a zombie
//! until then), and its pid may be used again by any process once reaped.
//! Polling `/proc/PID` can mistake a zombie for a live server, or a new
//! process for the old one. A pidfd refers to one process for good: it
//! reads as ready once that process has exited, reaped or not, and
//! `pidfd_send_signal` through it fails rather than signal a stranger.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use nix::libc;
use nix::sys::signal::Signal;

/// One process, held for as long as this value lives.
#[derive(Debug)]
pub struct Pidfd {
    fd: OwnedFd,
    pid: i32,
}

impl Pidfd {
    /// Holds process `pid`; `Ok(None)` when there is no such process (it was
    /// reaped already). A caller that checked who `pid` is must check again
    /// after this, since the pid may have been used again in between.
    pub fn open(pid: i32) -> io::Result<Option<Pidfd>> {
        if pid <= 0 {
            return Ok(None);
        }
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor
        // (close-on-exec by definition) or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ESRCH) => Ok(None),
                _ => Err(e),
            };
        }
        // SAFETY: the syscall returned a descriptor this process now owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        Ok(Some(Pidfd { fd, pid }))
    }

    /// The pid it was opened for.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Whether the process has exited (a zombie has).
    pub fn exited(&self) -> bool {
        let mut poll = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, no waiting.
        let n = unsafe { libc::poll(&mut poll, 1, 0) };
        n > 0 && poll.revents & (libc::POLLIN | libc::POLLHUP) != 0
    }

    /// Sends `signal` to this process and no other; a process that has exited
    /// is not signalled (and that is not an error).
    pub fn signal(&self, signal: Signal) -> io::Result<()> {
        // SAFETY: a pidfd this value owns, a signal number, no siginfo, no flags.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.fd.as_raw_fd(),
                signal as libc::c_int,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        match r {
            0 => Ok(()),
            _ => match io::Error::last_os_error() {
                e if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
                e => Err(e),
            },
        }
    }

    /// Waits until the process has exited, at most `limit`; whether it did.
    /// The wait is the kernel's wake-up, not a poll of `/proc`.
    pub async fn exits_within(&self, limit: Duration) -> bool {
        if self.exited() {
            return true;
        }
        let registered = self.fd.try_clone().ok().and_then(|fd| {
            // SAFETY: the AsyncFd owns a descriptor of its own (a duplicate of
            // this pidfd), open until the AsyncFd drops it, and an OwnedFd's
            // raw descriptor never changes.
            unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
                .ok()
        });
        let Some(ready) = registered else { return self.exited_by_polling(limit).await };
        matches!(tokio::time::timeout(limit, ready.readable()).await, Ok(Ok(_))) || self.exited()
    }

    /// The same wait without the reactor (outside a runtime's I/O driver).
    async fn exited_by_polling(&self, limit: Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        let mut wait = Duration::from_micros(500);
        while !self.exited() {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_millis(10));
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[tokio::test]
    async fn an_exited_child_counts_as_exited_before_it_is_reaped() {
        let mut child = Command::new("sleep").arg("0.2").spawn().unwrap();
        let pidfd = Pidfd::open(child.id() as i32).unwrap().unwrap();
        assert!(!pidfd.exited());
        assert!(pidfd.exits_within(Duration::from_secs(5)).await);
        // Not reaped yet: a zombie, which /proc still lists.
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap();
        assert!(stat.rsplit_once(')').unwrap().1.trim_start().starts_with('Z'), "{stat}");
        child.wait().unwrap();
        assert!(pidfd.exited(), "still exited once reaped");
        // Signalling a reaped process through its pidfd reaches nobody.
        pidfd.signal(Signal::SIGKILL).unwrap();
    }

    #[tokio::test]
    async fn a_live_process_is_waited_for_and_signalled() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pidfd = Pidfd::open(child.id() as i32).unwrap().unwrap();
        assert!(!pidfd.exits_within(Duration::from_millis(50)).await);
        pidfd.signal(Signal::SIGTERM).unwrap();
        assert!(pidfd.exits_within(Duration::from_secs(5)).await);
        child.wait().unwrap();
    }

    #[test]
    fn a_pid_with_no_process_opens_nothing() {
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        assert!(Pidfd::open(pid).unwrap().is_none());
        assert!(Pidfd::open(0).unwrap().is_none());
    }
}
