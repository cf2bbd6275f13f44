//! The migration airlock: candidate migrations tested on forks of a golden with
//! real data, measured statement by statement, verified, judged and ranked; then
//! applied to a real database only behind guards (`promote`).
//!
//! Each candidate gets its own fork, so candidates never share state, and they run
//! in parallel. Before a candidate runs, its fork gets the measuring machinery
//! (`probe`); the candidate then runs as the agent role, as it would be applied
//! (`apply`); assertions and a schema comparison follow; `hazards` turns it all
//! into a verdict from counts alone, and `scale` into estimates at production
//! size. `app` plans the application's queries before and after and runs a
//! workload beside the candidate.

pub mod agent;
pub mod app;
pub mod apply;
pub mod code;
pub mod command;
pub mod costs;
pub mod hazards;
pub mod parts;
pub mod probe;
pub mod promote;
pub mod render;
pub mod report;
pub mod rows;
pub mod scale;
pub mod seal;
pub mod verify;

use airlock_postgres::cell::Cell;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use airlock_core::dsn::DATABASE;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::events::{DeleteReason, NewEvent};
use airlock_lifecycle::engine::Engine;
use airlock_lifecycle::sandbox::{self, Access, ForkRequest, Limits, Mode, Sandbox};
use airlock_postgres::admin::Admin;
use airlock_postgres::catalog::{self, Catalog, Snapshot};
use airlock_postgres::wire::TextRows;
use report::{Assertion, CandidateReport, ExecOutcome, Report};

/// Most candidates in one run.
pub const MAX_CANDIDATES: usize = 32;

/// One candidate migration.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Candidate {
    /// How it is named in the report (a file name, say).
    pub name: String,
    /// Its SQL text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sql: Option<String>,
    /// Or a command run inside the fork's boundary with `DATABASE_URL` set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<String>,
    /// The migration files a command runs (`--exec-files`), each with its
    /// SHA-256: part of the candidate's hash, so a changed file is a changed candidate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exec_files: Vec<HashedFile>,
}

/// A file a command candidate runs, by path and content hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HashedFile {
    /// Its path as given.
    pub path: String,
    /// SHA-256 of its bytes.
    pub sha256: String,
}

impl HashedFile {
    /// Hashes `bytes` read from `path`.
    pub fn new(path: String, bytes: &[u8]) -> HashedFile {
        HashedFile { path, sha256: airlock_core::secret::hex(&Sha256::digest(bytes)) }
    }
}

impl Candidate {
    /// SHA-256 of what will be applied: the file's bytes, or the command and
    /// the files it runs (each by path and content, in path order).
    pub fn sha256(&self) -> String {
        if let (None, Some(cmd)) = (&self.sql, &self.exec) {
            if !self.exec_files.is_empty() {
                let mut files = self.exec_files.clone();
                files.sort_by(|a, b| a.path.cmp(&b.path));
                let mut h = Sha256::new();
                h.update(cmd.as_bytes());
                for f in &files {
                    h.update(b"\0");
                    h.update(f.path.as_bytes());
                    h.update(b"\0");
                    h.update(f.sha256.as_bytes());
                }
                return airlock_core::secret::hex(&h.finalize());
            }
        }
        let bytes = self.sql.as_deref().or(self.exec.as_deref()).unwrap_or_default();
        airlock_core::secret::hex(&Sha256::digest(bytes.as_bytes()))
    }
}

