//! Sequences a migration leaves behind the values their columns hold: a
//! `setval` or `ALTER SEQUENCE ... RESTART` below the highest id, or a new
//! sequence made the default of a column that already has rows. Every
//! insert that leaves the column to its default then takes a value a row
//! already holds: a duplicate key error where the column is unique, two
//! rows with one id where it is not.

use super::report::{Hazard, Severity, StatementReport};
use super::verify::Behind;

/// One hazard per column a sequence now gives values it already holds.
pub fn hazards(behind: &[Behind], statements: &[StatementReport]) -> Vec<Hazard> {
    behind
        .iter()
        .map(|b| {
            let short = |name: &str| name.rsplit('.').next().unwrap_or(name).trim_matches('"').to_ascii_lowercase();
            let (sequence, table) = (short(&b.sequence), short(b.column.rsplit_once('.').map_or("", |(t, _)| t)));
            // The last statement naming the sequence (its setval or RESTART),
            // else the last naming the table (its new default).
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
            let mut h = Hazard::new(
                "sequence_behind",
                severity,
                format!(
                    "sequence {} hands out {} next, but {} already holds values up to {}: the next inserts that take {} from it {outcome} ({} rows hold a value at or past {})",
                    b.sequence,
                    b.next,
                    b.column,
                    b.max,
                    b.column.rsplit_once('.').map_or(b.column.as_str(), |(_, c)| c),
                    b.ahead,
                    b.next,
                ),
                line,
            );
            h.suggestion = Some(format!(
                "start it past what the column holds: SELECT setval('{}', (SELECT max({}) FROM {}))",
                b.sequence.replace('\'', "''"),
                b.column.rsplit_once('.').map_or("", |(_, c)| c),
                b.column.rsplit_once('.').map_or("", |(t, _)| t),
            ));
            h
        })
        .collect()
}
