//! Starting a contained server's process without a copy of the daemon's
//! memory.
//!
//! A fork copies the daemon's page tables, and until the child runs its
//! program every page either side writes is copied once more. A fork's
//! server waits at its gate (tens of milliseconds) while the daemon clones
//! its files, so the daemon's heap was copied page by page at each fork, and
//! torn down again at the child's `exec`: a twentieth of the host's CPU in a
//! run of cold forks. Here the child shares the daemon's memory
//! (`CLONE_VM | CLONE_VFORK`, as `posix_spawn` does), on a stack of its own,
//! and the spawning thread waits until the child runs its program or fails.
//!
//! So the child may do only what acts on itself alone: system calls, never
//! an allocation, and never glibc's `set*id` wrappers (they walk the
//! process's thread list, which here is the daemon's: [`crate::contain`]
//! makes the raw calls). It starts with every signal blocked and every
//! handler of the daemon's put back to the default, so no handler of the
//! daemon's runs in it (but glibc's own two, for thread cancellation and
//! set*id, which act only on a signal the process sent itself); its program
//! gets an empty signal mask.
//!
//! Where `fs.suid_dumpable` is 1 the child gets a copy of the memory
//! instead, as a fork does (see [`sharing_memory_is_safe`]).

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use nix::libc;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// The lowest descriptor the child's error pipe may have: below it are those
/// a child may be handed by number.
const FIRST_UNGIVEN_FD: RawFd = 10;

/// How much stack the child gets (mapped on demand; only what it touches
/// costs anything), below a guard page.
const STACK: usize = 256 << 10;

/// A program to start, with what it is given: its arguments and environment
/// (nothing of the daemon's), its standard descriptors, its process group.
pub struct Command {
    program: CString,
    args: Vec<CString>,
    env: Vec<CString>,
    stdin: Option<OwnedFd>,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    process_group: bool,
    /// An argument or variable with a NUL byte, refused at spawn.
    invalid: bool,
}

impl Command {
    /// Runs `program` (its path as the child will see it, after its
    /// containment); its first argument is that path.
    pub fn new(program: impl AsRef<OsStr>) -> Command {
        let (program, invalid) = match CString::new(program.as_ref().as_bytes()) {
            Ok(p) => (p, false),
            Err(_) => (CString::default(), true),
        };
        Command {
            args: vec![program.clone()],
            program,
            env: Vec::new(),
            stdin: None,
            stdout: None,
            stderr: None,
            process_group: false,
            invalid,
        }
    }

    /// One more argument.
    pub fn arg(&mut self, arg: impl AsRef<OsStr>) -> &mut Command {
        match CString::new(arg.as_ref().as_bytes()) {
            Ok(a) => self.args.push(a),
            Err(_) => self.invalid = true,
        }
        self
    }

    /// One environment variable (the environment holds only these).
    pub fn env(&mut self, key: &str, value: impl AsRef<OsStr>) -> &mut Command {
        let mut pair = key.as_bytes().to_vec();
        pair.push(b'=');
        pair.extend_from_slice(value.as_ref().as_bytes());
        match CString::new(pair) {
            Ok(p) if !key.is_empty() && !key.contains('=') => self.env.push(p),
            _ => self.invalid = true,
        }
        self
    }

    /// What the program reads and writes as its standard input, output and
    /// error; `None` is `/dev/null`.
    pub fn stdio(
        &mut self,
        stdin: Option<OwnedFd>,
        stdout: Option<OwnedFd>,
        stderr: Option<OwnedFd>,
    ) -> &mut Command {
        (self.stdin, self.stdout, self.stderr) = (stdin, stdout, stderr);
        self
    }

    /// The child leads a process group of its own, so one signal reaches all
    /// it starts, and a signal to the daemon's group does not reach it.
    pub fn process_group(&mut self) -> &mut Command {
        self.process_group = true;
        self
    }