/// Body of `POST /v1/migrations/test`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TestRequest {
    /// The golden to test on (its current generation).
    pub golden: String,
    /// The candidates.
    pub candidates: Vec<Candidate>,
    /// Queries that must each return true, or no rows, after a candidate.
    #[serde(default)]
    pub assertions: Vec<String>,
    /// Compare the result with this golden's schema.
    #[serde(default)]
    pub expect_golden: Option<String>,
    /// Or with the schema these SQL files make (absolute paths).
    #[serde(default)]
    #[schema(value_type = Vec<String>)]
    pub expect_files: Vec<PathBuf>,
    /// Candidates run at once (default 4).
    #[serde(default)]
    pub parallel: Option<usize>,
    /// Each statement's timeout, milliseconds (default 300,000).
    #[serde(default)]
    pub statement_timeout_ms: Option<u64>,
    /// A blocking lock on a table with rows estimated to be held longer than
    /// this (at production size when production statistics are given) is a
    /// hazard, milliseconds (default 1,000).
    #[serde(default)]
    pub lock_threshold_ms: Option<u64>,
    /// Production's table sizes, for estimates at production size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub production_stats: Option<scale::ProductionStats>,
    /// The application's queries, planned before and after each candidate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub app_queries: Vec<String>,
    /// A workload run beside each candidate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<app::WorkloadSpec>,
    /// The sandbox whose agent asked for the test (the `test_migration` tool),
    /// named in the test's audit record; never taken from a request body.
    #[serde(skip)]
    #[schema(ignore)]
    pub on_behalf_of: Option<String>,
}

