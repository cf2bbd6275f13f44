//! What a domain held its columns' values to, taken away: a domain's CHECK
//! dropped (`integrity_removed`) or made again to hold otherwise
//! (`integrity_changed`), its NOT NULL dropped, or a column moved off the
//! domain to a type that does not hold the same. PostgreSQL judges a
//! domain's constraints on every write to every column of the domain, so
//! each of those columns now takes values it used to refuse.
//!
//! Read per column of the golden's tables, so a domain renamed keeps what
//! it held, and a column given another domain with the same checks loses
//! nothing. A golden recorded before domains' constraints were read has no
//! record of them, and gets no hazard.

use std::collections::BTreeMap;

use super::hazards::{Evidence, Verdict};
use super::integrity::{line_naming, valid};
use super::report::{Hazard, Severity};
use airlock_postgres::catalog::Catalog;

/// The name of a domain's entry in the catalog's objects.
const PREFIX: &str = "constraints of type ";

/// What a domain holds its values to.
#[derive(Debug, Default, PartialEq)]
struct Holds {
    not_null: bool,
    /// CHECK definitions by constraint name.
    checks: BTreeMap<String, String>,
}

/// The domains of `catalog` with what each holds, by `schema.name` (as a
/// column's type is spelt); `None` where the catalog has no record of them.
fn domains(catalog: &Catalog) -> Option<BTreeMap<&str, Holds>> {
    let objects = catalog.objects.as_ref()?;
    let found: BTreeMap<&str, Holds> = objects
        .iter()
        .filter_map(|(name, entry)| Some((name.strip_prefix(PREFIX)?, holds(&entry.definition))))
        .collect();
    // A catalog with domains but no entry for them was recorded before they were read.
    let any_domain = catalog.types.values().any(|t| t.starts_with("domain over"));
    (!found.is_empty() || !any_domain).then_some(found)
}

/// Reads `not null; default 0; constraint a CHECK (...); constraint "b c" CHECK (...)`.
/// Parts are split at `; ` outside quotes, so a literal or a quoted name
/// holding one stays whole (a doubled quote toggles twice, so stays inside).
fn holds(definition: &str) -> Holds {
    let mut parts: Vec<&str> = Vec::new();
    let (mut single, mut double, mut start) = (false, false, 0);
    let bytes = definition.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        match b {
            b'\'' if !double => single = !single,
            b'"' if !single => double = !double,
            b';' if !single && !double && bytes.get(i + 1) == Some(&b' ') => {
                parts.push(&definition[start..i]);
                start = i + 2;
            }
            _ => {}
        }
    }
    parts.push(&definition[start..]);
    let mut out = Holds::default();
    for part in parts {
        if part == "not null" {
            out.not_null = true;
        } else if let Some(rest) = part.strip_prefix("constraint ") {
            let (name, check) = split_name(rest);
            out.checks.insert(name, check.to_owned());
        }
    }
    out
}

/// `name DEF` or `"quoted ""name""" DEF` as the name and the definition.
fn split_name(text: &str) -> (String, &str) {
    if let Some(quoted) = text.strip_prefix('"') {
        let mut chars = quoted.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            if c != '"' {
                continue;
            }
            if chars.peek().is_some_and(|(_, n)| *n == '"') {
                chars.next();
                continue;
            }
            let rest = quoted[i + 1..].trim_start();
            return (quoted[..i].replace("\"\"", "\""), rest);
        }
    }
    match text.split_once(' ') {
        Some((name, rest)) => (name.to_owned(), rest),
        None => (text.to_owned(), ""),
    }
}

/// What one column lost: keyed by the domain it had, what it lost and the
/// type it has now, so the columns that lost the same are named together.
type Loss = (String, Lost, String);

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Lost {
    NotNull,
    /// A CHECK gone: its name and definition.
    Check(String, String),
    /// A CHECK under the same name holding otherwise: name, was, now.
    Changed(String, String, String),
}

