//! Measuring one candidate on its fork: applying it while its locks, rows
//! and rewrites are read, then the counts, catalogs, assertions and row
//! images its report is made of.

use super::overwrite::json_parts;
use airlock_core::dsn::DATABASE;
use airlock_core::error::{Error, Result};
use airlock_lifecycle::engine::Engine;
use airlock_lifecycle::sandbox::Sandbox;
use airlock_postgres::admin::Admin;
use airlock_postgres::catalog::{self, Snapshot};
use airlock_postgres::cell::Cell;
use airlock_postgres::wire::TextRows;
use report::{Assertion, CandidateReport, ExecOutcome};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::*;

/// Rows each table's counters show changed by the candidate's session beyond
/// what its statements' measurements add up to, per table: `[inserted,
/// updated, deleted]` beyond. Read once the session's server process is gone
/// (it hands its counters over as it exits).
pub(crate) async fn unmeasured_changes(
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
pub(crate) async fn activity_by_relid(admin: &Admin) -> Result<BTreeMap<i64, (String, [i64; 3])>> {
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

pub(crate) async fn measure(
    engine: &std::sync::Arc<Engine>,
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
    let began = second_fork::clock(&admin).await?;
    // Costs are measured on a fork nothing has run on yet, before the probe exists.
    let calibration = costs::calibration(costs, admin.client(), &golden_rows).await?;
    let scale = scale::Scale::new(&calibration, req.production_stats.as_ref());
    admin.execute(&probe::install_sql()).await?;
    let planted_before = catalog::planted::read(admin.client()).await?;
    let invalid_before = invalid_indexes(&admin).await?;
    let matviews_before = super::matviews::read(admin.client()).await?;
    let borrowed_before = super::sequence_owners::read(admin.client()).await?;
    let sequences_before = verify::sequences(admin.client()).await?;
    let left_before = verify::values_left(admin.client()).await?;
    let behaviours_before = super::calls::behaviours(admin.client(), &snapshot.catalog).await?;
    // Which rows it changes, and to what, for promote to compare with the
    // target's (a workload beside it writes none: its writes are planned).
    let compared = compared_tables(&snapshot);
    let shape = verify::golden_shape(&snapshot.catalog);
    let images_before =
        verify::row_images(admin.client(), verify::Reading::AsReader, &shape, &compared, None).await?;
    rows::keep_generation(&baseline.rows, &rows::set_of(&images_before))?;
    // The values of the columns it sets or retypes, to say which it
    // overwrote: row by row where a key pairs them, else by counts.
    // A partitioned table's rows are its partitions': read (or not) as many,
    // an overwrite through it told against them, and not again partition by
    // partition.
    let roots = super::overwrite::names::partition_roots(admin.client()).await?;
    let mut rows_with_roots = golden_rows.clone();
    for (leaf, root) in &roots {
        *rows_with_roots.entry(root.clone()).or_default() += golden_rows.get(leaf).copied().unwrap_or(0);
    }
    let countable: std::collections::BTreeSet<String> = rows_with_roots
        .iter()
        .filter(|(_, rows)| **rows <= verify::ROWS_READ_MOST)
        .map(|(table, _)| table.clone())
        .collect();
    let written_columns = match candidate.sql.as_deref().map(airlock_postgres::split::split) {
        Some(Ok(statements)) => super::overwrite::targets(&statements, &snapshot.catalog, &countable),
        _ => vec![],
    };
    let (written_columns, counted_columns) = super::overwrite::by_pairing(written_columns, &shape, &compared);
    let golden_key = |table: &str| shape.key(table).map(str::to_owned);
    let values_before =
        super::overwrite::read(admin.client(), &written_columns, &golden_key, &snapshot.catalog).await?;
    let counts_before =
        super::overwrite::counts::read(admin.client(), &counted_columns, &snapshot.catalog).await?;
    // Its JSON columns, also as their documents' parts: a key stripped from
    // every document leaves each unlike the others, yet its values are gone.
    let json_columns = json_parts::targets(&written_columns, &snapshot.catalog, &rows_with_roots);
    let parts_before = super::overwrite::read_bounded(
        admin.client(),
        &json_columns,
        &golden_key,
        &snapshot.catalog,
        (&|_| json_parts::ROWS_MOST, super::overwrite::Reading::Parts),
    )
    .await?;
    // Read again at the end under the names they have then.
    let written_ids =
        super::overwrite::names::ids(admin.client(), &[&written_columns, &counted_columns], &golden_key)
            .await?;
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
                    let watched = super::sampler::Watched {
                        dir: engine.layout.sandbox_instance(&sb.id),
                        postmaster: sb.pid.unwrap_or_default(),
                    };
                    let applied = apply::apply_sql(
                        &mut session,
                        &admin,
                        &watched,
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
    // Tables whose rows it updated though no statement names their columns:
    // their second fork is made while the reads below run.
    let unnamed = super::overwrite::unnamed::targets(
        &applied.statements,
        &[&written_columns, &counted_columns],
        &snapshot.catalog,
        &countable,
        &golden_rows,
    );
    let second =
        (!unnamed.whole.is_empty() || !unnamed.rest.is_empty()).then(|| second_fork::make(engine, req));
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
    let followed = super::overwrite::names::follow(admin.client(), &written_columns, &written_ids).await?;
    let key_now = followed.keys_now(&shape);
    // At most twice the golden's rows and a thousand more: past that the
    // rows the candidate made would be what the daemon holds, and the table
    // is compared by counts, its counts before taken from its values.
    let grown = |table: &str| {
        let golden = followed.golden_table(table).unwrap_or(table);
        rows_with_roots.get(golden).copied().unwrap_or(0) * 2 + 1_000
    };
    let values_after = super::overwrite::read_bounded(
        admin.client(),
        &followed.now,
        &key_now,
        &now,
        (&grown, super::overwrite::Reading::Shown),
    )
    .await?;
    let values_after = followed.values_back(values_after);
    let mut losses =
        super::overwrite::losses(&written_columns, &values_before, &values_after, &rows_with_roots);
    // A new type that cannot hold the old values is what lost them, though
    // rounding may also have made some rows alike: one loss, told so.
    let narrowed = super::overwrite::narrowed::losses(
        admin.client(),
        &written_columns,
        (&values_before, &values_after),
        (&snapshot.catalog, &now),
        &rows_with_roots,
    )
    .await;
    losses.retain(|l| !narrowed.iter().any(|n| (&n.table, &n.column) == (&l.table, &l.column)));
    losses.extend(narrowed);
    let (mut counted_columns, mut counts_before) = (counted_columns, counts_before);
    for t in written_columns.iter().filter(|t| !values_after.contains_key(&t.table)) {
        let Some(before) = values_before.get(&t.table) else { continue };
        counts_before.insert(t.table.clone(), super::overwrite::counts::of_values(before));
        counted_columns.push(t.clone());
    }
    let followed = super::overwrite::names::follow(admin.client(), &counted_columns, &written_ids).await?;
    let counts_after = super::overwrite::counts::read(admin.client(), &followed.now, &now).await?;
    let counts_after = followed.counts_back(counts_after);
    losses.extend(super::overwrite::counted_losses(
        &counted_columns,
        &counts_before,
        &counts_after,
        &rows_with_roots,
    ));
    let mut values_before = values_before;
    if let Some(second) = second {
        let window = second_fork::Window::now(&admin, &began).await?;
        let fork =
            second_fork::Reading { engine, first: sb, admin: &admin, shape: &shape, compared: &compared };
        let (before, found) = fork.unnamed_losses(second, unnamed, snapshot, &now, &window).await?;
        for (table, values) in before {
            match values_before.get_mut(&table) {
                Some(named) => named.merge(values),
                None => {
                    values_before.insert(table, values);
                }
            }
        }
        losses.extend(found);
    }
    super::overwrite::told_through_roots(&mut losses, &roots);
    super::overwrite::place_at_writes(&mut losses, &applied.statements);
    let followed = super::overwrite::names::follow(admin.client(), &json_columns, &written_ids).await?;
    let parts_after = super::overwrite::read_bounded(
        admin.client(),
        &followed.now,
        &followed.keys_now(&shape),
        &now,
        (&grown, super::overwrite::Reading::Parts),
    )
    .await?;
    let parts_after = followed.values_back(parts_after);
    let whole_losses: Vec<super::overwrite::Loss> =
        losses.iter().filter(|l| super::overwrite::enough(l.lost.lost, l.rows)).cloned().collect();
    let mut part_losses =
        json_parts::losses(&json_columns, &parts_before, &parts_after, &rows_with_roots, &whole_losses);
    json_parts::place(&mut part_losses, &applied.statements);
    let parts_kept = super::overwrite::read_wanted(
        admin.client(),
        &json_parts::keepers(&part_losses, &shape, &snapshot.catalog, &now),
        &now,
        true,
    )
    .await?;
    // Where it may have kept what it overwrote: read only for a loss, and
    // only as far as a loss needs.
    let keepers = super::overwrite::keepers(&losses, &shape, &snapshot.catalog, &now);
    let values_kept = super::overwrite::read_wanted(admin.client(), &keepers, &now, true).await?;
    let changes = catalog::diff::diff(&snapshot.catalog, &now);
    let drift = expected.as_ref().map(|e| catalog::diff::diff(e, &now)).unwrap_or_default();
    let threshold = req.lock_threshold_ms.unwrap_or(1_000) as f64;
    super::locks::drop_subsumed(&mut applied.statements);
    hazards::estimate_locks(&mut applied.statements, &scale, &golden_rows);
    let calls = super::calls::read(admin.client(), &snapshot.catalog, &now, &behaviours_before).await?;
    let views_same_rows =
        super::view_rows::same_rows(engine, sb, (&snapshot.catalog, &now), hazards::redefined).await?;
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
        calls: &calls,
        views_same_rows: &views_same_rows,
        roots: &roots,
    });
    let mut found = verdict.hazards;
    // Sequences it set back, and those it made: where either now gives
    // values its column holds.
    let mut moved: Vec<String> = sequences_set_back.iter().cloned().collect();
    moved.extend(sequences_after.keys().filter(|name| !sequences_before.contains_key(*name)).cloned());
    let behind = verify::behind(admin.client(), &moved).await?;
    found.extend(super::set_back::hazards(&behind, &applied.statements));
    let run_out = verify::run_out(&left_before, &verify::values_left(admin.client()).await?);
    found.extend(super::set_back::run_out(&run_out, &applied.statements));
    found.extend(code::hazard(candidate, &snapshot.catalog));
    let plans_after = app::plan_all(engine, sb, &req.app_queries).await?;
    let context = app::Context {
        rows: Some(&golden_rows),
        dropped_indexes: app::Context::dropped_by(&applied.statements),
    };
    let (queries, plan_hazards) = app::compare(&req.app_queries, plans_before, plans_after, &context);
    found.extend(plan_hazards);
    // A golden column the file set to another's old values keeps them too
    // (two columns swapped): the tables' own columns after are searched as
    // well as the places the file made.
    let (overwritten, kept) =
        super::overwrite::report(&losses, &values_before, &[&values_kept, &values_after], &shape);
    found.extend(overwritten);
    let mut notes = verdict.notes;
    notes.extend(kept);
    let (overwritten, kept) = json_parts::report(&part_losses, &parts_kept, &shape);
    found.extend(overwritten);
    notes.extend(kept);
    let matviews_after = super::matviews::read(admin.client()).await?;
    found.extend(super::matviews::keys_lost(&matviews_before, &matviews_after, &applied.statements));
    found.extend(super::matviews::left_empty(&matviews_before, &matviews_after, &applied.statements));
    found.extend(super::orphans::hazards(admin.client(), &snapshot.catalog, &applied.statements).await?);
    let borrowed_after = super::sequence_owners::read(admin.client()).await?;
    found.extend(super::sequence_owners::hazards(&borrowed_before, &borrowed_after, &applied.statements));
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
    // A statement that fails is measured by nothing (its transaction is
    // aborted), and what it wrote before failing is undone with it: after a
    // failure, rows beyond the measurements of a table the failing statement
    // names are most likely its own. Those of any other table are not: a
    // failure later in the file hides nothing done at a commit before it.
    for (table, [inserted, updated, deleted]) in &unmeasured {
        let counted = format!("{table}: {inserted} rows inserted, {updated} updated and {deleted} deleted that no statement's measurement saw");
        let named_by_failing = applied.failure.as_ref().filter(|f| {
            let short = airlock_postgres::catalog::short_name(table).trim_matches('"').to_ascii_lowercase();
            super::lines::names_word(&f.sql.to_ascii_lowercase(), &short)
        });
        match named_by_failing {
            None => found.push(report::Hazard::new(
                "unmeasured_changes",
                report::Severity::Critical,
                format!("{counted} (work done at commit, or out of sight)"),
                None,
            )),
            Some(f) => notes.push(report::Hazard::new(
                "unmeasured_changes",
                report::Severity::Low,
                format!("{counted}: most likely written by the statement that failed before it failed, and undone with it"),
                Some(f.line).filter(|l| *l > 0),
            )),
        }
    }
    // The measurements follow each statement; whatever else removed rows (work
    // at commit that escaped them, say) still shows in the final counts.
    let counted = catalog::count_rows(
        &dir,
        sb.pid.unwrap_or_default(),
        DATABASE,
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
    super::partitions::fold(&mut found, &roots, &golden_rows);
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
        notes,
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
        node: None,
    })
}

/// The golden's tables small enough to compare row by row (at most
/// [`verify::ROWS_COMPARED`] each, and a million rows in all).
pub(crate) fn compared_tables(snapshot: &Snapshot) -> std::collections::BTreeSet<String> {
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
pub(crate) async fn invalid_indexes(admin: &Admin) -> Result<std::collections::BTreeSet<String>> {
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
pub(crate) async fn assert_all(engine: &Engine, sb: &Sandbox, queries: &[String]) -> Result<Vec<Assertion>> {
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
