//! Applying a candidate the way it would be applied, measuring each statement.
//!
//! SQL candidates run statement by statement on one session as the agent role,
//! as promote runs them (see [`super::parts`]): a file that runs whole runs in
//! one transaction, `BEGIN; statement; reading; ...; COMMIT`; in a file run in
//! parts, a statement outside the file's own `BEGIN ... COMMIT` commits on its
//! own, as under psql, in a transaction of its own so that the reading is
//! taken with its locks still held.
//! Statements that cannot run in a transaction block run alone while a second
//! session polls `pg_locks`. Command candidates run inside the sandbox's boundary
//! under the same polling, and are compared before and after.

use airlock_postgres::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::probe::{self, Lock, Reading};
use super::report::{
    Dropped, Failure, IndexBuilt, LockHeld, Rewrite, RewriteCause, RowsChanged, StatementReport, Validated,
};
use super::verify::DEFERRED_ROUNDS;
use airlock_core::error::{Error, Result};
use airlock_postgres::admin::Admin;
use airlock_postgres::split::{self, Kind, Statement};
use airlock_postgres::wire::{DbError, Session, TextRows};

/// Longest statement text kept in a report.
const SQL_IN_REPORT: usize = 2_000;

/// What applying a candidate measured.
#[derive(Debug, Default)]
pub struct Applied {
    /// Each statement (for a command: one entry standing for all it did).
    pub statements: Vec<StatementReport>,
    /// The failure that stopped it.
    pub failure: Option<Failure>,
    /// Rows per table afterwards (`schema.name`), as tracked from the golden's counts.
    pub rows: BTreeMap<String, i64>,
    /// Wall time, milliseconds.
    pub duration_ms: f64,
    /// The server process of the session the statements ran on (0 for a command).
    pub backend: i32,
    /// The name each relation is reported under (its first), by OID.
    pub names: BTreeMap<i64, String>,
    /// The session settings the statements were read and run with
    /// ([`SESSION_SETTINGS`]), for promote to run them with the same.
    pub session: BTreeMap<String, String>,
}

/// Settings that change what a statement means or does with the same text,
/// as the session has them: every setting anyone may set among PostgreSQL's
/// statement behaviour, locale and formatting, and compatibility settings
/// (how a date or time is read and shown, the text search configuration,
/// `transform_null_equals`, `array_nulls`...), with `search_path` as the
/// schemas it resolved to. Left out: the timeouts promote sets itself, the
/// client's encoding, where files go, vacuum's knobs, and the open
/// transaction's own (`transaction_isolation`...).
pub const SESSION_SETTINGS: &str = "SELECT pg_catalog.json_object_agg(name,
        CASE WHEN name = 'search_path' THEN
          (SELECT COALESCE(pg_catalog.string_agg(pg_catalog.quote_ident(s), ', ' ORDER BY o), '')
             FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, o))
        ELSE setting END)::text
   FROM pg_catalog.pg_settings
  WHERE context = 'user'
    AND category IN ('Client Connection Defaults / Statement Behavior',
                     'Client Connection Defaults / Locale and Formatting',
                     'Version and Platform Compatibility / Previous PostgreSQL Versions',
                     'Version and Platform Compatibility / Other Platforms and Clients')
    AND name NOT IN ('statement_timeout', 'lock_timeout', 'idle_in_transaction_session_timeout',
                     'idle_session_timeout', 'transaction_timeout', 'client_encoding',
                     'default_tablespace', 'temp_tablespaces', 'gin_pending_list_limit')
    AND name NOT LIKE 'vacuum%' AND name NOT LIKE 'transaction%'";

/// What is known about the database while a candidate runs.
struct Tracker {
    names: BTreeMap<i64, (String, String)>,
    filenodes: BTreeMap<i64, i64>,
    rows: BTreeMap<String, i64>,
    after_rewrite: i64,
    after_drop: i64,
    /// Locks taken in the open transaction: which statement took each, and when it started.
    txn_locks: BTreeMap<Lock, (usize, Instant)>,
    /// Row counters (inserted, updated, deleted, read) at the previous reading
    /// in the open transaction.
    txn_rows: BTreeMap<i64, [i64; 4]>,
    /// Statements in the open transaction.
    txn_statements: Vec<usize>,
    /// Transactions begun so far (the open one's number).
    txn: usize,
    /// Constraints known so far, and whether each was validated.
    constraints: BTreeMap<i64, bool>,
    /// The numbers of each table's NOT NULL columns and of all its columns, as last read.
    not_null: BTreeMap<i64, (Vec<i64>, Vec<i64>)>,
    /// The first name each relation was seen under: a table renamed, worked on
    /// and renamed back is still reported (and sized) as the table it is.
    first_names: BTreeMap<i64, String>,
    /// Savepoints in the open transaction: name, rows when it was set, and the
    /// statement that set it. The first, unnamed, is the transaction's start:
    /// a ROLLBACK goes back to it, as a ROLLBACK TO goes back to its own.
    savepoints: Vec<(String, BTreeMap<String, i64>, usize)>,
}

