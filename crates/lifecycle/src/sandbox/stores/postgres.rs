//! A sandbox's PostgreSQL as a [`StoreKind`]: its data directory cloned from
//! the golden's, its server started with the in-server guard, the agent's
//! role minted in it.

use std::collections::HashSet;
use std::path::Path;
use std::time::Instant;

use super::{At, Credential, Ending, Held, Launch, Stop, StoreKind};
use crate::engine::Engine;
use crate::sandbox::{millis, ms, Access, Steps};
use airlock_core::dsn::DATABASE;
use airlock_core::error::{Error, Result};
use airlock_core::layout::InstanceDir;
use airlock_host::storage::{clone::Deferred, Shape};
use airlock_postgres::admin::{self, Admin};
use airlock_postgres::instance;

/// A PostgreSQL server on the sandbox's private socket.
pub struct Postgres;

/// The pid in a data directory's `postmaster.pid`, if any (read without
/// following a link: the file is the instance user's, so only a hint).
pub fn postmaster_pid(dir: &InstanceDir) -> Option<i32> {
    let text = airlock_host::storage::tree::read_small(&dir.pgdata().join("postmaster.pid"), 4096).ok()?;
    text.lines().next()?.trim().parse().ok()
}

/// The pids that may be the sandbox's postmaster: the one on record, and the
/// one its pid file names (a start a crash cut short).
fn candidates(at: At<'_>) -> impl Iterator<Item = i32> {
    at.sb.pid.into_iter().chain(postmaster_pid(at.dir))
}

/// Writes a sandbox server's access files: the agent role by peer from the
/// sandbox's own OS users and the daemon's, never by a password.
fn write_access_files(at: At<'_>) -> Result<()> {
    let agent = at.engine.agent_os_users(at.sb)?;
    let admin = at.engine.admin_os_users();
    instance::write_access_files(at.dir, &instance::Peers { admin: &admin, agent: &agent, owner: &[] })
}

/// Whether the fork's golden holds the agent role its access asks for, made
/// by the same statements this daemon would run.
fn premade(at: At<'_>) -> bool {
    let golden = InstanceDir { root: at.engine.layout.golden_generation(&at.sb.golden, at.sb.generation) };
    let file = golden.agent_role_file();
    airlock_host::storage::tree::read_small(&file, 64 * 1024)
        .is_ok_and(|made| made == at.sb.access.create_role_sql())
}

/// template1's directory in a data directory.
pub const TEMPLATE1: &str = "base/1";

/// The golden's template1, which the sandbox's server copies from at its
/// first CREATE DATABASE (a golden built before goldens kept it has none).
fn template_of(at: At<'_>) -> Option<std::path::PathBuf> {
    let path =
        at.engine.layout.golden_generation(&at.sb.golden, at.sb.generation).join("pgdata").join(TEMPLATE1);
    path.join("PG_VERSION").is_file().then_some(path)
}

