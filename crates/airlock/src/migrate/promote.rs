//! `migrate promote`: the tested file, applied to a real database behind guards.
//!
//! The file must be the one tested (same SHA-256), its test must have passed (or
//! each hazard be allowed by name), and the target's schema must still be the
//! schema the test ran on — otherwise the target has drifted and the test says
//! nothing about it. Then the file is applied with `lock_timeout` and
//! `statement_timeout`, in one transaction unless it manages transactions itself
//! or holds a statement that cannot run in one.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::report::Report;
use super::split::{self, Kind};
use super::verify;
use super::Candidate;
use crate::engine::Engine;
use crate::error::{Error, ErrorCode, Result};
use crate::events::NewEvent;
use crate::pg::dsn::redact;

/// Body of `POST /v1/migrations/promote`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = MigrationPromoteRequest)]
pub struct PromoteRequest {
    /// The report `migrate test` wrote.
    pub report: Report,
    /// The candidate file to apply (its name and contents).
    pub candidate: Candidate,
    /// The database to apply it to. Its password is never logged or shown.
    pub target_dsn: String,
    /// Hazard kinds accepted even though the test reported them.
    #[serde(default)]
    pub allow_hazards: Vec<String>,
    /// SHA-256s of files whose code a person read and accepts (`opaque_code`
    /// is accepted by nothing else).
    #[serde(default)]
    pub allow_code: Vec<String>,
    /// `lock_timeout` on the target, milliseconds (default 5,000).
    #[serde(default)]
    pub lock_timeout_ms: Option<u64>,
    /// `statement_timeout` on the target, milliseconds (default 600,000).
    #[serde(default)]
    pub statement_timeout_ms: Option<u64>,
    /// Apply even when the target session is a superuser (or may run programs
    /// or write files on the server), whose effects reach beyond what promote
    /// can check or roll back.
    #[serde(default)]
    pub allow_superuser: bool,
    /// Check the guards only, applying nothing: how a command candidate is
    /// promoted (the CLI runs the command once they hold).
    #[serde(default)]
    pub check_only: bool,
}

/// What `migrate promote` did.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Promoted {
    /// The candidate's name in the report.
    pub candidate: String,
    /// Its SHA-256.
    pub sha256: String,
    /// The target, its password removed.
    pub target: String,
    /// Statements applied.
    pub statements: usize,
    /// Whether they ran in one transaction.
    pub single_transaction: bool,
    /// Wall time, milliseconds.
    pub duration_ms: f64,
}

fn refused(message: impl Into<String>, hint: impl Into<String>) -> Error {
    Error::new(ErrorCode::MigrationRefused, message, hint)
}

