//! Sequences a migration leaves behind the values their columns hold: a
//! `setval` or `ALTER SEQUENCE ... RESTART` below the highest id, or a new
//! sequence made the default of a column that already has rows. Every
//! insert that leaves the column to its default then takes a value a row
//! already holds: a duplicate key error where the column is unique, two
//! rows with one id where it is not. And sequences a migration brings to
//! the end of their range (`setval` to the top, a `MAXVALUE` lowered): every
//! insert that takes a value from one then fails.

use std::collections::BTreeMap;

use super::report::{Hazard, Severity, StatementReport};
use super::verify::Behind;

/// One hazard per column a sequence now gives values it already holds, or
/// whose values could not be read to tell.
pub fn hazards(behind: &[Behind], statements: &[StatementReport]) -> Vec<Hazard> {
    behind.iter().map(|b| hazard(b, statements)).collect()
}

/// `sequence_exhausted` hazards: one per sequence the file left at its end
/// (every insert that takes a value from it fails) or near it.
pub fn run_out(left: &BTreeMap<String, i64>, statements: &[StatementReport]) -> Vec<Hazard> {
    left.iter()
        .map(|(sequence, left)| {
            let message = match left {
                0 => format!(
                    "sequence {sequence} has no value left (it does not cycle): every insert that takes a value from it now fails with \"reached maximum value\" (or minimum, counting down)"
                ),
                1 => format!(
                    "sequence {sequence} has only 1 value left (it does not cycle): inserts that take a value from it fail once it is handed out, sooner on a database further ahead than the golden"
                ),
                _ => format!(
                    "sequence {sequence} has only {left} values left (it does not cycle): inserts that take a value from it fail once they are handed out, sooner on a database further ahead than the golden"
                ),
            };
            let mut h =
                Hazard::new("sequence_exhausted", Severity::High, message, last_naming(statements, &[sequence]));
            h.suggestion = Some(format!(
                "leave the sequence its range: ALTER SEQUENCE {sequence} NO MAXVALUE (or set it past the column's largest value with setval)"
            ));
            h
        })
        .collect()
}

/// The line of the last statement (not rolled back) whose text, comments
/// left out, names one of `names` (as written last in a qualified name, any
/// case), tried in order. A `DROP SEQUENCE` is not one: a sequence of the
/// same name that hands out values now was made by a later statement
/// (`ADD GENERATED ... AS IDENTITY` names its table, not its sequence).
fn last_naming(statements: &[StatementReport], names: &[&str]) -> Option<usize> {
    let texts: Vec<String> = statements.iter().map(|s| crate::lines::without_comments(&s.sql)).collect();
    names.iter().find_map(|name| {
        let name = airlock_postgres::catalog::split_qualified(name).1.to_ascii_lowercase();
        statements
            .iter()
            .zip(&texts)
            .rev()
            .find(|(s, text)| !s.rolled_back && text.contains(&name) && !text.starts_with("drop sequence"))
            .map(|(s, _)| s.line)
            .filter(|l| *l > 0)
    })
}

fn hazard(b: &Behind, statements: &[StatementReport]) -> Hazard {
    // The last statement naming the sequence (its setval or RESTART), else
    // the last naming the table (its new default).
    let line = last_naming(statements, &[&b.sequence, &b.table]);
    let (severity, outcome) = match b.unique {
        true => (Severity::High, "fail with a duplicate key error"),
        false => (Severity::Medium, "repeat a value another row holds"),
    };
    let (past, reach) = if b.descending { ("at or below", "down to") } else { ("at or past", "up to") };
    let message = match &b.held {
        Ok((ahead, far)) => format!(
            "sequence {} hands out {} next, but {}.{} already holds values {reach} {far}: the next inserts that take {} from it {outcome} ({} a value {past} {})",
            b.sequence, b.next, b.table, b.column, b.column,
            if *ahead == 1 { "1 row holds".to_string() } else { format!("{ahead} rows hold") },
            b.next,
        ),
        Err(error) => format!(
            "sequence {} hands out {} next, and {}.{} could not be read to tell whether its rows hold values {past} it ({error}): inserts that take {} from it may {outcome}",
            b.sequence, b.next, b.table, b.column, b.column,
        ),
    };
    let mut h = Hazard::new("sequence_behind", severity, message, line);
    let (extreme, whole) = if b.descending { ("min", "below") } else { ("max", "past") };
    h.suggestion = Some(format!(
        "start it {whole} what the column holds: SELECT setval('{}', (SELECT {extreme}({}) FROM {}))",
        b.sequence.replace('\'', "''"),
        b.column,
        b.table,
    ));
    h
}
