//! What a candidate takes away that kept data right, safe or quick to find:
//! a constraint dropped (`integrity_removed`), an index dropped that was the
//! only one behind a foreign key (`key_index_dropped`), a domain's checks
//! (`domains`), and a table's rows left to a crash (`durability`).
//!
//! Read from the golden's schema and the schema after the candidate, so a
//! constraint or index dropped and made again the same (under any name)
//! takes nothing away.

use super::definitions::{
    fk_target, index_columns, key_columns, same_foreign_key, same_index, sorted, valid,
};
use super::evidence::{Evidence, Verdict};
use super::lines::{line_dropping, line_naming, line_naming_table, names_word};
use super::report::{Hazard, RewriteCause, Severity};
use airlock_postgres::catalog::Table;

/// The hazards of what the candidate took away from the golden's tables
/// that are still there (a table dropped whole has its own).
pub(crate) fn integrity_hazards(e: &Evidence, v: &mut Verdict) {
    for (name, before) in &e.before.tables {
        let Some(after) = e.after.tables.get(name) else { continue };
        constraints_dropped(e, name, before, after, v);
        not_null_dropped(e, name, before, after, v);
        key_indexes_dropped(e, name, before, after, v);
        super::constraint_changes::constraints_changed(e, name, before, after, v);
    }
    super::domains::domains_loosened(e, v);
    durability(e, v);
}

/// Tables whose rows the candidate leaves without WAL: `SET UNLOGGED` on a
/// table with rows, and `CREATE UNLOGGED TABLE ... AS` of existing rows. A
/// crash empties an unlogged table, and replicas never see its rows.
fn durability(e: &Evidence, v: &mut Verdict) {
    for s in e.statements.iter().filter(|s| !s.rolled_back) {
        let sql = s.sql.to_ascii_lowercase();
        let line = Some(s.line).filter(|l| *l > 0);
        if sql.contains("set unlogged") {
            for w in s
                .rewrites
                .iter()
                .filter(|w| w.causes.contains(&RewriteCause::Persistence) && e.has_rows(&w.table))
            {
                v.hazards.push(Hazard::new(
                    "durability",
                    Severity::High,
                    format!(
                        "SET UNLOGGED: {} ({}) is written without WAL from now on: a crash empties it and replicas never see its rows, until it is SET LOGGED again",
                        w.table,
                        e.size_words(&w.table)
                    ),
                    line,
                ));
            }
        }
        if sql.contains("create unlogged table") && sql.contains(" as ") {
            for r in s.rows.iter().filter(|r| r.inserted > 0) {
                v.hazards.push(Hazard::new(
                    "durability",
                    Severity::Medium,
                    format!(
                        "CREATE UNLOGGED TABLE ... AS copies {} rows into {}, which is written without WAL: a crash empties it and replicas never see it",
                        r.inserted, r.table
                    ),
                    line,
                ));
            }
        }
    }
}

/// Constraints of the golden's table gone after the candidate, other than
/// ones kept (under another name, made again `NOT VALID`, or replaced by an
/// equal key or a unique index on the same columns) or that went with a
/// dropped column.
fn constraints_dropped(e: &Evidence, table: &str, before: &Table, after: &Table, v: &mut Verdict) {
    let dropped_columns: Vec<&str> = before
        .columns
        .iter()
        .filter(|b| !after.columns.iter().any(|a| a.name == b.name))
        .map(|b| b.name.as_str())
        .collect();
    for (constraint, definition) in &before.constraints {
        // PostgreSQL 18 names NOT NULL as a constraint: not_null_dropped says so.
        if definition.starts_with("NOT NULL")
            || after.constraints.contains_key(constraint)
            || kept(definition, after)
        {
            continue;
        }
        // A constraint on a dropped column went with it: column_dropped says so.
        if dropped_columns.iter().any(|c| names_word(definition, c)) {
            continue;
        }
        let on = key_columns(definition);
        let (severity, lost) = if definition.starts_with("FOREIGN KEY") {
            (
                Severity::High,
                format!(
                    "rows of {table} may now point at {} rows that do not exist, and deleting those is no longer refused or cascaded",
                    fk_target(definition)
                ),
            )
        } else if definition.starts_with("PRIMARY KEY") || definition.starts_with("UNIQUE") {
            (Severity::High, format!("rows of {table} with the same ({}) may now be written", on.join(", ")))
        } else if let Some(check) = definition.strip_prefix("CHECK ") {
            (Severity::Medium, format!("rows of {table} for which {check} is false may now be written"))
        } else {
            (Severity::Medium, format!("what it held of {table}'s rows is no longer checked"))
        };
        // Named, else dropped along (a CASCADE), else gone with its table's
        // name to another table (a copy swapped in, which lacks it).
        let line = line_naming(e, constraint)
            .or_else(|| line_dropping(e, constraint))
            .or_else(|| line_naming_table(e, table));
        let mut h = Hazard::new(
            "integrity_removed",
            severity,
            format!("drops constraint {constraint} of {table} ({definition}): {lost}"),
            line,
        );
        h.suggestion = Some(
            "keep the constraint; if it must change, add the new one (NOT VALID, then VALIDATE) before dropping the old".into(),
        );
        v.hazards.push(h);
    }
}

/// Whether what constraint `definition` held still holds after: the same
/// definition (made again `NOT VALID` counts), a foreign key on the same
/// columns to the same table, or a key or a unique index on the same columns.
fn kept(definition: &str, after: &Table) -> bool {
    if after.constraints.values().any(|d| valid(d) == valid(definition)) {
        return true;
    }
    let on = sorted(key_columns(definition));
    if on.is_empty() {
        return false;
    }
    if definition.starts_with("FOREIGN KEY") {
        return after.constraints.values().any(|d| same_foreign_key(d, definition));
    }
    unique_on(after, &on)
}

