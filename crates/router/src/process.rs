//! The router runs in a process of its own (`airlock router`, started by the
//! daemon), holding the listening socket and every established session, so
//! that restarting or upgrading the daemon cuts none of them.
//!
//! The daemon supervises it: at start it adopts a router already serving its
//! data root with the same settings (recorded in `router.json`), replaces one
//! with other settings, or starts one; then it starts it again if it exits. The
//! router holds `router.lock` while it runs, so "is one running" never depends
//! on a pid that may have been reused. It stops on SIGTERM
//! (`airlock daemon stop --with-router`), or by itself when its data root is
//! removed. While the daemon is away, sessions go on and new clients of running
//! sandboxes are served; waking a suspended one waits for the daemon.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{Address, Host, Relay, RelaySettings, RouterConfig};
use airlock_core::error::{Error, Result};
use airlock_core::layout::Layout;
use airlock_lifecycle::engine::Engine;

/// How long a starting router may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(15);
/// How often the daemon checks that its router runs.
const WATCH: Duration = Duration::from_millis(500);
/// How often the router checks that its data root still exists.
const HOME_CHECK: Duration = Duration::from_secs(1);

/// What a router process runs with: the daemon's router settings and the user
/// it runs sandboxes as. A router is adopted only if this is unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Spec {
    /// The router's settings.
    pub router: RouterConfig,
    /// The instance user (`airlock serve --instance-user`).
    pub instance_user: Option<String>,
    /// How the audit log writes, rotates and checkpoints (`--audit-*`).
    #[serde(default)]
    pub audit: airlock_state::audit::AuditOptions,
}

/// `router.json`: a running router's pid, settings and address.
#[derive(Debug, Serialize, Deserialize)]
struct State {
    pid: u32,
    spec: Spec,
    address: Address,
}

/// What makes a cluster node's [`Relay`] of its settings and its bound relay port.
pub type MakeRelay = dyn FnOnce(&Layout, &RelaySettings, tokio::net::TcpListener) -> Result<Relay>;

/// Runs the router process for the data root at `home` with the settings in
/// `spec_file`, until SIGTERM or SIGINT, or until the data root is removed.
/// In a cluster, `make_relay` makes its relay of the settings.
pub async fn run(home: &Path, spec_file: &Path, make_relay: Box<MakeRelay>) -> Result<()> {
    airlock_core::descriptors::close_on_exec_from_3()?;
    let layout = Layout::new(home);
    let spec: Spec = serde_json::from_slice(&std::fs::read(spec_file)?)
        .map_err(|e| Error::internal(format!("{} does not parse: {e}", spec_file.display())))?;
    // The daemon looks at the lock while this starts: wait out its glance.
    let deadline = Instant::now() + Duration::from_secs(2);
    let lock = loop {
        match try_lock(&layout)? {
            Some(lock) => break lock,
            None if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(5)).await,
            None => return Err(Error::internal(format!("a router already serves {}", home.display()))),
        }
    };
    airlock_core::descriptors::raise_descriptor_limit();
    let listen =
        spec.router.listen.ok_or_else(|| Error::internal("the router was started with --router off"))?;
    let listener = bind_soon(listen).await?;
    // The unix socket is a second way in: one that cannot be had (another
    // router holds it, say) leaves the port serving, said in the log, and
    // no sandbox's answer names a socket.
    let port = listener.local_addr()?.port();
    let (local, socket) = match spec.router.socket_dir.as_deref().map(|dir| super::local::bind(dir, port)) {
        Some(Ok((listener, bound))) => (Some(listener), Some(bound)),
        Some(Err(e)) => {
            tracing::warn!(error = %e.message, "the router's unix socket is off");
            (None, None)
        }
        None => (None, None),
    };
    // The Redis front door is a second port: one that cannot be had (another
    // data root's router holds the default) leaves Redis to the sockets, said
    // in the log, rather than failing PostgreSQL's.
    let redis = match spec.router.redis_listen {
        Some(addr) => match super::bind(addr).await {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::warn!(error = %e.message, "the Redis router is off");
                None
            }
        },
        None => None,
    };
    let relay = match &spec.router.relay {
        Some(settings) => Some(make_relay(&layout, settings, bind_soon(settings.listen).await?)?),
        None => None,
    };
    let host = Arc::new(Host::open(layout.clone(), spec.instance_user.as_deref(), spec.audit.clone())?);
    let address = super::serve(host.clone(), &spec.router, (listener, local), redis, relay)?;
    let state = State { pid: std::process::id(), spec, address };
    super::tls::write_private(
        &layout.router_state(),
        &serde_json::to_vec_pretty(&state).expect("state serializes"),
    )?;

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let home_gone = async {
        while layout.state_db().exists() {
            tokio::time::sleep(HOME_CHECK).await;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("router stopping"),
        _ = tokio::signal::ctrl_c() => tracing::info!("router stopping"),
        _ = home_gone => tracing::info!("the data root is gone; router stopping"),
    }
    // What was counted and not yet recorded is recorded now, whatever the
    // window's age, and any refusal from now on as it comes: every refusal
    // stays on record.
    host.record_counted_refusals(true);
    let _ = std::fs::remove_file(layout.router_state());
    // The socket and its lock go first: a router started once this one's
    // lock is free finds the socket free too.
    drop(socket);
    drop(lock);
    Ok(())
}

