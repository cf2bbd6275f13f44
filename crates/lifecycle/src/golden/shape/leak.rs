//! The leak check: after masking, no source value of a masked column is left
//! in the golden. Two searches, each exact over every row:
//!
//! 1. each masked column holds only masked values (every value is one its
//!    map gave, or one kept because there was nothing in it to change);
//! 2. no column anywhere holds one of the masked columns' source values,
//!    whole or inside its text (a ticket quoting an email address, an array
//!    or a search vector holding one, a JSON document, bytes, XML): the
//!    daemon reads every value of every column but numbers, dates, times and
//!    booleans, and looks for all the source values at once (Aho-Corasick,
//!    case-insensitive). Source values of 8 characters or more are looked
//!    for, but not those of `noise` and `date_shift` columns, whose dates
//!    and amounts other columns hold by right.
//!
//! The source values are read from the maps in the staging server into the
//! daemon's memory only; none is ever part of a statement's text.

use aho_corasick::AhoCorasick;
use futures_util::TryStreamExt;

use super::mask::{Domain, Plan};
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

/// Runs both searches, filling each column's `leaks` and `checked`.
pub async fn check(
    plan: &Plan,
    leaves: &[Leaf],
    admin: &Admin,
    columns: &mut [MaskedColumn],
) -> Result<LeakSearch> {
    let c = admin.client();
    // 1. Each masked column, every row.
    for (i, p) in plan.columns.iter().enumerate() {
        let leaf = &leaves[p.leaf];
        let col = quote_ident(&p.column);
        let map = Domain::map(p.domain);
        let sql = format!(
            "SELECT count(*) FROM ONLY {} t
              WHERE t.{col} IS NOT NULL
                AND NOT EXISTS (SELECT 1 FROM {map} m WHERE m.dst = t.{col}::text AND (m.kept OR m.dst IS DISTINCT FROM m.src))",
            leaf.sql
        );
        let n: i64 = c.query_one(&sql, &[]).await.map_err(failed)?.cell(0)?;
        columns[i].leaks = n as u64;
        columns[i].checked = "every value".into();
        let kept = format!(
            "SELECT count(DISTINCT t.{col}) FROM ONLY {} t JOIN {map} m ON m.src = t.{col}::text AND m.kept",
            leaf.sql
        );
        columns[i].kept = c.query_one(&kept, &[]).await.map_err(failed)?.cell::<i64>(0)? as u64;
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
    let sources = identifying
        .iter()
        .map(|m| format!("SELECT src FROM {m} WHERE NOT kept AND length(src) >= 8"))
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
    let finder = AhoCorasick::builder()
        .ascii_case_insensitive(true)
        .build(&needles)
        .map_err(|e| Error::internal(format!("building the leak search failed: {e}")))?;
    drop(needles);
    for leaf in leaves {
        let searched: Vec<(&str, String)> = leaf
            .columns
            .iter()
            .filter(|col| !matches!(col.ty, ColumnType::Number | ColumnType::Date))
            .filter(|col| !NOT_SEARCHED.contains(&col.type_sql.as_str()) && !col.type_sql.starts_with("bit"))
            .map(|col| {
                let q = quote_ident(&col.name);
                // Bytes as text, printable ones as they are.
                let text = match col.type_sql.as_str() {
                    "bytea" => format!("pg_catalog.encode({q}, 'escape')"),
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
                    if finder.is_match(v) {
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
    Ok(search)
}
