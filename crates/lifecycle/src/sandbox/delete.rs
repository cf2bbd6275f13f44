//! Deleting a sandbox: by its owner, its TTL, a failed fork or the reaper;
//! every kind of deletion ends in one teardown.

use std::time::{Duration, Instant};

use serde_json::json;

use super::stores::{self, At, Stop};
use super::{instance_dir, ms, Sandbox, SandboxState};
use crate::engine::{Engine, TeardownClaim};
use crate::golden;
use airlock_core::clock::Timestamp;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::events::{DeleteReason, NewEvent};

/// Deletes a sandbox by id or name. Waits for a fork in progress to finish first;
/// if another caller is already deleting it, waits for that.
pub async fn delete(engine: &Engine, key: &str, reason: DeleteReason) -> Result<Sandbox> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen: Option<Sandbox> = None;
    // Since when a `deleting` row has had no teardown under way.
    let mut unclaimed_since: Option<Instant> = None;
    loop {
        let sb = match engine.store().sandbox(key) {
            Ok(sb) => sb,
            // Someone else finished deleting it while we waited: that is what was asked.
            Err(e) if e.code == ErrorCode::SandboxNotFound && seen.is_some() => {
                return Ok(seen.take().expect("checked"))
            }
            Err(e) => return Err(e),
        };
        match sb.state {
            SandboxState::Running | SandboxState::Suspended => {
                // Not while a suspend or wake is stopping or starting its server.
                let _op = engine.sandbox_lock(&sb.id).await;
                let sb = engine.store().sandbox(&sb.id)?;
                // A TTL's deletion only while it is still due: an extension
                // that came first wins.
                let begun = match reason {
                    DeleteReason::Ttl => engine.store().begin_expiry_delete(&sb.id, Timestamp::now())?,
                    _ => engine.store().begin_delete(&sb.id)?,
                };
                if begun {
                    teardown(engine, &sb, reason).await?;
                    return Ok(sb);
                }
                if reason == DeleteReason::Ttl && sb.expires_at > Timestamp::now() {
                    return Err(Error::new(
                        ErrorCode::InvalidTtl,
                        format!(
                            "sandbox {} is not due: its TTL was extended to {}",
                            sb.id,
                            sb.expires_at.to_rfc3339()
                        ),
                        "nothing to do; it is deleted when its new TTL passes",
                    ));
                }
            }
            // A teardown that failed left it; take it up (after a moment, so a
            // deletion about to start its own teardown is not raced).
            SandboxState::Deleting if !engine.tearing_down(&sb.id) && Instant::now() < deadline => {
                let since = *unclaimed_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= RESUME_AFTER {
                    teardown(engine, &sb, reason).await?;
                }
            }
            SandboxState::Creating | SandboxState::Resetting | SandboxState::Deleting
                if Instant::now() < deadline =>
            {
                unclaimed_since = None;
            }
            _ => {
                return Err(Error::internal(format!(
                    "sandbox {} is stuck in state {}",
                    sb.id,
                    sb.state.as_str()
                )))
            }
        }
        seen = Some(sb);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How long a `deleting` row must go without a teardown under way before
/// another takes it up.
pub const RESUME_AFTER: Duration = Duration::from_secs(1);

/// Stops a sandbox's processes, removes its files and its state row, and records
/// why. Used for every kind of deletion, including failed forks and orphans.
///
/// A teardown that fails (say, it could not tell whether the server still runs)
/// leaves the row `deleting`; the reaper, or the next `delete`, takes it up
/// again. While one is under way another returns at once.
pub async fn teardown(engine: &Engine, sb: &Sandbox, reason: DeleteReason) -> Result<()> {
    let Some(claim) = engine.claim_teardown(&sb.id) else { return Ok(()) };
    teardown_claimed(engine, claim, sb, reason).await
}

/// [`teardown`], its claim taken already (by a caller that queues teardowns
/// and must keep others from taking them up meanwhile).
pub async fn teardown_claimed(
    engine: &Engine,
    _claim: TeardownClaim<'_>,
    sb: &Sandbox,
    reason: DeleteReason,
) -> Result<()> {
    let began = Instant::now();
    engine.pool.admins.lock().unwrap_or_else(|p| p.into_inner()).remove(&sb.id);
    let dir = instance_dir(engine, &sb.id);
    // Files are never removed under a server that may still run.
    for store in stores::of_sandbox(&dir) {
        store.stop(At { engine, sb, dir: &dir }, Stop::Now).await?;
    }
    kill_cgroup_members(engine, &sb.id).await;
    if let Err(e) = engine.cloner.discard_sandbox_dir(&dir.root) {
        if e.kind() != std::io::ErrorKind::NotFound {
            return Err(Error::io(format!("removing {}", dir.root.display()), &e));
        }
    }
    {
        let mut store = engine.store();
        store.delete_sandbox(&sb.id)?;
        store.record_or_log(NewEvent {
            kind: airlock_core::events::EventKind::Deleted,
            sandbox: Some(sb.id.clone()),
            golden: Some(sb.golden.clone()),
            reason: Some(reason.as_str()),
            detail: json!({"generation": sb.generation, "expires_at": sb.expires_at, "delete_ms": ms(began)}),
            ..Default::default()
        });
    }
    // Its processes and files are gone: the uid can serve another sandbox.
    engine.release_identity(sb);
    engine.forget_sandbox(&sb.id);
    engine.headroom.forget(&sb.id);
    engine.room.freed.notify_waiters();
    golden::prune(engine, &sb.golden)
}

/// Kills whatever is left in a sandbox's cgroups (backends of a killed server,
/// `exec` processes), then removes the cgroups.
pub async fn kill_cgroup_members(engine: &Engine, id: &str) {
    for _ in 0..200 {
        let members = engine.cgroups.members(id);
        if members.is_empty() {
            break;
        }
        for pid in members {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    engine.cgroups.remove(id);
}
