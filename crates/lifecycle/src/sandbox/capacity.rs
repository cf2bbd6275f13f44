//! Capacity: limits on running sandboxes, on all sandboxes and on the volume's
//! disk use. When a fork or wake finds no room, idle sandboxes are suspended
//! first (least recently used), then warm-pool members are given up, then it
//! waits its turn in a first-in-first-out queue for up to its `--wait`, then
//! fails with `capacity_exhausted`.

use std::time::{Duration, Instant};

use tokio::sync::MutexGuard;

use super::suspend::{suspend, SuspendReason};
use super::volume::Space;
use super::SandboxState;
use crate::engine::Engine;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::events::DeleteReason;
use airlock_state::store::SandboxFilter;

/// What the caller is about to add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// A new sandbox with a running server (a cold fork or a branch).
    New,
    /// A running server for an existing sandbox (a wake).
    Start,
}

/// Room granted; hold it until the new sandbox's row is recorded (or the woken
/// server is up), so the next in the queue counts it.
pub struct Admitted<'a> {
    _turn: MutexGuard<'a, ()>,
}

/// Waits (first come, first served) until there is room for `need`, suspending
/// idle sandboxes or draining pool members to make it; `except` is never
/// suspended (the one being woken).
pub async fn admit<'a>(
    engine: &'a Engine,
    wait: Duration,
    need: Need,
    except: Option<&str>,
) -> Result<Admitted<'a>> {
    let deadline = Instant::now() + wait;
    // The queue is held briefly by each admission, and for long only by forks
    // waiting for room. Queue behind the first kind even without `--wait`; behind
    // the second only if willing to wait.
    if wait.is_zero() && engine.room.waiting.load(std::sync::atomic::Ordering::SeqCst) > 0 {
        return Err(full(engine, "other forks are already waiting for room"));
    }
    let turn_deadline = Instant::now() + wait.max(QUICK_TURN);
    let turn = match tokio::time::timeout_at(turn_deadline.into(), engine.room.admission.lock()).await {
        Ok(turn) => turn,
        Err(_) => return Err(full(engine, "other forks are ahead in the queue")),
    };
    loop {
        let freed = engine.room.freed.notified();
        tokio::pin!(freed);
        freed.as_mut().enable();
        let why = match room(engine, need)? {
            None => return Ok(Admitted { _turn: turn }),
            Some(why) => why,
        };
        if why.running_only && suspend_least_recently_used(engine, except).await {
            continue;
        }
        if why.pool_helps && drain_a_pool_member(engine).await {
            continue;
        }
        let waiting = WaitingForRoom::new(engine);
        let waited = tokio::time::timeout_at(deadline.into(), freed).await;
        drop(waiting);
        if waited.is_err() {
            return Err(match why.code {
                ErrorCode::DiskFull => {
                    let mut e = super::headroom::no_room(engine);
                    e.message = why.message;
                    e
                }
                _ => full(engine, &why.message),
            });
        }
    }
}

/// Counts a queued admission as waiting for room while it lives (also when the
/// waiting future is dropped, as a router connection's is when its client goes).
struct WaitingForRoom<'a>(&'a Engine);

impl<'a> WaitingForRoom<'a> {
    fn new(engine: &'a Engine) -> Self {
        engine.room.waiting.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        WaitingForRoom(engine)
    }
}

impl Drop for WaitingForRoom<'_> {
    fn drop(&mut self) {
        self.0.room.waiting.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// How long a fork without `--wait` may queue behind admissions that are not
/// waiting for room (each only checks the limits and records a row).
const QUICK_TURN: Duration = Duration::from_secs(30);

struct NoRoom {
    message: String,
    /// What the error says: `capacity_exhausted`, or `disk_full` when the
    /// volume cannot promise a server its disk headroom.
    code: ErrorCode,
    /// Suspending a sandbox would make room.
    running_only: bool,
    /// Giving up a pool member would make room.
    pool_helps: bool,
}

fn room(engine: &Engine, need: Need) -> Result<Option<NoRoom>> {
    let (all, running) = engine.store().counts()?;
    let c = &engine.config;
    if need == Need::New && all >= c.max_sandboxes {
        return Ok(Some(NoRoom {
            message: format!("{all} sandboxes exist, the limit"),
            running_only: false,
            pool_helps: true,
            code: ErrorCode::CapacityExhausted,
        }));
    }
    let Space { used, free, reserve, .. } = Space::of(engine);
    if free < reserve {
        return Ok(Some(NoRoom {
            message: format!(
                "no room for another sandbox: the volume has {free} bytes free, below its reserve of {reserve}"
            ),
            running_only: false,
            pool_helps: true,
            code: ErrorCode::DiskFull,
        }));
    }
    if let Some(max) = c.max_disk_bytes {
        if used >= max {
            return Ok(Some(NoRoom {
                message: format!("the volume holds {used} bytes, the limit is {max}"),
                running_only: false,
                pool_helps: false,
                code: ErrorCode::CapacityExhausted,
            }));
        }
    }
    if running >= c.max_running {
        return Ok(Some(NoRoom {
            message: format!("{running} sandboxes are running, the limit, and none is idle"),
            running_only: true,
            pool_helps: true,
            code: ErrorCode::CapacityExhausted,
        }));
    }
    // Last, so a promise is taken only for what is admitted.
    if !engine.headroom.promise(engine) {
        return Ok(Some(NoRoom {
            message: super::headroom::no_room(engine).message,
            // Suspending a neighbour would free its promise only until it
            // wakes, which then could not: never done for disk.
            running_only: false,
            pool_helps: true,
            code: ErrorCode::DiskFull,
        }));
    }
    Ok(None)
}

fn full(engine: &Engine, why: &str) -> Error {
    let c = &engine.config;
    Error::new(
        ErrorCode::CapacityExhausted,
        format!("no room for another sandbox: {why}"),
        format!(
            "wait longer (--wait 30s), delete or suspend sandboxes you no longer need, or raise the daemon's limits \
             (--max-running {}, --max-sandboxes {})",
            c.max_running, c.max_sandboxes
        ),
    )
}

/// Deletes the oldest warm-pool member of any golden (the pool refills when there
/// is room again); false if there is none.
async fn drain_a_pool_member(engine: &Engine) -> bool {
    let filter = SandboxFilter { pooled: true, ..Default::default() };
    let Ok(all) = engine.store().sandboxes(&filter) else { return false };
    for member in all.into_iter().filter(|s| s.state == SandboxState::Pooled) {
        if engine.store().begin_drain(&member.id).unwrap_or(false) {
            return super::teardown(engine, &member, DeleteReason::Drained).await.is_ok();
        }
    }
    false
}

/// Suspends the running sandbox unused for longest that has no connection open;
/// false if there is none.
async fn suspend_least_recently_used(engine: &Engine, except: Option<&str>) -> bool {
    let Ok(all) = engine.store().sandboxes(&SandboxFilter::default()) else { return false };
    let mut idle: Vec<_> = all
        .into_iter()
        .filter(|s| s.state == SandboxState::Running && Some(s.id.as_str()) != except)
        .filter_map(|s| super::idle::last_used(engine, &s).map(|t| (t, s.id)))
        .collect();
    idle.sort();
    for (_, id) in idle {
        if super::idle::has_direct_sessions(engine, &id).await {
            continue;
        }
        if suspend(engine, &id, SuspendReason::Capacity).await.is_ok() {
            return true;
        }
    }
    false
}
