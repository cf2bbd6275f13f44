//! What the application's running code meets after the candidate besides a
//! name or a type it knew gone: a default its inserts leave a column to,
//! and the labels of an enum it writes and compares with.

use std::collections::BTreeSet;

use airlock_postgres::catalog::{short_name, Catalog};

use super::report::{Hazard, Severity};

/// How the old code breaks on the golden's tables and types, one phrase
/// each with the names a statement doing it would say, for
/// `breaks_compatibility`: a default (or identity) gone from a
/// column (its inserts that leave the column out now fail, or write NULL),
/// and an enum label gone (renamed or dropped: writing it fails, and a
/// comparison with it is an error).
pub fn breaks(before: &Catalog, after: &Catalog) -> Vec<(String, Vec<String>)> {
    let mut found = Vec::new();
    for (name, table) in &before.tables {
        let Some(now) = after.tables.get(name) else { continue };
        for col in &table.columns {
            let (Some(was), Some(c)) = (&col.default, now.columns.iter().find(|c| c.name == col.name)) else {
                continue;
            };
            // A stored generated column is not written by inserts at all.
            if c.default.is_some() || was.ends_with(") stored") {
                continue;
            }
            let phrase = match c.nullable {
                false => format!(
                    "inserts into {name} that leave out {} now fail: its default ({was}) is gone and it is NOT NULL",
                    col.name
                ),
                true => format!(
                    "inserts into {name} that leave out {} now write NULL: its default ({was}) is gone",
                    col.name
                ),
            };
            found.push((phrase, vec![short_name(name).to_owned(), col.name.clone()]));
        }
    }
    for (name, was) in &before.types {
        let Some(now) = after.types.get(name) else { continue };
        let (Some(was), Some(now)) = (enum_labels(was), enum_labels(now)) else { continue };
        let now: BTreeSet<&String> = now.iter().collect();
        let gone: Vec<&String> = was.iter().filter(|l| !now.contains(l)).collect();
        if let Some(first) = gone.first() {
            let quoted: Vec<String> = gone.iter().map(|l| quoted(l)).collect();
            let phrase = format!(
                "enum {name} no longer has {} {} (renamed or dropped): code that writes or compares with {} fails",
                if gone.len() == 1 { "the value" } else { "the values" },
                quoted.join(", "),
                if gone.len() == 1 { "it" } else { "them" },
            );
            found.push((phrase, vec![(*first).clone()]));
        }
    }
    found
}

/// Notes for defaults the candidate changed on the golden's columns: the old
/// code's inserts that leave the column out now write another value, which
/// no error will ever show.
pub fn defaults_changed(before: &Catalog, after: &Catalog) -> Vec<Hazard> {
    let mut out = Vec::new();
    for (name, table) in &before.tables {
        let Some(now) = after.tables.get(name) else { continue };
        for col in &table.columns {
            let Some(c) = now.columns.iter().find(|c| c.name == col.name) else { continue };
            let Some(is) = &c.default else { continue };
            // A type change spells the same default with another cast; a
            // sequence's is sequence_behind's to judge; an identity is not
            // a value.
            if c.type_name != col.type_name || is.contains("nextval(") || is.starts_with("generated ") {
                continue;
            }
            let message = match &col.default {
                Some(was) if was == is => continue,
                Some(was) => format!(
                    "the default of {name}.{} changes from {was} to {is}: inserts that leave it out now write the new value, the running code's included",
                    col.name
                ),
                None => format!(
                    "{name}.{} now defaults to {is}: inserts that leave it out now write it, the running code's included, where they wrote NULL{}",
                    col.name,
                    if col.nullable { "" } else { " (or failed, as it is NOT NULL)" }
                ),
            };
            out.push(Hazard::new("default_changed", Severity::Low, message, None));
        }
    }
    out
}

/// The labels of an enum as the catalog records it (`enum ('a', 'b')`),
/// or None for any other type.
fn enum_labels(record: &str) -> Option<Vec<String>> {
    let inner = record.strip_prefix("enum (")?.strip_suffix(')')?;
    let mut labels = Vec::new();
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\'' {
            continue;
        }
        let mut label = String::new();
        loop {
            match chars.next() {
                Some('\'') if chars.peek() == Some(&'\'') => {
                    chars.next();
                    label.push('\'');
                }
                Some('\'') | None => break,
                Some(ch) => label.push(ch),
            }
        }
        labels.push(label);
    }
    Some(labels)
}

fn quoted(label: &str) -> String {
    format!("'{}'", label.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enum_labels_are_read_with_quotes_and_commas_inside() {
        assert_eq!(
            enum_labels("enum ('a', 'it''s', 'x, y')"),
            Some(vec!["a".to_owned(), "it's".to_owned(), "x, y".to_owned()])
        );
        assert_eq!(enum_labels("domain over integer"), None);
    }
}
