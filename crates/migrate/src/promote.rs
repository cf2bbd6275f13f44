//! `migrate promote`: the tested file, applied to a real database behind guards.
//!
//! The file must be the one tested (same SHA-256), its test must have passed (or
//! each hazard be allowed by name), and the target's schema must still be the
//! schema the test ran on — otherwise the target has drifted and the test says
//! nothing about it. Then the file is applied with `lock_timeout` and
//! `statement_timeout`, in one transaction unless it manages transactions itself
//! or holds a statement that cannot run in one.

use std::time::{Duration, Instant};

use airlock_postgres::cell::Cell;

use serde::{Deserialize, Serialize};

use super::parts;
use super::report::Report;
use super::verify;
use super::verify::pg_error;
use super::Candidate;
use airlock_core::dsn::redact;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::events::NewEvent;
use airlock_lifecycle::engine::Engine;
use airlock_postgres::split;

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
    /// Apply a file its report already promoted to this target once more.
    #[serde(default)]
    pub again: bool,
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
    // Nothing in the report is read before its seal holds.
    super::seal::check(&engine.layout, &req.report)?;
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
    let client = airlock_postgres::target::connect(&req.target_dsn).await?;
    if !req.allow_superuser {
        if let Some(why) = verify::too_powerful(&client).await? {
            return Err(refused(
                format!("the target session {why}: a migration run by it can act outside the database (roles, programs, files), beyond what promote checks or rolls back"),
                "give a DSN of the application's owner role, or pass --allow-superuser",
            ));
        }
    }
    let now = airlock_postgres::catalog::read(&client).await?;
    let drift = verify::drift(
        &req.report.golden_catalog,
        &verify::leaving_out(now.clone(), &req.report.left_out, &req.report.golden_catalog),
    );
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
            kind: airlock_core::events::EventKind::MigrationPromoted,
            golden: Some(req.report.golden.clone()),
            detail: serde_json::json!({"checked_only": true, "promoted": checked}),
            ..Default::default()
        });
        return Ok(checked);
    };
    // Once per report, file and target, unless told: a file of data changes
    // promoted twice does them twice, and after the first time its rows count
    // as changed since the golden, which no check compares.
    let target_name: String = client
        .query_one("SELECT pg_catalog.current_database()::text", &[])
        .await
        .map_err(pg_error)?
        .cell(0)?;
    let marker = super::rows::promotion_mark(
        &engine.layout,
        &tested.row_record,
        &hash,
        &format!("{target}\0{target_name}"),
    );
    if let Ok(at) = std::fs::read_to_string(&marker) {
        if !req.again {
            return Err(refused(
                format!("{} was promoted from this report to {target} already ({})", tested.name, at.trim()),
                "promote it once more on purpose with --again, or test it again for a fresh report",
            ));
        }
    }
    let statements = split::split(sql)?;
    let lock = req.lock_timeout_ms.unwrap_or(5_000);
    let statement = req.statement_timeout_ms.unwrap_or(600_000);
    // Promote's timeouts hold for every statement: set again after each of
    // the file's, whose own `SET lock_timeout = 0` would otherwise lift them
    // for the rest of it.
    // And its own checks leave the session idle in the open transaction for as
    // long as they take: a role's idle_in_transaction_session_timeout would
    // end it.
    let guards = format!(
        "SET lock_timeout = {lock}; SET statement_timeout = {statement}; SET idle_in_transaction_session_timeout = 0"
    );
    let run = |sql: String| {
        let (client, guards) = (&client, guards.clone());
        async move {
            if split::copies_out(&sql) {
                let rows = client.copy_out(sql.as_str()).await?;
                futures_util::pin_mut!(rows);
                while futures_util::TryStreamExt::try_next(&mut rows).await?.is_some() {}
            } else {
                client.batch_execute(&sql).await?;
            }
            client.batch_execute(&guards).await
        }
    };
    run("SELECT 1".into()).await.map_err(pg_error)?;
    // The same text means the same only under the same settings: a time
    // without a zone, a date's order, an unqualified name.
    for (name, value) in &tested.session {
        if let Err(e) = client.execute("SELECT pg_catalog.set_config($1, $2, false)", &[name, value]).await {
            return Err(refused(
                format!(
                    "the target does not take {name} = {value:?}, which the test ran with: {}",
                    airlock_postgres::admin::describe(&e)
                ),
                "test against a golden built from this target, then promote",
            ));
        }
    }
    let single = parts::whole(&statements);
    let all = parts::parts(&statements);
    // The rows the test saw, part by part, for the target's to be held to.
    let home = engine.layout.migration_rows();
    let golden_rows = super::rows::load_generation(&home.join(&req.report.rows))
        .map_err(|e| super::rows::gone("the golden's rows", &e))?;
    let mut rows_before = golden_rows.clone();
    let record = super::rows::load_run(&home.join(&tested.row_record))
        .map_err(|e| super::rows::gone("the rows it changed", &e))?;
    let shape = verify::golden_shape(&req.report.golden_catalog);
    let began = Instant::now();
    let mut kept = false;
    // The target's schema before the next part: what that part's catalog
    // changes are read against.
    let mut catalog_before = now;
    for part in &all {
        let within = &statements[part.range.clone()];
        let line = within.first().map_or(0, |s| s.line);
        // What the test saw this part do: the whole file's record, or the part's.
        let (changes, set_back, advanced) = if single {
            (tested.changes.as_slice(), &tested.sequences_set_back, &tested.sequences_advanced)
        } else {
            let record = tested
                .parts
                .iter()
                .find(|r| r.from == part.range.start && r.to == part.range.end)
                .ok_or_else(|| {
                refused(
                    format!("its test recorded nothing of the part from line {line}"),
                    "test the file again with `airlock migrate test`, then promote with the new report",
                )
            })?;
            (record.changes.as_slice(), &record.sequences_set_back, &record.sequences_advanced)
        };
        let rows = record
            .iter()
            .find(|(from, to, _)| *from == part.range.start && *to == part.range.end)
            .map(|(_, _, rows)| rows)
            .ok_or_else(|| {
                refused(
                    format!("its test's row record holds nothing of the part from line {line}"),
                    "test the file again with `airlock migrate test`, then promote with the new report",
                )
            })?;
        let tested_part = tested.statements.get(part.range.clone()).unwrap_or(&[]);
        let compared: std::collections::BTreeSet<String> = rows.keys().cloned().collect();
        let seen_in_test = verify::Tested {
            statements: tested_part,
            changes,
            set_back,
            advanced,
            golden_rows: &golden_rows,
            rows_before: &rows_before,
            rows,
            shape: &shape,
        };
        let failed = |s: &split::Statement, e: tokio_postgres::Error, kept: bool| {
            let undone = if kept { "statements before it stay applied" } else { "nothing was applied" };
            Error::new(
                ErrorCode::MigrationFailed,
                format!("line {}: {} ({undone})", s.line, airlock_postgres::admin::describe(&e)),
                "a lock_timeout error (55P03) means the target is busy: retry when it is quieter",
            )
        };
        let differs = |surprises: Vec<String>, after: &str| {
            refused(
                format!(
                    "on the target, {} did what its test did not (the part from line {line}){after}: {}",
                    tested.name,
                    surprises.join("; ")
                ),
                "the migration behaves differently here than on the golden (it may tell the two apart): \
                 read it before running it anywhere",
            )
        };
        if !part.checked {
            // What cannot run in a transaction (or rolls itself back) is
            // checked once it ran: a difference then stops the file there.
            let before = verify::Before::read(&client, &shape, &compared).await?;
            for s in within {
                if let Err(e) = run(s.sql.clone()).await {
                    return Err(undone(&client, &before, advanced, failed(s, e, kept)).await);
                }
                kept = true;
            }
            let seen = verify::surprises(&client, &seen_in_test, &catalog_before, &before).await?;
            if !seen.found.is_empty() {
                let e = differs(
                    seen.found,
                    ", where nothing can be undone: what it did stays, and nothing after it ran",
                );
                return Err(undone(&client, &before, advanced, e).await);
            }
            catalog_before = seen.catalog;
        } else {
            let (open, body, close) = {
                let from = usize::from(part.opening == parts::Opening::File);
                let to = within.len() - usize::from(part.file_commits);
                (&within[..from], &within[from..to], &within[to..])
            };
            match (part.opening, open.first()) {
                (parts::Opening::File, Some(s)) => {
                    run(s.sql.clone()).await.map_err(|e| failed(s, e, kept))?
                }
                (parts::Opening::Chained, _) => {}
                _ => run("BEGIN".into()).await.map_err(pg_error)?,
            }
            // One snapshot for the whole part (unless the file chose its own
            // level): what the check reads before and after is the
            // migration's doing alone, not the application's writes that
            // commit meanwhile. A write the application made to a row the
            // migration writes too fails it (40001): promote again.
            let chose_level = open.first().is_some_and(|s| s.sql.to_ascii_lowercase().contains("isolation"));
            if part.opening != parts::Opening::Chained && !chose_level {
                run("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ".into()).await.map_err(pg_error)?;
            }
            let before = verify::Before::read(&client, &shape, &compared).await?;
            for s in body {
                if let Err(e) = run(s.sql.clone()).await {
                    let _ = run("ROLLBACK".into()).await;
                    return Err(undone(&client, &before, advanced, failed(s, e, kept)).await);
                }
            }
            // Before anything is kept, the target must have seen what the test
            // saw: a migration that behaves otherwise here (one that can tell it
            // is being tested, say) is rolled back and refused.
            let checked = async {
                if let Some(e) = verify::settle_deferred(&client).await? {
                    return Err(Error::new(
                        ErrorCode::MigrationFailed,
                        format!("at the COMMIT of the part from line {line}: {e}"),
                        "the target refused what the commit would do",
                    ));
                }
                let seen = verify::surprises(&client, &seen_in_test, &catalog_before, &before).await?;
                if !seen.found.is_empty() {
                    let kept =
                        if kept { "; the parts before it stay applied" } else { "; nothing was applied" };
                    return Err(differs(seen.found, &format!(", so that part was rolled back{kept}")));
                }
                Ok(seen.catalog)
            }
            .await;
            match checked {
                // A commit changes no catalog entry, so what the check read is
                // what the next part starts from.
                Ok(catalog) => catalog_before = catalog,
                Err(e) => {
                    let _ = run("ROLLBACK".into()).await;
                    return Err(undone(&client, &before, advanced, e).await);
                }
            }
            match close.first() {
                Some(s) => run(s.sql.clone()).await.map_err(|e| failed(s, e, kept))?,
                None => run("COMMIT".into()).await.map_err(pg_error)?,
            }
            kept = true;
        }
        // The next part starts, in the test, from what this one left.
        super::rows::apply(&mut rows_before, rows);
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
        kind: airlock_core::events::EventKind::MigrationPromoted,
        golden: Some(req.report.golden.clone()),
        detail: serde_json::to_value(&promoted).expect("promoted serializes"),
        ..Default::default()
    });
    if let Err(e) =
        std::fs::write(&marker, format!("{}\n", airlock_core::clock::Timestamp::now().to_rfc3339()))
    {
        tracing::warn!(error = %e, "a promotion's mark could not be kept: it could be promoted again unasked");
    }
    Ok(promoted)
}

/// `e`, once what a rollback leaves is seen to: sequences set back, or moved
/// forward further than `tested` (the test's advances) allows, are put back
/// where they were, and what stays (sequences advanced, an INVALID index) is
/// said.
async fn undone(
    client: &tokio_postgres::Client,
    before: &verify::Before,
    tested: &std::collections::BTreeMap<String, i64>,
    mut e: Error,
) -> Error {
    let mut said = Vec::new();
    match verify::restore_sequences(client, before, tested).await {
        Ok(restored) if !restored.is_empty() => {
            said.push(format!("sequences put back where they were: {}", restored.join(", ")))
        }
        Ok(_) => {}
        Err(r) => said.push(format!("a sequence it set back could not be put back: {}", r.message)),
    }
    match before.left_behind(client).await {
        Ok(left) => said.extend(left),
        Err(r) => said.push(format!("what it left behind could not be read: {}", r.message)),
    }
    if !said.is_empty() {
        e.message = format!("{} ({})", e.message, said.join("; "));
    }
    e
}