/// Applies the candidate to the target if every guard holds.
pub async fn promote(engine: &Engine, req: &PromoteRequest) -> Result<Promoted> {
    let sql = match (&req.candidate.sql, &req.candidate.exec) {
        (Some(sql), _) => Some(sql.as_str()),
        (None, Some(_)) if req.check_only => None,
        (None, Some(_)) => {
            return Err(refused(
                "a command candidate is not run by the daemon",
                "promote it with `airlock migrate promote --exec 'COMMAND' [--exec-files GLOB]`, which checks its guards here and runs it itself",
            ))
        }
        (None, None) => return Err(refused("the candidate has neither SQL nor a command", "give the tested file")),
    };
    let hash = req.candidate.sha256();
    let tested = req.report.candidates.iter().find(|c| c.sha256 == hash).ok_or_else(|| {
        if req.candidate.exec.is_some() {
            return refused(
                "the command, or a migration file it runs, changed since it was tested (or it was never tested)",
                "test it as it is now with `airlock migrate test --exec ... --exec-files ...`, then promote with the new report",
            );
        }
        match req.report.candidates.iter().find(|c| c.name == req.candidate.name) {
            Some(c) => refused(
                format!(
                    "{} changed since it was tested (sha256 {} now, {} tested)",
                    req.candidate.name,
                    &hash[..12],
                    &c.sha256[..12]
                ),
                "test the file as it is now with `airlock migrate test`, then promote with the new report",
            ),
            None => refused(
                format!("{} is not in the report", req.candidate.name),
                "promote a file the report tested, unchanged",
            ),
        }
    })?;
    // Code is judged here again from the file itself and the golden's
    // catalog: a report's hazards are the client's to edit.
    if let Some(h) = super::code::hazard(&req.candidate, &req.report.golden_catalog) {
        if !req.allow_code.iter().any(|a| a.eq_ignore_ascii_case(&hash)) {
            return Err(refused(
                format!("{} {}", tested.name, h.message),
                format!(
                    "a person must read it and accept this exact file: --allow-code {hash} \
                     (--allow-hazard cannot accept code)"
                ),
            ));
        }
    }
    let unallowed: Vec<&str> = tested
        .hazards
        .iter()
        .map(|h| h.kind.as_str())
        .filter(|k| *k != super::code::OPAQUE_CODE && !req.allow_hazards.iter().any(|a| a == k))
        .collect();
    if !unallowed.is_empty() {
        let mut kinds = unallowed.clone();
        kinds.dedup();
        return Err(refused(
            format!("{} did not pass its test: {}", tested.name, kinds.join(", ")),
            format!(
                "fix the migration, or accept each hazard by name: {}",
                kinds.iter().map(|k| format!("--allow-hazard {k}")).collect::<Vec<_>>().join(" ")
            ),
        ));
    }
    let target = redact(&req.target_dsn);
    let client = crate::pg::target::connect(&req.target_dsn).await?;
    if !req.allow_superuser {
        if let Some(why) = verify::too_powerful(&client).await? {
            return Err(refused(
                format!("the target session {why}: a migration run by it can act outside the database (roles, programs, files), beyond what promote checks or rolls back"),
                "give a DSN of the application's owner role, or pass --allow-superuser",
            ));
        }
    }
    let now = crate::catalog::read(&client).await?;
    let drift = verify::drift(&req.report.golden_catalog, &now);
    if !drift.is_empty() {
        let lines: Vec<String> = drift.iter().map(|c| c.line()).collect();
        return Err(refused(
            format!(
                "the target's schema has drifted from golden {}@{} the test ran on: {}",
                req.report.golden,
                req.report.generation,
                lines.join("; ")
            ),
            "was it applied already, or changed by hand? Build a golden from the target \
             (`airlock golden create NAME --from-url -`), test against it, then promote",
        ));
    }
    let Some(sql) = sql.filter(|_| !req.check_only) else {
        let checked = Promoted {
            candidate: tested.name.clone(),
            sha256: hash,
            target,
            statements: 0,
            single_transaction: false,
            duration_ms: 0.0,
        };
        engine.store().record_or_log(NewEvent {
            kind: crate::events::EventKind::MigrationPromoted,
            golden: Some(req.report.golden.clone()),
            detail: serde_json::json!({"checked_only": true, "promoted": checked}),
            ..Default::default()
        });
        return Ok(checked);
    };
    let statements = split::split(sql)?;
    let lock = req.lock_timeout_ms.unwrap_or(5_000);
    let statement = req.statement_timeout_ms.unwrap_or(600_000);
    let run = |sql: String| {
        let client = &client;
        async move { client.batch_execute(&sql).await }
    };
    run(format!("SET lock_timeout = {lock}; SET statement_timeout = {statement}")).await.map_err(pg_error)?;
    let single = statements.iter().all(|s| split::kind(&s.sql) == Kind::Plain);
    let began = Instant::now();
    let mut kept = false;
    for part in parts(&statements, single) {
        let within = &statements[part.range.clone()];
        // The file's own BEGIN and COMMIT, when the part is its transaction.
        let (open, body, close) = match (part.checked, part.own_transaction) {
            (true, false) => (&within[..1], &within[1..within.len() - 1], &within[within.len() - 1..]),
            _ => (&within[..0], within, &within[within.len()..]),
        };
        let failed = |s: &split::Statement, e: tokio_postgres::Error, kept: bool| {
            let undone = if kept { "statements before it stay applied" } else { "nothing was applied" };
            Error::new(
                ErrorCode::MigrationFailed,
                format!("line {}: {} ({undone})", s.line, crate::pg::admin::describe(&e)),
                "a lock_timeout error (55P03) means the target is busy: retry when it is quieter",
            )
        };
        if !part.checked {
            for s in body {
                run(s.sql.clone()).await.map_err(|e| failed(s, e, kept))?;
                kept = true;
            }
            continue;
        }
        match open.first() {
            Some(s) => run(s.sql.clone()).await.map_err(|e| failed(s, e, kept))?,
            None => run("BEGIN".into()).await.map_err(pg_error)?,
        }
        // Rows are compared for a file applied whole (the test's keys are the
        // whole file's).
        let compared = match single {
            true => tested.changed_keys.keys().cloned().collect(),
            false => Default::default(),
        };
        let before = verify::Before::read(&client, &compared).await?;
        for s in body {
            if let Err(e) = run(s.sql.clone()).await {
                let _ = run("ROLLBACK".into()).await;
                return Err(failed(s, e, kept));
            }
        }
        // Before anything is kept, the target must have seen what the test saw:
        // a migration that behaves otherwise here (one that can tell it is being
        // tested, say) is rolled back and refused — part by part, for a file
        // that runs in parts.
        let tested_part = tested.statements.get(part.range.clone()).unwrap_or(&[]);
        let changes = single.then_some(tested.changes.as_slice());
        let line = within.first().map_or(0, |s| s.line);
        let checked = async {
            if let Some(e) = verify::settle_deferred(&client).await? {
                return Err(Error::new(
                    ErrorCode::MigrationFailed,
                    format!("at the COMMIT of the part from line {line}: {e}"),
                    "the target refused what the commit would do",
                ));
            }
            let surprises = verify::surprises(
                &client,
                tested_part,
                changes,
                &tested.sequences_set_back,
                &tested.changed_keys,
                &now,
                &before,
            )
                .await?;
            if !surprises.is_empty() {
                let kept = if kept { "; the parts before it stay applied" } else { "; nothing was applied" };
                return Err(refused(
                    format!(
                        "on the target, {} did what its test did not (from line {line}), so that part was rolled back{kept}: {}",
                        tested.name,
                        surprises.join("; ")
                    ),
                    "the migration behaves differently here than on the golden (it may tell the two apart): \
                     read it before running it anywhere",
                ));
            }
            Ok(())
        }
        .await;
        if let Err(mut e) = checked {
            let _ = run("ROLLBACK".into()).await;
            // A rollback leaves sequences where the migration put them.
            match verify::restore_sequences(&client, &before).await {
                Ok(restored) if !restored.is_empty() => {
                    e.message =
                        format!("{} (sequences put back where they were: {})", e.message, restored.join(", "))
                }
                Ok(_) => {}
                Err(r) => {
                    e.message =
                        format!("{} (a sequence it set back could not be put back: {})", e.message, r.message)
                }
            }
            return Err(e);
        }
        match close.first() {
            Some(s) => run(s.sql.clone()).await.map_err(|e| failed(s, e, kept))?,
            None => run("COMMIT".into()).await.map_err(pg_error)?,
        }
        kept = true;
    }
    let took = Duration::from_secs_f64(began.elapsed().as_secs_f64());
    let promoted = Promoted {
        candidate: tested.name.clone(),
        sha256: hash,
        target,
        statements: statements.len(),
        single_transaction: single,
        duration_ms: took.as_secs_f64() * 1e3,
    };
    engine.store().record_or_log(NewEvent {
        kind: crate::events::EventKind::MigrationPromoted,
        golden: Some(req.report.golden.clone()),
        detail: serde_json::to_value(&promoted).expect("promoted serializes"),
        ..Default::default()
    });
    Ok(promoted)
}