impl Tracker {
    fn new(rows: BTreeMap<String, i64>) -> Tracker {
        Tracker {
            names: BTreeMap::new(),
            filenodes: BTreeMap::new(),
            rows,
            after_rewrite: 0,
            after_drop: 0,
            txn_locks: BTreeMap::new(),
            txn_rows: BTreeMap::new(),
            txn_statements: Vec::new(),
            txn: 0,
            constraints: BTreeMap::new(),
            not_null: BTreeMap::new(),
            savepoints: Vec::new(),
            first_names: BTreeMap::new(),
        }
    }

    /// Takes in the relations a reading lists: names now, first names kept.
    fn see(&mut self, relations: &[probe::Relation]) {
        for rel in relations {
            self.names.insert(rel.relid, (rel.name.clone(), rel.kind.clone()));
            self.first_names.entry(rel.relid).or_insert_with(|| rel.name.clone());
        }
    }

    /// Follows `SAVEPOINT`, `RELEASE` and `ROLLBACK TO` (statement `index`,
    /// command tag `tag`): what a rollback to a savepoint undid never counts,
    /// and the statements it undid are marked rolled back.
    fn savepoint(&mut self, sql: &str, tag: &str, index: usize, reports: &mut [StatementReport]) {
        let last = sql.trim().trim_end_matches(';').split_whitespace().last().unwrap_or("");
        let name = match last.strip_prefix('"').and_then(|n| n.strip_suffix('"')) {
            Some(quoted) => quoted.replace("\"\"", "\""),
            None => last.to_lowercase(),
        };
        let at = self.savepoints.iter().rposition(|(n, _, _)| *n == name).filter(|_| !name.is_empty());
        match (tag, at) {
            ("SAVEPOINT", _) => self.savepoints.push((name, self.rows.clone(), index)),
            ("RELEASE", Some(at)) => self.savepoints.truncate(at),
            ("ROLLBACK", Some(at)) => {
                let (_, rows, set) = &self.savepoints[at];
                self.rows = rows.clone();
                for undone in reports.iter_mut().take(index).skip(set + 1) {
                    undone.rolled_back = true;
                }
                self.savepoints.truncate(at + 1);
            }
            _ => {}
        }
    }

    /// What is there before the candidate: relations, constraints, NOT NULL columns.
    fn know(&mut self, r: &Reading) {
        self.see(&r.relations);
        for rel in &r.relations {
            self.filenodes.insert(rel.relid, rel.filenode);
            self.not_null.insert(rel.relid, (rel.not_null.clone(), rel.columns.clone()));
        }
        self.constraints = r.constraints.iter().map(|c| (c.oid, c.validated)).collect();
    }

    /// A transaction begins: its row changes count only if it commits.
    fn begin_transaction(&mut self, index: usize) {
        self.txn += 1;
        self.savepoints = vec![(String::new(), self.rows.clone(), index)];
    }

