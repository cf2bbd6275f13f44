//! What `migrate test` reports: per candidate, per statement, and the verdict.

use serde::{Deserialize, Serialize};

use crate::catalog::diff::Change;
use crate::catalog::Catalog;
use crate::pg::wire::DbError;

/// The whole report of one `migrate test` run.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Report {
    /// The golden the candidates ran on.
    pub golden: String,
    /// Its generation.
    pub generation: i64,
    /// That generation's schema, so `migrate promote` can check a target for drift.
    #[schema(value_type = Object)]
    pub golden_catalog: Catalog,
    /// Whether every candidate passed.
    pub passed: bool,
    /// The best passing candidate, if any passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best: Option<String>,
    /// Candidates from best to worst: passing ones by time, then failing ones by
    /// their worst hazard.
    pub ranking: Vec<String>,
    /// Each candidate's result, in the order given.
    pub candidates: Vec<CandidateReport>,
}

/// One candidate's result.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CandidateReport {
    /// Its name (the file name, or `exec-N`).
    pub name: String,
    /// SHA-256 of the file's bytes (or of the command), for `migrate promote`.
    pub sha256: String,
    /// `sql` or `exec`.
    pub kind: String,
    /// Whether it passed.
    pub passed: bool,
    /// What makes it risky, most severe first.
    pub hazards: Vec<Hazard>,
    /// Each statement as applied (SQL candidates).
    pub statements: Vec<StatementReport>,
    /// The failure that stopped it, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// What a command candidate printed and how it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecOutcome>,
    /// The assertion queries after it.
    pub assertions: Vec<Assertion>,
    /// Its resulting schema against the golden's.
    #[schema(value_type = Vec<Object>)]
    pub changes: Vec<Change>,
    /// Its resulting schema against the expected one; empty when it matches or none was given.
    #[schema(value_type = Vec<Object>)]
    pub drift: Vec<Change>,
    /// Time applying the candidate (statements and their measurements), milliseconds.
    pub duration_ms: f64,
}

/// One statement as applied.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StatementReport {
    /// The line it starts on.
    pub line: usize,
    /// Its text (the first 500 characters).
    pub sql: String,
    /// PostgreSQL's command tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// `implicit` (its own transaction), `explicit` (inside the file's BEGIN),
    /// or `none` (cannot run in a transaction, such as CREATE INDEX CONCURRENTLY).
    pub transaction: String,
    /// Wall time, milliseconds.
    pub duration_ms: f64,
    /// Relation locks it took, and how long each was held (to the commit).
    pub locks: Vec<LockHeld>,
    /// Tables it rewrote, and why.
    pub rewrites: Vec<Rewrite>,
    /// Rows it inserted, updated or deleted per table (cascades included).
    pub rows: Vec<RowsChanged>,
    /// Objects it dropped: the ones named, and what a CASCADE reached.
    pub dropped: Vec<Dropped>,
    /// Whether a later ROLLBACK undid it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rolled_back: bool,
}

/// A lock and how long it was held.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LockHeld {
    /// `schema.name`.
    pub relation: String,
    /// `table`, `index`, `materialized view` or `sequence`.
    #[serde(default)]
    pub kind: String,
    /// `ACCESS EXCLUSIVE` and so on.
    pub mode: String,
    /// From the statement's start to the commit (or end of statement), milliseconds.
    pub held_ms: f64,
    /// Whether it blocks other sessions' writes (and, for ACCESS EXCLUSIVE, reads).
    pub blocking: bool,
    /// Whether it was seen by polling (commands, statements outside a transaction)
    /// rather than read exactly.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub observed: bool,
}

/// A table rewritten.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Rewrite {
    /// `schema.name`.
    pub table: String,
    /// Why, from PostgreSQL's `table_rewrite` event (or `truncated`).
    pub reason: String,
    /// Rows it held.
    pub rows: i64,
}

/// Rows changed in one table.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RowsChanged {
    /// `schema.name`.
    pub table: String,
    /// Rows inserted.
    pub inserted: i64,
    /// Rows updated.
    pub updated: i64,
    /// Rows deleted (TRUNCATE included).
    pub deleted: i64,
    /// Whether it was truncated.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// An object dropped.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Dropped {
    /// `table`, `view`, `table column`, `index`...
    pub object_type: String,
    /// Its identity.
    pub identity: String,
    /// Whether a CASCADE reached it rather than the statement naming it.
    pub cascade: bool,
}

/// The failure that stopped a candidate.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Failure {
    /// The line of the statement (of the error, when PostgreSQL gave a position).
    pub line: usize,
    /// The statement.
    pub sql: String,
    /// PostgreSQL's error.
    pub error: DbError,
}

/// How a command candidate ended.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExecOutcome {
    /// Its exit code; absent when killed.
    pub exit_code: Option<i32>,
    /// Whether the timeout ended it.
    pub timed_out: bool,
    /// The last 4 KB of its standard output.
    pub stdout: String,
    /// The last 4 KB of its standard error.
    pub stderr: String,
}

