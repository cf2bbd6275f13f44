//! Sequences a migration leaves behind the values their columns hold: a
//! `setval` or `ALTER SEQUENCE ... RESTART` below the highest id, or a new
//! sequence made the default of a column that already has rows. Every
//! insert that leaves the column to its default then takes a value a row
//! already holds: a duplicate key error where the column is unique, two
//! rows with one id where it is not.

use super::report::{Hazard, Severity, StatementReport};
use super::verify::Behind;

/// One hazard per column a sequence now gives values it already holds, or
/// whose values could not be read to tell.
pub fn hazards(behind: &[Behind], statements: &[StatementReport]) -> Vec<Hazard> {
    behind.iter().map(|b| hazard(b, statements)).collect()
}

fn hazard(b: &Behind, statements: &[StatementReport]) -> Hazard {
    let unquoted = |name: &str| {
        let last = airlock_postgres::catalog::split_qualified(name).1;
        last.to_ascii_lowercase()
    };
    let (sequence, table) = (unquoted(&b.sequence), unquoted(&b.table));
    // The last statement naming the sequence (its setval or RESTART), else
    // the last naming the table (its new default).
    let line = [sequence.as_str(), table.as_str()].iter().find_map(|name| {
        statements
            .iter()
            .rev()
            .find(|s| !s.rolled_back && s.sql.to_ascii_lowercase().contains(name))
            .map(|s| s.line)
            .filter(|l| *l > 0)
    });
    let (severity, outcome) = match b.unique {
        true => (Severity::High, "fail with a duplicate key error"),
        false => (Severity::Medium, "repeat a value another row holds"),
    };
    let (past, reach) = if b.descending { ("at or below", "down to") } else { ("at or past", "up to") };
    let message = match &b.held {
        Ok((ahead, far)) => format!(
            "sequence {} hands out {} next, but {}.{} already holds values {reach} {far}: the next inserts that take {} from it {outcome} ({ahead} rows hold a value {past} {})",
            b.sequence, b.next, b.table, b.column, b.column, b.next,
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
