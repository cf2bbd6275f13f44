//! Fleet health: the five measures of a healthy sandbox fleet, as Prometheus
//! metrics (`airlock serve --metrics ADDR`) and for `airlock stats`.
//!
//! - *isolation*: running sessions served by a dedicated instance, from the
//!   processes ([`isolation`]);
//! - *provisioning latency*: fork request to ready, by golden and source;
//! - *collisions*: two sandboxes sharing a process, directory, socket or OS user;
//! - *reaping accuracy*: expiry-to-gone lag, and what reconciliation found;
//! - *audit completeness*: events with and without an audit record.
//!
//! Counts come from the audit log itself ([`airlock_state::audit::follow`]): whatever door an event
//! came through, the router's process included, it is counted once, and only
//! if it has a record. This service owns its state; the engine knows nothing of it.

pub mod isolation;
pub mod stats;

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use airlock_core::clock::Timestamp;
use airlock_core::events::{Door, EventKind, NewEvent};
use airlock_lifecycle::engine::Engine;
use airlock_state::audit::follow::Follower;
use airlock_state::audit::record::Sealed;
use isolation::{Collision, Isolation};

/// How often the audit log is followed and the isolation check runs.
const TICK: Duration = Duration::from_secs(2);

/// Label pairs of a metric family.
type Labels = Vec<(String, String)>;
type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

fn latency_buckets() -> Histogram {
    Histogram::new([0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0])
}

fn lag_buckets() -> Histogram {
    Histogram::new([0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0])
}

/// Samples kept for the percentiles `airlock stats` shows.
const SAMPLES_KEPT: usize = 2000;

/// What the follow loop has seen, beyond the counters.
#[derive(Default)]
struct Seen {
    /// The last isolation check.
    isolation: Isolation,
    /// Collisions already recorded (each is recorded once while it lasts).
    known_collisions: HashSet<Collision>,
    /// Records read but not yet matched with their event: seq → (kind, sandbox).
    unmatched: BTreeMap<u64, (String, Option<String>)>,
    /// The first record the follower read (earlier ones are not checked).
    first_seq: Option<u64>,
    /// The last record read.
    followed_seq: u64,
    /// The last event checked for a record.
    events_after: i64,
    /// Events found with and without their audit record.
    with_record: u64,
    without_record: u64,
    /// Recent provisioning latencies (ms) by source, and reap lags (ms).
    provisioning: BTreeMap<String, VecDeque<f64>>,
    reap_lag: VecDeque<f64>,
    /// Reconciliation findings and collisions seen, by kind.
    findings: BTreeMap<String, u64>,
    collisions_total: u64,
}

impl Seen {
    /// Events checked that have their record, over all checked, tool calls
    /// that ended without their record counted among those without (1
    /// before any).
    fn completeness(&self) -> f64 {
        let without = self.without_record + airlock_core::events::TOOL_CALLS.unrecorded();
        let checked = self.with_record + without;
        if checked == 0 {
            1.0
        } else {
            self.with_record as f64 / checked as f64
        }
    }
}

/// The metrics service: counters fed from the audit log, gauges read at scrape.
pub struct Metrics {
    /// The agent tools' names: only these get a label of their own.
    tools: &'static [&'static str],
    provisioning: Histograms,
    reap_lag: Histogram,
    deleted: Family<Labels, Counter>,
    reconcile: Family<Labels, Counter>,
    tool_calls: Family<Labels, Counter>,
    connections: Family<Labels, Counter>,
    verdicts: Family<Labels, Counter>,
    collisions: Family<Labels, Counter>,
    watchdog: Family<Labels, Counter>,
    audit_events: Family<Labels, Counter>,
    records: Family<Labels, Counter>,
    seen: Mutex<Seen>,
}

