//! What each subcommand does.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper::Method;

use super::output;
use super::{
    Cli, Command, DaemonCommand, ForkArgs, GoldenCommand, McpArgs, MigrateCommand, MigratePromoteArgs,
    MigrateStatsArgs, MigrateTestArgs, Placement, PostgresCommand, ServeArgs, StorageCommand,
};
use crate::api::ExtendRequest;
use crate::daemon;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::events::Event;
use airlock_core::validate;
use airlock_host::storage;
use airlock_lifecycle::engine::{Config, Doctor};
use airlock_lifecycle::golden::{CreateGolden, Golden};
use airlock_lifecycle::sandbox::{
    Access, BranchRequest, ExecRequest, ExecResult, ForkRequest, Forked, Limits, Mode, Sandbox,
};
use airlock_listen::client::encode;

pub(super) const NO_BODY: Option<&()> = None;

pub(super) async fn run(cli: Cli) -> Result<i32> {
    let json = cli.json;
    match &cli.command {
        Command::Serve(args) => serve(&cli, args).await,
        Command::Router { spec } => {
            init_logging();
            airlock_router::process::run(cli.layout().home(), spec).await?;
            Ok(0)
        }
        Command::Storage(StorageCommand::Init { size, filesystem }) => {
            let size = storage::volume::parse_size(size)?;
            let layout = cli.layout();
            if std::os::unix::net::UnixStream::connect(layout.api_socket()).is_ok() {
                return Err(Error::new(
                    ErrorCode::StorageFailed,
                    "a daemon is serving this data root",
                    "stop it first (`airlock daemon stop`), then run storage init",
                ));
            }
            airlock_core::layout::prepare_home(layout.home())?;
            let report = storage::volume::init(&layout, size, *filesystem)?;
            output::print(json, &report, || {
                if report.created {
                    format!(
                        "mounted a {} {} image (reflink={}, quota per sandbox={}) on {}",
                        output::bytes(report.size_bytes),
                        report.filesystem,
                        report.reflink,
                        report.quota,
                        report.mount_point
                    )
                } else {
                    format!(
                        "{} is already a prepared {} volume (reflink={})",
                        report.mount_point, report.filesystem, report.reflink
                    )
                }
            });
            if !json {
                for warning in &report.warnings {
                    eprintln!("warning: {warning}");
                }
            }
            Ok(0)
        }
        Command::Daemon(DaemonCommand::Stop { with_router }) => {
            let layout = cli.layout();
            let running = std::os::unix::net::UnixStream::connect(layout.api_socket()).is_ok();
            if running {
                cli.client()?.call_raw(Method::POST, "/v1/shutdown", None).await?;
                for _ in 0..500 {
                    if !layout.api_socket().exists() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            let router = *with_router && airlock_router::process::stop_running(&layout).await?;
            let answer = serde_json::json!({"stopped": running, "router_stopped": router});
            output::print(json, &answer, || match (running, router) {
                (true, true) => "daemon and router stopped; sandboxes keep running".into(),
                (true, false) => "daemon stopped; sandboxes and router sessions keep running".into(),
                (false, true) => "no daemon was running; router stopped".into(),
                (false, false) => "no daemon is running".into(),
            });
            Ok(0)
        }
        Command::Daemon(DaemonCommand::Status) => {
            let up = std::os::unix::net::UnixStream::connect(cli.layout().api_socket()).is_ok();
            let router = airlock_router::process::status(&cli.layout())?;
            let answer = serde_json::json!({"running": up, "router": router});
            output::print(json, &answer, || {
                let daemon = if up { "running" } else { "not running" };
                match &router {
                    Some(r) => format!("{daemon}; router pid {} on {}:{}", r.pid, r.host, r.port),
                    None => format!("{daemon}; no router"),
                }
            });
            Ok(if up { 0 } else { ErrorCode::DaemonUnreachable.exit_code() })
        }
        Command::Bench(cmd) => super::bench::run(&cli, cmd).await,
        Command::Golden(cmd) => golden(&cli, cmd).await,
        Command::Fork(args) => fork(&cli, args).await,
        Command::Mcp(args) => mcp(&cli, args).await,
        Command::Migrate(MigrateCommand::Test(args)) => migrate_test(&cli, args).await,
        Command::Migrate(MigrateCommand::Promote(args)) => migrate_promote(&cli, args).await,
        Command::Migrate(MigrateCommand::Stats(args)) => migrate_stats(args).await,
        Command::Ls { golden, labels } => {
            validate::labels(labels)?;
            let mut query = Vec::new();
            if let Some(g) = golden {
                query.push(format!("golden={}", encode(g)));
            }
            query.extend(labels.iter().map(|l| format!("label={}", encode(l))));
            let list: Vec<Sandbox> = cli
                .client()?
                .call(Method::GET, &format!("/v1/sandboxes?{}", query.join("&")), NO_BODY)
                .await?;
            let list: Vec<Sandbox> = list
                .into_iter()
                .map(|mut s| {
                    s.dsn = None;
                    s.socket_dsn = None;
                    s.redis_url = None;
                    s.redis_socket_url = None;
                    s
                })
                .collect();
            output::print(json, &list, || output::sandboxes(&list));
            Ok(0)
        }
        Command::Show { id } => {
            let mut sb: Sandbox =
                cli.client()?.call(Method::GET, &format!("/v1/sandboxes/{}", encode(id)), NO_BODY).await?;
            // The credential is printed only when asked for (`airlock dsn`).
            sb.dsn = None;
            sb.socket_dsn = None;
            sb.redis_url = None;
            sb.redis_socket_url = None;
            output::print(json, &sb, || output::sandbox(&sb));
            Ok(0)
        }
        Command::Rm { ids } => {
            let client = cli.client()?;
            let mut removed = Vec::new();
            for id in ids {
                let sb: Sandbox =
                    client.call(Method::DELETE, &format!("/v1/sandboxes/{}", encode(id)), NO_BODY).await?;
                if !json {
                    output::line(&format!("deleted {}", sb.id));
                }
                removed.push(sb);
            }
            if json {
                output::print(json, &removed, String::new);
            }
            Ok(0)
        }
        Command::Branch { id, placement } => {
            let req = placement.checked()?;
            let forked: Forked = cli
                .client()?
                .call(Method::POST, &format!("/v1/sandboxes/{}/branch", encode(id)), Some(&req))
                .await?;
            print_forked(&forked, json);
            Ok(0)
        }
        Command::Promote { id, golden, allow_planted } => {
            validate::name("golden", golden)?;
            let body = crate::api::PromoteRequest { golden: golden.clone(), allow_planted: *allow_planted };
            let spinner = output::spinner(json, format!("promoting {id} to golden {golden}"));
            let g: Result<Golden> = cli
                .client()?
                .call(Method::POST, &format!("/v1/sandboxes/{}/promote", encode(id)), Some(&body))
                .await;
            spinner.finish_and_clear();
            let g = g?;
            output::print(json, &g, || output::golden(&g));
            Ok(0)
        }
        Command::Suspend { ids } | Command::Wake { ids } => {
            let (verb, done) = if matches!(cli.command, Command::Suspend { .. }) {
                ("suspend", "suspended")
            } else {
                ("wake", "running")
            };
            let client = cli.client()?;
            let mut changed = Vec::new();
            for id in ids {
                // The API leaves the connection strings out of this answer.
                let sb: Sandbox = client
                    .call(Method::POST, &format!("/v1/sandboxes/{}/{verb}", encode(id)), NO_BODY)
                    .await?;
                if !json {
                    output::line(&format!("{} is {done}", sb.id));
                }
                changed.push(sb);
            }
            if json {
                output::print(json, &changed, String::new);
            }
            Ok(0)
        }
        Command::Reset { id } => {
            let sb: Sandbox = cli
                .client()?
                .call(Method::POST, &format!("/v1/sandboxes/{}/reset", encode(id)), NO_BODY)
                .await?;
            output::print(json, &sb, || format!("{} is back to {}@{}", sb.id, sb.golden, sb.generation));
            Ok(0)
        }
        Command::Extend { id, ttl } => {
            let ttl = validate::parse_ttl(ttl)?;
            let body = ExtendRequest { ttl_seconds: ttl.as_secs().max(1) as i64 };
            let sb: Sandbox = cli
                .client()?
                .call(Method::POST, &format!("/v1/sandboxes/{}/extend", encode(id)), Some(&body))
                .await?;
            output::print(json, &sb, || format!("{} now expires at {}", sb.id, sb.expires_at.to_rfc3339()));
            Ok(0)
        }
        Command::Dsn { id, socket, redis } => {
            let sb: Sandbox =
                cli.client()?.call(Method::GET, &format!("/v1/sandboxes/{}", encode(id)), NO_BODY).await?;
            let dsn = if *redis {
                let url = if *socket { sb.redis_socket_url.clone() } else { sb.redis_url.clone() };
                Some(url.or(sb.redis_socket_url.clone()).ok_or_else(|| {
                    Error::new(
                        ErrorCode::InvalidRequest,
                        format!("sandbox {} has no Redis", sb.id),
                        "fork a golden made with --redis-seed or --redis-rdb",
                    )
                })?)
            } else if *socket {
                sb.socket_dsn.clone().or(sb.dsn.clone())
            } else {
                sb.dsn.clone()
            };
            let dsn = match dsn {
                Some(dsn) => dsn,
                None if sb.redis_socket_url.is_some() => return Err(no_postgres(&sb)),
                None => String::new(),
            };
            output::print(json, &serde_json::json!({"id": sb.id, "dsn": dsn}), || dsn.clone());
            Ok(0)
        }
        Command::Psql { id, args } => {
            let sb: Sandbox =
                cli.client()?.call(Method::GET, &format!("/v1/sandboxes/{}", encode(id)), NO_BODY).await?;
            psql(&sb, args)
        }
        Command::Exec { id, timeout, command } => {
            let timeout = humantime::parse_duration(timeout).map_err(|e| {
                Error::new(
                    ErrorCode::InvalidRequest,
                    format!("invalid timeout {timeout:?}: {e}"),
                    "give a duration such as 30s or 5m",
                )
            })?;
            let req = ExecRequest {
                argv: command.clone(),
                timeout_seconds: Some(timeout.as_secs().max(1)),
                stdin: None,
            };
            let result: ExecResult = cli
                .client()?
                .call(Method::POST, &format!("/v1/sandboxes/{}/exec", encode(id)), Some(&req))
                .await?;
            if json {
                output::print(true, &result, String::new);
            } else {
                use std::io::Write;
                output::write_stdout(result.stdout.as_bytes());
                let _ = std::io::stderr().write_all(result.stderr.as_bytes());
                if result.timed_out {
                    eprintln!(
                        "airlock: the command was killed after {}",
                        humantime::format_duration(timeout)
                    );
                }
            }
            // Like `timeout(1)`: 124 when the time ran out, 137 when a signal ended it.
            Ok(if result.timed_out { 124 } else { result.exit_code.unwrap_or(137) })
        }
        Command::Events { sandbox, limit } => {
            let mut path = format!("/v1/events?limit={limit}");
            if let Some(s) = sandbox {
                path.push_str(&format!("&sandbox={}", encode(s)));
            }
            let events: Vec<Event> = cli.client()?.call(Method::GET, &path, NO_BODY).await?;
            output::print(json, &events, || output::events(&events));
            Ok(0)
        }
        Command::Audit(command) => super::audit::run(&cli, command, json).await,
        Command::Stats => {
            let stats: airlock_telemetry::metrics::stats::Stats =
                cli.client()?.call(Method::GET, "/v1/stats", NO_BODY).await?;
            output::print(json, &stats, || airlock_telemetry::metrics::stats::render(&stats));
            Ok(0)
        }
        Command::Doctor => {
            let d: Doctor = cli.client()?.call(Method::GET, "/v1/doctor", NO_BODY).await?;
            output::print(json, &d, || output::doctor(&d));
            Ok(0)
        }
        Command::Postgres(PostgresCommand::Install { majors }) => {
            let root = airlock_postgres::majors::default_root();
            let mut reports = Vec::new();
            for major in majors {
                let spinner = output::spinner(json, format!("installing PostgreSQL {major}"));
                let say = |step: &str| spinner.set_message(step.to_owned());
                let report =
                    tokio::task::block_in_place(|| airlock_postgres::install::install(&root, *major, &say));
                spinner.finish_and_clear();
                reports.push(report?);
            }
            output::print(json, &reports, || output::installed(&reports));
            Ok(0)
        }
        Command::Postgres(PostgresCommand::Ls) => {
            let d: Doctor = cli.client()?.call(Method::GET, "/v1/doctor", NO_BODY).await?;
            output::print(json, &d.postgres_majors, || output::majors(&d.postgres_majors));
            Ok(0)
        }
    }
}

/// Logs to stderr at `AIRLOCK_LOG`'s level (default info), for the daemon and the router.
fn init_logging() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("AIRLOCK_LOG").unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}

async fn serve(cli: &Cli, args: &ServeArgs) -> Result<i32> {
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
    config.uid_range = airlock_host::users::UidRange::parse(&args.uid_range)?;
    config.lease_dir = args.lease_dir.clone();
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
    let router = airlock_router::RouterConfig {
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
    };
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
    let settings = daemon::Settings { engine: config, router, gateway, metrics };
    daemon::serve(settings, daemon::Listen { tcp: args.tcp, token }).await?;
    Ok(0)
}

/// The shortest bearer token the TCP API takes (an empty one would let anyone in).
const MIN_TOKEN: usize = 16;

fn absolute(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    paths
        .iter()
        .map(|p| {
            std::fs::canonicalize(p).map_err(|e| {
                Error::new(
                    ErrorCode::FileUnreadable,
                    format!("cannot read {}: {e}", p.display()),
                    "check the path",
                )
            })
        })
        .collect()
}

/// Waits for `request` (a golden build), showing the build's progress on
/// `spinner` as the daemon reports it.
async fn with_progress<T>(
    client: &airlock_listen::client::Client,
    name: &str,
    spinner: &indicatif::ProgressBar,
    request: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    let path = format!("/v1/goldens/{}/progress", encode(name));
    let poll = async {
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(400)).await;
            let progress: Result<airlock_lifecycle::golden::progress::BuildProgress> =
                client.call(Method::GET, &path, NO_BODY).await;
            if let Ok(p) = progress {
                spinner.set_message(output::build_progress(name, &p));
            }
        }
    };
    tokio::pin!(request);
    tokio::select! {
        done = &mut request => done,
        _ = poll => unreachable!("polling never ends"),
    }
}

