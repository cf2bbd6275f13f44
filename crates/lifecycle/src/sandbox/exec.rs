//! `airlock exec`: run agent-written code inside a sandbox's boundary.
//!
//! The command runs as the sandbox's OS user, in its network namespace (so the
//! only thing it can reach is its own database, over the unix socket) and its
//! cgroups, with the connection string in `DATABASE_URL` (never on a command
//! line), in a private working directory, under a timeout. When it ends — or
//! times out — every process it started is killed: its process group, then
//! every process of the exec user (the sandbox's alone), forks in flight
//! included; without root, anything in the sandbox's cgroups that is not the
//! database server.

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

use crate::engine::Engine;
use crate::sandbox::{Sandbox, SandboxState};
use airlock_core::error::{Error, ErrorCode, Result};

/// Most bytes of stdout and of stderr returned; the rest is counted and dropped.
pub const OUTPUT_CAP: usize = 1 << 20;

/// A command to run in a sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExecRequest {
    /// The program and its arguments.
    #[schema(min_items = 1)]
    pub argv: Vec<String>,
    /// Seconds before it is killed (1 to 3600; default 60).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 3600)]
    pub timeout_seconds: Option<u64>,
    /// Text for its standard input.
    #[serde(default)]
    pub stdin: Option<String>,
}

/// What a command did.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExecResult {
    /// Its exit code; absent when a signal ended it.
    pub exit_code: Option<i32>,
    /// Whether the timeout ended it.
    pub timed_out: bool,
    /// Standard output (at most [`OUTPUT_CAP`] bytes, lossily UTF-8).
    pub stdout: String,
    /// Standard error (at most [`OUTPUT_CAP`] bytes, lossily UTF-8).
    pub stderr: String,
    /// Whether either output was cut at the cap.
    pub truncated: bool,
    /// Wall time, milliseconds.
    pub duration_ms: u64,
}

fn invalid(message: impl Into<String>, hint: &str) -> Error {
    Error::new(ErrorCode::InvalidRequest, message, hint)
}

