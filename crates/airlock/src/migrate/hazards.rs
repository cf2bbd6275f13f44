//! Turning measurements into hazards, ranked by severity, and candidates into a ranking.

use std::collections::BTreeMap;

use super::report::{Assertion, CandidateReport, Failure, Hazard, Severity, StatementReport};
use crate::catalog::diff::Change;

/// A table rewrite of at least this many rows is high severity, not medium.
const BIG_TABLE_ROWS: i64 = 100_000;

/// Everything a candidate did that a production database would feel, most severe first.
///
/// `rows_before` are the golden's rows per table; `rows_after` the tracked rows
/// at the end (a dropped table keeps its last count there).
pub fn assess(
    statements: &[StatementReport],
    failure: Option<&Failure>,
    assertions: &[Assertion],
    drift: &[Change],
    rows_before: &BTreeMap<String, i64>,
    rows_after: &BTreeMap<String, i64>,
    lock_threshold_ms: f64,
) -> Vec<Hazard> {
    let mut out = Vec::new();
    let mut add = |kind: &str, severity, message: String, line: Option<usize>| {
        out.push(Hazard { kind: kind.into(), severity, message, line });
    };
    if let Some(f) = failure {
        let on_data = matches!(&f.error.sqlstate[..2.min(f.error.sqlstate.len())], "22" | "23");
        let detail = f.error.detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default();
        if on_data {
            add(
                "fails_on_data",
                Severity::Critical,
                format!("fails on the golden's data: {}{detail}", f.error.message),
                Some(f.line),
            );
        } else {
            add("failed", Severity::Critical, format!("fails: {}{detail}", f.error.message), Some(f.line));
        }
    }
    for a in assertions.iter().filter(|a| !a.passed) {
        let detail = a.detail.as_deref().unwrap_or("");
        add("assertion_failed", Severity::High, format!("assertion failed: {} -> {detail}", a.sql), None);
    }
    if !drift.is_empty() {
        let first: Vec<String> = drift.iter().take(3).map(Change::line).collect();
        add(
            "schema_drift",
            Severity::High,
            format!(
                "the resulting schema differs from the expected one in {} places: {}",
                drift.len(),
                first.join("; ")
            ),
            None,
        );
    }
    let rows_of = |table: &str| rows_after.get(table).or(rows_before.get(table)).copied().unwrap_or(0);
    for s in statements.iter().filter(|s| !s.rolled_back) {
        let line = Some(s.line).filter(|l| *l > 0);
        for d in &s.dropped {
            match (d.object_type.as_str(), d.cascade) {
                (_, true) => add(
                    "cascade",
                    Severity::High,
                    format!("CASCADE also dropped {} {}", d.object_type, d.identity),
                    line,
                ),
                ("table", false) => {
                    let rows = rows_of(&d.identity);
                    if rows > 0 {
                        add(
                            "table_dropped",
                            Severity::Critical,
                            format!("drops table {} holding {rows} rows", d.identity),
                            line,
                        );
                    }
                }
                ("table column", false) => {
                    let table = d.identity.rsplit_once('.').map_or(d.identity.as_str(), |(t, _)| t);
                    let rows = rows_of(table);
                    if rows > 0 {
                        add(
                            "column_dropped",
                            Severity::High,
                            format!("drops column {} from a table with {rows} rows", d.identity),
                            line,
                        );
                    }
                }
                _ => {}
            }
        }
        for r in s.rows.iter().filter(|r| r.deleted > 0 && rows_before.contains_key(&r.table)) {
            let what = if r.truncated { "truncates" } else { "deletes" };
            add("rows_deleted", Severity::High, format!("{what} {} rows of {}", r.deleted, r.table), line);
        }
        for w in s.rewrites.iter().filter(|w| w.rows > 0) {
            let severity = if w.rows >= BIG_TABLE_ROWS { Severity::High } else { Severity::Medium };
            add(
                "table_rewrite",
                severity,
                format!("rewrites {} ({} rows) under ACCESS EXCLUSIVE: {}", w.table, w.rows, w.reason),
                line,
            );
        }
        for l in s.locks.iter().filter(|l| l.blocking && l.kind == "table" && l.held_ms > lock_threshold_ms) {
            if rows_of(&l.relation) == 0 {
                continue;
            }
            let severity = if l.mode == "ACCESS EXCLUSIVE" { Severity::High } else { Severity::Medium };
            let blocks = if l.mode == "ACCESS EXCLUSIVE" { "reads and writes" } else { "writes" };
            add(
                "long_lock",
                severity,
                format!("holds {} on {} for {:.0} ms, blocking its {blocks}", l.mode, l.relation, l.held_ms),
                line,
            );
        }
    }
    out.sort_by_key(|h| std::cmp::Reverse(h.severity));
    out
}

/// Candidate names from best to worst: passing ones by time, then failing ones by
/// their worst hazard, then by how many hazards they have.
pub fn rank(candidates: &[CandidateReport]) -> Vec<String> {
    let mut order: Vec<&CandidateReport> = candidates.iter().collect();
    order.sort_by(|a, b| {
        let worst = |c: &CandidateReport| c.hazards.first().map(|h| h.severity);
        (!a.passed, worst(a), a.hazards.len())
            .cmp(&(!b.passed, worst(b), b.hazards.len()))
            .then(a.duration_ms.total_cmp(&b.duration_ms))
    });
    order.into_iter().map(|c| c.name.clone()).collect()
}
