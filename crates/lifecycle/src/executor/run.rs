//! Running a contained command to its end or its timeout: its standard
//! input given, its output captured up to a cap, and, when it ends or times
//! out, its process group killed, then whatever else it left (every process
//! of its user, forks in flight included).

use std::time::Duration;

use tokio::io::AsyncReadExt;

use airlock_host::users::Identity;

/// Most bytes of stdout and of stderr returned; the rest is counted and dropped.
pub const OUTPUT_CAP: usize = 1 << 20;
/// How long output may stay open once the command's processes are dead.
const OUTPUT_GRACE: Duration = Duration::from_secs(5);

/// How a command ended.
pub struct Ended {
    /// Its exit code; None when a signal ended it.
    pub exit_code: Option<i32>,
    /// Whether the timeout ended it.
    pub timed_out: bool,
    /// Standard output, lossily UTF-8, at most [`OUTPUT_CAP`] bytes.
    pub stdout: String,
    /// Standard error, the same.
    pub stderr: String,
    /// Whether either was cut at the cap.
    pub truncated: bool,
}

/// Waits for `child` (spawned in a process group of its own, stdout and
/// stderr piped) until it exits or `timeout` passes, writing `stdin` to it;
/// then kills its group, runs `kill_rest` (which kills what else it left),
/// and returns what it said.
pub async fn to_the_end(
    mut child: tokio::process::Child,
    stdin: Option<String>,
    timeout: Duration,
    kill_rest: impl std::future::Future<Output = ()>,
) -> Ended {
    let group = child.id().map(|p| p as i32);
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let _ = pipe.write_all(text.as_bytes()).await;
        });
    }
    let (out, out_task) = Capture::spawn(child.stdout.take());
    let (err, err_task) = Capture::spawn(child.stderr.take());
    let status = tokio::time::timeout(timeout, child.wait()).await;
    let timed_out = status.is_err();
    if let Some(pgid) = group {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::Signal::SIGKILL);
    }
    let status = match status {
        Ok(s) => s.ok(),
        Err(_) => child.wait().await.ok(),
    };
    kill_rest.await;
    // With every writer dead the pipes end at once; should one be held anyway,
    // the answer does not wait on it.
    for mut task in [out_task, err_task] {
        if tokio::time::timeout(OUTPUT_GRACE, &mut task).await.is_err() {
            task.abort();
            tracing::warn!("an executor's output stayed open after its processes were killed");
        }
    }
    let (stdout, cut_out) = out.take();
    let (stderr, cut_err) = err.take();
    Ended {
        exit_code: status.and_then(|s| s.code()),
        timed_out,
        stdout,
        stderr,
        truncated: cut_out || cut_err,
    }
}

/// One output pipe read to its end in the background, at most [`OUTPUT_CAP`]
/// bytes kept; what was read is there even if the end never comes.
#[derive(Clone, Default)]
struct Capture(std::sync::Arc<std::sync::Mutex<(Vec<u8>, bool)>>);

impl Capture {
    fn spawn<R: tokio::io::AsyncRead + Unpin + Send + 'static>(
        pipe: Option<R>,
    ) -> (Capture, tokio::task::JoinHandle<()>) {
        let capture = Capture::default();
        let kept = capture.clone();
        let task = tokio::spawn(async move {
            let Some(mut pipe) = pipe else { return };
            let mut buf = [0u8; 8192];
            while let Ok(n @ 1..) = pipe.read(&mut buf).await {
                let mut kept = kept.0.lock().unwrap_or_else(|p| p.into_inner());
                let room = OUTPUT_CAP.saturating_sub(kept.0.len());
                kept.0.extend_from_slice(&buf[..n.min(room)]);
                kept.1 |= n > room;
            }
        });
        (capture, task)
    }

    /// The text read so far, and whether some was cut at the cap.
    fn take(&self) -> (String, bool) {
        let kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        (String::from_utf8_lossy(&kept.0).into_owned(), kept.1)
    }
}

/// Whether a process of `uid` is still in the cgroups of `id`: what
/// [`kill_user`] asks after each round, for an executor of a sandbox or a grant.
pub fn left_in(cgroups: &airlock_host::cgroup::Cgroups, id: &str, uid: nix::unistd::Uid) -> bool {
    cgroups.members(id).into_iter().any(|pid| airlock_core::process::owner(pid) == Some(uid.as_raw()))
}

/// Kills every process of `user` (an executor's alone): a process that
/// signals all it may (`kill(-1)`) as that user reaches each one, including
/// those forked while it runs, which one pass over a process list would miss.
/// Repeated until `left` says none is left.
pub async fn kill_user(user: &Identity, left: impl Fn() -> bool) {
    let (uid, gid) = (user.uid, user.gid);
    for _ in 0..20 {
        let killed = tokio::task::spawn_blocking(move || signal_all_as(uid, gid)).await;
        if !matches!(killed, Ok(Ok(()))) {
            tracing::warn!(uid = uid.as_raw(), "could not run an executor's killer");
        }
        if !left() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tracing::warn!(uid = uid.as_raw(), "executor processes outlived twenty rounds of killing");
}

/// Forks a child that becomes `uid` and sends SIGKILL to every process it may
/// signal (all of that user's but itself), then waits for it.
fn signal_all_as(uid: nix::unistd::Uid, gid: nix::unistd::Gid) -> nix::Result<()> {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::{fork, ForkResult, Pid};
    // SAFETY: the child makes only async-signal-safe system calls, then _exit.
    match unsafe { fork() }? {
        ForkResult::Child => {
            let ok = nix::unistd::setgroups(&[]).is_ok()
                && nix::unistd::setgid(gid).is_ok()
                && nix::unistd::setuid(uid).is_ok()
                && kill(Pid::from_raw(-1), Signal::SIGKILL).is_ok();
            // SAFETY: leaving the forked child without running the parent's destructors.
            unsafe { nix::libc::_exit(if ok { 0 } else { 1 }) }
        }
        ForkResult::Parent { child } => {
            nix::sys::wait::waitpid(child, None)?;
            Ok(())
        }
    }
}
