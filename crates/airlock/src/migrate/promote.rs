//! `migrate promote`: the tested file, applied to a real database behind guards.
//!
//! The file must be the one tested (same SHA-256), its test must have passed (or
//! each hazard be allowed by name), and the target's schema must still be the
//! schema the test ran on — otherwise the target has drifted and the test says
//! nothing about it. Then the file is applied with `lock_timeout` and
//! `statement_timeout`, in one transaction unless it manages transactions itself
//! or holds a statement that cannot run in one.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::report::{CandidateReport, Report};
use super::split::{self, Kind};
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
    /// `lock_timeout` on the target, milliseconds (default 5,000).
    #[serde(default)]
    pub lock_timeout_ms: Option<u64>,
    /// `statement_timeout` on the target, milliseconds (default 600,000).
    #[serde(default)]
    pub statement_timeout_ms: Option<u64>,
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
    let sql = req.candidate.sql.as_deref().ok_or_else(|| {
        refused("only SQL files can be promoted", "apply a command candidate with its own tool")
    })?;
    let hash = req.candidate.sha256();
    let tested = req.report.candidates.iter().find(|c| c.sha256 == hash).ok_or_else(|| {
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
    let unallowed: Vec<&str> = tested
        .hazards
        .iter()
        .map(|h| h.kind.as_str())
        .filter(|k| !req.allow_hazards.iter().any(|a| a == k))
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
    let statements = split::split(sql)?;
    let target = redact(&req.target_dsn);
    let client = crate::pg::target::connect(&req.target_dsn).await?;
    let now = crate::catalog::read(&client).await?;
    let drift = crate::catalog::diff::diff(&req.report.golden_catalog, &now);
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
    let lock = req.lock_timeout_ms.unwrap_or(5_000);
    let statement = req.statement_timeout_ms.unwrap_or(600_000);
    let run = |sql: String| {
        let client = &client;
        async move { client.batch_execute(&sql).await }
    };
    run(format!("SET lock_timeout = {lock}; SET statement_timeout = {statement}")).await.map_err(pg_error)?;
    let single = statements.iter().all(|s| split::kind(&s.sql) == Kind::Plain);
    let began = Instant::now();
    let mut files_before = BTreeMap::new();
    if single {
        run("BEGIN".into()).await.map_err(pg_error)?;
        files_before = table_files(&client).await?;
    }
    for s in &statements {
        if let Err(e) = run(s.sql.clone()).await {
            if single {
                let _ = run("ROLLBACK".into()).await;
            }
            let undone = if single { "nothing was applied" } else { "statements before it stay applied" };
            return Err(Error::new(
                ErrorCode::MigrationFailed,
                format!("line {}: {} ({undone})", s.line, crate::pg::admin::describe(&e)),
                "a lock_timeout error (55P03) means the target is busy: retry when it is quieter",
            ));
        }
    }
    if single {
        // Before anything is kept, the target must have seen what the test saw:
        // a migration that behaves otherwise here (one that can tell it is being
        // tested, say) is rolled back and refused.
        let checked = async {
            if let Some(e) = settle_deferred(&client).await? {
                return Err(Error::new(
                    ErrorCode::MigrationFailed,
                    format!("at COMMIT: {e} (nothing was applied)"),
                    "the target refused what the commit would do",
                ));
            }
            let surprises = surprises(&client, tested, &now, &files_before).await?;
            if !surprises.is_empty() {
                return Err(refused(
                    format!(
                        "on the target, {} did what its test did not, so nothing was applied: {}",
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
        if let Err(e) = checked {
            let _ = run("ROLLBACK".into()).await;
            return Err(e);
        }
        run("COMMIT".into()).await.map_err(pg_error)?;
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
    engine.store().record(NewEvent {
        kind: crate::events::EventKind::MigrationPromoted,
        golden: Some(req.report.golden.clone()),
        detail: serde_json::to_value(&promoted).expect("promoted serializes"),
        ..Default::default()
    })?;
    Ok(promoted)
}

/// Each user table's storage file, `schema.name` to file number: a rewrite or
/// TRUNCATE gives a table a new one.
async fn table_files(client: &tokio_postgres::Client) -> Result<BTreeMap<String, i64>> {
    let rows = client
        .query(
            "SELECT n.nspname::text || '.' || c.relname::text, c.relfilenode::bigint
               FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
              WHERE c.relkind IN ('r', 'm') AND n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\\_%'",
            &[],
        )
        .await
        .map_err(pg_error)?;
    Ok(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Runs what the commit would set off, until a round changes no row (see the
/// test's own `apply::run_deferred`); the error the commit would raise, if any.
async fn settle_deferred(client: &tokio_postgres::Client) -> Result<Option<String>> {
    let mut changed = xact_activity(client).await?;
    for _ in 0..20 {
        if let Err(e) = client.batch_execute("SET CONSTRAINTS ALL IMMEDIATE").await {
            return Ok(Some(crate::pg::admin::describe(&e)));
        }
        let now = xact_activity(client).await?;
        if now == changed {
            return Ok(None);
        }
        changed = now;
    }
    Ok(Some("work deferred to the commit kept deferring more work".into()))
}

/// Rows inserted, updated and deleted per user table in the open transaction.
async fn xact_activity(client: &tokio_postgres::Client) -> Result<BTreeMap<String, [i64; 3]>> {
    let rows = client
        .query(
            "SELECT schemaname::text || '.' || relname::text, n_tup_ins, n_tup_upd, n_tup_del
               FROM pg_catalog.pg_stat_xact_user_tables",
            &[],
        )
        .await
        .map_err(pg_error)?;
    Ok(rows.into_iter().map(|r| (r.get(0), [r.get(1), r.get(2), r.get(3)])).collect())
}

/// What the migration did on the target, in its open transaction, that its test
/// did not: rows inserted, updated or deleted in a table where the test changed
/// none of that kind, a table rewritten or truncated that the test did not, and
/// objects made, dropped or changed that the test's did not.
async fn surprises(
    client: &tokio_postgres::Client,
    tested: &CandidateReport,
    catalog_before: &crate::catalog::Catalog,
    files_before: &BTreeMap<String, i64>,
) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut seen: BTreeMap<&str, [i64; 3]> = BTreeMap::new();
    let mut rewritten: BTreeSet<&str> = BTreeSet::new();
    for st in &tested.statements {
        for r in &st.rows {
            let m = seen.entry(r.table.as_str()).or_default();
            m[0] += r.inserted;
            m[1] += r.updated;
            m[2] += r.deleted;
            if r.truncated {
                rewritten.insert(r.table.as_str());
            }
        }
        rewritten.extend(st.rewrites.iter().map(|w| w.table.as_str()));
    }
    for (table, did) in xact_activity(client).await? {
        let tested = seen.get(table.as_str()).copied().unwrap_or_default();
        for (i, what) in ["inserted into", "updated in", "deleted from"].iter().enumerate() {
            if did[i] > 0 && tested[i] == 0 {
                out.push(format!("{} rows {what} {table}", did[i]));
            }
        }
    }
    for (table, file) in table_files(client).await? {
        if files_before.get(&table).is_some_and(|f| *f != file) && !rewritten.contains(table.as_str()) {
            out.push(format!("{table} rewritten or truncated"));
        }
    }
    // Objects by kind, name and change (definitions may differ: owners do).
    let after = crate::catalog::read(client).await?;
    let key = |c: &crate::catalog::diff::Change| format!("{} {} {}", c.change, c.object, c.name);
    let objects = |changes: &[crate::catalog::diff::Change]| -> BTreeSet<String> {
        changes.iter().filter(|c| !c.name.starts_with("properties of")).map(key).collect()
    };
    let here = objects(&crate::catalog::diff::diff(catalog_before, &after));
    let there = objects(&tested.changes);
    for extra in here.difference(&there).take(5) {
        out.push(format!("{extra} (not in the test)"));
    }
    for missing in there.difference(&here).take(5) {
        out.push(format!("{missing} in the test, not here"));
    }
    Ok(out)
}

fn pg_error(e: tokio_postgres::Error) -> Error {
    Error::new(
        ErrorCode::MigrationFailed,
        crate::pg::admin::describe(&e),
        "the target refused; nothing was applied",
    )
}
