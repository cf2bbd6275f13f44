//! `airlock bench audit`: what the audit log adds to each recorded event, on
//! the filesystem of the data root, with and without a flush per record.
//!
//! Three stores record the same events (the three a pooled fork writes, and a
//! tool call with its statement) in turn: one without the audit log (the cost
//! before it existed), one with it, one with it and `--audit-fsync`. The
//! difference is the audit log's share; a pooled fork writes three events,
//! one of which (`credential_issued`) is new with the log and counts whole.

use std::time::Instant;

use serde::Serialize;
use serde_json::json;

use super::bench_series::{series, Series};
use super::output::{self, Table};
use super::Cli;
use airlock_core::error::{Error, Result};
use airlock_core::events::{EventKind, NewEvent};
use airlock_state::audit::{AuditLog, AuditOptions};
use airlock_state::store::Store;

/// What `bench audit` measured.
#[derive(Debug, Serialize)]
pub struct AuditBench {
    /// Per event: store only, with the audit log, with the log and fsync (µs in `*_ms` fields ×1000).
    pub per_event: Vec<Series>,
    /// Added to a pooled fork's path by the log (three events, one new), in milliseconds (p50).
    pub pooled_fork_added_ms: f64,
    /// The same with `--audit-fsync`.
    pub pooled_fork_added_fsync_ms: f64,
    /// Added to a tool call (one event), p50 ms, without and with fsync.
    pub tool_call_added_ms: f64,
    /// See `tool_call_added_ms`.
    pub tool_call_added_fsync_ms: f64,
}

/// The events one round records: a pooled fork's three and a tool call.
fn round(i: usize) -> Vec<NewEvent> {
    let sandbox = Some(format!("sb-bench{i:05}"));
    let golden = Some("bench".to_owned());
    let event = |kind, detail| NewEvent {
        kind,
        sandbox: sandbox.clone(),
        golden: golden.clone(),
        detail,
        ..Default::default()
    };
    vec![
        event(
            EventKind::Created,
            json!({"generation": 1, "expires_at": "2026-01-01T00:00:00.000Z", "labels": {}, "from_pool": true}),
        ),
        event(
            EventKind::Ready,
            json!({"fork_ms": 5.1, "from_pool": true, "steps": {"clone_ms": 0.0, "start_ms": 0.0, "ready_ms": 1.2, "credential_ms": 3.4}, "storage": "reflink"}),
        ),
        event(
            EventKind::CredentialIssued,
            json!({"to": "api:fork", "forms": ["dsn", "socket_dsn"], "fingerprint": "0123456789abcdef"}),
        ),
        event(
            EventKind::ToolCall,
            json!({"tool": "run_sql", "via": "mcp_http", "statement": "SELECT id, status, total FROM orders WHERE status = 'pending' ORDER BY id LIMIT 50", "rows": 50, "duration_ms": 2}),
        ),
    ]
}

/// Records `rounds` rounds in `store`; each event's time, by its place in a round.
fn time(store: &mut Store, rounds: usize) -> Result<Vec<Vec<f64>>> {
    let mut ms: Vec<Vec<f64>> = (0..4).map(|_| Vec::with_capacity(rounds)).collect();
    for i in 0..rounds {
        for (k, event) in round(i).into_iter().enumerate() {
            let began = Instant::now();
            store.record(event)?;
            ms[k].push(began.elapsed().as_secs_f64() * 1000.0);
        }
    }
    Ok(ms)
}

pub(super) fn run(cli: &Cli, rounds: usize) -> Result<i32> {
    let rounds = rounds.max(10);
    let scratch = cli.layout().home().join(format!("bench-audit-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)
        .map_err(|e| Error::io(format!("creating {}", scratch.display()), &e))?;
    let measured = (|| -> Result<[Vec<Vec<f64>>; 3]> {
        let mut plain = Store::open(&scratch.join("plain.db"))?;
        let journal = |name: &str, fsync: bool| -> Result<std::sync::Arc<AuditLog>> {
            Ok(std::sync::Arc::new(AuditLog::open(
                &scratch.join(name),
                AuditOptions { fsync, ..Default::default() },
            )?))
        };
        let mut audited = Store::open(&scratch.join("audited.db"))?.with_journal(journal("audit", false)?);
        let mut synced = Store::open(&scratch.join("synced.db"))?.with_journal(journal("audit-fsync", true)?);
        // Interleaved, so that machine noise falls on all three alike.
        let (mut a, mut b, mut c) = (vec![Vec::new(); 4], vec![Vec::new(); 4], vec![Vec::new(); 4]);
        for _ in 0..rounds / 10 {
            for (store, into) in [(&mut plain, &mut a), (&mut audited, &mut b), (&mut synced, &mut c)] {
                for (k, ms) in time(store, 10)?.into_iter().enumerate() {
                    into[k].extend(ms);
                }
            }
        }
        Ok([a, b, c])
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    let [plain, audited, synced] = measured?;
    let all = |m: &[Vec<f64>]| m.iter().flatten().copied().collect::<Vec<f64>>();
    let p50 = |ms: &[f64]| series("", ms.to_vec()).p50_ms;
    let per_event = vec![
        series("store_only", all(&plain)),
        series("with_audit", all(&audited)),
        series("with_audit_fsync", all(&synced)),
    ];
    // A pooled fork: created and ready existed before (the log's share), the
    // credential record is new (all of it).
    let fork_added = |with: &[Vec<f64>]| {
        (p50(&with[0]) - p50(&plain[0])) + (p50(&with[1]) - p50(&plain[1])) + p50(&with[2])
    };
    let result = AuditBench {
        pooled_fork_added_ms: fork_added(&audited),
        pooled_fork_added_fsync_ms: fork_added(&synced),
        tool_call_added_ms: p50(&audited[3]) - p50(&plain[3]),
        tool_call_added_fsync_ms: p50(&synced[3]) - p50(&plain[3]),
        per_event,
    };
    output::print(cli.json, &result, || {
        let mut t = Table::new(&["EVENT RECORDED", "RUNS", "P50 (µs)", "P99 (µs)", "MAX (µs)"]);
        for s in &result.per_event {
            t.row(vec![
                s.method.clone(),
                s.runs.to_string(),
                format!("{:.1}", s.p50_ms * 1000.0),
                format!("{:.1}", s.p99_ms * 1000.0),
                format!("{:.1}", s.max_ms * 1000.0),
            ]);
        }
        format!(
            "{}\nadded by the audit log, p50: pooled fork +{:.3} ms (+{:.3} ms with --audit-fsync); tool call +{:.3} ms (+{:.3} ms with --audit-fsync)",
            t.render(),
            result.pooled_fork_added_ms,
            result.pooled_fork_added_fsync_ms,
            result.tool_call_added_ms,
            result.tool_call_added_fsync_ms
        )
    });
    Ok(0)
}
