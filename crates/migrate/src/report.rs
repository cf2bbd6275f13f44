//! What `migrate test` reports: per candidate, per statement, and the verdict.

use serde::{Deserialize, Serialize};

use std::collections::{BTreeMap, BTreeSet};

use airlock_postgres::catalog::diff::Change;
use airlock_postgres::catalog::Catalog;
use airlock_postgres::wire::DbError;

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
    /// What the golden's import left out on purpose: promote does not call
    /// its presence on the target drift.
    #[serde(default)]
    pub left_out: airlock_lifecycle::golden::Exclusions,
    /// Whether every candidate passed.
    pub passed: bool,
    /// The best passing candidate, if any passed.
    #[serde(default)]
    pub best: Option<String>,
    /// Candidates from best to worst, by the rule of `hazards::rank`: passing
    /// first, then by their hazards' severities, the estimated time they block
    /// production, their notes and their names; never by a measured time.
    pub ranking: Vec<String>,
    /// Each candidate's result, in the order given.
    pub candidates: Vec<CandidateReport>,
    /// The table sizes and per-row costs the estimates are made with.
    #[serde(default)]
    pub scale: super::scale::Scale,
    /// The golden generation's rows, as the daemon keeps them for promote
    /// (`migration-rows/...`; see `airlock_migrate::rows`).
    #[serde(default)]
    pub rows: String,
    /// In a cluster: the node whose daemon sealed the report, where
    /// `migrate promote` runs (any node sends it there).
    #[serde(default)]
    pub node: Option<String>,
    /// The daemon's MAC over everything above: `migrate promote` reads no
    /// report whose seal does not match (see `airlock_migrate::seal`).
    #[serde(default)]
    pub seal: String,
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
    #[serde(default)]
    pub notes: Vec<Hazard>,
    /// The application's queries planned before and after it (`--app-queries`).
    #[serde(default)]
    #[schema(value_type = Vec<Object>)]
    pub queries: Vec<QueryPlan>,
    /// What a concurrent workload felt while it ran (`--workload`).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub workload: Option<WorkloadReport>,
    /// Each statement as applied (SQL candidates).
    pub statements: Vec<StatementReport>,
    /// The failure that stopped it, if one did.
    #[serde(default)]
    pub failure: Option<Failure>,
    /// What a command candidate printed and how it ended.
    #[serde(default)]
    pub exec: Option<ExecOutcome>,
    /// The assertion queries after it.
    pub assertions: Vec<Assertion>,
    /// Its resulting schema against the golden's.
    pub changes: Vec<Change>,
    /// Its resulting schema against the expected one; empty when it matches or none was given.
    pub drift: Vec<Change>,
    /// Sequences it set back (`setval`, `RESTART`): promote expects the same
    /// on the target, and no other.
    #[serde(default)]
    pub sequences_set_back: std::collections::BTreeSet<String>,
    /// How far it moved sequences forward: promote refuses one moved much
    /// further on the target.
    #[serde(default)]
    pub sequences_advanced: std::collections::BTreeMap<String, i64>,
    /// For each table of at most `verify::ROWS_COMPARED` rows that it
    /// touched: how many rows it changed. Which ones, and to what, are in its
    /// row record, which promote holds the target's rows to.
    #[serde(default)]
    pub changed_rows: std::collections::BTreeMap<String, usize>,
    /// Its row record in the daemon's data root (`migration-rows/...`), part
    /// by part (see `airlock_migrate::rows`); empty when none was kept.
    #[serde(default)]
    pub row_record: String,
    /// The session settings its statements ran with (time zone, date style,
    /// the schemas names resolved in...): promote runs them with the same.
    #[serde(default)]
    pub session: std::collections::BTreeMap<String, String>,
    /// For a file that runs in parts: what each part did, which promote
    /// holds that part to on the target.
    #[serde(default)]
    #[schema(value_type = Vec<Object>)]
    pub parts: Vec<PartRecord>,
    /// Time applying the candidate (statements and their measurements), milliseconds.
    pub duration_ms: f64,
    /// In a cluster: the node it ran on (a test's candidates are spread
    /// over the nodes that hold the golden).
    #[serde(default)]
    pub node: Option<String>,
}

