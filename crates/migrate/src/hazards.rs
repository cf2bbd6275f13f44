//! Turning measurements into hazards, ranked by severity, and candidates into a ranking.
//!
//! Every hazard is decided by what is certain — what a statement did (rows
//! read, changed, rewritten or indexed, objects made or dropped), the lock
//! modes it took, and the tables' sizes — never by how long something took on
//! this machine: the same file on the same golden gets the same hazards on a
//! busy machine or an idle one. Durations appear only as estimates, made from
//! those counts and the golden's per-row costs (`scale`).

use std::collections::{BTreeMap, BTreeSet};

pub use super::evidence::{Evidence, Verdict};
use super::report::{
    human_ms, CandidateReport, Failure, Hazard, LockHeld, RewriteCause, Severity, StatementReport,
};
use super::scale::{Scale, Sizes, Work};
use airlock_postgres::catalog::diff::Change;
use airlock_postgres::catalog::Catalog;

/// A share of a table's rows beyond which an UPDATE or DELETE touches "most" of it.
const MOST: f64 = 0.5;
/// Tables smaller than this (rows, at production size) are not worth batching for.
const MASS_MIN_ROWS: i64 = 1_000;

/// The work each table saw in one statement, each row counted once for
/// what was done to it: an index build counts the golden's rows of its
/// table, a rewrite the rows it wrote (its reading of them is part of it),
/// and a TRUNCATE nothing per row (it swaps the table's files).
fn work<'a>(s: &'a StatementReport, golden: &BTreeMap<String, i64>) -> BTreeMap<&'a str, Work> {
    let mut out: BTreeMap<&str, Work> = BTreeMap::new();
    for (table, n) in &s.scanned {
        out.entry(table).or_default().scanned += n;
    }
    for r in s.rows.iter().filter(|r| !r.truncated) {
        out.entry(&r.table).or_default().changed += r.inserted + r.updated + r.deleted;
    }
    for w in &s.rewrites {
        out.entry(&w.table).or_default().rewritten += w.rows;
    }
    for b in s.indexes_built.iter().filter(|b| !b.concurrently) {
        out.entry(&b.table).or_default().indexed += golden.get(&b.table).copied().unwrap_or(0);
    }
    for v in s.validated.iter().filter(|v| v.kind == "foreign key") {
        out.entry(&v.table).or_default().joined += golden.get(&v.table).copied().unwrap_or(0);
    }
    for w in out.values_mut().filter(|w| w.rewritten > 0 || w.indexed > 0) {
        w.scanned = 0;
    }
    out
}

/// Fills in each blocking lock's estimated hold: the work done from the
/// statement that took it to the end of its transaction, at production size.
pub fn estimate_locks(statements: &mut [StatementReport], scale: &Scale, golden: &BTreeMap<String, i64>) {
    let per_statement: Vec<f64> = statements
        .iter()
        .map(|s| work(s, golden).iter().map(|(t, w)| scale.estimate_ms(t, w)).fold(0.0, |a, b| a + b))
        .collect();
    for i in 0..statements.len() {
        let txn = statements[i].txn;
        let until: f64 = statements[i..]
            .iter()
            .zip(&per_statement[i..])
            .take_while(|(s, _)| s.txn == txn)
            .fold(0.0, |a, (_, ms)| a + ms);
        for l in statements[i].locks.iter_mut().filter(|l| l.blocking && holds_rows(l)) {
            l.estimated_ms = Some(round(until));
        }
    }
}

/// Whether a lock keeps the application from rows: on a table, or on a
/// materialized view when its readers wait (no one but a refresh writes to
/// one, so a lock that stops only writes keeps no one waiting there).
pub(crate) fn holds_rows(l: &LockHeld) -> bool {
    l.kind == "table" || (l.kind == "materialized view" && super::locks::blocks_reads(&l.mode))
}

/// Everything a candidate did that a production database, or the application
/// running on it, would feel.
pub fn assess(e: &Evidence) -> Verdict {
    let mut v = Verdict::default();
    if let Some(f) = e.failure {
        let on_data = matches!(&f.error.sqlstate[..2.min(f.error.sqlstate.len())], "22" | "23");
        let detail = f.error.detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default();
        let (kind, what) =
            if on_data { ("fails_on_data", "fails on the golden's data") } else { ("failed", "fails") };
        v.hazards.push(Hazard::new(
            kind,
            Severity::Critical,
            format!("{what}: {}{detail}", f.error.message),
            Some(f.line),
        ));
        partial_commit(e, f, &mut v);
    }
    for a in e.assertions.iter().filter(|a| !a.passed) {
        let detail = a.detail.as_deref().unwrap_or("");
        v.hazards.push(Hazard::new(
            "assertion_failed",
            Severity::High,
            format!("assertion failed: {} -> {detail}", a.sql),
            None,
        ));
    }
    if !e.drift.is_empty() {
        let first: Vec<String> = e.drift.iter().take(3).map(Change::line).collect();
        v.hazards.push(Hazard::new(
            "schema_drift",
            Severity::High,
            format!(
                "the resulting schema differs from the expected one in {} places: {}",
                e.drift.len(),
                first.join("; ")
            ),
            None,
        ));
    }
    // Each statement's work per table, worked out once.
    let works: Vec<BTreeMap<&str, Work>> = e.statements.iter().map(|s| work(s, e.rows_before)).collect();
    mass_hazards(e, &works, &mut v);
    let mut blocking_tables = Vec::new();
    let mut locked = BTreeSet::new();
    for (i, s) in e.statements.iter().enumerate().filter(|(_, s)| !s.rolled_back) {
        drop_hazards(e, s, &mut v);
        statement_hazards(e, i, &works[i], &mut v);
        for l in s
            .locks
            .iter()
            .filter(|l| l.blocking && holds_rows(l) && (e.has_rows(&l.relation) || l.kind != "table"))
        {
            // (The file's own new tables wait for no one's queries.)
            if e.before.tables.contains_key(&l.relation) || e.before.views.contains_key(&l.relation) {
                blocking_tables.push((i, l.relation.as_str()));
            }
            if locked.insert((s.txn, l.relation.as_str())) {
                lock_hazard(e, i, l, &works, &mut v);
            }
        }
    }
    compatibility(e, &mut v);
    super::integrity::integrity_hazards(e, &mut v);
    super::keys_off::hazards(e, &mut v);
    super::access::access_hazards(e, &mut v);
    super::reached::reached_hazards(e, &mut v);
    v.notes.extend(super::shadowed::notes(e));
    if e.sql.is_some() {
        v.notes.extend(super::lock_timeout::note(&e.statements, &blocking_tables, e.roots));
    }
    v.hazards.sort_by_key(|h| std::cmp::Reverse(h.severity));
    v
}

