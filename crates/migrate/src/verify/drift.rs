//! How the target's schema differs from the golden the test ran on, and
//! what of it the golden's import left out on purpose.

use std::collections::{BTreeMap, BTreeSet};

use airlock_postgres::catalog::diff::Change;
use airlock_postgres::catalog::Catalog;

/// How the target's schema differs from the golden's the test ran on, owners
/// set aside: a golden built from the target gives its objects to the sandbox's
/// owner role, so an owner alone is no drift.
pub fn drift(golden: &Catalog, target: &Catalog) -> Vec<Change> {
    airlock_postgres::catalog::diff::diff(golden, target)
        .into_iter()
        .filter(|c| match (&c.before, &c.after) {
            (Some(before), Some(after)) => without_owners(before) != without_owners(after),
            _ => true,
        })
        .collect()
}

/// `catalog` (a target's) without what the golden's import left out on
/// purpose (`--exclude-table`, `--exclude-schema`, as pg_dump leaves them out:
/// a table with its indexes, constraints, triggers and the sequences its
/// columns draw from; a schema with everything in it). The golden cannot have
/// drifted from what it never held. What a migration does to those objects on
/// the target is still compared: the target check sets the target's catalog
/// after each part against its own before.
pub fn leaving_out(
    mut catalog: Catalog,
    left_out: &airlock_lifecycle::golden::Exclusions,
    golden: &Catalog,
) -> Catalog {
    if left_out.is_empty() {
        return catalog;
    }
    let in_schema_left_out = |qualified: &str| {
        qualified.contains('.')
            && left_out.leaves_out_schema(&airlock_postgres::catalog::split_qualified(qualified).0)
    };
    // What the golden holds all the same (pg_dump keeps the sequence a
    // left-out table's column draws from) is compared as ever.
    let mut gone: BTreeSet<String> = BTreeSet::new();
    catalog.tables.retain(|name, table| {
        if !left_out.leaves_out(name) || golden.tables.contains_key(name) {
            return true;
        }
        let (schema, _) = airlock_postgres::catalog::split_qualified(name);
        gone.insert(name.clone());
        gone.extend(table.indexes.keys().map(|i| format!("{schema}.{i}")));
        for column in &table.columns {
            let drawn = column.default.as_deref().and_then(|d| d.strip_prefix("nextval('"));
            if let Some(sequence) = drawn.and_then(|d| d.split_once('\'')).map(|(s, _)| s) {
                gone.insert(sequence.to_owned());
            }
        }
        false
    });
    for name in catalog.views.keys().chain(catalog.sequences.keys()) {
        if left_out.leaves_out(name) {
            gone.insert(name.clone());
        }
    }
    let kept = |name: &str, held: &BTreeMap<String, String>, left: bool| !left || held.contains_key(name);
    catalog.views.retain(|name, _| kept(name, &golden.views, gone.contains(name)));
    catalog
        .sequences
        .retain(|name, _| kept(name, &golden.sequences, gone.contains(name) || in_schema_left_out(name)));
    catalog.functions.retain(|name, _| {
        kept(name, &golden.functions, in_schema_left_out(name.split('(').next().unwrap_or(name)))
    });
    catalog.types.retain(|name, _| kept(name, &golden.types, in_schema_left_out(name)));
    let held = golden.objects.as_ref();
    if let Some(objects) = catalog.objects.as_mut() {
        objects.retain(|name, _| {
            if held.is_some_and(|h| h.contains_key(name)) {
                return true;
            }
            let words: Vec<&str> = name
                .split_whitespace()
                .map(|w| w.trim_matches(|c: char| matches!(c, '(' | ')' | ',' | ';')))
                .collect();
            let names_gone = words.iter().any(|w| {
                gone.contains(*w)
                    || gone.iter().any(|g| w.starts_with(&format!("{g}.")))
                    || in_schema_left_out(w)
            });
            let schema_gone = words
                .windows(2)
                .any(|p| p[0] == "schema" && left_out.leaves_out_schema(p[1].trim_matches('"')));
            !(names_gone || schema_gone)
        });
    }
    catalog
}

/// A table's rows in the catalog the test ran against (the planner's estimate).
pub(super) fn tested_table_rows(catalog: &Catalog, table: &str) -> f64 {
    catalog.tables.get(table).map_or(0.0, |t| t.row_estimate.max(0) as f64)
}

/// Changes as comparable lines: what changed, and its definition with owners,
/// grantors and the grants' holders that are owners written `OWNER`; the
/// default privileges of `runners` (the roles the session that ran the
/// migration ran as) are written as `RUNNER`'s.
pub(super) fn entries(changes: &[Change], runners: &[&str]) -> BTreeSet<String> {
    // (PostgreSQL quotes a role's name where it must.)
    let runs: Vec<(&str, String)> = runners
        .iter()
        .flat_map(|r| [(*r, r.to_string()), (*r, airlock_postgres::catalog::quote_ident(r))])
        .map(|(r, written)| (r, format!("belonging to role {written}")))
        .collect();
    changes
        .iter()
        .map(|c| {
            let mut definition = c.after.as_deref().map(without_owners).unwrap_or_default();
            let mut name = c.name.clone();
            let by_runner = runs.iter().find(|(_, runs)| name.ends_with(runs.as_str()));
            if let Some((runner, runs)) = by_runner.filter(|_| name.starts_with("default privileges ")) {
                name = format!("{}belonging to role RUNNER", &name[..name.len() - runs.len()]);
                definition = renamed(&definition, runner, "RUNNER");
            }
            // An entry whose name says what it is has no object word.
            let what: Vec<&str> = [&c.change, &c.object, &name]
                .into_iter()
                .map(String::as_str)
                .filter(|w| !w.is_empty())
                .collect();
            format!("{}: {definition}", what.join(" "))
        })
        .collect()
}

/// `text` with every whole word `from` (between `=`, `/`, `,`, spaces and
/// braces, as in an ACL) written `to`.
pub(super) fn renamed(text: &str, from: &str, to: &str) -> String {
    text.split_inclusive(['=', '/', ',', ' ', '{', '}'])
        .map(|w| {
            let word = w.trim_end_matches(['=', '/', ',', ' ', '{', '}']);
            match word == from {
                true => format!("{to}{}", &w[word.len()..]),
                false => w.to_owned(),
            }
        })
        .collect()
}

/// A definition with its owner set aside: the owner's name is `OWNER` wherever
/// it appears as a word, and the owner's own privileges (implicit, and shown or
/// not depending on who owns it) are left out of its grants.
pub(super) fn without_owners(definition: &str) -> String {
    let owner = definition.split("; ").find_map(|part| part.strip_prefix("owner ")).map(str::to_owned);
    let Some(owner) = owner else { return definition.to_owned() };
    let named = |text: &str| -> String {
        text.split_inclusive(['=', '/', ',', ' '])
            .map(|w| {
                let word = w.trim_end_matches(['=', '/', ',', ' ']);
                if word == owner {
                    format!("OWNER{}", &w[word.len()..])
                } else {
                    w.to_owned()
                }
            })
            .collect()
    };
    definition
        .split("; ")
        .filter_map(|part| match part.strip_prefix("grants ") {
            Some(list) => {
                let kept: Vec<String> =
                    list.split(',').map(named).filter(|entry| !entry.starts_with("OWNER=")).collect();
                (!kept.is_empty()).then(|| format!("grants {}", kept.join(",")))
            }
            None => Some(named(part)),
        })
        .collect::<Vec<_>>()
        .join("; ")
}
