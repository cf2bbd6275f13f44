//! A sandbox's Redis as a [`StoreKind`]: its data cloned from the golden's
//! dump, its server configured with the agent's user and started beside the
//! others.

use std::collections::HashSet;
use std::path::Path;

use super::{At, Credential, Held, Launch, Stop, StoreKind, HOLD_LIMIT};
use crate::engine::Engine;
use crate::sandbox::{Mode, Steps};
use airlock_core::error::{Error, Result};
use airlock_core::layout::InstanceDir;
use airlock_host::storage::clone::Deferred;
use airlock_redis::server::{self, Admin};

/// A Redis server on the sandbox's private socket ([`airlock_redis`]).
pub struct Redis;

#[async_trait::async_trait]
impl StoreKind for Redis {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn in_generation(&self, root: &Path) -> bool {
        server::rdb(root).is_file()
    }

    fn in_sandbox(&self, dir: &InstanceDir) -> bool {
        server::configured(dir)
    }

    fn restarts_alone(&self) -> bool {
        true
    }

    fn clone_from_golden(&self, at: At<'_>, golden_root: &Path) -> Result<Option<Deferred>> {
        let user = at.engine.sandbox_user(at.sb)?;
        let (from, to) = (golden_root.join("redis"), at.dir.redis_dir());
        super::clone_owned(
            at.engine,
            (&from, &to),
            &user,
            at.engine.daemon_user.uid,
            "a golden's Redis part",
        )?;
        Ok(None)
    }

    fn configure(&self, at: At<'_>, password: &str) -> Result<()> {
        let admin_password = airlock_core::secret::password();
        let settings = server::Settings {
            max_memory: server::max_memory(at.engine.config.cgroup_limits.memory_bytes),
            admin_password: &admin_password,
            user: Some((&at.sb.id, password)),
            read_only: at.sb.access.mode == Mode::Readonly,
        };
        server::write_config(at.dir, &settings)
    }

    async fn start(
        &self,
        at: At<'_>,
        launch: &Launch,
        _credential: Credential<'_>,
        _steps: &mut Steps,
    ) -> Result<Option<i32>> {
        // Its credential is in the configuration `configure` wrote, and its
        // spawn reads it: for a new fork, only once the gate says it is there.
        if let Some(gate) = &launch.gate {
            gate.passed().await.map_err(|e| Error::io("starting a sandbox's Redis", &e))?;
        }
        server::start(at.dir, (&launch.user, launch.group), &launch.cgroups, launch.network.as_ref())
            .await
            .map(Some)
    }

    fn pid(&self, at: At<'_>) -> Option<i32> {
        server::find(at.dir)
    }

    async fn answers(&self, at: At<'_>) -> bool {
        self.pid(at).is_some()
    }

    async fn save(&self, at: At<'_>) -> Result<()> {
        Admin::connect(at.dir).await?.save().await
    }

    async fn prepare_copy(&self, at: At<'_>) -> Result<Option<Held>> {
        // It saves its state and takes no write from then until the copy is
        // made (or, should the daemon die first, HOLD_LIMIT): a PostgreSQL
        // frozen after this is a copy of the same instant.
        let mut admin = Admin::connect(at.dir).await?;
        admin.hold_writes(HOLD_LIMIT).await?;
        if let Err(e) = admin.save().await {
            resume(admin).await;
            return Err(e);
        }
        Ok(Some(Held::new(resume(admin))))
    }

    fn copy_frozen(&self, from: At<'_>, to: At<'_>) -> Result<()> {
        let user = to.engine.sandbox_user(to.sb)?;
        let source_user = from.engine.sandbox_user(from.sb)?;
        let (source, target) = (from.dir.redis_dir(), to.dir.redis_dir());
        super::clone_owned(from.engine, (&source, &target), &user, source_user.uid, "a sandbox's Redis data")
    }

    async fn resume_writes(&self, at: At<'_>) -> Result<()> {
        match self.pid(at) {
            Some(_) => Admin::connect(at.dir).await?.resume_writes().await,
            None => Ok(()),
        }
    }

    async fn stop(&self, at: At<'_>, how: Stop) -> Result<bool> {
        // What it held since its last save (a suspend saves first) is given
        // up when stopped at once.
        server::stop(at.dir).await;
        Ok(how == Stop::Clean)
    }

    async fn claim(&self, at: At<'_>, password: &str, fresh: bool, changed: bool) -> Result<()> {
        if !changed {
            return Ok(());
        }
        let mut admin = Admin::connect(at.dir).await?;
        if fresh {
            admin.set_password(&at.sb.id, password).await?;
        }
        admin.set_read_only(&at.sb.id, at.sb.access.mode == Mode::Readonly).await
    }

    fn remove_data(&self, at: At<'_>) -> Result<()> {
        super::remove_tree(at.engine, &at.dir.redis_dir())
    }

    async fn clients(&self, at: At<'_>) -> Option<u64> {
        Admin::connect(at.dir).await.ok()?.other_clients().await.ok()
    }

    async fn stop_unknown(&self, engine: &Engine, live: &HashSet<String>) -> Result<usize> {
        let layout = &engine.layout;
        let mut stopped = 0;
        for (pid, cmdline) in server::servers_under(&[layout.sandboxes(), layout.staging()]) {
            let known = live.iter().any(|id| {
                cmdline.contains(&format!("/{id}/run/redis.sock"))
                    || cmdline.contains(&format!("/{id}/redis.conf"))
            });
            if !known {
                tracing::warn!(pid, "stopping a redis-server the store does not know");
                server::kill(pid).await;
                stopped += 1;
            }
        }
        Ok(stopped)
    }

    fn exec_env(&self, at: At<'_>, password: &str) -> Option<(&'static str, String, Option<&'static str>)> {
        Some(("REDIS_URL", server::exec_url(at.dir, &at.sb.id, password), Some("redis_url")))
    }
}

/// Lets a held server's writes go on (a failure is logged: the hold ends at
/// [`HOLD_LIMIT`] anyway).
async fn resume(mut admin: Admin) {
    if let Err(e) = admin.resume_writes().await {
        tracing::warn!(error = %e, "a store's writes could not be resumed; they resume when the hold ends");
    }
}