/// Binds `listen`, waiting a little for a router that is just exiting to let
/// go of it.
async fn bind_soon(listen: std::net::SocketAddr) -> Result<tokio::net::TcpListener> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match super::bind(listen).await {
            Ok(l) => return Ok(l),
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => return Err(e),
        }
    }
}

/// Adopts, replaces or starts the data root's router for the settings
/// `router` and keeps it running; returns the address DSNs name (None with
/// `--router off`, which also stops a router left running).
pub async fn supervise(engine: Arc<Engine>, router: RouterConfig) -> Result<Option<Address>> {
    let layout = engine.layout.clone();
    let spec = Spec {
        router,
        instance_user: engine.config.instance_user.clone(),
        audit: engine.config.audit.clone(),
    };
    let running = running(&layout)?;
    if spec.router.listen.is_none() {
        if let Some(state) = running {
            stop(&layout, state.pid).await;
        }
        return Ok(None);
    }
    let address = match running {
        Some(state) if state.spec == spec => {
            tracing::info!(pid = state.pid, "adopted the running router: its sessions go on");
            state.address
        }
        Some(state) => {
            tracing::info!(pid = state.pid, "the router's settings changed: replacing it");
            stop(&layout, state.pid).await;
            launch(&layout, &spec).await?
        }
        None => launch(&layout, &spec).await?,
    };
    tokio::spawn(watch(engine, spec));
    Ok(Some(address))
}

/// Starts the router again whenever it is found not running, and records
/// where the new one listens (its port, its unix socket) for the forms
/// credentials are handed out in.
async fn watch(engine: Arc<Engine>, spec: Spec) {
    let layout = engine.layout.clone();
    loop {
        tokio::time::sleep(WATCH).await;
        match running(&layout) {
            Ok(Some(_)) => {}
            Ok(None) => {
                tracing::warn!("the router is not running; starting it again");
                match launch(&layout, &spec).await {
                    Ok(address) => engine.router.set(address),
                    Err(e) => tracing::warn!(error = %e, "starting the router failed"),
                }
            }
            Err(e) => tracing::debug!(error = %e, "checking the router failed"),
        }
    }
}

/// The running router's state, if one holds the lock.
fn running(layout: &Layout) -> Result<Option<State>> {
    if try_lock(layout)?.is_some() {
        return Ok(None);
    }
    let state = std::fs::read(layout.router_state()).ok().and_then(|b| serde_json::from_slice(&b).ok());
    Ok(state)
}

/// What `airlock daemon status` says of the router.
#[derive(Debug, Serialize)]
pub struct Status {
    /// Its process id.
    pub pid: u32,
    /// The host DSNs name.
    pub host: String,
    /// Its port.
    pub port: u16,
}

/// The data root's router, if one runs.
pub fn status(layout: &Layout) -> Result<Option<Status>> {
    Ok(running(layout)?.map(|s| Status { pid: s.pid, host: s.address.host, port: s.address.port }))
}