impl Postgres {
    /// Starts the server and waits until it is ready; returns its pid, and
    /// whether it became ready.
    async fn launch(&self, at: At<'_>, launch: &Launch, steps: &mut Steps) -> Result<(i32, Result<()>)> {
        let server = at.engine.server_for(&at.sb.golden, at.sb.generation)?;
        let t = Instant::now();
        let (mut started, exec_at) = match &launch.gate {
            None => (
                instance::start(
                    &server.bin,
                    at.dir,
                    &launch.user,
                    launch.group,
                    &launch.cgroups,
                    Some(&server.guard),
                    launch.network.as_ref(),
                    template_of(at).as_deref(),
                    None,
                )?,
                Instant::now(),
            ),
            // The spawn returns once the server runs its program, which then
            // waits for the gate (or, uncontained, once the gate opens): on a
            // thread of its own while this task clones the files.
            Some(gate) => {
                let (bin, dir, user, group) =
                    (server.bin.clone(), at.dir.clone(), launch.user.clone(), launch.group);
                let cgroups = launch.cgroups.clone();
                let guard = server.guard.clone();
                let network = launch.network.as_ref().map(|n| n.try_clone()).transpose()?;
                let template = template_of(at);
                let gate = gate.clone();
                // This task resumes only once the clone is done (it has no
                // await point), so the exec's moment is taken on the thread.
                tokio::task::spawn_blocking(move || {
                    instance::start(
                        &bin,
                        &dir,
                        &user,
                        group,
                        &cgroups,
                        Some(&guard),
                        network.as_ref(),
                        template.as_deref(),
                        Some(&gate),
                    )
                    .map(|started| (started, Instant::now()))
                })
                .await
                .map_err(|e| Error::internal(format!("starting a server stopped: {e}")))??
            }
        };
        let opened = launch.gate.as_ref().and_then(|g| g.opened_at());
        // The start: the containment and the exec, from the spawn or, when
        // the gate held the spawn back, from its opening.
        let began = opened.filter(|o| *o <= exec_at).map_or(t, |o| o.max(t));
        steps.start_ms = millis(exec_at.saturating_duration_since(began));
        let ready = started.wait_ready(at.dir).await;
        let pid = started.detach();
        // Ready: from the moment the server could go on, its program running
        // and its gate open, to `ready`.
        let could_go_on = opened.map_or(exec_at, |o| o.max(exec_at));
        steps.ready_ms = millis(Instant::now().saturating_duration_since(could_go_on));
        Ok((pid, ready))
    }

    /// Clears what a dead server left behind before the sandbox's own data
    /// starts again: a server still on the directory (two on one data
    /// directory would corrupt it), the System V segment a dead one names,
    /// and its pid file, whose pid may live on as a zombie or be reused.
    async fn clear_leftovers(&self, at: At<'_>) -> Result<()> {
        let pgdata = at.dir.pgdata();
        if let Some(pid) = postmaster_pid(at.dir) {
            if instance::is_postmaster_of(pid, &pgdata) {
                tracing::warn!(sandbox = %at.sb.id, pid, "a server still ran on a sandbox being restarted; stopping it");
            }
            // Fails when it cannot tell whether that server runs: no second
            // server is started beside one that may.
            instance::kill(pid, &pgdata).await?;
        }
        instance::remove_stale_shared_memory(&pgdata);
        let _ = std::fs::remove_file(pgdata.join("postmaster.pid"));
        Ok(())
    }
}

#[async_trait::async_trait]
impl StoreKind for Postgres {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn in_generation(&self, root: &Path) -> bool {
        InstanceDir { root: root.to_owned() }.has_postgres()
    }

    fn in_sandbox(&self, dir: &InstanceDir) -> bool {
        dir.has_postgres()
    }

    fn restarts_alone(&self) -> bool {
        false
    }

    fn clone_from_golden(&self, at: At<'_>, golden_root: &Path) -> Result<Option<Deferred>> {
        let golden = golden_root.join("pgdata");
        let user = at.engine.sandbox_user(at.sb)?;
        let what = golden.display().to_string();
        let shape = Shape {
            // Not cloned: the guard copies it into place from the golden's at
            // the first CREATE DATABASE that needs it.
            hollow: &[TEMPLATE1],
            // Read by no process of the server before a session opens (a
            // clean shutdown's start recovers nothing): cloned while it starts.
            deferred: &["base"],
            renamed: &[instance::RELCACHE_KEPT_AT_CLONE],
            skip: &[instance::RELCACHE_NOT_CLONED],
        };
        let (from, to) = (&golden, &at.dir.pgdata());
        let later = super::clone_owned_shaped(
            at.engine,
            (from, to),
            &user,
            at.engine.daemon_user.uid,
            &what,
            &shape,
        )?;
        Ok(Some(later))
    }

    fn configure(&self, _at: At<'_>, _password: &str) -> Result<()> {
        // The access files are written before the server is spawned (see
        // `start`): its view, composed then, holds their user database.
        Ok(())
    }

