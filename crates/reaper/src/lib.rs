//! The lifecycle loop: deletes sandboxes whose TTL has passed ([`ttl`]), suspends idle
//! ones, stops the writer when the volume runs into its reserve ([`reserve`]),
//! holds time and connection ceilings ([`watchdog`]), stops runaway Redis
//! scripts ([`scripts`]), and at daemon start reconciles state, processes and
//! directories ([`reconcile`]).

mod reconcile;
mod reserve;
pub mod scripts;
mod ttl;
pub mod watchdog;

pub use reconcile::{reconcile, Reconciled};

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_core::events::DeleteReason;
use airlock_core::events::{Door, NewEvent};
use airlock_lifecycle::engine::Engine;
use airlock_lifecycle::sandbox::stores::{self, StoreKind};
use airlock_lifecycle::sandbox::{self, SandboxState};
use airlock_state::store::SandboxFilter;

/// How often the reaper's round runs: the disk reserve, dead servers,
/// stalled teardowns and disk use (TTLs have a timer of their own, [`ttl`]).
const TICK: Duration = Duration::from_millis(200);

/// How often each sandbox's disk headroom is read and given again
/// ([`sandbox::headroom`]): a writer's headroom grows this often.
const HEADROOM_TICK: Duration = Duration::from_millis(100);

/// How often idle sandboxes are looked for.
const IDLE_TICK: Duration = Duration::from_secs(1);

/// Events kept: every router connection is one, so without a bound the store
/// would grow with traffic. The newest are kept.
pub const EVENTS_KEPT: i64 = 200_000;

/// Spawns reaper work: the events it records name the reaper as their door.
pub(crate) fn spawn_as_reaper<F>(work: F) -> tokio::task::JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(airlock_core::events::DOOR.scope(Door::Reaper, work))
}

/// Runs the TTL timer, the idle-suspend loop and the reaper's round until the daemon exits.
pub fn spawn(engine: Arc<Engine>) -> tokio::task::JoinHandle<()> {
    spawn_as_reaper(ttl::keep(engine.clone()));
    if sandbox::headroom::Headroom::applies(&engine) {
        let balancing = engine.clone();
        spawn_as_reaper(async move {
            let mut tick = tokio::time::interval(HEADROOM_TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let engine = balancing.clone();
                let _ = tokio::task::spawn_blocking(move || engine.headroom.balance(&engine)).await;
            }
        });
    }
    let idle = engine.clone();
    spawn_as_reaper(async move {
        let mut tick = tokio::time::interval(IDLE_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            sandbox::suspend_idle(&idle).await;
        }
    });
    spawn_as_reaper(async move {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ticks: u64 = 0;
        let mut disk_cursor = 0usize;
        let mut reserve = reserve::Watch::default();
        let mut stalled = HashMap::new();
        loop {
            tick.tick().await;
            ticks += 1;
            reserve.check(&engine).await;
            if ticks.is_multiple_of(5) {
                watch_servers(&engine);
                resume_teardowns(&engine, &mut stalled);
                disk_cursor = watch_disk(&engine, disk_cursor).await;
            }
            if ticks.is_multiple_of(25) {
                airlock_lifecycle::golden::dump::expire_kept(&engine, engine.config.import_keep);
            }
            if ticks.is_multiple_of(300) {
                match engine.store().trim_events(EVENTS_KEPT) {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(trimmed = n, kept = EVENTS_KEPT, "trimmed old events"),
                    Err(e) => tracing::warn!(error = %e, "could not trim old events"),
                }
            }
        }
    })
}