/// Stops the data root's router (if one runs), for `airlock daemon stop
/// --with-router`; true if one was stopped.
pub async fn stop_running(layout: &Layout) -> Result<bool> {
    match running(layout)? {
        Some(state) => {
            stop(layout, state.pid).await;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// SIGTERM, then SIGKILL after 5 s; returns when the lock is free, or once
/// `pid` is no longer this data root's router (gone, and its pid perhaps
/// another process's now) while something else holds the lock, or 5 s after
/// the SIGKILL: said in the log, and nobody else is ever signalled.
async fn stop(layout: &Layout, pid: u32) {
    use nix::sys::signal::{kill, Signal};
    let spec = std::fs::canonicalize(spec_file(layout)).ok();
    let deadline = Instant::now() + Duration::from_secs(5);
    let (mut signalled, mut not_it) = (None, 0);
    while matches!(try_lock(layout), Ok(None)) {
        let late = Instant::now() > deadline;
        // Twice in a row: an exiting router loses its command line a moment
        // before it lets go of its lock.
        not_it = if is_this_roots_router(spec.as_deref(), pid) { 0 } else { not_it + 1 };
        if not_it > 1 || Instant::now() > deadline + Duration::from_secs(5) {
            tracing::warn!(pid, lock = %layout.router_lock().display(),
                "the router's lock is held by a process that is not the router this data root names; \
                 not waiting for it");
            return;
        }
        let signal = if late { Signal::SIGKILL } else { Signal::SIGTERM };
        if not_it == 0 && signalled != Some(signal) {
            let _ = kill(nix::unistd::Pid::from_raw(pid as i32), signal);
            signalled = Some(signal);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether process `pid` is a router of this data root (`airlock router
/// --spec SPEC`, `spec` its settings file resolved), so a pid a gone router
/// left in its state, and another process took since, is never signalled.
fn is_this_roots_router(spec: Option<&Path>, pid: u32) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let (Some(spec), Ok(cmdline)) = (spec, std::fs::read(format!("/proc/{pid}/cmdline"))) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    args.windows(3).any(|w| {
        let named = Path::new(std::ffi::OsStr::from_bytes(w[2]));
        w[0] == b"router" && w[1] == b"--spec" && std::fs::canonicalize(named).is_ok_and(|n| n == spec)
    })
}

/// The file a router of this data root reads its settings from.
fn spec_file(layout: &Layout) -> std::path::PathBuf {
    layout.home().join("router.spec.json")
}

/// Starts `airlock router` in a session of its own (so no signal for the
/// daemon's process group reaches it), logging where the daemon logs, and
/// waits until it listens.
async fn launch(layout: &Layout, spec: &Spec) -> Result<Address> {
    let spec_file = spec_file(layout);
    super::tls::write_private(&spec_file, &serde_json::to_vec_pretty(spec).expect("spec serializes"))?;
    // The daemon's log is root's alone (it names every sandbox); made so here
    // when the router is the first to write it.
    let log =
        std::os::unix::fs::OpenOptionsExt::mode(std::fs::OpenOptions::new().create(true).append(true), 0o600)
            .open(layout.daemon_log())?;
    let exe = std::env::current_exe()?;
    let mut command = std::process::Command::new(exe);
    command
        .arg("router")
        .arg("--spec")
        .arg(&spec_file)
        .env("AIRLOCK_HOME", layout.home())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: setsid is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        command.pre_exec(|| nix::unistd::setsid().map(|_| ()).map_err(std::io::Error::from));
    }
    let mut child = command.spawn()?;
    let pid = child.id();
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some(state) = running(layout)?.filter(|s| s.pid == pid) {
            // Reap it if it exits while this daemon lives.
            std::thread::spawn(move || child.wait());
            return Ok(state.address);
        }
        if let Some(status) = child.try_wait()? {
            let log = std::fs::read_to_string(layout.daemon_log()).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(2).collect();
            return Err(Error::internal(format!(
                "the router exited at start ({status}): {}",
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            )));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err(Error::internal("the router did not start listening in time"));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Takes the router lock without waiting: Some while held by this process,
/// None if another process holds it.
fn try_lock(layout: &Layout) -> Result<Option<nix::fcntl::Flock<std::fs::File>>> {
    airlock_core::process::try_lock_file(&layout.router_lock())
}
