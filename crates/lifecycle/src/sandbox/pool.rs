//! The warm pool: per golden, a configured number of sandboxes already cloned
//! and started, each with a credential made ahead and bound to no one, so a fork
//! only has to claim one (and the router keeps a session open on each).
//!
//! One background task keeps every pool at its size, building one member at a
//! time so claims keep the CPU; it drains members of a replaced generation and
//! members beyond the size. A claim is a single store update (see
//! `Store::claim_pooled`) and wakes the task to build a replacement.

use std::sync::Arc;
use std::time::Duration;

use crate::engine::Engine;
use crate::golden::Golden;
use crate::sandbox::{self, Access, Sandbox, SandboxState, Steps};
use airlock_core::error::{ErrorCode, Result};
use airlock_core::events::DeleteReason;
use airlock_state::store::SandboxFilter;

/// How often the filler looks even when nothing woke it.
const TICK: Duration = Duration::from_millis(500);

/// How long the filler waits after a claim woke it, so the claim and the agent's
/// first connection get the CPU before a replacement is cloned and started.
const AFTER_CLAIM: Duration = Duration::from_millis(150);

/// Pool members never expire on their own: a claim sets the real expiry.
const NEVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Runs the pool filler until the daemon exits.
pub fn spawn(engine: Arc<Engine>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = engine.pool.wanted.notified() => tokio::time::sleep(AFTER_CLAIM).await,
                _ = tokio::time::sleep(TICK) => {}
            }
            if let Err(e) = fill(&engine).await {
                tracing::warn!(error = %e, "could not fill the warm pools");
            }
        }
    })
}

/// Brings every pool to its size: drains what is stale or surplus, then builds
/// one member at a time until all are full or the host is.
pub async fn fill(engine: &Engine) -> Result<()> {
    loop {
        let mut built = false;
        let goldens = engine.store().goldens()?;
        for golden in goldens {
            drain(engine, &golden).await?;
            let fresh = members(engine, &golden.name)?
                .iter()
                .filter(|m| m.generation == golden.current_generation)
                .count() as i64;
            if fresh < golden.pool_size {
                match build_one(engine, &golden).await {
                    Ok(()) => built = true,
                    Err(e) if e.code == ErrorCode::CapacityExhausted => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
        }
        if !built {
            return Ok(());
        }
    }
}

fn members(engine: &Engine, golden: &str) -> Result<Vec<Sandbox>> {
    let filter = SandboxFilter { golden: Some(golden.to_owned()), pooled: true, ..Default::default() };
    Ok(engine.store().sandboxes(&filter)?.into_iter().filter(|s| s.state == SandboxState::Pooled).collect())
}

/// Deletes members of an older generation, and members beyond the pool's size.
async fn drain(engine: &Engine, golden: &Golden) -> Result<()> {
    let all = members(engine, &golden.name)?;
    let (current, stale): (Vec<_>, Vec<_>) =
        all.into_iter().partition(|m| m.generation == golden.current_generation);
    let surplus = current.len().saturating_sub(golden.pool_size.max(0) as usize);
    for m in stale.into_iter().chain(current.into_iter().take(surplus)) {
        if engine.store().begin_drain(&m.id)? {
            sandbox::teardown(engine, &m, DeleteReason::Drained).await?;
        }
    }
    Ok(())
}

/// Clones and starts one member of a golden's pool, with a credential bound to no one.
async fn build_one(engine: &Engine, golden: &Golden) -> Result<()> {
    let mut sb = Sandbox::creating(
        &golden.name,
        golden.current_generation,
        None,
        Default::default(),
        Access::default(),
        NEVER,
        Duration::ZERO,
    );
    // The pool takes only free room: it never suspends a sandbox or queues.
    // It counts and records its member within an admission's turn (taken
    // only if free), so room a fork or a wake was admitted to (a fork's by
    // giving up a pool member, say) is not taken by a new member before the
    // fork's row is recorded or the woken server is up. (The disk's checks
    // and promise a fork's admission makes are not made here: see
    // `capacity::room`.)
    let busy = || airlock_core::error::Error::new(ErrorCode::CapacityExhausted, "the host is full", "");
    let Ok(turn) = engine.room.admission.try_lock() else { return Err(busy()) };
    let (all, running) = engine.store().counts()?;
    if running >= engine.config.max_running || all >= engine.config.max_sandboxes {
        return Err(busy());
    }
    engine.insert_sandbox(&mut sb, |_, _| Ok(()))?;
    drop(turn);
    let mut steps = Steps::default();
    // The member's credential is made now, off any fork's path, and bound to a
    // fork when one claims the member; until then no client can use it (the
    // router does not connect to pool members).
    let password = airlock_core::secret::password();
    let verifier = sandbox::mint_verifier(&password);
    let made = async {
        let pid = sandbox::bring_up(engine, &sb, &password, &mut steps).await?;
        // Each store readies itself for a quick claim (PostgreSQL's first
        // connection builds the catalog caches, and stays open for a claim
        // that asks for other access).
        let dir = engine.layout.sandbox_instance(&sb.id);
        let started = Sandbox { pid: Some(pid), ..sb.clone() };
        let at = sandbox::stores::At { engine, sb: &started, dir: &dir };
        for store in sandbox::stores::of_sandbox(&dir) {
            store.warm(at).await?;
        }
        let verifier = verifier.await.map_err(|e| airlock_core::error::Error::internal(e.to_string()))?;
        Ok::<_, airlock_core::error::Error>((pid, verifier))
    }
    .await;
    match made {
        Ok((pid, verifier)) => {
            let url =
                airlock_core::dsn::sandbox(&engine.layout.sandbox_instance(&sb.id).socket_dir(), &password);
            engine.store().set_pooled(&sb.id, pid, &url, &verifier)
        }
        Err(e) => {
            tracing::warn!(golden = %golden.name, error = %e, "could not build a pool member");
            sandbox::teardown(engine, &sb, DeleteReason::Failed).await?;
            Err(e)
        }
    }
}
