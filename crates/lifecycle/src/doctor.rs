//! `airlock doctor`: what the daemon's host can do, and what it does less
//! well than it could.

use serde::Serialize;

use crate::engine::Engine;
use crate::sandbox::{headroom, volume};
use airlock_host::cgroup::{CgroupLimits, Cgroups};
use airlock_host::storage::Backend;

impl Engine {
    /// A report for `airlock doctor`.
    pub fn doctor(&self) -> Doctor {
        let mut warnings = self.fork_warnings();
        warnings.extend(headroom::check_volume(self).unwrap_or_else(|e| vec![e.message]));
        let root = self.daemon_user.is_root();
        let cgroup_moves = (root && self.cgroups.available()).then(airlock_host::cgroup_moves::state);
        if !root {
            warnings.push(
                "the daemon is not root: sandboxes run as the daemon's own user in the host's network namespace, \
                 without cgroup limits, and `storage init` is unavailable"
                    .into(),
            );
        } else if !self.cgroups.available() {
            warnings.push("no usable cgroups (v2 with memory, pids and cpu, or v1): sandboxes run without memory, pids and CPU limits".into());
        } else if let Some(airlock_host::cgroup_moves::CgroupMoves::Waiting { mount }) = &cgroup_moves {
            warnings.push(format!(
                "{} lacks favordynmods: each cold fork waits 5-15 ms for the kernel to move its server into its cgroups \
                 (serve with --favor-cgroup-moves on, or remount it with that option)",
                mount.display()
            ));
        }
        Doctor {
            version: env!("CARGO_PKG_VERSION").into(),
            home: self.layout.home().display().to_string(),
            volume: self.layout.volume().display().to_string(),
            filesystem: self.cloner.filesystem().to_owned(),
            storage_backend: self.cloner.backend(),
            postgres_bin: self.postgres.default_server().bin.dir().display().to_string(),
            postgres_version: self.postgres.default_server().bin.version(),
            extensions: self.postgres.default_server().bin.available_extensions(),
            postgres_majors: self.postgres.list(),
            daemon_user: self.daemon_user.name.clone(),
            instance_user: self.instance_user.name.clone(),
            per_sandbox_users: root,
            sandbox_uids: self.leases.as_ref().map(|l| l.range()),
            network_namespaces: root,
            cgroups: self.cgroups.clone(),
            cgroup_limits: self.config.cgroup_limits,
            cgroup_moves,
            disk_limit_bytes: self.config.disk_limit_bytes,
            max_sandboxes: self.config.max_sandboxes,
            max_running: self.config.max_running,
            max_disk_bytes: self.config.max_disk_bytes,
            disk_reserve_bytes: volume::Space::of(self).reserve,
            disk_quota_per_sandbox: self.cloner.hard_quota(),
            disk_headroom_bytes: self.config.disk_headroom_bytes,
            disk_unpromised_bytes: self.headroom.unpromised(),
            default_idle_suspend_seconds: self.config.default_idle_suspend.as_secs(),
            router: self.router.get(),
            gateway: None,
            default_ttl_seconds: self.config.default_ttl.as_secs(),
            max_ttl_seconds: self.config.max_ttl.as_secs(),
            warnings,
        }
    }
}

/// What `airlock doctor` reports about the daemon's host.
#[derive(Debug, Clone, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Doctor {
    /// Airlock's version.
    pub version: String,
    /// The data root.
    pub home: String,
    /// The copy-on-write volume.
    pub volume: String,
    /// The volume's filesystem type.
    pub filesystem: String,
    /// `reflink` or `copy`.
    pub storage_backend: Backend,
    /// Where the PostgreSQL binaries are.
    pub postgres_bin: String,
    /// `postgres --version`.
    pub postgres_version: String,
    /// Extensions this PostgreSQL can install (goldens import the ones their source uses).
    #[serde(default)]
    pub extensions: Vec<String>,
    /// Every PostgreSQL major found: system, installed, and any that cannot be used.
    #[serde(default)]
    pub postgres_majors: Vec<airlock_postgres::majors::MajorInfo>,
    /// The daemon's OS user.
    pub daemon_user: String,
    /// The OS user goldens are built as; sandboxes run as `<it>-<slot>` when root.
    pub instance_user: String,
    /// Whether each sandbox runs as its own OS user.
    pub per_sandbox_users: bool,
    /// The uids sandboxes are leased from (root only).
    #[serde(default)]
    pub sandbox_uids: Option<airlock_host::users::UidRange>,
    /// Whether each sandbox has its own network namespace (no egress).
    pub network_namespaces: bool,
    /// The cgroup layout used for limits.
    pub cgroups: Cgroups,
    /// The limits each sandbox gets when cgroups are available.
    pub cgroup_limits: CgroupLimits,
    /// Whether a server's move into its cgroups waits on the kernel (root only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_moves: Option<airlock_host::cgroup_moves::CgroupMoves>,
    /// How far a sandbox may grow beyond its golden, bytes.
    pub disk_limit_bytes: u64,
    /// The sandbox limit.
    pub max_sandboxes: usize,
    /// The running-sandbox limit.
    pub max_running: usize,
    /// The volume's disk limit, bytes.
    pub max_disk_bytes: Option<u64>,
    /// Free space kept on the volume, bytes.
    #[serde(default)]
    pub disk_reserve_bytes: u64,
    /// Whether each sandbox has a hard disk quota (Btrfs) rather than a watch.
    #[serde(default)]
    pub disk_quota_per_sandbox: bool,
    /// With a quota per sandbox: what every running sandbox can always write.
    #[serde(default)]
    pub disk_headroom_bytes: u64,
    /// With a quota per sandbox: what the volume has promised to no sandbox yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_unpromised_bytes: Option<u64>,
    /// Idle time before a sandbox is suspended unless its fork says otherwise; 0 never.
    pub default_idle_suspend_seconds: u64,
    /// Where the router listens; absent when it is off.
    pub router: Option<crate::doors::Address>,
    /// The MCP gateway's base URL; absent when it is off (the API fills it in:
    /// the gateway is a service, so the engine does not know it).
    #[serde(default)]
    pub gateway: Option<String>,
    /// Default TTL, seconds.
    pub default_ttl_seconds: u64,
    /// Maximum TTL, seconds.
    pub max_ttl_seconds: u64,
    /// Things that work but not as well as they could.
    pub warnings: Vec<String>,
}