    /// Starts the program, with `before_exec` run in the child first; returns
    /// once the child runs its program, or with the error that stopped it.
    ///
    /// # Safety
    /// `before_exec` runs in the child, in the daemon's memory: it may make
    /// only system calls that act on the calling process alone, and must not
    /// allocate, take a lock, or touch a thread-local of the daemon's. It may
    /// block (it keeps this thread waiting, not the daemon).
    pub unsafe fn spawn(&mut self, before_exec: &mut dyn FnMut() -> io::Result<()>) -> io::Result<Child> {
        // SAFETY: as the caller promised.
        unsafe { self.spawn_sharing(sharing_memory_is_safe(), before_exec) }
    }

    /// [`Command::spawn`], the child sharing this memory or getting a copy.
    unsafe fn spawn_sharing(
        &mut self,
        share: bool,
        before_exec: &mut dyn FnMut() -> io::Result<()>,
    ) -> io::Result<Child> {
        if self.invalid {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an argument or variable holds a NUL byte",
            ));
        }
        let null = std::fs::File::options().read(true).write(true).open("/dev/null")?;
        // Each source above the standard three, so no source is one of the
        // targets another `dup2` overwrites first (a daemon started with them
        // closed opens files there).
        // (`try_clone_to_owned` duplicates to the lowest free descriptor from 3.)
        let sources = [&self.stdin, &self.stdout, &self.stderr]
            .map(|fd| fd.as_ref().map_or(null.as_fd(), |fd| fd.as_fd()).try_clone_to_owned());
        let sources = sources.into_iter().collect::<io::Result<Vec<OwnedFd>>>()?;
        let stdio = [0, 1, 2].map(|i| sources[i].as_raw_fd());
        let argv: Vec<*const libc::c_char> =
            self.args.iter().map(|a| a.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
        let envp: Vec<*const libc::c_char> =
            self.env.iter().map(|e| e.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
        // The child's error, 4 bytes on a close-on-exec pipe: nothing once it
        // runs its program (its end closes at exec), or the error that
        // stopped it.
        let (error_read, low) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        // Above the descriptors a child is handed by number (a gate's, 3), so
        // no step before exec puts another in its place and loses the error.
        // The first copy goes at once: an end left open here would keep the
        // read below from ever seeing the child's exec.
        let high = nix::fcntl::fcntl(&low, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(FIRST_UNGIVEN_FD))?;
        drop(low);
        // SAFETY: a new descriptor, owned here alone.
        let error_write = unsafe { OwnedFd::from_raw_fd(high) };
        let shared = Shared {
            program: self.program.as_ptr(),
            argv: argv.as_ptr(),
            envp: envp.as_ptr(),
            stdio,
            process_group: self.process_group,
            before_exec: before_exec as *mut (dyn FnMut() -> io::Result<()> + '_),
            error: error_write.as_raw_fd(),
        };
        let stack = Stack::new()?;
        let mut pidfd: libc::c_int = -1;
        // Every signal blocked across the clone: the child starts with them
        // blocked, and unblocks them only once no handler of the daemon's is left.
        let all = nix::sys::signal::SigSet::all();
        let mut before = nix::sys::signal::SigSet::empty();
        nix::sys::signal::pthread_sigmask(
            nix::sys::signal::SigmaskHow::SIG_SETMASK,
            Some(&all),
            Some(&mut before),
        )?;
        let memory = if share { libc::CLONE_VM } else { 0 };
        // SAFETY: the child runs `child_main` on its own stack, in this memory
        // or a copy of it, reading `shared` (which outlives it: this thread
        // waits, by CLONE_VFORK, until the child has run its program or exited).
        let pid = unsafe {
            libc::clone(
                child_main,
                stack.top(),
                memory | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD,
                (&shared as *const Shared<'_>).cast_mut().cast(),
                &mut pidfd as *mut libc::c_int,
            )
        };
        let cloned = io::Error::last_os_error();
        let _ =
            nix::sys::signal::pthread_sigmask(nix::sys::signal::SigmaskHow::SIG_SETMASK, Some(&before), None);
        drop(stack);
        drop(error_write);
        if pid < 0 {
            return Err(cloned);
        }
        // SAFETY: CLONE_PIDFD gave this process a new descriptor for the child
        // (none on kernels before 5.2: then it is watched by its pid).
        let pidfd = (pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd) });
        let mut child = Child { pid, pidfd, watched: None, status: None };
        let mut errno = [0u8; 4];
        match nix::unistd::read(&error_read, &mut errno) {
            Ok(0) => Ok(child),
            Ok(4) => {
                let _ = child.reap(true);
                Err(io::Error::from_raw_os_error(i32::from_ne_bytes(errno)))
            }
            result => {
                let _ = child.reap(true);
                Err(io::Error::other(format!("the child's error could not be read: {result:?}")))
            }
        }
    }
}