async fn golden(cli: &Cli, cmd: &GoldenCommand) -> Result<i32> {
    let json = cli.json;
    let client = cli.client()?;
    match cmd {
        GoldenCommand::Create {
            name,
            schema,
            seed,
            from_url,
            from_dump,
            exclude_table,
            exclude_schema,
            allow_extension,
            jobs,
            pool,
            postgres,
            redis_seed,
            redis_rdb,
            redis_from_url,
        } => {
            validate::name("golden", name)?;
            let one = |p: &PathBuf| absolute(std::slice::from_ref(p)).map(|mut v| v.remove(0));
            let redis_url = match redis_from_url.as_deref() {
                Some("-") if from_url.as_deref() == Some("-") => return Err(Error::new(
                    ErrorCode::InvalidRequest,
                    "--from-url - and --redis-from-url - both read stdin",
                    "pass one of them in its environment variable (AIRLOCK_FROM_URL, AIRLOCK_REDIS_FROM_URL)",
                )),
                Some("-") => {
                    let mut text = String::new();
                    std::io::stdin().read_to_string(&mut text)?;
                    Some(text.trim().to_owned())
                }
                Some(url) => {
                    let from_env = std::env::var("AIRLOCK_REDIS_FROM_URL").ok().as_deref() == Some(url);
                    if !from_env && airlock_core::records::redis::redact(url) != url {
                        eprintln!(
                            "warning: a password on the command line is visible to `ps` while this runs; \
                             use `--redis-from-url -` (URL on stdin) or AIRLOCK_REDIS_FROM_URL instead"
                        );
                    }
                    Some(url.to_owned())
                }
                None => None,
            };
            let redis = match (redis_seed, redis_rdb, redis_url) {
                (Some(path), _, _) => {
                    Some(airlock_core::records::redis::RedisSource::Seed { path: one(path)? })
                }
                (_, Some(path), _) => {
                    Some(airlock_core::records::redis::RedisSource::Rdb { path: one(path)? })
                }
                (_, _, Some(url)) => Some(airlock_core::records::redis::RedisSource::Url { url }),
                _ => None,
            };
            let from_url = match from_url.as_deref() {
                Some("-") => {
                    let mut text = String::new();
                    std::io::stdin().read_to_string(&mut text)?;
                    Some(text.trim().to_owned())
                }
                Some(dsn) => {
                    let from_env = std::env::var("AIRLOCK_FROM_URL").ok().as_deref() == Some(dsn);
                    if !from_env && airlock_core::dsn::password(dsn).is_some() {
                        eprintln!(
                            "warning: a password on the command line is visible to `ps` while this runs; \
                             use `--from-url -` (DSN on stdin) or AIRLOCK_FROM_URL instead"
                        );
                    }
                    Some(dsn.to_owned())
                }
                None => None,
            };
            let req = CreateGolden {
                name: name.clone(),
                schema: absolute(schema)?,
                seed: absolute(seed)?,
                from_url,
                from_dump: from_dump
                    .as_ref()
                    .map(|p| absolute(std::slice::from_ref(p)))
                    .transpose()?
                    .map(|mut v| v.remove(0)),
                exclude: airlock_lifecycle::golden::Exclusions {
                    tables: exclude_table.clone(),
                    schemas: exclude_schema.clone(),
                },
                jobs: *jobs,
                pool_size: *pool,
                postgres: *postgres,
                redis,
                allow_extensions: allow_extension.clone(),
            };
            req.source()?;
            let spinner = output::spinner(json, format!("building golden {name}"));
            let g: Result<Golden> =
                with_progress(&client, name, &spinner, client.call(Method::POST, "/v1/goldens", Some(&req)))
                    .await;
            spinner.finish_and_clear();
            let g = g?;
            output::print(json, &g, || output::golden(&g));
            Ok(0)
        }
        GoldenCommand::Refresh { name } => {
            let spinner = output::spinner(json, format!("building a new generation of {name}"));
            let path = format!("/v1/goldens/{}/refresh", encode(name));
            let g: Result<Golden> =
                with_progress(&client, name, &spinner, client.call(Method::POST, &path, NO_BODY)).await;
            spinner.finish_and_clear();
            let g = g?;
            output::print(json, &g, || output::golden(&g));
            Ok(0)
        }
        GoldenCommand::Pool { name, size } => {
            let body = crate::api::PoolRequest { size: *size };
            let g: Golden =
                client.call(Method::POST, &format!("/v1/goldens/{}/pool", encode(name)), Some(&body)).await?;
            output::print(json, &g, || {
                format!("golden {} keeps {} started sandboxes ready", g.name, g.pool_size)
            });
            Ok(0)
        }
        GoldenCommand::Ls => {
            let list: Vec<Golden> = client.call(Method::GET, "/v1/goldens", NO_BODY).await?;
            output::print(json, &list, || output::goldens(&list));
            Ok(0)
        }
        GoldenCommand::Show { name } => {
            let g: Golden =
                client.call(Method::GET, &format!("/v1/goldens/{}", encode(name)), NO_BODY).await?;
            output::print(json, &g, || output::golden(&g));
            Ok(0)
        }
        GoldenCommand::Rm { name, force } => {
            let g: Golden = client
                .call(Method::DELETE, &format!("/v1/goldens/{}?force={force}", encode(name)), NO_BODY)
                .await?;
            output::print(json, &g, || format!("deleted golden {}", g.name));
            Ok(0)
        }
    }
}