    async fn start(
        &self,
        at: At<'_>,
        launch: &Launch,
        credential: Credential<'_>,
        steps: &mut Steps,
    ) -> Result<Option<i32>> {
        if let Credential::Kept = credential {
            self.clear_leftovers(at).await?;
        }
        write_access_files(at)?;
        let (pid, ready) = self.launch(at, launch, steps).await?;
        let bound = async {
            ready?;
            // Before any session, the admin's too: the first reads them.
            if let Credential::Mint(_) = credential {
                if let Err(e) = instance::restore_relcache_init(&at.dir.pgdata()) {
                    tracing::warn!(sandbox = %at.sb.id, error = %e, "could not restore the relation cache files");
                }
            }
            let t = Instant::now();
            match credential {
                // The golden's own agent role, made for this access: nothing
                // to do, and no session of the admin's on the fork's clock.
                Credential::Mint(_) if premade(at) => return Ok(pid),
                Credential::Mint(_) => {
                    Admin::connect(at.dir, DATABASE, pid).await?.make_agent(&at.sb.access).await?
                }
                // Ready is not enough: at a full disk a server can start and
                // then refuse every session. A copy's agent role is its
                // source's; it logs in by peer, so there is no password to bind.
                Credential::Rebind(_) | Credential::Kept => {
                    return admin::answers(at.dir, pid, admin::ANSWER_TIMEOUT).await.map(|()| pid)
                }
            }
            steps.credential_ms = ms(t);
            Ok(pid)
        }
        .await;
        if bound.is_err() {
            let _ = instance::kill(pid, &at.dir.pgdata()).await;
        }
        bound.map(Some)
    }

    fn pid(&self, at: At<'_>) -> Option<i32> {
        let pgdata = at.dir.pgdata();
        candidates(at).find(|pid| instance::is_postmaster_of(*pid, &pgdata))
    }

    fn serves(&self, at: At<'_>) -> std::io::Result<bool> {
        at.sb.pid.map_or(Ok(false), |pid| instance::serves(pid, &at.dir.pgdata()))
    }

