//! Columns a file overwrote though no statement of it names them: an
//! `UPDATE` through a view that renames them, one whose names are made as
//! the file runs (`EXECUTE format('UPDATE %I SET %I = ...')`), a rule, the
//! golden's own triggers, or a command candidate, which has no text at all.
//!
//! What was read before the file ran came from its text, so here the text
//! has nothing to say. The server's counters do: a golden table whose rows
//! the file updated, enough of them for a hazard, has every column no
//! statement names compared (where a statement names some, only as far as
//! they can be read row by row: a decoy `UPDATE` of one column does not
//! hide another). Their values before are read on a second fork of the
//! same golden generation, which nothing has run on, made only then
//! (`second_fork.rs`); after, on the test's fork, followed through renames.
//!
//! Which column the file meant to set is unknown, so each is judged as if
//! computed from its own value: a bump of a version column loses nothing,
//! and neither does a shuffle of values among rows (from the values alone
//! the two cannot be told apart), only a merge of many values into fewer.
//! A column of timestamps that every changed row now holds the time the
//! file ran in is left out ([`stamped`]): a trigger stamping the time of the
//! change keeps a record, and overwrites nothing anyone would keep.

use std::collections::{BTreeMap, BTreeSet};

use airlock_postgres::catalog::Catalog;

use super::{enough, Target};
use crate::report::StatementReport;

/// Whether `loss`, of a column of timestamps (`type_name`), put in every
/// row it changed the time the file ran in, to the second, as the reader
/// writes it (`YYYY-MM-DD HH:MM:SS`): between `utc`'s two times for a time
/// with a zone, between `any_zone`'s (fourteen hours wider each way) for
/// one without, which a session in another zone writes in its own. A stamp
/// of the change. (A date is not judged so: a day is too wide a window, and
/// today's date written as a literal would pass for a stamp.)
pub fn stamped(loss: &super::Loss, type_name: &str, utc: (&str, &str), any_zone: (&str, &str)) -> bool {
    let t = type_name.trim_end_matches("[]");
    let window = match (t.starts_with("timestamp"), t.ends_with("without time zone")) {
        (false, _) => return false,
        (true, true) => any_zone,
        (true, false) => utc,
    };
    let l = &loss.lost;
    l.distinct.1 <= l.into.len()
        && l.into.iter().all(|(now, _, _)| now.as_deref().is_some_and(|v| within(v, window)))
}

/// Whether a timestamp's text lies within `window`, to the second.
fn within(value: &str, (from, to): (&str, &str)) -> bool {
    if value.as_bytes().get(10) != Some(&b' ') {
        return false;
    }
    let (Some(v), Some(from), Some(to)) = (value.get(..19), from.get(..19), to.get(..19)) else {
        return false;
    };
    from <= v && v <= to
}

/// The columns to compare, by whether a statement names a column of their table.
#[derive(Debug, Default)]
pub struct Unnamed {
    /// Every column of tables no statement names a column of.
    pub whole: Vec<Target>,
    /// The columns no statement names of tables where one names others: a
    /// decoy `UPDATE` of one column beside an overwrite of another no
    /// statement names. Read only row by row, within [`CELLS_MOST`].
    pub rest: Vec<Target>,
}

/// The columns (but those of the golden key, or that a default
/// fills by clock or chance) that no target of `named` holds, of each
/// golden table of `countable` whose rows `statements` updated, enough for
/// a hazard.
pub fn targets(
    statements: &[StatementReport],
    named: &[&[Target]],
    catalog: &Catalog,
    countable: &BTreeSet<String>,
    rows_before: &BTreeMap<String, i64>,
) -> Unnamed {
    let mut set: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for t in named.iter().flat_map(|ts| ts.iter()) {
        set.entry(t.table.as_str()).or_default().extend(t.columns.iter().map(String::as_str));
    }
    // Rows updated by table (a row updated twice counts twice: this only
    // decides what to read), and the line of the first statement that did.
    let mut updated: BTreeMap<&str, (i64, usize)> = BTreeMap::new();
    for s in statements.iter().filter(|s| !s.rolled_back) {
        for r in s.rows.iter().filter(|r| r.updated > 0) {
            updated.entry(r.table.as_str()).or_insert((0, s.line)).0 += r.updated;
        }
    }
    let mut out = Unnamed::default();
    for (table, (n, line)) in updated {
        let (Some(rows), Some(golden)) = (rows_before.get(table).copied(), catalog.tables.get(table)) else {
            continue;
        };
        if !countable.contains(table) || !enough(n.min(rows).max(0) as usize, rows) {
            continue;
        }
        // (Its key pairs the rows: a key renumbered is no value lost.)
        let key: Vec<String> = golden
            .constraints
            .values()
            .find(|d| d.starts_with("PRIMARY KEY"))
            .map(|d| crate::definitions::key_columns(d))
            .unwrap_or_default();
        let already = set.get(table);
        let columns: Vec<String> = golden
            .columns
            .iter()
            .filter(|c| !key.contains(&c.name))
            .filter(|c| !c.default.as_deref().is_some_and(crate::code::fills_by_chance))
            .filter(|c| !already.is_some_and(|a| a.contains(c.name.as_str())))
            .map(|c| c.name.clone())
            .collect();
        if columns.is_empty() {
            continue;
        }
        let target = Target {
            table: table.to_owned(),
            from_itself: columns.iter().cloned().collect(),
            discards: Default::default(),
            columns,
            line,
            named: false,
        };
        match already {
            Some(_) => out.rest.push(target),
            None => out.whole.push(target),
        }
    }
    out
}

/// The most values read row by row for these columns, all tables together,
/// before and after each: each is held as a 64-bit hash first (the text
/// only of columns that lost values), but a read of every column of a wide
/// table must stop somewhere. Tables past it are compared by counts, whose
/// reads hold one entry per distinct value ([`super::counts::DISTINCT_MOST`]).
pub const CELLS_MOST: i64 = 1_500_000;

/// `paired` split into those read row by row within [`CELLS_MOST`] (in
/// order) and those past it.
pub fn within_budget(paired: Vec<Target>, rows_before: &BTreeMap<String, i64>) -> (Vec<Target>, Vec<Target>) {
    let mut room = CELLS_MOST;
    paired.into_iter().partition(|t| {
        let rows = rows_before.get(&t.table).copied().unwrap_or(i64::MAX / 2);
        let cells = rows.saturating_mul(t.columns.len() as i64);
        let fits = cells <= room;
        if fits {
            room -= cells;
        }
        fits
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_is_a_time_within_the_run_to_the_second() {
        let window = ("2026-12-06 01:02:03", "2026-12-06 01:02:09");
        assert!(within("2026-12-06 01:02:05.123+00", window));
        assert!(within("2026-12-06 01:02:09.999+00", window));
        assert!(!within("2026-12-06", window));
        assert!(!within("2026-12-06 01:02:10+00", window));
        assert!(!within("2020-01-01", window));
        assert!(!within("01:02:05", window));
    }
}