    /// Takes in a reading made after statement `index` (started at `started`,
    /// ended with `tag`), adding what it did to `report`.
    fn absorb(
        &mut self,
        r: Reading,
        index: usize,
        started: Instant,
        tag: &str,
        report: &mut StatementReport,
    ) {
        let table_name = |t: &Tracker, relid: i64| t.names.contains_key(&relid).then(|| t.name(relid));
        for rel in r.relations.iter().filter(|rel| rel.kind == "i" && !self.names.contains_key(&rel.relid)) {
            let Some(table) = rel.table.and_then(|t| table_name(self, t)) else { continue };
            // An index a rewrite of its table made again under its own name
            // (a type change rebuilds the indexes on the column) is part of
            // the rewrite, under its lock: not a build of its own.
            let rewritten = r.probe.rewrites.iter().any(|w| Some(w.relid) == rel.table);
            if rewritten && self.names.values().any(|(name, kind)| kind == "i" && *name == rel.name) {
                continue;
            }
            // One made again on the storage of an index it replaces (a type
            // change that needs no rebuild, `varchar` to `text`, keeps the
            // index's files under a new OID) built nothing.
            if self.filenodes.iter().any(|(relid, f)| *f == rel.filenode && *relid != rel.relid) {
                continue;
            }
            report.indexes_built.push(IndexBuilt {
                index: rel.name.clone(),
                table,
                concurrently: report.transaction == "none",
                valid: rel.valid.unwrap_or(true),
            });
        }
        for c in &r.constraints {
            let before = self.constraints.insert(c.oid, c.validated);
            let Some(table) = table_name(self, c.relid) else { continue };
            // VALIDATE CONSTRAINT itself lets writes go on, unless the same
            // transaction already holds a lock that stops them.
            let under_lock = before == Some(false)
                && c.validated
                && self.txn_locks.keys().any(|l| l.relid == c.relid && probe::blocks_writes(&l.mode));
            // A check made in a statement that rewrites its table (a type
            // change makes the table's checks again) is checked row by row
            // by the rewrite itself: no scan of its own, and its lock is the
            // rewrite's.
            let rides_rewrite = c.kind != "f" && r.probe.rewrites.iter().any(|w| w.relid == c.relid);
            if ((before.is_none() && c.validated) || under_lock) && !rides_rewrite {
                report.validated.push(Validated {
                    kind: if c.kind == "f" { "foreign key" } else { "check" }.into(),
                    name: c.name.clone(),
                    table,
                    references: c.references.and_then(|t| table_name(self, t)),
                    under_lock,
                });
            }
        }
        self.see(&r.relations);
        for lock in r.locks {
            if self.names.contains_key(&lock.relid) {
                self.txn_locks.entry(lock).or_insert((index, started));
            }
        }
        let mut rewritten = BTreeSet::new();
        for w in &r.probe.rewrites {
            let table = match (self.names.contains_key(&w.relid), &w.relname) {
                (false, Some(name)) => name.clone(),
                _ => self.name(w.relid),
            };
            let rows = self.rows.get(&table).copied().unwrap_or(0);
            report.rewrites.push(Rewrite {
                table,
                reason: probe::rewrite_reason(w.reason, &report.sql),
                causes: RewriteCause::from_bits(w.reason),
                rows,
            });
            rewritten.insert(w.relid);
            self.after_rewrite = self.after_rewrite.max(w.id);
        }
        for rel in r.relations.iter().filter(|rel| rel.kind == "r" || rel.kind == "m") {
            let before = self.filenodes.insert(rel.relid, rel.filenode);
            if before.is_some_and(|f| f != rel.filenode) && !rewritten.contains(&rel.relid) {
                let name = self.name(rel.relid);
                let rows = self.rows.get(&name).copied().unwrap_or(0);
                rewritten.insert(rel.relid);
                if tag.starts_with("TRUNCATE") {
                    report.rows.push(RowsChanged {
                        table: name.clone(),
                        inserted: 0,
                        updated: 0,
                        deleted: rows,
                        truncated: true,
                    });
                    self.rows.insert(name, 0);
                } else {
                    let (cause, reason) = RewriteCause::from_tag(tag);
                    report.rewrites.push(Rewrite {
                        table: name,
                        reason: reason.into(),
                        causes: vec![cause],
                        rows,
                    });
                }
            }
        }
        // An index given new storage while its table kept its own (REINDEX)
        // was built again: under a lock that stops the table's writes, unless
        // it ran outside a transaction (REINDEX CONCURRENTLY builds new ones).
        for rel in r.relations.iter().filter(|rel| rel.kind == "i") {
            let before = self.filenodes.insert(rel.relid, rel.filenode);
            let table = rel.table.filter(|t| !rewritten.contains(t) && self.names.contains_key(t));
            if let (Some(before), Some(table)) = (before, table) {
                if before != rel.filenode && report.transaction != "none" {
                    report.indexes_built.push(IndexBuilt {
                        index: self.name(rel.relid),
                        table: self.name(table),
                        concurrently: false,
                        valid: rel.valid.unwrap_or(true),
                    });
                }
            }
        }
        // Only application tables: the probe's own log tables are not among them.
        for s in r.rows.into_iter().filter(|s| self.names.contains_key(&s.relid)) {
            let now = [s.ins, s.upd, s.del, s.scanned];
            let before = self.txn_rows.insert(s.relid, now).unwrap_or_default();
            // (A counter can read lower after DDL rebuilds the table's cache entry: never below nothing.)
            let [ins, upd, del, read] = std::array::from_fn(|i| (now[i] - before[i]).max(0));
            let table = self.name(s.relid);
            // A rewrite or an index build reads each row of its table once,
            // whatever the counters say (a rewrite's index builds read the
            // new heap again): its rows are counted as its own work.
            let rebuilt = report.rewrites.iter().any(|w| w.table == table)
                || report.indexes_built.iter().any(|b| b.table == table);
            let read = match self.rows.get(&table) {
                Some(rows) if rebuilt => read.min(*rows),
                _ => read,
            };
            if read > 0 {
                report.scanned.insert(table.clone(), read);
            }
            if ins == 0 && upd == 0 && del == 0 {
                continue;
            }
            *self.rows.entry(table.clone()).or_default() += ins - del;
            report.rows.push(RowsChanged {
                table,
                inserted: ins,
                updated: upd,
                deleted: del,
                truncated: false,
            });
        }
        // SET NOT NULL checks every row; a column added NOT NULL does not
        // (with a constant default it reads nothing, with a volatile one the
        // rewrite writes each row checked), so only a column that was there
        // before and became NOT NULL while its table was read counts.
        for rel in r.relations.iter().filter(|rel| rel.kind == "r" || rel.kind == "p") {
            let before = self.not_null.insert(rel.relid, (rel.not_null.clone(), rel.columns.clone()));
            let name = self.name(rel.relid);
            let read = report.scanned.get(&name).is_some_and(|n| *n > 0);
            let rewritten = report.rewrites.iter().any(|w| w.table == name);
            let Some((not_null, columns)) = before else { continue };
            // Columns there before that are NOT NULL now and were not.
            let became = rel.not_null.iter().filter(|n| columns.contains(n) && !not_null.contains(n)).count();
            if read && !rewritten && became > 0 {
                report.validated.push(Validated {
                    kind: "not null".into(),
                    name: format!("{became} more NOT NULL column(s)"),
                    table: name,
                    references: None,
                    under_lock: false,
                });
            }
        }
        // (A dropped schema's tables went by the CASCADE, each reported;
        // the rest it held, its sequences, functions and types, are its
        // parts.)
        // Whose parts went with them: what the statement named, and every
        // table that went (the partitions of a dropped partitioned table go
        // by an automatic dependency) with its defaults, constraints and
        // indexes.
        let (schemas, parts_of): (Vec<&probe::DropLog>, Vec<&probe::DropLog>) = r
            .probe
            .dropped
            .iter()
            .filter(|d| d.original || d.object_type == "table")
            .partition(|d| d.original && d.object_type == "schema");
        let identities = |logs: Vec<&probe::DropLog>| -> Vec<String> {
            logs.into_iter().filter_map(|d| d.identity.clone()).collect()
        };
        let (schemas, parts_of) = (identities(schemas), identities(parts_of));
        for d in r.probe.dropped {
            self.after_drop = self.after_drop.max(d.id);
            // What a CASCADE reached beyond the named object's own parts (a
            // dropped column's check, a table's defaults reach it by a normal
            // dependency too, but went with it whatever the statement said),
            // and every table that went with another (a partition).
            let table = d.object_type == "table";
            let own = !table
                && d.identity.as_deref().is_some_and(|i| own_part(i, &parts_of) || held_by(i, &schemas));
            let cascade = !d.original && (d.normal || table) && !own;
            // A view's own rewrite rule goes with the view; it says nothing more.
            let view_rule = d.object_type == "rule"
                && d.identity.as_deref().is_some_and(|i| i.starts_with("\"_RETURN\""));
            if (d.original || cascade) && !view_rule {
                let identity = self.dropped_identity(&d);
                report.dropped.push(Dropped { object_type: d.object_type, identity, cascade });
            }
        }
        self.txn_statements.push(index);
    }

