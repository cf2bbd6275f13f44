//! Pre-authenticated backends: for every warm-pool member, one server session
//! opened as the agent role ahead of time, so the first client of a claimed
//! sandbox is spliced onto a backend that has already started and logged in.
//!
//! A background task keeps one parked session per pool member. A client of the
//! member (once claimed) takes it if the server and the role are still the ones
//! it was opened for and it has said nothing since; else the client gets a fresh
//! session as usual. A parked session no client took is closed a few seconds
//! after its member was claimed, so it neither holds one of the role's
//! connection slots nor keeps the sandbox from counting as idle.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::backend::{self, Backend};
use super::host::Host;
use super::protocol::Startup;
use airlock_core::dsn::{AGENT_ROLE, DATABASE};
use airlock_lifecycle::sandbox::{Access, Sandbox, SandboxState};

/// How often the task looks for members without a parked session.
const TICK: Duration = Duration::from_millis(20);
/// How long a claimed sandbox's parked session waits for its first client.
const UNCLAIMED_FOR: Duration = Duration::from_secs(5);
/// The settings parked sessions open with: what most drivers ask for, so that
/// usually nothing needs to be set when a client takes one.
pub const OPENED_WITH: &[(&str, &str)] = &[("client_encoding", "UTF8")];

/// One parked session.
struct Entry {
    backend: Backend,
    /// The postmaster it belongs to.
    postmaster: i32,
    /// When its member was first seen claimed.
    claimed_at: Option<Instant>,
}

/// The parked sessions, by sandbox id.
#[derive(Default)]
pub struct Parked {
    entries: Mutex<HashMap<String, Entry>>,
}

impl Parked {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the parked session of `sb` if it is still good for `sb`'s agent: the
    /// same server, the role as it was parked (a claim with other access makes it
    /// again), and nothing said since.
    pub fn take(&self, sb: &Sandbox) -> Option<Backend> {
        let entry = self.lock().remove(&sb.id)?;
        let usable =
            Some(entry.postmaster) == sb.pid && sb.access == Access::default() && !entry.backend.is_gone();
        usable.then_some(entry.backend)
    }

    /// Whether `sb` has a parked session (for tests and the benchmark's wait).
    pub fn has(&self, id: &str) -> bool {
        self.lock().contains_key(id)
    }

    /// Runs the keeper until the daemon exits.
    pub async fn keep(self: Arc<Self>, host: Arc<Host>) {
        loop {
            if let Err(e) = self.round(&host).await {
                tracing::debug!(error = %e, "parking backends failed");
            }
            tokio::time::sleep(TICK).await;
        }
    }

    /// Drops what is stale and parks a session for each member without one.
    async fn round(&self, host: &Host) -> airlock_core::error::Result<()> {
        let members: HashMap<String, Sandbox> =
            host.store().pooled()?.into_iter().map(|sb| (sb.id.clone(), sb)).collect();
        // Parked sessions of members claimed since (or deleted: then None).
        let claimed: Vec<String> =
            self.lock().keys().filter(|id| !members.contains_key(*id)).cloned().collect();
        let claimed: HashMap<String, Option<Sandbox>> =
            claimed.into_iter().map(|id| (id.clone(), host.store().sandbox(&id).ok())).collect();
        let now = Instant::now();
        self.lock().retain(|id, entry| {
            let (sb, waiting) = match (members.get(id), claimed.get(id)) {
                (Some(member), _) => (member, false),
                (None, Some(Some(sb))) if matches!(sb.state, SandboxState::Creating | SandboxState::Running) => {
                    (sb, true)
                }
                // Claimed after the list was read: look again next round.
                (None, None) => return true,
                _ => return false,
            };
            if sb.pid != Some(entry.postmaster) || entry.backend.is_gone() {
                tracing::debug!(sandbox = %id, pid = ?sb.pid, postmaster = entry.postmaster, "a parked session is stale; dropped");
                return false;
            }
            !waiting || now.duration_since(*entry.claimed_at.get_or_insert(now)) < UNCLAIMED_FOR
        });
        for sb in members.into_values() {
            // A member of a Redis-only golden has no PostgreSQL to park a session on.
            if self.has(&sb.id) || !host.layout.generation_has_postgres(&sb.golden, sb.generation) {
                continue;
            }
            let (Some(pid), Some(password)) =
                (sb.pid, sb.dsn.as_deref().and_then(airlock_core::dsn::password))
            else {
                continue;
            };
            let user = host.sandbox_user(&sb)?;
            let socket = host.layout.sandbox_instance(&sb.id).socket();
            let Ok(stream) = airlock_postgres::socket::connect_instance(&socket, Some(&user), pid).await
            else {
                continue;
            };
            let startup = Startup {
                version: super::protocol::PROTOCOL_3_0,
                user: AGENT_ROLE.into(),
                database: DATABASE.into(),
                settings: OPENED_WITH.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                later: Vec::new(),
                protocol_options: Vec::new(),
            };
            match backend::login(stream, &startup.encode_for(AGENT_ROLE, DATABASE), &password).await {
                Ok(backend) => {
                    self.lock().insert(sb.id.clone(), Entry { backend, postmaster: pid, claimed_at: None });
                }
                Err(e) => tracing::debug!(sandbox = %sb.id, error = %e, "could not park a backend"),
            }
        }
        Ok(())
    }
}
