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
    /// The table sizes and per-row costs the estimates are made with.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub scale: super::scale::Scale,
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
    /// Worth knowing, but no reason to refuse it (`no_lock_timeout`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<Hazard>,
    /// The application's queries planned before and after it (`--app-queries`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<Object>)]
    pub queries: Vec<super::app::QueryPlan>,
    /// What a concurrent workload felt while it ran (`--workload`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Object)]
    pub workload: Option<super::app::WorkloadReport>,
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
    /// Its text (the first 2,000 characters).
    pub sql: String,
    /// Which transaction it ran in (statements of one transaction share it).
    #[serde(default)]
    pub txn: usize,
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
    /// Rows it read per table (scans and index fetches), from the server's counters.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub scanned: std::collections::BTreeMap<String, i64>,
    /// Indexes it built.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub indexes_built: Vec<IndexBuilt>,
    /// Constraints it checked against every existing row.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validated: Vec<Validated>,
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
    /// How long it would be held at production size (or the golden's, without
    /// production statistics), from the rows worked under it and the golden's
    /// per-row costs, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_ms: Option<f64>,
}

/// An index a statement built.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct IndexBuilt {
    /// `schema.name` of the index.
    pub index: String,
    /// The table it indexes.
    pub table: String,
    /// Whether it was built `CONCURRENTLY` (writes go on meanwhile).
    pub concurrently: bool,
    /// Whether it ended valid.
    pub valid: bool,
}

/// A constraint checked against every row of its table.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Validated {
    /// `foreign key`, `check` or `not null`.
    pub kind: String,
    /// The constraint's name (the column's, for `not null`).
    pub name: String,
    /// The table whose rows were checked.
    pub table: String,
    /// For a foreign key, the table it references (also locked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub references: Option<String>,
    /// Whether it was validated (`VALIDATE CONSTRAINT`) while the transaction
    /// held a write-blocking lock on the table from an earlier statement.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub under_lock: bool,
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
    /// A safer way to the same result, where there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suggestion: Option<String>,
    /// Estimated time at production size (or the golden's), milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_ms: Option<f64>,
}

impl Hazard {
    /// A hazard with no suggestion or estimate.
    pub fn new(kind: &str, severity: Severity, message: impl Into<String>, line: Option<usize>) -> Hazard {
        Hazard {
            kind: kind.into(),
            severity,
            message: message.into(),
            line,
            suggestion: None,
            estimated_ms: None,
        }
    }
}

