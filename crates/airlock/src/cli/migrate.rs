//! `airlock migrate`: test, stats and promote.

use std::io::Read;
use std::path::Path;

use hyper::Method;

use super::golden::absolute;
use super::output;
use super::{Cli, MigratePromoteArgs, MigrateStatsArgs, MigrateTestArgs};
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::validate;

/// The largest file the CLI reads for a command (a migration, a report).
pub(super) const MAX_FILE: u64 = 64 << 20;

/// Reads a file the user named, with an error that says which. Only a
/// regular file, never through a link (a link in a repository could show a
/// host's secret in a report meant for a pull request), and at most
/// [`MAX_FILE`] bytes (never a device or a pipe that never ends).
pub(super) fn read_file(path: &Path, what: &str) -> Result<String> {
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
pub(super) async fn migrate_test(cli: &Cli, args: &MigrateTestArgs) -> Result<i32> {
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
    // A candidate's SQL is shown whole: control and bidirectional characters in
    // it are escaped, so it cannot move a terminal's cursor or hide what it says.
    let shown = |text: String| text.lines().map(output::printable).collect::<Vec<_>>().join("\n");
    let write = |path: &std::path::Path, bytes: Vec<u8>| {
        std::fs::write(path, bytes).map_err(|e| {
            let message = format!("cannot write the report {}: {e}", path.display());
            Error::new(ErrorCode::FileUnreadable, message, "check the path")
        })
    };
    if let Some(path) = &args.report {
        write(path, serde_json::to_vec_pretty(&report).expect("report serializes"))?;
    }
    if let Some(path) = &args.html {
        write(path, (shown(report.html()) + "\n").into_bytes())?;
    }
    match format {
        "markdown" => output::line(&shown(report.markdown())),
        "html" => output::line(&shown(report.html())),
        "sarif" => {
            output::line(&serde_json::to_string_pretty(&report.sarif(&paths)).expect("sarif serializes"))
        }
        _ => output::print(format == "json", &report, || shown(report.text())),
    }
    Ok(if report.passed { 0 } else { 12 })
}

/// The files `--exec-files` names (paths or globs), each hashed; a pattern
/// that matches nothing is an error, not an empty list.
pub(super) fn hashed_files(patterns: &[String]) -> Result<Vec<airlock_migrate::HashedFile>> {
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
pub(super) fn dsn_argument(given: &str) -> Result<String> {
    if given != "-" {
        return Ok(given.to_owned());
    }
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s)?;
    Ok(s.trim().to_owned())
}

/// Production's table sizes from a DSN (a URL, `key=value` pairs, or `-` for
/// one on stdin) or a file.
pub(super) async fn production_stats(source: &str) -> Result<airlock_migrate::scale::ProductionStats> {
    let is_dsn = source == "-" || source.contains("://") || source.contains('=');
    if !is_dsn {
        let text = read_file(std::path::Path::new(source), "production statistics file")?;
        return airlock_migrate::scale::ProductionStats::parse(&text, source.to_owned());
    }
    stats_from(&dsn_argument(source)?).await
}

/// A database's table sizes, read over `dsn`.
pub(super) async fn stats_from(dsn: &str) -> Result<airlock_migrate::scale::ProductionStats> {
    let client = airlock_postgres::target::connect(dsn).await?;
    airlock_migrate::scale::ProductionStats::read(&client, airlock_core::dsn::redact(dsn)).await
}

/// `airlock migrate stats`: a database's table sizes, for `--production-stats FILE`.
pub(super) async fn migrate_stats(args: &MigrateStatsArgs) -> Result<i32> {
    let stats = stats_from(&dsn_argument(&args.target)?).await?;
    println!("{}", serde_json::to_string_pretty(&stats).expect("stats serialize"));
    Ok(0)
}

/// `airlock migrate promote`.
pub(super) async fn migrate_promote(cli: &Cli, args: &MigratePromoteArgs) -> Result<i32> {
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
pub(super) fn promote_command(
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
