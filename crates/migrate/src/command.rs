//! Command candidates (`--exec`): a migration tool run inside the fork's
//! boundary with `DATABASE_URL` set, its locks polled, the database compared
//! before and after; and what to say when it fails.

use airlock_postgres::cell::Cell;
use std::collections::BTreeMap;
use std::time::Duration;

use super::apply;
use super::report::{self, ExecOutcome};
use airlock_core::error::Result;
use airlock_lifecycle::engine::Engine;
use airlock_lifecycle::sandbox::{self, Sandbox};
use airlock_postgres::admin::Admin;

/// Runs a command candidate inside the fork's boundary while locks are polled.
pub async fn run(
    engine: &Engine,
    sb: &Sandbox,
    admin: &Admin,
    cmd: &str,
    golden_rows: BTreeMap<String, i64>,
    timeout: Duration,
) -> Result<(apply::Applied, Option<ExecOutcome>)> {
    let before = apply::admin_reading(admin).await?;
    // Its sessions start as the golden's owner role, as a SQL candidate's
    // do (a migration runs as its target's owner): `PGOPTIONS`, read by
    // libpq and node-postgres, sets the role at login.
    let request = sandbox::ExecRequest {
        argv: vec![
            "env".into(),
            format!("PGOPTIONS=-c role={}", airlock_core::dsn::OWNER_ROLE),
            "bash".into(),
            "-c".into(),
            cmd.to_owned(),
        ],
        timeout_seconds: Some(timeout.as_secs().clamp(1, 3600)),
        ..Default::default()
    };
    let watched = super::sampler::Watched {
        dir: engine.layout.sandbox_instance(&sb.id),
        postmaster: sb.pid.unwrap_or_default(),
    };
    let sampler = super::sampler::Sampler::start(&watched, 0).await?;
    let started = std::time::Instant::now();
    let ran = sandbox::exec::exec(engine, &sb.id, &request).await;
    let observed = sampler.finish().await;
    let ran = ran?;
    let took = started.elapsed();
    // Statistics reach the shared counters when a session ends: wait for the
    // command's sessions to be gone.
    for _ in 0..200 {
        let others: i64 = admin
            .client()
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .ok()
            .and_then(|r| r.cell(0).ok())
            .unwrap_or(0);
        if others == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let after = apply::admin_reading(admin).await?;
    let (statement, rows) = apply::command_report(&before, after, &observed, golden_rows, took);
    let tail = |s: &str| {
        let start = s.len().saturating_sub(4096);
        let start = (start..s.len()).find(|i| s.is_char_boundary(*i)).unwrap_or(s.len());
        s[start..].to_owned()
    };
    let outcome = ExecOutcome {
        exit_code: ran.exit_code,
        timed_out: ran.timed_out,
        stdout: tail(&ran.stdout),
        stderr: tail(&ran.stderr),
    };
    let applied = apply::Applied {
        statements: vec![statement],
        failure: None,
        rows,
        duration_ms: took.as_secs_f64() * 1e3,
        backend: 0,
        names: BTreeMap::new(),
        session: BTreeMap::new(),
    };
    Ok((applied, Some(outcome)))
}

/// Why a command failed, in a sentence: how it ended, and the error it printed
/// (PostgreSQL's `ERROR:` line, or an error line of its own), not merely its last line.
pub fn failure(e: &ExecOutcome) -> String {
    let why = match (e.timed_out, e.exit_code) {
        (true, _) => "timed out".to_owned(),
        (false, Some(code)) => format!("exited {code}"),
        (false, None) => "was killed".to_owned(),
    };
    let lines: Vec<&str> =
        e.stderr.lines().chain(e.stdout.lines()).map(str::trim).filter(|l| !l.is_empty()).collect();
    let error = lines
        .iter()
        .find(|l| l.contains("ERROR:") || l.contains("FATAL:"))
        .or_else(|| lines.iter().find(|l| l.to_ascii_lowercase().contains("error")))
        .or(lines.first())
        .map(|l| report::cut(l, 500));
    match error {
        Some(error) => format!("the command {why}: {error}"),
        None => format!("the command {why}"),
    }
}
