//! The golden's per-row costs: measured once per golden generation, on a
//! fork, and kept in the data root by the generation's name and catalog hash,
//! so every later test of that generation estimates with the same numbers — on
//! a busy machine or an idle one.

use airlock_postgres::cell::Cell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use sha2::Digest;

use super::sizes::{TableSize, STATS_SQL};
use airlock_core::error::{Error, Result};

/// Per-row costs measured on a fork of the golden, microseconds per row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Costs {
    /// Reading a row in a sequential scan and testing it (what a CHECK or
    /// NOT NULL validation, or a filtered query, does).
    pub scan_us: f64,
    /// Checking a row against another table (what a foreign key's validation does).
    #[serde(default)]
    pub join_us: f64,
    /// Updating a row in place.
    pub change_us: f64,
    /// Writing a row into a new table (what a rewrite does).
    pub write_us: f64,
    /// Indexing a row (a scan and a sort).
    pub index_us: f64,
    /// The row width measured with, bytes.
    pub row_bytes: i64,
    /// Rows measured with.
    pub rows: i64,
}

/// The file a golden generation's costs are kept in: named by the golden,
/// the generation and its recorded catalog's hash, so a golden made again
/// under the same name never reads the costs of the one before.
pub fn costs_path(layout: &airlock_core::layout::Layout, golden: &str, generation: i64) -> Result<PathBuf> {
    let catalog = std::fs::read(airlock_postgres::catalog::snapshot_path(
        &layout.golden_generation(golden, generation),
    ))?;
    let digest = airlock_core::secret::hex(&sha2::Sha256::digest(&catalog));
    Ok(layout.migration_costs().join(format!("{golden}-{generation}-{}.json", &digest[..16])))
}

/// What is measured once per generation.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Calibration {
    /// The per-row costs.
    pub costs: Costs,
    /// The golden's tables (bytes read from the fork).
    pub tables: BTreeMap<String, TableSize>,
}

/// The generation's calibration, if one was made (kept at `path`).
pub fn kept(path: &Path) -> Option<Calibration> {
    std::fs::read(path).ok().and_then(|b| serde_json::from_slice(&b).ok())
}

/// One calibration at a time: the first test of a generation measures, the others wait and read.
static CALIBRATING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The generation's calibration: read, or measured now on `client` (the admin
/// role on a fresh fork of it, before anything else runs there) and kept.
pub async fn calibration(
    path: &Path,
    client: &tokio_postgres::Client,
    golden_rows: &BTreeMap<String, i64>,
) -> Result<Calibration> {
    let _one = CALIBRATING.lock().await;
    if let Some(kept) = kept(path) {
        return Ok(kept);
    }
    let tables = table_sizes(client, golden_rows).await?;
    let (rows, bytes) = tables.values().fold((0i64, 0i64), |(r, b), t| (r + t.rows, b + t.bytes));
    let width = if rows > 0 { (bytes / rows).clamp(32, 2048) } else { 64 };
    let costs = measure_costs(client, width).await?;
    let calibration = Calibration { costs, tables };
    let json = serde_json::to_vec_pretty(&calibration).expect("calibration serializes");
    if let Some(dir) = path.parent() {
        airlock_host::storage::tree::private_dir(dir)?;
    }
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, json).and_then(|_| std::fs::rename(&tmp, path))?;
    Ok(calibration)
}

/// Each golden table's rows (the golden's counts) and bytes (from the fork).
async fn table_sizes(
    client: &tokio_postgres::Client,
    golden_rows: &BTreeMap<String, i64>,
) -> Result<BTreeMap<String, TableSize>> {
    let rows = client
        .query(STATS_SQL, &[])
        .await
        .map_err(|e| Error::postgres(airlock_postgres::admin::describe(&e)))?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let name: String = r.cell(0)?;
            // A table the golden has no count of (a partitioned table's
            // parent) and never analyzed has no estimate either: no rows of its own.
            let rows = match golden_rows.get(&name) {
                Some(rows) => *rows,
                None => r.cell::<Option<i64>>(1)?.unwrap_or(0),
            };
            Ok((name, TableSize { rows, bytes: r.cell(2)? }))
        })
        .collect::<Result<_>>()?)
}

/// Measures per-row costs on a table shaped like a typical application table
/// (a primary key, a second index, rows `width` bytes wide, logged like the
/// real ones), made in a schema of its own and dropped before the candidate
/// runs: built-in functions only, nothing of the golden's runs.
async fn measure_costs(client: &tokio_postgres::Client, width: i64) -> Result<Costs> {
    let rows = (20_000_000 / width).clamp(10_000, 100_000);
    let pad = (width / 32).max(1);
    let run = |sql: String| async move {
        let started = Instant::now();
        client
            .batch_execute(&sql)
            .await
            .map_err(|e| Error::postgres(airlock_postgres::admin::describe(&e)))?;
        Ok::<f64, Error>(started.elapsed().as_secs_f64() * 1e6 / rows as f64)
    };
    // A schema named like PostgreSQL's own, which no role but the admin can
    // make: nothing a promoted golden holds can stand in its place.
    run("SET search_path = pg_catalog, pg_temp; SET max_parallel_workers_per_gather = 0;
         SET max_parallel_maintenance_workers = 0;
         SET allow_system_table_mods = on; CREATE SCHEMA pg_airlock_calibration; RESET allow_system_table_mods;
         CREATE TABLE pg_airlock_calibration.t (id int8 PRIMARY KEY, k int8, v int8 NOT NULL DEFAULT 0, pad text)"
        .into())
    .await?;
    let measured = async {
        // Writing every row with its primary key: what a rewrite does.
        let write_us = run(format!(
            "INSERT INTO pg_airlock_calibration.t (id, k, pad)
               SELECT g, g, repeat(md5(g::text), {pad}) FROM generate_series(1, {rows}) g"
        ))
        .await?;
        let index_us = run("CREATE INDEX ON pg_airlock_calibration.t (k)".into()).await?;
        run("VACUUM ANALYZE pg_airlock_calibration.t".into()).await?;
        let mut scan_us = f64::MAX;
        for _ in 0..3 {
            let sql = "SELECT count(*) FROM pg_airlock_calibration.t WHERE pad IS NOT NULL AND k >= 0";
            scan_us = scan_us.min(run(sql.into()).await?);
        }
        let join_us = run("SELECT count(*) FROM pg_airlock_calibration.t a
                             LEFT JOIN pg_airlock_calibration.t b ON b.id = a.k WHERE b.id IS NULL"
            .into())
        .await?;
        // Every row updated in one statement, its two indexes kept up.
        let change_us = run("UPDATE pg_airlock_calibration.t SET v = v + 1".into()).await?;
        Ok::<_, Error>((scan_us, join_us, change_us, write_us, index_us))
    }
    .await;
    run("DROP SCHEMA pg_airlock_calibration CASCADE; RESET search_path;
         RESET max_parallel_workers_per_gather; RESET max_parallel_maintenance_workers"
        .into())
    .await?;
    let (scan_us, join_us, change_us, write_us, index_us) = measured?;
    let round = |us: f64| (us * 1e3).round() / 1e3;
    Ok(Costs {
        scan_us: round(scan_us),
        join_us: round(join_us),
        change_us: round(change_us),
        write_us: round(write_us),
        index_us: round(index_us),
        row_bytes: width,
        rows,
    })
}
