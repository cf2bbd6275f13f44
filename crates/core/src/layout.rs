//! Where everything lives under the data root (`$AIRLOCK_HOME`).
//!
//! ```text
//! state.db  daemon.lock  daemon.log  airlock.sock  storage.xfs
//! lib/                           the in-server guard library (root-owned, world-readable)
//! volume/                        the copy-on-write filesystem (a mount point after `storage init`)
//!   goldens/<name>/<gen>/        pgdata/, manifest.json
//!   sandboxes/<id>/              root-owned: pg_hba.conf, pg_ident.conf, postgres.log;
//!                                the sandbox's own: pgdata/, run/ (socket), exec/
//!   staging/                     goldens being built; removed at start if left over
//! ```
//!
//! An instance directory belongs to root and only its `pgdata/`, `run/` and
//! `exec/` to the instance's user, so the names root opens inside it (access
//! files, the log) cannot be swapped for links by code running as that user.
//!
//! Goldens and sandboxes share one filesystem (`volume/`) because a reflink
//! cannot cross filesystems.

use std::path::{Path, PathBuf};

/// Makes the data root and checks that it can be written.
pub fn prepare_home(home: &Path) -> crate::error::Result<()> {
    let fail = |e: std::io::Error| {
        crate::error::Error::new(
            crate::error::ErrorCode::DataRootNotWritable,
            format!("the data root {} cannot be written: {e}", home.display()),
            "point AIRLOCK_HOME (or --home) at a directory this user can write, or fix its permissions",
        )
    };
    std::fs::create_dir_all(home).map_err(fail)?;
    let probe = home.join(format!(".write-probe-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(fail)?;
    let _ = std::fs::remove_file(probe);
    Ok(())
}

/// Paths under one data root.
#[derive(Debug, Clone)]
pub struct Layout {
    home: PathBuf,
}

impl Layout {
    /// A layout rooted at `home`.
    pub fn new(home: impl Into<PathBuf>) -> Self {
        Layout { home: home.into() }
    }

    /// The default data root: `$AIRLOCK_HOME`, else `/var/lib/airlock` for root,
    /// else `$XDG_DATA_HOME/airlock` or `~/.local/share/airlock`.
    pub fn default_home() -> PathBuf {
        if let Some(h) = std::env::var_os("AIRLOCK_HOME") {
            return PathBuf::from(h);
        }
        if nix::unistd::geteuid().is_root() {
            return PathBuf::from("/var/lib/airlock");
        }
        if let Some(x) = std::env::var_os("XDG_DATA_HOME") {
            return PathBuf::from(x).join("airlock");
        }
        let home = std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into());
        PathBuf::from(home).join(".local/share/airlock")
    }

    /// A short name for this data root, stable across restarts (for host-wide
    /// names such as cgroups).
    pub fn tag(&self) -> String {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(self.home.as_os_str().as_encoded_bytes());
        crate::secret::hex(&digest[..6])
    }

    /// The data root itself.
    pub fn home(&self) -> &Path {
        &self.home
    }
    /// Per-row costs the migration airlock measured on each golden generation
    /// (kept apart from the goldens, which nothing changes once built).
    pub fn migration_costs(&self) -> PathBuf {
        self.home.join("migration-costs")
    }

    /// What migration tests saw of each row, kept for promote (see
    /// `airlock_migrate::rows`): each generation's rows, and each run's changes.
    pub fn migration_rows(&self) -> PathBuf {
        self.home.join("migration-rows")
    }

    /// Where this data root's sandboxes lease their uids, as first served.
    pub fn lease_place(&self) -> PathBuf {
        self.home.join("lease-place.json")
    }

    /// The embedded state store.
    pub fn state_db(&self) -> PathBuf {
        self.home.join("state.db")
    }
    /// The REST API's unix socket.
    pub fn api_socket(&self) -> PathBuf {
        self.home.join("airlock.sock")
    }
    /// The lock file that makes one daemon per data root.
    pub fn daemon_lock(&self) -> PathBuf {
        self.home.join("daemon.lock")
    }
    /// Where an auto-started daemon writes its log.
    pub fn daemon_log(&self) -> PathBuf {
        self.home.join("daemon.log")
    }
    /// The XFS image made by `airlock storage init`.
    pub fn storage_image(&self) -> PathBuf {
        self.home.join("storage.xfs")
    }
    /// The copy-on-write volume holding goldens and sandboxes.
    pub fn volume(&self) -> PathBuf {
        self.home.join("volume")
    }
    /// All goldens.
    pub fn goldens(&self) -> PathBuf {
        self.volume().join("goldens")
    }
    /// One golden generation's directory.
    pub fn golden_generation(&self, name: &str, generation: i64) -> PathBuf {
        self.goldens().join(name).join(generation.to_string())
    }
    /// Whether the sandboxes of a golden generation run a PostgreSQL (a
    /// Redis-only golden's run none). Read from the generation, which is the
    /// daemon's and never changes while a sandbox uses it: a reset between
    /// removing a sandbox's data and cloning it again does not change the answer.
    pub fn generation_has_postgres(&self, golden: &str, generation: i64) -> bool {
        InstanceDir { root: self.golden_generation(golden, generation) }.has_postgres()
    }
    /// Goldens under construction (same filesystem, so a finished one is renamed into place).
    pub fn staging(&self) -> PathBuf {
        self.volume().join("staging")
    }
    /// Dumps of live sources kept, per golden, until a build from them succeeds.
    pub fn imports(&self) -> PathBuf {
        self.volume().join("imports")
    }
    /// All sandboxes.
    pub fn sandboxes(&self) -> PathBuf {
        self.volume().join("sandboxes")
    }
    /// One sandbox's directory.
    pub fn sandbox(&self, id: &str) -> PathBuf {
        self.sandboxes().join(id)
    }
    /// One sandbox's instance files.
    pub fn sandbox_instance(&self, id: &str) -> InstanceDir {
        InstanceDir { root: self.sandbox(id) }
    }
    /// Libraries the daemon gives its instances (the in-server guard).
    pub fn lib(&self) -> PathBuf {
        self.home.join("lib")
    }
    /// The router's certificates.
    pub fn tls(&self) -> PathBuf {
        self.home.join("tls")
    }
    /// The cluster's CA certificate, and this node's certificate and key (root's, 0700).
    pub fn cluster(&self) -> PathBuf {
        self.home.join("cluster")
    }
    /// The audit log: segments, checkpoints and the signing key ([`airlock_state::audit`]).
    pub fn audit(&self) -> PathBuf {
        self.home.join("audit")
    }
    /// Routes the router leads clients along to databases outside any
    /// sandbox ([`crate::records::route`]), one file each, root's alone.
    pub fn routes(&self) -> PathBuf {
        self.home.join("routes")
    }
    /// The lock the router process holds while it runs.
    pub fn router_lock(&self) -> PathBuf {
        self.home.join("router.lock")
    }
    /// What the router process runs with and where it listens (JSON).
    pub fn router_state(&self) -> PathBuf {
        self.home.join("router.json")
    }
}

/// The files inside one instance directory (a sandbox, or a golden being built).
#[derive(Debug, Clone)]
pub struct InstanceDir {
    /// The directory holding `pgdata/` and `run/`.
    pub root: PathBuf,
}

impl InstanceDir {
    /// The PostgreSQL data directory.
    pub fn pgdata(&self) -> PathBuf {
        self.root.join("pgdata")
    }
    /// Whether it holds a PostgreSQL data directory (a golden generation, or
    /// a sandbox, with no PostgreSQL part holds none). Never follows a link:
    /// the entry sits in a directory only the daemon may change.
    pub fn has_postgres(&self) -> bool {
        std::fs::symlink_metadata(self.pgdata()).is_ok_and(|m| m.is_dir())
    }
    /// The private directory holding the instance's unix socket.
    pub fn socket_dir(&self) -> PathBuf {
        self.root.join("run")
    }
    /// The instance's unix socket.
    pub fn socket(&self) -> PathBuf {
        self.socket_dir().join(format!(".s.PGSQL.{}", crate::dsn::SOCKET_PORT))
    }
    /// The instance's server log (root's; the server writes it through the
    /// descriptor it was started with).
    pub fn log(&self) -> PathBuf {
        self.root.join("postgres.log")
    }
    /// The access rules the server reads (root's, outside the data directory).
    pub fn hba_file(&self) -> PathBuf {
        self.root.join("pg_hba.conf")
    }
    /// The peer-authentication map the server reads (root's, outside the data directory).
    pub fn ident_file(&self) -> PathBuf {
        self.root.join("pg_ident.conf")
    }
    /// The user database the server resolves peers' uids in (root's): the
    /// host's, with names for a sandbox's leased uids, which have none there.
    pub fn passwd_file(&self) -> PathBuf {
        self.root.join("passwd")
    }
    /// In a golden generation: the statements its agent role was made with
    /// (none in a golden made before goldens held one).
    pub fn agent_role_file(&self) -> PathBuf {
        self.root.join("agent-role.sql")
    }
    /// The working directory `airlock exec` commands start in (the instance user's).
    pub fn exec_dir(&self) -> PathBuf {
        self.root.join("exec")
    }
    /// The Redis server's data directory (its user's; `dump.rdb` inside).
    pub fn redis_dir(&self) -> PathBuf {
        self.root.join("redis")
    }
    /// The Redis server's unix socket, beside PostgreSQL's.
    pub fn redis_socket(&self) -> PathBuf {
        self.socket_dir().join("redis.sock")
    }
    /// The Redis server's configuration (root's, outside its data directory).
    pub fn redis_conf(&self) -> PathBuf {
        self.root.join("redis.conf")
    }
    /// The Redis admin's password (root's alone).
    pub fn redis_admin(&self) -> PathBuf {
        self.root.join("redis.admin")
    }
    /// The Redis server's log (root's, written through its descriptor).
    pub fn redis_log(&self) -> PathBuf {
        self.root.join("redis.log")
    }
}
