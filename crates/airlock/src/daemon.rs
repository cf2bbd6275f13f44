//! `airlock serve`: one daemon per data root, owning the store, reconciling at
//! start, running the reaper and serving the API on a unix socket (and on TCP
//! with a bearer token when configured).

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use tokio::sync::Notify;

use crate::api::{self, AppState};
use crate::engine::{prepare_home, Config, Engine};
use crate::reaper;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::layout::Layout;

/// Where the API listens besides its unix socket.
#[derive(Debug, Clone, Default)]
pub struct Listen {
    /// A TCP address, served only with a bearer token.
    pub tcp: Option<SocketAddr>,
    /// The bearer token TCP clients must send.
    pub token: Option<String>,
}

/// Runs the daemon until SIGTERM, SIGINT or `POST /v1/shutdown`. Sandboxes keep
/// running after it exits; the next daemon picks them up.
pub async fn serve(config: Config, listen: Listen) -> Result<()> {
    // Whatever the launcher left open stays with the daemon, never its children.
    airlock_core::descriptors::close_on_exec_from_3()?;
    let layout = Layout::new(&config.home);
    prepare_home(layout.home())?;
    let _lock = lock(&layout)?;
    raise_descriptor_limit();
    // A dead daemon's listening socket can outlive it for a moment in a child that
    // has not yet called exec; unlink its path now, so no client queues up on it
    // while this daemon reconciles.
    let _ = std::fs::remove_file(layout.api_socket());
    let engine = Arc::new(Engine::open(config)?);
    // A volume that could not give one sandbox its headroom is refused now.
    crate::sandbox::headroom::check_volume(&engine)?;
    let counted_from = crate::metrics::Start::now(&engine);
    let traced_from = airlock_state::audit::follow::Follower::at_end(&engine.layout.audit());
    let reconciled = reaper::reconcile(&engine).await?;
    tracing::info!(?reconciled, "reconciled state, processes and directories");
    let doctor = engine.doctor();
    tracing::info!(backend = ?doctor.storage_backend, filesystem = %doctor.filesystem, instance_user = %doctor.instance_user, "storage probed");
    for w in &doctor.warnings {
        tracing::warn!("{w}");
    }
    if let Some(address) = crate::router::process::supervise(engine.clone()).await? {
        let _ = engine.router.set(address);
    }
    if let Some(addr) = engine.config.gateway {
        let advertise = engine.config.router.advertise.clone();
        let base = crate::gateway::http::start(engine.clone(), addr, advertise.as_deref()).await?;
        let _ = engine.gateway.set(base);
    }
    reaper::spawn(engine.clone());
    reaper::watchdog::spawn(engine.clone());
    reaper::scripts::spawn(engine.clone());
    crate::sandbox::pool::spawn(engine.clone());
    airlock_state::audit::spawn_ticks(engine.audit.clone());
    let metrics = crate::metrics::spawn(engine.clone(), counted_from);
    let traces = crate::traces::spawn(engine.layout.audit(), traced_from)?;
    if let Some(addr) = engine.config.metrics {
        crate::metrics::serve(engine.clone(), metrics.clone(), addr).await?;
    }

    let shutdown = Arc::new(Notify::new());
    let state = AppState { engine: engine.clone(), shutdown: shutdown.clone(), metrics };
    // TCP first: a client that finds the unix socket answering may go on to use TCP.
    let tcp = match (listen.tcp, &listen.token) {
        (Some(addr), Some(_)) => Some((addr, tokio::net::TcpListener::bind(addr).await?)),
        (Some(_), None) => {
            return Err(Error::new(
                ErrorCode::InvalidRequest,
                "a TCP listener needs a bearer token",
                "pass --token-file FILE (or set AIRLOCK_TOKEN) together with --tcp",
            ))
        }
        _ => None,
    };
    let socket = layout.api_socket();
    let _ = std::fs::remove_file(&socket);
    let unix = tokio::net::UnixListener::bind(&socket)?;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))?;
    tracing::info!(socket = %socket.display(), "serving the API");

    let stop = {
        let shutdown = shutdown.clone();
        async move {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("SIGTERM handler");
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
                _ = shutdown.notified() => {}
            }
        }
    };
    let (stopped_tx, stopped) = tokio::sync::watch::channel(false);
    let stopped_signal = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    // The socket is root's alone; its bounds matter less than the TCP listener's.
    let unix_server = crate::serve::serve(
        unix,
        api::router(state.clone()),
        crate::serve::Bounds { max_connections: 1024, ..Default::default() },
        stopped_signal(stopped.clone()),
    );
    let tcp_server = tcp.zip(listen.token).map(|((addr, tcp), token)| {
        tracing::info!(%addr, "serving the API on TCP (bearer token required)");
        let app = api::router(state)
            .layer(axum::middleware::from_fn_with_state(Arc::new(token), api::require_token));
        let signal = stopped_signal(stopped.clone());
        tokio::spawn(crate::serve::serve(tcp, app, crate::serve::Bounds::default(), signal))
    });

    let unix_task = tokio::spawn(unix_server);
    stop.await;
    tracing::info!("stopping the API; sandboxes keep running");
    let _ = stopped_tx.send(true);
    let _ = unix_task.await;
    if let Some(t) = tcp_server {
        let _ = t.await;
    }
    let _ = std::fs::remove_file(&socket);
    if let Some(traces) = traces {
        tokio::task::spawn_blocking(move || traces.shutdown()).await?;
    }
    Ok(())
}

/// Lifts the soft limit on open files to the hard one: the listeners' caps
/// assume thousands of descriptors, and the usual soft default is 1024.
pub(crate) fn raise_descriptor_limit() {
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

/// Takes the data root's exclusive lock, so only one daemon serves it.
///
/// A daemon killed with SIGKILL can leave the lock for a few milliseconds in a
/// child it forked that has not yet reached exec (the descriptor closes there), so
/// a busy lock is retried briefly before it counts as another live daemon.
fn lock(layout: &Layout) -> Result<nix::fcntl::Flock<std::fs::File>> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    loop {
        match try_lock_file(&layout.daemon_lock())? {
            Some(lock) => return Ok(lock),
            None if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50))
            }
            None => {
                return Err(Error::new(
                    ErrorCode::InvalidRequest,
                    format!("another daemon already serves {}", layout.home().display()),
                    "use that one, or stop it first (`airlock daemon stop`)",
                ))
            }
        }
    }
}

/// Takes an exclusive lock on the file at `path` (made if missing) without
/// waiting: Some while this process holds it, None if another process does.
pub(crate) fn try_lock_file(path: &std::path::Path) -> Result<Option<nix::fcntl::Flock<std::fs::File>>> {
    let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(path)?;
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(Some(lock)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(Error::internal(format!("locking {}: {e}", path.display()))),
    }
}
