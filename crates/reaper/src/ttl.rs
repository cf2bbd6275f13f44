//! TTLs kept by a timer: the reaper sleeps until the nearest expiry and
//! starts that sandbox's deletion when it comes, rather than looking every so
//! often; a new sandbox, a claimed pool member or an extension wakes it to
//! look again (`Engine::expiries`).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock_core::clock::Timestamp;
use airlock_core::events::DeleteReason;
use airlock_lifecycle::engine::Engine;
use airlock_lifecycle::sandbox;

/// The longest the timer sleeps without looking: what a sandbox whose expiry
/// came nearer without a wake-up (one whose fork finished after its TTL,
/// say) or a deletion that failed waits at most.
const LOOK_AGAIN: Duration = Duration::from_secs(1);

/// Runs the timer until the daemon exits.
pub(crate) async fn keep(engine: Arc<Engine>) {
    // Sandboxes whose deletion this timer started and that has not ended:
    // not started twice (one may wait for a suspend or a fork to finish).
    let deleting: Arc<Mutex<HashSet<String>>> = Default::default();
    loop {
        let now = Timestamp::now();
        let (expired, next) = {
            let store = engine.store();
            (store.expired(now), store.next_expiry(now))
        };
        match expired {
            Ok(ids) => {
                for id in ids {
                    if !deleting.lock().unwrap_or_else(|p| p.into_inner()).insert(id.clone()) {
                        continue;
                    }
                    let engine = engine.clone();
                    // Forgotten however the deletion ends, a panic included, so
                    // the next look takes it up again if it is still due.
                    let in_flight = InFlight { deleting: deleting.clone(), id: id.clone() };
                    // Each deletion runs on its own so one slow teardown delays no other.
                    crate::spawn_as_reaper(async move {
                        let _in_flight = in_flight;
                        match sandbox::delete(&engine, &id, DeleteReason::Ttl).await {
                            Ok(_) => tracing::info!(sandbox = %id, "expired and deleted"),
                            Err(e) => {
                                tracing::error!(sandbox = %id, error = %e, "could not delete expired sandbox")
                            }
                        }
                    });
                }
            }
            Err(e) => tracing::error!(error = %e, "the TTL timer could not read the store"),
        }
        let until_next = match next {
            Ok(Some(at)) => at.remaining(),
            Ok(None) => LOOK_AGAIN,
            Err(e) => {
                tracing::error!(error = %e, "the TTL timer could not read the store");
                LOOK_AGAIN
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(until_next.min(LOOK_AGAIN)) => {}
            _ = engine.expiries.notified() => {}
        }
    }
}

/// A deletion the timer started, forgotten when it ends.
struct InFlight {
    deleting: Arc<Mutex<HashSet<String>>>,
    id: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.deleting.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.id);
    }
}
