//! Start-up reconciliation after a crash or restart: the store, the processes and
//! the directories are made to agree.
//!
//! - a sandbox half-made (`creating`) or half-deleted (`deleting`) is torn down (`orphan`);
//! - a running sandbox whose TTL passed while the daemon was down is deleted (`ttl`);
//!   these sandboxes are marked `deleting` at once (whatever state they were
//!   in, so the reaper takes up a teardown that fails) and torn down after
//!   reconciliation, in the background and a few at a time, so the API
//!   answers whatever expired while the daemon was down;
//! - a running or pooled server is continued (a branch's pause may have been cut
//!   short) and must answer a query within five seconds, or it is started again;
//! - a running sandbox whose process is gone (host restart) is started again; one
//!   that cannot start is kept suspended with its files, and says why;
//! - a reset cut short is completed, keeping id, address and credential;
//! - a migration test's fork is deleted: no test outlives the daemon that ran it;
//! - a suspended sandbox stays suspended (a server left by an interrupted suspend is stopped);
//! - a store's server or a directory under the volume that the store does not know is removed (`orphan`);
//! - a half-built golden in `staging/` and a generation directory with no row are removed;
//! - uid leases are made to match the live sandboxes.

use airlock_lifecycle::sandbox::stores;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use futures_util::StreamExt;

use serde::Serialize;
use serde_json::json;

use airlock_core::clock::Timestamp;
use airlock_core::error::Result;
use airlock_core::events::{DeleteReason, NewEvent};
use airlock_lifecycle::engine::Engine;
use airlock_lifecycle::sandbox::{self, Sandbox, SandboxState};
use airlock_state::store::SandboxFilter;

/// What reconciliation did, for the daemon log.
#[derive(Debug, Default, Serialize)]
pub struct Reconciled {
    /// Running sandboxes left as they were.
    pub kept: usize,
    /// Running sandboxes whose process had to be started again.
    pub restarted: usize,
    /// Resets a crash cut short, completed.
    pub reset: usize,
    /// Running sandboxes whose server could not start, kept suspended.
    pub unstartable: usize,
    /// Sandboxes whose TTL passed, being deleted in the background.
    pub expired: usize,
    /// Half-made or unknown sandboxes, processes and directories removed (or,
    /// for sandboxes, being removed in the background).
    pub orphans: usize,
}

/// How many teardowns left by a stopped daemon run at once after a restart:
/// each mostly waits on a server's exit and the filesystem, so a few overlap
/// well without crowding out the sandboxes that are kept.
const TEARDOWNS_AT_ONCE: usize = 8;

/// Reconciles store, processes and directories; run once before serving.
/// Sandboxes to delete are marked so and torn down after it returns, in the
/// background (a teardown that fails is taken up again by the reaper).
pub async fn reconcile(engine: &Arc<Engine>) -> Result<Reconciled> {
    let mut teardowns = Vec::new();
    let done = reconcile_deferring(engine, &mut teardowns).await?;
    let engine = engine.clone();
    // Recorded as reconciliation's, as they were when they ran before serving.
    let door = airlock_core::events::Door::Daemon;
    tokio::spawn(airlock_core::events::DOOR.scope(door, async move {
        // Claimed before any starts, so the reaper does not take up the ones still queued.
        let claimed: Vec<_> = teardowns
            .iter()
            .filter_map(|(sb, reason)| Some((engine.claim_teardown(&sb.id)?, sb, *reason)))
            .collect();
        futures_util::stream::iter(claimed)
            .for_each_concurrent(TEARDOWNS_AT_ONCE, |(claim, sb, reason)| {
                let engine = &engine;
                async move {
                    if let Err(e) = sandbox::teardown_claimed(engine, claim, sb, reason).await {
                        tracing::error!(sandbox = %sb.id, error = %e, "could not delete a sandbox found at start; will try again");
                    }
                }
            })
            .await;
    }));
    Ok(done)
}

