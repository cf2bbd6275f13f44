//! Materialized views a candidate leaves harder to use: one that lost the
//! unique index `REFRESH MATERIALIZED VIEW CONCURRENTLY` needs, and one left
//! without data. Dropping and making a view again (to change what it shows)
//! takes its indexes with it, and nothing in the new definition says one is
//! missing: the next concurrent refresh fails, and the refresh that still
//! works blocks every reader of the view while it runs. Made again `WITH NO
//! DATA` (or refreshed so), every query that reads it fails until a plain
//! refresh fills it.
//!
//! Neither a view's indexes nor whether it holds data are in the catalog the
//! golden keeps, so both are read on the fork before the candidate runs and
//! after.

use std::collections::BTreeMap;

use airlock_core::error::{Error, Result};
use airlock_postgres::cell::Cell as _;

use crate::report::{Hazard, Severity, StatementReport};

/// What a materialized view offers its readers.
#[derive(Debug, Default)]
pub struct View {
    /// Whether it holds data (`pg_class.relispopulated`): one without fails every read.
    pub populated: bool,
    /// Its unique indexes that a concurrent refresh can use (on columns
    /// only, with no `WHERE`), by name, each with its columns.
    pub keys: BTreeMap<String, String>,
}

/// Every materialized view, by `schema.name`.
pub type Views = BTreeMap<String, View>;

/// Every materialized view, read from an admin session.
pub async fn read(client: &tokio_postgres::Client) -> Result<Views> {
    let rows = client
        .query(
            &format!(
                "SELECT pg_catalog.quote_ident(n.nspname) OPERATOR(pg_catalog.||) '.' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(c.relname),
                        c.relispopulated,
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
    let mut out = Views::new();
    for r in rows {
        let view = out.entry(r.cell(0)?).or_default();
        view.populated = r.cell(1)?;
        // (A view without such an index is listed with none.)
        if let Some(index) = r.cell::<Option<String>>(2)? {
            view.keys.insert(index, r.cell::<Option<String>>(3)?.unwrap_or_default());
        }
    }
    Ok(out)
}

/// An `integrity_removed` hazard for each materialized view that had a
/// unique index a concurrent refresh can use before the candidate, is one
/// after it, and has none now (a view dropped for good, or made a plain
/// view, is told otherwise).
pub fn keys_lost(before: &Views, after: &Views, statements: &[StatementReport]) -> Vec<Hazard> {
    let mut out = Vec::new();
    for (view, was) in before {
        if after.get(view).is_none_or(|now| !now.keys.is_empty()) {
            continue;
        }
        let Some((index, columns)) = was.keys.iter().next() else { continue };
        let naming = |name: &str| crate::lines::naming(statements.iter(), name);
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

/// A `matview_unpopulated` hazard for each materialized view that held data
/// before the candidate and is, under the same name, one without data after
/// it: made again `WITH NO DATA`, or refreshed so. Its line is the last
/// statement that names the view and says `WITH NO DATA`, else the last that
/// names it.
pub fn left_empty(before: &Views, after: &Views, statements: &[StatementReport]) -> Vec<Hazard> {
    let mut out = Vec::new();
    for (view, was) in before {
        if !was.populated || after.get(view).is_none_or(|now| now.populated) {
            continue;
        }
        let name = airlock_postgres::catalog::split_qualified(view).1.to_ascii_lowercase();
        let naming = |s: &&StatementReport| {
            !s.rolled_back && crate::lines::names_word(&crate::lines::without_comments(&s.sql), &name)
        };
        let says_no_data =
            |s: &&StatementReport| crate::lines::without_comments(&s.sql).contains("with no data");
        let line = statements
            .iter()
            .rev()
            .find(|s| naming(s) && says_no_data(s))
            .or_else(|| statements.iter().rev().find(naming))
            .map(|s| s.line)
            .filter(|l| *l > 0);
        let mut h = Hazard::new(
            "matview_unpopulated",
            Severity::High,
            format!(
                "materialized view {view} is left without data: every query that reads it fails \
                 (\"materialized view has not been populated\") until a REFRESH MATERIALIZED VIEW \
                 without CONCURRENTLY fills it, and that refresh blocks every reader of the view while it runs"
            ),
            line,
        );
        h.suggestion = Some(format!(
            "make it WITH DATA, or fill it in the same migration: REFRESH MATERIALIZED VIEW {view}"
        ));
        out.push(h);
    }
    out
}
