//! `airlock serve`: the daemon's settings from its flags, checked before it starts.

use std::path::Path;

use super::{Cli, ServeArgs};
use crate::daemon;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::validate;
use airlock_lifecycle::engine::Config;

/// Logs to stderr at `AIRLOCK_LOG`'s level (default info), for the daemon and the router.
pub(super) fn init_logging() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("AIRLOCK_LOG").unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}

pub(super) async fn serve(cli: &Cli, args: &ServeArgs) -> Result<i32> {
    init_logging();
    let mut config = Config::new(cli.layout().home());
    config.max_sandboxes = args.max_sandboxes;
    config.default_ttl = validate::parse_ttl(&args.default_ttl)?;
    config.max_ttl = validate::parse_ttl(&args.max_ttl)?;
    if config.default_ttl > config.max_ttl {
        return Err(Error::new(
            ErrorCode::InvalidTtl,
            "the default TTL is over the maximum TTL",
            "raise --max-ttl or lower --default-ttl",
        ));
    }
    config.instance_user = args.instance_user.clone();
    // Settled under the data root's lock, against what it recorded.
    let leases = daemon::LeasesGiven {
        dir: args.lease_dir.clone(),
        uid_range: args.uid_range.as_deref().map(airlock_host::users::UidRange::parse).transpose()?,
    };
    config.default_pool_size = args.pool_size;
    if args.pool_size < 0 || args.pool_size as usize > args.max_sandboxes {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            "--pool-size is out of range",
            "give between 0 and --max-sandboxes",
        ));
    }
    config.disk_limit_bytes = validate::bytes(&args.disk_limit)?;
    if config.disk_limit_bytes < 1 << 20 {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            "--disk-limit is below 1MB",
            "give a size such as 500M or 10G",
        ));
    }
    config.disk_headroom_bytes = validate::bytes(&args.disk_headroom)?;
    if config.disk_headroom_bytes < 8 << 20 {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            "--disk-headroom is below 8MB",
            "give a size such as 64M: a server needs room for its temporary files and catalog writes",
        ));
    }
    config.cgroup_limits = airlock_host::cgroup::CgroupLimits {
        memory_bytes: validate::bytes(&args.memory_limit)?,
        pids: args.pids_limit,
        cpu_weight: args.cpu_weight,
    };
    if config.cgroup_limits.memory_bytes < 64 << 20
        || !(32..=100_000).contains(&args.pids_limit)
        || !(1..=10_000).contains(&args.cpu_weight)
    {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            "a sandbox limit is out of range",
            "give --memory-limit of at least 64M, --pids-limit between 32 and 100000, --cpu-weight between 1 and 10000",
        ));
    }
    config.pg_bin = args.pg_bin.clone();
    if let Some(root) = &args.pg_root {
        config.pg_root = root.clone();
    }
    config.force_copy = match args.storage.as_str() {
        "auto" => false,
        "copy" => true,
        other => {
            return Err(Error::new(
                ErrorCode::InvalidRequest,
                format!("unknown storage mode {other:?}"),
                "use auto or copy",
            ))
        }
    };
    config.favor_cgroup_moves = args.favor_cgroup_moves == super::Switch::On;
    config.max_running = args.max_running;
    config.max_disk_bytes = args.max_disk.as_deref().map(validate::bytes).transpose()?;
    config.disk_reserve = validate::Reserve::parse(&args.disk_reserve)?;
    config.default_idle_suspend = validate::duration("--idle-suspend", &args.idle_suspend)?;
    config.import_keep = validate::duration("--import-keep", &args.import_keep)?;
    config.audit = airlock_state::audit::AuditOptions {
        fsync: args.audit_fsync,
        segment_bytes: validate::bytes(&args.audit_segment_size)?.max(4096),
        keep_segments: args.audit_keep_segments,
        checkpoint_every: args.audit_checkpoint_every.max(1),
        checkpoint_interval: validate::duration(
            "--audit-checkpoint-interval",
            &args.audit_checkpoint_interval,
        )?
        .max(std::time::Duration::from_secs(1)),
    };
    let metrics = args.metrics;
    if let Some(addr) = args.metrics.filter(|a| !a.ip().is_loopback() && !args.metrics_public) {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            format!("--metrics {addr} is not a loopback address, and metrics need no token"),
            "serve them on 127.0.0.1 (and let a Prometheus on the host scrape them), or pass --metrics-public \
             to show them to anyone who can reach that address",
        ));
    }
    let gateway: Option<std::net::SocketAddr> = match args.gateway.as_str() {
        "off" => None,
        addr => Some(addr.parse().map_err(|_| {
            Error::new(
                ErrorCode::InvalidRequest,
                format!("--gateway {addr:?} is not HOST:PORT"),
                "give an address such as 127.0.0.1:7433 (port 0 picks a free one), or off",
            )
        })?),
    };
    if let Some(addr) = gateway.filter(|a| !a.ip().is_loopback() && !args.gateway_public) {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            format!("--gateway {addr} is not a loopback address, and the gateway speaks plain HTTP"),
            "serve it on 127.0.0.1 (agents on the host reach it there), or put TLS in front and pass \
             --gateway-public to accept connections from anyone who can reach that address",
        ));
    }
    let mut router = airlock_router::RouterConfig {
        listen: match args.router.as_str() {
            "off" => None,
            addr => Some(addr.parse().map_err(|_| {
                Error::new(
                    ErrorCode::InvalidRequest,
                    format!("--router {addr:?} is not HOST:PORT"),
                    "give an address such as 127.0.0.1:7432 (port 0 picks a free one), or off",
                )
            })?),
        },
        advertise: args.router_host.clone(),
        tls: args.tls,
        cert: match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => {
                Some(airlock_router::tls::CertFiles { cert: cert.clone(), key: key.clone() })
            }
            _ => None,
        },
        startup_timeout: validate::duration("--router-startup-timeout", &args.router_startup_timeout)?,
        max_connections: args.router_max_connections.max(1),
        handoff: args.router_handoff == super::Switch::On,
        socket_dir: args.router_socket.clone(),
        redis_listen: match args.redis_router.as_str() {
            "off" => None,
            addr => Some(addr.parse().map_err(|_| {
                Error::new(
                    ErrorCode::InvalidRequest,
                    format!("--redis-router {addr:?} is not HOST:PORT"),
                    "give an address such as 127.0.0.1:7434 (port 0 picks a free one), or off",
                )
            })?),
        },
        relay: None,
    };
    if let (Some(dir), Some(_)) = (&router.socket_dir, &router.listen) {
        // Not where a sandbox's processes see: the system trees, the
        // PostgreSQL trees its server is run from, the data root.
        let mut seen = airlock_host::rootfs::seen_by_every_view();
        seen.extend([cli.layout().home().to_owned(), config.pg_root.clone()]);
        seen.extend(
            config.pg_bin.as_deref().and_then(Path::parent).and_then(Path::parent).map(Path::to_owned),
        );
        airlock_router::local::check_unseen(dir, &seen)?;
        airlock_router::local::prepare(dir)?;
    }
    let public = |addr: &Option<std::net::SocketAddr>| addr.filter(|a| !a.ip().is_loopback());
    if let Some(addr) = public(&args.tcp).filter(|_| !args.tcp_public) {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            format!("--tcp {addr} is not a loopback address, and the API speaks plain HTTP"),
            "serve it on 127.0.0.1, or put TLS in front and pass --tcp-public (the bearer token would otherwise \
             cross the network in clear)",
        ));
    }
    if router.tls == airlock_router::TlsMode::Off && !args.plaintext_public {
        let routers = [("--router", &router.listen), ("--redis-router", &router.redis_listen)];
        if let Some((flag, Some(addr))) = routers.into_iter().find(|(_, a)| public(a).is_some()) {
            return Err(Error::new(
                ErrorCode::InvalidRequest,
                format!("{flag} {addr} is not a loopback address, and --tls off sends every session in clear"),
                "use --tls optional or required (the DSNs then verify the router), or pass --plaintext-public",
            ));
        }
    }
    let token = match (&cli.token_file, std::env::var("AIRLOCK_TOKEN").ok()) {
        (Some(f), _) => Some(std::fs::read_to_string(f)?.trim().to_owned()),
        (None, t) => t.map(|t| t.trim().to_owned()),
    };
    if let (Some(_), Some(token)) = (args.tcp, &token) {
        if token.len() < MIN_TOKEN {
            return Err(Error::new(
                ErrorCode::InvalidRequest,
                format!(
                    "the TCP API's bearer token is {} bytes long; it needs at least {MIN_TOKEN}",
                    token.len()
                ),
                "make one with `openssl rand -hex 32 > token` (the file is read and trimmed), then pass \
                 --token-file token",
            ));
        }
    }
    let cluster = cluster_settings(cli, args)?;
    if let (Some(cluster), Some(_)) = (&cluster, router.listen) {
        router.relay = relay_settings(cluster, args.relay.as_deref())?;
    }
    let settings = daemon::Settings { engine: config, leases, router, gateway, metrics, cluster };
    daemon::serve(settings, daemon::Listen { tcp: args.tcp, token }).await?;
    Ok(0)
}

