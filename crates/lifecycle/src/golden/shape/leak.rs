//! The leak check: after masking, no source value of a masked column is left
//! in the golden. Three searches, each exact over every row it reads:
//!
//! 1. each masked column holds only masked values (every value is one its
//!    map gave, or one kept because nothing in it was the source's);
//! 2. no column of text, JSON, UUID or address type anywhere holds a whole
//!    source value of a masked column (values of 8 characters or more, and
//!    not of `noise` or `date_shift` columns, whose source values are dates
//!    and amounts other columns hold by right);
//! 3. no text or JSON column quotes one inside: a sample of those source
//!    values (the same sample every build of the same data) looked for as
//!    substrings of every unmasked text and JSON column.

use super::mask::{Domain, Plan};
use super::tables::{failed, Leaf};
use airlock_core::error::Result;
use airlock_core::records::masking::{LeakSearch, MaskedColumn};
use airlock_mask::{ColumnType, Transformer};
use airlock_postgres::admin::Admin;
use airlock_postgres::catalog::quote_ident;
use airlock_postgres::cell::Cell;

/// How many source values the substring search looks for.
const SUBSTRING_SAMPLE: i64 = 100;

/// Runs the three searches, filling each column's `leaks` and `checked`.
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
    }
    // 2. Whole source values anywhere.
    let identifying: Vec<String> = plan
        .domains
        .iter()
        .enumerate()
        .filter(|(_, d)| !matches!(d.transformer, Transformer::Noise { .. } | Transformer::DateShift { .. }))
        .map(|(i, _)| Domain::map(i))
        .collect();
    let mut search = LeakSearch::default();
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
    admin
        .execute(&format!(
            "CREATE UNLOGGED TABLE airlock_mask.raw AS SELECT src AS v FROM ({sources}) s
               WHERE NOT EXISTS (SELECT 1 FROM ({outputs}) o(dst) WHERE o.dst = s.src);
             CREATE INDEX ON airlock_mask.raw USING hash (v);
             ANALYZE airlock_mask.raw;
             CREATE UNLOGGED TABLE airlock_mask.sample AS SELECT v FROM airlock_mask.raw
               WHERE v !~ '[\\n\\r]' ORDER BY pg_catalog.md5(v) LIMIT {SUBSTRING_SAMPLE};"
        ))
        .await?;
    search.values =
        c.query_one("SELECT count(*) FROM airlock_mask.raw", &[]).await.map_err(failed)?.cell::<i64>(0)?
            as u64;
    search.sampled_for_substrings =
        c.query_one("SELECT count(*) FROM airlock_mask.sample", &[]).await.map_err(failed)?.cell::<i64>(0)?
            as u64;
    admin.execute("SET work_mem = '256MB'").await?;
    for leaf in leaves {
        let mut whole = Vec::new();
        let mut inside = Vec::new();
        for column in &leaf.columns {
            let holds_text = matches!(
                column.ty,
                ColumnType::Text { .. } | ColumnType::Json | ColumnType::Uuid | ColumnType::Inet
            ) || matches!(&column.ty, ColumnType::Other(name) if name.ends_with("[]"));
            if !holds_text {
                continue;
            }
            let col = quote_ident(&column.name);
            whole.push((
                column.name.clone(),
                format!("count(*) FILTER (WHERE t.{col}::text IN (SELECT v FROM airlock_mask.raw))"),
            ));
            // Masked columns hold fakes, which may by chance hold a short
            // source value inside; all but JSON (masked at some paths only) are left out.
            let masked_by = plan
                .columns
                .iter()
                .find(|p| leaves[p.leaf].sql == leaf.sql && p.column == column.name)
                .map(|p| &plan.domains[p.domain].transformer);
            let searched = !matches!(column.ty, ColumnType::Uuid | ColumnType::Inet)
                && matches!(masked_by, None | Some(Transformer::Json(_)));
            if searched && search.sampled_for_substrings > 0 {
                inside.push((
                    column.name.clone(),
                    format!(
                        "count(*) FILTER (WHERE EXISTS (SELECT 1 FROM airlock_mask.sample s WHERE pg_catalog.strpos(t.{col}::text, s.v) > 0))"
                    ),
                ));
            }
        }
        if whole.is_empty() {
            continue;
        }
        search.columns_searched += whole.len() as u64;
        search.text_columns_searched += inside.len() as u64;
        let all: Vec<&(String, String)> = whole.iter().chain(&inside).collect();
        let sql = format!(
            "SELECT {} FROM ONLY {} t",
            all.iter().map(|(_, e)| e.as_str()).collect::<Vec<_>>().join(", "),
            leaf.sql
        );
        let row = c.query_one(&sql, &[]).await.map_err(failed)?;
        for (i, (name, _)) in all.iter().enumerate() {
            let n: i64 = row.cell(i)?;
            if n == 0 {
                continue;
            }
            let how = if i < whole.len() { "a whole source value" } else { "a source value inside its text" };
            search.found.push(format!("{}.{name}: {n} rows hold {how} of a masked column", leaf.named));
        }
    }
    admin.execute("RESET work_mem").await?;
    Ok(search)
}
