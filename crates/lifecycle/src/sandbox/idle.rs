//! Idle suspend: a running sandbox with no connection for its idle time is
//! suspended. The router counts its own connections; sessions opened straight on
//! the private socket (`airlock psql`, tools on the host) are asked of the server
//! itself before anything is stopped.

use std::time::{Duration, Instant};

use super::stores::{self, At};
use super::suspend::{suspend, SuspendReason};
use super::SandboxState;
use crate::engine::Engine;
use airlock_state::store::SandboxFilter;

/// Whether the sandbox's stores have client sessions other than the asking
/// one and the daemon's own (a Redis's count clients of the router's Redis
/// port and of its socket alike). Counts as yes when a store cannot be asked
/// (a Redis running a script, say), so nothing in use is stopped.
pub async fn has_direct_sessions(engine: &Engine, id: &str) -> bool {
    let dir = engine.layout.sandbox_instance(id);
    let Ok(sb) = engine.store().sandbox(id) else { return true };
    let at = At { engine, sb: &sb, dir: &dir };
    for store in stores::of_sandbox(&dir) {
        match tokio::time::timeout(Duration::from_secs(5), store.clients(at)).await {
            Ok(Some(0)) => {}
            _ => return true,
        }
    }
    false
}

/// When a sandbox without open daemon sessions (gateway, exec) was last used:
/// by those, or through the router, whose process records the time in the
/// store. None while a daemon session is open, or before the daemon has seen it.
pub(crate) fn last_used(engine: &Engine, sb: &super::Sandbox) -> Option<Instant> {
    let local = engine.activity.idle_since(&sb.id)?;
    let routed = sb.active_at.map(|at| {
        let ago = (airlock_core::clock::Timestamp::now().0 - at.0).max(0) as u64;
        Instant::now().checked_sub(Duration::from_millis(ago)).unwrap_or(local)
    });
    Some(routed.map_or(local, |r| r.max(local)))
}

/// Suspends every running sandbox idle for longer than its idle time. Run by
/// the reaper about once a second.
pub async fn suspend_idle(engine: &Engine) {
    let Ok(all) = engine.store().sandboxes(&SandboxFilter::default()) else { return };
    for sb in all.into_iter().filter(|s| s.state == SandboxState::Running && s.idle_suspend_seconds > 0) {
        let Some(since) = last_used(engine, &sb) else {
            // First sight (a daemon restart): count from now.
            if engine.activity.open_count(&sb.id) == 0 {
                engine.activity.touch(&sb.id);
            }
            continue;
        };
        if since.elapsed() < Duration::from_secs(sb.idle_suspend_seconds) {
            continue;
        }
        if has_direct_sessions(engine, &sb.id).await {
            engine.activity.touch(&sb.id);
            continue;
        }
        if let Err(e) = suspend(engine, &sb.id, SuspendReason::Idle).await {
            tracing::debug!(sandbox = %sb.id, error = %e, "idle suspend skipped");
        }
    }
}