/// Rows each table's counters show changed by the candidate's session beyond
/// what its statements' measurements add up to, per table: `[inserted,
/// updated, deleted]` beyond. Read once the session's server process is gone
/// (it hands its counters over as it exits).
async fn unmeasured_changes(
    admin: &Admin,
    applied: &apply::Applied,
    before: &BTreeMap<i64, (String, [i64; 3])>,
) -> Result<Vec<(String, [i64; 3])>> {
    let gone = Instant::now() + Duration::from_secs(5);
    while Instant::now() < gone {
        let row = admin
            .client()
            .query_one("SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE pid = $1", &[&applied.backend])
            .await
            .map_err(|e| Error::postgres(airlock_postgres::admin::describe(&e)))?;
        if row.cell::<i64>(0)? == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let after = activity_by_relid(admin).await?;
    // Rolled-back changes are on the server's counters too.
    let measured = report::rows_by_table(&applied.statements, false);
    let mut out = Vec::new();
    for (relid, (current, now)) in &after {
        // The probe's own tables are the measuring machinery's.
        if current.starts_with("pg_airlock") {
            continue;
        }
        // Measurements name a table by the name it was first seen under.
        let table = applied.names.get(relid).unwrap_or(current);
        let then = before.get(relid).map(|b| b.1).unwrap_or_default();
        let seen = measured.get(table.as_str()).copied().unwrap_or_default();
        let beyond: [i64; 3] = std::array::from_fn(|i| (now[i] - then[i] - seen[i]).max(0));
        if beyond.iter().any(|n| *n > 0) {
            out.push((table.clone(), beyond));
        }
    }
    Ok(out)
}

/// Each user table's counters of rows inserted, updated and deleted, with its
/// name now, by OID (a table renamed during the run is still the same table).
async fn activity_by_relid(admin: &Admin) -> Result<BTreeMap<i64, (String, [i64; 3])>> {
    let rows = admin
        .client()
        .query(
            "SELECT relid::int8, pg_catalog.quote_ident(schemaname) || '.' || pg_catalog.quote_ident(relname), n_tup_ins, n_tup_upd, n_tup_del
               FROM pg_catalog.pg_stat_user_tables",
            &[],
        )
        .await
        .map_err(|e| Error::postgres(airlock_postgres::admin::describe(&e)))?;
    rows.into_iter().map(|r| Ok((r.cell(0)?, (r.cell(1)?, [r.cell(2)?, r.cell(3)?, r.cell(4)?])))).collect()
}

/// How long the final count of one table, and of all, may take.
const FINAL_COUNT_PER_TABLE: Duration = Duration::from_secs(10);
const FINAL_COUNT_BUDGET: Duration = Duration::from_secs(60);

fn invalid(message: impl Into<String>, hint: impl Into<String>) -> Error {
    Error::new(ErrorCode::InvalidRequest, message, hint)
}

/// Tests every candidate on its own fork; returns the report.
pub async fn test(engine: Arc<Engine>, req: TestRequest) -> Result<Report> {
    let began = std::time::Instant::now();
    if req.candidates.is_empty() || req.candidates.len() > MAX_CANDIDATES {
        return Err(invalid(
            format!("{} candidates given", req.candidates.len()),
            format!("give between 1 and {MAX_CANDIDATES} candidate files (or --exec commands)"),
        ));
    }
    for c in &req.candidates {
        match (&c.sql, &c.exec) {
            (Some(sql), None) => {
                if let Some(at) = sql.find('\0') {
                    let line = sql[..at].matches('\n').count() + 1;
                    return Err(invalid(
                        format!("{}: a NUL byte at line {line}", c.name),
                        "a migration is text: remove the NUL byte (is it a binary file?)",
                    ));
                }
                let statements = airlock_postgres::split::split(sql)
                    .map_err(|e| invalid(format!("{}: {}", c.name, e.message), e.hint))?;
                if statements.is_empty() {
                    return Err(invalid(
                        format!("{} holds no statement", c.name),
                        "give a file with at least one SQL statement",
                    ));
                }
            }
            (None, Some(cmd)) if !cmd.trim().is_empty() => {}
            _ => {
                return Err(invalid(
                    format!("candidate {:?} needs SQL or a command", c.name),
                    "give a file or --exec",
                ))
            }
        }
    }
    if req.app_queries.len() > app::MAX_QUERIES {
        return Err(invalid(
            format!("{} application queries given", req.app_queries.len()),
            format!("give at most {} (the most frequent ones)", app::MAX_QUERIES),
        ));
    }
    if req.workload.as_ref().is_some_and(|w| w.queries.len() > app::MAX_QUERIES) {
        return Err(invalid(
            "the workload has too many queries",
            format!("give at most {}", app::MAX_QUERIES),
        ));
    }
    if !req.expect_files.is_empty() && req.expect_golden.is_some() {
        return Err(invalid("both --expect and --expect-golden given", "compare with one expected schema"));
    }
    let golden = engine.store().golden(&req.golden)?;
    let generation = golden.current_generation;
    if golden.current().is_some_and(|m| !m.has_postgres()) {
        return Err(invalid(
            format!("golden {:?} has no PostgreSQL part to migrate", req.golden),
            "test migrations against a golden made from PostgreSQL (--schema/--seed, --from-url or --from-dump)",
        ));
    }
    let snapshot = Snapshot::load(&engine.layout.golden_generation(&req.golden, generation))?;
    let costs = costs::costs_path(&engine.layout, &req.golden, generation)?;
    let rows = rows::generation_path(&engine.layout, &req.golden, generation)?;
    rows::prune(&engine.layout);
    let run = rows::run_dir(&engine.layout);
    let expected = expected_catalog(&engine, &req).await?;
    let baseline = Arc::new(Baseline { snapshot, expected, costs, rows, run });
    let parallel = req.parallel.unwrap_or(4).clamp(1, MAX_CANDIDATES);
    let permits = Arc::new(tokio::sync::Semaphore::new(parallel));
    let mut tasks = tokio::task::JoinSet::new();
    // The candidates' forks are recorded as coming through the test's own door.
    let door = airlock_core::events::Door::current();
    for (i, candidate) in req.candidates.iter().cloned().enumerate() {
        let (engine, req, baseline, permits) =
            (engine.clone(), req.clone(), baseline.clone(), permits.clone());
        tasks.spawn(airlock_core::events::DOOR.scope(door, async move {
            let _permit = permits.acquire_owned().await;
            (i, test_one(&engine, &req, &candidate, &baseline).await)
        }));
    }
    // Every candidate runs to its end (and deletes its fork) before any error is
    // returned: leaving the others would abort them and leave their forks running.
    let mut results: Vec<Option<CandidateReport>> = vec![None; req.candidates.len()];
    let mut first_error = None;
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((i, Ok(report))) => results[i] = Some(report),
            Ok((_, Err(e))) => {
                first_error.get_or_insert(e);
            }
            Err(e) => {
                first_error.get_or_insert(e.into());
            }
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    let candidates: Vec<CandidateReport> = results.into_iter().flatten().collect();
    let ranking = hazards::rank(&candidates);
    let calibration = costs::kept(&baseline.costs).unwrap_or_default();
    let scale = scale::Scale::new(&calibration, req.production_stats.as_ref());
    let best = ranking.first().filter(|n| candidates.iter().any(|c| &c.name == *n && c.passed)).cloned();
    let mut report = Report {
        golden: req.golden.clone(),
        generation,
        golden_catalog: baseline.snapshot.catalog.clone(),
        left_out: match golden.current().map(|m| &m.source) {
            Some(airlock_lifecycle::golden::Source::Url { exclude, .. }) => exclude.clone(),
            _ => Default::default(),
        },
        passed: candidates.iter().all(|c| c.passed),
        best,
        ranking,
        candidates,
        scale,
        rows: baseline
            .rows
            .strip_prefix(engine.layout.migration_rows())
            .unwrap_or(&baseline.rows)
            .display()
            .to_string(),
        seal: String::new(),
    };
    seal::seal(&engine.layout, &mut report)?;
    let summary: Vec<serde_json::Value> = report
        .candidates
        .iter()
        .map(|c| {
            // Statement timings (not their text) are kept for the trace of the test.
            let statements: Vec<serde_json::Value> = c
                .statements
                .iter()
                .take(500)
                .map(|st| serde_json::json!({"line": st.line, "tag": st.tag, "ms": st.duration_ms}))
                .collect();
            serde_json::json!({"name": c.name, "sha256": c.sha256, "passed": c.passed,
            "hazards": c.hazards.iter().map(|h| h.kind.as_str()).collect::<Vec<_>>(),
            "duration_ms": c.duration_ms, "statements": statements})
        })
        .collect();
    engine.store().record(NewEvent {
        kind: airlock_core::events::EventKind::MigrationTested,
        sandbox: req.on_behalf_of.clone(),
        golden: Some(req.golden.clone()),
        detail: serde_json::json!({"generation": generation, "candidates": summary, "best": report.best,
            "test_ms": began.elapsed().as_secs_f64() * 1e3}),
        ..Default::default()
    })?;
    Ok(report)
}

/// What every candidate of a run is measured against: the golden
/// generation's record, the expected schema, and where its costs are kept.
struct Baseline {
    snapshot: Snapshot,
    expected: Option<Catalog>,
    costs: std::path::PathBuf,
    /// Where the generation's rows are kept for promote.
    rows: std::path::PathBuf,
    /// Where this run's candidates' row records go.
    run: std::path::PathBuf,
}

/// The expected schema, when one was asked for.
async fn expected_catalog(engine: &Engine, req: &TestRequest) -> Result<Option<Catalog>> {
    if let Some(name) = &req.expect_golden {
        let g = engine.store().golden(name)?;
        return Ok(Some(
            Snapshot::load(&engine.layout.golden_generation(name, g.current_generation))?.catalog,
        ));
    }
    if req.expect_files.is_empty() {
        return Ok(None);
    }
    // A throwaway generation built from the files, read, and removed; never a golden.
    let name = format!("expect-{}", &airlock_core::secret::sandbox_id()[3..]);
    let source = airlock_lifecycle::golden::Source::Files { schema: req.expect_files.clone(), seed: vec![] };
    // On the tested golden's major, so both catalogs read alike.
    let major = engine.store().golden(&req.golden)?.current().map(|m| m.major());
    let built =
        airlock_lifecycle::golden::build_generation(engine, &name, 1, &source, false, major, None).await;
    let dir = engine.layout.goldens().join(&name);
    let result = built.and_then(|_| Snapshot::load(&engine.layout.golden_generation(&name, 1)));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Some(result?.catalog))
}