/// Rows inserted, updated and deleted per table, summed over `statements`
/// (with `committed_only`, leaving out those a ROLLBACK undid).
pub fn rows_by_table(
    statements: &[StatementReport],
    committed_only: bool,
) -> std::collections::BTreeMap<&str, [i64; 3]> {
    let mut out: std::collections::BTreeMap<&str, [i64; 3]> = Default::default();
    for r in statements.iter().filter(|s| !(committed_only && s.rolled_back)).flat_map(|s| &s.rows) {
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
            "golden {}@{}: {} candidate(s); {}",
            self.golden,
            self.generation,
            self.candidates.len(),
            self.scale.describe()
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
            for h in c.hazards.iter().chain(&c.notes) {
                let line = h.line.map(|l| format!(" (line {l})")).unwrap_or_default();
                let estimate = h
                    .estimated_ms
                    .map(|ms| format!(" [est. {}]", super::hazards::human_ms(ms)))
                    .unwrap_or_default();
                let label = if h.severity == Severity::Low {
                    "note".to_owned()
                } else {
                    h.severity.as_str().to_owned()
                };
                out.push(format!("  [{label}] {}: {}{line}{estimate}", h.kind, h.message));
                if let Some(s) = &h.suggestion {
                    out.push(format!("      safer: {s}"));
                }
            }
            for s in &c.statements {
                let at = if s.line == 0 { "command  ".to_owned() } else { format!("line {:>4}", s.line) };
                out.push(format!(
                    "  {at}  {:>9.1} ms  {}{}",
                    s.duration_ms,
                    s.tag.as_deref().unwrap_or("-"),
                    if s.rolled_back { " (rolled back)" } else { "" }
                ));
                out.extend(wrap(&s.sql, 90).into_iter().map(|l| format!("             {l}")));
                for l in s.locks.iter().filter(|l| l.blocking && l.kind == "table") {
                    let estimate = l
                        .estimated_ms
                        .map(|ms| format!(", est. {}", super::hazards::human_ms(ms)))
                        .unwrap_or_default();
                    out.push(format!(
                        "             lock {} on {} held {:.1} ms{estimate}",
                        l.mode, l.relation, l.held_ms
                    ));
                }
                for r in &s.rewrites {
                    out.push(format!("             rewrote {} ({} rows): {}", r.table, r.rows, r.reason));
                }
                for b in &s.indexes_built {
                    out.push(format!(
                        "             built index {} on {}{}{}",
                        b.index,
                        b.table,
                        if b.concurrently { " concurrently" } else { "" },
                        if b.valid { "" } else { " (INVALID)" }
                    ));
                }
                for v in &s.validated {
                    out.push(format!(
                        "             checked {} {} on every row of {}",
                        v.kind, v.name, v.table
                    ));
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
                let how = match e.exit_code {
                    Some(code) => format!("exited {code}"),
                    None => "was killed".to_owned(),
                };
                out.push(format!("  command {how}{}", if e.timed_out { " (timed out)" } else { "" }));
            }
            for a in &c.assertions {
                out.push(format!(
                    "  assert {}: {}{}",
                    if a.passed { "ok" } else { "FAILED" },
                    cut(&a.sql, 80),
                    a.detail.as_deref().map(|d| format!(" -> {d}")).unwrap_or_default()
                ));
            }
            if !c.queries.is_empty() {
                let changed =
                    c.queries.iter().filter(|q| q.before != q.after || q.error_after.is_some()).count();
                out.push(format!(
                    "  application queries: {} planned, {changed} planned differently after",
                    c.queries.len()
                ));
            }
            if let Some(w) = &c.workload {
                out.push(format!("  workload ({} sessions, {:.0} ms):", w.clients, w.duration_ms));
                out.extend(w.summary.iter().map(|s| format!("    {s}")));
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

    /// The report as Markdown, for a pull-request comment. Text from the
    /// candidates is escaped, and SQL sits in fences longer than any it holds.
    pub fn markdown(&self) -> String {
        let passed = self.candidates.iter().filter(|c| c.passed).count();
        let mut out = vec![
            format!(
                "## Airlock migration test: {passed} of {} passed on golden `{}@{}`",
                self.candidates.len(),
                md(&self.golden),
                self.generation
            ),
            String::new(),
            format!("_{}._", md(&self.scale.describe())),
            String::new(),
            "| candidate | verdict | hazards | time |".into(),
            "|---|---|---|---|".into(),
        ];
        for c in &self.candidates {
            let kinds: Vec<String> =
                c.hazards.iter().map(|h| format!("`{}` ({})", h.kind, h.severity.as_str())).collect();
            out.push(format!(
                "| {} | {} | {} | {:.0} ms |",
                md(&c.name),
                if c.passed { "✅ pass" } else { "❌ fail" },
                if kinds.is_empty() { "none".into() } else { kinds.join(", ") },
                c.duration_ms
            ));
        }
        for c in &self.candidates {
            out.push(String::new());
            out.push(format!("### {} {}", if c.passed { "✅" } else { "❌" }, md(&c.name)));
            out.push(String::new());
            for h in c.hazards.iter().chain(&c.notes) {
                let line = h.line.map(|l| format!(" (line {l})")).unwrap_or_default();
                let estimate = h
                    .estimated_ms
                    .map(|ms| format!(" — est. {}", super::hazards::human_ms(ms)))
                    .unwrap_or_default();
                let label = if h.severity == Severity::Low { "note" } else { h.severity.as_str() };
                out.push(format!("- **{label}** `{}`{line}: {}{estimate}", h.kind, md(&h.message)));
                if let Some(s) = &h.suggestion {
                    out.push(format!("  - safer: {}", md(s)));
                }
            }
            if c.hazards.is_empty() && c.notes.is_empty() {
                out.push("No hazards.".into());
            }
            if let Some(w) = &c.workload {
                out.push(String::new());
                out.push(format!("Workload ({} sessions): {}", w.clients, md(&w.summary.join("; "))));
            }
            if !c.statements.is_empty() {
                out.push(String::new());
                out.push("<details><summary>Statements</summary>".into());
                out.push(String::new());
                for s in &c.statements {
                    out.push(format!(
                        "- line {}: {} in {:.1} ms",
                        s.line,
                        md(s.tag.as_deref().unwrap_or("-")),
                        s.duration_ms
                    ));
                }
                let sql: Vec<&str> = c.statements.iter().map(|s| s.sql.as_str()).collect();
                let body = sql.join(";\n") + ";";
                let fence = "`".repeat(longest_run(&body, '`').max(2) + 1);
                out.push(String::new());
                out.push(format!("{fence}sql"));
                out.push(body);
                out.push(fence);
                out.push(String::new());
                out.push("</details>".into());
            }
        }
        out.join("\n") + "\n"
    }

    /// The report as SARIF 2.1.0, for code scanning: one result per hazard
    /// (and note), at the candidate file and line.
    pub fn sarif(&self) -> serde_json::Value {
        let mut rules: std::collections::BTreeMap<&str, &str> = Default::default();
        let mut results = Vec::new();
        for c in &self.candidates {
            for h in c.hazards.iter().chain(&c.notes) {
                rules.entry(h.kind.as_str()).or_insert(h.severity.as_str());
                let level = match h.severity {
                    Severity::Critical | Severity::High => "error",
                    Severity::Medium => "warning",
                    Severity::Low => "note",
                };
                let text = match &h.suggestion {
                    Some(s) => format!("{} Safer: {s}", h.message),
                    None => h.message.clone(),
                };
                results.push(serde_json::json!({
                    "ruleId": h.kind,
                    "level": level,
                    "message": {"text": text},
                    "locations": [{"physicalLocation": {
                        "artifactLocation": {"uri": c.name},
                        "region": {"startLine": h.line.unwrap_or(1).max(1)}
                    }}],
                    "partialFingerprints": {"candidateSha256": c.sha256},
                    "properties": {"severity": h.severity.as_str(), "estimatedMs": h.estimated_ms}
                }));
            }
        }
        let rules: Vec<serde_json::Value> = rules
            .into_iter()
            .map(|(id, severity)| {
                serde_json::json!({"id": id, "shortDescription": {"text": format!("migration hazard: {id}")},
                    "properties": {"severity": severity}})
            })
            .collect();
        serde_json::json!({
            "version": "2.1.0",
            "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
            "runs": [{
                "tool": {"driver": {"name": "airlock migrate test", "version": env!("CARGO_PKG_VERSION"),
                    "informationUri": "https://github.com/airlock/airlock/blob/main/docs/MIGRATIONS.md", "rules": rules}},
                "results": results,
                "properties": {"golden": self.golden, "generation": self.generation, "passed": self.passed}
            }]
        })
    }
}

/// Text escaped for Markdown: nothing in it can open a link, an image, code,
/// emphasis, a table cell or HTML.
fn md(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        match ch {
            '\\' | '`' | '*' | '_' | '[' | ']' | '<' | '>' | '|' | '!' | '#' | '~' | '&' => {
                out.push('\\');
                out.push(ch);
            }
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// The longest run of `ch` in `text`.
fn longest_run(text: &str, ch: char) -> usize {
    let (mut best, mut run) = (0, 0);
    for c in text.chars() {
        run = if c == ch { run + 1 } else { 0 };
        best = best.max(run);
    }
    best
}

/// A statement's lines, each wrapped at `width` characters (at a space where
/// there is one): the whole statement, never cut short.
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.trim().lines() {
        let mut rest: Vec<char> = line.trim_end().chars().collect();
        loop {
            if rest.len() <= width {
                out.push(rest.iter().collect());
                break;
            }
            let at = rest[..width].iter().rposition(|c| *c == ' ').filter(|i| *i > 0).unwrap_or(width);
            out.push(rest[..at].iter().collect());
            rest = rest[at..].iter().copied().skip_while(|c| *c == ' ').collect();
            if rest.is_empty() {
                break;
            }
        }
    }
    out
}

/// The first `max` characters of `text`, with an ellipsis when cut.
pub fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_statements_wrap_whole() {
        let sql = format!("UPDATE orders SET note = '{}'\nWHERE id > 10", "x ".repeat(80));
        let lines = wrap(&sql, 40);
        assert!(lines.iter().all(|l| l.chars().count() <= 40));
        assert_eq!(
            lines.join(" ").split_whitespace().collect::<Vec<_>>(),
            sql.split_whitespace().collect::<Vec<_>>()
        );
        assert_eq!(lines.last().map(String::as_str), Some("WHERE id > 10"));
    }

    #[test]
    fn markdown_escapes_what_a_candidate_names() {
        assert_eq!(md("[x](http://e) `a` | b"), "\\[x\\](http://e) \\`a\\` \\| b");
        assert_eq!(longest_run("a ``` b `", '`'), 3);
    }
}
