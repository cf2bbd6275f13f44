//! Whether a golden view the candidate defined otherwise still shows its
//! callers the same rows: its old definition and the view now, each row as
//! JSON (its columns' names and values), compared as multisets on the
//! fork's data.
//!
//! A restyled definition (aliases, `WHERE active` written `WHERE active =
//! true`, a view renamed and one made in its place over it) prints
//! otherwise but reads the same. Equal rows on the golden's data are
//! evidence, not proof (rows the golden does not hold may still differ), so
//! such a view gets a note, not a hazard. Read in a fresh session of the
//! agent, read-only and bounded in time: the definitions may call code the
//! candidate made.

use std::collections::BTreeMap;

use airlock_core::error::Result;
use airlock_lifecycle::engine::Engine;
use airlock_lifecycle::sandbox::Sandbox;
use airlock_postgres::catalog::Catalog;
use airlock_postgres::wire::TextRows;

/// How long one view's comparison may take.
const COMPARE_TIMEOUT: &str = "5s";

/// How many views one candidate's test compares at most (the rest keep their
/// hazard): a file redefining every view does not hold its test for long.
const MOST_COMPARED: usize = 20;

/// The query that counts the rows `now` (a view's name) and `was` (its old
/// definition) do not share, and the rows of `was`.
fn compare_sql(now: &str, was: &str) -> String {
    let was = was.trim().trim_end_matches(';');
    format!(
        "SELECT (SELECT pg_catalog.count(*) FROM (
                  (SELECT pg_catalog.to_jsonb(n) FROM {now} n EXCEPT ALL SELECT pg_catalog.to_jsonb(o) FROM ({was}) o)
                  UNION ALL
                  (SELECT pg_catalog.to_jsonb(o) FROM ({was}) o EXCEPT ALL SELECT pg_catalog.to_jsonb(n) FROM {now} n)) d),
                (SELECT pg_catalog.count(*) FROM ({was}) o)"
    )
}

/// The golden's views of `before` that `after` defines otherwise (by
/// `changed`) and that show the same rows, at least one, as their old
/// definition does on the fork: by name, how many rows.
pub async fn same_rows(
    engine: &Engine,
    sb: &Sandbox,
    (before, after): (&Catalog, &Catalog),
    changed: impl Fn(&str, &str) -> bool,
) -> Result<BTreeMap<String, i64>> {
    let redefined: Vec<(&String, &String)> = before
        .views
        .iter()
        .filter(|(name, was)| after.views.get(*name).is_some_and(|now| changed(was, now)))
        .take(MOST_COMPARED)
        .collect();
    let mut out = BTreeMap::new();
    if redefined.is_empty() {
        return Ok(out);
    }
    let mut session = airlock_lifecycle::sandbox::session::connect(engine, sb).await?;
    for (name, was) in redefined {
        let (schema, view) = airlock_postgres::catalog::split_qualified(name);
        let now = format!(
            "{}.{}",
            airlock_postgres::catalog::quote_ident(&schema),
            airlock_postgres::catalog::quote_ident(&view)
        );
        let sql = format!(
            "BEGIN READ ONLY; SET LOCAL statement_timeout = '{COMPARE_TIMEOUT}'; {}; ROLLBACK",
            compare_sql(&now, was)
        );
        let mut rows = TextRows::default();
        let ran = session.simple_query(&sql, &mut rows).await;
        if ran.is_err() {
            break;
        }
        let counts: Vec<Option<i64>> = rows
            .rows
            .first()
            .map(|r| r.iter().map(|v| v.as_deref().and_then(|v| v.parse().ok())).collect())
            .unwrap_or_default();
        if let (None, [Some(0), Some(shown)]) = (&rows.error, counts.as_slice()) {
            if *shown > 0 {
                out.insert(name.clone(), *shown);
            }
        }
        if rows.error.is_some() {
            let mut ended = TextRows::default();
            if session.simple_query("ROLLBACK", &mut ended).await.is_err() {
                break;
            }
        }
    }
    session.close().await;
    Ok(out)
}