impl Placement {
    /// The TTL in seconds, labels and name, checked before anything is sent (the
    /// fields of a branch request, and of a fork request besides its golden and access).
    fn checked(&self) -> Result<BranchRequest> {
        let ttl_seconds = match &self.ttl {
            Some(t) => Some(validate::parse_ttl(t)?.as_secs().max(1) as i64),
            None => None,
        };
        if let Some(n) = &self.name {
            validate::sandbox_name(n)?;
        }
        Ok(BranchRequest { ttl_seconds, labels: validate::labels(&self.labels)?, name: self.name.clone() })
    }
}

/// Prints a new sandbox: only its DSN (so `$(airlock fork ...)` works), or JSON;
/// warnings go to stderr.
fn print_forked(forked: &Forked, json: bool) {
    for w in &forked.warnings {
        eprintln!("warning: {w}");
    }
    if json {
        output::print(true, forked, String::new);
    } else if let Some(url) = &forked.mcp_url {
        output::line(url);
    } else {
        // A sandbox of a Redis-only golden has no DSN: its Redis URL instead.
        let sb = &forked.sandbox;
        let url = sb.dsn.as_deref().or(sb.redis_url.as_deref()).or(sb.redis_socket_url.as_deref());
        output::line(url.unwrap_or_default());
    }
}

