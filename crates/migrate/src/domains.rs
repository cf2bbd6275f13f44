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

use super::definitions::valid;
use super::evidence::{Evidence, Verdict};
use super::lines::line_naming;
use super::report::{Hazard, Severity};
use airlock_postgres::catalog::Catalog;

/// The name of a domain's entry in the catalog's objects.
const PREFIX: &str = "constraints of type ";

/// What a domain holds its values to: its own constraints, or (from
/// [`effective`]) those of the domains it is made over too.
#[derive(Debug, Default, PartialEq, Clone)]
struct Holds {
    /// The domain whose NOT NULL it has, if one has.
    not_null: Option<String>,
    /// CHECK definitions by the domain that has them and their name.
    checks: BTreeMap<(String, String), String>,
}

/// The domains of `catalog` with what each holds, by `schema.name` (as a
/// column's type is spelt); `None` where the catalog has no record of them.
fn domains(catalog: &Catalog) -> Option<BTreeMap<&str, Holds>> {
    let objects = catalog.objects.as_ref()?;
    let found: BTreeMap<&str, Holds> = objects
        .iter()
        .filter_map(|(name, entry)| {
            let domain = name.strip_prefix(PREFIX)?;
            Some((domain, holds(domain, &entry.definition)))
        })
        .collect();
    // A catalog with domains but no entry for them was recorded before they were read.
    let any_domain = catalog.types.values().any(|t| t.starts_with("domain over"));
    (!found.is_empty() || !any_domain).then_some(found)
}

/// Reads `not null; default 0; constraint a CHECK (...); constraint "b c" CHECK (...)`.
/// Parts are split at `; ` outside quotes, so a literal or a quoted name
/// holding one stays whole (a doubled quote toggles twice, so stays inside).
fn holds(domain: &str, definition: &str) -> Holds {
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
            out.not_null = Some(domain.to_owned());
        } else if let Some(rest) = part.strip_prefix("constraint ") {
            let (name, check) = split_name(rest);
            out.checks.insert((domain.to_owned(), name), check.to_owned());
        }
    }
    out
}

/// How deep a domain made over a domain is followed.
const CHAIN_MOST: usize = 16;

/// What a value of type `type_name` is held to: its domain's constraints
/// and those of every domain that one is made over (a domain's values must
/// pass its base domain's checks too). Nothing for a type that is no domain.
fn effective(domains: &BTreeMap<&str, Holds>, catalog: &Catalog, type_name: &str) -> Holds {
    let mut out = Holds::default();
    let mut at = element(type_name).to_owned();
    for _ in 0..CHAIN_MOST {
        let Some(own) = domains.get(at.as_str()) else { break };
        out.not_null = out.not_null.or_else(|| own.not_null.clone());
        out.checks.extend(own.checks.iter().map(|(k, v)| (k.clone(), v.clone())));
        match catalog.types.get(&at).and_then(|t| t.strip_prefix("domain over ")) {
            Some(base) => at = element(base).to_owned(),
            None => break,
        }
    }
    out
}

/// Where a table holds values of a type: each column, and each field of a
/// column of a composite type (`items.line.qty`), with the type there and
/// whether NULL may be written there.
fn slots(catalog: &Catalog, table: &airlock_postgres::catalog::Table) -> Vec<(String, String, bool)> {
    let mut out = Vec::new();
    for c in &table.columns {
        out.push((c.name.clone(), c.type_name.clone(), c.nullable));
        let fields = catalog.types.get(element(&c.type_name)).and_then(|t| t.strip_prefix("composite ("));
        for field in fields.map(|f| f.strip_suffix(')').unwrap_or(f)).map(split_fields).unwrap_or_default() {
            let (name, type_name) = split_name(&field);
            out.push((format!("{}.{name}", c.name), type_name.to_owned(), true));
        }
    }
    out
}

