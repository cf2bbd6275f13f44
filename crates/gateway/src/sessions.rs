//! Idle agent sessions kept between `run_sql` calls, one per sandbox.
//!
//! Opening a session (SCRAM and a backend start) is most of a short call's time,
//! so a session that ended its call cleanly is reset — `ROLLBACK` if a transaction
//! was left open, `DISCARD ALL`, and a statistics flush — and kept for the next
//! call on the same sandbox. A call therefore sees what a fresh session would:
//! no settings, temporary tables, prepared statements, cursors, listeners,
//! advisory locks or role change survive it. A kept session is tied to the server
//! process it was opened on: after a suspend, wake, reset or restart it is
//! dropped, never used.

use std::collections::HashMap;
use std::sync::Mutex;

use airlock_lifecycle::services::{Change, SandboxWatcher};
use airlock_postgres::wire::{Session, TextRows};

/// The idle sessions, by sandbox id.
#[derive(Default)]
pub struct SessionCache {
    idle: Mutex<HashMap<String, Kept>>,
}

struct Kept {
    session: Session,
    postmaster: Option<i32>,
}

impl SessionCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Kept>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The kept session of `sandbox`, if it was opened on server `postmaster`.
    pub fn take(&self, sandbox: &str, postmaster: Option<i32>) -> Option<Session> {
        let kept = self.lock().remove(sandbox)?;
        (kept.postmaster == postmaster && postmaster.is_some()).then_some(kept.session)
    }

    /// Keeps `session` for the next call; returns it back when one is kept already.
    pub fn put(&self, sandbox: &str, postmaster: Option<i32>, session: Session) -> Option<Session> {
        let mut idle = self.lock();
        if idle.contains_key(sandbox) {
            return Some(session);
        }
        idle.insert(sandbox.to_owned(), Kept { session, postmaster });
        None
    }

    /// Backend process ids of `sandbox`'s kept sessions: not a client's sessions.
    pub fn backend_pids(&self, sandbox: &str) -> Vec<i32> {
        self.lock()
            .get(sandbox)
            .and_then(|k| k.session.backend_key())
            .map(|(pid, _)| pid)
            .into_iter()
            .collect()
    }
}

/// Puts a session that ended a call with transaction status `status` back to the
/// state of a fresh one; false when that failed (the session must not be kept).
pub async fn reset(session: &mut Session, status: u8) -> bool {
    let mut steps = vec!["DISCARD ALL", "SELECT pg_catalog.pg_stat_force_next_flush()"];
    if status != b'I' {
        steps.insert(0, "ROLLBACK");
    }
    for sql in steps {
        let mut out = TextRows::default();
        match session.simple_query(sql, &mut out).await {
            Ok(b'I') if out.error.is_none() => {}
            _ => return false,
        }
    }
    true
}

/// The lifecycle tells the cache when a sandbox's server goes: its kept
/// session goes too (a kept session is only ever used on the server it was
/// opened on in any case), and says which backends are kept, not used.
impl SandboxWatcher for SessionCache {
    fn changed(&self, sandbox: &str, _change: Change) {
        self.lock().remove(sandbox);
    }

    fn kept_backends(&self, sandbox: &str) -> Vec<i32> {
        self.backend_pids(sandbox)
    }
}