async fn fork(cli: &Cli, args: &ForkArgs) -> Result<i32> {
    let BranchRequest { ttl_seconds, labels, name } = args.placement.checked()?;
    let millis = |what: &str, text: &str| -> Result<u64> {
        humantime::parse_duration(text).map(|d| d.as_millis() as u64).map_err(|e| {
            Error::new(
                ErrorCode::InvalidRequest,
                format!("invalid {what} {text:?}: {e}"),
                "give a duration such as 500ms, 30s or 5m",
            )
        })
    };
    let access = Access {
        mode: Mode::parse(&args.mode)?,
        limits: Limits {
            statement_timeout_ms: millis("statement timeout", &args.statement_timeout)?,
            lock_timeout_ms: millis("lock timeout", &args.lock_timeout)?,
            idle_in_transaction_timeout_ms: millis(
                "idle-in-transaction timeout",
                &args.idle_in_transaction_timeout,
            )?,
            temp_file_limit_kb: validate::bytes(&args.temp_file_limit)? / 1024,
            work_mem_kb: validate::bytes(&args.work_mem)? / 1024,
            connection_limit: args.connection_limit,
        },
    };
    access.validate()?;
    let idle_suspend_seconds =
        args.idle_suspend.as_deref().map(|t| validate::duration("--idle-suspend", t)).transpose()?;
    let req = ForkRequest {
        golden: args.golden.clone(),
        ttl_seconds,
        labels,
        name,
        access,
        idle_suspend_seconds: idle_suspend_seconds.map(|d| d.as_secs() as i64),
        wait_seconds: Some(validate::duration("--wait", &args.wait)?.as_secs() as i64),
        mcp: args.mcp,
        ..Default::default()
    };
    let forked: Forked = cli.client()?.call(Method::POST, "/v1/sandboxes", Some(&req)).await?;
    print_forked(&forked, cli.json);
    Ok(0)
}

