//! Forking a sandbox, talking to it with psql, and `airlock mcp`.

use std::path::{Path, PathBuf};

use hyper::Method;

use super::output;
use super::{Cli, ForkArgs, McpArgs};
use crate::api::{ForkAnswer, ForkBody};
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::validate;
use airlock_lifecycle::sandbox::{Access, BranchRequest, ForkRequest, Limits, Mode, Sandbox};

/// Prints a new sandbox: only its DSN (so `$(airlock fork ...)` works), its
/// MCP URL when it has one, or JSON; warnings go to stderr.
pub(super) fn print_forked(answer: &ForkAnswer, json: bool) {
    let forked = &answer.forked;
    for w in &forked.warnings {
        eprintln!("warning: {w}");
    }
    if json {
        output::print(true, answer, String::new);
    } else if let Some(url) = &answer.mcp_url {
        output::line(url);
    } else {
        // A sandbox of a Redis-only golden has no DSN: its Redis URL instead.
        let sb = &forked.sandbox;
        let url = sb.dsn.as_deref().or(sb.redis_url.as_deref()).or(sb.redis_socket_url.as_deref());
        output::line(url.unwrap_or_default());
    }
}

pub(super) async fn fork(cli: &Cli, args: &ForkArgs) -> Result<i32> {
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
        ..Default::default()
    };
    let body = ForkBody {
        fork: req,
        mcp: args.mcp,
        node: args.node.clone(),
        node_labels: validate::labels(&args.node_labels)?,
    };
    let answer: ForkAnswer = cli.client()?.call(Method::POST, "/v1/sandboxes", Some(&body)).await?;
    print_forked(&answer, cli.json);
    Ok(0)
}

/// `airlock mcp`: one sandbox for one MCP session on stdio.
pub(super) async fn mcp(cli: &Cli, args: &McpArgs) -> Result<i32> {
    let home = cli.layout().home().display().to_string();
    if let Some(target) = &args.target {
        let request = airlock_live::grant::GrantRequest {
            tables: args.tables.clone(),
            schema: args.schema.clone(),
            where_clause: args.where_clause.clone(),
            ttl_seconds: Some(validate::parse_ttl(&args.ttl)?.as_secs().max(1) as i64),
            ..Default::default()
        };
        let request = serde_json::to_value(&request).expect("a grant request serializes");
        return airlock_gateway::stdio::serve_grant(cli.client()?, home, target.clone(), request).await;
    }
    let req = ForkRequest {
        golden: args.golden.clone().unwrap_or_default(),
        ttl_seconds: Some(validate::parse_ttl(&args.ttl)?.as_secs().max(1) as i64),
        labels: validate::labels(&args.labels)?,
        access: Access { mode: Mode::parse(&args.mode)?, ..Default::default() },
        ..Default::default()
    };
    airlock_gateway::stdio::serve(cli.client()?, home, req).await
}

/// Runs psql on a sandbox; the password reaches psql through a private password
/// file, never its command line or environment.
pub(super) fn psql(sb: &Sandbox, args: &[String]) -> Result<i32> {
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
pub(super) fn no_postgres(sb: &Sandbox) -> Error {
    Error::new(
        ErrorCode::InvalidRequest,
        format!("sandbox {} has no PostgreSQL: its golden has only a Redis part", sb.id),
        "ask for its Redis URL: `airlock dsn ID --redis`",
    )
}

pub(super) fn which_psql() -> PathBuf {
    let path = std::env::var("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("psql"))
        .find(|p| p.exists())
        .or_else(|| airlock_postgres::PgBin::locate(None).ok().map(|b| b.tool("psql")))
        .unwrap_or_else(|| Path::new("psql").to_path_buf())
}
