//! `airlock branch`: a new sandbox from a live one's state at one instant.
//!
//! Every process of the source's server is stopped (SIGSTOP to its process
//! group), its data directory is cloned, and the processes continue: the clone
//! is what a crash at that instant would have left on disk, which PostgreSQL
//! recovers from when the branch starts. (A stopped process has finished any
//! write in progress, so no page is torn.) The branch gets its own id, user,
//! cgroups and a fresh password for the same role.

use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{instance_dir, ms, start, Forked, Sandbox, SandboxState, Steps};
use crate::engine::Engine;
use crate::error::{Error, ErrorCode, Result};
use crate::events::NewEvent;
use crate::pg::admin::Admin;
use crate::pg::dsn::DATABASE;
use crate::secret;

/// A request to branch a live sandbox.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BranchRequest {
    /// Seconds until the branch expires; the daemon default if absent.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub ttl_seconds: Option<i64>,
    /// Labels of the branch.
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
    /// A unique name for the branch.
    #[serde(default)]
    #[schema(pattern = "^[a-z][a-z0-9_-]{0,47}$")]
    pub name: Option<String>,
}

/// Makes a new sandbox holding a running sandbox's state at one instant.
pub async fn branch(engine: &Engine, key: &str, req: &BranchRequest) -> Result<Forked> {
    let began = Instant::now();
    let ttl = super::placement(engine, req.name.as_deref(), &req.labels, req.ttl_seconds)?;
    let mut source = engine.store().sandbox(key)?;
    if source.state == SandboxState::Suspended {
        source = super::wake(engine, &source.id).await?;
    }
    if source.state != SandboxState::Running {
        return Err(not_running(&source));
    }
    let mut sb = Sandbox::creating(
        &source.golden,
        source.generation,
        req.name.clone(),
        req.labels.clone(),
        source.access,
        ttl,
        Duration::from_secs(source.idle_suspend_seconds),
    );
    // Room for the branch, never made by suspending the sandbox being branched.
    let admitted =
        super::capacity::admit(engine, Duration::ZERO, super::capacity::Need::New, Some(&source.id)).await?;
    engine.insert_sandbox(&mut sb, |_, _| Ok(()))?;
    let created = engine.store().record(NewEvent {
        kind: crate::events::EventKind::Created,
        sandbox: Some(sb.id.clone()),
        golden: Some(sb.golden.clone()),
        detail: json!({"generation": sb.generation, "expires_at": sb.expires_at, "branched_from": source.id}),
        ..Default::default()
    });
    if let Err(e) = created {
        super::teardown(engine, &sb, crate::events::DeleteReason::Failed).await?;
        return Err(e);
    }
    drop(admitted);
    let mut steps = Steps::default();
    let password = secret::password();
    let minting = super::mint_verifier(&password);
    let mut paused_ms = 0.0;
    // The source's lock, held to the end: no suspend, wake, reset or delete of it
    // runs while it is paused or copied. Taken after admission, which may wait on
    // other sandboxes' locks, so no two branches can wait on each other.
    let _source_op = engine.sandbox_lock(&source.id).await;
    let made = async {
        let source = engine.store().sandbox(&source.id)?;
        let Some(source_pid) = source.pid.filter(|_| source.state == SandboxState::Running) else {
            return Err(not_running(&source));
        };
        let dir = instance_dir(engine, &sb.id);
        let user = engine.sandbox_user(&sb)?;
        let source_user = engine.sandbox_user(&source)?;
        let group = engine.socket_group(&sb);
        super::make_dir(engine, &dir)?;
        crate::pg::instance::prepare_dir(&dir, &user, group)?;
        let t = Instant::now();
        let source_pgdata = instance_dir(engine, &source.id).pgdata();
        // The source's files are its user's, and code running as that user may
        // be swapping them right now: the clone takes directories and regular
        // files of that user only, never a link, and fails closed otherwise.
        let config = engine.layout.golden_generation(&source.golden, source.generation).join("pgdata");
        let source_dir = instance_dir(engine, &source.id);
        let postgres = engine.layout.generation_has_postgres(&source.golden, source.generation);
        let stores = super::stores::Store::of_sandbox(&source_dir);
        let cloned = {
            // A daemon that dies while the source is paused leaves it stopped;
            // reconciliation continues every server it keeps.
            let _paused = postgres.then(|| Paused::new(source_pid)).transpose()?;
            crate::crashpoint::reached("branch.paused");
            // Its other stores save their state while PostgreSQL is held: all
            // are taken at the same point of the agent's work.
            for store in &stores {
                store.save(&source_dir).await?;
            }
            let cloned = match postgres {
                true => engine.cloner.clone_data(
                    &source_pgdata,
                    &config,
                    &dir.pgdata(),
                    Some(&user),
                    Some(source_user.uid),
                ),
                false => Ok(Default::default()),
            };
            for store in &stores {
                store.clone_saved(engine, (&source_dir, &dir), &user, source_user.uid)?;
            }
            cloned
        };
        paused_ms = ms(t);
        cloned.map_err(|e| Error::io(format!("cloning {}", source_pgdata.display()), &e))?;
        steps.clone_ms = paused_ms;
        if postgres {
            crate::pg::instance::write_access_files(&dir, &engine.admin_os_users(), &[])?;
        }
        let cgroups = engine
            .cgroups
            .create(&sb.id, &engine.config.cgroup_limits)
            .map_err(|e| Error::io(format!("making the cgroups of {}", sb.id), &e))?;
        let server = postgres.then(|| engine.server_for(&sb.golden, sb.generation)).transpose()?;
        for store in &stores {
            store.configure(engine, &dir, &sb, &password)?;
        }
        let started =
            server.map(|server| start(server, &dir, (&user, group), &cgroups, &sb.access, None, &mut steps));
        let pid = super::stores::start_with(started, &stores, &dir, (&user, group), &cgroups).await?;
        // The clone carries the source's role and password: give the branch its own.
        if postgres {
            let t = Instant::now();
            Admin::connect(&dir, DATABASE, pid).await?.restore_agent_password(&password).await?;
            steps.credential_ms = ms(t);
        }
        Ok::<i32, Error>(pid)
    }
    .await;
    let detail = json!({"fork_ms": ms(began), "branched_from": source.id, "source_paused_ms": paused_ms, "steps": steps});
    super::finish(engine, sb, made, &password, minting, detail).await
}