    /// A dropped table, or a column of one, under the table's first name.
    fn dropped_identity(&self, d: &probe::DropLog) -> String {
        let identity = d.identity.clone().unwrap_or_default();
        let Some(relid) = d.relid.filter(|r| self.first_names.contains_key(r)) else { return identity };
        let first = self.name(relid);
        match (d.object_type.as_str(), self.names.get(&relid)) {
            ("table column", Some((now, _))) => match identity.strip_prefix(&format!("{now}.")) {
                Some(column) => format!("{first}.{column}"),
                None => identity,
            },
            ("table" | "view" | "materialized view", _) => first,
            _ => identity,
        }
    }

    /// The name a relation is reported under: the first it was seen with.
    fn name(&self, relid: i64) -> String {
        self.first_names.get(&relid).cloned().unwrap_or_else(|| format!("oid {relid}"))
    }

    /// Relations by OID with the names they are reported under, and their kinds.
    fn reported_names(&self) -> BTreeMap<i64, (String, String)> {
        self.names.iter().map(|(relid, (_, kind))| (*relid, (self.name(*relid), kind.clone()))).collect()
    }

    /// The open transaction ended at `at`: each lock was held until then.
    fn end_transaction(&mut self, at: Instant, reports: &mut [StatementReport], rolled_back: bool) {
        for (lock, (index, since)) in std::mem::take(&mut self.txn_locks) {
            let kind = self.names.get(&lock.relid).map(|(_, k)| k.clone()).unwrap_or_default();
            let relation = self.name(lock.relid);
            reports[index].locks.push(LockHeld {
                relation,
                kind: probe::relation_kind(&kind).to_owned(),
                blocking: probe::blocks_writes(&lock.mode),
                mode: probe::mode_name(&lock.mode),
                held_ms: ms(at.duration_since(since)),
                observed: false,
                estimated_ms: None,
            });
        }
        for index in std::mem::take(&mut self.txn_statements) {
            reports[index].rolled_back |= rolled_back;
        }
        self.txn_rows.clear();
        // What a rolled-back transaction changed is gone: its rows never count.
        let start = std::mem::take(&mut self.savepoints).into_iter().next();
        if let Some((_, rows, _)) = start.filter(|_| rolled_back) {
            self.rows = rows;
        }
    }
}

/// Whether a dropped object's identity places it in one of `schemas` (its
/// name, or a default's `for schema.table.column`).
fn held_by(identity: &str, schemas: &[String]) -> bool {
    schemas.iter().any(|schema| {
        let prefix = format!("{schema}.");
        identity.starts_with(&prefix) || identity.starts_with(&format!("for {prefix}"))
    })
}