    async fn answers(&self, at: At<'_>) -> bool {
        let Some(pid) = at.sb.pid.filter(|pid| instance::is_postmaster_of(*pid, &at.dir.pgdata())) else {
            return false;
        };
        match admin::answers(at.dir, pid, admin::ANSWER_TIMEOUT).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(sandbox = %at.sb.id, error = %e, "a kept server does not answer");
                false
            }
        }
    }

    async fn save(&self, _at: At<'_>) -> Result<()> {
        // Everything committed is in its files already; a shutdown checkpoints.
        Ok(())
    }

    async fn prepare_copy(&self, at: At<'_>) -> Result<Option<Held>> {
        // A checkpoint first (the admin's; it runs nothing of the agent's):
        // the copy's crash recovery then replays only what came after, which
        // its own first promise of disk must hold. A failed one only makes
        // that recovery longer.
        let Some(pid) = at.sb.pid else { return Ok(None) };
        let done = async { Admin::connect(at.dir, DATABASE, pid).await?.execute("CHECKPOINT").await };
        if let Err(e) = done.await {
            tracing::warn!(sandbox = %at.sb.id, error = %e, "a checkpoint before a copy failed");
        }
        Ok(None)
    }

    fn copy_frozen(&self, from: At<'_>, to: At<'_>) -> Result<()> {
        let source = from.dir.pgdata();
        let config = from.engine.layout.golden_generation(&from.sb.golden, from.sb.generation).join("pgdata");
        let user = to.engine.sandbox_user(to.sb)?;
        let source_user = from.engine.sandbox_user(from.sb)?;
        from.engine
            .cloner
            .clone_data(&source, &config, &to.dir.pgdata(), Some(&user), Some(source_user.uid))
            .map(drop)
            .map_err(|e| Error::io(format!("cloning {}", source.display()), &e))
    }

    async fn end_sessions(&self, at: At<'_>, why: Ending) -> Result<()> {
        let Some(pid) = at.sb.pid else { return Ok(()) };
        let admin = Admin::connect(at.dir, DATABASE, pid).await?;
        admin.end_agent_sessions(why, std::time::Duration::from_secs(2)).await.map(drop)
    }

    async fn stop(&self, at: At<'_>, how: Stop) -> Result<bool> {
        let pgdata = at.dir.pgdata();
        match how {
            Stop::Clean => {
                if let Some(pid) = at.sb.pid {
                    instance::stop(pid, &pgdata).await;
                }
                Ok(instance::shut_down_cleanly(&pgdata))
            }
            Stop::Now => {
                for pid in candidates(at) {
                    instance::kill(pid, &pgdata).await.map_err(|e| {
                        Error::internal(format!(
                            "could not tell whether sandbox {}'s server still runs: {e}",
                            at.sb.id
                        ))
                    })?;
                }
                Ok(false)
            }
        }
    }

    async fn claim(&self, at: At<'_>, _password: &str, _fresh: bool, changed: bool) -> Result<()> {
        let kept = at.engine.pool.admins.lock().unwrap_or_else(|p| p.into_inner()).remove(&at.sb.id);
        if !changed {
            return Ok(());
        }
        // The agent logs in by peer: a fresh password binds nothing here.
        if at.sb.access == Access::default() {
            return Ok(());
        }
        let admin = match kept {
            Some(admin) => admin,
            None => Admin::connect(at.dir, DATABASE, at.sb.pid.unwrap_or_default()).await?,
        };
        admin.make_agent(&at.sb.access).await
    }

    async fn warm(&self, at: At<'_>) -> Result<()> {
        // A first connection builds the catalog caches and writes the relcache
        // init file, so the agent's sessions are quick. It stays open for a
        // claim that asks for other access.
        let admin = Admin::connect(at.dir, DATABASE, at.sb.pid.unwrap_or_default()).await?;
        at.engine.pool.admins.lock().unwrap_or_else(|p| p.into_inner()).insert(at.sb.id.clone(), admin);
        Ok(())
    }

    fn remove_data(&self, at: At<'_>) -> Result<()> {
        at.engine.cloner.remove_data_dir(&at.dir.pgdata()).or_else(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Ok(()),
            _ => Err(Error::io(format!("removing {}", at.dir.pgdata().display()), &e)),
        })
    }

    async fn clients(&self, at: At<'_>) -> Option<u64> {
        // Sessions the daemon keeps for the next tool call are not a client's.
        let kept: Vec<String> =
            at.engine.services.kept_backends(&at.sb.id).iter().map(|p| p.to_string()).collect();
        let admin = Admin::connect(at.dir, DATABASE, at.sb.pid.unwrap_or_default()).await.ok()?;
        let n = admin
            .value(&format!(
                "SELECT count(*)::text FROM pg_stat_activity
                 WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
                   AND pid <> ALL('{{{}}}'::int[])",
                kept.join(",")
            ))
            .await
            .ok()?;
        n.parse().ok()
    }

    async fn stop_unknown(&self, engine: &Engine, live: &HashSet<String>) -> Result<usize> {
        let mut stopped = 0;
        for (pid, pgdata) in postmasters_under(&engine.layout.volume()) {
            let id = sandbox_id_of(&engine.layout.sandboxes(), &pgdata);
            if id.as_ref().is_some_and(|id| live.contains(id)) {
                continue;
            }
            tracing::warn!(pid, pgdata = %pgdata.display(), "stopping a postgres process the store does not know");
            instance::kill(pid, &pgdata).await?;
            stopped += 1;
        }
        Ok(stopped)
    }

    fn exec_env(&self, at: At<'_>, _password: &str) -> Option<(&'static str, String, Option<&'static str>)> {
        Some(("DATABASE_URL", at.sb.dsn.clone()?, Some("database_url")))
    }
}

/// Every postmaster whose data directory lies under `root`, with that directory.
fn postmasters_under(root: &Path) -> Vec<(i32, std::path::PathBuf)> {
    let Ok(procs) = std::fs::read_dir("/proc") else { return vec![] };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let dir = instance::postmaster_data_dir(pid).ok()??;
            (dir.starts_with(root) && instance::is_alive(pid)).then_some((pid, dir))
        })
        .collect()
}

/// The sandbox id in `<sandboxes>/<id>/pgdata`.
fn sandbox_id_of(sandboxes: &Path, pgdata: &Path) -> Option<String> {
    let rest = pgdata.strip_prefix(sandboxes).ok()?;
    Some(rest.components().next()?.as_os_str().to_string_lossy().into_owned())
}
