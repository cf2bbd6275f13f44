//! The fidelity report of an import: the source's catalog, rows and extensions
//! against the golden's, and what was made of its roles. A build whose golden
//! differs from its source beyond what was asked to be left out fails.

use std::collections::BTreeMap;

use crate::golden::source::SourceFacts;
use airlock_postgres::catalog::{diff, Catalog, Snapshot};
use airlock_postgres::imported::Exclusions;
use airlock_postgres::imported::{Imported, Report};

/// The source's `public` schema as its golden has it. The source's belongs to
/// the database's owner (`pg_database_owner`, PostgreSQL 15's default) or,
/// before 15, to the bootstrap superuser; a golden's belongs to the owner role,
/// which stands for the application's owner: the same meaning.
fn public_as_golden(definition: &str, facts: &SourceFacts) -> String {
    let Some(rest) = definition.strip_prefix("owner ") else { return definition.to_owned() };
    let (owner, grants) = rest.split_once("; grants ").map_or((rest, None), |(o, g)| (o, Some(g)));
    let stands_for_owner = owner == "pg_database_owner" || facts.roles.get(owner).is_none_or(|a| a.superuser);
    if !stands_for_owner {
        return definition.to_owned();
    }
    let role = airlock_core::dsn::OWNER_ROLE;
    let rename = |name: &str| if name == owner { role.to_owned() } else { name.to_owned() };
    let mut out = format!("owner {role}");
    if let Some(grants) = grants {
        let mut items: Vec<String> = grants
            .split(',')
            .map(|item| {
                let (grantee, rest) = item.split_once('=').unwrap_or(("", item));
                let (privileges, grantor) = rest.split_once('/').unwrap_or((rest, ""));
                format!("{}={privileges}/{}", rename(grantee), rename(grantor))
            })
            .collect();
        items.sort();
        out.push_str(&format!("; grants {}", items.join(",")));
    }
    out
}

/// Compares a live source with the golden built from it.
pub fn compare(facts: &SourceFacts, golden: &Snapshot, imported: &Imported, excluded: &Exclusions) -> Report {
    let mut source = without(&facts.catalog, excluded);
    if let Some(public) = source.objects.as_mut().and_then(|o| o.get_mut("schema public")) {
        public.definition = public_as_golden(&public.definition, facts);
    }
    let superusers: Vec<&String> = facts.roles.iter().filter(|(_, a)| a.superuser).map(|(n, _)| n).collect();
    let mut catalog_differences: Vec<String> = diff::diff(&source, &golden.catalog)
        .iter()
        // Event triggers and subscriptions are never carried, and the agent
        // role of a source that was a sandbox is folded into the owner role:
        // the report says so.
        .filter(|c| !c.name.starts_with("event trigger ") && !c.name.starts_with("subscription "))
        // Nor are extensions that reach outside a fork, unless asked for.
        .filter(|c| {
            !imported.left_out_extensions.iter().any(|e| {
                (c.object == "extension" && c.name == *e) || c.name == format!("comment on extension {e}")
            })
        })
        // Entries PostgreSQL cannot print are digests of catalog rows, which
        // hold object ids that differ between two databases: across databases
        // they are compared by presence alone.
        .filter(|c| {
            !(c.change == "changed"
                && [&c.before, &c.after]
                    .iter()
                    .all(|d| d.as_deref().is_some_and(|d| d.starts_with("digest "))))
        })
        .filter(|c| {
            ![&c.name, c.before.as_deref().unwrap_or(""), c.after.as_deref().unwrap_or("")]
                .iter()
                .any(|t| t.contains(airlock_core::dsn::AGENT_ROLE))
        })
        // What extensions made belongs to whoever installed them: a superuser
        // of the source's, the admin in the golden.
        .filter(|c| {
            let (Some(before), Some(after)) = (&c.before, &c.after) else { return true };
            !superusers.iter().any(|s| before.replace(s.as_str(), airlock_core::dsn::ADMIN_ROLE) == *after)
        })
        .map(|c| c.line())
        .collect();
    catalog_differences.sort();
    let mut row_differences = Vec::new();
    for (table, rows) in &facts.rows {
        let got = golden.rows.get(table).map(|r| r.rows);
        if got != Some(*rows) {
            row_differences.push(format!(
                "{table}: {rows} rows in the source, {} in the golden",
                got.map_or("none".into(), |g| g.to_string())
            ));
        }
    }
    let installed: BTreeMap<&str, &str> =
        imported.extensions.iter().map(|e| (e.name.as_str(), e.version.as_str())).collect();
    let extension_differences = facts
        .extensions
        .iter()
        .filter(|e| !excluded.schemas.iter().any(|s| s == &e.schema))
        .filter(|e| !imported.left_out_extensions.contains(&e.name))
        .filter_map(|e| match installed.get(e.name.as_str()) {
            Some(v) if *v == e.version => None,
            Some(v) => Some(format!("extension {}: {} in the source, {v} in the golden", e.name, e.version)),
            None => Some(format!("extension {}: {} in the source, not in the golden", e.name, e.version)),
        })
        .collect();
    Report {
        source_version: Some(facts.server_version.clone()),
        tables: golden.catalog.tables.len(),
        rows: golden.rows.values().map(|r| r.rows).sum(),
        row_differences,
        catalog_differences,
        extension_differences,
        imported: imported.clone(),
        excluded: excluded.clone(),
        compared: true,
        ..Default::default()
    }
}