fn not_running(source: &Sandbox) -> Error {
    Error::new(
        ErrorCode::InvalidRequest,
        format!("sandbox {} is {}, not running", source.id, source.state.as_str()),
        "branch a running sandbox (wake it first if it was suspended meanwhile)",
    )
}

/// A server's process group held stopped; continued when dropped, whatever happens.
pub(crate) struct Paused {
    group: Pid,
}

impl Paused {
    /// Stops every process of the server whose postmaster is `postmaster`.
    pub(crate) fn new(postmaster: i32) -> Result<Paused> {
        let group = Pid::from_raw(postmaster);
        killpg(group, Signal::SIGSTOP)
            .map_err(|e| Error::postgres(format!("could not pause the source: {e}")))?;
        let paused = Paused { group };
        // Wait until every process of the group has actually stopped.
        let deadline = Instant::now() + Duration::from_secs(2);
        while !all_stopped(postmaster) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(paused)
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = killpg(self.group, Signal::SIGCONT);
    }
}

/// Whether every live process in `pgid`'s group is stopped.
fn all_stopped(pgid: i32) -> bool {
    let Ok(procs) = std::fs::read_dir("/proc") else { return true };
    procs.flatten().filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok()).all(|pid| {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return true };
        let Some((_, rest)) = stat.rsplit_once(')') else { return true };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // fields[0] is the state, fields[2] the process group.
        fields.get(2).and_then(|g| g.parse::<i32>().ok()) != Some(pgid)
            || matches!(fields[0], "T" | "t" | "Z" | "X")
    })
}