/// Runs a command inside a running sandbox's boundary.
pub async fn exec(engine: &Engine, key: &str, req: &ExecRequest) -> Result<ExecResult> {
    if req.argv.is_empty() || req.argv[0].is_empty() {
        return Err(invalid(
            "no command given",
            "put the command after `--`, e.g. `airlock exec ID -- python3 job.py`",
        ));
    }
    let timeout = req.timeout_seconds.unwrap_or(60);
    if !(1..=3600).contains(&timeout) {
        return Err(invalid(format!("a timeout of {timeout}s is out of range"), "give between 1s and 1h"));
    }
    let mut sb = engine.store().sandbox(key)?;
    if sb.state == SandboxState::Suspended {
        sb = super::wake(engine, &sb.id).await?;
    }
    // A command in progress counts as a connection: the sandbox is not idle, and
    // is not suspended (which would kill the command) to make room.
    let _busy = engine.activity.open(&sb.id);
    if sb.state != SandboxState::Running {
        return Err(Error::new(
            ErrorCode::SandboxNotFound,
            format!("sandbox {} is {}", sb.id, sb.state.as_str()),
            "exec needs a running sandbox",
        ));
    }
    let workdir = engine.layout.sandbox_instance(&sb.id).exec_dir();
    // Its own user, not the server's: exec code reaches the server through its
    // socket only, and can neither read its files nor trace its processes.
    let user = engine.exec_user(&sb)?;
    // The instance directory is root's, so nothing can stand at this name but
    // what root put there (a link left by an older layout is replaced).
    match std::fs::symlink_metadata(&workdir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => std::fs::remove_file(&workdir)?,
        Err(_) => {}
    }
    airlock_host::storage::tree::private_dir(&workdir)?;
    user.own(&workdir)?;
    let mut cmd = tokio::process::Command::new(&req.argv[0]);
    cmd.args(&req.argv[1..])
        .current_dir(&workdir)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", &workdir)
        .env("LANG", "C.UTF-8");
    let instance = engine.layout.sandbox_instance(&sb.id);
    let at = super::stores::At { engine, sb: &sb, dir: &instance };
    let stores = super::stores::of_sandbox(&instance);
    // Each store says how the code reaches it (DATABASE_URL, REDIS_URL, ...),
    // in the environment, never on a command line.
    if let Some(password) = sb.dsn.as_deref().and_then(airlock_core::dsn::password) {
        let reached: Vec<_> = stores.iter().filter_map(|s| s.exec_env(at, &password)).collect();
        let forms: Vec<&str> = reached.iter().filter_map(|(_, _, form)| *form).collect();
        if !forms.is_empty() {
            engine.record_credential(&sb, "exec", &password, &forms)?;
        }
        for (name, value, _) in reached {
            cmd.env(name, value);
        }
    }
    cmd.stdin(if req.stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    // The sandbox's first server's namespaces (PostgreSQL's when it has one):
    // its network (loopback only), its System V IPC, and its mounts (private
    // /tmp, a /proc showing only its own processes).
    // The pid on record, checked to be that store's server: never a pid
    // read from a file the sandbox's own user may write.
    let server = super::stores::first_server(&stores).filter(|s| s.serves(at).unwrap_or(false)).and(sb.pid);
    let namespaces = match (engine.daemon_user.is_root(), server) {
        (true, Some(pid)) => Some(airlock_host::contain::Namespaces::of(pid)?),
        (true, _) => return Err(Error::postgres(format!("sandbox {} has no running server", sb.id))),
        (false, _) => None,
    };
    let contained = namespaces.is_some();
    if let Some(ns) = namespaces {
        let who = airlock_host::contain::Who::of(&user, None);
        let cgroups = engine.cgroups.procs_files(&sb.id);
        let workdir = std::ffi::CString::new(workdir.as_os_str().as_encoded_bytes())
            .map_err(|_| Error::internal("the exec directory's path has a NUL byte"))?;
        // SAFETY: only async-signal-safe system calls run between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                airlock_host::contain::contain(
                    who,
                    &cgroups,
                    airlock_host::contain::Enter::Join(&ns, &workdir),
                )
            });
        }
    }
    let started = Instant::now();
    let mut child = cmd.spawn().map_err(|e| {
        invalid(
            format!("could not run {:?}: {e}", req.argv[0]),
            "check the program exists inside the sandbox's view (PATH is /usr/local/bin:/usr/bin:/bin)",
        )
    })?;
    let group = child.id().map(|p| p as i32);
    if let (Some(text), Some(mut stdin)) = (req.stdin.clone(), child.stdin.take()) {
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let _ = stdin.write_all(text.as_bytes()).await;
        });
    }
    let (out, out_task) = Capture::spawn(child.stdout.take());
    let (err, err_task) = Capture::spawn(child.stderr.take());
    let status = tokio::time::timeout(Duration::from_secs(timeout), child.wait()).await;
    let timed_out = status.is_err();
    if let Some(pgid) = group {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::Signal::SIGKILL);
    }
    let status = match status {
        Ok(s) => s.ok(),
        Err(_) => child.wait().await.ok(),
    };
    if contained {
        kill_user(engine, &sb, &user).await;
    } else {
        kill_strays(engine, &sb);
    }
    // With every writer dead the pipes end at once; should one be held anyway,
    // the answer does not wait on it.
    for mut task in [out_task, err_task] {
        if tokio::time::timeout(OUTPUT_GRACE, &mut task).await.is_err() {
            task.abort();
            tracing::warn!(sandbox = %sb.id, "an exec's output stayed open after its processes were killed");
        }
    }
    let (stdout, cut_out) = out.take();
    let (stderr, cut_err) = err.take();
    Ok(ExecResult {
        exit_code: status.and_then(|s| s.code()),
        timed_out,
        stdout,
        stderr,
        truncated: cut_out || cut_err,
        duration_ms: started.elapsed().as_millis() as u64,
    })
}

/// How long output may stay open once the command's processes are dead.
const OUTPUT_GRACE: Duration = Duration::from_secs(5);

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

/// Kills every process of the exec user, the sandbox's alone: a process that
/// signals all it may (`kill(-1)`) as that user reaches each one, including
/// those forked while it runs, which one pass over a process list would miss.
/// Repeated until none is left in the sandbox's cgroups.
async fn kill_user(engine: &Engine, sb: &Sandbox, user: &airlock_host::users::Identity) {
    let (uid, gid) = (user.uid, user.gid);
    for _ in 0..20 {
        let killed = tokio::task::spawn_blocking(move || signal_all_as(uid, gid)).await;
        if !matches!(killed, Ok(Ok(()))) {
            tracing::warn!(sandbox = %sb.id, "could not run the exec user's killer");
        }
        let left = engine
            .cgroups
            .members(&sb.id)
            .into_iter()
            .any(|pid| airlock_core::process::owner(pid) == Some(uid.as_raw()));
        if !left {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tracing::warn!(sandbox = %sb.id, "exec processes outlived twenty rounds of killing");
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

/// Without root there is no exec user of its own to kill by: kills what an exec
/// left in the sandbox's cgroups (a process that left its group with setsid,
/// say), everything but the server and its own children.
fn kill_strays(engine: &Engine, sb: &Sandbox) {
    let Some(server) = sb.pid else { return };
    for pid in engine.cgroups.members(&sb.id) {
        if pid == server || airlock_core::process::parent(pid) == Some(server) {
            continue;
        }
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }
}
