//! The leak check: after masking, no source value of a masked column is left
//! in the golden. Two searches, each exact over every row:
//!
//! 1. each masked column holds only masked values (every value is one its
//!    map gave, or one kept because there was nothing in it to change);
//! 2. no column anywhere holds one of the masked columns' source values,
//!    whole or inside its text (a ticket quoting an email address, an array
//!    or a search vector holding one, a JSON document, bytes, XML): the
//!    daemon reads every value of every column but dates, times and
//!    booleans (and every large object), and looks for all the source values
//!    at once ([`Needles`]), whatever their case, with `%XX` escapes read and
//!    `json` read as `jsonb` (so `\u0040` is `@`). The values inside JSON
//!    documents a `json` rule replaced are looked for too. Source values of 8
//!    characters or more (6 with an `@`, a digit or a space) are looked for,
//!    but not those of `noise` and `date_shift` columns, whose dates and
//!    amounts other columns hold by right.
//!
//! The source values are read from the maps in the staging server into the
//! daemon's memory only; none is ever part of a statement's text.

use futures_util::TryStreamExt;

use super::mask::{Domain, Plan};
use super::needles::Needles;
use super::tables::{failed, Leaf};
use airlock_core::error::{Error, Result};
use airlock_core::records::masking::{LeakSearch, MaskedColumn};
use airlock_mask::{ColumnType, Transformer};
use airlock_postgres::admin::Admin;
use airlock_postgres::catalog::quote_ident;
use airlock_postgres::cell::Cell;

/// Types whose values are numbers or instants, whose text is no one's.
const NOT_SEARCHED: &[&str] =
    &["boolean", "interval", "time without time zone", "time with time zone", "money", "oid", "pg_lsn"];

