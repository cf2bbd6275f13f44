//! What a candidate's judgement rests on ([`Evidence`]), and what it comes
//! to ([`Verdict`]): shared by every module that finds hazards.

use std::collections::BTreeMap;

use super::report::{Assertion, Failure, Hazard, Severity, StatementReport};
use super::scale::Scale;
use airlock_postgres::catalog::diff::Change;
use airlock_postgres::catalog::Catalog;

/// Everything a candidate's judgement rests on.
pub struct Evidence<'a> {
    /// Its statements as applied.
    pub statements: &'a [StatementReport],
    /// The failure that stopped it.
    pub failure: Option<&'a Failure>,
    /// Its assertions.
    pub assertions: &'a [Assertion],
    /// The differences from the expected schema.
    pub drift: &'a [Change],
    /// The golden's rows per table.
    pub rows_before: &'a BTreeMap<String, i64>,
    /// The golden's schema, and the schema after the candidate.
    pub before: &'a Catalog,
    /// The schema after the candidate.
    pub after: &'a Catalog,
    /// Table sizes and per-row costs.
    pub scale: &'a Scale,
    /// A blocking lock estimated to be held longer than this is `long_lock`, milliseconds.
    pub max_lock_ms: f64,
    /// The SQL file's text (none for a command).
    pub sql: Option<&'a str>,
    /// The golden functions each function's body names, read after it.
    pub calls: &'a super::calls::Calls,
    /// Golden views defined otherwise that show the same rows on the fork
    /// as their old definition, and how many ([`super::view_rows`]).
    pub views_same_rows: &'a BTreeMap<String, i64>,
    /// Each partition of the golden's, to the partitioned table at the top
    /// of its tree.
    pub roots: &'a BTreeMap<String, String>,
}

/// Hazards (any one fails the candidate) and notes (worth knowing).
#[derive(Debug, Default)]
pub struct Verdict {
    /// Most severe first.
    pub hazards: Vec<Hazard>,
    /// No reason to refuse it.
    pub notes: Vec<Hazard>,
}

impl Evidence<'_> {
    /// The golden's rows of a table.
    pub(crate) fn golden_rows(&self, table: &str) -> i64 {
        self.rows_before.get(table).copied().unwrap_or(0)
    }

    /// A golden table with rows: where blocking and losing data matter.
    pub(crate) fn has_rows(&self, table: &str) -> bool {
        self.golden_rows(table) > 0 || self.scale.size(table).rows > 0 && self.rows_before.contains_key(table)
    }

    /// High for a big table, medium otherwise.
    pub(crate) fn sized(&self, table: &str) -> Severity {
        if self.scale.big(table) {
            Severity::High
        } else {
            Severity::Medium
        }
    }

    /// A table's size in words: `20000 rows in the golden`.
    pub(crate) fn size_words(&self, table: &str) -> String {
        format!("{} {}", super::report::rows(self.scale.size(table).rows), self.scale.source.place())
    }
}