/// The largest file the CLI reads for a command (a migration, a report).
const MAX_FILE: u64 = 64 << 20;

/// Reads a file the user named, with an error that says which. Only a
/// regular file, never through a link (a link in a repository could show a
/// host's secret in a report meant for a pull request), and at most
/// [`MAX_FILE`] bytes (never a device or a pipe that never ends).
fn read_file(path: &Path, what: &str) -> Result<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let unreadable = |why: String| {
        Error::new(
            ErrorCode::FileUnreadable,
            format!("cannot read {what} {}: {why}", path.display()),
            "name a regular file (not a link, a device or a pipe) of at most 64 MiB",
        )
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(nix::libc::ELOOP) => unreadable("it is a symbolic link".into()),
            _ => unreadable(e.to_string()),
        })?;
    let meta = file.metadata().map_err(|e| unreadable(e.to_string()))?;
    if !meta.is_file() {
        return Err(unreadable("it is not a regular file".into()));
    }
    if meta.len() > MAX_FILE {
        return Err(unreadable(format!("it holds {} bytes", meta.len())));
    }
    let mut text = String::new();
    file.take(MAX_FILE + 1).read_to_string(&mut text).map_err(|e| unreadable(e.to_string()))?;
    Ok(text)
}

/// `airlock migrate test`.
async fn migrate_test(cli: &Cli, args: &MigrateTestArgs) -> Result<i32> {
    use airlock_migrate::{Candidate, TestRequest};
    let mut candidates: Vec<Candidate> = Vec::new();
    // Named by file name, or by the path as given when two share a file name.
    let base = |p: &Path| {
        p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned())
    };
    let mut paths = std::collections::BTreeMap::new();
    for path in &args.candidates {
        let shared = args.candidates.iter().filter(|p| base(p) == base(path)).count() > 1;
        let name = if shared { path.display().to_string() } else { base(path) };
        paths.insert(name.clone(), path.display().to_string());
        candidates.push(Candidate {
            name,
            sql: Some(read_file(path, "candidate")?),
            exec: None,
            exec_files: vec![],
        });
    }
    if args.parallel == 0 {
        return Err(Error::new(ErrorCode::InvalidRequest, "--parallel 0 runs nothing", "give 1 or more"));
    }
    let exec_files = hashed_files(&args.exec_files)?;
    for (i, cmd) in args.exec.iter().enumerate() {
        candidates.push(Candidate {
            name: format!("exec-{}", i + 1),
            sql: None,
            exec: Some(cmd.clone()),
            exec_files: exec_files.clone(),
        });
    }
    let mut assertions = Vec::new();
    for path in &args.asserts {
        let text = read_file(path, "assertion file")?;
        assertions.extend(airlock_postgres::split::split(&text)?.into_iter().map(|s| s.sql));
    }
    let queries = |path: &std::path::Path, what: &str| -> Result<Vec<String>> {
        let text = read_file(path, what)?;
        Ok(airlock_postgres::split::split(&text)?.into_iter().map(|s| s.sql).collect())
    };
    let app_queries = match &args.app_queries {
        Some(path) => queries(path, "application query file")?,
        None => vec![],
    };
    let workload = match args.workload.as_deref() {
        None => None,
        Some("default") => Some(vec![]),
        Some(path) => Some(queries(std::path::Path::new(path), "workload file")?),
    }
    .map(|queries| airlock_migrate::app::WorkloadSpec { queries, clients: Some(args.workload_clients) });
    let production_stats = match &args.production_stats {
        Some(source) => Some(production_stats(source).await?),
        None => None,
    };
    let millis = |flag: &str, text: &str| validate::duration(flag, text).map(|d| d.as_millis() as u64);
    let req = TestRequest {
        golden: args.golden.clone(),
        candidates,
        assertions,
        expect_golden: args.expect_golden.clone(),
        expect_files: absolute(&args.expect)?,
        parallel: Some(args.parallel),
        statement_timeout_ms: Some(millis("--statement-timeout", &args.statement_timeout)?),
        lock_threshold_ms: Some(millis("--max-lock", &args.max_lock)?),
        production_stats,
        app_queries,
        workload,
        on_behalf_of: None,
    };
    let what = format!("testing {} candidate(s) on golden {}", req.candidates.len(), req.golden);
    let format = args.format.as_deref().unwrap_or(if cli.json { "json" } else { "text" });
    let spinner = output::spinner(format != "text", what);
    let report: Result<airlock_migrate::report::Report> =
        cli.client()?.call(Method::POST, "/v1/migrations/test", Some(&req)).await;
    spinner.finish_and_clear();
    let report = report?;
    if let Some(path) = &args.report {
        let json = serde_json::to_vec_pretty(&report).expect("report serializes");
        std::fs::write(path, json).map_err(|e| {
            let message = format!("cannot write the report {}: {e}", path.display());
            Error::new(ErrorCode::FileUnreadable, message, "check the path")
        })?;
    }
    // A candidate's SQL is shown whole: control and bidirectional characters in
    // it are escaped, so it cannot move a terminal's cursor or hide what it says.
    let shown = |text: String| text.lines().map(output::printable).collect::<Vec<_>>().join("\n");
    match format {
        "markdown" => output::line(&shown(report.markdown())),
        "sarif" => {
            output::line(&serde_json::to_string_pretty(&report.sarif(&paths)).expect("sarif serializes"))
        }
        _ => output::print(format == "json", &report, || shown(report.text())),
    }
    Ok(if report.passed { 0 } else { 12 })
}