/// Whether a dropped object belongs to one the statement named: a table's own
/// columns, constraints, defaults, triggers, rules, policies and row type (a
/// column named: its table's constraints and defaults).
fn own_part(identity: &str, originals: &[String]) -> bool {
    originals.iter().any(|o| {
        let o = o.as_str();
        let table = o.rsplit_once('.').filter(|_| o.matches('.').count() >= 2).map_or(o, |(t, _)| t);
        identity == o
            || identity.strip_suffix("[]") == Some(o)
            || identity.starts_with(&format!("{o}."))
            || identity.ends_with(&format!(" on {table}"))
            || identity.starts_with(&format!("for {table}."))
            || identity.ends_with(&format!(" on {o}"))
    })
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// One statement's text on the session; returns its result and wall time.
async fn run(session: &mut Session, sql: &str, limit: Duration) -> Result<(TextRows, Duration)> {
    let started = Instant::now();
    let mut out = TextRows::default();
    match tokio::time::timeout(limit, session.simple_query(sql, &mut out)).await {
        Ok(Ok(_)) => Ok((out, started.elapsed())),
        Ok(Err(e)) => Err(Error::postgres(format!("the candidate's session failed: {e}"))),
        Err(_) => {
            Err(Error::postgres("a statement outlived its statement timeout and did not answer a cancel"))
        }
    }
}

/// Parallel workers hand their row counts to the server, not to the
/// session's transaction, and how many rows each reads depends on the
/// machine's load: kept off in the candidate's session, set off again with
/// every reading (a statement of the candidate's may have turned them on), so
/// the counts the verdict rests on are the same on a busy or an idle machine.
const NO_PARALLEL_WORKERS: &str =
    "SET max_parallel_workers_per_gather = 0; SET max_parallel_maintenance_workers = 0";

async fn reading(session: &mut Session, t: &Tracker, limit: Duration) -> Result<Reading> {
    let sql = format!("{NO_PARALLEL_WORKERS}; {}", probe::reading_sql(t.after_rewrite, t.after_drop, false));
    let (out, _) = run(session, &sql, limit).await?;
    if let Some(e) = out.error {
        return Err(Error::postgres(format!("reading the measurements failed: {}", e.message)));
    }
    serde_json::from_str(out.value().unwrap_or("{}")).map_err(|e| Error::internal(format!("reading: {e}")))
}

/// The open transaction's row counters, as the baseline for its next statement.
/// (PostgreSQL keeps a session's counters until it flushes them, which happens
/// only between transactions, so deltas are taken within one transaction.)
async fn baseline_rows(session: &mut Session, t: &mut Tracker, limit: Duration) -> Result<()> {
    let (out, _) = run(session, &probe::transaction_rows_sql(), limit).await?;
    let rows: Vec<[i64; 5]> = serde_json::from_str(out.value().unwrap_or("[]")).unwrap_or_default();
    t.txn_rows =
        rows.into_iter().map(|[relid, ins, upd, del, read]| (relid, [ins, upd, del, read])).collect();
    Ok(())
}

/// The session's cumulative row counters per table, once its own are
/// flushed into them: `None` where the server cannot be asked to flush
/// (before PostgreSQL 15).
async fn flushed_rows(session: &mut Session, limit: Duration) -> Result<Option<BTreeMap<i64, [i64; 4]>>> {
    let (out, _) = run(session, &probe::flush_rows_sql(), limit).await?;
    if out.error.is_some() || out.value() != Some("t") {
        return Ok(None);
    }
    // (The flush happened as the session went idle after that statement.)
    let (out, _) = run(session, &probe::reading_sql(0, 0, true), limit).await?;
    let r: probe::Reading = match out.value().map(serde_json::from_str) {
        Some(Ok(r)) if out.error.is_none() => r,
        _ => return Ok(None),
    };
    Ok(Some(r.rows.into_iter().map(|s| (s.relid, [s.ins, s.upd, s.del, s.scanned])).collect()))
}

fn statement_report(st: &Statement, txn: usize, transaction: &str) -> StatementReport {
    StatementReport {
        line: st.line,
        sql: super::report::cut(&st.sql, SQL_IN_REPORT),
        txn,
        scanned: BTreeMap::new(),
        indexes_built: vec![],
        validated: vec![],
        tag: None,
        transaction: transaction.to_owned(),
        duration_ms: 0.0,
        locks: vec![],
        rewrites: vec![],
        rows: vec![],
        dropped: vec![],
        rolled_back: false,
    }
}

/// Puts a statement's tag and time into its report; returns PostgreSQL's error, if any.
fn outcome(report: &mut StatementReport, out: TextRows, took: Duration) -> Option<DbError> {
    report.tag = out.tags.last().cloned();
    report.duration_ms = ms(took);
    out.error
}

fn failure(st: &Statement, error: DbError) -> Failure {
    let line = match error.position {
        // PostgreSQL's position counts characters from the text's start,
        // leading comments included.
        Some(p) => {
            st.line - split::leading_lines(&st.sql)
                + st.sql.chars().take(p.saturating_sub(1) as usize).filter(|c| *c == '\n').count()
        }
        None => st.line,
    };
    Failure { line, sql: super::report::cut(&st.sql, SQL_IN_REPORT), error }
}

/// Applies SQL statements on `session` (the agent's), reading what it did
/// from `monitor`, and sampling the locks of statements that cannot run in a
/// transaction on the server `watched`.
pub async fn apply_sql(
    session: &mut Session,
    monitor: &Admin,
    watched: &super::sampler::Watched,
    statements: &[Statement],
    golden_rows: BTreeMap<String, i64>,
    statement_timeout: Duration,
    mut recorder: Option<&mut super::parts::Recorder>,
) -> Result<Applied> {
    let limit = statement_timeout + Duration::from_secs(10);
    let began = Instant::now();
    let mut t = Tracker::new(golden_rows);
    // As the golden's owner, as a migration runs as its target's owner: what
    // the file makes is then owned as the golden's objects are (a sequence
    // made OWNED BY one of their columns must share its table's owner). The
    // agent is a member of that role, so the file could take it itself; a
    // sandbox whose agent is not stays the agent.
    run(session, &format!("SET ROLE {}", airlock_core::dsn::OWNER_ROLE), limit).await?;
    let first = reading(session, &t, limit).await?;
    t.know(&first);
    let (pid_rows, _) = run(session, "SELECT pg_catalog.pg_backend_pid()", limit).await?;
    let pid: i32 = pid_rows.value().and_then(|v| v.parse().ok()).unwrap_or(0);
    let (settings, _) = run(session, SESSION_SETTINGS, limit).await?;
    let session_settings: BTreeMap<String, String> = settings
        .value()
        .and_then(|v| serde_json::from_str(v).ok())
        .ok_or_else(|| Error::postgres("the candidate's session did not say its settings"))?;
    let mut reports: Vec<StatementReport> = Vec::new();
    let mut explicit: Option<usize> = None; // the line of the file's open BEGIN
    let mut stopped: Option<Failure> = None;
    // A file that runs whole runs in one transaction, as promote runs it:
    // what one statement may do only once another has committed (use an enum
    // value added before it, alter a table with trigger events pending) fails
    // here as it would there, and every lock is held to the file's end.
    let whole = super::parts::whole(statements);
    let last = statements.len().saturating_sub(1);

    for (index, st) in statements.iter().enumerate() {
        // A part of a file run in parts may have ended with the last statement.
        if let Some(r) = recorder.as_deref_mut() {
            r.ran(monitor.client(), index, &reports).await?;
        }
        let kind = split::kind(&st.sql);
        let in_txn = explicit.is_some();
        // Whether this statement opens, and ends, a transaction of promote's.
        let opens = !in_txn && (!whole || index == 0);
        let closes = !in_txn && (!whole || index == last);
        if opens && kind != Kind::Commit && kind != Kind::Rollback {
            t.begin_transaction(index);
        }
        let mut report = statement_report(
            st,
            t.txn,
            match (kind, in_txn) {
                (Kind::NoTransaction, false) => "none",
                (_, true) | (Kind::Begin, _) => "explicit",
                _ => "implicit",
            },
        );
        reports.push(report.clone());
        let started = Instant::now();
        match kind {
            Kind::Begin | Kind::Commit | Kind::Rollback => {
                // What the file's COMMIT would set off (deferred constraints and
                // their triggers) runs first, inside the transaction, where it is
                // measured and charged to the COMMIT's line.
                if kind == Kind::Commit && in_txn {
                    if let Some(e) = run_deferred(session, limit).await? {
                        reports[index] = report;
                        stopped = Some(failure(st, e));
                        roll_back(session, &mut t, &mut reports, limit).await;
                        explicit = None;
                        break;
                    }
                    let r = reading(session, &t, limit).await?;
                    t.absorb(r, index, started, "COMMIT", &mut report);
                }
                let (out, took) = run(session, &st.sql, limit).await?;
                if let Some(e) = outcome(&mut report, out, took) {
                    reports[index] = report;
                    stopped = Some(failure(st, e));
                    break;
                }
                match kind {
                    Kind::Begin => {
                        explicit = Some(st.line);
                        baseline_rows(session, &mut t, limit).await?;
                    }
                    _ => {
                        reports[index] = report;
                        t.end_transaction(Instant::now(), &mut reports, kind == Kind::Rollback);
                        explicit = None;
                        // COMMIT AND CHAIN (or ROLLBACK AND CHAIN) begins the next
                        // transaction at once: what follows shares it, as under psql.
                        if in_txn && super::parts::chains(&st.sql) {
                            t.begin_transaction(index);
                            explicit = Some(st.line);
                            baseline_rows(session, &mut t, limit).await?;
                        }
                        continue;
                    }
                }
            }
            Kind::NoTransaction if !in_txn => {
                // Outside a transaction block its rows (a DO block's that
                // commits each batch) are told by the cumulative counters,
                // flushed before it and after it, where the server can.
                let cumulative = flushed_rows(session, limit).await?.map(|rows| t.txn_rows = rows).is_some();
                let sampler = super::sampler::Sampler::start(watched, pid).await?;
                let ran = run(session, &st.sql, limit).await;
                let observed = sampler.finish().await;
                let (out, took) = ran?;
                let failed = outcome(&mut report, out, took);
                let mut r = reading(session, &t, limit).await?;
                match flushed_rows(session, limit).await?.filter(|_| cumulative) {
                    Some(rows) => {
                        r.rows = rows
                            .into_iter()
                            .map(|(relid, [ins, upd, del, scanned])| probe::RowStats {
                                relid,
                                ins,
                                upd,
                                del,
                                scanned,
                            })
                            .collect()
                    }
                    // Counters outside a transaction are not this statement's.
                    None => r.rows.clear(),
                }
                let tag = report.tag.clone().unwrap_or_default();
                t.absorb(r, index, started, &tag, &mut report);
                t.txn_locks.clear();
                t.txn_statements.clear();
                report.locks = observed_locks(&observed, &t.reported_names());
                // What it committed before it failed is kept, and its own.
                if let Some(e) = failed {
                    reports[index] = report;
                    stopped = Some(failure(st, e));
                    break;
                }
            }
            _ => {
                if opens {
                    run(session, "BEGIN", limit).await?;
                    baseline_rows(session, &mut t, limit).await?;
                }
                let (out, took) = run(session, &st.sql, limit).await?;
                if let Some(e) = outcome(&mut report, out, took) {
                    reports[index] = report;
                    stopped = Some(failure(st, e));
                    roll_back(session, &mut t, &mut reports, limit).await;
                    explicit = None;
                    break;
                }
                // The statement that ends promote's transaction: what its
                // commit sets off belongs to it, and is measured with it.
                if closes {
                    if let Some(e) = run_deferred(session, limit).await? {
                        reports[index] = report;
                        stopped = Some(failure(st, e));
                        roll_back(session, &mut t, &mut reports, limit).await;
                        break;
                    }
                }
                let r = reading(session, &t, limit).await?;
                let tag = report.tag.clone().unwrap_or_default();
                t.absorb(r, index, started, &tag, &mut report);
                if !closes {
                    t.savepoint(&st.sql, &tag, index, &mut reports);
                }
                if closes {
                    let (out, _) = run(session, "COMMIT", limit).await?;
                    reports[index] = report;
                    if let Some(e) = out.error {
                        stopped = Some(failure(st, e));
                        break;
                    }
                    t.end_transaction(Instant::now(), &mut reports, false);
                    continue;
                }
            }
        }
        reports[index] = report;
    }
    if let (Some(r), None, None) = (recorder, &stopped, explicit) {
        r.ran(monitor.client(), statements.len(), &reports).await?;
    }
    if let Some(line) = explicit.filter(|_| stopped.is_none()) {
        roll_back(session, &mut t, &mut reports, limit).await;
        stopped = Some(Failure {
            line,
            sql: "BEGIN".into(),
            error: DbError {
                sqlstate: "25P01".into(),
                message: format!(
                    "the transaction begun at line {line} is never committed, so nothing in it would be kept"
                ),
                hint: Some("end the file's transaction with COMMIT".into()),
                ..Default::default()
            },
        });
    }
    Ok(Applied {
        statements: reports,
        failure: stopped,
        rows: t.rows,
        duration_ms: ms(began.elapsed()),
        backend: pid,
        names: t.first_names,
        session: session_settings,
    })
}

/// Polled locks on application relations, as reported.
pub fn observed_locks(seen: &super::sampler::Seen, names: &BTreeMap<i64, (String, String)>) -> Vec<LockHeld> {
    seen.iter()
        .filter_map(|(lock, (first, last))| {
            let (relation, kind) = names.get(&lock.relid)?;
            Some(LockHeld {
                relation: relation.clone(),
                kind: probe::relation_kind(kind).to_owned(),
                mode: probe::mode_name(&lock.mode),
                held_ms: ms(last.duration_since(*first) + super::sampler::POLL),
                blocking: probe::blocks_writes(&lock.mode),
                observed: true,
                estimated_ms: None,
            })
        })
        .collect()
}

/// Rolls back the open transaction after a failure, its statements marked so.
/// Ends the transaction a failure broke. Its statements are not marked
/// `rolled_back` (what the file's own ROLLBACK undid): once the failure is
/// fixed they would run and be kept, so what they do is still judged.
async fn roll_back(session: &mut Session, t: &mut Tracker, reports: &mut [StatementReport], limit: Duration) {
    let _ = run(session, "ROLLBACK", limit).await;
    t.txn_statements.clear();
    t.end_transaction(Instant::now(), reports, true);
}

/// Runs, inside the open transaction, the work its commit would set off:
/// deferred constraint checks and deferred constraint triggers fire now
/// (`SET CONSTRAINTS ALL IMMEDIATE` runs what was deferred at once, exactly as
/// the commit would), so the reading that follows sees their deletes, locks and
/// rewrites. A deferred trigger may defer more work (`SET CONSTRAINTS ALL
/// DEFERRED` and another row), so this repeats until a round changes no row:
/// no row changed means no event was queued, and the commit has nothing left to
/// run. Returns the error the commit would have raised, if any.
async fn run_deferred(session: &mut Session, limit: Duration) -> Result<Option<DbError>> {
    let mut changed = xact_row_changes(session, limit).await?;
    for _ in 0..DEFERRED_ROUNDS {
        let (out, _) = run(session, "SET CONSTRAINTS ALL IMMEDIATE", limit).await?;
        if out.error.is_some() {
            return Ok(out.error);
        }
        let now = xact_row_changes(session, limit).await?;
        if now == changed {
            return Ok(None);
        }
        changed = now;
    }
    Ok(Some(DbError {
        sqlstate: "54000".into(),
        message: format!(
            "work deferred to the commit kept deferring more work after {DEFERRED_ROUNDS} rounds, so what the commit would do cannot be measured"
        ),
        hint: Some("do not defer constraint triggers that themselves defer more work".into()),
        ..Default::default()
    }))
}

/// Rows inserted, updated and deleted so far in the session's open transaction,
/// over every table. Summed here, not in SQL: an operator in the agent's
/// search path could stand in for `+`.
async fn xact_row_changes(session: &mut Session, limit: Duration) -> Result<i64> {
    let (out, _) =
        run(session, "SELECT n_tup_ins, n_tup_upd, n_tup_del FROM pg_catalog.pg_stat_xact_all_tables", limit)
            .await?;
    if let Some(e) = out.error {
        return Err(Error::postgres(format!("reading the transaction's row counts failed: {}", e.message)));
    }
    Ok(out.rows.iter().flatten().flatten().filter_map(|v| v.parse::<i64>().ok()).sum())
}

/// The admin session's reading of everything since the fork (for commands).
pub async fn admin_reading(monitor: &Admin) -> Result<Reading> {
    let row = monitor
        .client()
        .query_one(&probe::reading_sql(0, 0, true), &[])
        .await
        .map_err(|e| Error::postgres(format!("reading the measurements failed: {e}")))?;
    let text: String = row.cell(0)?;
    serde_json::from_str(&text).map_err(|e| Error::internal(format!("reading: {e}")))
}

/// Turns before-and-after readings around a command into one report entry.
pub fn command_report(
    before: &Reading,
    after: Reading,
    observed: &BTreeMap<Lock, (Instant, Instant)>,
    golden_rows: BTreeMap<String, i64>,
    took: Duration,
) -> (StatementReport, BTreeMap<String, i64>) {
    let mut t = Tracker::new(golden_rows);
    t.know(before);
    for s in &before.rows {
        t.txn_rows.insert(s.relid, [s.ins, s.upd, s.del, s.scanned]);
    }
    let command = Statement { sql: "(the command)".into(), line: 0 };
    let mut report = statement_report(&command, 1, "none");
    report.duration_ms = ms(took);
    let mut after = after;
    after.locks.clear();
    t.absorb(after, 0, Instant::now(), "", &mut report);
    report.locks = observed_locks(observed, &t.reported_names());
    // A command's index builds were concurrent unless a write-blocking lock was
    // seen on their table.
    for built in &mut report.indexes_built {
        built.concurrently = !report.locks.iter().any(|l| l.blocking && l.relation == built.table);
    }
    (report, t.rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_errors_line_counts_characters_from_the_statements_own_text() {
        let file = "SELECT 1;\n-- ééé\nSELECT 'éé€€😀😀',\n nosuchcol FROM users;";
        let st = &split::split(file).unwrap()[1];
        assert_eq!(st.line, 3);
        let at = st.sql.chars().position(|c| c == 'n').unwrap() as u32 + 1;
        let error = DbError { position: Some(at), ..Default::default() };
        assert_eq!(failure(st, error).line, 4);
    }

    #[test]
    fn a_dropped_tables_own_parts_are_not_cascade() {
        let originals = ["public.orders".to_owned()];
        for own in [
            "public.orders.total",
            "orders_pkey on public.orders",
            "for public.orders.id",
            "public.orders[]",
            "trg on public.orders",
        ] {
            assert!(own_part(own, &originals), "{own}");
        }
        for other in
            ["public.order_totals", "order_items_order_id_fkey on public.order_items", "public.orders_view"]
        {
            assert!(!own_part(other, &originals), "{other}");
        }
        // A dropped column's own constraint is its table's part; a view on it is not.
        assert!(own_part("c_check on public.t", &["public.t.c".to_owned()]));
        assert!(!own_part("public.v", &["public.t.c".to_owned()]));
    }
}
