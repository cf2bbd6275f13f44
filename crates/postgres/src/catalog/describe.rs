//! `describe_schema`: a catalog as compact text a model reads well.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::{short_name, Catalog, RowCount, Table};

/// Renders every table (or only `only`), then views, functions, sequences,
/// types and extensions. `None` when `only` names no table or view.
pub fn render(catalog: &Catalog, rows: &BTreeMap<String, RowCount>, only: Option<&str>) -> Option<String> {
    let mut out = String::new();
    if let Some(wanted) = only {
        let key = find(catalog, wanted)?;
        if let Some(table) = catalog.tables.get(&key) {
            table_text(&mut out, &key, table, rows.get(&key));
        } else {
            let _ = writeln!(out, "{} (view)\n  {}", short_name(&key), catalog.views[&key].trim());
        }
        return Some(out);
    }
    let _ = writeln!(
        out,
        "{} tables, {} views, {} functions. Rows marked ~ are estimates.",
        catalog.tables.len(),
        catalog.views.len(),
        catalog.functions.len()
    );
    for (name, table) in &catalog.tables {
        out.push('\n');
        table_text(&mut out, name, table, rows.get(name));
    }
    let list = |out: &mut String, title: &str, items: Vec<String>| {
        if !items.is_empty() {
            let _ = write!(out, "\n{title}:\n");
            for item in items {
                let _ = writeln!(out, "  {item}");
            }
        }
    };
    list(&mut out, "views", catalog.views.keys().map(|v| short_name(v).to_owned()).collect());
    list(
        &mut out,
        "functions",
        catalog
            .functions
            .iter()
            .map(|(f, d)| format!("{} {}", short_name(f), d.split(" [").next().unwrap_or("")))
            .collect(),
    );
    list(&mut out, "sequences", catalog.sequences.keys().map(|s| short_name(s).to_owned()).collect());
    list(&mut out, "types", catalog.types.iter().map(|(t, d)| format!("{} {d}", short_name(t))).collect());
    list(&mut out, "extensions", catalog.extensions.iter().map(|(e, v)| format!("{e} {v}")).collect());
    Some(out)
}

/// The catalog key a user's table name means: `schema.name`, or `name` in any
/// schema (public first), ignoring case when nothing matches exactly.
pub fn find(catalog: &Catalog, wanted: &str) -> Option<String> {
    let names = catalog.tables.keys().chain(catalog.views.keys());
    let candidates: Vec<&String> = names.collect();
    let exact = |w: &str| {
        candidates
            .iter()
            .find(|n| n.as_str() == w || n.as_str() == format!("public.{w}"))
            .or_else(|| candidates.iter().find(|n| n.split_once('.').map(|(_, r)| r) == Some(w)))
            .map(|n| (*n).clone())
    };
    exact(wanted).or_else(|| exact(&wanted.to_lowercase()))
}

fn table_text(out: &mut String, name: &str, table: &Table, rows: Option<&RowCount>) {
    let rows = match rows {
        Some(r) if r.exact => format!("{} rows", r.rows),
        Some(r) if r.rows >= 0 => format!("~{} rows", r.rows),
        _ => "rows not yet counted".to_owned(),
    };
    let _ = writeln!(out, "{} ({}, {rows})", short_name(name), table.kind);
    let width = table.columns.iter().map(|c| c.name.len()).max().unwrap_or(0);
    for c in &table.columns {
        let mut line = format!("  {:width$}  {}", c.name, c.type_name);
        if !c.nullable {
            line.push_str(" not null");
        }
        if let Some(d) = &c.default {
            let _ = write!(line, " default {d}");
        }
        let _ = writeln!(out, "{line}");
    }
    for (cname, def) in &table.constraints {
        let _ = writeln!(out, "  constraint {cname}: {def}");
    }
    for (iname, def) in &table.indexes {
        if table.constraints.contains_key(iname) {
            continue; // the constraint above says it
        }
        let how = def.split_once(" USING ").map_or(def.as_str(), |(_, rest)| rest);
        let unique = if def.starts_with("CREATE UNIQUE") { "unique " } else { "" };
        let _ = writeln!(out, "  {unique}index {iname}: {how}");
    }
    for tname in table.triggers.keys() {
        let _ = writeln!(out, "  trigger {tname}");
    }
}