/// The files `--exec-files` names (paths or globs), each hashed; a pattern
/// that matches nothing is an error, not an empty list.
fn hashed_files(patterns: &[String]) -> Result<Vec<airlock_migrate::HashedFile>> {
    let mut out = Vec::new();
    for pattern in patterns {
        let bad = |why: String| {
            Error::new(
                ErrorCode::InvalidRequest,
                format!("--exec-files {pattern:?}: {why}"),
                "give a path or a glob such as 'migrations/*.sql'",
            )
        };
        let paths = glob::glob(pattern).map_err(|e| bad(e.to_string()))?;
        let before = out.len();
        for path in paths {
            let path = path.map_err(|e| bad(e.to_string()))?;
            if path.is_file() {
                let bytes = std::fs::read(&path).map_err(|e| bad(format!("{}: {e}", path.display())))?;
                out.push(airlock_migrate::HashedFile::new(path.display().to_string(), &bytes));
            }
        }
        if out.len() == before {
            return Err(bad("matches no file".into()));
        }
    }
    Ok(out)
}

/// Reads a DSN from stdin when it was given as `-`.
fn dsn_argument(given: &str) -> Result<String> {
    if given != "-" {
        return Ok(given.to_owned());
    }
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s)?;
    Ok(s.trim().to_owned())
}