/// Whether a child may share the daemon's memory while it takes its user.
/// Taking another uid makes a process's memory dumpable as
/// `fs.suid_dumpable` says; at 1 (a debugging setting) the memory the child
/// shares would be open to that user's processes until the child makes it
/// not dumpable again. Then the child gets a copy, as a fork does.
fn sharing_memory_is_safe() -> bool {
    std::fs::read_to_string("/proc/sys/fs/suid_dumpable").is_ok_and(|v| v.trim() != "1")
}

/// What the child reads from the spawning thread's frame, and where it
/// writes the error that stopped it before its program ran.
struct Shared<'a> {
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    stdio: [RawFd; 3],
    process_group: bool,
    before_exec: *mut (dyn FnMut() -> io::Result<()> + 'a),
    error: RawFd,
}

/// The child: its handlers put back, its descriptors and group set, the
/// caller's steps, an empty signal mask, its program.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the spawning thread's `Shared`, alive until this exits or execs.
    let shared = unsafe { &*(arg as *const Shared<'_>) };
    let fail = |errno: i32| -> ! {
        let errno = errno.max(1).to_ne_bytes();
        // SAFETY: 4 bytes from a local buffer to the pipe's write end.
        unsafe { libc::write(shared.error, errno.as_ptr().cast(), 4) };
        // SAFETY: ends this process alone (its own thread group), running
        // no exit handler of the daemon's.
        unsafe { libc::_exit(127) }
    };
    // SAFETY: system calls on this process's own state, with valid pointers.
    unsafe {
        let default: libc::sigaction = std::mem::zeroed();
        for signal in 1..=64 {
            if signal == libc::SIGKILL || signal == libc::SIGSTOP {
                continue;
            }
            let mut was: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut was) != 0 {
                continue;
            }
            // Ignored signals stay ignored across exec, as they would after a
            // fork, but for SIGPIPE (which the Rust runtime ignores).
            if was.sa_sigaction != libc::SIG_DFL
                && (was.sa_sigaction != libc::SIG_IGN || signal == libc::SIGPIPE)
            {
                libc::sigaction(signal, &default, std::ptr::null_mut());
            }
        }
        for (target, fd) in shared.stdio.iter().enumerate() {
            if libc::dup2(*fd, target as libc::c_int) < 0 {
                fail(errno());
            }
        }
        if shared.process_group && libc::setpgid(0, 0) != 0 {
            fail(errno());
        }
        if let Err(e) = (*shared.before_exec)() {
            fail(e.raw_os_error().unwrap_or(libc::EIO));
        }
        let empty: libc::sigset_t = std::mem::zeroed();
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &empty as *const libc::sigset_t,
            0usize,
            8usize,
        );
        libc::execve(shared.program, shared.argv, shared.envp);
        fail(errno())
    }
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// The child's stack: mapped for the spawn, with a guard page below it.
struct Stack(*mut libc::c_void);