/// One statement as applied.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StatementReport {
    /// The line it starts on.
    pub line: usize,
    /// Its text (the first 2,000 characters).
    pub sql: String,
    /// Which transaction it ran in (statements of one transaction share it).
    #[serde(default)]
    pub txn: usize,
    /// PostgreSQL's command tag.
    #[serde(default)]
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
    #[serde(default)]
    pub scanned: std::collections::BTreeMap<String, i64>,
    /// Indexes it built.
    #[serde(default)]
    pub indexes_built: Vec<IndexBuilt>,
    /// Constraints it checked against every existing row.
    #[serde(default)]
    pub validated: Vec<Validated>,
    /// Whether a later ROLLBACK undid it.
    #[serde(default)]
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
    #[serde(default)]
    pub observed: bool,
    /// How long it would be held at production size (or the golden's, without
    /// production statistics), from the rows worked under it and the golden's
    /// per-row costs, milliseconds.
    #[serde(default)]
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
    #[serde(default)]
    pub references: Option<String>,
    /// Whether it was validated (`VALIDATE CONSTRAINT`) while the transaction
    /// held a write-blocking lock on the table from an earlier statement.
    #[serde(default)]
    pub under_lock: bool,
}

/// A table rewritten.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Rewrite {
    /// `schema.name`.
    pub table: String,
    /// Why, in words, from PostgreSQL's `table_rewrite` event or the statement.
    pub reason: String,
    /// Why, as stable names: each has its own safer form, or none.
    #[serde(default)]
    pub causes: Vec<RewriteCause>,
    /// Rows it held.
    pub rows: i64,
}

impl StatementReport {
    /// The rows rewrite `w` of this statement wrote: the rows its table held,
    /// or for a materialized view's refresh (whose rows no table counter
    /// holds before), what the refresh inserted.
    pub fn rewritten_rows(&self, w: &Rewrite) -> i64 {
        match w.causes.contains(&RewriteCause::Refresh) {
            true => w.rows.max(self.rows.iter().filter(|r| r.table == w.table).map(|r| r.inserted).sum()),
            false => w.rows,
        }
    }
}

/// What made PostgreSQL write a table anew.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RewriteCause {
    /// A column added with a volatile default (or an identity, a stored generated column).
    VolatileDefault,
    /// A column's type changed in a way its stored values do not survive.
    TypeChange,
    /// `SET LOGGED` or `SET UNLOGGED`.
    Persistence,
    /// `SET ACCESS METHOD`.
    AccessMethod,
    /// `VACUUM FULL`.
    VacuumFull,
    /// `CLUSTER`.
    Cluster,
    /// `SET TABLESPACE`.
    Tablespace,
    /// `REFRESH MATERIALIZED VIEW` without `CONCURRENTLY`.
    Refresh,
    /// Something else replaced its storage.
    Other,
}

impl RewriteCause {
    /// The causes PostgreSQL's `table_rewrite` reason bits name.
    pub fn from_bits(bits: i32) -> Vec<RewriteCause> {
        let named = [
            (1, RewriteCause::Persistence),
            (2, RewriteCause::VolatileDefault),
            (4, RewriteCause::TypeChange),
            (8, RewriteCause::AccessMethod),
        ];
        let causes: Vec<RewriteCause> =
            named.iter().filter(|(bit, _)| bits & bit != 0).map(|(_, cause)| *cause).collect();
        if causes.is_empty() {
            vec![RewriteCause::Other]
        } else {
            causes
        }
    }

    /// What replaced a table's storage without a `table_rewrite` event,
    /// from the statement's command tag, and that in words.
    pub fn from_tag(tag: &str) -> (RewriteCause, &'static str) {
        match tag {
            "VACUUM" => (RewriteCause::VacuumFull, "VACUUM FULL wrote it anew"),
            "CLUSTER" => (RewriteCause::Cluster, "CLUSTER wrote it anew in an index's order"),
            "ALTER TABLE" => (RewriteCause::Tablespace, "its files were moved (SET TABLESPACE)"),
            "REFRESH MATERIALIZED VIEW" => {
                (RewriteCause::Refresh, "REFRESH MATERIALIZED VIEW replaced its rows")
            }
            "" => (RewriteCause::Other, "its storage was replaced (TRUNCATE, VACUUM FULL or CLUSTER)"),
            _ => (RewriteCause::Other, "its storage was rebuilt"),
        }
    }