/// Most of a table updated or deleted in one transaction.
fn mass_hazards(e: &Evidence, works: &[BTreeMap<&str, Work>], v: &mut Verdict) {
    let scale = e.scale;
    let mass = mass_changes(e, works);
    for ((_, table), m) in &mass {
        let at = Some(m.lines[0]).filter(|l| *l > 0);
        let lines: Vec<String> = m.lines.iter().map(|l| l.to_string()).collect();
        let within = if m.lines.len() > 1 {
            format!("in one transaction (lines {})", lines.join(", "))
        } else {
            "in one statement".to_owned()
        };
        let share = |n: i64| (n as f64 / e.golden_rows(table).max(1) as f64).min(1.0) * 100.0;
        if m.most_deleted {
            let rows = e.golden_rows(table);
            let deletes = match m.deleted > rows {
                false => format!("deletes {} of the {rows} rows of {table} ({:.0}%)", m.deleted, share(m.deleted)),
                true => format!("deletes {} rows of {table}, more than the {rows} it held (rows the file added count too)", m.deleted),
            };
            let mut h = Hazard::new(
                "mass_delete",
                Severity::High,
                format!("{deletes} {within} ({})", e.size_words(table)),
                at,
            );
            h.suggestion = Some("delete in batches (DELETE ... WHERE id IN (SELECT id ... LIMIT 10000)), each committed, so locks and WAL stay small, or make sure the data really should go".into());
            h.estimated_ms = Some(round(scale.estimate_ms(table, &m.work)));
            v.hazards.push(h);
        }
        if m.most_updated {
            // Statements of one transaction that update the same rows (or
            // rows the file added) make more row updates than the table
            // holds: said as such, never as more rows than there are.
            let rows = e.golden_rows(table);
            let updates = match m.updated > rows {
                false => format!("updates {} of the {rows} rows of {table} ({:.0}%)", m.updated, share(m.updated)),
                true => format!(
                    "makes {} row updates to the {rows} rows of {table} (rows updated more than once, or rows the file added, count again)",
                    m.updated
                ),
            };
            let mut h = Hazard::new(
                "mass_update",
                e.sized(table),
                format!(
                    "{updates} {within}: every row locked and rewritten before the commit ({})",
                    e.size_words(table)
                ),
                at,
            );
            h.suggestion = Some("update in batches of a few thousand rows, each committed, so row locks, WAL and bloat stay small".into());
            h.estimated_ms = Some(round(scale.estimate_ms(table, &m.work)));
            v.hazards.push(h);
        }
    }
}

/// Whether column `identity` (`schema.table.column`) of golden table
/// `table` is not the golden's, and a statement of the file adds a column
/// of that name (`ADD [COLUMN] [IF NOT EXISTS] name`). A golden column
/// renamed by the file and then dropped is still the golden's loss.
fn added_by_the_file(e: &Evidence, table: &str, identity: &str) -> bool {
    use super::code::lexer::{tokens, word, Token};
    let column = identity.rsplit_once('.').map_or(identity, |(_, c)| c).trim_matches('"');
    let golden = e.before.tables.get(table).is_some_and(|t| t.columns.iter().any(|c| c.name == column));
    let adds = |said: &[Token]| {
        said.iter().enumerate().any(|(i, t)| {
            if !word(Some(t), "add") {
                return false;
            }
            let mut at = i + 1;
            if word(said.get(at), "column") {
                at += 1;
            }
            if word(said.get(at), "if") && word(said.get(at + 1), "not") && word(said.get(at + 2), "exists") {
                at += 3;
            }
            matches!(said.get(at), Some(Token::Word(n) | Token::Quoted(n)) if n == column)
        })
    };
    !golden && e.statements.iter().any(|s| adds(&tokens(&s.sql)))
}

/// Tables, columns and what a CASCADE reached, dropped by one statement.
fn drop_hazards(e: &Evidence, s: &StatementReport, v: &mut Verdict) {
    let line = Some(s.line).filter(|l| *l > 0);
    for d in &s.dropped {
        // Rows lost are named as such, whether the statement named their
        // table or a CASCADE (of a schema, a type) reached it.
        let by = match d.cascade {
            false => "",
            true if super::lines::names_word(&s.sql.to_ascii_lowercase(), "cascade") => {
                " (reached by the CASCADE)"
            }
            true => " (a partition of the table dropped, which goes with it)",
        };
        let table_of_column = d.identity.rsplit_once('.').map_or(d.identity.as_str(), |(t, _)| t);
        match d.object_type.as_str() {
            "table" if e.has_rows(&d.identity) => v.hazards.push(Hazard::new(
                "table_dropped",
                Severity::Critical,
                format!(
                    "drops table {} holding {}{by}",
                    d.identity,
                    super::report::rows(e.golden_rows(&d.identity))
                ),
                line,
            )),
            // A column of a table this run made held nothing anyone kept;
            // nor did one the file added to a golden table (what it held is
            // told by what it was filled from).
            "table column" if added_by_the_file(e, table_of_column, &d.identity) => {}
            "table column" if e.has_rows(table_of_column) => v.hazards.push(Hazard::new(
                "column_dropped",
                Severity::High,
                format!(
                    "drops column {} from a table with {}{by}",
                    d.identity,
                    super::report::rows(e.golden_rows(table_of_column))
                ),
                line,
            )),
            // A table or view the file made itself held nothing the golden had.
            "table" | "view" | "materialized view"
                if !e.before.tables.contains_key(&d.identity)
                    && !e.before.views.contains_key(&d.identity) => {}
            _ if d.cascade => v.hazards.push(Hazard::new(
                "cascade",
                Severity::High,
                format!("CASCADE also dropped {} {}", d.object_type, d.identity),
                line,
            )),
            _ => {}
        }
    }
}

