//! A table's size, and the query that reads every table's from a database's
//! catalog (never its rows): what the estimates scale by (`scale.rs`) and
//! what the costs are calibrated against (`costs.rs`).

use serde::{Deserialize, Serialize};

/// A table's size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TableSize {
    /// Its rows (the planner's estimate, `pg_class.reltuples`, for production).
    pub rows: i64,
    /// Its bytes on disk (`relpages` × 8 KiB for production).
    #[serde(default)]
    pub bytes: i64,
}

/// The query that reads a database's table sizes: run by `migrate stats`, and
/// usable by hand to make a `--production-stats` file.
pub const STATS_SQL: &str =
    "SELECT pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname) AS table_name,
       CASE WHEN c.reltuples >= 0 THEN c.reltuples::int8 END AS rows, c.relpages::int8 * 8192 AS bytes
  FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind IN ('r', 'p', 'm') AND n.nspname <> 'information_schema'
   AND n.nspname NOT LIKE 'pg\\_%'";