impl Metrics {
    fn new(tools: &'static [&'static str]) -> Metrics {
        Metrics {
            tools,
            provisioning: Family::new_with_constructor(latency_buckets as fn() -> Histogram),
            reap_lag: lag_buckets(),
            deleted: Family::default(),
            reconcile: Family::default(),
            tool_calls: Family::default(),
            connections: Family::default(),
            verdicts: Family::default(),
            collisions: Family::default(),
            watchdog: Family::default(),
            audit_events: Family::default(),
            records: Family::default(),
            seen: Mutex::new(Seen::default()),
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts one audit record.
    fn observe(&self, engine: &Engine, sealed: &Sealed, seen: &mut Seen) {
        let r = &sealed.record;
        let detail = &r.detail;
        let text = |key: &str| detail.get(key).and_then(|v| v.as_str()).unwrap_or("").to_owned();
        self.records.get_or_create(&labels(&[("kind", &r.kind), ("door", r.door.as_str())])).inc();
        match r.kind.as_str() {
            "ready" => {
                let ms = detail.get("fork_ms").and_then(|v| v.as_f64()).unwrap_or(0.0);
                let source = if detail.get("branched_from").is_some() {
                    "branch"
                } else if detail.get("from_pool").and_then(|v| v.as_bool()).unwrap_or(false) {
                    "pool"
                } else {
                    "cold"
                };
                let golden = r.golden.clone().unwrap_or_default();
                let redis = r
                    .sandbox
                    .as_deref()
                    .is_some_and(|id| airlock_redis::server::configured(&engine.layout.sandbox_instance(id)));
                self.provisioning
                    .get_or_create(&labels(&[
                        ("golden", &golden),
                        ("source", source),
                        ("redis", if redis { "yes" } else { "no" }),
                    ]))
                    .observe(ms / 1000.0);
                keep(seen.provisioning.entry(source.to_owned()).or_default(), ms);
            }
            "deleted" => {
                let reason = r.reason.clone().unwrap_or_default();
                self.deleted.get_or_create(&labels(&[("reason", &reason)])).inc();
                if reason == "ttl" {
                    let expired = detail
                        .get("expires_at")
                        .cloned()
                        .and_then(|v| serde_json::from_value::<Timestamp>(v).ok());
                    if let Some(expired) = expired {
                        let lag = (r.at.0 - expired.0).max(0) as f64;
                        self.reap_lag.observe(lag / 1000.0);
                        keep(&mut seen.reap_lag, lag);
                    }
                }
                if reason == "orphan" {
                    let finding = if detail.get("found").is_some() { "leaked" } else { "orphaned" };
                    self.reconcile.get_or_create(&labels(&[("finding", finding)])).inc();
                    *seen.findings.entry(finding.to_owned()).or_default() += 1;
                }
            }
            "tool_call" => {
                let outcome = if detail.get("error").is_some_and(|e| !e.is_null()) { "error" } else { "ok" };
                // A tool name is the caller's: only the tools there are get a label of their own.
                let named = text("tool");
                let tool = if self.tools.contains(&named.as_str()) { named.as_str() } else { "other" };
                self.tool_calls
                    .get_or_create(&labels(&[
                        ("tool", tool),
                        ("outcome", outcome),
                        ("door", r.door.as_str()),
                    ]))
                    .inc();
            }
            "connected" | "connection_refused" => {
                let outcome = if r.kind == "connected" { "accepted" } else { "refused" };
                let store = detail.get("store").and_then(|v| v.as_str()).unwrap_or("postgres");
                // A router's summary of refusals it counted stands for that many.
                let summed = detail.get("refusals").and_then(|v| v.as_u64()).filter(|_| outcome == "refused");
                let many = summed.unwrap_or(1);
                self.connections
                    .get_or_create(&labels(&[("outcome", outcome), ("store", store)]))
                    .inc_by(many);
            }
            "migration_tested" => {
                for c in detail.get("candidates").and_then(|v| v.as_array()).into_iter().flatten() {
                    let passed = c.get("passed").and_then(|v| v.as_bool()).unwrap_or(false);
                    self.verdicts
                        .get_or_create(&labels(&[("verdict", if passed { "passed" } else { "failed" })]))
                        .inc();
                }
            }
            "collision" => {
                self.collisions.get_or_create(&labels(&[("shared", &text("shared"))])).inc();
                seen.collisions_total += 1;
            }
            "watchdog" => {
                let reason = r.reason.clone().unwrap_or_default();
                self.watchdog.get_or_create(&labels(&[("reason", &reason)])).inc();
            }
            _ => {}
        }
    }

    /// Matches events in the store with their records (the completeness check).
    fn cross_check(&self, engine: &Engine, seen: &mut Seen) {
        let Ok(events) = engine.store().events_with_audit(seen.events_after, 10_000) else { return };
        for event in events {
            let found = match event.audit_seq {
                None => Some(false),
                // Written before this daemon started following: not checked.
                Some(seq) if seen.first_seq.is_none_or(|first| seq < first) => None,
                Some(seq) if seq <= seen.followed_seq => Some(
                    seen.unmatched.remove(&seq).is_some_and(|(k, s)| k == event.kind && s == event.sandbox),
                ),
                // Its record is not read yet: check it next time.
                Some(_) => break,
            };
            if let Some(found) = found {
                *if found { &mut seen.with_record } else { &mut seen.without_record } += 1;
                self.audit_events
                    .get_or_create(&labels(&[("recorded", if found { "true" } else { "false" })]))
                    .inc();
            }
            seen.events_after = event.id;
        }
        // Records with no event (a gap record) are never matched: keep the map bounded.
        let floor = seen.followed_seq.saturating_sub(500_000);
        seen.unmatched = seen.unmatched.split_off(&floor);
    }

    /// Records each collision found for the first time; forgets those gone.
    fn record_collisions(engine: &Engine, seen: &mut Seen) {
        let now: HashSet<Collision> = seen.isolation.collisions.iter().cloned().collect();
        for c in now.difference(&seen.known_collisions) {
            tracing::error!(shared = %c.shared, first = %c.sandboxes.0, second = %c.sandboxes.1, "two sandboxes share what each must have alone");
            engine.store().record_or_log(NewEvent {
                kind: EventKind::Collision,
                sandbox: Some(c.sandboxes.0.clone()),
                detail: serde_json::json!({"shared": c.shared, "with": c.sandboxes.1}),
                door: Some(Door::Reaper),
                ..Default::default()
            });
        }
        seen.known_collisions = now;
    }

    /// One pass: follow the log, run the isolation check, cross-check events.
    fn tick(&self, engine: &Engine, follower: &mut Follower) {
        let isolation = isolation::check(engine);
        let mut seen = self.seen();
        seen.isolation = isolation;
        Metrics::record_collisions(engine, &mut seen);
        loop {
            let batch = follower.next_batch(8 << 20);
            if batch.is_empty() {
                break;
            }
            for sealed in &batch {
                self.observe(engine, sealed, &mut seen);
                seen.first_seq.get_or_insert(sealed.record.seq);
                seen.followed_seq = sealed.record.seq;
                seen.unmatched
                    .insert(sealed.record.seq, (sealed.record.kind.clone(), sealed.record.sandbox.clone()));
            }
        }
        self.cross_check(engine, &mut seen);
    }

    /// The metrics in the Prometheus text exposition format (OpenMetrics).
    pub fn render(&self, engine: &Engine) -> String {
        let mut registry = Registry::with_prefix("airlock");
        let seen = self.seen();
        let gauge = |value: f64| {
            let g: Gauge<f64, AtomicU64> = Gauge::default();
            g.set(value);
            g
        };
        let isolation = &seen.isolation;
        registry.register(
            "isolation_ratio",
            "Running agent sessions served by a dedicated instance of their own, over all running sessions (target 1)",
            gauge(isolation.ratio()),
        );
        registry.register(
            "isolation_sessions",
            "Running agent sessions checked",
            gauge(isolation.sessions as f64),
        );
        registry.register(
            "isolation_dedicated_sessions",
            "Running agent sessions found served by a dedicated instance",
            gauge(isolation.dedicated as f64),
        );
        registry.register(
            "collisions_current",
            "Pairs of sandboxes sharing a process, directory, socket or OS user right now (target 0)",
            gauge(isolation.collisions.len() as f64),
        );
        registry.register(
            "collisions",
            "Collisions found by the isolation check, by what was shared (target 0)",
            self.collisions.clone(),
        );
        registry.register(
            "provisioning_seconds",
            "Fork request to ready, by golden, source (pool, cold, branch) and whether it has a Redis",
            self.provisioning.clone(),
        );
        registry.register(
            "reap_lag_seconds",
            "Time from a sandbox's expiry to its deletion",
            self.reap_lag.clone(),
        );
        registry.register(
            "reconcile_findings",
            "Sandboxes reconciliation found leaked (a directory without state) or orphaned (half made)",
            self.reconcile.clone(),
        );
        registry.register("sandboxes_deleted", "Sandboxes deleted, by reason", self.deleted.clone());
        registry.register(
            "audit_completeness_ratio",
            "Events checked that have their audit record, over all events checked (target 1)",
            gauge(seen.completeness()),
        );
        registry.register(
            "tool_calls_unrecorded",
            "Tool calls that ended without their audit record (target 0)",
            gauge(airlock_core::events::TOOL_CALLS.unrecorded() as f64),
        );
        registry.register(
            "audit_events_checked",
            "Events cross-checked against the audit log, by whether their record was found",
            self.audit_events.clone(),
        );
        registry.register("audit_records", "Audit records written, by kind and door", self.records.clone());
        let (head, _) = engine.audit.head();
        registry.register(
            "audit_head_sequence",
            "The sequence number of the newest audit record",
            gauge(head as f64),
        );
        registry.register(
            "audit_deferred_records",
            "Records waiting to be written after the audit log failed (target 0)",
            gauge(engine.audit.deferred() as f64),
        );
        registry.register(
            "tool_calls",
            "Agent tool calls, by tool, outcome and door",
            self.tool_calls.clone(),
        );
        registry.register(
            "router_connections",
            "Router connections, by outcome (accepted, refused) and store",
            self.connections.clone(),
        );
        registry.register(
            "migration_verdicts",
            "Migration candidates tested, by verdict",
            self.verdicts.clone(),
        );
        registry.register(
            "watchdog_interventions",
            "Watchdog interventions, by reason",
            self.watchdog.clone(),
        );
        drop(seen);
        let states: Family<Labels, Gauge> = Family::default();
        for (state, n) in engine.store().counts_by_state().unwrap_or_default() {
            states.get_or_create(&labels(&[("state", &state)])).set(n);
        }
        for state in ["running", "suspended", "pooled"] {
            let _ = states.get_or_create(&labels(&[("state", state)]));
        }
        registry.register("sandboxes", "Sandboxes, by state (pool members are `pooled`)", states);
        let (pooled, target): (Family<Labels, Gauge>, Family<Labels, Gauge>) = Default::default();
        for golden in engine.store().goldens().unwrap_or_default() {
            pooled.get_or_create(&labels(&[("golden", &golden.name)])).set(golden.pooled);
            target.get_or_create(&labels(&[("golden", &golden.name)])).set(golden.pool_size);
        }
        registry.register("pool_members", "Started sandboxes waiting in a golden's warm pool", pooled);
        let routes = airlock_core::records::route::ids(&engine.layout).len();
        registry.register(
            "grants_live",
            "Grants on live targets that the router leads clients to now (their routes)",
            gauge(routes as f64),
        );
        registry.register("pool_target", "The warm-pool size a golden asks for", target);
        let airlock_lifecycle::sandbox::volume::Space { used, free, .. } =
            airlock_lifecycle::sandbox::volume::Space::of(engine);
        registry.register("volume_used_bytes", "Bytes used on the copy-on-write volume", gauge(used as f64));
        registry.register("volume_free_bytes", "Bytes free on the copy-on-write volume", gauge(free as f64));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry)
            .expect("writing to a String cannot fail");
        out
    }
}