/// Production's table sizes from a DSN (a URL, `key=value` pairs, or `-` for
/// one on stdin) or a file.
async fn production_stats(source: &str) -> Result<airlock_migrate::scale::ProductionStats> {
    let is_dsn = source == "-" || source.contains("://") || source.contains('=');
    if !is_dsn {
        let text = read_file(std::path::Path::new(source), "production statistics file")?;
        return airlock_migrate::scale::ProductionStats::parse(&text, source.to_owned());
    }
    stats_from(&dsn_argument(source)?).await
}

/// A database's table sizes, read over `dsn`.
async fn stats_from(dsn: &str) -> Result<airlock_migrate::scale::ProductionStats> {
    let client = airlock_postgres::target::connect(dsn).await?;
    airlock_migrate::scale::ProductionStats::read(&client, airlock_core::dsn::redact(dsn)).await
}

/// `airlock migrate stats`: a database's table sizes, for `--production-stats FILE`.
async fn migrate_stats(args: &MigrateStatsArgs) -> Result<i32> {
    let stats = stats_from(&dsn_argument(&args.target)?).await?;
    println!("{}", serde_json::to_string_pretty(&stats).expect("stats serialize"));
    Ok(0)
}

/// `airlock migrate promote`.
async fn migrate_promote(cli: &Cli, args: &MigratePromoteArgs) -> Result<i32> {
    use airlock_migrate::promote::{PromoteRequest, Promoted};
    let report = serde_json::from_str(&read_file(&args.report, "report")?).map_err(|e| {
        Error::new(
            ErrorCode::InvalidRequest,
            format!("{} is not a migrate test report: {e}", args.report.display()),
            "pass the file `migrate test --report` wrote",
        )
    })?;
    let candidate = match (&args.candidate, &args.exec) {
        (Some(path), None) => {
            let name = path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
            airlock_migrate::Candidate {
                name,
                sql: Some(read_file(path, "candidate")?),
                exec: None,
                exec_files: vec![],
            }
        }
        (None, Some(cmd)) => airlock_migrate::Candidate {
            name: "exec".into(),
            sql: None,
            exec: Some(cmd.clone()),
            exec_files: hashed_files(&args.exec_files)?,
        },
        _ => {
            return Err(Error::new(
                ErrorCode::InvalidRequest,
                "nothing to promote",
                "give the tested SQL file, or --exec 'COMMAND' with its --exec-files",
            ))
        }
    };
    let target_dsn = dsn_argument(&args.target)?;
    let millis = |flag: &str, text: &str| validate::duration(flag, text).map(|d| d.as_millis() as u64);
    let req = PromoteRequest {
        report,
        candidate,
        target_dsn,
        allow_hazards: args.allow_hazards.clone(),
        allow_code: args.allow_code.clone(),
        allow_superuser: args.allow_superuser,
        again: args.again,
        lock_timeout_ms: Some(millis("--lock-timeout", &args.lock_timeout)?),
        statement_timeout_ms: Some(millis("--statement-timeout", &args.statement_timeout)?),
        check_only: args.exec.is_some(),
    };
    let done: Promoted = cli.client()?.call(Method::POST, "/v1/migrations/promote", Some(&req)).await?;
    if let Some(cmd) = &args.exec {
        return promote_command(cmd, &req, &done);
    }
    output::print(cli.json, &done, || {
        format!(
            "applied {} ({} statements{}) to {} in {:.0} ms\n",
            done.candidate,
            done.statements,
            if done.single_transaction { ", in one transaction" } else { "" },
            done.target,
            done.duration_ms
        )
    });
    Ok(0)
}

