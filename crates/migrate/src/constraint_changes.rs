//! Constraints of a golden table that are still there but hold otherwise
//! (`integrity_changed`): made again under their own name with another
//! definition (a looser `CHECK`), or a foreign key replaced by one on the
//! same columns and table whose actions differ (`ON DELETE CASCADE`, where
//! deleting a referenced row used to be refused). Nothing is dropped, so
//! `integrity_removed` stays quiet, yet what the data is kept to changed.

use super::definitions::{fk_target, key_columns, same_foreign_key, valid};
use super::evidence::{Evidence, Verdict};
use super::lines::{line_naming, line_naming_table};
use super::report::{Hazard, Severity};
use airlock_postgres::catalog::Table;

/// The `integrity_changed` hazards of table `table`, `before` and `after`.
pub(crate) fn constraints_changed(e: &Evidence, table: &str, before: &Table, after: &Table, v: &mut Verdict) {
    // A column's type changed: definitions are written again with casts for
    // it (`price >= 0` becomes `price >= (0)::numeric`).
    let retyped = after
        .columns
        .iter()
        .any(|c| before.columns.iter().any(|b| b.name == c.name && b.type_name != c.type_name));
    for (name, was) in before.constraints.iter().filter(|(_, d)| !d.starts_with("NOT NULL")) {
        // The same definition anywhere (made again NOT VALID too) holds what it held.
        if after.constraints.values().any(|d| valid(d) == valid(was)) {
            continue;
        }
        let now = match after.constraints.get_key_value(name) {
            Some(now) => now,
            // Dropped: reported as removed, unless a foreign key on the same
            // columns to the same table took its place.
            None => match after.constraints.iter().find(|(_, d)| same_foreign_key(d, was)) {
                Some(now) => now,
                None => continue,
            },
        };
        // A rename (of a column, or of the table a key references) rewrites
        // the definition and changes nothing it holds.
        let (was_shape, now_shape) = (shape(e, table, was), shape(e, table, now.1));
        if was_shape == now_shape || (retyped && uncast(&was_shape) == uncast(&now_shape)) {
            continue;
        }
        v.hazards.push(changed(e, (table, after), (name, was), now));
    }
}

/// A definition with every name a rename could change in it put as `$`:
/// the columns of `table` and of the tables it references, before and
/// after, and the tables renamed away or in.
fn shape(e: &Evidence, table: &str, definition: &str) -> String {
    let mut names: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
    let tables = [Some(table), definition.starts_with("FOREIGN KEY").then(|| fk_target(definition))];
    for catalog in [e.before, e.after] {
        for t in tables.iter().flatten().filter_map(|t| catalog.tables.get(*t)) {
            names.extend(t.columns.iter().map(|c| c.name.as_str()));
        }
    }
    let renamed = e.before.tables.keys().filter(|t| !e.after.tables.contains_key(*t));
    let renamed = renamed.chain(e.after.tables.keys().filter(|t| !e.before.tables.contains_key(*t)));
    names.extend(renamed.map(|t| t.rsplit('.').next().unwrap_or(t)));
    let mut out = String::with_capacity(definition.len());
    let mut word = String::new();
    for c in definition.chars().chain(std::iter::once(' ')) {
        if c.is_alphanumeric() || c == '_' || c == '$' {
            word.push(c);
            continue;
        }
        out.push_str(if names.contains(word.as_str()) { "$" } else { &word });
        word.clear();
        out.push(c);
    }
    valid(&out).to_owned()
}