/// Rows deleted, rewrites, index builds and validations of one statement.
fn statement_hazards(e: &Evidence, i: usize, work: &BTreeMap<&str, Work>, v: &mut Verdict) {
    let s = &e.statements[i];
    let scale = e.scale;
    let line = Some(s.line).filter(|l| *l > 0);
    for r in s.rows.iter().filter(|r| r.deleted > 0 && e.rows_before.contains_key(&r.table)) {
        let message = if r.truncated {
            format!(
                "truncates {}: its {} rows are gone (its files are swapped for empty ones, so no row is deleted one by one)",
                r.table, r.deleted
            )
        } else {
            format!("deletes {} of {}", super::report::rows(r.deleted), r.table)
        };
        // A few rows picked out (test data, a duplicate) are not a table's worth.
        let many = super::overwrite::enough(r.deleted.max(0) as usize, e.golden_rows(&r.table));
        let severity = if many { Severity::High } else { Severity::Medium };
        let mut h = Hazard::new("rows_deleted", severity, message, line);
        // The statement's whole work on the table: the rows it read to find them too.
        let w = work.get(r.table.as_str()).copied().unwrap_or_default();
        h.estimated_ms = Some(round(scale.estimate_ms(&r.table, &w)));
        v.hazards.push(h);
    }
    for w in s.rewrites.iter() {
        // A materialized view's refresh writes what its query now returns,
        // and takes as long as that query and the writing: the statement's
        // whole work.
        let refresh = w.causes.contains(&RewriteCause::Refresh);
        let rows = s.rewritten_rows(w);
        if rows == 0 || !(refresh || e.rows_before.contains_key(&w.table)) {
            continue;
        }
        let mut h = Hazard::new(
            "table_rewrite",
            e.sized(&w.table),
            // Every rewrite holds ACCESS EXCLUSIVE (a VACUUM FULL's may be
            // too quick for the lock sampler to see).
            format!(
                "rewrites {} ({}) while its reads and writes wait: {}",
                w.table,
                if refresh && e.scale.size(&w.table).rows == 0 {
                    format!("{rows} rows written by the refresh")
                } else {
                    e.size_words(&w.table)
                },
                w.reason
            ),
            line,
        );
        h.estimated_ms = Some(round(if refresh {
            work.iter().map(|(t, w)| scale.estimate_ms(t, w)).sum()
        } else {
            scale.estimate_ms(&w.table, &Work { rewritten: rows, ..Default::default() })
        }));
        // Each cause's own safer form; none where there is none. PostgreSQL
        // gives an identity or a stored generated column the volatile
        // default's reason, and SET EXPRESSION the type change's: neither
        // form fits them.
        let sql = s.sql.to_ascii_lowercase();
        let unfit = |c: &RewriteCause| match c {
            RewriteCause::VolatileDefault => sql.contains("generated") || sql.contains("identity"),
            RewriteCause::TypeChange => sql.contains("set expression"),
            _ => false,
        };
        let mut forms: Vec<&str> =
            w.causes.iter().filter(|c| !unfit(c)).filter_map(|c| c.safer_form()).collect();
        forms.dedup();
        h.suggestion = (!forms.is_empty()).then(|| forms.join("; "));
        v.hazards.push(h);
    }
    // Indexes built under one statement's lock, per table (REINDEX TABLE builds them all).
    let mut built: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for b in s.indexes_built.iter().filter(|b| !b.concurrently && e.has_rows(&b.table)) {
        built.entry(b.table.as_str()).or_default().push(b.index.as_str());
    }
    for (table, mut indexes) in built {
        indexes.sort_unstable();
        let what = if indexes.len() == 1 { "index" } else { "indexes" };
        let mut h = Hazard::new(
            "blocking_index_build",
            e.sized(table),
            format!(
                "builds {what} {} on {table} ({}) while its {} wait, for the whole build",
                indexes.join(", "),
                e.size_words(table),
                // REINDEX holds ACCESS EXCLUSIVE on the index itself, which
                // every query planning on the table waits for.
                if s.tag.as_deref().is_some_and(|t| t.starts_with("REINDEX")) {
                    "reads and writes"
                } else {
                    super::locks::what_waits(e.statements, i, table)
                }
            ),
            line,
        );
        let rows = e.golden_rows(table) * indexes.len() as i64;
        h.estimated_ms = Some(round(scale.estimate_ms(table, &Work { indexed: rows, ..Default::default() })));
        h.suggestion = index_build_safer_form(e, s);
        v.hazards.push(h);
    }
    for c in s.validated.iter().filter(|c| e.has_rows(&c.table)) {
        let (what, suggestion) = match c.kind.as_str() {
            _ if c.under_lock => (
                format!(
                    "validates {} {} on every row of {} ({}) in the transaction that already locked the table against writes",
                    c.kind,
                    c.name,
                    c.table,
                    e.size_words(&c.table)
                ),
                "commit the NOT VALID constraint first; VALIDATE CONSTRAINT in a transaction of its own lets writes go on",
            ),
            "not null" => (
                format!(
                    "SET NOT NULL checks every row of {} ({}) while its {} wait",
                    c.table,
                    e.size_words(&c.table),
                    super::locks::what_waits(e.statements, i, &c.table)
                ),
                "add CHECK (col IS NOT NULL) NOT VALID, VALIDATE CONSTRAINT it in a later transaction, then SET NOT NULL (PostgreSQL 12+ uses the check and skips the scan)",
            ),
            kind => (
                format!(
                    "adds {kind} {} and checks every row of {} ({}) while its {} wait{}",
                    c.name,
                    c.table,
                    e.size_words(&c.table),
                    super::locks::what_waits(e.statements, i, &c.table),
                    c.references.as_deref().map(|r| format!(" (and writes to {r})")).unwrap_or_default()
                ),
                "add it NOT VALID (no scan, a brief lock), then ALTER TABLE ... VALIDATE CONSTRAINT in its own transaction (writes go on meanwhile)",
            ),
        };
        let mut h = Hazard::new("constraint_validation", e.sized(&c.table), what, line);
        let rows = e.golden_rows(&c.table);
        let work = match c.kind.as_str() {
            "foreign key" => Work { joined: rows, ..Default::default() },
            _ => Work { scanned: rows, ..Default::default() },
        };
        h.estimated_ms = Some(round(scale.estimate_ms(&c.table, &work)));
        // A foreign key added to a partitioned table is checked on each
        // partition; the parent itself refuses NOT VALID (before PostgreSQL 18).
        let parent = partitioned_named(e, s, "table").filter(|_| c.kind == "foreign key" && !c.under_lock);
        h.suggestion = Some(match parent {
            Some(parent) => format!(
                "for each partition of {parent}, add the foreign key NOT VALID, then VALIDATE CONSTRAINT it in its own transaction \
                 (writes go on meanwhile); the same key added to {parent} then adopts them without a scan \
                 (a partitioned table refuses NOT VALID foreign keys before PostgreSQL 18)"
            ),
            None => suggestion.into(),
        });
        v.hazards.push(h);
    }
    attach_scans(e, i, v);
    detached(e, s, v);
}

