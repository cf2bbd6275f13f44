//! `airlock serve`: one daemon per data root, owning the store, reconciling at
//! start, running the reaper and serving the API on a unix socket (and on TCP
//! with a bearer token when configured).

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use tokio::sync::Notify;

use crate::api::{self, AppState};
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::layout::prepare_home;
use airlock_core::layout::Layout;
use airlock_host::users::place::LeasePlace;
use airlock_lifecycle::engine::{Config, Engine};
use airlock_reaper as reaper;

/// What `airlock serve` runs with: the engine's settings, and each service's.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The engine's (and so the lifecycle's) settings.
    pub engine: Config,
    /// The lease directory and uid range given, if any ([`LeasePlace`]).
    pub leases: LeasesGiven,
    /// The PostgreSQL and Redis router.
    pub router: airlock_router::RouterConfig,
    /// Where the MCP gateway listens; `None` turns it off.
    pub gateway: Option<SocketAddr>,
    /// Where Prometheus metrics are served; `None` turns them off.
    pub metrics: Option<SocketAddr>,
    /// The cluster this daemon is a node of; `None` for a lone daemon.
    pub cluster: Option<airlock_cluster::Settings>,
}

/// The lease directory and uid range `serve` was given; what is not given is
/// the data root's recorded place ([`LeasePlace`]), or the default.
#[derive(Debug, Clone, Default)]
pub struct LeasesGiven {
    /// `--lease-dir`.
    pub dir: Option<std::path::PathBuf>,
    /// `--uid-range`.
    pub uid_range: Option<airlock_host::users::UidRange>,
}

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
pub async fn serve(settings: Settings, listen: Listen) -> Result<()> {
    let Settings { engine: mut config, leases, router, gateway, metrics: metrics_addr, cluster } = settings;
    // Whatever the launcher left open stays with the daemon, never its children.
    airlock_core::descriptors::close_on_exec_from_3()?;
    let layout = Layout::new(&config.home);
    prepare_home(layout.home())?;
    let _lock = lock(&layout)?;
    let occupied = std::fs::read_dir(layout.sandboxes()).is_ok_and(|mut d| d.next().is_some());
    let place = LeasePlace::settle(&layout.lease_place(), leases.dir, leases.uid_range, occupied)?;
    (config.lease_dir, config.uid_range) = (place.lease_dir, place.uid_range);
    airlock_core::descriptors::raise_descriptor_limit();
    // A dead daemon's listening socket can outlive it for a moment in a child that
    // has not yet called exec; unlink its path now, so no client queues up on it
    // while this daemon reconciles.
    let _ = std::fs::remove_file(layout.api_socket());
    let engine = Arc::new(Engine::open(config)?);
    // The services the lifecycle tells of sandbox changes, and the migration
    // airlock the gateway's test_migration tool reaches through it.
    airlock_gateway::register(&engine);
    engine.services.perform_migrations(Arc::new(airlock_migrate::agent::ForAgents::new(&engine)));
    // A volume that could not give one sandbox its headroom is refused now.
    airlock_lifecycle::sandbox::headroom::check_volume(&engine)?;
    let counted_from = airlock_telemetry::metrics::Start::now(&engine);
    let traced_from = airlock_state::audit::follow::Follower::at_end(&engine.layout.audit());
    let reconciled = reaper::reconcile(&engine).await?;
    tracing::info!(?reconciled, "reconciled state, processes and directories");
    let doctor = engine.doctor();
    tracing::info!(backend = ?doctor.storage_backend, filesystem = %doctor.filesystem, instance_user = %doctor.instance_user, "storage probed");
    for w in &doctor.warnings {
        tracing::warn!("{w}");
    }
    if let Some(address) = airlock_router::process::supervise(engine.clone(), router.clone()).await? {
        engine.router.set(address);
    }
    if let Some(addr) = gateway {
        let advertise = router.advertise.clone();
        airlock_gateway::http::start(engine.clone(), addr, advertise.as_deref()).await?;
    }
    reaper::spawn(engine.clone());
    reaper::watchdog::spawn(engine.clone());
    reaper::scripts::spawn(engine.clone());
    airlock_lifecycle::sandbox::pool::spawn(engine.clone());
    airlock_state::audit::spawn_ticks(engine.audit.clone());
    let metrics =
        airlock_telemetry::metrics::spawn(engine.clone(), counted_from, &airlock_gateway::tools::ALL);
    let traces = airlock_telemetry::traces::spawn(engine.layout.audit(), traced_from)?;
    if let Some(addr) = metrics_addr {
        airlock_telemetry::metrics::serve(engine.clone(), metrics.clone(), addr).await?;
    }

    let shutdown = Arc::new(Notify::new());
    let live = airlock_live::Live::open(engine.clone())?;
    airlock_live::watch::spawn(live.clone());
    // A node joins once its own sandboxes are reconciled, so what it publishes is true.
    let cluster = match cluster {
        Some(settings) => {
            let cluster = airlock_cluster::Cluster::join(engine.clone(), settings).await?;
            airlock_cluster::membership::spawn(cluster.clone());
            Some(cluster)
        }
        None => None,
    };
    let state = AppState {
        engine: engine.clone(),
        shutdown: shutdown.clone(),
        metrics,
        live,
        cluster: cluster.clone(),
    };
    let peers = match &cluster {
        Some(cluster) => {
            let addr = resolve(&cluster.settings.advertise)?;
            let listener =
                airlock_cluster::peer::PeerListener::bind(addr, cluster.server_config(), cluster.revoked())
                    .await?;
            tracing::info!(%addr, node = %cluster.name(), "serving the cluster's nodes (mutual TLS)");
            Some(listener)
        }
        None => None,
    };
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
    let unix_server = airlock_listen::serve::serve(
        unix,
        api::router(state.clone()),
        airlock_listen::serve::Bounds { max_connections: 1024, ..Default::default() },
        stopped_signal(stopped.clone()),
    );
    let tcp_server = tcp.zip(listen.token).map(|((addr, tcp), token)| {
        tracing::info!(%addr, "serving the API on TCP (bearer token required)");
        let app = api::router(state.clone())
            .layer(axum::middleware::from_fn_with_state(Arc::new(token), api::require_token));
        let signal = stopped_signal(stopped.clone());
        tokio::spawn(airlock_listen::serve::serve(tcp, app, airlock_listen::serve::Bounds::default(), signal))
    });

    let peer_server = peers.map(|listener| {
        let signal = stopped_signal(stopped.clone());
        // Only here are requests marked as a peer's: served, never forwarded again.
        let app = api::router(state.clone()).layer(axum::middleware::from_fn(api::cluster::from_peer));
        tokio::spawn(airlock_listen::serve::serve(
            listener,
            app,
            airlock_listen::serve::Bounds::default(),
            signal,
        ))
    });
    let unix_task = tokio::spawn(unix_server);
    stop.await;
    tracing::info!("stopping the API; sandboxes keep running");
    let _ = stopped_tx.send(true);
    let _ = unix_task.await;
    if let Some(t) = tcp_server {
        let _ = t.await;
    }
    if let Some(t) = peer_server {
        let _ = t.await;
    }
    let _ = std::fs::remove_file(&socket);
    if let Some(traces) = traces {
        tokio::task::spawn_blocking(move || traces.shutdown()).await?;
    }
    Ok(())
}

/// The socket address of `--advertise` (`HOST:PORT`, a name resolved once).
fn resolve(advertise: &str) -> Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    advertise.to_socket_addrs().ok().and_then(|mut a| a.next()).ok_or_else(|| {
        Error::new(
            ErrorCode::InvalidArguments,
            format!("--advertise {advertise:?} is not an address of this host"),
            "give HOST:PORT, such as 10.0.0.2:7440",
        )
    })
}

/// Takes the data root's exclusive lock, so only one daemon serves it.
///
/// A daemon killed with SIGKILL can leave the lock for a few milliseconds in a
/// child it forked that has not yet reached exec (the descriptor closes there), so
/// a busy lock is retried briefly before it counts as another live daemon.
fn lock(layout: &Layout) -> Result<nix::fcntl::Flock<std::fs::File>> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    loop {
        match airlock_core::process::try_lock_file(&layout.daemon_lock())? {
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
