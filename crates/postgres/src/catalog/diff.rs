//! Comparing two catalogs: what was added, dropped or changed, object by object.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::objects::Entry;
use super::{short_name, Catalog, Column};

/// One difference between two catalogs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Change {
    /// `table`, `column`, `constraint`, `index`, `trigger`, `view`, `function`,
    /// `sequence`, `type` or `extension`; empty for the other entries, whose
    /// name says what they are (`rule r on table orders`).
    pub object: String,
    /// Its name; a table's parts are `table.part`.
    pub name: String,
    /// `added`, `dropped` or `changed`.
    pub change: String,
    /// Its definition before, when it existed.
    #[serde(default)]
    pub before: Option<String>,
    /// Its definition after, when it exists.
    #[serde(default)]
    pub after: Option<String>,
}

impl Change {
    /// One line: `+ column orders.note text`, `- table audit`, `~ column orders.total: integer -> bigint`.
    /// Definitions are put on one line and cut at 160 characters.
    pub fn line(&self) -> String {
        let one_line = |d: &str| {
            let flat = d.split_whitespace().collect::<Vec<_>>().join(" ");
            match flat.char_indices().nth(160) {
                Some((i, _)) => format!("{}…", &flat[..i]),
                None => flat,
            }
        };
        let (before, after) = (self.before.as_deref().map(one_line), self.after.as_deref().map(one_line));
        // Entries PostgreSQL names itself (`rule r on table orders`) have no kind of their own.
        let what = [self.object.as_str(), self.name.as_str()]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        match (before.as_deref(), after.as_deref()) {
            (None, Some(a)) => format!("+ {what} {a}"),
            (Some(b), None) => format!("- {what} (was {b})"),
            (Some(b), Some(a)) => format!("~ {what}: {b} -> {a}"),
            (None, None) => format!("? {what}"),
        }
        .trim_end()
        .to_owned()
    }
}

/// Every difference from `before` to `after`, tables first.
pub fn diff(before: &Catalog, after: &Catalog) -> Vec<Change> {
    let mut out = Vec::new();
    let summary = |t: &super::Table| format!("({} columns)", t.columns.len());
    for (name, table) in &before.tables {
        match after.tables.get(name) {
            None => out.push(change("table", name, Some(summary(table)), None)),
            Some(now) => {
                let label = short_name(name);
                columns(&mut out, label, &table.columns, &now.columns);
                maps(&mut out, "constraint", label, &table.constraints, &now.constraints);
                maps(&mut out, "index", label, &table.indexes, &now.indexes);
                maps(&mut out, "trigger", label, &table.triggers, &now.triggers);
            }
        }
    }
    for (name, table) in &after.tables {
        if !before.tables.contains_key(name) {
            let cols: Vec<String> =
                table.columns.iter().map(|c| format!("{} {}", c.name, c.type_name)).collect();
            out.push(change("table", name, None, Some(format!("({})", cols.join(", ")))));
        }
    }
    maps(&mut out, "view", "", &before.views, &after.views);
    maps(&mut out, "function", "", &before.functions, &after.functions);
    maps(&mut out, "sequence", "", &before.sequences, &after.sequences);
    maps(&mut out, "type", "", &before.types, &after.types);
    maps(&mut out, "extension", "", &before.extensions, &after.extensions);
    if let (Some(before), Some(after)) = (&before.objects, &after.objects) {
        objects(&mut out, before, after);
    }
    out
}

/// The `; `-separated parts of two property lists that differ, as two entries
/// (`grants a -> grants a,b` rather than every property twice).
fn differing_parts(before: &str, after: &str) -> (Entry, Entry) {
    let (old, new): (Vec<&str>, Vec<&str>) = (before.split("; ").collect(), after.split("; ").collect());
    let only = |these: &[&str], those: &[&str]| {
        let kept: Vec<&str> = these.iter().filter(|p| !those.contains(p)).copied().collect();
        Entry { definition: if kept.is_empty() { "(none)".into() } else { kept.join("; ") }, property: true }
    };
    (only(&old, &new), only(&new, &old))
}