/// Everything of [`reconcile`] but the teardowns, which go to `teardowns`.
async fn reconcile_deferring(
    engine: &Engine,
    teardowns: &mut Vec<(Sandbox, DeleteReason)>,
) -> Result<Reconciled> {
    let mut done = Reconciled::default();
    let layout = &engine.layout;

    // Processes first: anything under the volume not known to be running goes.
    let all = SandboxFilter { pooled: true, ..Default::default() };
    let rows = engine.store().sandboxes(&all)?;
    let running: HashSet<String> = rows
        .iter()
        .filter(|s| matches!(s.state, SandboxState::Running | SandboxState::Pooled))
        .map(|s| s.id.clone())
        .collect();
    // Servers of builds cut short, and of sandboxes no longer live.
    for store in stores::ALL {
        done.orphans += store.stop_unknown(engine, &running).await?;
    }
    for entry in std::fs::read_dir(layout.staging())?.flatten() {
        tracing::warn!(path = %entry.path().display(), "removing a half-built golden");
        let _ = std::fs::remove_dir_all(entry.path());
    }

    let now = Timestamp::now();
    for sb in rows {
        if sb.is_migration_test_fork() && !matches!(sb.state, SandboxState::Creating | SandboxState::Deleting)
        {
            engine.store().mark_deleting(&sb.id)?;
            teardowns.push((sb, DeleteReason::Orphan));
            done.orphans += 1;
            continue;
        }
        match sb.state {
            // `lost` is only ever shown of another node's sandbox; a row in that
            // state here would be a record no one can finish: an orphan.
            SandboxState::Creating | SandboxState::Deleting | SandboxState::Lost => {
                engine.store().mark_deleting(&sb.id)?;
                teardowns.push((sb, DeleteReason::Orphan));
                done.orphans += 1;
            }
            SandboxState::Running | SandboxState::Suspended | SandboxState::Resetting
                if sb.expires_at <= now =>
            {
                engine.store().mark_deleting(&sb.id)?;
                teardowns.push((sb, DeleteReason::Ttl));
                done.expired += 1;
            }
            // Its server was stopped above if a crash interrupted the suspend.
            SandboxState::Suspended => done.kept += 1,
            SandboxState::Resetting => match sandbox::rebuild(engine, &sb, Instant::now(), true).await {
                Ok(_) => done.reset += 1,
                Err(e) => {
                    tracing::error!(sandbox = %sb.id, error = %e, "could not complete a reset a crash cut short")
                }
            },
            SandboxState::Pooled => {
                if answers(engine, &sb).await? {
                    done.kept += 1;
                } else {
                    // A pool member holds nothing anyone waits for: the pool makes another.
                    sandbox::teardown(engine, &sb, DeleteReason::Drained).await?;
                }
            }
            SandboxState::Running => {
                if answers(engine, &sb).await? {
                    done.kept += 1;
                    continue;
                }
                match sandbox::restart(engine, &sb).await {
                    Ok(_) => done.restarted += 1,
                    Err(e) => {
                        sandbox::suspend::keep_unstartable(engine, &sb, &e).await?;
                        done.unstartable += 1;
                    }
                }
            }
        }
    }

    // Directories nobody owns: a fork that died before its row was written, or a
    // teardown that died after the row went.
    let known: HashSet<String> = engine.store().sandboxes(&all)?.into_iter().map(|s| s.id).collect();
    for entry in std::fs::read_dir(layout.sandboxes())?.flatten() {
        let id = entry.file_name().to_string_lossy().into_owned();
        if known.contains(&id) {
            continue;
        }
        let _ = engine.cloner.remove_tree(&entry.path());
        engine.store().record_or_log(NewEvent {
            kind: airlock_core::events::EventKind::Deleted,
            sandbox: Some(id),
            reason: Some(DeleteReason::Orphan.as_str()),
            detail: json!({"found": "directory without state"}),
            ..Default::default()
        });
        done.orphans += 1;
    }

    // Identity leases: this data root's live sandboxes hold theirs (taken again
    // if a crash lost one), its other leases go back, and leases of data roots
    // that no longer exist are reclaimed.
    if let Some(leases) = &engine.leases {
        let live = engine.store().sandboxes(&all)?;
        for sb in &live {
            if let Some(uid) = sb.uid {
                if let Err(e) = leases.confirm(uid, &sb.id) {
                    tracing::error!(sandbox = %sb.id, error = %e, "a sandbox's uid is leased elsewhere");
                }
            }
        }
        for lease in leases.mine() {
            if !live.iter().any(|sb| sb.id == lease.sandbox && sb.uid == Some(lease.uid)) {
                leases.release(lease.uid, &lease.sandbox);
            }
        }
        let reclaimed = leases.reclaim_abandoned();
        if reclaimed > 0 {
            tracing::info!(reclaimed, "reclaimed uid leases of data roots that no longer exist");
        }
    }

    // Cgroups of sandboxes that are gone (their processes are killed first).
    for id in engine.cgroups.existing() {
        if !known.contains(&id) {
            sandbox::kill_cgroup_members(engine, &id).await;
            done.orphans += 1;
        }
    }

    // Golden generations on disk that the store does not list (a crash between
    // the rename into place and the row).
    for golden_dir in std::fs::read_dir(layout.goldens())?.flatten() {
        let name = golden_dir.file_name().to_string_lossy().into_owned();
        let generations: HashSet<i64> = match engine.store().golden(&name) {
            Ok(g) => g.generations.iter().map(|m| m.generation).collect(),
            Err(_) => HashSet::new(),
        };
        for gen_dir in std::fs::read_dir(golden_dir.path())?.flatten() {
            let known = gen_dir
                .file_name()
                .to_str()
                .and_then(|s| s.parse().ok())
                .is_some_and(|g| generations.contains(&g));
            if !known {
                tracing::warn!(path = %gen_dir.path().display(), "removing a golden generation the store does not list");
                let _ = std::fs::remove_dir_all(gen_dir.path());
            }
        }
        if generations.is_empty() {
            let _ = std::fs::remove_dir(golden_dir.path());
        }
    }
    Ok(done)
}