/// A migration test's fork, deleted however the test ends: by
/// [`TestFork::delete`] when it runs to its end, else (a panic, a dropped
/// request) by a task of its own.
struct TestFork {
    engine: Arc<Engine>,
    id: Option<String>,
}

impl TestFork {
    async fn delete(mut self) {
        if let Some(id) = self.id.take() {
            let _ = sandbox::delete(&self.engine, &id, DeleteReason::User).await;
        }
    }
}

impl Drop for TestFork {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let engine = self.engine.clone();
            tokio::spawn(async move {
                if let Err(e) = sandbox::delete(&engine, &id, DeleteReason::User).await {
                    tracing::error!(sandbox = %id, error = %e, "could not delete a migration test's fork");
                }
            });
        }
    }
}

/// Forks, measures, verifies and judges one candidate; the fork is always deleted.
async fn test_one(
    engine: &Arc<Engine>,
    req: &TestRequest,
    candidate: &Candidate,
    baseline: &Baseline,
) -> Result<CandidateReport> {
    let timeout = Duration::from_millis(req.statement_timeout_ms.unwrap_or(300_000).clamp(1_000, 3_600_000));
    let mut access = Access {
        mode: Mode::Owner,
        limits: Limits { statement_timeout_ms: timeout.as_millis() as u64, ..Default::default() },
    };
    // On a sandbox's behalf, no looser than that sandbox: its mode and limits,
    // and what is left of its disk allowance (the test's fork writes within it).
    let mut disk_allowance = None;
    if let Some(caller) = &req.on_behalf_of {
        let sb = engine.store().sandbox(caller)?;
        access = access.at_most(&sb.access);
        disk_allowance = engine.headroom.remaining(engine, &sb.id);
        if disk_allowance.is_some_and(|left| left < engine.config.disk_headroom_bytes) {
            return Err(Error::new(
                ErrorCode::DiskFull,
                format!("sandbox {} has written nearly all of its disk allowance", sb.id),
                "its migration tests write within what it has left: drop what it no longer needs (or reset it), then test again",
            ));
        }
    }
    let fork = ForkRequest {
        golden: req.golden.clone(),
        ttl_seconds: Some((timeout.as_secs() as i64 * 4).max(3600)),
        for_migration_test: true,
        disk_allowance,
        access,
        idle_suspend_seconds: Some(0),
        wait_seconds: Some(300),
        ..Default::default()
    };
    // On a task of its own: a test given up while its fork is being made
    // (its request dropped, its deadline passed) still ends with a fork that
    // [`TestFork`] deletes, never with one half-made.
    let forking = {
        let engine = engine.clone();
        // (Its records name the door the test came through, as they would here.)
        let door = airlock_core::events::Door::current();
        tokio::spawn(airlock_core::events::DOOR.scope(door, async move {
            let sb = sandbox::fork(&engine, &fork).await?.sandbox;
            Ok::<_, Error>((TestFork { engine, id: Some(sb.id.clone()) }, sb))
        }))
    };
    let (made, sb) = forking
        .await
        .map_err(|e| Error::internal(format!("making a migration test's fork failed ({e})")))??;
    airlock_core::crashpoint::reached("migrate.forked");
    let busy = engine.activity.open(&sb.id);
    let measured = {
        use futures_util::FutureExt;
        std::panic::AssertUnwindSafe(measure(engine, req, candidate, baseline, &sb, timeout))
            .catch_unwind()
            .await
    };
    drop(busy);
    made.delete().await;
    let result = measured.unwrap_or_else(|panic| {
        let what = airlock_listen::serve::panic_message(&panic);
        tracing::error!(sandbox = %sb.id, panic = %what, "measuring a migration candidate panicked");
        Err(Error::internal(format!("measuring it failed unexpectedly ({what})")))
    });
    // A candidate that breaks the measuring (it changed role, say) fails on
    // its own; the others' reports stand.
    Ok(result.unwrap_or_else(|e| unmeasurable(candidate, &e)))
}

