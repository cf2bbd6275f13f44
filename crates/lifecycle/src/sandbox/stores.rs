//! The stores a sandbox holds beside (or instead of) its PostgreSQL.
//!
//! PostgreSQL, when a golden has it, is driven by the lifecycle code directly.
//! Every other kind a golden may carry is a [`StoreKind`], which fork, reset,
//! branch, suspend, wake, restart, teardown, the pool and the reaper handle
//! through this one interface: a new kind is a new variant here, never new
//! lifecycle code. A sandbox with no PostgreSQL is known by the pid of its
//! first store's server.

use std::ffi::CString;
use std::path::Path;

use crate::engine::Engine;
use crate::sandbox::{Mode, Sandbox};
use airlock_core::error::{Error, Result};
use airlock_core::layout::InstanceDir;
use airlock_host::users::Identity;

/// A kind of store beside PostgreSQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// A Redis server ([`airlock_redis`]).
    Redis,
}

/// The longest a store's writes are held while a copy is taken: past it
/// they go on by themselves (a daemon that died mid-copy holds nothing).
pub const HOLD_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// A store whose writes are held since its state was saved.
pub struct Held {
    admin: airlock_redis::server::Admin,
}

impl Held {
    /// Lets its writes go on (a failure is logged: the hold ends at
    /// [`HOLD_LIMIT`] anyway).
    pub async fn resume(mut self) {
        if let Err(e) = self.admin.resume_writes().await {
            tracing::warn!(error = %e, "a store's writes could not be resumed; they resume when the hold ends");
        }
    }
}

/// Saves and holds every store of `dir` (see [`StoreKind::save_held`]); none is
/// left held when one fails.
pub async fn save_all_held(stores: &[StoreKind], dir: &InstanceDir) -> Result<Vec<Held>> {
    let mut held = Vec::new();
    for store in stores {
        match store.save_held(dir).await {
            Ok(h) => held.push(h),
            Err(e) => {
                resume_all(held).await;
                return Err(e);
            }
        }
    }
    Ok(held)
}

/// Lets every held store's writes go on.
pub async fn resume_all(held: Vec<Held>) {
    for h in held {
        h.resume().await;
    }
}

/// Every kind, in the order the lifecycle handles them.
const ALL: &[StoreKind] = &[StoreKind::Redis];

impl StoreKind {
    /// The stores a golden generation (its directory) carries.
    pub fn of_generation(root: &Path) -> Vec<StoreKind> {
        ALL.iter().copied().filter(|s| s.in_generation(root)).collect()
    }

    /// The stores a sandbox (its instance directory) holds.
    pub fn of_sandbox(dir: &InstanceDir) -> Vec<StoreKind> {
        ALL.iter().copied().filter(|s| s.in_sandbox(dir)).collect()
    }