/// Runs both searches, filling each column's `leaks` and `checked`, in the
/// owner role's session `owner` (every value is cast to text, and a cast may
/// be the dump's own).
pub async fn check(
    plan: &Plan,
    leaves: &[Leaf],
    owner: &Admin,
    columns: &mut [MaskedColumn],
) -> Result<LeakSearch> {
    let c = owner.client();
    // 1. Each masked column, every row.
    for (i, p) in plan.columns.iter().enumerate() {
        let leaf = &leaves[p.leaf];
        let col = quote_ident(&p.column);
        let map = Domain::map(p.domain);
        // One read of the column: rows holding no value its map gave, and
        // the distinct values kept as they were.
        let sql = format!(
            "SELECT count(*) FILTER (WHERE NOT EXISTS (SELECT 1 FROM {map} m WHERE m.dst = t.{col}::text
                                                         AND (m.kept OR m.dst IS DISTINCT FROM m.src))),
                    count(DISTINCT t.{col}::text) FILTER (WHERE EXISTS (SELECT 1 FROM {map} m
                                                         WHERE m.src = t.{col}::text AND m.kept))
               FROM ONLY {} t WHERE t.{col} IS NOT NULL",
            leaf.sql
        );
        let row = c.query_one(&sql, &[]).await.map_err(failed)?;
        columns[i].leaks = row.cell::<i64>(0)? as u64;
        columns[i].kept = row.cell::<i64>(1)? as u64;
        columns[i].checked = "every value".into();
    }
    // 2. Source values anywhere, whole or inside.
    let mut search = LeakSearch::default();
    let identifying: Vec<String> = plan
        .domains
        .iter()
        .enumerate()
        .filter(|(_, d)| !matches!(d.transformer, Transformer::Noise { .. } | Transformer::DateShift { .. }))
        .map(|(i, _)| Domain::map(i))
        .collect();
    if identifying.is_empty() {
        return Ok(search);
    }
    // Long enough to say something of someone: 8 characters, or 6 with an
    // `@`, a digit or a space in them (`li@x.io`, `Ann Lee`).
    let long_enough = "(length(src) >= 8 OR length(src) >= 6 AND src ~ '[@0-9 ]')";
    let sources = identifying
        .iter()
        .map(|m| format!("SELECT src FROM {m} WHERE NOT kept AND {long_enough}"))
        .chain(std::iter::once(format!("SELECT src FROM airlock_mask.inner AS i(src) WHERE {long_enough}")))
        .collect::<Vec<_>>()
        .join(" UNION ");
    let outputs = (0..plan.domains.len())
        .map(|i| format!("SELECT dst FROM {} WHERE dst IS NOT NULL", Domain::map(i)))
        .collect::<Vec<_>>()
        .join(" UNION ALL ");
    // A source value some other value masked into is no one's secret.
    let sql = format!(
        "SELECT s.src FROM ({sources}) s WHERE NOT EXISTS (SELECT 1 FROM ({outputs}) o(dst) WHERE o.dst = s.src)"
    );
    let mut needles: Vec<String> = Vec::new();
    let rows = c.query_raw(&sql, std::iter::empty::<&str>()).await.map_err(failed)?;
    futures_util::pin_mut!(rows);
    while let Some(row) = rows.try_next().await.map_err(failed)? {
        needles.push(row.try_get(0).map_err(|e| Error::postgres(e.to_string()))?);
    }
    search.values = needles.len() as u64;
    if needles.is_empty() {
        return Ok(search);
    }
    let built = std::time::Instant::now();
    let finder = Needles::new(needles);
    tracing::info!(values = search.values, seconds = built.elapsed().as_secs_f64(), "leak search built");
    for leaf in leaves {
        let searched: Vec<(&str, String)> = leaf
            .columns
            .iter()
            .filter(|col| col.ty != ColumnType::Date)
            .filter(|col| !NOT_SEARCHED.contains(&col.type_sql.as_str()) && !col.type_sql.starts_with("bit"))
            .map(|col| {
                let q = quote_ident(&col.name);
                let text = match col.type_sql.as_str() {
                    // Bytes as text, printable ones as they are.
                    "bytea" => format!("pg_catalog.encode({q}, 'escape')"),
                    // `json` keeps its `\u0040` escapes as written; jsonb reads them.
                    "json" => format!("{q}::jsonb::text"),
                    _ => format!("{q}::text"),
                };
                (col.name.as_str(), text)
            })
            .collect();
        if searched.is_empty() {
            continue;
        }
        search.columns_searched += searched.len() as u64;
        let sql = format!(
            "SELECT {} FROM ONLY {}",
            searched.iter().map(|(_, e)| e.as_str()).collect::<Vec<_>>().join(", "),
            leaf.sql
        );
        let mut hits = vec![0u64; searched.len()];
        let rows = c.query_raw(&sql, std::iter::empty::<&str>()).await.map_err(failed)?;
        futures_util::pin_mut!(rows);
        while let Some(row) = rows.try_next().await.map_err(failed)? {
            for (i, hit) in hits.iter_mut().enumerate() {
                let value: Option<&str> = row.try_get(i).map_err(|e| Error::postgres(e.to_string()))?;
                if let Some(v) = value {
                    search.bytes_searched += v.len() as u64;
                    if finder.found_in(v) {
                        *hit += 1;
                    }
                }
            }
        }
        for ((name, _), n) in searched.iter().zip(hits) {
            if n > 0 {
                search
                    .found
                    .push(format!("{}.{name}: {n} rows hold a source value of a masked column", leaf.named));
            }
        }
    }
    // Large objects are data too.
    let objects = c
        .query_raw(
            "SELECT l.oid::text, pg_catalog.encode(pg_catalog.lo_get(l.oid), 'escape') FROM pg_catalog.pg_largeobject_metadata l",
            std::iter::empty::<&str>(),
        )
        .await
        .map_err(failed)?;
    futures_util::pin_mut!(objects);
    while let Some(row) = objects.try_next().await.map_err(failed)? {
        let (oid, data): (String, String) = (
            row.try_get(0).map_err(|e| Error::postgres(e.to_string()))?,
            row.try_get(1).map_err(|e| Error::postgres(e.to_string()))?,
        );
        search.bytes_searched += data.len() as u64;
        if finder.found_in(&data) {
            search.found.push(format!("large object {oid} holds a source value of a masked column"));
        }
    }
    Ok(search)
}