/// The node's settings from `--cluster`, `--node`, `--advertise`; a join
/// token given is installed first.
fn cluster_settings(cli: &Cli, args: &ServeArgs) -> Result<Option<airlock_cluster::Settings>> {
    let (Some(etcd), Some(node), Some(advertise)) = (&args.cluster, &args.node, &args.advertise) else {
        return Ok(None);
    };
    validate::name("node", node)?;
    airlock_cluster::ca::host_of(advertise)?;
    let lease_ttl = validate::duration("--lease-ttl", &args.lease_ttl)?;
    if !(std::time::Duration::from_secs(2)..=std::time::Duration::from_secs(300)).contains(&lease_ttl) {
        return Err(Error::new(
            ErrorCode::InvalidArguments,
            "--lease-ttl is out of range",
            "give between 2s and 5m: it is how long a stopped node goes unnoticed",
        ));
    }
    if let Some(file) = &args.join {
        let token = std::fs::read_to_string(file).map_err(|e| {
            Error::new(
                ErrorCode::FileUnreadable,
                format!("the join token {} does not read: {e}", file.display()),
                "give the file `airlock cluster token --out` wrote",
            )
        })?;
        airlock_cluster::ca::join(&cli.layout().cluster(), &token, node)?;
    }
    if let Some(ca) = &args.etcd_ca {
        if !etcd.trim_start().starts_with("https://") {
            return Err(Error::new(
                ErrorCode::InvalidArguments,
                "--etcd-ca is given, and --cluster names http:// members",
                "name etcd's members with https:// URLs",
            ));
        }
        let client = args.etcd_cert.clone().zip(args.etcd_key.clone());
        airlock_cluster::etcd_tls::install(
            &cli.layout().cluster(),
            &airlock_cluster::etcd_tls::Given { ca: ca.clone(), client },
        )?;
    }
    // The members and the TLS they are reached with are checked before
    // anything starts (the router reads etcd too).
    let kept = airlock_cluster::etcd_tls::load(&cli.layout().cluster())?;
    airlock_cluster::etcd::Etcd::new(etcd, std::time::Duration::from_secs(2), kept)?;
    Ok(Some(airlock_cluster::Settings {
        etcd: etcd.clone(),
        node: node.clone(),
        advertise: advertise.clone(),
        labels: validate::labels(&args.node_labels)?,
        lease_ttl,
    }))
}