    /// Its name, for messages and events.
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Redis => "redis",
        }
    }

    fn in_generation(self, root: &Path) -> bool {
        match self {
            StoreKind::Redis => airlock_redis::server::rdb(root).is_file(),
        }
    }

    fn in_sandbox(self, dir: &InstanceDir) -> bool {
        match self {
            StoreKind::Redis => airlock_redis::server::configured(dir),
        }
    }

    /// Clones the golden generation's data (`golden_root`) into a new or reset
    /// sandbox, for `user`.
    pub fn clone_from_golden(
        self,
        engine: &Engine,
        golden_root: &Path,
        dir: &InstanceDir,
        user: &Identity,
    ) -> Result<()> {
        match self {
            StoreKind::Redis => engine
                .cloner
                .clone_tree(
                    &golden_root.join("redis"),
                    &dir.redis_dir(),
                    Some(user),
                    Some(engine.daemon_user.uid),
                )
                .map(|_| ())
                .map_err(|e| Error::io("cloning a golden's Redis part", &e)),
        }
    }

    /// Copies what a running sandbox saved ([`StoreKind::save`]) into a new one
    /// (a branch), its files taken only if they belong to `source_uid`.
    pub fn clone_saved(
        self,
        engine: &Engine,
        (from, to): (&InstanceDir, &InstanceDir),
        user: &Identity,
        source_uid: nix::unistd::Uid,
    ) -> Result<()> {
        match self {
            StoreKind::Redis => engine
                .cloner
                .clone_tree(&from.redis_dir(), &to.redis_dir(), Some(user), Some(source_uid))
                .map(|_| ())
                .map_err(|e| Error::io("cloning a sandbox's Redis data", &e)),
        }
    }

    /// Binds the store to sandbox `sb`'s agent with `password` and its access
    /// mode (its configuration, written before it starts).
    pub fn configure(self, engine: &Engine, dir: &InstanceDir, sb: &Sandbox, password: &str) -> Result<()> {
        match self {
            StoreKind::Redis => {
                let admin_password = airlock_core::secret::password();
                let settings = airlock_redis::server::Settings {
                    max_memory: airlock_redis::server::max_memory(engine.config.cgroup_limits.memory_bytes),
                    admin_password: &admin_password,
                    user: Some((&sb.id, password)),
                    read_only: sb.access.mode == Mode::Readonly,
                };
                airlock_redis::server::write_config(dir, &settings)
            }
        }
    }

    /// Starts it as `user` in `cgroups`; returns its server's pid once it answers.
    pub async fn start(
        self,
        dir: &InstanceDir,
        who: (&Identity, Option<nix::unistd::Gid>),
        cgroups: &[CString],
    ) -> Result<i32> {
        match self {
            StoreKind::Redis => airlock_redis::server::start(dir, who, cgroups).await,
        }
    }

    /// Its running server's pid.
    pub fn pid(self, dir: &InstanceDir) -> Option<i32> {
        match self {
            StoreKind::Redis => airlock_redis::server::find(dir),
        }
    }

    /// Whether its server runs.
    pub fn running(self, dir: &InstanceDir) -> bool {
        self.pid(dir).is_some()
    }

    /// Stops its server, if it runs.
    pub async fn stop(self, dir: &InstanceDir) {
        match self {
            StoreKind::Redis => airlock_redis::server::stop(dir).await,
        }
    }

    /// Writes its state into the sandbox's own directory (suspend, branch),
    /// where its next start begins from.
    pub async fn save(self, dir: &InstanceDir) -> Result<()> {
        match self {
            StoreKind::Redis => airlock_redis::server::Admin::connect(dir).await?.save().await,
        }
    }

    /// Saves its state as [`StoreKind::save`] does, and holds it so from then on:
    /// its server takes no write until [`Held::resume`] (or, should the
    /// daemon die first, [`HOLD_LIMIT`]). A PostgreSQL frozen after this is
    /// then a copy of the same instant as what it saved (branch, promote).
    pub async fn save_held(self, dir: &InstanceDir) -> Result<Held> {
        match self {
            StoreKind::Redis => {
                let mut admin = airlock_redis::server::Admin::connect(dir).await?;
                admin.hold_writes(HOLD_LIMIT).await?;
                let mut held = Held { admin };
                if let Err(e) = held.admin.save().await {
                    held.resume().await;
                    return Err(e);
                }
                Ok(held)
            }
        }
    }

    /// Lets go writes a copy held, should a daemon that died mid-copy have
    /// left them held (reconciliation; harmless otherwise).
    pub async fn resume_writes(self, dir: &InstanceDir) -> Result<()> {
        match self {
            StoreKind::Redis => airlock_redis::server::Admin::connect(dir).await?.resume_writes().await,
        }
    }

    /// Binds a pool member's store to the fork that claimed it: its access
    /// mode, and a new password when one was minted (`password`).
    pub async fn claim(self, dir: &InstanceDir, sb: &Sandbox, password: Option<&str>) -> Result<()> {
        match self {
            StoreKind::Redis => {
                let mut admin = airlock_redis::server::Admin::connect(dir).await?;
                if let Some(password) = password {
                    admin.set_password(&sb.id, password).await?;
                }
                admin.set_read_only(&sb.id, sb.access.mode == Mode::Readonly).await
            }
        }
    }

    /// Removes its data from a sandbox (a reset, before cloning again).
    pub fn remove_data(self, engine: &Engine, dir: &InstanceDir) -> std::io::Result<()> {
        let data = match self {
            StoreKind::Redis => dir.redis_dir(),
        };
        match engine.cloner.remove_tree(&data) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// Starts PostgreSQL (`postgres`, when the sandbox has it) and every other
/// store of a sandbox at once; returns, once all answer, the pid the sandbox
/// is known by (the postmaster's, else its first store's), or the first failure.
pub async fn start_with(
    postgres: Option<impl std::future::Future<Output = Result<i32>>>,
    stores: &[StoreKind],
    dir: &InstanceDir,
    who: (&Identity, Option<nix::unistd::Gid>),
    cgroups: &[CString],
) -> Result<i32> {
    let others = async {
        let mut first = None;
        for store in stores {
            let pid = store.start(dir, who, cgroups).await?;
            first.get_or_insert(pid);
        }
        Ok::<_, Error>(first)
    };
    let postgres = async {
        match postgres {
            Some(postgres) => postgres.await.map(Some),
            None => Ok(None),
        }
    };
    let (postgres, others) = tokio::join!(postgres, others);
    let first = others?;
    postgres?.or(first).ok_or_else(|| Error::internal("a sandbox has neither PostgreSQL nor another store"))
}

/// What `start_with` is given for a sandbox with no PostgreSQL.
pub const NO_POSTGRES: Option<std::future::Ready<Result<i32>>> = None;