/// `DETACH PARTITION`: the partition's rows stay, but no longer read as
/// its parent's: every query of the parent loses them.
fn detached(e: &Evidence, s: &StatementReport, v: &mut Verdict) {
    let sql = s.sql.to_ascii_lowercase();
    if s.tag.as_deref() != Some("ALTER TABLE") {
        return;
    }
    let Some(at) = sql.find("detach partition") else { return };
    let name: String = sql[at + "detach partition".len()..]
        .trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || matches!(c, '_' | '.' | '"' | '$'))
        .filter(|c| *c != '"')
        .collect();
    // The table altered: after ALTER TABLE (past comments), IF EXISTS and ONLY.
    let mut rest = sql.find("alter table").map_or("", |at| &sql[at + "alter table".len()..]).trim_start();
    for word in ["if exists", "only"] {
        rest = rest.strip_prefix(word).unwrap_or(rest).trim_start();
    }
    let parent: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || matches!(c, '_' | '.' | '"' | '$'))
        .filter(|c| *c != '"')
        .collect();
    let Some(partition) = e
        .rows_before
        .keys()
        .find(|t| t.as_str() == name || airlock_postgres::catalog::split_qualified(t).1 == name)
    else {
        return;
    };
    let rows = e.golden_rows(partition);
    if rows == 0 {
        return;
    }
    let mut h = Hazard::new(
        "rows_deleted",
        Severity::High,
        format!(
            "detaches partition {partition} from {parent}: its {rows} rows stay in it, but no query of {parent} reads them any more"
        ),
        Some(s.line).filter(|l| *l > 0),
    );
    h.suggestion = Some(format!(
        "detach only a partition no query of {parent} needs any more, and say where its rows are read from now"
    ));
    v.hazards.push(h);
}

/// `ATTACH PARTITION` reads every row of the table it attaches (unless a
/// CHECK already proves the bounds), and it or `CREATE TABLE ... PARTITION
/// OF` reads every row of a DEFAULT partition (for rows that belong to the
/// new one, unless a CHECK of the DEFAULT partition already excludes them),
/// under their locks: a validation like a constraint's.
fn attach_scans(e: &Evidence, i: usize, v: &mut Verdict) {
    let s = &e.statements[i];
    let sql = crate::lines::without_comments(&s.sql);
    let has = |word: &str| crate::lines::names_word(&sql, word);
    let attach = s.tag.as_deref() == Some("ALTER TABLE") && has("attach") && has("partition");
    let create = s.tag.as_deref() == Some("CREATE TABLE") && sql.contains("partition of");
    if !attach && !create {
        return;
    }
    let line = Some(s.line).filter(|l| *l > 0);
    for (table, rows) in s.scanned.iter().filter(|(t, n)| **n > 0 && e.has_rows(t)) {
        // The table attached is the one the statement names; any other it
        // read is the DEFAULT partition.
        let (_, bare) = airlock_postgres::catalog::split_qualified(table);
        let attached = attach && (has(&bare.to_ascii_lowercase()) || has(&table.to_ascii_lowercase()));
        let waits = super::locks::what_waits(e.statements, i, table);
        let (message, suggestion) = match attached {
            true => (
                format!(
                    "attaching a partition checks every row of {table} ({}) against the partition's bounds while its {waits} wait",
                    e.size_words(table)
                ),
                "add a CHECK matching the partition's bounds to the table first (NOT VALID, then VALIDATE in its own transaction): ATTACH then skips its scan".to_owned(),
            ),
            false => (
                format!(
                    "{} checks every row of the DEFAULT partition {table} ({}) for rows that belong to the new partition while its {waits} wait",
                    if attach { "attaching a partition" } else { "making a partition" },
                    e.size_words(table)
                ),
                format!(
                    "add a CHECK to {table} that excludes the new partition's bounds first (NOT VALID, then VALIDATE in its own transaction): the scan of the DEFAULT partition is then skipped"
                ),
            ),
        };
        let mut h = Hazard::new("constraint_validation", e.sized(table), message, line);
        h.estimated_ms =
            Some(round(e.scale.estimate_ms(table, &Work { scanned: *rows, ..Default::default() })));
        h.suggestion = Some(suggestion);
        v.hazards.push(h);
    }
}

/// The safer form of what built indexes under a blocking lock, by what the
/// statement is; none where there is none (an exclusion constraint, a
/// column's type or collation changed, whose indexes are rebuilt).
fn index_build_safer_form(e: &Evidence, s: &StatementReport) -> Option<String> {
    let sql = s.sql.to_ascii_lowercase();
    let has = |word: &str| crate::lines::names_word(&sql, word);
    let form = match s.tag.as_deref().unwrap_or_default() {
        "REINDEX" => "REINDEX ... CONCURRENTLY, outside a transaction",
        "ALTER TABLE" if has("attach") && has("partition") => {
            "build the parent's indexes on the table first with CREATE INDEX CONCURRENTLY (ATTACH adopts a matching one), \
             and add a CHECK matching the partition's bounds (NOT VALID, then VALIDATE) so ATTACH skips its scan"
        }
        "ALTER TABLE" if has("exclude") => return None,
        "ALTER TABLE" if has("unique") || has("primary") => match partitioned_named(e, s, "table") {
            Some(parent) => {
                return Some(format!(
                    "for each partition of {parent}, CREATE UNIQUE INDEX CONCURRENTLY on it, then ALTER TABLE <the partition> ADD CONSTRAINT ... USING INDEX; \
                     the key added to {parent} then adopts them and builds nothing (a partitioned table refuses USING INDEX itself)"
                ))
            }
            None => "CREATE UNIQUE INDEX CONCURRENTLY first (outside a transaction), then ADD CONSTRAINT ... USING INDEX",
        },
        "ALTER TABLE" => return None,
        // A partitioned table's own index cannot be built CONCURRENTLY.
        "CREATE INDEX" => match partitioned_named(e, s, "on") {
            Some(parent) => {
                return Some(format!(
                    "CREATE INDEX ... ON ONLY {parent} (made at once, invalid until every partition has its own), \
                     then for each partition CREATE INDEX CONCURRENTLY on it and ALTER INDEX <the parent's index> ATTACH PARTITION <its index>: \
                     a partitioned table's own index cannot be built CONCURRENTLY"
                ))
            }
            None => "CREATE INDEX CONCURRENTLY, alone outside a transaction, with a check for an INVALID index should it fail",
        },
        _ => "CREATE INDEX CONCURRENTLY, alone outside a transaction, with a check for an INVALID index should it fail",
    };
    Some(form.to_owned())
}

/// The partitioned table (`schema.name`) statement `s` names after its
/// first `anchor` word (`on` for `CREATE INDEX`, `table` for `ALTER
/// TABLE`; `ONLY`, `IF EXISTS` passed over), if it is one, as a search path
/// finds it or qualified.
fn partitioned_named(e: &Evidence, s: &StatementReport, anchor: &str) -> Option<String> {
    let sql = crate::lines::without_comments(&s.sql);
    let words: Vec<&str> = sql.split(' ').collect();
    let at = words.iter().position(|w| *w == anchor)?;
    let named = words[at + 1..].iter().find(|w| !matches!(**w, "only" | "if" | "exists"))?.trim_matches('"');
    e.before
        .tables
        .iter()
        .find(|(name, t)| {
            t.kind == "partitioned table"
                && (name.as_str() == named || airlock_postgres::catalog::split_qualified(name).1 == named)
        })
        .map(|(name, _)| name.clone())
}

