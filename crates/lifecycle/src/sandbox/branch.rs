//! `airlock branch`: a new sandbox from a live one's state at one instant.
//!
//! Every process of the source is frozen at one instant (its cgroup's
//! freezer, [`Frozen`]), its data directory is cloned, and the processes go
//! on: the clone is what a crash at that instant would have left on disk,
//! which PostgreSQL recovers from when the branch starts. (A frozen process has
//! finished any write in progress, so no page is torn.) A store with a server
//! that cannot be copied so (Redis) saves its data just before and takes no
//! write from then until the copy is made, so all are copies of the same
//! instant. The branch gets its own id, user, cgroups and a fresh password for
//! the same role.

use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::stores::{self, At, Credential, Launch};
use super::{instance_dir, ms, Forked, Sandbox, SandboxState, Steps};
use crate::engine::Engine;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::events::NewEvent;
use airlock_core::secret;

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
        kind: airlock_core::events::EventKind::Created,
        sandbox: Some(sb.id.clone()),
        golden: Some(sb.golden.clone()),
        detail: json!({"generation": sb.generation, "expires_at": sb.expires_at, "branched_from": source.id}),
        ..Default::default()
    });
    if let Err(e) = created {
        super::teardown(engine, &sb, airlock_core::events::DeleteReason::Failed).await?;
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
        let source_dir = instance_dir(engine, &source.id);
        let (from, to) = (At { engine, sb: &source, dir: &source_dir }, At { engine, sb: &sb, dir: &dir });
        let launch = Launch::of(engine, &sb, Vec::new()).await?;
        super::make_dir(engine, &dir)?;
        airlock_postgres::instance::prepare_dir(&dir, &launch.user, launch.group)?;
        let t = Instant::now();
        let stores = stores::of_sandbox(&source_dir);
        // Each store readies itself for the copy (PostgreSQL checkpoints, so
        // the copy's crash recovery replays only what came after; a Redis
        // saves its state and takes no write from then on, a frozen server
        // answering nothing), then every process of the sandbox is frozen at
        // one instant while its data is cloned: the saved state is the state
        // at that instant too. A daemon that dies while the source is frozen
        // leaves it so; reconciliation thaws every sandbox it keeps (and a
        // store's hold ends by itself).
        let held = stores::prepare_copy_all(&stores, from).await?;
        // Off the async workers: the agent decides how many files there are
        // to clone, and a clone of many would hold a worker (and whatever
        // waits on it) as long. The source's files are its user's, and code
        // running as that user may be swapping them right now: each store's
        // copy takes directories and regular files of that user only, never a
        // link, and fails closed otherwise.
        let cloned = tokio::task::block_in_place(|| {
            let _frozen = Frozen::new(engine, &source.id, source_pid)?;
            airlock_core::crashpoint::reached("branch.paused");
            stores.iter().try_for_each(|store| store.copy_frozen(from, to))
        });
        stores::resume_all(held).await;
        paused_ms = ms(t);
        cloned?;
        steps.clone_ms = paused_ms;
        let cgroups = engine
            .cgroups
            .create(&sb.id, &engine.config.cgroup_limits)
            .map_err(|e| Error::io(format!("making the cgroups of {}", sb.id), &e))?;
        let launch = Launch { cgroups, ..launch };
        for store in &stores {
            store.configure(to, &password)?;
        }
        // The copy carries the source's credential: the branch gets its own.
        stores::start_all(&stores, to, &launch, Credential::Rebind(&password), &mut steps).await
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

/// Every process of a sandbox held still at one instant, so its files are
/// what a crash at that instant would have left; let go when dropped,
/// whatever happens.
///
/// Its cgroup's freezer stops them all at once, forks in flight included
/// (PostgreSQL's backends each run in a session of their own, so a signal to
/// the postmaster's process group stops none of them). Without a freezer
/// (no cgroups), the postmaster is stopped first, so it starts no more, then
/// every process it started.
pub(crate) struct Frozen<'a> {
    engine: &'a Engine,
    id: String,
    /// Without a freezer: the processes stopped, the server first.
    stopped: Vec<Pid>,
}

/// How long freezing may take before the branch or promotion fails.
const FREEZE_LIMIT: Duration = Duration::from_secs(10);

impl<'a> Frozen<'a> {
    /// Freezes sandbox `id`, whose first server's pid is `server`.
    pub(crate) fn new(engine: &'a Engine, id: &str, server: i32) -> Result<Frozen<'a>> {
        let mut frozen = Frozen { engine, id: id.to_owned(), stopped: Vec::new() };
        match engine.cgroups.freeze(id, FREEZE_LIMIT) {
            Ok(true) => return Ok(frozen),
            Ok(false) => {}
            Err(e) => return Err(Error::io(format!("freezing sandbox {id}"), &e)),
        }
        let first = Pid::from_raw(server);
        kill(first, Signal::SIGSTOP)
            .map_err(|e| Error::postgres(format!("could not pause the source: {e}")))?;
        frozen.stopped.push(first);
        wait_stopped(server);
        for child in children_of(server) {
            if kill(Pid::from_raw(child), Signal::SIGSTOP).is_ok() {
                frozen.stopped.push(Pid::from_raw(child));
                wait_stopped(child);
            }
        }
        Ok(frozen)
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        if self.stopped.is_empty() {
            self.engine.cgroups.thaw(&self.id);
        }
        for pid in self.stopped.iter().rev() {
            let _ = kill(*pid, Signal::SIGCONT);
        }
    }
}

/// Continues the postmaster `postmaster` and every process it started (a
/// daemon that died while a sandbox was frozen without a freezer left them
/// stopped).
pub fn continue_all(postmaster: i32) {
    let _ = kill(Pid::from_raw(postmaster), Signal::SIGCONT);
    for child in children_of(postmaster) {
        let _ = kill(Pid::from_raw(child), Signal::SIGCONT);
    }
}

/// Every process whose parent is `parent`.
fn children_of(parent: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| airlock_core::process::parent(*pid) == Some(parent))
        .collect()
}

/// Waits (2 s at most) until process `pid` has stopped: a stopped process has
/// finished any write in progress, so no page is torn.
fn wait_stopped(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let stopped = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_none_or(|state| matches!(state, "T" | "t" | "Z" | "X"))
        });
        if stopped {
            return;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}
