//! `airlock reset`: a sandbox put back to its golden's state, keeping its id,
//! address and credential; and the rebuild a crash cut short, completed at start.

use std::time::Instant;

use serde_json::json;

use super::stores::{self, At, Stop};
use super::{
    bring_up, capacity, instance_dir, kill_cgroup_members, ms, teardown, Sandbox, SandboxState, Steps,
};
use crate::engine::Engine;
use airlock_core::dsn;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::events::{DeleteReason, NewEvent};

/// Puts a running sandbox back to its golden's state, keeping its id, address and
/// credential: the server is stopped, its data directory cloned again from the
/// generation it was forked from, and the same role created again.
pub async fn reset(engine: &Engine, key: &str) -> Result<Sandbox> {
    let began = Instant::now();
    let id = engine.store().sandbox(key)?.id;
    // Not while a suspend, wake, branch or delete is under way on it.
    let _op = engine.sandbox_lock(&id).await;
    let sb = engine.store().sandbox(&id)?;
    // A suspended sandbox is rebuilt as it lies, never woken first: a server
    // started on the data the reset throws away could not start when that
    // data is what filled its allowance. It needs a running slot all the same.
    let _admitted = match sb.state {
        SandboxState::Suspended => {
            Some(capacity::admit(engine, engine.config.wake_wait, capacity::Need::Start, Some(&id)).await?)
        }
        _ => None,
    };
    // Marked `resetting` while it is rebuilt: deletes wait, the router holds new
    // clients, and a daemon that dies in between completes the reset at start.
    let resettable = matches!(sb.state, SandboxState::Running | SandboxState::Suspended);
    if !resettable || !engine.store().begin_reset(&sb.id)? {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            format!("sandbox {} is {}, not running", sb.id, sb.state.as_str()),
            "wait for the operation in progress to finish, then reset again",
        ));
    }
    airlock_core::crashpoint::reached("reset.begun");
    rebuild(engine, &sb, began, false).await
}

/// Rebuilds a `resetting` sandbox from the generation it was forked from and
/// marks it running with the same address and credential; if that cannot be
/// done, deletes it. Used by `reset`, and at start for a reset a crash cut short
/// (`after_crash`).
pub async fn rebuild(engine: &Engine, sb: &Sandbox, began: Instant, after_crash: bool) -> Result<Sandbox> {
    let dir = instance_dir(engine, &sb.id);
    let mut steps = Steps::default();
    let rebuilt = async {
        let password = sb
            .dsn
            .as_deref()
            .and_then(dsn::password)
            .ok_or_else(|| Error::internal(format!("sandbox {} has no credential to keep", sb.id)))?;
        // Its servers: the one the reset began with, and one a crash left half-started.
        let stores = stores::of_sandbox(&dir);
        // Its clients are told why their sessions end.
        if sb.state == SandboxState::Running {
            stores::end_sessions_all(&stores, At { engine, sb, dir: &dir }, stores::Ending::Reset).await;
        }
        for store in &stores {
            store.stop(At { engine, sb, dir: &dir }, Stop::Now).await?;
        }
        kill_cgroup_members(engine, &sb.id).await;
        engine.services.changed(&sb.id, crate::services::Change::Reset);
        airlock_core::crashpoint::reached("reset.stopped");
        // remove_dir_all removes links inside, never what they point at.
        engine.cloner.unlimit(&dir.root);
        for store in &stores {
            store.remove_data(At { engine, sb, dir: &dir })?;
        }
        engine.headroom.regroup(&sb.id);
        engine.headroom.limit_new(engine, &dir.root)?;
        bring_up(engine, sb, &password, &mut steps).await
    }
    .await;
    match rebuilt {
        Ok(pid) => {
            let mut store = engine.store();
            store.set_running(&sb.id, pid, sb.dsn.as_deref().unwrap_or_default())?;
            store.record_or_log(NewEvent {
                kind: airlock_core::events::EventKind::Reset,
                sandbox: Some(sb.id.clone()),
                golden: Some(sb.golden.clone()),
                detail: json!({"reset_ms": ms(began), "steps": steps, "generation": sb.generation,
                    "completed_after_restart": after_crash}),
                ..Default::default()
            });
            store.sandbox(&sb.id)
        }
        Err(e) => {
            tracing::warn!(sandbox = %sb.id, error = %e, "reset failed; deleting the sandbox");
            teardown(engine, sb, DeleteReason::Failed).await?;
            Err(Error::new(
                e.code,
                format!("resetting sandbox {} failed, and it was deleted: {}", sb.id, e.message),
                e.hint,
            ))
        }
    }
}