/// What a dump file's import can say without a live source to compare with.
/// Every table its table of contents lists must be in the golden.
pub fn of_dump(golden: &Snapshot, imported: &Imported) -> Report {
    let catalog_differences = imported
        .listed_tables
        .iter()
        .filter(|t| !golden.catalog.tables.contains_key(t.as_str()))
        .map(|t| format!("- table {t} (listed in the dump, not in the golden)"))
        .collect();
    Report {
        catalog_differences,
        tables: golden.catalog.tables.len(),
        rows: golden.rows.values().map(|r| r.rows).sum(),
        imported: imported.clone(),
        ..Default::default()
    }
}

/// `catalog` without what `excluded` leaves out.
fn without(catalog: &Catalog, excluded: &Exclusions) -> Catalog {
    if excluded.is_empty() {
        return catalog.clone();
    }
    let mut c = catalog.clone();
    c.tables.retain(|name, _| !excluded.leaves_out(name));
    let in_left_out_schema = |name: &str| {
        name.split_once('.').is_some_and(|(schema, _)| excluded.schemas.iter().any(|s| s == schema))
    };
    c.views.retain(|name, _| !in_left_out_schema(name));
    c.functions.retain(|name, _| !in_left_out_schema(name));
    c.sequences.retain(|name, _| !excluded.leaves_out(name));
    c.types.retain(|name, _| !in_left_out_schema(name));
    if let Some(objects) = c.objects.as_mut() {
        // Entries name their table or schema in words: `policy p on table app.audit`.
        objects.retain(|name, _| {
            !name.split_whitespace().any(|w| w.contains('.') && excluded.leaves_out(w.trim_matches('"')))
                && !excluded.schemas.iter().any(|s| name.ends_with(&format!("schema {s}")))
        });
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::golden::source::RoleAttributes;
    use airlock_postgres::catalog::{RowCount, Table};
    use airlock_postgres::imported::Extension;

    fn facts() -> SourceFacts {
        let mut catalog = Catalog::default();
        for name in ["app.orders", "app.audit"] {
            catalog.tables.insert(name.into(), Table { kind: "table".into(), ..Default::default() });
        }
        SourceFacts {
            server_version: "15.8".into(),
            extensions: vec![Extension {
                name: "postgis".into(),
                version: "3.3.2".into(),
                schema: "public".into(),
            }],
            roles: [(
                "postgres".to_owned(),
                RoleAttributes { inherit: true, bypassrls: true, superuser: true },
            )]
            .into(),
            catalog,
            rows: [("app.orders".to_owned(), 10), ("app.audit".to_owned(), 5)].into(),
            ..Default::default()
        }
    }

    fn golden(facts: &SourceFacts, orders: i64) -> Snapshot {
        let mut rows = BTreeMap::new();
        rows.insert("app.orders".into(), RowCount { rows: orders, exact: true });
        rows.insert("app.audit".into(), RowCount { rows: 5, exact: true });
        Snapshot { catalog: facts.catalog.clone(), rows, ..Default::default() }
    }

    fn imported(version: &str) -> Imported {
        Imported {
            extensions: vec![Extension {
                name: "postgis".into(),
                version: version.into(),
                schema: "public".into(),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_faithful_golden_passes_and_every_kind_of_difference_fails() {
        let f = facts();
        let none = Exclusions::default();
        assert!(!compare(&f, &golden(&f, 10), &imported("3.3.2"), &none).differs());

        let rows = compare(&f, &golden(&f, 9), &imported("3.3.2"), &none);
        assert_eq!(rows.row_differences, ["app.orders: 10 rows in the source, 9 in the golden"]);

        let version = compare(&f, &golden(&f, 10), &imported("3.4.0"), &none);
        assert_eq!(
            version.extension_differences,
            ["extension postgis: 3.3.2 in the source, 3.4.0 in the golden"]
        );

        let mut missing = golden(&f, 10);
        missing.catalog.tables.remove("app.audit");
        missing.rows.remove("app.audit");
        let report = compare(&f, &missing, &imported("3.3.2"), &none);
        assert!(report.differs());
        assert!(report.catalog_differences.iter().any(|d| d.contains("app.audit")), "{report:?}");
        assert!(report.row_differences.iter().any(|d| d.contains("app.audit")), "{report:?}");

        // What was left out on purpose is no difference.
        let mut left_out = facts();
        left_out.rows.remove("app.audit");
        let asked = Exclusions { tables: vec!["app.audit".into()], schemas: vec![] };
        assert!(!compare(&left_out, &missing, &imported("3.3.2"), &asked).differs());
    }
}
