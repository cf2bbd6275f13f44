//! Live targets: real PostgreSQL databases outside Airlock, registered with an
//! admin DSN the daemon alone keeps, on which Airlock mints short-lived,
//! scoped, read-only grants (see `docs/LIVE.md`).
//!
//! The service owns its state (`live.db` in the data root, readable by root
//! alone, since it holds the targets' admin DSNs) and depends on the core and
//! the PostgreSQL engine only.

pub mod executor;
pub mod grant;
pub mod store;
pub mod target;
pub mod watch;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use airlock_core::error::Result;
use airlock_lifecycle::engine::Engine;

/// The live-target service: its store, and the daemon's engine it records events through.
pub struct Live {
    store: Mutex<store::Store>,
    engine: Arc<Engine>,
    /// Roles being minted, which reconciliation must not take for orphans.
    minting: Arc<Mutex<HashSet<String>>>,
    /// This data root's mark in its grants' role names ([`store::Store::mark`]).
    mark: String,
}

/// A role being minted, until dropped.
struct Minting {
    role: String,
    set: Arc<Mutex<HashSet<String>>>,
}

impl Drop for Minting {
    fn drop(&mut self) {
        self.set.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.role);
    }
}

impl Live {
    /// Opens the service's store in the engine's data root.
    pub fn open(engine: Arc<Engine>) -> Result<Arc<Live>> {
        let store = store::Store::open(&engine.layout.home().join("live.db"))?;
        let mark = store.mark()?;
        // No executor runs before the service opens: workspaces left by a
        // daemon that died during a run go (their processes were killed and
        // their uids given back by the daemon's reconciliation, which found
        // their cgroups and leases belonging to no sandbox).
        let executors = engine.layout.home().join("executors");
        if let Err(e) = std::fs::remove_dir_all(&executors) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %executors.display(), error = %e, "executors' workspaces left by a crash could not be removed");
            }
        }
        Ok(Arc::new(Live { store: Mutex::new(store), engine, minting: Default::default(), mark }))
    }

    fn minting(&self, role: &str) -> Minting {
        self.minting.lock().unwrap_or_else(|p| p.into_inner()).insert(role.to_owned());
        Minting { role: role.to_owned(), set: self.minting.clone() }
    }

    fn is_minting(&self, role: &str) -> bool {
        self.minting.lock().unwrap_or_else(|p| p.into_inner()).contains(role)
    }

    fn store(&self) -> std::sync::MutexGuard<'_, store::Store> {
        self.store.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