/// A definition without its casts (`::numeric`, `::character varying(20)`,
/// `::text[]`) and with the parentheses they leave around a lone constant
/// (`(0)`) taken off: how it reads whatever the column's type.
fn uncast(definition: &str) -> String {
    const MORE: &[&str] = &[" varying", " precision", " with time zone", " without time zone"];
    let mut out = String::with_capacity(definition.len());
    let mut rest = definition;
    while let Some(at) = rest.find("::") {
        out.push_str(&rest[..at]);
        rest = &rest[at + 2..];
        let name = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '"' || c == '.'))
            .unwrap_or(rest.len());
        rest = &rest[name..];
        while let Some(more) = MORE.iter().find(|m| rest.starts_with(**m)) {
            rest = &rest[more.len()..];
        }
        if rest.starts_with('(') {
            rest = rest.find(')').map_or("", |end| &rest[end + 1..]);
        }
        while let Some(r) = rest.strip_prefix("[]") {
            rest = r;
        }
    }
    out.push_str(rest);
    // `(0)` and `('x')` left by the casts: a lone constant in parentheses.
    let mut bare = String::with_capacity(out.len());
    let mut chars = out.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c == '(' {
            if let Some(end) = out[i + 1..].find(')') {
                let inside = &out[i + 1..i + 1 + end];
                let constant = !inside.is_empty()
                    && (inside.trim_start_matches('-').chars().all(|c| c.is_ascii_digit() || c == '.')
                        || (inside.starts_with('\'')
                            && inside.ends_with('\'')
                            && !inside[1..inside.len() - 1].contains('\'')));
                if constant {
                    bare.push_str(inside);
                    while chars.peek().is_some_and(|(j, _)| *j <= i + 1 + end) {
                        chars.next();
                    }
                    continue;
                }
            }
        }
        bare.push(c);
    }
    bare
}

fn changed(
    e: &Evidence,
    (table, after): (&str, &Table),
    (name, was): (&String, &String),
    (new_name, now): (&String, &String),
) -> Hazard {
    // A foreign key carried along by a rename of the table it points at
    // names neither: the statement that names the table it points at now.
    let line = line_naming(e, new_name)
        .or_else(|| line_naming(e, name))
        .or_else(|| now.starts_with("FOREIGN KEY").then(|| line_naming_table(e, fk_target(now))).flatten());
    let what = match new_name == name {
        true => format!("changes constraint {name} of {table}: was {was}, now {now}"),
        false => format!("replaces constraint {name} of {table} ({was}) with {new_name} ({now})"),
    };
    if was.starts_with("FOREIGN KEY") && now.starts_with("FOREIGN KEY") && fk_target(was) != fk_target(now) {
        let (target, target_now) = (fk_target(was), fk_target(now));
        let mut h = Hazard::new(
            "integrity_changed",
            Severity::High,
            format!(
                "{what}: rows of {table} must now point at rows of {target_now}, not of {target}: \
                 writing a row of {table} that points at a {target} row {target_now} does not hold \
                 (one made after this) now fails, and deleting a row of {target} no longer checks {table}"
            ),
            line,
        );
        h.suggestion = Some(format!(
            "point the foreign key at {target} again in the same migration (DROP CONSTRAINT, then ADD CONSTRAINT ... REFERENCES {target} NOT VALID and VALIDATE CONSTRAINT): \
             renaming a table moves the foreign keys that point at it along with it"
        ));
        return h;
    }
    if was.starts_with("FOREIGN KEY") && now.starts_with("FOREIGN KEY") {
        let target = fk_target(was);
        let (deletes_was, deletes_now) = (action(was, "ON DELETE"), action(now, "ON DELETE"));
        // SET NULL on a NOT NULL key cannot be done: the delete fails.
        let not_null: Vec<String> = key_columns(now)
            .into_iter()
            .filter(|k| after.columns.iter().any(|c| c.name == *k && !c.nullable))
            .collect();
        let fails = deletes_now == "SET NULL" && !not_null.is_empty();
        let worked = reaches_rows(deletes_was).is_some();
        if deletes_now != deletes_was && (fails || (worked && reaches_rows(deletes_now).is_none())) {
            let why = match fails {
                true => format!("ON DELETE SET NULL cannot empty its NOT NULL {}", not_null.join(", ")),
                false => format!("the key is now {deletes_now}"),
            };
            let message = match worked {
                true => format!(
                    "{what}: deleting a row of {target} that rows of {table} point at now fails ({why}), where it {}",
                    was_word(deletes_was)
                ),
                false => format!(
                    "{what}: deleting a row of {target} that rows of {table} point at still fails ({why}), as it was refused before"
                ),
            };
            let mut h = Hazard::new(
                "integrity_changed",
                if worked { Severity::High } else { Severity::Medium },
                message,
                line,
            );
            h.suggestion = Some(match fails {
                true => format!("make the key's columns nullable first, or keep ON DELETE as it was ({deletes_was})"),
                false => format!("keep the foreign key's ON DELETE as it was ({deletes_was}), or delete the rows of {table} first wherever the application deletes from {target}"),
            });
            return h;
        }
        if deletes_now != deletes_was {
            if let Some(does) = reaches_rows(deletes_now) {
                let mut h = Hazard::new(
                    "integrity_changed",
                    Severity::High,
                    format!(
                        "{what}: deleting a row of {target} now {does} the rows of {table} that point at it, where it {}",
                        was_word(deletes_was)
                    ),
                    line,
                );
                h.suggestion = Some(format!(
                    "keep the foreign key's ON DELETE as it was ({deletes_was}), and delete or detach the rows of {table} explicitly where that is meant"
                ));
                return h;
            }
        }
    }
    let what_held = if was.starts_with("CHECK") {
        "rows the old check refused may now be written"
    } else {
        "what the old definition held of its rows may no longer hold"
    };
    let mut h = Hazard::new("integrity_changed", Severity::Medium, format!("{what}: {what_held}"), line);
    h.suggestion =
        Some("if the new definition is meant, say why in the migration; otherwise keep the old one".into());
    h
}

