//! Suspend and wake: stopping an idle sandbox's server to free its memory while
//! keeping its files, credential and address, and starting it again when a
//! client connects through the router (or `airlock wake` asks).
//!
//! Both run under the sandbox's operation lock, so a client connecting while a
//! suspend is under way waits for it and then wakes the sandbox.

use std::time::Instant;

use serde_json::json;

use super::stores::{self, At, Stop};
use super::{kill_cgroup_members, ms, Sandbox, SandboxState};
use crate::engine::Engine;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::events::NewEvent;

/// Why a sandbox was suspended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SuspendReason {
    /// `airlock suspend`.
    User,
    /// No connection for its idle time.
    Idle,
    /// Room was needed for another sandbox (least recently used first).
    Capacity,
    /// It was writing when the volume reached its free-space reserve: stopped at
    /// once, without a checkpoint.
    DiskFull,
}

impl SuspendReason {
    fn as_str(self) -> &'static str {
        match self {
            SuspendReason::User => "user",
            SuspendReason::Idle => "idle",
            SuspendReason::Capacity => "capacity",
            SuspendReason::DiskFull => "disk_full",
        }
    }
}

/// Stops a running sandbox's server (a clean, fast shutdown), keeping the rest.
/// Suspending a suspended sandbox is a no-op.
pub async fn suspend(engine: &Engine, key: &str, reason: SuspendReason) -> Result<Sandbox> {
    let id = engine.store().sandbox(key)?.id;
    let _op = engine.sandbox_lock(&id).await;
    let sb = engine.store().sandbox(&id)?;
    match sb.state {
        SandboxState::Suspended => return Ok(sb),
        SandboxState::Running if engine.store().begin_suspend(&id)? => {}
        _ => {
            return Err(Error::new(
                ErrorCode::InvalidRequest,
                format!("sandbox {id} is {}, not running", sb.state.as_str()),
                "wait for the operation in progress to finish, then suspend again",
            ))
        }
    }
    let began = Instant::now();
    let dir = engine.layout.sandbox_instance(&id);
    let at = At { engine, sb: &sb, dir: &dir };
    let stores = stores::of_sandbox(&dir);
    // Every store saves its state in the sandbox's own directory, which a
    // wake starts from, before any is stopped; at a full disk nothing more is
    // written (a checkpoint included), and a wake starts from the last state
    // saved (PostgreSQL recovers from its WAL).
    if reason != SuspendReason::DiskFull {
        for store in &stores {
            if let Err(e) = store.save(at).await {
                // Still running as it was: no store was stopped.
                engine.store().set_running(
                    &id,
                    sb.pid.unwrap_or_default(),
                    sb.dsn.as_deref().unwrap_or_default(),
                )?;
                return Err(Error::new(
                    e.code,
                    format!(
                        "sandbox {id} was not suspended: its {} could not save its data: {}",
                        store.name(),
                        e.message
                    ),
                    "free some of the sandbox's disk space or let a script it runs end (a runaway one is \
                     killed within seconds), then suspend again; or delete the sandbox",
                ));
            }
        }
    }
    let how = match reason {
        SuspendReason::DiskFull => Stop::Now,
        _ => Stop::Clean,
    };
    // Stopped in the reverse of their order, the first server (the one the
    // sandbox is known by) last: what saved its state just now stops at once,
    // taking no write after its save while a slower shutdown runs.
    // Its clients are told why their sessions end (at a full disk the server
    // could not write why).
    if how == Stop::Clean {
        stores::end_sessions_all(&stores, at, stores::Ending::Suspend).await;
    }
    let mut clean = true;
    for store in stores.iter().rev() {
        clean &= match store.stop(at, how).await {
            Ok(clean) => clean,
            Err(e) if how == Stop::Now => return Err(e),
            Err(_) => false,
        };
    }
    kill_cgroup_members(engine, &id).await;
    engine.services.changed(&id, crate::services::Change::Suspended);
    engine.headroom.withdraw(engine, &id);
    engine.store().record_or_log(NewEvent {
        kind: airlock_core::events::EventKind::Suspended,
        sandbox: Some(id.clone()),
        golden: Some(sb.golden.clone()),
        reason: Some(reason.as_str()),
        detail: json!({"suspend_ms": ms(began), "clean": clean}),
        ..Default::default()
    });
    engine.room.freed.notify_waiters();
    // A server that could not write its shutdown checkpoint (a full disk) has
    // stopped all the same: its files hold everything committed, and it recovers
    // from its WAL when woken. Said as a failure, since the suspend was not clean.
    if !clean && reason != SuspendReason::DiskFull {
        let e = Error::postgres_with_log(
            format!(
                "sandbox {id} is suspended, but its server could not shut down cleanly; \
                 its files are kept and it recovers from its WAL when woken"
            ),
            &airlock_host::contain::log_tail(&dir.log()),
        );
        tracing::error!(sandbox = %id, error = %e, "a suspend did not shut the server down cleanly");
        return Err(e);
    }
    tracing::info!(sandbox = %id, reason = reason.as_str(), "suspended");
    engine.store().sandbox(&id)
}

/// Keeps a sandbox whose server could not be started suspended, its files
/// kept, and records why: a later wake tries again (once there is space, say).
pub async fn keep_unstartable(engine: &Engine, sb: &Sandbox, e: &Error) -> Result<()> {
    tracing::error!(sandbox = %sb.id, error = %e, "a sandbox's server could not start; it is kept suspended");
    kill_cgroup_members(engine, &sb.id).await;
    let mut store = engine.store();
    store.set_suspended(&sb.id)?;
    store.record_or_log(NewEvent {
        kind: airlock_core::events::EventKind::Suspended,
        sandbox: Some(sb.id.clone()),
        golden: Some(sb.golden.clone()),
        reason: Some("unstartable"),
        detail: json!({"error": e.code.as_str(), "message": e.message}),
        ..Default::default()
    });
    Ok(())
}