/// A write-blocking lock statement `i` took, judged by what the rest of its
/// transaction did while holding it, and by its estimate.
fn lock_hazard(e: &Evidence, i: usize, l: &LockHeld, works: &[BTreeMap<&str, Work>], v: &mut Verdict) {
    let (s, scale) = (&e.statements[i], e.scale);
    let line = Some(s.line).filter(|l| *l > 0);
    // Work the rest of the transaction does while the lock stays held.
    // A statement that would take as strong a lock on the table itself (a
    // rewrite, an index build under SHARE) would make the same sessions wait
    // for its work alone: its own hazard tells that, and holding the lock
    // already adds nothing to it.
    let locks_alone = |t: &StatementReport| {
        t.rewrites.iter().any(|w| w.table == l.relation)
            || t.locks.iter().any(|m| m.relation == l.relation && super::locks::subsumes(&m.mode, &l.mode))
    };
    let after: Vec<(&StatementReport, &BTreeMap<&str, Work>)> = e.statements[i + 1..]
        .iter()
        .zip(&works[i + 1..])
        .take_while(|(t, _)| t.txn == s.txn)
        .filter(|(t, _)| !locks_alone(t))
        .collect();
    let rows = |w: &BTreeMap<&str, Work>| w.values().map(Work::rows).sum::<i64>();
    let worked: i64 = after.iter().map(|(_, w)| rows(w)).sum();
    let estimate = l.estimated_ms.unwrap_or(0.0);
    let held_over_work = worked >= MASS_MIN_ROWS;
    // Queries and code (a SELECT, a DO block, a procedure) take as long as
    // they take, whatever rows the counters see: pg_sleep, a CPU loop, an
    // index-only scan. Running any under the lock is certain.
    let code: Vec<String> = after
        .iter()
        .filter(|(t, _)| t.tag.as_deref().is_some_and(runs_code) && !counted_query(t))
        .map(|(t, _)| {
            // The command, not its tag's row count (`SELECT 1`).
            let command = t.tag.as_deref().unwrap_or_default().split_whitespace().next().unwrap_or_default();
            format!("{} ({command})", t.line)
        })
        .collect();
    if estimate <= e.max_lock_ms && !held_over_work && code.is_empty() {
        return;
    }
    let exclusive = l.mode == "ACCESS EXCLUSIVE";
    let blocks = if exclusive { "reads and writes" } else { "writes" };
    let why = if !code.is_empty() && !held_over_work {
        format!(
            "line(s) {} run queries or code under it in the same transaction, for as long as they take",
            code.join(", ")
        )
    } else if held_over_work {
        let lines: Vec<String> = after
            .iter()
            .filter(|(t, w)| t.line > 0 && rows(w) > 0)
            .map(|(t, _)| t.line.to_string())
            .collect();
        let production = if scale.source == Sizes::Production {
            let at_scale: f64 = after
                .iter()
                .flat_map(|(_, w)| w.iter())
                .map(|(table, w)| w.rows() as f64 * scale.factor(table))
                .sum();
            format!(" ({at_scale:.0} at production size)")
        } else {
            String::new()
        };
        // A row two statements touch counts for each: said so when a table
        // is worked by more than one statement and the sum is more than
        // the tables hold.
        let mut statements_on: BTreeMap<&str, usize> = BTreeMap::new();
        for table in after.iter().flat_map(|(_, w)| w.keys().copied()) {
            *statements_on.entry(table).or_default() += 1;
        }
        let held: i64 = statements_on.keys().map(|t| e.golden_rows(t)).sum();
        let again = if worked > held {
            format!(
                " (the tables held {held}: rows it added count too, and a row read more than once, by a join, a foreign key's lookups{}, counts each time)",
                if statements_on.values().any(|n| *n > 1) { " or more than one statement" } else { "" }
            )
        } else {
            String::new()
        };
        format!(
            "while line(s) {} read or write {worked} rows{production} in the same transaction{again}",
            lines.join(", ")
        )
    } else {
        format!("over --max-lock {}", human_ms(e.max_lock_ms))
    };
    let mut h = Hazard::new(
        "long_lock",
        if exclusive { Severity::High } else { Severity::Medium },
        format!(
            "holds {} on {} ({}) for an estimated {} to the end of its transaction, blocking its {blocks}: {why}",
            l.mode,
            l.relation,
            e.size_words(&l.relation),
            human_ms(estimate)
        ),
        line,
    );
    h.estimated_ms = Some(estimate);
    // Work after it in its transaction can move out; a statement long on
    // its own has its own hazard's safer form.
    h.suggestion = (held_over_work || !code.is_empty()).then(|| {
        "commit the locking statement in a short transaction of its own, and do the work after it in batches"
            .into()
    });
    v.hazards.push(h);
}

/// Rows updated and deleted per transaction and golden table, and whether
/// that is most of a table worth batching for.
struct Mass {
    /// The transaction's work on the table (reads included), for the estimate.
    work: Work,
    updated: i64,
    deleted: i64,
    most_updated: bool,
    most_deleted: bool,
    lines: Vec<usize>,
}

/// Each transaction's updates and deletes per golden table: most of a table
/// is as heavy split over several statements of one transaction as in one.
fn mass_changes<'a>(e: &'a Evidence, works: &[BTreeMap<&str, Work>]) -> BTreeMap<(usize, &'a str), Mass> {
    let mut out: BTreeMap<(usize, &str), Mass> = BTreeMap::new();
    // A statement run outside a transaction block (a DO block that commits
    // each batch) ends its own transactions: how many rows each holds is
    // not seen, and batching is what it is for.
    let in_transaction = |s: &StatementReport| !s.rolled_back && s.transaction != "none";
    for (s, work) in e.statements.iter().zip(works).filter(|(s, _)| in_transaction(s)) {
        for r in s.rows.iter().filter(|r| e.rows_before.contains_key(&r.table) && !r.truncated) {
            if r.updated + r.deleted == 0 {
                continue;
            }
            let m = out.entry((s.txn, r.table.as_str())).or_insert(Mass {
                work: Work::default(),
                updated: 0,
                deleted: 0,
                most_updated: false,
                most_deleted: false,
                lines: vec![],
            });
            m.updated += r.updated;
            m.deleted += r.deleted;
            let w = work.get(r.table.as_str()).copied().unwrap_or_default();
            m.work.scanned += w.scanned;
            m.work.changed += w.changed;
            if !m.lines.contains(&s.line) {
                m.lines.push(s.line);
            }
        }
    }
    for ((_, table), m) in out.iter_mut() {
        let rows = e.rows_before.get(*table).copied().unwrap_or(0).max(1) as f64;
        let worth = e.scale.size(table).rows >= MASS_MIN_ROWS;
        m.most_updated = worth && m.updated as f64 / rows > MOST;
        m.most_deleted = worth && m.deleted as f64 / rows > MOST;
    }
    out.retain(|_, m| m.most_updated || m.most_deleted);
    out
}