/// Whether a sandbox's servers run and answer. It is thawed and its
/// processes continued first, and its stores' writes let go: a daemon that
/// died during a branch or promotion left the source stopped.
async fn answers(engine: &Engine, sb: &Sandbox) -> Result<bool> {
    if sb.pid.is_none() {
        return Ok(false);
    }
    let dir = engine.layout.sandbox_instance(&sb.id);
    let at = stores::At { engine, sb, dir: &dir };
    let all = stores::of_sandbox(&dir);
    let Some(first) = stores::first_server(&all) else { return Ok(false) };
    // A daemon that died while copying the sandbox (a branch, a promotion)
    // left it frozen (or, without a freezer, its first server and that
    // server's children stopped), and its stores' writes held.
    engine.cgroups.thaw(&sb.id);
    let alive = first.serves(at)?;
    if let (true, Some(pid)) = (alive, sb.pid) {
        airlock_lifecycle::sandbox::branch::continue_all(pid);
    }
    for store in &all {
        if let Err(e) = store.resume_writes(at).await {
            tracing::warn!(sandbox = %sb.id, store = store.name(), error = %e, "a kept store's writes could not be resumed");
        }
    }
    if !alive {
        return Ok(false);
    }
    // The first server, and every store that cannot start again alone, must
    // answer; another whose server died (a Redis beside a PostgreSQL) is
    // started again by the reaper, as it would be at any time.
    for store in all.iter().filter(|s| !s.restarts_alone() || s.name() == first.name()) {
        if !store.answers(at).await {
            tracing::warn!(sandbox = %sb.id, store = store.name(), "a kept store does not answer; starting the sandbox again");
            return Ok(false);
        }
    }
    Ok(true)
}
