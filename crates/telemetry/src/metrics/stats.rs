//! `airlock stats`: the five measures of fleet health, for people (and `--json`).

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::isolation::Collision;

/// The five measures, as `GET /v1/stats` answers them.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Stats {
    /// Sessions served by a dedicated instance (target: all).
    pub isolation: IsolationStat,
    /// Fork request to ready, by source (`pool`, `cold`, `branch`), over recent forks.
    pub provisioning: Vec<Latency>,
    /// Sandboxes found sharing what each must have alone (target: none).
    pub collisions: CollisionStat,
    /// Expiry to deletion, and what reconciliation found.
    pub reaping: ReapStat,
    /// Events with and without their audit record (target: all with).
    pub audit: AuditStat,
    /// Sandboxes by state.
    pub sandboxes: BTreeMap<String, i64>,
}

/// The isolation measure.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct IsolationStat {
    /// `dedicated / sessions` (1 with no sessions).
    pub ratio: f64,
    /// Running sessions checked.
    pub sessions: usize,
    /// Those served by a dedicated instance.
    pub dedicated: usize,
    /// Sessions that were not, and why.
    pub not_dedicated: Vec<String>,
}

/// Percentiles of recent durations of one kind.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Latency {
    /// What was measured (`pool`, `cold`, `branch`, `ttl`).
    pub of: String,
    /// Samples (the newest 2,000 at most).
    pub count: usize,
    /// Median, 99th percentile and maximum, in milliseconds.
    pub p50_ms: f64,
    /// See `p50_ms`.
    pub p99_ms: f64,
    /// See `p50_ms`.
    pub max_ms: f64,
}

impl Latency {
    /// The percentiles of `samples` (milliseconds).
    pub fn of(what: &str, samples: &VecDeque<f64>) -> Latency {
        let mut sorted: Vec<f64> = samples.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        let at = |q: f64| {
            if sorted.is_empty() {
                0.0
            } else {
                sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1]
            }
        };
        Latency {
            of: what.to_owned(),
            count: sorted.len(),
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            max_ms: sorted.last().copied().unwrap_or(0.0),
        }
    }
}

/// The collision measure.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CollisionStat {
    /// Collisions recorded since the daemon started.
    pub total: u64,
    /// Those the last check found.
    pub current: Vec<Collision>,
}

/// The reaping measure.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReapStat {
    /// Expiry-to-gone lag of sandboxes deleted by their TTL.
    pub lag: Latency,
    /// Directories without state that reconciliation removed.
    pub leaked: u64,
    /// Half-made sandboxes that reconciliation removed.
    pub orphaned: u64,
}

/// The audit completeness measure.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AuditStat {
    /// Events found with their audit record.
    pub with_record: u64,
    /// Events found without one.
    pub without_record: u64,
    /// `with / (with + without)` (1 before any event).
    pub ratio: f64,
    /// The newest record's sequence number.
    pub head_seq: u64,
    /// Records waiting to be written after a failure.
    pub deferred: usize,
}

/// The measures as text for people.
pub fn render(s: &Stats) -> String {
    let pct = |r: f64| format!("{:.1}%", r * 100.0);
    let mut out = String::new();
    let mark = |ok: bool| if ok { "ok " } else { "BAD" };
    out += &format!(
        "{} isolation          {} ({} of {} running sessions on a dedicated instance; target 100%)\n",
        mark(s.isolation.ratio >= 1.0),
        pct(s.isolation.ratio),
        s.isolation.dedicated,
        s.isolation.sessions
    );
    for why in &s.isolation.not_dedicated {
        out += &format!("      {why}\n");
    }
    if s.provisioning.is_empty() {
        out += "    provisioning       no forks yet\n";
    }
    for l in &s.provisioning {
        out += &format!(
            "    provisioning       {:<6} p50 {:.1} ms, p99 {:.1} ms over {} forks\n",
            l.of, l.p50_ms, l.p99_ms, l.count
        );
    }
    out += &format!(
        "{} collisions         {} now, {} since start (target 0)\n",
        mark(s.collisions.current.is_empty() && s.collisions.total == 0),
        s.collisions.current.len(),
        s.collisions.total
    );
    for c in &s.collisions.current {
        out += &format!("      {} and {} share a {}\n", c.sandboxes.0, c.sandboxes.1, c.shared);
    }
    out += &format!(
        "{} reaping            expiry to gone p50 {:.0} ms, max {:.0} ms over {} expiries; {} leaked, {} orphaned found at start\n",
        mark(s.reaping.lag.max_ms <= 5000.0),
        s.reaping.lag.p50_ms,
        s.reaping.lag.max_ms,
        s.reaping.lag.count,
        s.reaping.leaked,
        s.reaping.orphaned
    );
    out += &format!(
        "{} audit completeness {} ({} events with their record, {} without; head at record {}{})\n",
        mark(s.audit.ratio >= 1.0 && s.audit.deferred == 0),
        pct(s.audit.ratio),
        s.audit.with_record,
        s.audit.without_record,
        s.audit.head_seq,
        if s.audit.deferred > 0 {
            format!(", {} waiting to be written", s.audit.deferred)
        } else {
            String::new()
        }
    );
    let states: Vec<String> = s.sandboxes.iter().map(|(k, v)| format!("{v} {k}")).collect();
    out += &format!(
        "    sandboxes          {}\n",
        if states.is_empty() { "none".into() } else { states.join(", ") }
    );
    out
}
