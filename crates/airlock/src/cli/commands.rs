//! What each subcommand does.

use std::time::Duration;

use hyper::Method;

use super::output;
use super::{Cli, Command, DaemonCommand, MigrateCommand, PostgresCommand, StorageCommand};
use crate::api::ExtendRequest;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::events::Event;
use airlock_core::validate;
use airlock_host::storage;
use airlock_lifecycle::doctor::Doctor;
use airlock_lifecycle::golden::Golden;
use airlock_lifecycle::sandbox::{Forked, Sandbox};
use airlock_listen::client::encode;

use super::golden::*;
use super::migrate::*;
use super::sandbox::*;
use super::serve::*;
use airlock_listen::client::NO_BODY;

pub(super) async fn run(cli: Cli) -> Result<i32> {
    let json = cli.json;
    match &cli.command {
        Command::Serve(args) => serve(&cli, args).await,
        Command::Router { spec } => {
            init_logging();
            airlock_router::process::run(cli.layout().home(), spec, Box::new(crate::relay::make)).await?;
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
        Command::Nodes => super::cluster::nodes(&cli).await,
        Command::Cluster(cmd) => super::cluster::run(&cli, cmd),
        Command::Golden(cmd) => golden(&cli, cmd).await,
        Command::Target(cmd) => super::target::run(&cli, cmd).await,
        Command::Grant(args) => super::grant::grant(&cli, args).await,
        Command::Grants => super::grant::list(&cli).await,
        Command::Revoke { id } => super::grant::revoke(&cli, id).await,
        Command::Fork(args) => fork(&cli, args).await,
        Command::Mcp(args) => mcp(&cli, args).await,
        Command::Migrate(MigrateCommand::Test(args)) => migrate_test(&cli, args).await,
        Command::Migrate(MigrateCommand::Promote(args)) => migrate_promote(&cli, args).await,
        Command::Migrate(MigrateCommand::Stats(args)) => migrate_stats(args).await,
        Command::Migrate(MigrateCommand::Schema) => {
            let schema = airlock_migrate::schema::report_schema();
            println!("{}", serde_json::to_string_pretty(&schema).expect("a schema serializes"));
            Ok(0)
        }
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
            let list: Vec<Sandbox> = list.into_iter().map(Sandbox::without_credentials).collect();
            output::print(json, &list, || output::sandboxes(&list));
            Ok(0)
        }
        Command::Show { id } => {
            let sb: Sandbox =
                cli.client()?.call(Method::GET, &format!("/v1/sandboxes/{}", encode(id)), NO_BODY).await?;
            // The credential is printed only when asked for (`airlock dsn`).
            let sb = sb.without_credentials();
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
            print_forked(&crate::api::ForkAnswer { forked, mcp_url: None }, json);
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
        Command::Dsn { id, socket, router_socket, redis } => {
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
            } else if *router_socket {
                Some(sb.router_socket_dsn.clone().ok_or_else(|| {
                    Error::new(
                        ErrorCode::InvalidRequest,
                        "the router has no unix socket",
                        "start the daemon with `airlock serve --router-socket DIR`, or connect with `airlock dsn ID`",
                    )
                })?)
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
        Command::Exec { id, grant, timeout, put, get, command } => {
            super::exec::run(&cli, id.as_deref(), grant.as_deref(), timeout, put, get, command).await
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
