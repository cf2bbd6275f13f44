//! When each sandbox was last used in the daemon, and by how many at once:
//! what idle suspend reads. A service that keeps a sandbox busy (a tool call,
//! `exec`, a migration test) holds a [`Busy`] while it does; a fork, a wake or
//! an API call on a sandbox [`Activity::touch`]es it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

#[derive(Debug)]
struct Use {
    open: usize,
    last_active: Instant,
}

/// Every sandbox's use, shared by the lifecycle and the services above it.
#[derive(Debug, Clone, Default)]
pub struct Activity {
    uses: Arc<Mutex<HashMap<String, Use>>>,
}

impl Activity {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Use>> {
        self.uses.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn used<'a>(uses: &'a mut HashMap<String, Use>, sandbox: &str) -> &'a mut Use {
        let u = uses.entry(sandbox.to_owned()).or_insert(Use { open: 0, last_active: Instant::now() });
        u.last_active = Instant::now();
        u
    }

    /// Counts `sandbox` as in use until the returned guard drops.
    pub fn open(&self, sandbox: &str) -> Busy {
        Self::used(&mut self.lock(), sandbox).open += 1;
        Busy { activity: self.clone(), sandbox: sandbox.to_owned() }
    }

    /// Marks `sandbox` as used now (a fork, a wake, an API call on it).
    pub fn touch(&self, sandbox: &str) {
        Self::used(&mut self.lock(), sandbox);
    }

    /// How many uses of `sandbox` are open.
    pub fn open_count(&self, sandbox: &str) -> usize {
        self.lock().get(sandbox).map_or(0, |u| u.open)
    }

    /// When `sandbox` was last used, if no use of it is open and it was ever seen.
    pub fn idle_since(&self, sandbox: &str) -> Option<Instant> {
        self.lock().get(sandbox).filter(|u| u.open == 0).map(|u| u.last_active)
    }

    /// Forgets a deleted sandbox.
    pub fn forget(&self, sandbox: &str) {
        self.lock().remove(sandbox);
    }
}

/// One open use of a sandbox; ends it (and marks the sandbox used now) on drop.
#[derive(Debug)]
pub struct Busy {
    activity: Activity,
    sandbox: String,
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Some(u) = self.activity.lock().get_mut(&self.sandbox) {
            u.open = u.open.saturating_sub(1);
            u.last_active = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_uses_until_they_end() {
        let a = Activity::default();
        assert_eq!(a.idle_since("a"), None);
        let one = a.open("a");
        let two = a.open("a");
        assert_eq!(a.open_count("a"), 2);
        assert_eq!(a.idle_since("a"), None);
        drop(one);
        assert_eq!(a.idle_since("a"), None);
        drop(two);
        assert!(a.idle_since("a").is_some());
        a.forget("a");
        assert_eq!(a.idle_since("a"), None);
    }
}
