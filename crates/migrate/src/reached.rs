//! Golden functions the candidate replaced (or dropped), reached from what
//! guards or derives the data: a `CHECK` constraint, an index's expression
//! or predicate, a policy, a column's default or generation expression.
//! `CREATE OR REPLACE FUNCTION` keeps the function's identity, so every one
//! of those goes on running it, now with the new body, and nothing is
//! checked or computed again: an index's entries were made by the old body,
//! rows a check let in were judged by it. The same holds down the chain,
//! for functions those functions name ([`super::calls`]). Triggers are
//! judged with the rest of what a trigger does ([`super::access`]).

use std::collections::BTreeSet;

use super::calls::{by_name, changed_down, words, Changed};
use super::evidence::{Evidence, Verdict};
use super::lines::line_naming;
use super::report::{Hazard, Severity};

/// What runs a function, as a message names it, and what a new body does to it.
struct User {
    /// `CHECK constraint price_positive on public.items`.
    what: String,
    /// Its definition, read for the functions it names.
    definition: String,
    severity: Severity,
    effect: &'static str,
    suggestion: Option<String>,
    /// Its own name, and the words of a statement that makes it judge or
    /// compute everything again (`reindex`): such a statement naming it
    /// after the function was replaced puts it right.
    redone_by: Option<(String, &'static [&'static str])>,
}

/// Whether a statement after line `after` names `name` with one of `words`.
fn redone(e: &Evidence, after: Option<usize>, (name, words): &(String, &[&str])) -> bool {
    let name = name.to_ascii_lowercase();
    e.statements.iter().filter(|s| !s.rolled_back && Some(s.line) > after).any(|s| {
        let sql = s.sql.to_ascii_lowercase();
        super::lines::names_word(&sql, &name) && words.iter().any(|w| sql.contains(w))
    })
}

/// `function_replaced` hazards for golden objects of `e` still there after
/// the candidate whose functions (or theirs) it replaced or dropped.
pub fn reached_hazards(e: &Evidence, v: &mut Verdict) {
    let by_name = by_name(e.before);
    for user in users(e) {
        let words = words(&user.definition);
        let mut named: Vec<&String> = by_name
            .iter()
            .filter(|(name, _)| words.contains(*name))
            .flat_map(|(_, keys)| keys.clone())
            .collect();
        // Functions run through the application's own operators.
        let symbols = operator_symbols(&user.definition);
        named.extend(
            e.calls.operators.iter().filter(|(o, _)| symbols.contains(o.as_str())).flat_map(|(_, f)| f),
        );
        if let Some(first) = changed_down(e.calls, (e.before, e.after), named).into_iter().next() {
            let (Changed { function, via, .. }, what) = (first, first.verb());
            let through = match via {
                Some(caller) => format!("which {caller} names, down the chain"),
                None => "which".to_owned(),
            };
            let short = function.split('(').next().unwrap_or(function);
            let line = line_naming(e, short.rsplit('.').next().unwrap_or(short));
            if user.redone_by.as_ref().is_some_and(|r| redone(e, line, r)) {
                continue;
            }
            let mut h = Hazard::new(
                "function_replaced",
                user.severity,
                format!("{what} function {function}, {through} {} runs: {}", user.what, user.effect),
                line,
            );
            h.suggestion = user.suggestion;
            v.hazards.push(h);
        }
    }
}

/// The runs of operator characters in a definition (`>>>`, `@@`).
fn operator_symbols(definition: &str) -> BTreeSet<&str> {
    definition.split(|c: char| !"+-*/<>=~!@#%^&|`?".contains(c)).filter(|s| !s.is_empty()).collect()
}

/// The golden's objects that run functions, still there after the candidate.
fn users(e: &Evidence) -> Vec<User> {
    let mut out = Vec::new();
    for (name, table) in &e.before.tables {
        let Some(now) = e.after.tables.get(name) else { continue };
        for (constraint, definition) in table.constraints.iter().filter(|(_, d)| d.starts_with("CHECK")) {
            if now.constraints.get(constraint) != Some(definition) {
                continue;
            }
            out.push(User {
                what: format!("CHECK constraint {constraint} on {name}"),
                definition: definition.clone(),
                severity: Severity::Medium,
                effect: "the rows already there were judged by the old body and are not judged again, and what it lets in from now on changed",
                suggestion: Some(format!(
                    "to judge every row by the new body, drop the constraint and add it again NOT VALID, then VALIDATE CONSTRAINT {constraint}"
                )),
                redone_by: Some((constraint.clone(), &["add constraint", "validate constraint"])),
            });
        }
        for (index, definition) in &table.indexes {
            if now.indexes.get(index) != Some(definition) {
                continue;
            }
            out.push(User {
                what: format!("index {index} on {name}"),
                definition: definition.clone(),
                severity: Severity::High,
                effect: "its entries were computed by the old body, so lookups through it can miss rows, and a unique index can let duplicates in",
                suggestion: Some(format!("REINDEX INDEX CONCURRENTLY {index} right after, or give the new body a new name")),
                redone_by: Some((index.clone(), &["reindex", "create"])),
            });
        }
        for column in &table.columns {
            let Some(default) = &column.default else { continue };
            let same =
                now.columns.iter().any(|c| c.name == column.name && c.default.as_ref() == Some(default));
            if !same {
                continue;
            }
            out.push(User {
                what: format!("the default or generation expression of {name}.{}", column.name),
                definition: default.clone(),
                severity: Severity::Medium,
                effect: "rows written from now on get values the old body would not have given (stored generated values already there keep the old body's)",
                suggestion: None,
                redone_by: None,
            });
        }
    }
    // Domains' checks as they stand now (a dropped one is not a user).
    for (what, definition) in &e.calls.domain_checks {
        out.push(User {
            what: what.clone(),
            definition: definition.clone(),
            severity: Severity::Medium,
            effect: "the values already there were judged by the old body and are not judged again, and what it lets in from now on changed",
            suggestion: None,
            redone_by: None,
        });
    }
    let policies = e.before.objects.iter().flatten().filter(|(k, _)| k.starts_with("policy "));
    for (policy, entry) in policies {
        let still = e.after.objects.as_ref().and_then(|o| o.get(policy)).is_some_and(|now| now == entry);
        if still {
            out.push(User {
                what: policy.clone(),
                definition: entry.definition.clone(),
                severity: Severity::High,
                effect: "which rows each role may see or write changed with it",
                suggestion: None,
                redone_by: None,
            });
        }
    }
    out
}