/// Deletes running sandboxes whose server is gone (killed by a limit, or crashed),
/// with an event saying so, so nothing dead is left looking alive.
fn watch_servers(engine: &Arc<Engine>) {
    let Ok(all) = engine.store().sandboxes(&SandboxFilter { pooled: true, ..Default::default() }) else {
        return;
    };
    for sb in all.into_iter().filter(|s| matches!(s.state, SandboxState::Running | SandboxState::Pooled)) {
        let dir = engine.layout.sandbox_instance(&sb.id);
        let at = stores::At { engine, sb: &sb, dir: &dir };
        let all_stores = stores::of_sandbox(&dir);
        // The sandbox lives while the server its record names does, unless
        // that store starts again by itself (a sandbox with only a Redis).
        // (A sandbox whose directory holds no store any more is dead too.)
        let first = stores::first_server(&all_stores);
        let first_alive = match (first, sb.pid) {
            (Some(first), Some(_)) => first.serves(at),
            _ => Ok(false),
        };
        match first_alive {
            Ok(alive) if alive || first.is_some_and(|f| f.restarts_alone()) => {
                // Only a store that starts again alone is started again here;
                // one that cannot (PostgreSQL) is the first server, whose
                // death the next pass sees.
                let dead: Vec<&'static dyn StoreKind> = all_stores
                    .iter()
                    .copied()
                    .filter(|s| s.has_server() && s.restarts_alone() && s.pid(at).is_none())
                    .collect();
                if dead.is_empty() {
                    continue;
                }
                // A pool member holds nothing anyone waits for: the pool makes
                // another. A sandbox's other stores, killed by a limit say,
                // start again.
                match sb.state {
                    SandboxState::Pooled => {
                        let engine = engine.clone();
                        spawn_as_reaper(async move {
                            if engine.store().begin_drain(&sb.id).unwrap_or(false) {
                                let _ = sandbox::teardown(&engine, &sb, DeleteReason::Drained).await;
                            }
                        });
                    }
                    _ => {
                        for store in dead {
                            spawn_as_reaper(restart_store(engine.clone(), sb.id.clone(), store));
                        }
                    }
                }
                continue;
            }
            Ok(_) => {}
            // Could not look (out of descriptors, say): that says nothing about the server.
            Err(e) => {
                tracing::warn!(sandbox = %sb.id, error = %e, "could not check its server; will look again");
                continue;
            }
        }
        // A server that died while the volume was full (a WAL write that could
        // not be made) left consistent files: the sandbox is kept, suspended, to
        // wake once there is room, rather than deleted for what its neighbours
        // did. The volume must really be full; the log decides nothing: at a
        // full volume the server may not have been able to write its last words
        // (a red-team round lost a neighbour so), and the agent can write any
        // words there. Kept by mistake, a sandbox costs a suspend; deleted by
        // mistake, its data. A server that stopped at its own limit (its
        // WAL's, say, under a bulk load) is kept so too: the agent learns
        // what happened and a reset or wake gives it back.
        let log = engine.layout.sandbox(&sb.id).join("postgres.log");
        let volume_full = airlock_lifecycle::sandbox::volume::Space::of(engine).free < VOLUME_FULL_BELOW
            || engine.headroom.at_its_limit(engine, &sb.id);
        if sb.state == SandboxState::Running && volume_full {
            if engine.store().suspend_dead(&sb.id, sb.pid).unwrap_or(false) {
                tracing::warn!(sandbox = %sb.id, "its server stopped at a full disk; kept suspended");
                engine.store().record_or_log(NewEvent {
                    kind: airlock_core::events::EventKind::Suspended,
                    sandbox: Some(sb.id.clone()),
                    golden: Some(sb.golden.clone()),
                    reason: Some("disk_full"),
                    detail: serde_json::json!({"log": airlock_host::contain::log_tail(&log), "clean": false}),
                    door: Some(Door::Reaper),
                });
                let engine = engine.clone();
                spawn_as_reaper(async move { sandbox::kill_cgroup_members(&engine, &sb.id).await });
            }
            continue;
        }
        // Only if it is still the same live row (a suspend stops servers on purpose).
        if !engine.store().begin_delete_dead(&sb.id, sb.pid).unwrap_or(false) {
            continue;
        }
        engine.store().record_or_log(NewEvent {
            kind: airlock_core::events::EventKind::ServerExited,
            sandbox: Some(sb.id.clone()),
            golden: Some(sb.golden.clone()),
            detail: serde_json::json!({"log": airlock_host::contain::log_tail(&engine.layout.sandbox(&sb.id).join("postgres.log"))}),
            ..Default::default()
        });
        let engine = engine.clone();
        spawn_as_reaper(async move {
            tracing::warn!(sandbox = %sb.id, "its server exited; deleting it");
            if let Err(e) = sandbox::teardown(&engine, &sb, DeleteReason::Failed).await {
                tracing::error!(sandbox = %sb.id, error = %e, "could not delete a sandbox whose server exited");
            }
        });
    }
}

/// Starts again a store of a running sandbox whose server died (its memory
/// cgroup killed it, say), from the data it last saved, and records it.
async fn restart_store(engine: Arc<Engine>, id: String, store: &'static dyn StoreKind) {
    let op = engine.sandbox_lock(&id).await;
    let Ok(sb) = engine.store().sandbox(&id) else { return };
    let dir = engine.layout.sandbox_instance(&id);
    let at = stores::At { engine: &engine, sb: &sb, dir: &dir };
    if sb.state != SandboxState::Running || store.pid(at).is_some() {
        return;
    }
    let started = async {
        // Beside the sandbox's other running server, if any: in its network
        // namespace, where `exec` code reaches both.
        let cgroups = engine.cgroups.procs_files(&id);
        let others = stores::of_sandbox(&dir);
        let running = others.iter().filter(|s| s.name() != store.name()).find_map(|s| s.pid(at));
        let launch = match running {
            Some(pid) => stores::Launch::beside(&engine, &sb, cgroups, pid)?,
            None => stores::Launch::of(&engine, &sb, cgroups).await?,
        };
        store.start(at, &launch, stores::Credential::Kept, &mut sandbox::Steps::default()).await
    }
    .await;
    tracing::warn!(sandbox = %id, store = store.name(), restarted = started.is_ok(), "a store's server had exited");
    engine.store().record_or_log(NewEvent {
        kind: airlock_core::events::EventKind::ServerExited,
        sandbox: Some(id.clone()),
        golden: Some(sb.golden.clone()),
        detail: serde_json::json!({"store": store.name(), "restarted": started.is_ok()}),
        ..Default::default()
    });
    // When its server is the one the sandbox is known by, its new pid is the
    // sandbox's, and one that cannot start is gone like a dead postmaster.
    let first = stores::first_server(&stores::of_sandbox(&dir)).map(|s| s.name());
    if first != Some(store.name()) {
        return;
    }
    match started {
        Ok(Some(pid)) => {
            if let Err(e) = engine.store().set_running(&id, pid, sb.dsn.as_deref().unwrap_or_default()) {
                tracing::warn!(sandbox = %id, error = %e, "could not record a restarted store's pid");
            }
        }
        Ok(None) => {}
        Err(e) => {
            drop(op);
            if engine.store().begin_delete_dead(&id, sb.pid).unwrap_or(false) {
                tracing::warn!(sandbox = %id, error = %e, "its only server could not start again; deleting it");
                if let Err(e) = sandbox::teardown(&engine, &sb, DeleteReason::Failed).await {
                    tracing::error!(sandbox = %id, error = %e, "could not delete a sandbox whose server exited");
                }
            }
        }
    }
}

