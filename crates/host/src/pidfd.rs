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
//!
//! Where the kernel gives no pidfd (before Linux 5.3, or a seccomp policy
//! that refuses `pidfd_open`), the process is held by its pid alone and
//! watched through `/proc` (a zombie counts as exited): the old way, with
//! its small pid-reuse window.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use nix::libc;
use nix::sys::signal::Signal;

/// One process, held for as long as this value lives.
#[derive(Debug)]
pub struct Pidfd {
    /// `None` where the kernel gives no pidfd: then watched by pid.
    fd: Option<OwnedFd>,
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
                // No such process; or a thread's id, not a process's (and
                // so not the server anyone asked about).
                Some(libc::ESRCH) | Some(libc::EINVAL) | Some(libc::ENOENT) => Ok(None),
                // No pidfds here: watched by pid, if it lives.
                Some(libc::ENOSYS) | Some(libc::EPERM) => {
                    Ok(running_by_proc(pid).then_some(Pidfd { fd: None, pid }))
                }
                _ => Err(e),
            };
        }
        // SAFETY: the syscall returned a descriptor this process now owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        Ok(Some(Pidfd { fd: Some(fd), pid }))
    }

    /// Whether the process has exited (a zombie has).
    pub fn exited(&self) -> bool {
        let Some(fd) = &self.fd else { return !running_by_proc(self.pid) };
        let mut poll = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, no waiting.
        let n = unsafe { libc::poll(&mut poll, 1, 0) };
        n > 0 && poll.revents & (libc::POLLIN | libc::POLLHUP) != 0
    }

    /// Sends `signal` to this process and no other; a process that has exited
    /// is not signalled (and that is not an error).
    pub fn signal(&self, signal: Signal) -> io::Result<()> {
        let Some(fd) = &self.fd else {
            return match nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid), signal) {
                Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
                Err(e) => Err(e.into()),
            };
        };
        // SAFETY: a pidfd this value owns, a signal number, no siginfo, no flags.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd.as_raw_fd(),
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
    /// The wait is the kernel's wake-up, not a poll of `/proc` (but where
    /// there is no pidfd, or the runtime's reactor refuses it).
    pub async fn exits_within(&self, limit: Duration) -> bool {
        if self.exited() {
            return true;
        }
        let registered = self.fd.as_ref().and_then(|fd| fd.try_clone().ok()).and_then(|fd| {
            // SAFETY: the AsyncFd owns a descriptor of its own (a duplicate of
            // this pidfd), open until the AsyncFd drops it, and an OwnedFd's
            // raw descriptor never changes.
            unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
                .ok()
        });
        let Some(ready) = registered else { return self.exited_by_polling(limit).await };
        matches!(tokio::time::timeout(limit, ready.readable()).await, Ok(Ok(_))) || self.exited()
    }

    /// The same wait by polling.
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

/// Whether `pid` is a process that has not exited, by `/proc`; "could not
/// look" counts as running, so a waiter keeps waiting.
fn running_by_proc(pid: i32) -> bool {
    airlock_core::process::running(pid).unwrap_or(true)
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

    #[tokio::test]
    async fn without_a_pidfd_a_process_is_watched_by_its_pid() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let held = Pidfd { fd: None, pid: child.id() as i32 };
        assert!(!held.exits_within(Duration::from_millis(30)).await);
        held.signal(Signal::SIGKILL).unwrap();
        assert!(held.exits_within(Duration::from_secs(5)).await, "a zombie counts as exited");
        child.wait().unwrap();
    }

    #[test]
    fn a_thread_is_not_a_process() {
        let tid = std::thread::spawn(|| nix::unistd::gettid().as_raw()).join().unwrap();
        // (The thread has ended; a live one's id is refused the same way.)
        assert!(Pidfd::open(tid).unwrap().is_none());
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(nix::unistd::gettid().as_raw()).unwrap();
            let _ = stopped.recv();
        });
        assert!(Pidfd::open(rx.recv().unwrap()).unwrap().is_none(), "a live thread's id");
        stop.send(()).unwrap();
        t.join().unwrap();
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
