//! A gate contained children wait at until the daemon says whether to go
//! on: once in their cgroups, before they run their program or in it.
//!
//! Joining a cgroup can be slow for no work of the child's own: a write to
//! `cgroup.procs` waits for an RCU grace period (5 to 30 ms on a small
//! virtual machine) where moves are not favored ([`crate::cgroup_moves`]).
//! A fork's server can join its cgroups while the daemon clones the files it
//! will run on, and wait here until they are there: the two waits overlap
//! instead of adding up.
//!
//! A child waits either before it runs its program ([`Pass::wait`]) or in
//! it, before the program's own code runs ([`Pass::hand_over`]: a fork's
//! contained PostgreSQL server, whose in-server guard the child preloads, so
//! the loader's linking of the server's libraries, and their constructors,
//! run while the daemon clones; the server's own code runs only after).
//!
//! The children and the daemon share one pipe: each waiting child reads one
//! byte, `g` to go on or `x` to give up (its spawn then fails, or its program
//! exits). The daemon
//! writes one byte per child that enlisted, so a child never depends on any
//! other process closing its copy of the pipe. A child enlisted after the
//! gate was decided does not wait at all, or is refused if it was shut.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The gate, shared by the daemon's tasks that spawn children behind it.
pub struct Gate {
    read: OwnedFd,
    write: OwnedFd,
    state: Mutex<State>,
    decided: tokio::sync::watch::Sender<Option<bool>>,
}

/// What the daemon's side counts; whether the gate is decided, and how, is
/// the `decided` channel's value, changed under this state's lock.
#[derive(Default)]
struct State {
    waiting: usize,
    opened_at: Option<Instant>,
}

/// What one child waits on: the pipe's two ends, as raw descriptors (copied
/// into the child by fork), and the daemon's pid.
#[derive(Clone, Copy, Debug)]
pub struct Pass {
    read: RawFd,
    write: RawFd,
    daemon: i32,
}

impl Gate {
    /// A closed gate.
    pub fn new() -> io::Result<Arc<Gate>> {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let (decided, _) = tokio::sync::watch::channel(None);
        Ok(Arc::new(Gate { read, write, state: Mutex::default(), decided }))
    }

    /// Enlists a child about to be spawned: what it waits on, `None` when the
    /// gate is open already (it need not wait), or an error when it was shut.
    pub fn enlist(&self) -> io::Result<Option<Pass>> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let decided = *self.decided.borrow();
        match decided {
            Some(true) => Ok(None),
            Some(false) => Err(shut()),
            None => {
                state.waiting += 1;
                Ok(Some(Pass {
                    read: self.read.as_raw_fd(),
                    write: self.write.as_raw_fd(),
                    daemon: std::process::id() as i32,
                }))
            }
        }
    }

    /// Lets every child waiting, and any enlisted later, go on.
    pub fn open(&self) {
        self.decide(true);
    }

    /// Sends every child waiting away (their spawns fail), and refuses any
    /// enlisted later. Nothing once the gate is decided.
    pub fn shut(&self) {
        self.decide(false);
    }

    fn decide(&self, go: bool) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if self.decided.borrow().is_some() {
            return;
        }
        if go {
            state.opened_at = Some(Instant::now());
        }
        let bytes = vec![if go { b'g' } else { b'x' }; state.waiting];
        // One byte per waiting child; a pipe holds 64 KiB, so this never blocks.
        let mut written = 0;
        while written < bytes.len() {
            match nix::unistd::write(&self.write, &bytes[written..]) {
                Ok(n) => written += n,
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => {
                    tracing::error!(error = %e, "could not signal the children at a gate");
                    break;
                }
            }
        }
        self.decided.send_replace(Some(go));
    }

    /// When the gate was opened, if it was.
    pub fn opened_at(&self) -> Option<Instant> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).opened_at
    }

    /// Waits until the gate is decided (for work in the daemon that must come
    /// after what the gate waits for); an error when it was shut.
    pub async fn passed(&self) -> io::Result<()> {
        let mut decided = self.decided.subscribe();
        match decided.wait_for(Option::is_some).await.map(|d| *d) {
            Ok(Some(true)) => Ok(()),
            _ => Err(shut()),
        }
    }
}

