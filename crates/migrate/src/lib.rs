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

mod access;
pub mod agent;
pub mod app;
pub mod apply;
pub mod calls;
pub mod code;
pub mod command;
mod constraint_changes;
pub mod costs;
mod definitions;
mod domains;
mod evidence;
pub mod hazards;
pub mod html;
mod integrity;
mod keys_off;
mod lines;
mod lock_timeout;
pub mod locks;
mod matviews;
mod measure;
pub mod merge;
mod old_code;
mod orphans;
mod overwrite;
mod partitions;
pub mod parts;
mod policies;
pub mod probe;
pub mod promote;
mod reached;
pub mod render;
pub mod report;
mod request;
pub mod rows;
pub mod sampler;
pub mod scale;
pub mod schema;
pub mod seal;
mod second_fork;
mod sequence_owners;
mod set_back;
mod shadowed;
pub mod sizes;
mod stopped;
pub mod verify;
mod view_rows;

use std::sync::Arc;
use std::time::Duration;

use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::events::{DeleteReason, NewEvent};
use airlock_lifecycle::engine::Engine;
use airlock_lifecycle::sandbox::{self, Access, ForkRequest, Limits, Mode};
use airlock_postgres::catalog::{Catalog, Snapshot};
use report::{CandidateReport, Report};

use measure::*;
pub use request::*;

/// How long the final count of one table, and of all, may take.
const FINAL_COUNT_PER_TABLE: Duration = Duration::from_secs(10);
const FINAL_COUNT_BUDGET: Duration = Duration::from_secs(60);

fn invalid(message: impl Into<String>, hint: impl Into<String>) -> Error {
    Error::new(ErrorCode::InvalidRequest, message, hint)
}

/// Tests every candidate on its own fork; returns the report.
pub async fn test(engine: Arc<Engine>, req: TestRequest) -> Result<Report> {
    let began = std::time::Instant::now();
    check(&req)?;
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
    let node = airlock_core::events::NODE.get().cloned();
    let mut candidates: Vec<CandidateReport> = results.into_iter().flatten().collect();
    for c in &mut candidates {
        c.node = node.clone();
    }
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
        node,
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

/// What makes a request untestable wherever it runs: no candidate or too
/// many, a candidate that is not text or holds no statement, too many
/// queries, two expected schemas.
pub fn check(req: &TestRequest) -> Result<()> {
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
    Ok(())
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
        airlock_lifecycle::golden::build_generation(engine, &name, 1, &source, false, major, None, None)
            .await;
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

/// How long one statement of a candidate may run.
fn statement_timeout(req: &TestRequest) -> Duration {
    Duration::from_millis(req.statement_timeout_ms.unwrap_or(300_000).clamp(1_000, 3_600_000))
}

/// Forks, measures, verifies and judges one candidate; the fork is always deleted.
async fn test_one(
    engine: &Arc<Engine>,
    req: &TestRequest,
    candidate: &Candidate,
    baseline: &Baseline,
) -> Result<CandidateReport> {
    let timeout = statement_timeout(req);
    let (made, sb) = test_fork(engine, req).await?;
    airlock_core::crashpoint::reached("migrate.forked");
    let busy = engine.activity.open(&sb.id);
    let measured = {
        use futures_util::FutureExt;
        std::panic::AssertUnwindSafe(measure(engine, req, candidate, baseline, &sb, timeout))
            .catch_unwind()
            .await
    };
    drop(busy);
    let result = measured.unwrap_or_else(|panic| {
        let what = airlock_listen::serve::panic_message(&panic);
        tracing::error!(sandbox = %sb.id, panic = %what, "measuring a migration candidate panicked");
        Err(Error::internal(format!("measuring it failed unexpectedly ({what})")))
    });
    // Read before the fork (and its log) is deleted.
    let result = result.map_err(|e| out_of_disk(engine, &sb, e));
    made.delete().await;
    // A candidate that breaks the measuring (it changed role, say) fails on
    // its own; the others' reports stand.
    Ok(result.unwrap_or_else(|e| unmeasurable(candidate, &e)))
}

/// A fork of the test's golden for one candidate (or, made only when a
/// candidate's values must be read as they were before it ran, a second one
/// nothing runs on), deleted when the returned [`TestFork`] is.
async fn test_fork(engine: &Arc<Engine>, req: &TestRequest) -> Result<(TestFork, sandbox::Sandbox)> {
    let timeout = statement_timeout(req);
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
    forking.await.map_err(|e| Error::internal(format!("making a migration test's fork failed ({e})")))?
}

/// A failure of a fork whose server stopped on a full disk or allowance
/// (a write of the WAL that fails is a PANIC, so the session ends with no
/// error of its own) as `disk_full`, saying so; any other error as it is.
/// The log's lines are not shown: they name the host's paths.
fn out_of_disk(engine: &Engine, sb: &sandbox::Sandbox, e: Error) -> Error {
    if e.code != ErrorCode::PostgresFailed {
        return e;
    }
    let log = engine.layout.sandbox_instance(&sb.id).log();
    let tail = airlock_host::storage::tree::read_tail(&log, 16 << 10).unwrap_or_default();
    match stopped::on_full_disk(&tail) {
        Some(word) => Error::new(
            ErrorCode::DiskFull,
            format!(
                "the test's fork ran out of its disk quota ({word}) and its server stopped: {}",
                e.message
            ),
            "the candidate writes more than the fork may hold: test with a larger disk limit, or \
             on a sandbox's behalf, drop what the sandbox no longer needs first",
        ),
        None => e,
    }
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
        node: None,
    }
}
