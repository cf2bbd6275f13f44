//! What the lifecycle tells the services above it, and what it asks of them,
//! without naming any.
//!
//! - A service that holds something per sandbox (kept sessions, say)
//!   implements [`SandboxWatcher`] and is registered once at start
//!   ([`Services::watch`]): it hears when a sandbox is deleted, suspended or
//!   reset, and can say which of the sandbox's server processes it keeps open
//!   while idle.
//! - A migration test that one service runs on behalf of an agent and another
//!   performs goes through [`AgentMigrations`].
//! - A service's own state lives in [`Services::state`], a slot keyed by the
//!   service's own type, which nothing here can name.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::records::sandbox::Sandbox;

/// What happened to a sandbox's server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The sandbox is gone.
    Deleted,
    /// Its server was stopped; a wake starts a new one.
    Suspended,
    /// It was rebuilt from its golden; its server is a new one.
    Reset,
}

/// A service that holds something per sandbox.
pub trait SandboxWatcher: Send + Sync {
    /// The sandbox's server went away or was replaced: let go of what is held on it.
    fn changed(&self, sandbox: &str, change: Change);

    /// Server processes the service keeps open on the sandbox while nobody
    /// uses them, so that they do not count as activity.
    fn kept_backends(&self, _sandbox: &str) -> Vec<i32> {
        Vec::new()
    }
}

/// A migration test asked for by an agent, of the golden its sandbox was
/// forked from, on the sandbox's behalf.
#[async_trait::async_trait]
pub trait AgentMigrations: Send + Sync {
    /// Tests `sql` with the sandbox's statement timeout; the report comes back
    /// whole ([`TestedMigration`]). The implementation holds the engine it
    /// tests on, so the engine, which holds it, is named by neither.
    async fn test(&self, sandbox: &Sandbox, sql: &str) -> Result<TestedMigration>;
}

/// A finished migration test, as the service that asked for it shows it.
#[derive(Debug, Clone)]
pub struct TestedMigration {
    /// Whether it passed.
    pub passed: bool,
    /// The report, as JSON.
    pub report: serde_json::Value,
    /// The report, as text.
    pub text: String,
}

type Slot = Arc<dyn Any + Send + Sync>;

/// The services registered with the engine, and their state.
#[derive(Default)]
pub struct Services {
    watchers: RwLock<Vec<Arc<dyn SandboxWatcher>>>,
    migrations: OnceLock<Arc<dyn AgentMigrations>>,
    state: Mutex<HashMap<TypeId, Slot>>,
}

impl Services {
    /// Registers a watcher of sandbox changes.
    pub fn watch(&self, watcher: Arc<dyn SandboxWatcher>) {
        self.watchers.write().unwrap_or_else(|p| p.into_inner()).push(watcher);
    }

    /// Tells every watcher that `sandbox` changed.
    pub fn changed(&self, sandbox: &str, change: Change) {
        for w in self.watchers.read().unwrap_or_else(|p| p.into_inner()).iter() {
            w.changed(sandbox, change);
        }
    }

    /// The server processes some service keeps open on `sandbox` while idle.
    pub fn kept_backends(&self, sandbox: &str) -> Vec<i32> {
        let watchers = self.watchers.read().unwrap_or_else(|p| p.into_inner());
        watchers.iter().flat_map(|w| w.kept_backends(sandbox)).collect()
    }

    /// Registers what performs agents' migration tests (once; later calls are ignored).
    pub fn perform_migrations(&self, migrations: Arc<dyn AgentMigrations>) {
        let _ = self.migrations.set(migrations);
    }

    /// What performs agents' migration tests, when one is registered.
    pub fn migrations(&self) -> Result<Arc<dyn AgentMigrations>> {
        self.migrations.get().cloned().ok_or_else(|| {
            Error::new(
                ErrorCode::InvalidRequest,
                "migration tests are not available in this daemon",
                "run the migration through `airlock migrate test`",
            )
        })
    }

    /// A service's own state of type `T`, made on first use.
    pub fn state<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        let mut slots = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let slot = slots.entry(TypeId::of::<T>()).or_insert_with(|| Arc::new(T::default()));
        slot.clone().downcast::<T>().expect("a slot holds the type it is keyed by")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Kept(Mutex<Vec<(String, Change)>>);

    impl SandboxWatcher for Kept {
        fn changed(&self, sandbox: &str, change: Change) {
            self.0.lock().unwrap().push((sandbox.to_owned(), change));
        }
        fn kept_backends(&self, sandbox: &str) -> Vec<i32> {
            if sandbox == "a" {
                vec![7]
            } else {
                vec![]
            }
        }
    }

    #[test]
    fn watchers_hear_changes_and_state_is_one_per_type() {
        let services = Services::default();
        let kept = Arc::new(Kept::default());
        services.watch(kept.clone());
        services.changed("a", Change::Suspended);
        assert_eq!(kept.0.lock().unwrap().as_slice(), &[("a".to_owned(), Change::Suspended)]);
        assert_eq!(services.kept_backends("a"), vec![7]);
        assert!(services.kept_backends("b").is_empty());
        let one = services.state::<Mutex<u32>>();
        *one.lock().unwrap() = 5;
        assert_eq!(*services.state::<Mutex<u32>>().lock().unwrap(), 5);
        assert!(services.migrations().is_err());
    }
}
