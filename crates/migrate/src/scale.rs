//! Table sizes and per-row costs: what turns the work a candidate did on the
//! golden into an estimate at production size.
//!
//! Hazards are decided by what is certain (lock modes, rows worked, tables'
//! sizes); durations only estimate, from the per-row costs `costs` measured on
//! the golden.

use airlock_postgres::cell::Cell;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::costs::{Calibration, Costs};
pub use super::sizes::{TableSize, STATS_SQL};
use airlock_core::error::{Error, ErrorCode, Result};

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

impl ProductionStats {
    /// Reads the sizes from a database (never its rows).
    pub async fn read(client: &tokio_postgres::Client, source: String) -> Result<ProductionStats> {
        let rows = client.query(STATS_SQL, &[]).await.map_err(|e| {
            Error::new(
                ErrorCode::InvalidRequest,
                format!(
                    "reading table sizes from the production database failed: {}",
                    airlock_postgres::admin::describe(&e)
                ),
                "the role needs only to see pg_class: any role that can connect can",
            )
        })?;
        // A table never analyzed has no estimate (-1): its size stays unknown.
        let mut tables = BTreeMap::new();
        for r in rows {
            let rows: Option<i64> = r.cell(1)?;
            if let Some(rows) = rows {
                tables.insert(r.cell::<String>(0)?, TableSize { rows, bytes: r.cell(2)? });
            }
        }
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

/// Whose table sizes the estimates take.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Sizes {
    /// The golden's own.
    #[default]
    Golden,
    /// Production's, from `--production-stats`.
    Production,
}

impl Sizes {
    /// Where a table's size was found, in words: `in production`, `in the golden`.
    pub fn place(self) -> &'static str {
        match self {
            Sizes::Golden => "in the golden",
            Sizes::Production => "in production",
        }
    }
}

/// What the estimates of one run are made with.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Scale {
    /// `production` (sizes from `--production-stats`) or `golden`.
    pub source: Sizes,
    /// Where production sizes came from; empty when they did not.
    #[serde(default)]
    pub production_source: String,
    /// Per-row costs on the golden.
    pub costs: Costs,
    /// The golden's tables.
    #[schema(value_type = Object)]
    pub golden: BTreeMap<String, TableSize>,
    /// Production's tables; empty when not given.
    #[serde(default)]
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

impl Work {
    /// Rows worked through, each once: a row read and then changed, or read
    /// and checked against another table, is one row worked.
    pub fn rows(&self) -> i64 {
        self.scanned.max(self.joined).max(self.changed) + self.rewritten + self.indexed
    }
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
        if self.source == Sizes::Production {
            format!("estimates at production size (table sizes from {})", self.production_source)
        } else {
            "estimates at the golden's own size: give --production-stats for production's".to_owned()
        }
    }
}

impl Scale {
    /// The scale of a run: the golden's calibration, and production's sizes when given.
    pub fn new(calibration: &Calibration, production: Option<&ProductionStats>) -> Scale {
        Scale {
            source: if production.is_some() { Sizes::Production } else { Sizes::Golden },
            production_source: production.map(|p| p.source.clone()).unwrap_or_default(),
            costs: calibration.costs,
            golden: calibration.tables.clone(),
            production: production.map(|p| p.tables.clone()).unwrap_or_default(),
        }
    }
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
