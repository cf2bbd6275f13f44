//! What every benchmark measures with: a series of timings and its
//! percentiles, and the first query on a new connection.

use std::time::Instant;

use serde::Serialize;

use airlock_core::error::{Error, Result};

/// Timings of one method, in milliseconds.
#[derive(Debug, Serialize)]
pub struct Series {
    /// `airlock_fork`, `template`, `pg_restore` or `initdb_seed`.
    pub method: String,
    /// Number of runs.
    pub runs: usize,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile (nearest rank).
    pub p99_ms: f64,
    /// Fastest.
    pub min_ms: f64,
    /// Slowest.
    pub max_ms: f64,
    /// This method's median over Airlock's.
    pub vs_airlock: f64,
}

/// The percentiles of `ms` as the series of `method`.
pub(super) fn series(method: &str, mut ms: Vec<f64>) -> Series {
    ms.sort_by(|a, b| a.total_cmp(b));
    let rank = |p: f64| ms[((p * ms.len() as f64).ceil() as usize).clamp(1, ms.len()) - 1];
    Series {
        method: method.into(),
        runs: ms.len(),
        p50_ms: rank(0.5),
        p99_ms: rank(0.99),
        min_ms: ms[0],
        max_ms: ms[ms.len() - 1],
        vs_airlock: 1.0,
    }
}

pub(super) fn elapsed_ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

/// Connects with a DSN and runs `SELECT 1`.
pub(super) async fn first_query(config: &tokio_postgres::Config) -> Result<()> {
    let (client, conn) = config.connect(tokio_postgres::NoTls).await.map_err(|e| {
        Error::postgres(format!("benchmark connection failed: {}", airlock_postgres::admin::describe(&e)))
    })?;
    tokio::spawn(conn);
    client.simple_query("SELECT 1").await.map_err(|e| Error::postgres(e.to_string()))?;
    Ok(())
}