/// Entries of [`super::objects`]: a property only changes (its object's coming
/// and going is reported above); anything else also comes and goes.
fn objects(out: &mut Vec<Change>, before: &BTreeMap<String, Entry>, after: &BTreeMap<String, Entry>) {
    let named = |name: &str, before: Option<&Entry>, after: Option<&Entry>| Change {
        object: String::new(),
        name: name.replace(" public.", " "),
        change: match (before, after) {
            (None, _) => "added",
            (_, None) => "dropped",
            _ => "changed",
        }
        .into(),
        before: before.map(|e| e.definition.clone()),
        after: after.map(|e| e.definition.clone()),
    };
    for (name, then) in before {
        match after.get(name) {
            None if !then.property => out.push(named(name, Some(then), None)),
            Some(now) if now.definition != then.definition && now.property => {
                let (then, now) = differing_parts(&then.definition, &now.definition);
                out.push(named(name, Some(&then), Some(&now)));
            }
            Some(now) if now.definition != then.definition => out.push(named(name, Some(then), Some(now))),
            _ => {}
        }
    }
    for (name, now) in after {
        if !now.property && !before.contains_key(name) {
            out.push(named(name, None, Some(now)));
        }
    }
}

fn change(object: &str, name: &str, before: Option<String>, after: Option<String>) -> Change {
    let kind = match (&before, &after) {
        (None, _) => "added",
        (_, None) => "dropped",
        _ => "changed",
    };
    Change { object: object.into(), name: short_name(name).to_owned(), change: kind.into(), before, after }
}

fn column_text(c: &Column) -> String {
    let mut s = c.type_name.clone();
    if !c.nullable {
        s.push_str(" not null");
    }
    if let Some(d) = &c.default {
        s.push_str(" default ");
        s.push_str(d);
    }
    s
}

fn columns(out: &mut Vec<Change>, table: &str, before: &[Column], after: &[Column]) {
    let old: BTreeMap<&str, String> = before.iter().map(|c| (c.name.as_str(), column_text(c))).collect();
    let new: BTreeMap<&str, String> = after.iter().map(|c| (c.name.as_str(), column_text(c))).collect();
    for c in before {
        let name = format!("{table}.{}", c.name);
        match new.get(c.name.as_str()) {
            None => out.push(change("column", &name, Some(old[c.name.as_str()].clone()), None)),
            Some(n) if *n != old[c.name.as_str()] => {
                out.push(change("column", &name, Some(old[c.name.as_str()].clone()), Some(n.clone())))
            }
            _ => {}
        }
    }
    for c in after {
        if !old.contains_key(c.name.as_str()) {
            out.push(change(
                "column",
                &format!("{table}.{}", c.name),
                None,
                Some(new[c.name.as_str()].clone()),
            ));
        }
    }
}

fn maps(
    out: &mut Vec<Change>,
    object: &str,
    owner: &str,
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
) {
    let name = |n: &str| if owner.is_empty() { n.to_owned() } else { format!("{owner}.{n}") };
    for (n, def) in before {
        match after.get(n) {
            None => out.push(change(object, &name(n), Some(def.clone()), None)),
            Some(now) if now != def => {
                out.push(change(object, &name(n), Some(def.clone()), Some(now.clone())))
            }
            _ => {}
        }
    }
    for (n, def) in after {
        if !before.contains_key(n) {
            out.push(change(object, &name(n), None, Some(def.clone())));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Table;

    fn col(name: &str, ty: &str) -> Column {
        Column { name: name.into(), type_name: ty.into(), nullable: true, default: None }
    }

    #[test]
    fn finds_added_dropped_and_changed_objects() {
        let mut before = Catalog::default();
        before.tables.insert(
            "public.orders".into(),
            Table {
                kind: "table".into(),
                columns: vec![col("id", "integer"), col("gone", "text")],
                ..Default::default()
            },
        );
        before.tables.insert("public.audit".into(), Table::default());
        let mut after = before.clone();
        after.tables.remove("public.audit");
        let orders = after.tables.get_mut("public.orders").unwrap();
        orders.columns = vec![col("id", "bigint"), col("note", "text")];
        orders.indexes.insert("orders_note".into(), "CREATE INDEX orders_note ON orders (note)".into());
        after.views.insert("public.v".into(), "SELECT 1".into());
        let lines: Vec<String> = diff(&before, &after).iter().map(Change::line).collect();
        assert_eq!(
            lines,
            [
                "- table audit (was (0 columns))",
                "~ column orders.id: integer -> bigint",
                "- column orders.gone (was text)",
                "+ column orders.note text",
                "+ index orders.orders_note CREATE INDEX orders_note ON orders (note)",
                "+ view v SELECT 1",
            ]
        );
        assert!(diff(&after, &after).is_empty());
    }
}