/// Free space on the volume below which it counts as full.
const VOLUME_FULL_BELOW: u64 = 64 << 20;

/// Takes up deletions whose teardown failed (it could not tell whether the
/// server still ran, say, or could not remove a file), once they have gone
/// `sandbox::RESUME_AFTER` with no teardown under way. `stalled` remembers since
/// when each has been seen so, across rounds.
fn resume_teardowns(engine: &Arc<Engine>, stalled: &mut HashMap<String, Instant>) {
    let Ok(all) = engine.store().sandboxes(&SandboxFilter { pooled: true, ..Default::default() }) else {
        return;
    };
    let now = Instant::now();
    let waiting: Vec<_> = all
        .into_iter()
        .filter(|s| s.state == SandboxState::Deleting && !engine.tearing_down(&s.id))
        .collect();
    stalled.retain(|id, _| waiting.iter().any(|s| &s.id == id));
    for sb in waiting {
        let since = *stalled.entry(sb.id.clone()).or_insert(now);
        if since.elapsed() < sandbox::RESUME_AFTER {
            continue;
        }
        stalled.remove(&sb.id);
        let engine = engine.clone();
        spawn_as_reaper(async move {
            tracing::info!(sandbox = %sb.id, "taking up a deletion that stalled");
            if let Err(e) = sandbox::teardown(&engine, &sb, DeleteReason::Orphan).await {
                tracing::error!(sandbox = %sb.id, error = %e, "could not finish deleting a sandbox; will try again");
            }
        });
    }
}

/// Sandboxes whose disk use is checked per second: the check walks a data
/// directory, so a large host checks each sandbox every few seconds, round robin.
const DISK_CHECKS_PER_SECOND: usize = 20;

/// Deletes sandboxes that grew past the disk limit beyond their golden, with an
/// event saying so. Returns where the next round starts. (The host kernel may
/// lack filesystem quotas, so this is a watch, not a hard quota: a sandbox can
/// overshoot by what it writes between two checks.)
async fn watch_disk(engine: &Arc<Engine>, cursor: usize) -> usize {
    // A hard quota holds the limit itself (the writer gets EDQUOT); nothing to watch.
    if engine.cloner.hard_quota() {
        return 0;
    }
    let Ok(all) = engine.store().sandboxes(&SandboxFilter::default()) else { return 0 };
    let running: Vec<_> = all.into_iter().filter(|s| s.state == SandboxState::Running).collect();
    if running.is_empty() {
        return 0;
    }
    let start = cursor % running.len();
    let batch: Vec<_> =
        running.iter().cycle().skip(start).take(DISK_CHECKS_PER_SECOND.min(running.len())).cloned().collect();
    for sb in batch {
        let golden_size = engine
            .store()
            .golden(&sb.golden)
            .ok()
            .and_then(|g| g.generations.iter().find(|m| m.generation == sb.generation).map(|m| m.size_bytes))
            .unwrap_or(0);
        let dir = engine.layout.sandbox(&sb.id);
        let used =
            tokio::task::spawn_blocking(move || airlock_host::storage::tree_size(&dir)).await.unwrap_or(0);
        let grown = used.saturating_sub(golden_size);
        if grown <= engine.config.disk_limit_bytes || !engine.store().begin_delete(&sb.id).unwrap_or(false) {
            continue;
        }
        engine.store().record_or_log(NewEvent {
            kind: airlock_core::events::EventKind::DiskLimitExceeded,
            sandbox: Some(sb.id.clone()),
            golden: Some(sb.golden.clone()),
            detail: serde_json::json!({"grown_bytes": grown, "limit_bytes": engine.config.disk_limit_bytes}),
            ..Default::default()
        });
        let engine = engine.clone();
        spawn_as_reaper(async move {
            tracing::warn!(sandbox = %sb.id, grown, "over its disk limit; deleting it");
            if let Err(e) = sandbox::teardown(&engine, &sb, DeleteReason::Quota).await {
                tracing::error!(sandbox = %sb.id, error = %e, "could not delete a sandbox over its disk limit");
            }
        });
    }
    start + DISK_CHECKS_PER_SECOND
}