/// The hazards of the golden's columns whose domain holds less than it did.
pub(crate) fn domains_loosened(e: &Evidence, v: &mut Verdict) {
    let (Some(before), Some(after)) = (domains(e.before), domains(e.after)) else { return };
    let none = Holds::default();
    let mut losses: BTreeMap<Loss, Vec<String>> = BTreeMap::new();
    for (table, was) in &e.before.tables {
        let Some(now) = e.after.tables.get(table) else { continue };
        for column in &was.columns {
            let Some(held) = before.get(element(&column.type_name)) else { continue };
            // A column dropped is column_dropped's.
            let Some(after_column) = now.columns.iter().find(|c| c.name == column.name) else { continue };
            let domain_now = element(&after_column.type_name);
            let holds_now = after.get(domain_now).unwrap_or(&none);
            let key = |lost| (element(&column.type_name).to_owned(), lost, after_column.type_name.clone());
            let at = format!("{table}.{}", column.name);
            if held.not_null && !holds_now.not_null && after_column.nullable {
                losses.entry(key(Lost::NotNull)).or_default().push(at.clone());
            }
            for (name, check) in &held.checks {
                if holds_now.checks.values().any(|c| valid(c) == valid(check)) {
                    continue;
                }
                let lost = match holds_now.checks.get(name) {
                    Some(other) => Lost::Changed(name.clone(), check.clone(), other.clone()),
                    None => Lost::Check(name.clone(), check.clone()),
                };
                losses.entry(key(lost)).or_default().push(at.clone());
            }
        }
    }
    for ((domain, lost, type_now), columns) in losses {
        v.hazards.push(hazard(e, &domain, lost, &type_now, &columns));
    }
}

/// A type without its array brackets: a column of `d[]` holds `d`'s values.
fn element(type_name: &str) -> &str {
    type_name.trim_end_matches("[]")
}

fn hazard(e: &Evidence, domain: &str, lost: Lost, type_now: &str, columns: &[String]) -> Hazard {
    let listed = columns.join(", ");
    let moved = element(type_now) != domain;
    let short = domain.rsplit('.').next().unwrap_or(domain);
    let (kind, message, line) = match (&lost, moved) {
        (Lost::NotNull, false) => (
            "integrity_removed",
            format!("drops NOT NULL from domain {domain}: NULL may now be written into {listed}"),
            statement_line(e, &["alter domain", "drop not null"], short),
        ),
        (Lost::Check(name, check), false) => (
            "integrity_removed",
            format!(
                "drops constraint {name} of domain {domain} ({check}): values for which it is false may now be written into {listed}"
            ),
            line_naming(e, name),
        ),
        (Lost::Changed(name, was, now), false) => (
            "integrity_changed",
            format!(
                "changes constraint {name} of domain {domain}: was {was}, now {now}, for every value written into {listed}"
            ),
            line_naming(e, name),
        ),
        (Lost::NotNull, true) => (
            "integrity_removed",
            format!("{listed} now of type {type_now}, not domain {domain}: NULL may now be written into them"),
            columns_line(e, columns),
        ),
        (Lost::Check(name, check) | Lost::Changed(name, check, _), true) => (
            "integrity_removed",
            format!(
                "{listed} now of type {type_now}, not domain {domain}: its constraint {name} ({check}) no longer holds their values"
            ),
            columns_line(e, columns),
        ),
    };
    let mut h = Hazard::new(kind, Severity::Medium, message, line);
    h.suggestion = Some(match moved {
        false => format!(
            "keep the domain's constraint; if it must change, add the new one to {domain} (NOT VALID, then VALIDATE CONSTRAINT) before dropping the old"
        ),
        true => "keep the column's domain, or add the same CHECK to the table (NOT VALID, then VALIDATE) before changing its type".into(),
    });
    h
}

/// The first statement holding all of `words` and naming `name`.
fn statement_line(e: &Evidence, words: &[&str], name: &str) -> Option<usize> {
    let name = name.to_ascii_lowercase();
    e.statements
        .iter()
        .filter(|s| !s.rolled_back)
        .find(|s| {
            let sql = s.sql.to_ascii_lowercase();
            words.iter().all(|w| sql.contains(w)) && super::integrity::names_word(&sql, &name)
        })
        .map(|s| s.line)
        .filter(|l| *l > 0)
}

/// The first statement changing the type of one of `columns` (`schema.table.column`).
fn columns_line(e: &Evidence, columns: &[String]) -> Option<usize> {
    columns.iter().find_map(|c| {
        let name = c.rsplit('.').next().unwrap_or(c);
        statement_line(e, &["alter", "type"], name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_domains_record_is_read_back_whatever_its_names_and_checks_hold() {
        let h = holds(
            "not null; default 0; constraint positive CHECK ((VALUE > 0)); \
             constraint \"odd \"\"name\"\"\" CHECK ((VALUE <> 'a; constraint b'::text))",
        );
        assert!(h.not_null);
        assert_eq!(h.checks.get("positive").map(String::as_str), Some("CHECK ((VALUE > 0))"));
        assert_eq!(
            h.checks.get("odd \"name\"").map(String::as_str),
            Some("CHECK ((VALUE <> 'a; constraint b'::text))")
        );
        assert_eq!(holds(""), Holds::default());
        assert!(!holds("default 'x; not null'::text").not_null);
    }
}