/// Runs a command candidate whose guards held, here, with `DATABASE_URL` set
/// to the target and its timeouts in `PGOPTIONS` (the DSN never on a command line).
fn promote_command(
    cmd: &str,
    req: &airlock_migrate::promote::PromoteRequest,
    checked: &airlock_migrate::promote::Promoted,
) -> Result<i32> {
    let options = format!(
        "-c lock_timeout={} -c statement_timeout={}",
        req.lock_timeout_ms.unwrap_or(5_000),
        req.statement_timeout_ms.unwrap_or(600_000)
    );
    let began = std::time::Instant::now();
    let status = std::process::Command::new("bash")
        .args(["-c", cmd])
        .env("DATABASE_URL", &req.target_dsn)
        .env("PGOPTIONS", options)
        .status()
        .map_err(|e| {
            Error::new(ErrorCode::Internal, format!("could not run the command: {e}"), "is bash installed?")
        })?;
    if !status.success() {
        return Err(Error::new(
            ErrorCode::MigrationFailed,
            format!(
                "the command {}",
                status.code().map_or("was killed".to_owned(), |c| format!("exited {c}"))
            ),
            "its own output above says why; what it applied before failing stays applied",
        ));
    }
    eprintln!(
        "applied {} to {} in {:.0} ms",
        checked.candidate,
        checked.target,
        began.elapsed().as_secs_f64() * 1e3
    );
    Ok(0)
}

/// `airlock mcp`: one sandbox for one MCP session on stdio.
async fn mcp(cli: &Cli, args: &McpArgs) -> Result<i32> {
    let req = ForkRequest {
        golden: args.golden.clone(),
        ttl_seconds: Some(validate::parse_ttl(&args.ttl)?.as_secs().max(1) as i64),
        labels: validate::labels(&args.labels)?,
        access: Access { mode: Mode::parse(&args.mode)?, ..Default::default() },
        ..Default::default()
    };
    let home = cli.layout().home().display().to_string();
    airlock_gateway::stdio::serve(cli.client()?, home, req).await
}

/// Runs psql on a sandbox; the password reaches psql through a private password
/// file, never its command line or environment.
fn psql(sb: &Sandbox, args: &[String]) -> Result<i32> {
    if sb.dsn.is_none() && sb.redis_socket_url.is_some() {
        return Err(no_postgres(sb));
    }
    let dsn = sb.dsn.as_deref().unwrap_or_default();
    let password = airlock_core::dsn::password(dsn).unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("airlock-psql-{}", airlock_core::secret::sandbox_id()));
    airlock_host::storage::tree::private_dir(&dir)?;
    let passfile = dir.join("pgpass");
    airlock_core::dsn::write_passfile(&passfile, &password)?;
    let psql = which_psql();
    let status = std::process::Command::new(psql)
        .arg(airlock_core::dsn::redact(dsn))
        .args(args)
        .env("PGPASSFILE", &passfile)
        .status();
    let _ = std::fs::remove_dir_all(&dir);
    let status = status.map_err(|e| {
        Error::new(
            ErrorCode::Internal,
            format!("could not run psql: {e}"),
            "install the PostgreSQL client (`apt-get install postgresql-client`)",
        )
    })?;
    Ok(status.code().unwrap_or(1))
}

/// The error for asking a Redis-only sandbox for PostgreSQL.
fn no_postgres(sb: &Sandbox) -> Error {
    Error::new(
        ErrorCode::InvalidRequest,
        format!("sandbox {} has no PostgreSQL: its golden has only a Redis part", sb.id),
        "ask for its Redis URL: `airlock dsn ID --redis`",
    )
}

fn which_psql() -> PathBuf {
    let path = std::env::var("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("psql"))
        .find(|p| p.exists())
        .or_else(|| airlock_postgres::PgBin::locate(None).ok().map(|b| b.tool("psql")))
        .unwrap_or_else(|| Path::new("psql").to_path_buf())
}
