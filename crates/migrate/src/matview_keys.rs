//! A materialized view that lost the unique index `REFRESH MATERIALIZED VIEW
//! CONCURRENTLY` needs. Dropping and making the view again (to change what
//! it shows) takes its indexes with it, and nothing in the new definition
//! says one is missing: the next concurrent refresh fails, and the refresh
//! that still works blocks every reader of the view while it runs.
//!
//! The view's indexes are not in the catalog the golden keeps, so they are
//! read on the fork before the candidate runs and after.

use std::collections::BTreeMap;

use airlock_core::error::{Error, Result};
use airlock_postgres::cell::Cell as _;

use crate::report::{Hazard, Severity, StatementReport};

/// By materialized view (`schema.name`, every one): its unique indexes that a
/// concurrent refresh can use (on columns only, with no `WHERE`), by name,
/// each with its columns.
pub type Keys = BTreeMap<String, BTreeMap<String, String>>;

/// The unique indexes of every materialized view that a concurrent refresh
/// can use, read from an admin session.
pub async fn read(client: &tokio_postgres::Client) -> Result<Keys> {
    let rows = client
        .query(
            &format!(
                "SELECT pg_catalog.quote_ident(n.nspname) OPERATOR(pg_catalog.||) '.' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(c.relname),
                        pg_catalog.quote_ident(ic.relname),
                        (SELECT pg_catalog.string_agg(pg_catalog.quote_ident(a.attname), ', ' ORDER BY k.ord)
                           FROM pg_catalog.unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
                           JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) c.oid AND a.attnum OPERATOR(pg_catalog.=) k.attnum)
                   FROM pg_catalog.pg_class c
                   JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
                   LEFT JOIN pg_catalog.pg_index i ON i.indrelid OPERATOR(pg_catalog.=) c.oid AND i.indisunique AND i.indisvalid
                        AND i.indpred IS NULL AND i.indexprs IS NULL
                   LEFT JOIN pg_catalog.pg_class ic ON ic.oid OPERATOR(pg_catalog.=) i.indexrelid
                  WHERE c.relkind OPERATOR(pg_catalog.=) 'm' AND {}",
                airlock_postgres::catalog::SYSTEM_SCHEMAS
            ),
            &[],
        )
        .await
        .map_err(|e| Error::postgres(airlock_postgres::admin::describe(&e)))?;
    let mut out = Keys::new();
    for r in rows {
        let keys = out.entry(r.cell(0)?).or_default();
        // (A view without such an index is listed with none.)
        if let Some(index) = r.cell::<Option<String>>(1)? {
            keys.insert(index, r.cell::<Option<String>>(2)?.unwrap_or_default());
        }
    }
    Ok(out)
}

/// An `integrity_removed` hazard for each materialized view that had a
/// unique index a concurrent refresh can use before the candidate, is one
/// after it, and has none now (a view dropped for good, or made a plain
/// view, is told otherwise).
pub fn hazards(before: &Keys, after: &Keys, statements: &[StatementReport]) -> Vec<Hazard> {
    let mut out = Vec::new();
    for (view, indexes) in before {
        if after.get(view).is_none_or(|now| !now.is_empty()) {
            continue;
        }
        let Some((index, columns)) = indexes.iter().next() else { continue };
        let naming = |name: &str| crate::integrity::naming(statements.iter(), name);
        let line = naming(index).or_else(|| naming(view));
        let mut h = Hazard::new(
            "integrity_removed",
            Severity::High,
            format!(
                "materialized view {view} no longer has unique index {index} on ({columns}): \
                 REFRESH MATERIALIZED VIEW CONCURRENTLY on it now fails, and a refresh without \
                 CONCURRENTLY blocks every reader of the view while it runs"
            ),
            line,
        );
        h.suggestion = Some(format!(
            "make the index again in the same migration, after the view: CREATE UNIQUE INDEX {index} ON {view} ({columns})"
        ));
        out.push(h);
    }
    out
}
