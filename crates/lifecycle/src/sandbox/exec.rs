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

use crate::engine::Engine;
use crate::executor::files::{self, FileIn, FileOut};
use crate::executor::run;
use crate::sandbox::{Sandbox, SandboxState};
use airlock_core::error::{Error, ErrorCode, Result};

pub use crate::executor::run::OUTPUT_CAP;

/// A command to run in a sandbox.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
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
    /// Files to put in its working directory before it runs (at most 64,
    /// 64 MB together).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileIn>,
    /// Files to bring back from its working directory after it ends (paths
    /// relative to it; at most 64 MB together).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub get: Vec<String>,
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
    /// The files asked for, in the order asked.
    #[serde(default)]
    pub files: Vec<FileOut>,
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
    let put = files::check(&req.files, &req.get)?;
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
    files::put(&workdir, &put, &user)?;
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
    // Its Redis, if it has one, at 127.0.0.1:6379 in that network, through
    // the daemon's door, which refuses a command over the limit with an
    // error reply, as the router does.
    let doors = engine.services.state::<super::redis_door::Doors>();
    let _door = match (server, airlock_redis::server::configured(&instance)) {
        (Some(pid), true) if contained => {
            let network = airlock_host::contain::Network::of(pid)?;
            doors.hold(&sb.id, &network, instance.redis_socket())
        }
        _ => None,
    };
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
    let child = cmd.spawn().map_err(|e| {
        invalid(
            format!("could not run {:?}: {e}", req.argv[0]),
            "check the program exists inside the sandbox's view (PATH is /usr/local/bin:/usr/bin:/bin)",
        )
    })?;
    let kill_rest = async {
        if contained {
            run::kill_user(&user, || run::left_in(&engine.cgroups, &sb.id, user.uid)).await;
        } else {
            kill_strays(engine, &sb);
        }
    };
    let ended = run::to_the_end(child, req.stdin.clone(), Duration::from_secs(timeout), kill_rest).await;
    let duration_ms = started.elapsed().as_millis() as u64;
    Ok(ExecResult::of(ended, duration_ms, files::get(&workdir, &req.get, &user)))
}

impl ExecResult {
    /// The answer of a run that `ended`, with the files it brought back.
    pub fn of(ended: run::Ended, duration_ms: u64, files: Vec<FileOut>) -> ExecResult {
        ExecResult {
            exit_code: ended.exit_code,
            timed_out: ended.timed_out,
            stdout: ended.stdout,
            stderr: ended.stderr,
            truncated: ended.truncated,
            duration_ms,
            files,
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
