//! How a file runs in parts, the same way under test and on promote.
//!
//! A file whose statements can all share one transaction runs whole. Any
//! other file runs as psql would run it: each statement outside the file's
//! transactions in one of its own, each of the file's transactions (`BEGIN`
//! to `COMMIT`, or a `COMMIT AND CHAIN` to the next end) as one part, and
//! what cannot run in a transaction (`CREATE INDEX CONCURRENTLY`, `VACUUM`)
//! alone. The test records what each part did; promote checks each part on
//! the target against that record.

use std::collections::{BTreeMap, BTreeSet};

pub use super::report::PartRecord;
use super::report::{rows_by_table, StatementReport};
use super::rows::RowImage;
use super::verify;
use airlock_core::error::Result;
use airlock_postgres::catalog::Catalog;
use airlock_postgres::split::{self, Kind, Statement};

/// How a part's transaction is opened on the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opening {
    /// Promote opens it.
    Promote,
    /// The part's first statement is the file's `BEGIN`.
    File,
    /// The previous part's `COMMIT AND CHAIN` left it open.
    Chained,
}

/// A run of a file's statements applied together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// The statements, by index.
    pub range: std::ops::Range<usize>,
    /// Whether it runs in a transaction promote checks before it ends (else
    /// it is checked after it ran, when nothing can be undone).
    pub checked: bool,
    /// How its transaction opens.
    pub opening: Opening,
    /// Whether its last statement is the file's `COMMIT` (else promote's).
    pub file_commits: bool,
}

/// Whether every statement can share one transaction: the file then runs whole.
pub fn whole(statements: &[Statement]) -> bool {
    statements.iter().all(|s| split::kind(&s.sql) == Kind::Plain)
}

/// Whether a `COMMIT` or `ROLLBACK` ends with `AND CHAIN` (not `AND NO CHAIN`).
pub fn chains(sql: &str) -> bool {
    let words: Vec<String> =
        sql.split_whitespace().map(|w| w.trim_end_matches(';').to_ascii_uppercase()).collect();
    words.ends_with(&["AND".to_owned(), "CHAIN".to_owned()])
}

/// The parts `statements` run in.
pub fn parts(statements: &[Statement]) -> Vec<Part> {
    if whole(statements) {
        return vec![Part {
            range: 0..statements.len(),
            checked: true,
            opening: Opening::Promote,
            file_commits: false,
        }];
    }
    let mut out = Vec::new();
    let mut i = 0;
    // Set while a chained transaction is open at `i`.
    let mut chained = false;
    while i < statements.len() {
        let kind = split::kind(&statements[i].sql);
        if !chained && kind != Kind::Begin {
            let checked = kind == Kind::Plain;
            out.push(Part { range: i..i + 1, checked, opening: Opening::Promote, file_commits: false });
            i += 1;
            continue;
        }
        let (opening, body) = if chained { (Opening::Chained, i) } else { (Opening::File, i + 1) };
        let end = statements[body..]
            .iter()
            .position(|s| matches!(split::kind(&s.sql), Kind::Commit | Kind::Rollback))
            .map(|e| body + e);
        let Some(end) = end else {
            out.push(Part { range: i..statements.len(), checked: false, opening, file_commits: false });
            break;
        };
        let plain = statements[body..end].iter().all(|s| split::kind(&s.sql) == Kind::Plain);
        let commits = split::kind(&statements[end].sql) == Kind::Commit;
        out.push(Part { range: i..end + 1, checked: plain && commits, opening, file_commits: true });
        chained = chains(&statements[end].sql);
        i = end + 1;
    }
    out
}

/// Records, under test, what each part of a file run in parts did, read
/// through the admin session as each part ends.
pub struct Recorder {
    parts: Vec<Part>,
    /// The next part to end.
    next: usize,
    catalog: Catalog,
    sequences: BTreeMap<String, Option<i64>>,
    images: BTreeMap<String, RowImage>,
    /// The golden's shape rows are read by.
    shape: verify::Shape,
    /// What each part that ended did, in order.
    pub records: Vec<PartRecord>,
    /// What each part that ended did to the compared tables' rows.
    pub rows: super::rows::RunRecord,
}