/// Shuts a gate that is dropped undecided: a daemon task that failed (or was
/// cancelled) before opening it never leaves a child waiting.
pub struct Opener(pub Arc<Gate>);

impl Drop for Opener {
    fn drop(&mut self) {
        self.0.shut();
    }
}

/// Where a contained child waits at its gate.
#[derive(Clone, Copy, Debug)]
pub enum Waiting {
    /// Before it enters its namespaces ([`Pass::wait`]).
    BeforeExec(Pass),
    /// In its program, which preloads a library that waits ([`Pass::hand_over`]).
    InProgram(Pass),
}

/// The descriptor a program waiting in itself ([`Pass::hand_over`]) reads its
/// gate's word from.
pub const PROGRAM_FD: RawFd = 3;

/// The variable that names [`PROGRAM_FD`] to the library that waits in the
/// program (the in-server guard's constructor).
pub const PROGRAM_FD_VARIABLE: &str = "AIRLOCK_GATE_FD";

/// The variable that names the daemon's pid to that library: a program
/// whose parent is another by the time it has the daemon's word (the
/// daemon died just after giving it) does not go on.
pub const PARENT_VARIABLE: &str = "AIRLOCK_GATE_PARENT";

impl Pass {
    /// In the child, as the last step before exec: hands the pipe's read end
    /// to the program as [`PROGRAM_FD`], for a library it preloads to wait on
    /// before the program's own code runs. The program is mapped and linked
    /// while the daemon clones its files. Once it runs its program the child
    /// holds no other descriptor of the daemon's, so the daemon's end closing
    /// (it died) is an end of file, and no `getppid` watch is needed. Only
    /// `close`, `dup2` and `fcntl`, all async-signal-safe; call it after
    /// everything that uses a descriptor of its own, which it may replace.
    pub fn hand_over(self) -> io::Result<()> {
        use nix::libc;
        let done = |rc: libc::c_int| match rc {
            -1 => Err(io::Error::last_os_error()),
            _ => Ok(()),
        };
        // SAFETY: descriptors inherited from the daemon, in the child's own table.
        unsafe {
            if self.write != PROGRAM_FD {
                let _ = libc::close(self.write);
            }
            match self.read == PROGRAM_FD {
                // dup2 onto itself keeps close-on-exec set.
                true => done(libc::fcntl(PROGRAM_FD, libc::F_SETFD, 0)),
                false => done(libc::dup2(self.read, PROGRAM_FD)),
            }
        }
    }

    /// In the child, between fork and exec: waits for the daemon's word.
    /// Gives up when the daemon is gone (its parent is then another process):
    /// the child holds copies of every descriptor the daemon had (another
    /// gate's pipe, the data root's lock) until it runs its program, so no
    /// end of file would ever come, and a child left waiting would keep the
    /// next daemon from starting. Only `close`, `poll`, `read` and
    /// `getppid`, all async-signal-safe.
    pub fn wait(self) -> io::Result<()> {
        use nix::libc;
        // The child's copy of the write end goes first: it is the daemon's to write.
        let _ = nix::unistd::close(self.write);
        let mut byte = [0u8; 1];
        loop {
            let mut ready = libc::pollfd { fd: self.read, events: libc::POLLIN, revents: 0 };
            // SAFETY: one pollfd on a descriptor inherited from the daemon.
            let polled = unsafe { libc::poll(&mut ready, 1, 100) };
            // SAFETY: getppid has no arguments and cannot fail.
            if unsafe { libc::getppid() } != self.daemon {
                return Err(shut());
            }
            if polled == 0 || (polled < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)) {
                continue;
            }
            // SAFETY: a descriptor inherited from the daemon, read into a local buffer.
            let n = unsafe { libc::read(self.read, byte.as_mut_ptr().cast(), 1) };
            match n {
                1 if byte[0] == b'g' => return Ok(()),
                -1 if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) => {}
                _ => return Err(shut()),
            }
        }
    }
}