/// Whether a key constraint, or a non-partial unique index, of `table`
/// holds exactly the columns `on` (sorted) unique.
fn unique_on(table: &Table, on: &[String]) -> bool {
    let constraint = |d: &String| {
        (d.starts_with("PRIMARY KEY") || d.starts_with("UNIQUE")) && sorted(key_columns(d)) == on
    };
    let index = |d: &String| {
        d.starts_with("CREATE UNIQUE INDEX") && !d.contains(" WHERE ") && sorted(index_columns(d)) == on
    };
    table.constraints.values().any(constraint) || table.indexes.values().any(index)
}

/// Columns of the golden's table that were NOT NULL and are no longer.
fn not_null_dropped(e: &Evidence, table: &str, before: &Table, after: &Table, v: &mut Verdict) {
    for column in after.columns.iter().filter(|c| c.nullable) {
        if before.columns.iter().any(|b| b.name == column.name && !b.nullable) {
            let line = e
                .statements
                .iter()
                .find(|s| {
                    let sql = s.sql.to_ascii_lowercase();
                    !s.rolled_back
                        && sql.contains("drop not null")
                        && sql.contains(&column.name.to_ascii_lowercase())
                })
                .map(|s| s.line)
                .filter(|l| *l > 0);
            v.hazards.push(Hazard::new(
                "integrity_removed",
                Severity::Medium,
                format!(
                    "drops NOT NULL from {table}.{}: rows without a {} may now be written",
                    column.name, column.name
                ),
                line,
            ));
        }
    }
}

/// Indexes of the golden's table gone after the candidate that were the only
/// ones a foreign key of the table could use: each check of that key from
/// the table it references (a delete there, a change of its key) and each
/// join by it now reads the whole table. A unique index dropped takes its
/// uniqueness with it.
fn key_indexes_dropped(e: &Evidence, table: &str, before: &Table, after: &Table, v: &mut Verdict) {
    for (index, definition) in &before.indexes {
        // Kept: the same index under any name (one of the same name made
        // otherwise is not). An index of a key constraint: integrity_removed
        // says so.
        let kept = after.indexes.values().any(|d| same_index(d, definition))
            || before.constraints.contains_key(index);
        if kept {
            continue;
        }
        let line = line_naming(e, index);
        let leading = index_columns(definition);
        let still_unique = unique_on(after, &sorted(leading.clone()));
        if definition.starts_with("CREATE UNIQUE INDEX") && !leading.is_empty() && !still_unique {
            v.hazards.push(Hazard::new(
                "integrity_removed",
                Severity::High,
                format!(
                    "drops unique index {index} of {table}: rows with the same ({}) may now be written",
                    leading.join(", ")
                ),
                line,
            ));
        }
        for (key, fk) in after.constraints.iter().filter(|(_, d)| d.starts_with("FOREIGN KEY")) {
            let on = key_columns(fk);
            let served = |columns: &[String]| {
                !on.is_empty() && columns.len() >= on.len() && columns[..on.len()] == on[..]
            };
            if !served(&leading) || after.indexes.values().any(|d| served(&index_columns(d))) {
                continue;
            }
            let target = fk_target(fk);
            let on_delete = if fk.contains("ON DELETE CASCADE") {
                "find the rows to delete with it"
            } else if fk.contains("ON DELETE SET NULL") || fk.contains("ON DELETE SET DEFAULT") {
                "find the rows to change"
            } else {
                "check that no row still points at it"
            };
            let mut h = Hazard::new(
                "key_index_dropped",
                e.sized(table),
                format!(
                    "drops index {index}, the only one of {table} on ({}) behind foreign key {key} to {target}: \
                     each delete of a {target} row now reads all of {table} ({}) to {on_delete}, \
                     and each lookup or join of {table} by ({}) reads it all too",
                    on.join(", "),
                    e.size_words(table),
                    on.join(", ")
                ),
                line,
            );
            h.suggestion = Some(format!(
                "keep an index on {table} ({}): drop this one only after another that starts with those columns exists",
                on.join(", ")
            ));
            v.hazards.push(h);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(constraints: &[(&str, &str)], indexes: &[(&str, &str)]) -> Table {
        Table {
            constraints: constraints.iter().map(|(n, d)| (n.to_string(), d.to_string())).collect(),
            indexes: indexes.iter().map(|(n, d)| (n.to_string(), d.to_string())).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_constraint_made_again_or_replaced_by_an_equal_key_is_kept() {
        let fk = "FOREIGN KEY (user_id) REFERENCES public.users(id) ON DELETE CASCADE";
        // Made again NOT VALID, under another name.
        let again = table(&[("fk2", &format!("{fk} NOT VALID"))], &[]);
        assert!(kept(fk, &again));
        // Another foreign key on the same columns to the same table.
        let other = table(&[("fk3", "FOREIGN KEY (user_id) REFERENCES public.users(id)")], &[]);
        assert!(kept(fk, &other));
        let elsewhere = table(&[("fk4", "FOREIGN KEY (user_id) REFERENCES public.accounts(id)")], &[]);
        assert!(!kept(fk, &elsewhere));
        // A unique constraint replaced by a unique index on the same columns, in any order.
        let unique = "UNIQUE (tenant_id, email)";
        let index =
            table(&[], &[("u", "CREATE UNIQUE INDEX u ON public.users USING btree (email, tenant_id)")]);
        assert!(kept(unique, &index));
        let partial = table(
            &[],
            &[("u", "CREATE UNIQUE INDEX u ON public.users USING btree (email, tenant_id) WHERE (x)")],
        );
        assert!(!kept(unique, &partial));
        assert!(!kept("CHECK ((total >= (0)::numeric))", &table(&[], &[])));
    }
}