/// A run of a file's statements promote applies together.
struct Part {
    /// The statements, by index.
    range: std::ops::Range<usize>,
    /// Whether it runs in a transaction promote checks before it commits.
    checked: bool,
    /// Whether promote opens that transaction (else the part is the file's
    /// own `BEGIN ... COMMIT`).
    own_transaction: bool,
}

/// How a file runs: all in one checked transaction when every statement can
/// share one; else as psql would, each statement outside the file's
/// transactions in a checked transaction of its own, each of the file's
/// `BEGIN ... COMMIT` blocks checked before its COMMIT, and what cannot run in
/// a transaction (`CREATE INDEX CONCURRENTLY`...), or a block that chains or
/// rolls itself back, run unchecked.
fn parts(statements: &[split::Statement], single: bool) -> Vec<Part> {
    if single {
        return vec![Part { range: 0..statements.len(), checked: true, own_transaction: true }];
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i < statements.len() {
        let one = |checked| Part { range: i..i + 1, checked, own_transaction: true };
        match split::kind(&statements[i].sql) {
            Kind::Plain => out.push(one(true)),
            Kind::Begin => {
                let end = statements[i..]
                    .iter()
                    .position(|s| matches!(split::kind(&s.sql), Kind::Commit | Kind::Rollback));
                let Some(end) = end.map(|e| i + e) else {
                    out.push(Part { range: i..statements.len(), checked: false, own_transaction: true });
                    break;
                };
                let plain = statements[i + 1..end].iter().all(|s| split::kind(&s.sql) == Kind::Plain);
                let commits = split::kind(&statements[end].sql) == Kind::Commit
                    && !statements[end].sql.to_ascii_uppercase().contains("CHAIN");
                out.push(Part { range: i..end + 1, checked: plain && commits, own_transaction: false });
                i = end + 1;
                continue;
            }
            _ => out.push(one(false)),
        }
        i += 1;
    }
    out
}

/// A target's refusal, as `migration_failed`.
pub(super) fn pg_error(e: tokio_postgres::Error) -> Error {
    Error::new(
        ErrorCode::MigrationFailed,
        crate::pg::admin::describe(&e),
        "the target refused; nothing was applied",
    )
}