/// The error of a spawn sent away at a shut gate: `ECANCELED`, the one thing
/// a child can tell its parent before exec.
fn shut() -> io::Error {
    io::Error::from_raw_os_error(nix::libc::ECANCELED)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    fn spawn_behind(gate: &Gate) -> std::io::Result<std::process::Child> {
        let pass = gate.enlist()?;
        let mut cmd = Command::new("true");
        // SAFETY: Pass::wait makes only async-signal-safe calls.
        unsafe {
            cmd.pre_exec(move || pass.map_or(Ok(()), Pass::wait));
        }
        cmd.spawn()
    }

    #[tokio::test]
    async fn children_wait_until_the_gate_opens_and_each_goes_on() {
        let gate = Gate::new().unwrap();
        let spawning: Vec<_> = (0..3)
            .map(|_| {
                let gate = gate.clone();
                std::thread::spawn(move || spawn_behind(&gate))
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(spawning.iter().all(|t| !t.is_finished()), "a spawn went on before the gate opened");
        gate.open();
        for t in spawning {
            assert!(t.join().unwrap().unwrap().wait().unwrap().success());
        }
        gate.passed().await.unwrap();
        // Enlisted once open: no wait.
        assert!(spawn_behind(&gate).unwrap().wait().unwrap().success());
        assert!(gate.opened_at().is_some());
    }

    /// A child whose daemon dies while it waits gives up, though the pipe's
    /// write end lives on (here in this process, the daemon's parent).
    #[test]
    fn a_child_whose_daemon_dies_gives_up() {
        let gate = Gate::new().unwrap();
        let (report_read, report_write) = nix::unistd::pipe().unwrap();
        // SAFETY: the forked "daemon" makes one spawn and exits without unwinding.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                let pass = gate.enlist().unwrap();
                let mut cmd = Command::new("sleep");
                cmd.arg("0");
                // SAFETY: Pass::wait makes only async-signal-safe calls.
                unsafe {
                    cmd.pre_exec(move || pass.map_or(Ok(()), Pass::wait));
                }
                // The spawn blocks until its child execs or fails; the
                // "daemon" dies first, from a thread, without a word.
                std::thread::spawn(|| {
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    unsafe { nix::libc::_exit(0) };
                });
                let _ = cmd.spawn();
                unsafe { nix::libc::_exit(0) };
            }
            nix::unistd::ForkResult::Parent { child } => {
                drop(report_write);
                nix::sys::wait::waitpid(child, None).unwrap();
            }
        }
        // The waiting grandchild is this process's no more (nor its child's):
        // find it by the pipe it holds and see it go.
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        let mine = format!(
            "pipe:[{}]",
            std::fs::metadata(format!("/proc/self/fd/{}", gate.read.as_raw_fd()))
                .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
                .unwrap()
        );
        let holders = || {
            std::fs::read_dir("/proc")
                .unwrap()
                .flatten()
                .filter(|p| {
                    let pid = p.file_name().to_string_lossy().parse::<u32>().ok();
                    pid.is_some_and(|pid| pid != std::process::id())
                        && std::fs::read_dir(p.path().join("fd"))
                            .map(|fds| {
                                fds.flatten().any(|fd| {
                                    std::fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy() == mine)
                                })
                            })
                            .unwrap_or(false)
                })
                .count()
        };
        while holders() > 0 {
            assert!(Instant::now() < deadline, "a child still waits at the gate of a dead daemon");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        drop(report_read);
    }

    #[tokio::test]
    async fn a_shut_gate_fails_every_spawn_behind_it() {
        let gate = Gate::new().unwrap();
        let waiting = {
            let gate = gate.clone();
            std::thread::spawn(move || spawn_behind(&gate))
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        drop(Opener(gate.clone()));
        let err = waiting.join().unwrap().unwrap_err();
        assert_eq!(err.raw_os_error(), Some(nix::libc::ECANCELED), "{err}");
        assert!(spawn_behind(&gate).is_err(), "enlisted after it was shut");
        assert!(gate.passed().await.is_err());
        // Opening a shut gate changes nothing.
        gate.open();
        assert!(gate.opened_at().is_none());
    }
}
