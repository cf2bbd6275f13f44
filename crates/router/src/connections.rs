//! What the router knows about open connections: how many each sandbox has and
//! when its last one ended (the lifecycle's `Activity`), and which backend key
//! belongs to which sandbox (so a cancel request reaches the right server).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use airlock_lifecycle::activity::{Activity, Busy};

use super::protocol::BackendKey;

#[derive(Debug, Default)]
struct Inner {
    backends: HashMap<BackendKey, String>,
    authenticating: HashMap<String, Arc<tokio::sync::Semaphore>>,
}

/// How many authenticated router clients of one sandbox may be opening a
/// server session at once. A backend that has not yet logged in already
/// holds one of the server's connection slots, the admin's reserved ones
/// included; the others wait their turn. Only clients that proved they hold
/// the credential get here (the router authenticates them itself first), so a
/// client that never answers its password challenge holds none of them (and
/// its router slot is the first to go when the router runs out: see
/// [`airlock_listen::slots`]).
pub const AUTHENTICATING_PER_SANDBOX: usize = 8;

/// The router's connections: their use of each sandbox (the lifecycle's
/// [`Activity`]), their backend keys and who is being authenticated.
#[derive(Debug, Clone, Default)]
pub struct Connections {
    activity: Activity,
    inner: Arc<Mutex<Inner>>,
}

impl Connections {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a connection to `sandbox` as open until the returned guard drops.
    pub fn open(&self, sandbox: &str) -> Open {
        let busy = self.activity.open(sandbox);
        Open { connections: self.clone(), sandbox: sandbox.to_owned(), backend: None, _busy: busy }
    }

    /// Marks `sandbox` as used now.
    pub fn touch(&self, sandbox: &str) {
        self.activity.touch(sandbox);
    }

    /// How many router connections `sandbox` has open.
    pub fn open_count(&self, sandbox: &str) -> usize {
        self.activity.open_count(sandbox)
    }

    /// When `sandbox` was last used, if it has no open connection and was ever seen.
    pub fn idle_since(&self, sandbox: &str) -> Option<Instant> {
        self.activity.idle_since(sandbox)
    }

    /// Waits for one of the sandbox's [`AUTHENTICATING_PER_SANDBOX`] places for
    /// a client being authenticated; the place is held until the permit drops.
    pub async fn authenticating(&self, sandbox: &str) -> tokio::sync::OwnedSemaphorePermit {
        let places = self
            .lock()
            .authenticating
            .entry(sandbox.to_owned())
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(AUTHENTICATING_PER_SANDBOX)))
            .clone();
        places.acquire_owned().await.expect("the semaphore is never closed")
    }

    /// Forgets a deleted sandbox.
    pub fn forget(&self, sandbox: &str) {
        self.activity.forget(sandbox);
        let mut inner = self.lock();
        inner.authenticating.remove(sandbox);
        inner.backends.retain(|_, s| s != sandbox);
    }

    /// The sandbox serving the backend with this pid and secret key.
    pub fn backend_owner(&self, key: &BackendKey) -> Option<String> {
        self.lock().backends.get(key).cloned()
    }
}

/// One open router connection; closes its count (and its backend key) on drop.
#[derive(Debug)]
pub struct Open {
    connections: Connections,
    sandbox: String,
    backend: Option<BackendKey>,
    _busy: Busy,
}

impl Open {
    /// Records the backend key the server sent for this connection.
    pub fn set_backend(&mut self, key: BackendKey) {
        self.connections.lock().backends.insert(key.clone(), self.sandbox.clone());
        self.backend = Some(key);
    }

    /// The backend's pid and secret key, once the server has sent them.
    pub fn backend(&self) -> Option<&BackendKey> {
        self.backend.as_ref()
    }

    /// The sandbox it is open to.
    pub fn sandbox(&self) -> &str {
        &self.sandbox
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        if let Some(k) = &self.backend {
            self.connections.lock().backends.remove(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_connections_and_backend_keys() {
        let c = Connections::default();
        assert_eq!(c.idle_since("a"), None);
        let mut one = c.open("a");
        let two = c.open("a");
        let key = |secret: &[u8]| BackendKey { pid: 10, secret: secret.to_vec() };
        one.set_backend(key(&[0, 0, 0, 99]));
        assert_eq!(c.open_count("a"), 2);
        assert_eq!(c.idle_since("a"), None);
        assert_eq!(c.backend_owner(&key(&[0, 0, 0, 99])).as_deref(), Some("a"));
        assert_eq!(c.backend_owner(&key(&[0, 0, 0, 98])), None);
        // A longer key that begins with the right four bytes is another key.
        assert_eq!(c.backend_owner(&key(&[0, 0, 0, 99, 0])), None);
        drop(one);
        assert_eq!(c.backend_owner(&key(&[0, 0, 0, 99])), None);
        drop(two);
        assert!(c.idle_since("a").is_some());
        c.forget("a");
        assert_eq!(c.idle_since("a"), None);
    }
}