/// The report of a candidate whose test could not be completed.
fn unmeasurable(candidate: &Candidate, e: &Error) -> CandidateReport {
    let hazard = report::Hazard::new(
        "failed",
        report::Severity::Critical,
        format!("its test could not be completed: {} ({})", e.message, e.code.as_str()),
        None,
    );
    CandidateReport {
        name: candidate.name.clone(),
        sha256: candidate.sha256(),
        kind: if candidate.sql.is_some() { "sql" } else { "exec" }.into(),
        passed: false,
        hazards: vec![hazard],
        notes: vec![],
        queries: vec![],
        workload: None,
        statements: vec![],
        failure: None,
        exec: None,
        assertions: vec![],
        changes: vec![],
        drift: vec![],
        sequences_set_back: Default::default(),
        sequences_advanced: Default::default(),
        changed_rows: Default::default(),
        row_record: String::new(),
        parts: vec![],
        session: Default::default(),
        duration_ms: 0.0,
    }
}

async fn measure(
    engine: &Engine,
    req: &TestRequest,
    candidate: &Candidate,
    baseline: &Baseline,
    sb: &Sandbox,
    timeout: Duration,
) -> Result<CandidateReport> {
    let Baseline { snapshot, expected, costs, .. } = baseline;
    let dir = engine.layout.sandbox_instance(&sb.id);
    let admin = Admin::connect(&dir, DATABASE, sb.pid.unwrap_or_default()).await?;
    let golden_rows: BTreeMap<String, i64> = snapshot.rows.iter().map(|(k, v)| (k.clone(), v.rows)).collect();
    // Costs are measured on a fork nothing has run on yet, before the probe exists.
    let calibration = costs::calibration(costs, admin.client(), &golden_rows).await?;
    let scale = scale::Scale::new(&calibration, req.production_stats.as_ref());
    admin.execute(&probe::install_sql()).await?;
    let planted_before = catalog::planted::read(admin.client()).await?;
    let invalid_before = invalid_indexes(&admin).await?;
    let sequences_before = verify::sequences(admin.client()).await?;
    // Which rows it changes, and to what, for promote to compare with the
    // target's (a workload beside it writes none: its writes are planned).
    let compared = compared_tables(&snapshot);
    let shape = verify::golden_shape(&snapshot.catalog);
    let images_before =
        verify::row_images(admin.client(), verify::Reading::AsReader, &shape, &compared, None).await?;
    rows::keep_generation(&baseline.rows, &rows::set_of(&images_before))?;
    let activity_before = activity_by_relid(&admin).await?;
    let plans_before = app::plan_all(engine, sb, &req.app_queries).await?;
    let mut unmeasured = Vec::new();
    let mut recorder: Option<parts::Recorder> = None;
    let done = std::sync::atomic::AtomicBool::new(false);
    let tables: Vec<String> = golden_rows.keys().cloned().collect();
    let text = candidate.sql.as_deref().or(candidate.exec.as_deref()).unwrap_or_default();
    // Ready before the candidate starts, so it feels the candidate from its first lock.
    let workload = match &req.workload {
        Some(spec) => Some(app::Workload::prepare(engine, sb, spec, text, &tables, timeout).await?),
        None => None,
    };
    let workload = async {
        match workload {
            Some(w) => Some(w.run(&done).await),
            None => None,
        }
    };
    let applying = async {
        let r = async {
            match (&candidate.sql, &candidate.exec) {
                (Some(sql), _) => {
                    let statements = airlock_postgres::split::split(sql)?;
                    let mut session = airlock_lifecycle::sandbox::session::connect(engine, sb).await?;
                    recorder = parts::Recorder::new(
                        &statements,
                        snapshot.catalog.clone(),
                        sequences_before.clone(),
                        images_before.clone(),
                        shape.clone(),
                    );
                    let applied = apply::apply_sql(
                        &mut session,
                        &admin,
                        &statements,
                        golden_rows.clone(),
                        timeout,
                        recorder.as_mut(),
                    )
                    .await;
                    session.close().await;
                    let applied = applied?;
                    unmeasured = unmeasured_changes(&admin, &applied, &activity_before).await?;
                    Ok((applied, None))
                }
                (None, Some(cmd)) => {
                    command::run(engine, sb, &admin, cmd, golden_rows.clone(), timeout).await
                }
                (None, None) => unreachable!("checked before forking"),
            }
        }
        .await;
        // However it ended, the workload beside it stops.
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        r
    };
    let (applied, workload) = tokio::join!(applying, workload);
    let (mut applied, exec): (apply::Applied, Option<ExecOutcome>) = applied?;
    let assertions =
        if applied.failure.is_none() { assert_all(engine, sb, &req.assertions).await? } else { vec![] };
    let now = catalog::read(admin.client()).await?;
    let sequences_after = verify::sequences(admin.client()).await?;
    let sequences_set_back = verify::set_back(&sequences_before, &sequences_after);
    let sequences_advanced = verify::advanced(&sequences_before, &sequences_after);
    let images_after = verify::row_images(
        admin.client(),
        verify::Reading::AsReader,
        &shape,
        &compared,
        Some(&images_before),
    )
    .await?;
    // What it did to every compared table it touched (by the server's counts:
    // a row rewritten as it was is a table touched all the same), kept for
    // promote: the whole file's, or each part's.
    let mut touched = rows::changes_of(&images_before, &images_after);
    // A table it rewrote counts as touched though no counter moved: what the
    // rewrite put in its rows is compared on the target like any write.
    let written: std::collections::BTreeSet<&str> = report::rows_by_table(&applied.statements, true)
        .into_iter()
        .filter(|(_, counts)| counts.iter().any(|n| *n > 0))
        .map(|(table, _)| table)
        .chain(report::rewritten(&applied.statements))
        .collect();
    touched.retain(|table, changed| !changed.is_empty() || written.contains(table.as_str()));
    let changed_rows = touched.iter().map(|(t, r)| (t.clone(), r.len())).collect();
    let (parts, record) = match recorder {
        Some(r) => (r.records, r.rows),
        None => (vec![], vec![(0, applied.statements.len(), touched)]),
    };
    let row_record = match candidate.sql {
        Some(_) => {
            let path = baseline.run.join(format!("{}.changes", candidate.sha256()));
            rows::keep_run(&path, &record)?;
            path.strip_prefix(engine.layout.migration_rows()).unwrap_or(&path).display().to_string()
        }
        None => String::new(),
    };
    let changes = catalog::diff::diff(&snapshot.catalog, &now);
    let drift = expected.as_ref().map(|e| catalog::diff::diff(e, &now)).unwrap_or_default();
    let threshold = req.lock_threshold_ms.unwrap_or(1_000) as f64;
    hazards::estimate_locks(&mut applied.statements, &scale, &golden_rows);
    let verdict = hazards::assess(&hazards::Evidence {
        statements: &applied.statements,
        failure: applied.failure.as_ref(),
        assertions: &assertions,
        drift: &drift,
        rows_before: &golden_rows,
        before: &snapshot.catalog,
        after: &now,
        scale: &scale,
        max_lock_ms: threshold,
        sql: candidate.sql.as_deref(),
    });
    let mut found = verdict.hazards;
    found.extend(code::hazard(candidate, &snapshot.catalog));
    let plans_after = app::plan_all(engine, sb, &req.app_queries).await?;
    let (queries, plan_hazards) = app::compare(&req.app_queries, plans_before, plans_after);
    found.extend(plan_hazards);
    for index in invalid_indexes(&admin).await?.difference(&invalid_before) {
        let mut h = report::Hazard::new(
            "invalid_index",
            report::Severity::High,
            format!("a failed CREATE INDEX CONCURRENTLY left index {index} behind INVALID: it slows every write and serves no read"),
            applied.failure.as_ref().map(|f| f.line),
        );
        h.suggestion = Some(format!("DROP INDEX CONCURRENTLY {index}, fix the cause, and build it again"));
        found.push(h);
    }
    // The server's own counters, read once the session is gone, against the sum
    // of what the measurements saw: anything more ran out of their sight.
    for (table, [inserted, updated, deleted]) in &unmeasured {
        found.push(report::Hazard::new(
            "unmeasured_changes",
            report::Severity::Critical,
            format!(
                "{table}: {inserted} rows inserted, {updated} updated and {deleted} deleted that no statement's measurement saw (work done at commit, or out of sight)"
            ),
            None,
        ));
    }
    // The measurements follow each statement; whatever else removed rows (work
    // at commit that escaped them, say) still shows in the final counts.
    let counted = catalog::count_rows(
        &dir,
        sb.pid.unwrap_or_default(),
        &now,
        FINAL_COUNT_PER_TABLE,
        FINAL_COUNT_BUDGET,
    )
    .await;
    for (table, tracked) in &applied.rows {
        let golden_exact = snapshot.rows.get(table).is_some_and(|r| r.exact);
        let Some(last) = counted.get(table).filter(|c| c.exact && golden_exact) else { continue };
        if last.rows < *tracked {
            found.push(report::Hazard::new(
                "rows_deleted",
                report::Severity::High,
                format!(
                    "{} rows of {table} are gone that no statement's measurement shows (work done at commit, by a trigger, or out of sight)",
                    tracked - last.rows
                ),
                None,
            ));
        }
    }
    found.sort_by_key(|h| std::cmp::Reverse(h.severity));
    // Objects named like PostgreSQL's own can take the place of a built-in in
    // other sessions (an overload that matches better, a search path with the
    // schema first): a candidate that makes one fails, whatever else it did.
    let planted: Vec<_> = catalog::planted::read(admin.client())
        .await?
        .into_iter()
        .filter(|p| !planted_before.contains(p))
        .collect();
    if !planted.is_empty() {
        found.insert(
            0,
            report::Hazard::new(
                "shadows_catalog",
                report::Severity::Critical,
                format!(
                    "the migration makes objects or settings named like PostgreSQL's own, which can stand in for the built-in in other sessions: {}",
                    catalog::planted::list(&planted, 10)
                ),
                None,
            ),
        );
    }
    if let Some(e) = exec.as_ref().filter(|e| e.exit_code != Some(0)) {
        found.insert(0, report::Hazard::new("failed", report::Severity::Critical, command::failure(e), None));
    }
    Ok(CandidateReport {
        name: candidate.name.clone(),
        sha256: candidate.sha256(),
        kind: if candidate.sql.is_some() { "sql" } else { "exec" }.into(),
        passed: found.is_empty(),
        hazards: found,
        notes: verdict.notes,
        queries,
        workload,
        statements: applied.statements,
        failure: applied.failure,
        exec,
        assertions,
        changes,
        drift,
        sequences_set_back,
        sequences_advanced,
        changed_rows,
        row_record,
        parts,
        session: applied.session,
        duration_ms: applied.duration_ms,
    })
}