impl Metrics {
    /// The five measures, for `airlock stats`.
    pub fn stats(&self, engine: &Engine) -> stats::Stats {
        let seen = self.seen();
        stats::Stats {
            isolation: stats::IsolationStat {
                ratio: seen.isolation.ratio(),
                sessions: seen.isolation.sessions,
                dedicated: seen.isolation.dedicated,
                not_dedicated: seen.isolation.not_dedicated.clone(),
            },
            provisioning: seen
                .provisioning
                .iter()
                .map(|(source, samples)| stats::Latency::of(source, samples))
                .collect(),
            collisions: stats::CollisionStat {
                total: seen.collisions_total,
                current: seen.isolation.collisions.clone(),
            },
            reaping: stats::ReapStat {
                lag: stats::Latency::of("ttl", &seen.reap_lag),
                leaked: seen.findings.get("leaked").copied().unwrap_or(0),
                orphaned: seen.findings.get("orphaned").copied().unwrap_or(0),
            },
            audit: stats::AuditStat {
                with_record: seen.with_record,
                without_record: seen.without_record,
                ratio: seen.completeness(),
                head_seq: engine.audit.head().0,
                deferred: engine.audit.deferred(),
            },
            sandboxes: engine.store().counts_by_state().unwrap_or_default().into_iter().collect(),
        }
    }
}

