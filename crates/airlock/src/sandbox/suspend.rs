//! Suspend and wake: stopping an idle sandbox's server to free its memory while
//! keeping its files, credential and address, and starting it again when a
//! client connects through the router (or `airlock wake` asks).
//!
//! Both run under the sandbox's operation lock, so a client connecting while a
//! suspend is under way waits for it and then wakes the sandbox.

use std::time::Instant;

use serde_json::json;

use super::{capacity, kill_cgroup_members, ms, restart, Sandbox, SandboxState};
use crate::engine::Engine;
use crate::error::{Error, ErrorCode, Result};
use crate::events::NewEvent;
use crate::pg::instance;

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
    if let Some(pid) = sb.pid {
        match reason {
            // Nothing more may be written, a checkpoint included; it recovers on wake.
            SuspendReason::DiskFull => instance::kill(pid, &dir.pgdata()).await?,
            _ => instance::stop(pid, &dir.pgdata()).await,
        }
    }
    kill_cgroup_members(engine, &id).await;
    {
        let mut store = engine.store();
        store.record(NewEvent {
            kind: "suspended",
            sandbox: Some(id.clone()),
            golden: Some(sb.golden.clone()),
            reason: Some(reason.as_str()),
            detail: json!({"suspend_ms": ms(began)}),
        })?;
    }
    tracing::info!(sandbox = %id, reason = reason.as_str(), "suspended");
    engine.capacity_freed.notify_waiters();
    engine.store().sandbox(&id)
}

/// Starts a suspended sandbox again with the same data, credential and address.
/// Waking a running sandbox is a no-op. Needs a running slot: an idle sandbox may
/// be suspended for it, or the wake waits its turn for up to the daemon's wake wait.
pub async fn wake(engine: &Engine, key: &str) -> Result<Sandbox> {
    let id = engine.store().sandbox(key)?.id;
    let _op = engine.sandbox_lock(&id).await;
    let sb = engine.store().sandbox(&id)?;
    if sb.state != SandboxState::Suspended {
        return Ok(sb);
    }
    let began = Instant::now();
    let admitted = capacity::admit(engine, engine.config.wake_wait, capacity::Need::Start, Some(&id)).await?;
    restart(engine, &sb).await?;
    drop(admitted);
    engine.connections.touch(&id);
    engine.store().record(NewEvent {
        kind: "woken",
        sandbox: Some(id.clone()),
        golden: Some(sb.golden.clone()),
        detail: json!({"wake_ms": ms(began)}),
        ..Default::default()
    })?;
    engine.store().sandbox(&id)
}