/// The golden's tables small enough to compare row by row (at most
/// [`verify::ROWS_COMPARED`] each, and a million rows in all).
fn compared_tables(snapshot: &Snapshot) -> std::collections::BTreeSet<String> {
    let mut total = 0;
    let mut out = std::collections::BTreeSet::new();
    for (table, rows) in &snapshot.rows {
        if rows.rows <= verify::ROWS_COMPARED && total + rows.rows <= 1_000_000 {
            total += rows.rows;
            out.insert(table.clone());
        }
    }
    out
}

/// Indexes left INVALID (a failed concurrent build), by name.
async fn invalid_indexes(admin: &Admin) -> Result<std::collections::BTreeSet<String>> {
    let rows = admin
        .client()
        .query(
            &format!(
                "SELECT pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname)
                   FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
                   JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                  WHERE NOT i.indisvalid AND {}",
                airlock_postgres::catalog::SYSTEM_SCHEMAS
            ),
            &[],
        )
        .await
        .map_err(|e| Error::postgres(airlock_postgres::admin::describe(&e)))?;
    rows.into_iter().map(|r| r.cell(0)).collect()
}

/// Runs each assertion as the agent role: it passes when it returns no rows, or
/// only rows whose first column is true.
async fn assert_all(engine: &Engine, sb: &Sandbox, queries: &[String]) -> Result<Vec<Assertion>> {
    let mut out = Vec::new();
    for sql in queries {
        let mut session = airlock_lifecycle::sandbox::session::connect(engine, sb).await?;
        let mut rows = TextRows::default();
        let ran = session.simple_query(sql, &mut rows).await;
        session.close().await;
        let (passed, detail) = match (ran, rows.error) {
            (Err(e), _) => (false, Some(format!("session failed: {e}"))),
            (_, Some(e)) => (false, Some(format!("{} ({})", e.message, e.sqlstate))),
            (Ok(_), None) => {
                let bad = rows.rows.iter().find(|r| r.first().and_then(|v| v.as_deref()) != Some("t"));
                match bad {
                    None => (true, None),
                    Some(row) => {
                        let shown: Vec<&str> = row.iter().map(|v| v.as_deref().unwrap_or("NULL")).collect();
                        (false, Some(format!("returned ({})", shown.join(", "))))
                    }
                }
            }
        };
        out.push(Assertion { sql: sql.clone(), passed, detail });
    }
    Ok(out)
}