/// One assertion query's result.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Assertion {
    /// The query.
    pub sql: String,
    /// Whether it returned true, or no rows.
    pub passed: bool,
    /// What it returned or the error, when it did not pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// How bad a hazard is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Worth knowing.
    Low,
    /// Slows or blocks production for a while.
    Medium,
    /// Loses data or blocks production for long.
    High,
    /// The migration does not work, or destroys data wholesale.
    Critical,
}

impl Severity {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Low => "low",
            Severity::Medium => "medium",
            Severity::High => "high",
            Severity::Critical => "critical",
        }
    }
}

/// Something a candidate did that could hurt a production database.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Hazard {
    /// A stable kind, named by `migrate promote --allow-hazard`: `failed`,
    /// `fails_on_data`, `assertion_failed`, `schema_drift`, `table_dropped`,
    /// `column_dropped`, `cascade`, `rows_deleted`, `table_rewrite`, `long_lock`.
    pub kind: String,
    /// How bad it is.
    pub severity: Severity,
    /// What happened, in a sentence.
    pub message: String,
    /// The line of the statement that did it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
}

/// Rows inserted, updated and deleted per table, summed over `statements`.
pub fn rows_by_table(statements: &[StatementReport]) -> std::collections::BTreeMap<&str, [i64; 3]> {
    let mut out: std::collections::BTreeMap<&str, [i64; 3]> = Default::default();
    for r in statements.iter().flat_map(|s| &s.rows) {
        let m = out.entry(r.table.as_str()).or_default();
        m[0] += r.inserted;
        m[1] += r.updated;
        m[2] += r.deleted;
    }
    out
}

impl Report {
    /// The report as text for a terminal.
    pub fn text(&self) -> String {
        let mut out = Vec::new();
        out.push(format!(
            "golden {}@{}: {} candidate(s)",
            self.golden,
            self.generation,
            self.candidates.len()
        ));
        for c in &self.candidates {
            out.push(String::new());
            out.push(format!(
                "{} {} ({}, {:.0} ms, sha256 {})",
                if c.passed { "PASS" } else { "FAIL" },
                c.name,
                c.kind,
                c.duration_ms,
                &c.sha256[..12]
            ));
            for h in &c.hazards {
                let line = h.line.map(|l| format!(" (line {l})")).unwrap_or_default();
                out.push(format!("  [{}] {}: {}{line}", h.severity.as_str(), h.kind, h.message));
            }
            for s in &c.statements {
                let first = s.sql.lines().find(|l| !l.trim().is_empty() && !l.trim_start().starts_with("--"));
                let first = first.unwrap_or("");
                let at = if s.line == 0 { "command  ".to_owned() } else { format!("line {:>4}", s.line) };
                out.push(format!(
                    "  {at}  {:>9.1} ms  {}{}",
                    s.duration_ms,
                    s.tag.as_deref().unwrap_or("-"),
                    if s.rolled_back { " (rolled back)" } else { "" }
                ));
                out.push(format!("             {}", cut(first, 90)));
                for l in s.locks.iter().filter(|l| l.blocking && l.kind == "table") {
                    out.push(format!(
                        "             lock {} on {} held {:.1} ms",
                        l.mode, l.relation, l.held_ms
                    ));
                }
                for r in &s.rewrites {
                    out.push(format!("             rewrote {} ({} rows): {}", r.table, r.rows, r.reason));
                }
                for r in &s.rows {
                    out.push(format!(
                        "             rows in {}: +{} ~{} -{}{}",
                        r.table,
                        r.inserted,
                        r.updated,
                        r.deleted,
                        if r.truncated { " (truncated)" } else { "" }
                    ));
                }
                for d in &s.dropped {
                    out.push(format!(
                        "             dropped {} {}{}",
                        d.object_type,
                        d.identity,
                        if d.cascade { " (by CASCADE)" } else { "" }
                    ));
                }
            }
            if let Some(f) = &c.failure {
                out.push(format!("  error at line {}: {} ({})", f.line, f.error.message, f.error.sqlstate));
                if let Some(d) = &f.error.detail {
                    out.push(format!("    detail: {d}"));
                }
            }
            if let Some(e) = &c.exec {
                out.push(format!(
                    "  command exited {:?}{}",
                    e.exit_code,
                    if e.timed_out { " (timed out)" } else { "" }
                ));
            }
            for a in &c.assertions {
                out.push(format!(
                    "  assert {}: {}{}",
                    if a.passed { "ok" } else { "FAILED" },
                    cut(&a.sql, 80),
                    a.detail.as_deref().map(|d| format!(" -> {d}")).unwrap_or_default()
                ));
            }
            if !c.changes.is_empty() {
                out.push("  schema changes against the golden:".into());
                out.extend(c.changes.iter().map(|ch| format!("    {}", ch.line())));
            }
            if !c.drift.is_empty() {
                out.push("  differences from the expected schema:".into());
                out.extend(c.drift.iter().map(|ch| format!("    {}", ch.line())));
            }
        }
        out.push(String::new());
        match &self.best {
            Some(best) => out.push(format!("best passing candidate: {best}")),
            None => out.push("no candidate passed".into()),
        }
        if self.candidates.len() > 1 {
            out.push(format!("ranking: {}", self.ranking.join(" > ")));
        }
        out.join("\n") + "\n"
    }
}

/// The first `max` characters of `text`, with an ellipsis when cut.
pub fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}
