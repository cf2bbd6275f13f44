//! Rows a foreign key left `NOT VALID` does not hold: a file that drops a
//! key, deletes the rows it protected, and adds the key again `NOT VALID`
//! keeps the key in name, and every row that now points at nothing stays.
//! Nothing fails (a `NOT VALID` key checks only new writes), so the rows
//! are counted on the fork after the file: each such key's rows whose
//! columns are all set and match no row of the table it points at.
//!
//! The count is the reader's (`pg_airlock.orphan_count`), never the
//! admin's: planning any query of a candidate's table can run code it put
//! there (a partial index's predicate), so it runs with the reader's rights
//! alone, in a transaction rolled back after it, on keys of PostgreSQL's own
//! types compared with `OPERATOR(pg_catalog.=)`, all keys within one budget.
//! A count that fails or runs out of time is said, not dropped.

use airlock_postgres::catalog::Catalog;
use airlock_postgres::cell::Cell as _;

use super::report::{Hazard, Severity, StatementReport};

/// How long counting every key's rows may take, all keys together.
const COUNT_BUDGET_MS: u64 = 20_000;

/// One `NOT VALID` foreign key.
struct Key {
    name: String,
    table: String,
    columns: Vec<String>,
    parent: String,
    parent_columns: Vec<String>,
}

/// Every `NOT VALID` foreign key whose columns are all of PostgreSQL's own types.
async fn not_valid(client: &tokio_postgres::Client) -> Result<Vec<Key>, tokio_postgres::Error> {
    let rows = client
        .query(
            &format!(
                "SELECT k.conname::pg_catalog.text,
                        pg_catalog.quote_ident(n.nspname) OPERATOR(pg_catalog.||) '.' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(c.relname),
                        (SELECT pg_catalog.array_agg(a.attname::pg_catalog.text ORDER BY u.o) FROM pg_catalog.unnest(k.conkey) WITH ORDINALITY AS u(n, o)
                           JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) k.conrelid AND a.attnum OPERATOR(pg_catalog.=) u.n),
                        pg_catalog.quote_ident(pn.nspname) OPERATOR(pg_catalog.||) '.' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(p.relname),
                        (SELECT pg_catalog.array_agg(a.attname::pg_catalog.text ORDER BY u.o) FROM pg_catalog.unnest(k.confkey) WITH ORDINALITY AS u(n, o)
                           JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) k.confrelid AND a.attnum OPERATOR(pg_catalog.=) u.n)
                   FROM pg_catalog.pg_constraint k
                   JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) k.conrelid
                   JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
                   JOIN pg_catalog.pg_class p ON p.oid OPERATOR(pg_catalog.=) k.confrelid
                   JOIN pg_catalog.pg_namespace pn ON pn.oid OPERATOR(pg_catalog.=) p.relnamespace
                  WHERE k.contype OPERATOR(pg_catalog.=) 'f' AND NOT k.convalidated AND k.conparentid OPERATOR(pg_catalog.=) 0
                    AND {}
                    AND NOT EXISTS (SELECT FROM pg_catalog.pg_attribute a
                                     WHERE a.attrelid OPERATOR(pg_catalog.=) k.conrelid
                                       AND a.attnum OPERATOR(pg_catalog.=) ANY (k.conkey)
                                       AND a.atttypid OPERATOR(pg_catalog.>=) 16384)",
                airlock_postgres::catalog::SYSTEM_SCHEMAS
            ),
            &[],
        )
        .await?;
    let mut out = Vec::new();
    for r in rows {
        let (Ok(name), Ok(table), Ok(Some(columns)), Ok(parent), Ok(Some(parent_columns))) = (
            r.cell(0),
            r.cell(1),
            r.cell::<Option<Vec<String>>>(2),
            r.cell(3),
            r.cell::<Option<Vec<String>>>(4),
        ) else {
            continue;
        };
        if columns.len() == parent_columns.len() {
            out.push(Key { name, table, columns, parent, parent_columns });
        }
    }
    Ok(out)
}