/// Keeps the newest samples for percentiles.
fn keep(samples: &mut VecDeque<f64>, value: f64) {
    if samples.len() == SAMPLES_KEPT {
        samples.pop_front();
    }
    samples.push_back(value);
}

/// Where the service starts counting: the audit log's end and the newest
/// event, taken before reconciliation so that what it finds is counted.
pub struct Start {
    follower: Follower,
    events_after: i64,
}

impl Start {
    /// The log's end and the newest event, now.
    pub fn now(engine: &Engine) -> Start {
        Start {
            events_after: engine.store().last_event_id().unwrap_or(0),
            follower: Follower::at_end(&engine.layout.audit()),
        }
    }
}

/// Starts the service from `start`: follows the audit log and checks
/// isolation every few seconds, until the daemon exits. `tools` are the agent
/// tools' names: a tool call of any other name counts as `other`, so an agent
/// cannot make a label value of its choosing.
pub fn spawn(engine: Arc<Engine>, start: Start, tools: &'static [&'static str]) -> Arc<Metrics> {
    let metrics = Arc::new(Metrics::new(tools));
    metrics.seen().events_after = start.events_after;
    let service = metrics.clone();
    let mut follower = start.follower;
    tokio::spawn(airlock_core::events::DOOR.scope(Door::Reaper, async move {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let (pass, service, mut moved) = (engine.clone(), service.clone(), follower);
            follower = match tokio::task::spawn_blocking(move || {
                service.tick(&pass, &mut moved);
                moved
            })
            .await
            {
                Ok(f) => f,
                Err(e) => {
                    tracing::error!(error = %e, "the metrics pass failed; following the audit log from its end");
                    Follower::at_end(&engine.layout.audit())
                }
            };
        }
    }));
    metrics
}

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The OpenMetrics exposition rewritten in Prometheus's classic text format,
/// for clients that do not ask for OpenMetrics (`promtool check metrics`, older
/// scrapers): a counter's family is named by its samples' `_total` name, and
/// the OpenMetrics-only lines (`# EOF`, `# UNIT`) go.
pub fn classic_text(openmetrics: &str) -> String {
    let mut counters = HashSet::new();
    for line in openmetrics.lines() {
        if let Some(name) = line.strip_prefix("# TYPE ").and_then(|t| t.strip_suffix(" counter")) {
            counters.insert(name.to_owned());
        }
    }
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters.contains(name).then(|| format!("{prefix}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// Serves `GET /metrics` on `addr` until the daemon exits; the bound address.
pub async fn serve(
    engine: Arc<Engine>,
    metrics: Arc<Metrics>,
    addr: std::net::SocketAddr,
) -> airlock_core::error::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        airlock_core::error::Error::new(
            airlock_core::error::ErrorCode::InvalidRequest,
            format!("the metrics address {addr} cannot be listened on: {e}"),
            "pick a free HOST:PORT for --metrics (port 0 picks one)",
        )
    })?;
    let bound = listener.local_addr()?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move |headers: axum::http::HeaderMap| {
            let (engine, metrics) = (engine.clone(), metrics.clone());
            async move {
                let text =
                    tokio::task::spawn_blocking(move || metrics.render(&engine)).await.unwrap_or_default();
                let accept =
                    headers.get(axum::http::header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
                if accept.contains("application/openmetrics-text") {
                    ([(axum::http::header::CONTENT_TYPE, OPENMETRICS)], text)
                } else {
                    ([(axum::http::header::CONTENT_TYPE, PROMETHEUS_TEXT)], classic_text(&text))
                }
            }
        }),
    );
    tracing::info!(%bound, "serving metrics");
    tokio::spawn(airlock_listen::serve::serve(
        listener,
        app,
        airlock_listen::serve::Bounds::default(),
        std::future::pending(),
    ));
    Ok(bound)
}
