//! Statements that switch a table's foreign-key checks off: `ALTER TABLE ...
//! DISABLE TRIGGER ALL` (the keys' checks are system triggers of the table
//! and of the tables it points at) and `session_replication_role =
//! replica`. Only a superuser may do either, so under test the statement is
//! refused and what the rest of the file would leave is never measured; run
//! as a superuser on the target, rows deleted or written meanwhile are not
//! checked, and can be left pointing at nothing.

use airlock_postgres::catalog::{split_qualified, Catalog};

use super::evidence::{Evidence, Verdict};
use super::lines::without_comments;
use super::report::{Hazard, Severity};

/// An `integrity_removed` hazard for each statement that switches foreign
/// keys' checks off, the statement that failed included.
pub fn hazards(e: &Evidence, v: &mut Verdict) {
    let failed = e.failure.map(|f| (f.line, f.sql.as_str()));
    let ran = e.statements.iter().filter(|s| !s.rolled_back).map(|s| (s.line, s.sql.as_str()));
    let mut seen = Vec::new();
    for (line, sql) in ran.chain(failed) {
        if seen.contains(&line) {
            continue;
        }
        seen.push(line);
        let refused = e.failure.is_some_and(|f| f.line == line);
        let under_test = if refused {
            "; refused under test, where the migration is not a superuser's, so what the rest of the file leaves then was not measured"
        } else {
            ""
        };
        let text = without_comments(sql);
        let words: Vec<&str> = text.split(' ').collect();
        let message = match words.as_slice() {
            ["alter", "table", rest @ ..] => {
                let rest: Vec<&str> =
                    rest.iter().copied().skip_while(|w| matches!(*w, "only" | "if" | "exists")).collect();
                let [table, "disable", "trigger", "all", ..] = rest.as_slice() else { continue };
                let Some((name, keys)) = keys_of(e.before, table) else { continue };
                format!(
                    "switches off every trigger of {name} until it is enabled again, the checks of its foreign keys among them \
                     ({}), which only a superuser may: rows written or deleted meanwhile are not checked, and can be left \
                     pointing at nothing{under_test}",
                    keys.join(", ")
                )
            }
            ["set", rest @ ..] => {
                let rest: Vec<&str> =
                    rest.iter().copied().skip_while(|w| matches!(*w, "session" | "local")).collect();
                let ["session_replication_role", "=" | "to", role, ..] = rest.as_slice() else { continue };
                if role.trim_matches('\'') != "replica" {
                    continue;
                }
                format!(
                    "sets session_replication_role to replica, which only a superuser may: no foreign key of any table is \
                     checked and no ordinary trigger fires for the rest of the session, so rows written or deleted then can \
                     be left pointing at nothing{under_test}"
                )
            }
            _ => continue,
        };
        let mut h = Hazard::new("integrity_removed", Severity::High, message, Some(line).filter(|l| *l > 0));
        h.suggestion = Some(
            "switch off only the table's own triggers (DISABLE TRIGGER USER, or each by name), which leaves its foreign keys checked".into(),
        );
        v.hazards.push(h);
    }
}

/// Table `named` (as written) of `catalog`, and the foreign keys whose
/// checks its triggers make: its own, and those of other tables that point
/// at it (`table.constraint`); `None` where it has none.
fn keys_of(catalog: &Catalog, named: &str) -> Option<(String, Vec<String>)> {
    let named = named.trim_matches('"');
    let bare = |q: &str| split_qualified(q).1.to_ascii_lowercase();
    let (name, _) = catalog.tables.iter().find(|(q, _)| q.as_str() == named || bare(q) == named)?;
    let mut keys = Vec::new();
    for (other, t) in &catalog.tables {
        for (constraint, definition) in &t.constraints {
            let text = without_comments(definition);
            let words: Vec<&str> = text.split(' ').collect();
            let Some(at) = words.iter().position(|w| *w == "references") else { continue };
            let target = words.get(at + 1).map(|w| w.trim_matches('"')).unwrap_or_default();
            if other == name || target == name.as_str() || target == bare(name) {
                keys.push(format!("{}.{constraint}", bare(other)));
            }
        }
    }
    (!keys.is_empty()).then(|| (name.clone(), keys))
}
