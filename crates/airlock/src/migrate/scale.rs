//! Table sizes and per-row costs: what turns the work a candidate did on the
//! golden into an estimate at production size.
//!
//! Hazards are decided by what is certain (lock modes, rows worked, tables'
//! sizes); durations only estimate. The per-row costs are measured once per
//! golden generation, on a fork, and kept in the data root by the generation's
//! name and catalog hash, so
//! every later test of that generation estimates with the same numbers — on a
//! busy machine or an idle one.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use sha2::Digest;

use crate::error::{Error, ErrorCode, Result};

/// A table's size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TableSize {
    /// Its rows (the planner's estimate, `pg_class.reltuples`, for production).
    pub rows: i64,
    /// Its bytes on disk (`relpages` × 8 KiB for production).
    #[serde(default)]
    pub bytes: i64,
}

/// Table sizes read from a production database: `pg_class` only, never its data.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ProductionStats {
    /// Where they were read from (a DSN without its password, or a file name).
    #[serde(default)]
    pub source: String,
    /// Sizes by `schema.name`.
    #[schema(value_type = Object)]
    pub tables: BTreeMap<String, TableSize>,
}

/// The query that reads a database's table sizes: run by `migrate stats`, and
/// usable by hand to make a `--production-stats` file.
pub const STATS_SQL: &str = "SELECT n.nspname || '.' || c.relname AS table_name,
       CASE WHEN c.reltuples >= 0 THEN c.reltuples::int8 END AS rows, c.relpages::int8 * 8192 AS bytes
  FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind IN ('r', 'p', 'm') AND n.nspname <> 'information_schema'
   AND n.nspname NOT LIKE 'pg\\_%'";

impl ProductionStats {
    /// Reads the sizes from a database (never its rows).
    pub async fn read(client: &tokio_postgres::Client, source: String) -> Result<ProductionStats> {
        let rows = client.query(STATS_SQL, &[]).await.map_err(|e| {
            Error::new(
                ErrorCode::InvalidRequest,
                format!(
                    "reading table sizes from the production database failed: {}",
                    crate::pg::admin::describe(&e)
                ),
                "the role needs only to see pg_class: any role that can connect can",
            )
        })?;
        // A table never analyzed has no estimate (-1): its size stays unknown.
        let tables = rows
            .into_iter()
            .filter_map(|r| {
                let rows: Option<i64> = r.get(1);
                rows.map(|rows| (r.get::<_, String>(0), TableSize { rows, bytes: r.get(2) }))
            })
            .collect();
        Ok(ProductionStats { source, tables })
    }

    /// Parses a file: the JSON `migrate stats` prints, or CSV lines
    /// `schema.table,rows,bytes` (a header line is skipped; a negative row
    /// count, PostgreSQL's "never analyzed", leaves the table's size unknown).
    pub fn parse(text: &str, source: String) -> Result<ProductionStats> {
        if text.trim_start().starts_with('{') {
            let mut stats: ProductionStats =
                serde_json::from_str(text).map_err(|e| bad_file(&source, &e.to_string()))?;
            stats.source = source;
            stats.tables.retain(|_, t| t.rows >= 0);
            return Ok(stats);
        }
        let mut tables = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            let fields: Vec<&str> = line.split(',').map(|f| f.trim().trim_matches('"')).collect();
            if line.trim().is_empty() || (i == 0 && fields.get(1).is_some_and(|f| f.parse::<f64>().is_err()))
            {
                continue;
            }
            let number = |k: usize| fields.get(k).map(|f| f.parse::<f64>().map(|n| n as i64));
            let bad =
                || bad_file(&source, &format!("line {} is not schema.table,rows,bytes: {line:?}", i + 1));
            match (fields.first(), number(1), number(2)) {
                (Some(name), Some(Ok(rows)), None | Some(Ok(_)))
                    if name.contains('.') && fields.len() <= 3 =>
                {
                    let bytes = number(2).and_then(|b| b.ok()).unwrap_or(0).max(0);
                    if rows >= 0 {
                        tables.insert((*name).to_owned(), TableSize { rows, bytes });
                    }
                }
                _ => return Err(bad()),
            }
        }
        Ok(ProductionStats { source, tables })
    }
}

fn bad_file(source: &str, why: &str) -> Error {
    Error::new(
        ErrorCode::InvalidRequest,
        format!("{source} is not a table-size file: {why}"),
        "give the JSON `airlock migrate stats` prints, or CSV lines schema.table,rows,bytes",
    )
}

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

/// What the estimates of one run are made with.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Scale {
    /// `production` (sizes from `--production-stats`) or `golden`.
    pub source: String,
    /// Where production sizes came from, when they did.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub production_source: String,
    /// Per-row costs on the golden.
    pub costs: Costs,
    /// The golden's tables.
    #[schema(value_type = Object)]
    pub golden: BTreeMap<String, TableSize>,
    /// Production's tables, when given.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schema(value_type = Object)]
    pub production: BTreeMap<String, TableSize>,
}

/// Work done on one table: rows read, changed, rewritten, indexed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Work {
    /// Rows read by scans.
    pub scanned: i64,
    /// Rows checked against another table (a foreign key's validation).
    pub joined: i64,
    /// Rows inserted, updated or deleted.
    pub changed: i64,
    /// Rows copied by a rewrite.
    pub rewritten: i64,
    /// Rows indexed by index builds.
    pub indexed: i64,
}

/// Tables this big (rows) make a blocking hazard high severity.
pub const BIG_TABLE_ROWS: i64 = 100_000;
/// Or this big (bytes).
pub const BIG_TABLE_BYTES: i64 = 1 << 30;

