//! A sandbox as stored, listed and shown.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;

/// The label a migration test's forks carry (its key is reserved).
pub const MIGRATION_TEST_LABEL: (&str, &str) = (crate::validate::RESERVED_LABEL_KEY, "migration-test");

/// Where a sandbox is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Being cloned and started; torn down at daemon start if the daemon died meanwhile.
    Creating,
    /// Up and answering.
    Running,
    /// Being torn down.
    Deleting,
    /// Started ahead of demand in a golden's warm pool, its credential bound to no one yet;
    /// never listed or handed out until a fork claims it.
    Pooled,
    /// Stopped to free memory, files, credential and address kept; the next
    /// connection through the router (or `airlock wake`) starts it again.
    Suspended,
    /// Being rebuilt from its golden by `reset`, keeping id, address and
    /// credential; a daemon that dies meanwhile completes the reset at start.
    Resetting,
    /// Owned by a node of the cluster that stopped renewing its lease; only
    /// ever shown by another node, never stored by the owner.
    Lost,
}

impl SandboxState {
    /// The snake_case name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Creating => "creating",
            SandboxState::Running => "running",
            SandboxState::Deleting => "deleting",
            SandboxState::Pooled => "pooled",
            SandboxState::Suspended => "suspended",
            SandboxState::Resetting => "resetting",
            SandboxState::Lost => "lost",
        }
    }

    /// Parses the stored name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "creating" => SandboxState::Creating,
            "running" => SandboxState::Running,
            "deleting" => SandboxState::Deleting,
            "pooled" => SandboxState::Pooled,
            "suspended" => SandboxState::Suspended,
            "resetting" => SandboxState::Resetting,
            "lost" => SandboxState::Lost,
            _ => return None,
        })
    }
}

/// One sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Sandbox {
    /// Unique id, `sb-` and ten characters.
    pub id: String,
    /// Optional unique name among live sandboxes.
    pub name: Option<String>,
    /// The golden it was forked from.
    pub golden: String,
    /// The golden generation it was forked from.
    pub generation: i64,
    /// The connection string with its credential; only set once running. Through
    /// the router when it is on, else the private socket.
    pub dsn: Option<String>,
    /// The same credential over the sandbox's private unix socket (for tools on
    /// this host that bypass the router).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_dsn: Option<String>,
    /// The same credential on the router's unix socket, when the router has
    /// one (`serve --router-socket`): for clients on this host, any user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router_socket_dsn: Option<String>,
    /// Its Redis through the router, when its golden has one (`rediss://` with
    /// TLS): the sandbox's id as the user, its password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis_url: Option<String>,
    /// The same over the Redis server's private unix socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis_socket_url: Option<String>,
    /// Lifecycle state.
    pub state: SandboxState,
    /// Free-form labels for finding it again.
    pub labels: BTreeMap<String, String>,
    /// When the fork was asked for.
    pub created_at: Timestamp,
    /// When the reaper deletes it.
    pub expires_at: Timestamp,
    /// The credential's access mode and limits.
    #[serde(default)]
    pub access: crate::records::access::Access,
    /// Seconds without a connection after which it is suspended; 0 never.
    #[serde(default)]
    pub idle_suspend_seconds: u64,
    /// The cluster node that owns it (set only when the daemon is in a cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The postmaster's process id while running.
    #[serde(skip)]
    pub pid: Option<i32>,
    /// The uid it runs as (root only), leased host-wide.
    #[serde(skip)]
    pub uid: Option<u32>,
    /// The named per-sandbox user of a sandbox made before uids were leased.
    #[serde(skip)]
    pub slot: Option<i64>,
    /// The router's SCRAM verifier for its credential (4096 iterations), which
    /// clients authenticate against; None until minted.
    #[serde(skip)]
    pub verifier: Option<String>,
    /// When a router session on it last opened or closed (the router runs in a
    /// process of its own and records this for the daemon's idle decisions).
    #[serde(skip)]
    pub active_at: Option<Timestamp>,
}

impl Sandbox {
    /// The same sandbox with every form of its credential left out: what a
    /// listing or a `show` gives.
    pub fn without_credentials(mut self) -> Sandbox {
        self.dsn = None;
        self.socket_dsn = None;
        self.router_socket_dsn = None;
        self.redis_url = None;
        self.redis_socket_url = None;
        self
    }

    /// Whether a migration test made it (and deletes it when the test ends).
    pub fn is_migration_test_fork(&self) -> bool {
        let (key, value) = MIGRATION_TEST_LABEL;
        self.labels.get(key).map(String::as_str) == Some(value)
    }

    /// A new sandbox record in state `creating`, with a fresh id, expiring `ttl` from now.
    pub fn creating(
        golden: &str,
        generation: i64,
        name: Option<String>,
        labels: BTreeMap<String, String>,
        access: crate::records::access::Access,
        ttl: Duration,
        idle_suspend: Duration,
    ) -> Sandbox {
        let now = Timestamp::now();
        Sandbox {
            id: crate::secret::sandbox_id(),
            name,
            golden: golden.to_owned(),
            generation,
            dsn: None,
            socket_dsn: None,
            router_socket_dsn: None,
            redis_url: None,
            redis_socket_url: None,
            state: SandboxState::Creating,
            labels,
            created_at: now,
            expires_at: now.plus(ttl),
            access,
            idle_suspend_seconds: idle_suspend.as_secs(),
            node: None,
            pid: None,
            uid: None,
            slot: None,
            verifier: None,
            active_at: None,
        }
    }
}
