//! Waking a suspended sandbox: its server started again with the same data,
//! credential and address, once there is room for one more running server.

use std::time::Instant;

use serde_json::json;

use super::{capacity, ms, restart, Sandbox, SandboxState};
use crate::engine::Engine;
use airlock_core::error::{Error, Result};
use airlock_core::events::NewEvent;

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
    if let Err(e) = restart(engine, &sb).await {
        tracing::error!(sandbox = %id, error = %e, "waking a sandbox failed; it stays suspended");
        return Err(Error::new(e.code, format!("sandbox {id} stays suspended: {}", e.message), e.hint));
    }
    drop(admitted);
    engine.activity.touch(&id);
    engine.store().record_or_log(NewEvent {
        kind: airlock_core::events::EventKind::Woken,
        sandbox: Some(id.clone()),
        golden: Some(sb.golden.clone()),
        detail: json!({"wake_ms": ms(began)}),
        ..Default::default()
    });
    engine.store().sandbox(&id)
}