/// `a int, "b c" public.qty, d numeric(10,2)` as its fields, split at commas
/// outside parentheses and quotes.
fn split_fields(list: &str) -> Vec<String> {
    let (mut out, mut part, mut depth, mut quoted) = (Vec::new(), String::new(), 0i32, false);
    for c in list.chars() {
        match c {
            '"' => quoted = !quoted,
            '(' if !quoted => depth += 1,
            ')' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => {
                out.push(part.trim().to_owned());
                part.clear();
                continue;
            }
            _ => {}
        }
        part.push(c);
    }
    if !part.trim().is_empty() {
        out.push(part.trim().to_owned());
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

/// What one column lost, and (where its type changed) the domain it had and
/// the type it has now: the columns that lost the same are named together.
type Loss = (Lost, Option<(String, String)>);

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Lost {
    /// NOT NULL gone: the domain that had it.
    NotNull(String),
    /// A CHECK gone: the domain that had it, its name and definition.
    Check(String, String, String),
    /// A CHECK of the same domain and name holding otherwise: domain, name, was, now.
    Changed(String, String, String, String),
}

/// The hazards of the golden's columns whose domain holds less than it did.
pub(crate) fn domains_loosened(e: &Evidence, v: &mut Verdict) {
    let (Some(before), Some(after)) = (domains(e.before), domains(e.after)) else { return };
    let mut losses: BTreeMap<Loss, Vec<String>> = BTreeMap::new();
    for (table, was) in &e.before.tables {
        let Some(now) = e.after.tables.get(table) else { continue };
        let slots_now = slots(e.after, now);
        for (slot, type_name, _) in slots(e.before, was) {
            let held = effective(&before, e.before, &type_name);
            if held == Holds::default() {
                continue;
            }
            // A column dropped is column_dropped's.
            let Some((_, type_now, nullable)) = slots_now.iter().find(|(s, _, _)| *s == slot) else {
                continue;
            };
            let holds_now = effective(&after, e.after, type_now);
            let moved = (element(type_now) != element(&type_name))
                .then(|| (element(&type_name).to_owned(), type_now.clone()));
            let key = |lost| (lost, moved.clone());
            let at = format!("{table}.{slot}");
            if let (Some(domain), None, true) = (&held.not_null, &holds_now.not_null, *nullable) {
                losses.entry(key(Lost::NotNull(domain.clone()))).or_default().push(at.clone());
            }
            for ((domain, name), check) in &held.checks {
                if holds_now.checks.values().any(|c| valid(c) == valid(check)) {
                    continue;
                }
                let lost = match holds_now.checks.get(&(domain.clone(), name.clone())) {
                    Some(other) => Lost::Changed(domain.clone(), name.clone(), check.clone(), other.clone()),
                    None => Lost::Check(domain.clone(), name.clone(), check.clone()),
                };
                losses.entry(key(lost)).or_default().push(at.clone());
            }
        }
    }
    for ((lost, moved), columns) in losses {
        v.hazards.push(hazard(e, lost, moved, &columns));
    }
}

/// A type without its array brackets: a column of `d[]` holds `d`'s values.
fn element(type_name: &str) -> &str {
    type_name.trim_end_matches("[]")
}

fn hazard(e: &Evidence, lost: Lost, moved: Option<(String, String)>, columns: &[String]) -> Hazard {
    let listed = columns.join(", ");
    let short = |d: &str| d.rsplit('.').next().unwrap_or(d).to_owned();
    let (kind, message, line) = match (&lost, &moved) {
        (Lost::NotNull(owner), None) => (
            "integrity_removed",
            format!("drops NOT NULL from domain {owner}: NULL may now be written into {listed}"),
            statement_line(e, &["alter domain", "drop not null"], &short(owner)),
        ),
        (Lost::Check(owner, name, check), None) => (
            "integrity_removed",
            format!(
                "drops constraint {name} of domain {owner} ({check}): values for which it is false may now be written into {listed}"
            ),
            line_naming(e, name),
        ),
        (Lost::Changed(owner, name, was, now), None) => (
            "integrity_changed",
            format!(
                "changes constraint {name} of domain {owner}: was {was}, now {now}, for every value written into {listed}"
            ),
            line_naming(e, name),
        ),
        (Lost::NotNull(owner), Some((domain, type_now))) => (
            "integrity_removed",
            format!(
                "{listed} now of type {type_now}, not domain {domain}: NULL may now be written into them (domain {owner} refused it)"
            ),
            columns_line(e, columns),
        ),
        (Lost::Check(owner, name, check) | Lost::Changed(owner, name, check, _), Some((domain, type_now))) => (
            "integrity_removed",
            format!(
                "{listed} now of type {type_now}, not domain {domain}: constraint {name} of domain {owner} ({check}) no longer holds their values"
            ),
            columns_line(e, columns),
        ),
    };
    let mut h = Hazard::new(kind, Severity::Medium, message, line);
    let owner = match &lost {
        Lost::NotNull(owner) | Lost::Check(owner, ..) | Lost::Changed(owner, ..) => owner,
    };
    h.suggestion = Some(match moved {
        None => format!(
            "keep the domain's constraint; if it must change, add the new one to {owner} (NOT VALID, then VALIDATE CONSTRAINT) before dropping the old"
        ),
        Some(_) => "keep the column's domain, or add the same CHECK to the table (NOT VALID, then VALIDATE) before changing its type".into(),
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
            words.iter().all(|w| sql.contains(w)) && super::lines::names_word(&sql, &name)
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
            "public.q",
            "not null; default 0; constraint positive CHECK ((VALUE > 0)); \
             constraint \"odd \"\"name\"\"\" CHECK ((VALUE <> 'a; constraint b'::text))",
        );
        let check = |name: &str| h.checks.get(&("public.q".to_owned(), name.to_owned())).map(String::as_str);
        assert_eq!(h.not_null.as_deref(), Some("public.q"));
        assert_eq!(check("positive"), Some("CHECK ((VALUE > 0))"));
        assert_eq!(check("odd \"name\""), Some("CHECK ((VALUE <> 'a; constraint b'::text))"));
        assert_eq!(holds("public.q", ""), Holds::default());
        assert!(holds("public.q", "default 'x; not null'::text").not_null.is_none());
    }

    #[test]
    fn a_domain_over_a_domain_holds_both_and_a_composite_field_is_a_place() {
        let mut c = Catalog::default();
        for (name, text) in [
            ("public.base", "domain over integer"),
            ("public.derived", "domain over public.base"),
            ("public.line", "composite (q public.derived, \"a, b\" numeric(10,2))"),
        ] {
            c.types.insert(name.into(), text.into());
        }
        let domains = BTreeMap::from([
            ("public.base", holds("public.base", "not null; constraint b CHECK ((VALUE > 0))")),
            ("public.derived", holds("public.derived", "constraint d CHECK ((VALUE < 9))")),
        ]);
        let e = effective(&domains, &c, "public.derived[]");
        assert_eq!(e.not_null.as_deref(), Some("public.base"));
        assert_eq!(e.checks.len(), 2);
        assert_eq!(effective(&domains, &c, "integer"), Holds::default());
        assert_eq!(
            split_fields("q public.derived, \"a, b\" numeric(10,2)"),
            ["q public.derived", "\"a, b\" numeric(10,2)"]
        );
        let table = airlock_postgres::catalog::Table {
            columns: vec![airlock_postgres::catalog::Column {
                name: "l".into(),
                type_name: "public.line".into(),
                nullable: true,
                default: None,
            }],
            ..Default::default()
        };
        let places: Vec<(String, String)> = slots(&c, &table).into_iter().map(|(s, t, _)| (s, t)).collect();
        assert_eq!(
            places,
            [
                ("l".to_owned(), "public.line".to_owned()),
                ("l.q".to_owned(), "public.derived".to_owned()),
                ("l.a, b".to_owned(), "numeric(10,2)".to_owned())
            ]
        );
    }
}