/// Statements already committed when a later one failed: the database is left half-migrated.
fn partial_commit(e: &Evidence, f: &Failure, v: &mut Verdict) {
    let Some((failed, before)) = e.statements.split_last() else { return };
    // Those of the failed statement's own transaction were never kept; those
    // of an earlier one were, unless the file rolled them back.
    let kept: Vec<usize> = before
        .iter()
        .filter(|s| !s.rolled_back && s.txn != failed.txn && changes_something(s))
        .map(|s| s.line)
        .collect();
    // A statement run outside a transaction block (a DO block that commits
    // each batch) keeps what it committed before it failed.
    let itself = failed.transaction == "none" && !failed.rows.is_empty();
    if kept.is_empty() && !itself {
        return;
    }
    let lines: Vec<String> = kept.iter().take(10).map(|l| l.to_string()).collect();
    let message = match (kept.is_empty(), itself) {
        (true, _) => format!(
            "line {} failed after committing part of its own work ({}): the database is left half-migrated",
            f.line,
            rows_words(failed)
        ),
        (false, true) => format!(
            "line {} failed after committing part of its own work ({}), and after the statement(s) at line {} had already committed: the database is left half-migrated",
            f.line,
            rows_words(failed),
            lines.join(", ")
        ),
        (false, false) => format!(
            "line {} failed after the statement(s) at line {} had already committed: the database is left half-migrated",
            f.line,
            lines.join(", ")
        ),
    };
    let mut h = Hazard::new("partial_commit", Severity::High, message, Some(f.line));
    h.suggestion = Some(
        "let it run in one transaction: no COMMIT inside it, and nothing that cannot run in one (promote then runs it whole, and a failure leaves nothing behind)".into(),
    );
    v.hazards.push(h);
}

/// What a statement's rows were: `3000 rows of public.accounts updated`.
fn rows_words(s: &StatementReport) -> String {
    let said: Vec<String> = s
        .rows
        .iter()
        .map(|r| {
            let mut did = Vec::new();
            for (n, what) in [(r.inserted, "inserted"), (r.updated, "updated"), (r.deleted, "deleted")] {
                if n > 0 {
                    did.push(format!("{n} {what}"));
                }
            }
            format!("rows of {}: {}", r.table, did.join(", "))
        })
        .collect();
    said.join("; ")
}

/// Built-ins whose time is the rows they read (which the counters see) or
/// nothing: a query that calls no other function takes the time of its
/// reads, which the estimate already holds.
const COUNTED_BUILTINS: &[&str] = &[
    "setval",
    "nextval",
    "currval",
    "pg_get_serial_sequence",
    "set_config",
    "current_setting",
    "max",
    "min",
    "count",
    "sum",
    "avg",
    "coalesce",
    "greatest",
    "least",
    "nullif",
    "lower",
    "upper",
];

/// Keywords a parenthesis follows that are not a function's name.
const SQL_BEFORE_PARENTHESES: &[&str] = &[
    "select", "from", "join", "in", "exists", "as", "where", "and", "or", "not", "on", "any", "all", "some",
    "values", "lateral", "over", "filter", "when", "then", "else", "cast", "by", "with", "using",
];

/// Whether a statement is a `SELECT` calling only [`COUNTED_BUILTINS`], whose
/// time under a lock is the rows it reads, counted with the rest.
fn counted_query(s: &StatementReport) -> bool {
    use super::code::lexer::{tokens, Token};
    if !s.tag.as_deref().is_some_and(|t| t.starts_with("SELECT")) {
        return false;
    }
    let t = tokens(&s.sql);
    t.windows(2).all(|w| match w {
        // A keyword before a parenthesis is no call (`IN (`, `FROM (`, `AS (`).
        [Token::Word(f), Token::Other('(')] if SQL_BEFORE_PARENTHESES.contains(&f.as_str()) => true,
        [Token::Word(f) | Token::Quoted(f), Token::Other('(')] => {
            COUNTED_BUILTINS.contains(&f.to_ascii_lowercase().as_str())
        }
        _ => true,
    })
}

/// Whether a command tag is a query or code whose running time no row count bounds.
fn runs_code(tag: &str) -> bool {
    ["SELECT", "DO", "CALL", "COPY", "EXPLAIN", "FETCH", "EXECUTE"]
        .iter()
        .any(|t| tag == *t || tag.starts_with(&format!("{t} ")))
}

/// Whether a statement's tag says it changed something.
fn changes_something(s: &StatementReport) -> bool {
    let tag = s.tag.as_deref().unwrap_or("");
    !["SELECT", "SET", "RESET", "SHOW", "BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE", "EXPLAIN"]
        .iter()
        .any(|t| tag.starts_with(t))
}

/// Whether `column` of partition `table` changed as the same column of the
/// partitioned table at the top of its tree did (both gone, or both given
/// the same type): a change to a partitioned table's column is made to its
/// partitions', and is told once, for the table the application names.
fn follows_its_root(e: &Evidence, table: &str, column: &str) -> bool {
    let Some(root) = e.roots.get(table) else { return false };
    let column_of = |c: &Catalog, t: &str| {
        c.tables.get(t).and_then(|t| t.columns.iter().find(|c| c.name == column)).map(|c| c.type_name.clone())
    };
    let (was, now) = (column_of(e.before, table), column_of(e.after, table));
    let (root_was, root_now) = (column_of(e.before, root), column_of(e.after, root));
    e.after.tables.contains_key(table) && root_was == was && root_now == now && was != now
}