/// The router's relay settings of a node: on the advertised host's port
/// 7441 unless `--relay` says otherwise.
fn relay_settings(
    cluster: &airlock_cluster::Settings,
    relay: Option<&str>,
) -> Result<Option<airlock_router::RelaySettings>> {
    let listen = match relay {
        Some("off") => return Ok(None),
        Some(addr) => addr.parse().map_err(|_| {
            Error::new(
                ErrorCode::InvalidArguments,
                format!("--relay {addr:?} is not HOST:PORT"),
                "give an address of this node such as 10.0.0.2:7441, or off",
            )
        })?,
        None => {
            use std::net::ToSocketAddrs;
            let mut addr =
                cluster.advertise.to_socket_addrs().ok().and_then(|mut a| a.next()).ok_or_else(|| {
                    Error::new(
                        ErrorCode::InvalidArguments,
                        format!("--advertise {:?} does not resolve", cluster.advertise),
                        "give an address of this node, or name the relay's with --relay HOST:PORT",
                    )
                })?;
            addr.set_port(airlock_router::DEFAULT_RELAY_PORT);
            addr
        }
    };
    Ok(Some(airlock_router::RelaySettings {
        listen,
        node: cluster.node.clone(),
        advertise: cluster.advertise.clone(),
        coordinator: cluster.etcd.clone(),
    }))
}

/// The shortest bearer token the TCP API takes (an empty one would let anyone in).
pub(super) const MIN_TOKEN: usize = 16;