/// The rows of `k`'s table that point at nothing, counted by the reader
/// (never the admin: planning a query of the table can run code the
/// candidate put in its indexes), in a transaction rolled back after it,
/// within `timeout_ms`.
async fn count(client: &tokio_postgres::Client, k: &Key, timeout_ms: u64) -> Option<i64> {
    let grants = format!(
        "{}; {}",
        airlock_postgres::catalog::reader_grant(&k.table),
        airlock_postgres::catalog::reader_grant(&k.parent)
    );
    let query = "SELECT pg_airlock.orphan_count($1::text::pg_catalog.regclass, $2, $3::text::pg_catalog.regclass, $4)";
    let counted = async {
        client.batch_execute(&format!("BEGIN; SET LOCAL statement_timeout = {timeout_ms}; {grants}")).await?;
        client.query_one(query, &[&k.table, &k.columns, &k.parent, &k.parent_columns]).await
    }
    .await;
    let _ = client.batch_execute("ROLLBACK").await;
    counted.ok().and_then(|r| r.cell::<i64>(0).ok())
}

/// An `integrity_removed` hazard for each `NOT VALID` foreign key of a
/// golden table that rows break after the candidate: high where the golden
/// held the key on the same columns checked (the file made it again over
/// rows that break it), medium otherwise (its `VALIDATE` will fail).
pub async fn hazards(
    client: &tokio_postgres::Client,
    golden: &Catalog,
    statements: &[StatementReport],
) -> airlock_core::error::Result<Vec<Hazard>> {
    airlock_postgres::catalog::ensure_reader(client).await?;
    let pinned = airlock_postgres::catalog::Pinned::pin(client).await?;
    let keys = not_valid(client).await;
    let began = std::time::Instant::now();
    let mut out = Vec::new();
    for k in keys.iter().flatten() {
        let Some(was) = golden.tables.get(&k.table) else { continue };
        let left = COUNT_BUDGET_MS.saturating_sub(began.elapsed().as_millis() as u64);
        let line = super::lines::naming(statements.iter().rev(), &k.name);
        // A count that fails or runs out of time is said, not dropped: a
        // candidate could make counting slow to hide what it broke.
        let Some(n) = (if left > 0 { count(client, k, left).await } else { None }) else {
            out.push(Hazard::new(
                "integrity_removed",
                Severity::Medium,
                format!(
                    "foreign key {} of {} is NOT VALID, and whether rows of {} point at no row of {} could not be counted \
                     (it failed, or all such counts took more than {} s): its VALIDATE CONSTRAINT may fail",
                    k.name,
                    k.table,
                    k.table,
                    k.parent,
                    COUNT_BUDGET_MS / 1000
                ),
                line,
            ));
            continue;
        };
        if n == 0 {
            continue;
        }
        let checked_before = was.constraints.values().any(|d| {
            d.starts_with("FOREIGN KEY (")
                && !d.ends_with("NOT VALID")
                && super::definitions::key_columns(d) == k.columns
        });
        let rows = if n == 1 { "row" } else { "rows" };
        let (severity, message) = match checked_before {
            true => (
                Severity::High,
                format!(
                    "foreign key {} of {} is NOT VALID now, where it was checked, and {n} {rows} of {} point at no row of {}: \
                     the key holds only for new writes, and what it guarded is broken",
                    k.name, k.table, k.table, k.parent
                ),
            ),
            false => (
                Severity::Medium,
                format!(
                    "foreign key {} of {} is NOT VALID, and {n} {rows} of {} point at no row of {}: its VALIDATE CONSTRAINT will fail",
                    k.name, k.table, k.table, k.parent
                ),
            ),
        };
        let mut h = Hazard::new("integrity_removed", severity, message, line);
        h.suggestion = Some(format!(
            "delete or mend the rows that point at nothing (or delete the rows they point at with the key still checked, ON DELETE as it was), then VALIDATE CONSTRAINT {}",
            k.name
        ));
        out.push(h);
    }
    pinned.restore(client).await?;
    Ok(out)
}
