//! The lifecycle loop: deletes sandboxes whose TTL has passed, and at daemon start
//! reconciles state, processes and directories ([`reconcile`]).

mod reconcile;

pub use reconcile::{reconcile, Reconciled};

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Timestamp;
use crate::engine::Engine;
use crate::events::DeleteReason;
use crate::sandbox;

/// How often the reaper looks for expired sandboxes; with teardown this keeps
/// deletion within about a second of expiry.
const TICK: Duration = Duration::from_millis(200);

/// Runs the TTL loop until the daemon exits.
pub fn spawn(engine: Arc<Engine>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let expired = match engine.store().expired(Timestamp::now()) {
                Ok(ids) => ids,
                Err(e) => {
                    tracing::error!(error = %e, "reaper could not read the store");
                    continue;
                }
            };
            for id in expired {
                let engine = engine.clone();
                // Each deletion runs on its own so one slow teardown delays no other.
                tokio::spawn(async move {
                    match sandbox::delete(&engine, &id, DeleteReason::Ttl).await {
                        Ok(_) => tracing::info!(sandbox = %id, "expired and deleted"),
                        Err(e) => {
                            tracing::error!(sandbox = %id, error = %e, "could not delete expired sandbox")
                        }
                    }
                });
            }
        }
    })
}