impl Scale {
    /// A table's size as the estimates take it: production's when known.
    pub fn size(&self, table: &str) -> TableSize {
        self.production.get(table).or(self.golden.get(table)).copied().unwrap_or_default()
    }

    /// How many times bigger a table is in production than in the golden.
    pub fn factor(&self, table: &str) -> f64 {
        match (self.production.get(table), self.golden.get(table)) {
            (Some(p), Some(g)) if g.rows > 0 => p.rows.max(0) as f64 / g.rows as f64,
            _ => 1.0,
        }
    }

    /// Whether a table counts as big for severity.
    pub fn big(&self, table: &str) -> bool {
        let s = self.size(table);
        s.rows >= BIG_TABLE_ROWS || s.bytes >= BIG_TABLE_BYTES
    }

    /// Milliseconds the work on `table` would take at production size.
    pub fn estimate_ms(&self, table: &str, w: &Work) -> f64 {
        let c = &self.costs;
        // An index build or rewrite reads the table as part of its cost.
        let reading =
            if w.indexed > 0 || w.rewritten > 0 || w.joined > 0 { 0.0 } else { w.scanned as f64 * c.scan_us };
        let us = reading
            + w.joined as f64 * c.join_us
            + w.changed as f64 * c.change_us
            + w.rewritten as f64 * c.write_us
            + w.indexed as f64 * c.index_us;
        (us * self.factor(table) / 1e3).max(0.0)
    }

    /// A sentence on which sizes the estimates use.
    pub fn describe(&self) -> String {
        if self.source == "production" {
            format!("estimates at production size (table sizes from {})", self.production_source)
        } else {
            "estimates at the golden's own size: give --production-stats for production's".to_owned()
        }
    }
}

/// The file a golden generation's costs are kept in: named by the golden,
/// the generation and its recorded catalog's hash, so a golden made again
/// under the same name never reads the costs of the one before.
pub fn costs_path(
    layout: &crate::layout::Layout,
    golden: &str,
    generation: i64,
) -> Result<std::path::PathBuf> {
    let catalog =
        std::fs::read(crate::catalog::snapshot_path(&layout.golden_generation(golden, generation)))?;
    let digest = crate::secret::hex(&sha2::Sha256::digest(&catalog));
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

impl Scale {
    /// The scale of a run: the golden's calibration, and production's sizes when given.
    pub fn new(calibration: &Calibration, production: Option<&ProductionStats>) -> Scale {
        Scale {
            source: if production.is_some() { "production" } else { "golden" }.into(),
            production_source: production.map(|p| p.source.clone()).unwrap_or_default(),
            costs: calibration.costs,
            golden: calibration.tables.clone(),
            production: production.map(|p| p.tables.clone()).unwrap_or_default(),
        }
    }
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
        crate::pg::load::private_dir(dir)?;
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
    let rows =
        client.query(STATS_SQL, &[]).await.map_err(|e| Error::postgres(crate::pg::admin::describe(&e)))?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let name: String = r.get(0);
            let rows = golden_rows.get(&name).copied().unwrap_or(r.get(1));
            (name, TableSize { rows, bytes: r.get(2) })
        })
        .collect())
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
        client.batch_execute(&sql).await.map_err(|e| Error::postgres(crate::pg::admin::describe(&e)))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_files_parse_as_json_or_csv() {
        let csv =
            "table_name,rows,bytes\npublic.orders,5000000,1073741824\n\"public.users\",\"20000\",\"8192\"\n";
        let s = ProductionStats::parse(csv, "f".into()).unwrap();
        assert_eq!(s.tables["public.orders"], TableSize { rows: 5_000_000, bytes: 1 << 30 });
        assert_eq!(s.tables["public.users"].rows, 20_000);
        let json = r#"{"tables": {"public.orders": {"rows": 7, "bytes": 8192}}}"#;
        assert_eq!(ProductionStats::parse(json, "j".into()).unwrap().tables["public.orders"].rows, 7);
        assert!(ProductionStats::parse("orders 12\n", "bad".into()).is_err());
        // Never analyzed (-1): unknown, not empty; a malformed size is an error, not 0.
        let never = ProductionStats::parse("public.orders,-1,0\npublic.users,5,0\n", "f".into()).unwrap();
        assert!(!never.tables.contains_key("public.orders") && never.tables["public.users"].rows == 5);
        assert!(ProductionStats::parse("public.orders,-5,abc\n", "f".into()).is_err());
        assert!(ProductionStats::parse("public.orders,10,20,30\n", "f".into()).is_err());
    }

    #[test]
    fn estimates_scale_with_production_rows() {
        let mut scale = Scale {
            costs: Costs { scan_us: 1.0, change_us: 2.0, write_us: 3.0, index_us: 4.0, ..Default::default() },
            ..Default::default()
        };
        scale.golden.insert("public.t".into(), TableSize { rows: 1000, bytes: 0 });
        let w = Work { scanned: 1000, ..Default::default() };
        assert_eq!(scale.estimate_ms("public.t", &w), 1.0);
        scale.production.insert("public.t".into(), TableSize { rows: 1_000_000, bytes: 0 });
        assert_eq!(scale.estimate_ms("public.t", &w), 1000.0);
        assert!(scale.big("public.t"));
        let built = Work { scanned: 1000, indexed: 1000, ..Default::default() };
        assert_eq!(scale.estimate_ms("public.t", &built), 4000.0);
    }
}