    /// The safer way to the same end, where there is one: none is better
    /// than advice that does not fit.
    pub fn safer_form(self) -> Option<&'static str> {
        Some(match self {
            RewriteCause::VolatileDefault => "add the column without the volatile default (a constant one needs no rewrite), fill existing rows in batches, then SET DEFAULT for new rows",
            RewriteCause::TypeChange => "add a column of the new type, fill it in batches, switch the application over and drop the old one (some changes need no rewrite: varchar(n) to a longer varchar or to text, numeric to more precision)",
            RewriteCause::VacuumFull => "plain VACUUM makes the space reusable without blocking reads or writes; to give it back to the operating system with only brief locks, use pg_repack",
            RewriteCause::Cluster => "pg_repack --order-by writes the table in an index's order with only brief locks",
            RewriteCause::Tablespace => "pg_repack --tablespace moves the table with only brief locks",
            RewriteCause::Refresh => "REFRESH MATERIALIZED VIEW CONCURRENTLY lets reads go on (it needs a unique index on the view, and a view already populated)",
            RewriteCause::Persistence | RewriteCause::AccessMethod | RewriteCause::Other => return None,
        })
    }
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
    #[serde(default)]
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
    #[serde(default)]
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
    /// `column_dropped`, `cascade`, `rows_deleted`, `table_rewrite`, `long_lock`,
    /// `integrity_removed`, `key_index_dropped`, `durability` and the others
    /// docs/MIGRATIONS.md lists.
    pub kind: String,
    /// How bad it is.
    pub severity: Severity,
    /// What happened, in a sentence.
    pub message: String,
    /// The line of the statement that did it.
    #[serde(default)]
    pub line: Option<usize>,
    /// A safer way to the same result, where there is one.
    #[serde(default)]
    pub suggestion: Option<String>,
    /// Estimated time at production size (or the golden's), milliseconds.
    #[serde(default)]
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

/// The tables `statements` rewrote or truncated (not rolled back by the file).
pub fn rewritten(statements: &[StatementReport]) -> impl Iterator<Item = &str> {
    statements.iter().filter(|s| !s.rolled_back).flat_map(|s| s.rewrites.iter().map(|r| r.table.as_str()))
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

/// The first `max` characters of `text`, with an ellipsis when cut.
pub fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}

/// One application query, planned before and after the candidate.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct QueryPlan {
    /// The query (its first 300 characters).
    pub sql: String,
    /// The planner's total cost before.
    #[serde(default)]
    pub before: Option<f64>,
    /// And after.
    #[serde(default)]
    pub after: Option<f64>,
    /// How it reads its tables before (`Index Scan on orders`...).
    #[serde(default)]
    pub access_before: Vec<String>,
    /// And after.
    #[serde(default)]
    pub access_after: Vec<String>,
    /// PostgreSQL's error planning it before, if any.
    #[serde(default)]
    pub error_before: Option<String>,
    /// And after.
    #[serde(default)]
    pub error_after: Option<String>,
}

/// What the workload felt while the candidate ran.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WorkloadReport {
    /// Sessions it ran.
    pub clients: usize,
    /// How long it ran (the candidate's run), milliseconds.
    pub duration_ms: f64,
    /// Each query's latencies.
    pub queries: Vec<WorkloadQuery>,
    /// The waits worth knowing, in sentences ("reads of public.orders waited up to 2.3 s").
    pub summary: Vec<String>,
}

/// One workload query's latencies while the candidate ran.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WorkloadQuery {
    /// What it is: `read of public.orders`, or the query's text.
    pub label: String,
    /// `read` or `write`.
    pub kind: String,
    /// Times it ran.
    pub runs: usize,
    /// Median latency, milliseconds.
    pub p50_ms: f64,
    /// 95th percentile.
    pub p95_ms: f64,
    /// Longest (the longest it was blocked).
    pub max_ms: f64,
    /// Runs that failed (the first error is kept).
    pub errors: usize,
    /// The first error.
    #[serde(default)]
    pub error: Option<String>,
}

/// What one part of a file run in parts did in its test: what promote holds
/// that part to on the target.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PartRecord {
    /// Its first statement's index.
    pub from: usize,
    /// One past its last statement's index.
    pub to: usize,
    /// The catalog changes it made.
    #[schema(value_type = Vec<Object>)]
    pub changes: Vec<Change>,
    /// The sequences it set back.
    #[serde(default)]
    pub sequences_set_back: BTreeSet<String>,
    /// How far it moved sequences forward.
    #[serde(default)]
    pub sequences_advanced: BTreeMap<String, i64>,
    /// How many rows it changed, per table compared (which ones, and how,
    /// are in the test's row record: see [`super::rows`]).
    #[serde(default)]
    pub changed_rows: BTreeMap<String, usize>,
}

/// A duration for people: `850 ms`, `2.3 s`, `4.1 min`.
pub fn human_ms(ms: f64) -> String {
    if ms < 1_000.0 {
        format!("{ms:.0} ms")
    } else if ms < 10_000.0 {
        format!("{:.2} s", ms / 1e3)
    } else if ms < 60_000.0 {
        format!("{:.1} s", ms / 1e3)
    } else {
        format!("{:.1} min", ms / 60e3)
    }
}

/// A count of rows in words: `1 row`, `20000 rows`.
pub fn rows(n: i64) -> String {
    if n == 1 {
        "1 row".into()
    } else {
        format!("{n} rows")
    }
}