impl Stack {
    fn new() -> io::Result<Stack> {
        // SAFETY: a new private anonymous mapping, owned by this value.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                STACK,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Stack(base);
        // SAFETY: the lowest page of the mapping just made.
        if unsafe { libc::mprotect(base, page_size(), libc::PROT_NONE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The stack's top (it grows down), 16-byte aligned.
    fn top(&self) -> *mut libc::c_void {
        // SAFETY: one past the mapping's end, which is page aligned.
        unsafe { self.0.cast::<u8>().add(STACK).cast() }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping this value made; the child no longer runs on it.
        unsafe { libc::munmap(self.0, STACK) };
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no side effects.
    (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as usize
}

/// A started child, held by a pidfd until it is reaped. Dropped before it
/// exits, it is reaped by a background task.
#[derive(Debug)]
pub struct Child {
    pid: i32,
    pidfd: Option<OwnedFd>,
    watched: Option<AsyncFd<OwnedFd>>,
    status: Option<ExitStatus>,
}

impl Child {
    /// Its process id.
    pub fn id(&self) -> i32 {
        self.pid
    }

    /// Its exit status, if it has exited (reaping it then).
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        self.reap(false)
    }

    /// Waits until it exits; its exit status.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.reap(false)? {
                return Ok(status);
            }
            if self.watched.is_none() {
                if let Some(fd) = self.pidfd.take() {
                    // SAFETY: the pidfd is owned by the `AsyncFd`, neither
                    // replaced nor closed while registered.
                    match unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) } {
                        Ok(watched) => self.watched = Some(watched),
                        // A kernel whose pidfds cannot be polled (5.2).
                        Err(e) => drop(e.into_parts().0),
                    }
                }
            }
            match &self.watched {
                // Readable once the child has exited; reaped on the next turn.
                Some(watched) => watched.readable().await?.clear_ready(),
                // No pidfd to wait on: looked at again every 10 ms.
                None => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            }
        }
    }

    /// Reaps the child once it has exited (waiting for that when `block`).
    fn reap(&mut self, block: bool) -> io::Result<Option<ExitStatus>> {
        if let Some(status) = self.status {
            return Ok(Some(status));
        }
        let mut raw: libc::c_int = 0;
        let flags = if block { 0 } else { libc::WNOHANG };
        loop {
            // SAFETY: waits for this process's own child, by its pid: it is not
            // reaped by anyone else, so the pid is still this child's.
            let r = unsafe { libc::waitpid(self.pid, &mut raw, flags) };
            match r {
                0 => return Ok(None),
                r if r == self.pid => {
                    let status = ExitStatus::from_raw(raw);
                    self.status = Some(status);
                    return Ok(Some(status));
                }
                _ if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) => continue,
                _ => return Err(io::Error::last_os_error()),
            }
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.status.is_some() || matches!(self.reap(false), Ok(Some(_))) {
            return;
        }
        // Still running: reaped in the background once it exits, so no zombie
        // is left; where there is no runtime, it is left to exit unreaped.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let mut rest =
            Child { pid: self.pid, pidfd: self.pidfd.take(), watched: self.watched.take(), status: None };
        runtime.spawn(async move {
            let _ = rest.wait().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_program_runs_with_only_what_it_was_given_and_its_status_is_read() {
        let dir = crate::test_dir("spawn");
        let out = std::fs::File::create(dir.join("out")).unwrap();
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            // The masks read by the shell itself: a shell waiting for a
            // program it runs blocks every signal for a moment, which that
            // program could read instead.
            .arg(
                "echo \"$GREETING\" $# \"$1\"; while read -r k v; do case $k in SigBlk:|SigIgn:) echo \"$k $v\";; esac; \
                 done < /proc/$$/status; exit 7",
            )
            .arg("sh")
            .arg("one arg")
            .env("GREETING", "hello")
            .stdio(None, Some(out.into()), None)
            .process_group();
        let mut ran = false;
        // SAFETY: the closure only writes a local flag in this memory, as a
        // check that it ran in the child before the program.
        let mut child = unsafe {
            cmd.spawn(&mut || {
                ran = true;
                Ok(())
            })
        }
        .unwrap();
        // The flag is set in this memory only where the child shares it.
        assert_eq!(ran, sharing_memory_is_safe(), "the steps before exec did not run in this memory");
        let status = child.wait().await.unwrap();
        assert_eq!(status.code(), Some(7));
        let out = std::fs::read_to_string(dir.join("out")).unwrap();
        let mut lines = out.lines();
        assert_eq!(lines.next(), Some("hello 1 one arg"));
        // No signal blocked, and SIGPIPE (which this test's runtime ignores) not ignored.
        let mask = |line: Option<&str>| {
            u64::from_str_radix(line.unwrap().split_whitespace().nth(1).unwrap(), 16).unwrap()
        };
        assert_eq!(mask(lines.next()), 0, "{out}");
        assert_eq!(mask(lines.next()) & (1 << (libc::SIGPIPE - 1)), 0, "{out}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The ids of every thread of this process, from `/proc`.
    fn ids_of_every_thread() -> Vec<String> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .map(|t| {
                let status = std::fs::read_to_string(t.unwrap().path().join("status")).unwrap();
                status
                    .lines()
                    .filter(|l| l.starts_with("Uid:") || l.starts_with("Gid:") || l.starts_with("Groups:"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_contained_child_becomes_its_user_and_no_thread_of_the_daemon_does() {
        assert!(nix::unistd::geteuid().is_root(), "this test starts a child as another uid: run it as root");
        let before = ids_of_every_thread();
        assert!(before.len() > 1, "the test runs with threads besides this one");
        assert!(before.iter().all(|ids| ids == &before[0]), "{before:?}");
        let dir = crate::test_dir("spawn-user");
        let out = std::fs::File::create(dir.join("out")).unwrap();
        let who = crate::contain::Who::of(
            &crate::users::Identity {
                name: "64123".into(),
                uid: nix::unistd::Uid::from_raw(64_123),
                gid: nix::unistd::Gid::from_raw(64_124),
            },
            Some(nix::unistd::Gid::from_raw(64_125)),
        );
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c").arg("grep -E '^(Uid|Gid|Groups):' /proc/self/status").stdio(
            None,
            Some(out.into()),
            None,
        );
        let mut dumpable = -1;
        // SAFETY: containment's last step makes only system calls on the
        // child itself; the dumpable flag is read into this memory, which the
        // child shares.
        let mut child = unsafe {
            cmd.spawn(&mut || {
                crate::contain::become_user(&who)?;
                dumpable = libc::prctl(libc::PR_GET_DUMPABLE);
                Ok(())
            })
        }
        .unwrap();
        assert!(child.wait().await.unwrap().success());
        let seen = std::fs::read_to_string(dir.join("out")).unwrap();
        assert!(seen.contains("Uid:\t64123\t64123\t64123\t64123"), "{seen}");
        assert!(seen.contains("Gid:\t64124\t64124\t64124\t64124"), "{seen}");
        assert!(seen.contains("Groups:\t64125"), "{seen}");
        assert_eq!(dumpable, 0, "the child, sharing this memory, was dumpable as its user");
        // Every thread of this process is still root, with its own groups.
        let after = ids_of_every_thread();
        assert!(after.iter().all(|ids| ids == &before[0]), "{after:?} after {before:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_step_that_fails_or_a_missing_program_fails_the_spawn_and_leaves_no_child() {
        let mut cmd = Command::new("/bin/true");
        // SAFETY: the closure makes no call at all.
        let e = unsafe { cmd.spawn(&mut || Err(io::Error::from_raw_os_error(libc::ECANCELED))) }.unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ECANCELED));
        let mut cmd = Command::new("/nonexistent/program");
        // SAFETY: as above.
        let e = unsafe { cmd.spawn(&mut || Ok(())) }.unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        // A child with a copy of the memory (where `fs.suid_dumpable` is 1)
        // tells its errors the same way, and its steps leave this memory be.
        for share in [true, false] {
            let mut cmd = Command::new("/bin/true");
            // SAFETY: as above.
            let e =
                unsafe { cmd.spawn_sharing(share, &mut || Err(io::Error::from_raw_os_error(libc::EPERM))) };
            assert_eq!(e.unwrap_err().raw_os_error(), Some(libc::EPERM));
            let mut ran = false;
            let mut cmd = Command::new("/bin/sh");
            cmd.arg("-c").arg("exit 3");
            // SAFETY: the closure writes a local flag, in this memory or a copy.
            let mut child = unsafe {
                cmd.spawn_sharing(share, &mut || {
                    ran = true;
                    Ok(())
                })
            }
            .unwrap();
            assert_eq!(child.wait().await.unwrap().code(), Some(3));
            assert_eq!(ran, share);
        }
        // Every child, failed or run, was reaped (each test is a process of
        // its own under nextest, so these are this test's).
        let left: String = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .map(|t| std::fs::read_to_string(t.unwrap().path().join("children")).unwrap_or_default())
            .collect();
        assert_eq!(left.trim(), "", "children left behind");
        let mut cmd = Command::new("/bin/true");
        cmd.arg("a\0b");
        // SAFETY: as above.
        assert_eq!(unsafe { cmd.spawn(&mut || Ok(())) }.unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }
}