/// Renames, drops and type changes the application's running code would trip on.
fn compatibility(e: &Evidence, v: &mut Verdict) {
    // Each way it breaks, with the names a statement doing it would say.
    let mut found: Vec<(String, Vec<String>)> = Vec::new();
    for (name, table) in &e.before.tables {
        let short = airlock_postgres::catalog::short_name(name).to_owned();
        let Some(now) = e.after.tables.get(name) else {
            found.push((format!("table {name} is gone (dropped or renamed)"), vec![short]));
            continue;
        };
        for col in &table.columns {
            let names = vec![short.clone(), col.name.clone()];
            if follows_its_root(e, name, &col.name) {
                continue;
            }
            match now.columns.iter().find(|c| c.name == col.name) {
                None => {
                    found.push((format!("column {name}.{} is gone (dropped or renamed)", col.name), names))
                }
                Some(c) if c.type_name != col.type_name && !widens(&col.type_name, &c.type_name) => found
                    .push((
                        format!(
                            "column {name}.{} changes type {} -> {}{}",
                            col.name,
                            col.type_name,
                            c.type_name,
                            old_code_meets(&col.type_name, &c.type_name)
                                .map(|what| format!(" ({what})"))
                                .unwrap_or_default()
                        ),
                        names,
                    )),
                _ => {}
            }
        }
    }
    for (name, definition) in &e.before.views {
        let short = airlock_postgres::catalog::short_name(name).to_owned();
        match e.after.views.get(name) {
            None => found.push((format!("view {name} is gone (dropped or renamed)"), vec![short])),
            // Its callers may now get other columns or other rows (not where
            // it only gained columns at the end: the expand step).
            Some(now) if redefined(definition, now) => match e.views_same_rows.get(name) {
                Some(rows) => v.notes.push(Hazard::new(
                    "breaks_compatibility",
                    Severity::Low,
                    format!(
                        "view {name} is defined otherwise, but shows the same columns and the same {} as before on the golden's data: rows the golden does not hold may still differ",
                        super::report::rows(*rows)
                    ),
                    super::lines::line_naming(e, &short),
                )),
                None => found.push((
                    format!("view {name} is defined otherwise: what its callers read, its columns or its rows, may differ"),
                    vec![short],
                )),
            },
            Some(_) => {}
        }
    }
    // A sequence gone that no statement dropped was renamed or moved: the
    // defaults that take from it follow it, but code naming it does not.
    let dropped: BTreeSet<&str> =
        e.statements.iter().flat_map(|s| s.dropped.iter().map(|d| d.identity.as_str())).collect();
    for name in e.before.sequences.keys().filter(|n| !e.after.sequences.contains_key(*n)) {
        if !dropped.contains(name.as_str()) {
            let short = airlock_postgres::catalog::short_name(name).to_owned();
            found.push((
                format!("sequence {name} is gone (renamed or moved): code that names it (nextval('{short}'), setval, currval) fails, though the defaults that take from it follow it"),
                vec![short],
            ));
        }
    }
    found.extend(super::old_code::breaks(e.before, e.after));
    v.notes.extend(super::old_code::defaults_changed(e.before, e.after));
    if found.is_empty() {
        return;
    }
    // The first statement that names what the first of them names.
    // (Else the first that dropped one: a schema's CASCADE names none.)
    let line =
        found.iter().filter_map(|(_, names)| super::lines::line_naming_all(e, names)).min().or_else(|| {
            let dropped_one = |s: &&StatementReport| {
                s.dropped.iter().any(|d| {
                    let short = airlock_postgres::catalog::short_name(&d.identity);
                    found.iter().any(|(_, names)| names.first().is_some_and(|n| n.as_str() == short))
                })
            };
            e.statements
                .iter()
                .filter(|s| !s.rolled_back)
                .find(dropped_one)
                .map(|s| s.line)
                .filter(|l| *l > 0)
        });
    let found: Vec<String> = found.into_iter().map(|(phrase, _)| phrase).collect();
    let shown: Vec<&str> = found.iter().take(5).map(String::as_str).collect();
    let more = if found.len() > 5 { format!(" and {} more", found.len() - 5) } else { String::new() };
    let mut h = Hazard::new(
        "breaks_compatibility",
        Severity::Medium,
        format!(
            "the application still running the old code breaks until it is redeployed: {}{more}",
            shown.join("; ")
        ),
        line,
    );
    h.suggestion = Some(
        "expand, then contract: add the new column or table beside the old one, write both, move the code over, and drop the old one in a later release".into(),
    );
    v.hazards.push(h);
}

/// Whether a view's definition changed in a way its callers may see: not
/// where it only gained columns at the end (the expand step).
pub(crate) fn redefined(was: &str, now: &str) -> bool {
    now != was && !only_appends_columns(was, now)
}

/// Whether a view's new definition (as `pg_get_viewdef` prints it) only
/// adds columns after the old ones, reading the same rows the same way.
fn only_appends_columns(was: &str, now: &str) -> bool {
    let split = |d: &str| d.find("\n   FROM ").map(|at| (d[..at].trim_end().to_owned(), d[at..].to_owned()));
    match (split(was), split(now)) {
        (Some((old_columns, old_rest)), Some((new_columns, new_rest))) => {
            old_rest == new_rest
                && new_columns.len() > old_columns.len()
                && new_columns.starts_with(&old_columns)
                && new_columns[old_columns.len()..].starts_with(',')
        }
        _ => false,
    }
}

/// What the old code meets where a type change narrows a column within its
/// kind, rather than a type it cannot use: numbers rounded or refused,
/// strings refused past a length, times read in another way.
fn old_code_meets(before: &str, after: &str) -> Option<&'static str> {
    let base = |t: &str| {
        let (head, rest) = t.split_once('(').unwrap_or((t, ""));
        format!("{}{}", head.trim(), rest.split_once(')').map_or("", |(_, r)| r))
    };
    const NUMBERS: &[&str] = &["smallint", "integer", "bigint", "numeric", "real", "double precision"];
    const STRINGS: &[&str] = &["text", "character varying", "character"];
    match (base(before).as_str(), base(after).as_str()) {
        (b, a) if NUMBERS.contains(&b) && NUMBERS.contains(&a) => {
            Some("its writes are rounded to what the new type holds, or refused past its range, with no error to say so when rounded")
        }
        (b, a) if STRINGS.contains(&b) && STRINGS.contains(&a) => {
            Some("its writes longer than the new type allows now fail")
        }
        ("timestamp with time zone", "timestamp without time zone") => {
            Some("its times are now kept without a zone: a time written from a session in another TimeZone is kept as that session's local time")
        }
        ("timestamp without time zone", "timestamp with time zone") => {
            Some("its times are now read with a zone: each session's TimeZone decides which instant a time it writes without one is")
        }
        _ => None,
    }
}

/// Whether a type change only widens what a column holds, so code written for
/// the old type reads and writes it as before: a longer or unbounded
/// `varchar`, `text` for `varchar`, a wider integer or float, more numeric
/// precision at the same scale, finer timestamps.
fn widens(before: &str, after: &str) -> bool {
    let split = |t: &str| -> (String, Vec<i64>) {
        let (base, args) = t.split_once('(').unwrap_or((t, ""));
        let rest = args.split_once(')').map_or("", |(_, r)| r);
        let args =
            args.split(')').next().unwrap_or("").split(',').filter_map(|a| a.trim().parse().ok()).collect();
        (format!("{}{}", base.trim(), rest), args)
    };
    let ((b, bargs), (a, aargs)) = (split(before), split(after));
    let rank = |t: &str| ["smallint", "integer", "bigint"].iter().position(|x| *x == t);
    match (b.as_str(), a.as_str()) {
        ("character varying", "character varying") => aargs.is_empty() || aargs.first() >= bargs.first(),
        ("character varying", "text") => true,
        ("real", "double precision") => true,
        ("numeric", "numeric") => {
            aargs.is_empty() || (aargs.first() >= bargs.first() && aargs.get(1) == bargs.get(1))
        }
        (x, y) if x == y && x.starts_with("timestamp") => aargs.is_empty() || aargs.first() >= bargs.first(),
        (x, y) => matches!((rank(x), rank(y)), (Some(i), Some(j)) if j > i),
    }
}

