//! Live targets: real PostgreSQL databases outside Airlock, registered with an
//! admin DSN the daemon alone keeps, on which Airlock mints short-lived,
//! scoped, read-only grants (see `docs/LIVE.md`).
//!
//! The service owns its state (`live.db` in the data root, readable by root
//! alone, since it holds the targets' admin DSNs) and depends on the core and
//! the PostgreSQL engine only.

pub mod store;
pub mod target;

use std::sync::{Arc, Mutex};

use airlock_core::error::Result;
use airlock_lifecycle::engine::Engine;

/// The live-target service: its store, and the daemon's engine it records events through.
pub struct Live {
    store: Mutex<store::Store>,
    engine: Arc<Engine>,
}

impl Live {
    /// Opens the service's store in the engine's data root.
    pub fn open(engine: Arc<Engine>) -> Result<Arc<Live>> {
        let store = store::Store::open(&engine.layout.home().join("live.db"))?;
        Ok(Arc::new(Live { store: Mutex::new(store), engine }))
    }

    fn store(&self) -> std::sync::MutexGuard<'_, store::Store> {
        self.store.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