impl Recorder {
    /// A recorder for `statements` (none for a file that runs whole, whose
    /// record is the candidate's own), from the state the file starts on.
    pub fn new(
        statements: &[Statement],
        catalog: Catalog,
        sequences: BTreeMap<String, Option<i64>>,
        images: BTreeMap<String, RowImage>,
        shape: verify::Shape,
    ) -> Option<Recorder> {
        (!whole(statements)).then(|| Recorder {
            parts: parts(statements),
            next: 0,
            catalog,
            sequences,
            images,
            shape,
            records: Vec::new(),
            rows: Vec::new(),
        })
    }

    /// Called once statements `..done` have run (their reports final): when
    /// the next part ends there, what it did is read and kept.
    pub async fn ran(
        &mut self,
        client: &tokio_postgres::Client,
        done: usize,
        reports: &[StatementReport],
    ) -> Result<()> {
        let Some(part) = self.parts.get(self.next).filter(|p| p.range.end == done) else { return Ok(()) };
        let range = part.range.clone();
        self.next += 1;
        let catalog = airlock_postgres::catalog::read(client).await?;
        let sequences = verify::sequences(client).await?;
        // Only the tables its statements changed (or rewrote) are read again.
        let touched: BTreeSet<String> = rows_by_table(&reports[range.clone()], true)
            .into_iter()
            .filter(|(_, counts)| counts.iter().any(|n| *n > 0))
            .map(|(table, _)| table)
            .chain(super::report::rewritten(&reports[range.clone()]))
            .filter(|table| self.images.contains_key(*table))
            .map(str::to_owned)
            .collect();
        let was: BTreeMap<String, RowImage> = self
            .images
            .iter()
            .filter(|(t, _)| touched.contains(*t))
            .map(|(t, i)| (t.clone(), i.clone()))
            .collect();
        let now =
            verify::row_images(client, verify::Reading::AsReader, &self.shape, &touched, Some(&was)).await?;
        let rows = super::rows::changes_of(&was, &now);
        self.records.push(PartRecord {
            from: range.start,
            to: range.end,
            changes: airlock_postgres::catalog::diff::diff(&self.catalog, &catalog),
            sequences_set_back: verify::set_back(&self.sequences, &sequences),
            sequences_advanced: verify::advanced(&self.sequences, &sequences),
            changed_rows: rows.iter().map(|(t, r)| (t.clone(), r.len())).collect(),
        });
        self.rows.push((range.start, range.end, rows));
        self.images.extend(now);
        self.catalog = catalog;
        self.sequences = sequences;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(sql: &str) -> Vec<(std::ops::Range<usize>, bool, Opening)> {
        parts(&split::split(sql).unwrap()).into_iter().map(|p| (p.range, p.checked, p.opening)).collect()
    }

    #[test]
    fn a_file_runs_whole_or_as_psql_would() {
        assert_eq!(shape("CREATE TABLE a (); CREATE TABLE b ();"), [(0..2, true, Opening::Promote)]);
        assert_eq!(
            shape("CREATE TABLE a (); BEGIN; INSERT INTO a DEFAULT VALUES; SAVEPOINT s; COMMIT; VACUUM a;"),
            [(0..1, true, Opening::Promote), (1..5, true, Opening::File), (5..6, false, Opening::Promote)]
        );
        // A chain: two checked parts, the second opened by the first's end.
        assert_eq!(
            shape("BEGIN; CREATE TABLE a (); COMMIT AND CHAIN; CREATE TABLE b (); COMMIT;"),
            [(0..3, true, Opening::File), (3..5, true, Opening::Chained)]
        );
        // A block that rolls itself back is checked after it ran; an open one is never checked.
        assert_eq!(
            shape("BEGIN; DELETE FROM a; ROLLBACK; BEGIN; DELETE FROM a;"),
            [(0..3, false, Opening::File), (3..5, false, Opening::File)]
        );
    }
}