/// A foreign key's action for `on` (`ON DELETE`, `ON UPDATE`): what
/// `pg_get_constraintdef` writes after it, `NO ACTION` when it writes none.
fn action<'a>(definition: &'a str, on: &str) -> &'a str {
    let Some(rest) = definition.split(&format!("{on} ")).nth(1) else { return "NO ACTION" };
    ["SET DEFAULT", "SET NULL", "NO ACTION", "CASCADE", "RESTRICT"]
        .into_iter()
        .find(|a| rest.starts_with(a))
        .map_or("NO ACTION", |a| &rest[..a.len()])
}

/// What a delete action does to referencing rows, for one that does anything.
fn reaches_rows(action: &str) -> Option<&'static str> {
    match action {
        "CASCADE" => Some("deletes"),
        "SET NULL" => Some("sets to NULL the key of"),
        "SET DEFAULT" => Some("sets to its default the key of"),
        _ => None,
    }
}

/// What a delete of a referenced row did under `action`.
fn was_word(action: &str) -> &'static str {
    match action {
        "CASCADE" => "deleted them",
        "SET NULL" => "set their key to NULL",
        "SET DEFAULT" => "set their key to its default",
        _ => "was refused",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn casts_a_type_change_writes_into_a_definition_are_read_past() {
        assert_eq!(uncast("CHECK ((price >= (0)::numeric))"), uncast("CHECK ((price >= 0))"));
        assert_eq!(uncast("CHECK (((code)::text <> ''::text))"), "CHECK (((code) <> ''))");
        assert_eq!(
            uncast("CHECK ((name)::character varying(20) <> 'x'::character varying)"),
            "CHECK ((name) <> 'x')"
        );
        assert_eq!(
            uncast("CHECK ((at > '2020-01-01 00:00:00'::timestamp without time zone))"),
            "CHECK ((at > '2020-01-01 00:00:00'))"
        );
        assert_ne!(uncast("CHECK ((price >= (0)::numeric))"), uncast("CHECK ((price >= 1))"));
        assert_eq!(uncast("CHECK ((tags <> '{}'::text[]))"), "CHECK ((tags <> '{}'))");
    }

    #[test]
    fn a_foreign_keys_actions_are_read_from_its_definition() {
        let d = "FOREIGN KEY (kind) REFERENCES kinds(id) ON UPDATE CASCADE ON DELETE SET NULL";
        assert_eq!((action(d, "ON DELETE"), action(d, "ON UPDATE")), ("SET NULL", "CASCADE"));
        assert_eq!(action("FOREIGN KEY (kind) REFERENCES kinds(id)", "ON DELETE"), "NO ACTION");
        assert_eq!(
            action("FOREIGN KEY (k) REFERENCES t(id) ON DELETE SET NULL (k)", "ON DELETE"),
            "SET NULL"
        );
    }
}
