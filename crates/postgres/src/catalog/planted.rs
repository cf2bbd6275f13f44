//! What could steer a session other than the one that put it there: settings
//! stored for a database or role (`ALTER DATABASE/ROLE ... SET`), and
//! application objects named like PostgreSQL's own (a `public.lower(varchar)`
//! wins over `pg_catalog.lower(text)` for a varchar argument; a `public.pg_class`
//! is read by a session whose search path puts `public` first).
//!
//! Sandboxes never get such settings (the in-server guard refuses them), but a
//! sandbox's objects are the agent's to make. A promotion to a golden reports and
//! refuses them unless told to keep them, and a migration test reports a
//! candidate that makes them.

use crate::cell::Cell;
use serde::{Deserialize, Serialize};

use airlock_core::error::{Error, Result};

/// One thing found.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Planted {
    /// `setting`, `function`, `operator`, `relation` or `type`.
    pub kind: String,
    /// What it is, as a person would write it (names quoted where SQL would
    /// need them, so no two objects read alike).
    pub what: String,
}

impl std::fmt::Display for Planted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.kind, self.what)
    }
}

/// Application schemas (as in the catalog reader), and not an extension's object.
const APP_OBJECT: &str = "n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\\_%' \
    AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend d WHERE d.objid = o.oid AND d.deptype = 'e')";

/// Reads what is planted in the database `client` is connected to (as the
/// admin role, whose session's search path is pinned).
pub async fn read(client: &tokio_postgres::Client) -> Result<Vec<Planted>> {
    let queries = [
        (
            "setting",
            "SELECT coalesce('database ' || pg_catalog.quote_ident(d.datname), 'every database') || ', ' ||
                    coalesce('role ' || pg_catalog.quote_ident(r.rolname), 'every role') || ': ' ||
                    pg_catalog.array_to_string(s.setconfig, ', ')
             FROM pg_catalog.pg_db_role_setting s
             LEFT JOIN pg_catalog.pg_database d ON d.oid = s.setdatabase
             LEFT JOIN pg_catalog.pg_roles r ON r.oid = s.setrole"
                .to_owned(),
        ),
        (
            "function",
            format!(
                "SELECT pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(o.proname) || '(' || pg_catalog.pg_get_function_identity_arguments(o.oid) || ')'
                 FROM pg_catalog.pg_proc o JOIN pg_catalog.pg_namespace n ON n.oid = o.pronamespace
                 WHERE {APP_OBJECT} AND EXISTS (SELECT 1 FROM pg_catalog.pg_proc c
                   WHERE c.pronamespace = 'pg_catalog'::pg_catalog.regnamespace AND c.proname = o.proname)"
            ),
        ),
        (
            "operator",
            format!(
                "SELECT pg_catalog.quote_ident(n.nspname) || '.' || o.oprname || ' (' ||
                        coalesce(pg_catalog.format_type(o.oprleft, NULL), 'none') || ', ' ||
                        coalesce(pg_catalog.format_type(o.oprright, NULL), 'none') || ')'
                 FROM pg_catalog.pg_operator o JOIN pg_catalog.pg_namespace n ON n.oid = o.oprnamespace
                 WHERE {APP_OBJECT} AND EXISTS (SELECT 1 FROM pg_catalog.pg_operator c
                   WHERE c.oprnamespace = 'pg_catalog'::pg_catalog.regnamespace AND c.oprname = o.oprname)"
            ),
        ),
        (
            "relation",
            format!(
                "SELECT pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(o.relname)
                 FROM pg_catalog.pg_class o JOIN pg_catalog.pg_namespace n ON n.oid = o.relnamespace
                 WHERE {APP_OBJECT} AND EXISTS (SELECT 1 FROM pg_catalog.pg_class c
                   WHERE c.relnamespace = 'pg_catalog'::pg_catalog.regnamespace AND c.relname = o.relname)"
            ),
        ),
        (
            "type",
            format!(
                "SELECT pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(o.typname)
                 FROM pg_catalog.pg_type o JOIN pg_catalog.pg_namespace n ON n.oid = o.typnamespace
                 WHERE {APP_OBJECT} AND o.typrelid = 0 AND EXISTS (SELECT 1 FROM pg_catalog.pg_type c
                   WHERE c.typnamespace = 'pg_catalog'::pg_catalog.regnamespace AND c.typname = o.typname)"
            ),
        ),
    ];
    let mut found = Vec::new();
    for (kind, sql) in queries {
        let rows = client.query(sql.as_str(), &[]).await.map_err(|e| {
            Error::postgres(format!(
                "looking for planted settings and objects failed: {}",
                crate::admin::describe(&e)
            ))
        })?;
        for r in rows {
            found.push(Planted { kind: kind.to_owned(), what: r.cell(0)? });
        }
    }
    found.sort();
    Ok(found)
}

/// A sentence listing what was found (at most `max` items, then a count).
pub fn list(found: &[Planted], max: usize) -> String {
    let mut shown: Vec<String> = found.iter().take(max).map(|p| p.to_string()).collect();
    if found.len() > max {
        shown.push(format!("and {} more", found.len() - max));
    }
    shown.join("; ")
}