fn round(ms: f64) -> f64 {
    (ms * 10.0).round() / 10.0
}

/// Candidate names from best to worst, by a rule that reads only what the
/// verdict rests on, never a measured time, so the same files rank the same
/// on an idle machine or a busy one:
/// 1. passing before failing;
/// 2. by their hazards' severities, worst first, compared one by one (one
///    `high` is worse than any number of `medium`s; of two with the same
///    worst, the one with fewer or milder others is better);
/// 3. by how long production would be blocked, estimated at production size
///    ([`blocked_ms`]);
/// 4. by how many notes they have (no `lock_timeout`, say);
/// 5. by name.
pub fn rank(candidates: &[CandidateReport]) -> Vec<String> {
    // Each candidate's severities, worst first: compared as lists, the one
    // whose first difference is milder, or that ends sooner, comes first.
    let mut order: Vec<(&CandidateReport, Vec<Severity>, f64)> = candidates
        .iter()
        .map(|c| {
            let mut severities: Vec<Severity> = c.hazards.iter().map(|h| h.severity).collect();
            severities.sort_by(|a, b| b.cmp(a));
            (c, severities, blocked_ms(c))
        })
        .collect();
    order.sort_by(|(a, a_severities, a_blocked), (b, b_severities, b_blocked)| {
        (!a.passed)
            .cmp(&!b.passed)
            .then_with(|| a_severities.cmp(b_severities))
            .then(a_blocked.total_cmp(b_blocked))
            .then(a.notes.len().cmp(&b.notes.len()))
            .then_with(|| a.name.cmp(&b.name))
    });
    order.into_iter().map(|(c, _, _)| c.name.clone()).collect()
}

/// How long a candidate would block production, estimated at production
/// size: for each of its transactions, the longest estimate of a lock that
/// blocks others, summed. Statements a ROLLBACK undid still held their
/// locks, so they count.
pub fn blocked_ms(c: &CandidateReport) -> f64 {
    let mut longest: BTreeMap<usize, f64> = BTreeMap::new();
    for s in &c.statements {
        let most = s.locks.iter().filter(|l| l.blocking).filter_map(|l| l.estimated_ms).fold(0.0, f64::max);
        let entry = longest.entry(s.txn).or_insert(0.0);
        *entry = entry.max(most);
    }
    round(longest.values().sum())
}

#[cfg(test)]
mod tests {
    #[test]
    fn widening_type_changes_keep_old_code_working() {
        for (before, after) in [
            ("character varying(50)", "character varying(100)"),
            ("character varying(50)", "text"),
            ("character varying(50)", "character varying"),
            ("integer", "bigint"),
            ("numeric(10,2)", "numeric(12,2)"),
            ("timestamp(3) without time zone", "timestamp(6) without time zone"),
        ] {
            assert!(super::widens(before, after), "{before} -> {after}");
        }
        for (before, after) in [
            ("character varying(100)", "character varying(50)"),
            ("text", "character varying(50)"),
            ("bigint", "integer"),
            ("integer", "text"),
            ("numeric(10,2)", "numeric(12,4)"),
            ("timestamp without time zone", "timestamp with time zone"),
        ] {
            assert!(!super::widens(before, after), "{before} -> {after}");
        }
    }

    /// A candidate with hazards of `severities`, `notes` notes, a lock
    /// estimated at `estimate` ms, and a measured time of `measured` ms.
    fn candidate(
        name: &str,
        severities: &[&str],
        notes: usize,
        estimate: f64,
        measured: f64,
    ) -> super::CandidateReport {
        let hazard = |severity: &&str| serde_json::json!({"kind": "k", "severity": severity, "message": "m"});
        serde_json::from_value(serde_json::json!({
            "name": name, "sha256": "", "kind": "sql",
            "passed": severities.iter().all(|s| *s == "low"),
            "hazards": severities.iter().map(hazard).collect::<Vec<_>>(),
            "notes": (0..notes).map(|_| hazard(&"low")).collect::<Vec<_>>(),
            "statements": [{
                "line": 1, "sql": "", "txn": 1, "transaction": "implicit", "duration_ms": measured,
                "locks": [{"relation": "public.t", "kind": "table", "mode": "ACCESS EXCLUSIVE",
                           "held_ms": measured, "blocking": true, "estimated_ms": estimate}],
                "rewrites": [], "rows": [], "dropped": []
            }],
            "assertions": [], "changes": [], "drift": [], "duration_ms": measured
        }))
        .unwrap()
    }

    #[test]
    fn candidates_rank_by_severities_then_estimates_then_notes_never_by_measured_time() {
        let candidates = [
            candidate("fast_but_careless.sql", &[], 1, 10.0, 1.0),
            candidate("careful.sql", &[], 0, 10.0, 900.0),
            candidate("blocks_longer.sql", &[], 0, 50.0, 2.0),
            candidate("one_low.sql", &["low"], 0, 0.0, 1.0),
            candidate("high_and_low.sql", &["high", "low"], 0, 0.0, 1.0),
            candidate("high.sql", &["high"], 0, 0.0, 1.0),
            candidate("three_medium.sql", &["medium", "medium", "medium"], 0, 0.0, 1.0),
            candidate("critical.sql", &["critical"], 0, 0.0, 1.0),
        ];
        let expected = [
            "careful.sql",
            "fast_but_careless.sql",
            "blocks_longer.sql",
            "one_low.sql",
            "three_medium.sql",
            "high.sql",
            "high_and_low.sql",
            "critical.sql",
        ];
        assert_eq!(super::rank(&candidates), expected);
        // Given in any order, with any measured times: the same ranking.
        let mut again: Vec<_> = candidates.iter().rev().cloned().collect();
        for (i, c) in again.iter_mut().enumerate() {
            c.duration_ms = (i * 1000) as f64;
            c.statements[0].duration_ms = c.duration_ms;
        }
        assert_eq!(super::rank(&again), expected);
        // Two transactions block twice; a longer lock in one transaction counts once.
        let mut two = candidate("two.sql", &[], 0, 10.0, 1.0);
        let mut second = two.statements[0].clone();
        second.txn = 2;
        second.locks[0].estimated_ms = Some(5.0);
        two.statements.push(second.clone());
        second.txn = 1;
        second.locks[0].estimated_ms = Some(3.0);
        two.statements.push(second);
        assert_eq!(super::blocked_ms(&two), 15.0);
    }
}
