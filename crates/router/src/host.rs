//! What the router needs of its data root, in a process of its own: the store
//! (read for sandboxes and their verifiers, written for connection events and
//! the time a sandbox was last used), the paths, the OS identities sandboxes run
//! as, and the daemon, which alone wakes a suspended sandbox.
//!
//! Nothing here changes a sandbox's lifecycle: the router asks the daemon for
//! that over its API, and waits out a daemon that is restarting.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hyper::Method;

use super::Connections;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::events::{EventKind, NewEvent};
use airlock_core::layout::Layout;
use airlock_host::users::Identity;
use airlock_lifecycle::sandbox::Sandbox;
use airlock_state::store::Store;

/// How often a wake is retried while the daemon does not answer.
const DAEMON_RETRY: Duration = Duration::from_millis(50);

/// The router's view of its data root.
pub struct Host {
    /// Paths under the data root.
    pub layout: Layout,
    /// Open connections per sandbox, and backend keys for cancel requests.
    pub connections: Connections,
    store: Mutex<Store>,
    /// Refusals recorded one by one within a budget, the rest counted.
    refusals: super::refusals::Refusals,
    root: bool,
    instance_user: Identity,
    daemon: airlock_listen::client::Client,
}

impl Host {
    /// Opens the data root's store, writing its events to the data root's
    /// audit log, and resolves the instance user the daemon runs sandboxes as.
    pub fn open(
        layout: Layout,
        instance_user: Option<&str>,
        audit: airlock_state::audit::AuditOptions,
    ) -> Result<Host> {
        let journal = std::sync::Arc::new(airlock_state::audit::AuditLog::open(&layout.audit(), audit)?);
        let store = Store::open(&layout.state_db())?.with_journal(journal);
        let instance_user = Identity::for_instances(instance_user)?;
        Ok(Host {
            daemon: airlock_listen::client::Client::without_starting(layout.clone()),
            layout,
            connections: Connections::default(),
            store: Mutex::new(store),
            refusals: Default::default(),
            root: nix::unistd::geteuid().is_root(),
            instance_user,
        })
    }

    /// The store, locked.
    pub fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The OS identity a sandbox's server runs as.
    pub fn sandbox_user(&self, sb: &Sandbox) -> Result<Identity> {
        Identity::of_sandbox(self.root, &self.instance_user, sb.uid, sb.slot)
    }

    /// Asks the daemon to wake a suspended sandbox, waiting until `deadline` for
    /// a daemon that does not answer (one restarting).
    pub async fn wake(&self, id: &str, deadline: Instant) -> Result<()> {
        let path = format!("/v1/sandboxes/{}/wake", airlock_listen::client::encode(id));
        loop {
            match self.daemon.call_raw(Method::POST, &path, None).await {
                Ok(_) => return Ok(()),
                Err(e) if e.code == ErrorCode::DaemonUnreachable && Instant::now() < deadline => {
                    tokio::time::sleep(DAEMON_RETRY).await;
                }
                Err(e) if e.code == ErrorCode::DaemonUnreachable => {
                    return Err(Error::new(
                        ErrorCode::DaemonUnreachable,
                        "the sandbox is suspended and the Airlock daemon, which wakes it, is not running",
                        "try again in a moment; if the daemon was stopped, start it (`airlock serve`)",
                    ))
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Records that a sandbox was used through the router now, for idle suspend
    /// and least-recently-used suspension (which the daemon decides).
    pub fn touch(&self, id: &str) {
        if let Err(e) = self.store().set_active(id, airlock_core::clock::Timestamp::now()) {
            tracing::debug!(sandbox = %id, error = %e, "recording a sandbox's use failed");
        }
    }

    /// Records a connection accepted (which counts as the sandbox's use) or
    /// refused, before the client hears its answer; `store` names a store
    /// other than PostgreSQL the client reached, `phases` how long each step
    /// of the connection took (milliseconds, for its trace), `entry` the node
    /// whose router passed the client on (in a cluster). An accepted connection whose
    /// record could not be written is an error: the client is refused.
    pub async fn record_connection(
        self: &Arc<Self>,
        sb: &Sandbox,
        kind: EventKind,
        (peer, tls): (super::peer::Peer, bool),
        store: Option<&str>,
        phases: serde_json::Value,
        entry: Option<&str>,
    ) -> Result<()> {
        let mut detail = serde_json::json!({"client": peer.to_string(), "tls": tls, "phases": phases});
        if let Some(store) = store {
            detail["store"] = store.into();
        }
        if let Some(node) = entry {
            detail["entry"] = node.into();
        }
        let event = NewEvent {
            kind,
            sandbox: Some(sb.id.clone()),
            golden: Some(sb.golden.clone()),
            detail,
            door: Some(airlock_core::events::Door::Router),
            ..Default::default()
        };
        if kind == EventKind::ConnectionRefused && !self.refusals.admit(&sb.id, &event) {
            return Ok(());
        }
        let host = self.clone();
        let (id, used) = (sb.id.clone(), kind == EventKind::Connected);
        tokio::task::spawn_blocking(move || {
            if used {
                host.store().record(event)?;
                host.touch(&id);
            } else {
                host.store().record_or_log(event);
            }
            Ok(())
        })
        .await
        .map_err(|e| {
            airlock_core::error::Error::internal(format!("recording a router connection failed: {e}"))
        })?
    }

    /// Records a refusal that names no sandbox (a grant's, say) under `name`,
    /// within the same budget as a sandbox's.
    pub fn record_refused(&self, name: &str, event: NewEvent) {
        if self.refusals.admit(name, &event) {
            self.store().record_or_log(event);
        }
    }

    /// Records, as each window of refusals closes, what it counted; until the
    /// router stops.
    pub async fn keep_refusals(self: Arc<Self>) {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let host = self.clone();
            let _ = tokio::task::spawn_blocking(move || host.record_counted_refusals(false)).await;
        }
    }

    /// Records the summaries of the refusals counted in a window that has run
    /// its course, or, if `stopping` (the router is), in the current one
    /// whatever its age, and every refusal on its own from then on.
    pub fn record_counted_refusals(&self, stopping: bool) {
        let summaries =
            if stopping { self.refusals.close_for_good() } else { self.refusals.close(Instant::now()) };
        for summary in summaries {
            self.store().record_or_log(summary);
        }
    }
}
