//! Sandboxes: one disposable PostgreSQL instance per task, forked from a golden,
//! with the golden's other stores beside it (or, for a Redis-only golden,
//! instead of it: see [`stores`]).
//!
//! The fork path: record the sandbox (`creating`) → clone the golden's data
//! directory → write access files → start postgres on a private socket → wait
//! for "ready" → mint the agent credential → mark it `running`. Each step's
//! time goes into the `ready` event. Any failure tears down whatever was made.

pub mod branch;
pub mod capacity;
pub mod exec;
pub mod headroom;
mod idle;
pub mod pool;
pub mod session;

pub mod stores;
pub mod suspend;

pub use airlock_core::records::access::{Access, Limits, Mode};
pub use airlock_core::records::sandbox::{Sandbox, SandboxState, MIGRATION_TEST_LABEL};
pub use branch::BranchRequest;
pub use exec::{ExecRequest, ExecResult};
pub use idle::suspend_idle;
pub use suspend::{suspend, wake, SuspendReason};

use std::collections::BTreeMap;
use std::ffi::CString;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::engine::Engine;
use crate::golden;
use airlock_core::clock::Timestamp;
use airlock_core::dsn::{self, DATABASE};
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::events::{DeleteReason, NewEvent};
use airlock_core::layout::InstanceDir;
use airlock_core::{secret, validate};
use airlock_host::users::Identity;
use airlock_postgres::admin::Admin;
use airlock_postgres::instance;
use airlock_postgres::majors::Server;
use stores::StoreKind;

/// A request to fork a golden.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ForkRequest {
    /// The golden to fork (its current generation).
    pub golden: String,
    /// Seconds until the reaper deletes it; the daemon default if absent.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub ttl_seconds: Option<i64>,
    /// Labels to find it by.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// A unique name to address it by besides its id.
    #[serde(default)]
    #[schema(pattern = "^[a-z][a-z0-9_-]{0,47}$")]
    pub name: Option<String>,
    /// The credential's access mode and limits.
    #[serde(default)]
    pub access: Access,
    /// Seconds without a connection before it is suspended (0 never); the
    /// daemon default if absent.
    #[serde(default)]
    pub idle_suspend_seconds: Option<i64>,
    /// Seconds to wait in the queue when the host is full; 0 (the default) fails at once.
    #[serde(default)]
    pub wait_seconds: Option<i64>,
    /// Made for a migration test, which deletes it at its end (a restart deletes
    /// it too: no test outlives the daemon). Never set from a request.
    #[serde(skip)]
    pub for_migration_test: bool,
    /// Its disk allowance instead of `--disk-limit` (a migration test's fork
    /// gets what is left of the sandbox it is made for). Never from a request.
    #[serde(skip)]
    pub disk_allowance: Option<u64>,
}

/// What a fork answers: the sandbox, and warnings (such as the copy fallback).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Forked {
    /// The new sandbox.
    #[serde(flatten)]
    pub sandbox: Sandbox,
    /// Things the caller should know.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// Time spent in each step of one fork.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Steps {
    clone_ms: f64,
    start_ms: f64,
    ready_ms: f64,
    credential_ms: f64,
    /// Start to every store answering, when the sandbox has others than PostgreSQL.
    #[serde(skip_serializing_if = "Option::is_none")]
    stores_ms: Option<f64>,
}

fn ms(since: Instant) -> f64 {
    (since.elapsed().as_secs_f64() * 1e6).round() / 1e3
}

/// Checks a new sandbox's name, labels and TTL; returns the TTL to use.
fn placement(
    engine: &Engine,
    name: Option<&str>,
    labels: &BTreeMap<String, String>,
    ttl_seconds: Option<i64>,
) -> Result<Duration> {
    if let Some(name) = name {
        validate::sandbox_name(name)?;
    }
    for (k, v) in labels {
        validate::label(k, v)?;
    }
    match ttl_seconds {
        Some(s) => validate::ttl_seconds(s, engine.config.max_ttl),
        None => Ok(engine.config.default_ttl),
    }
}

/// The idle-suspend time a fork asked for, or the daemon default.
fn idle_suspend(engine: &Engine, seconds: Option<i64>) -> Result<Duration> {
    match seconds {
        None => Ok(engine.config.default_idle_suspend),
        Some(s) if s >= 0 => Ok(Duration::from_secs(s as u64)),
        Some(s) => Err(Error::new(
            ErrorCode::InvalidRequest,
            format!("idle suspend of {s} seconds is negative"),
            "give a duration such as 5m, or 0 to never suspend",
        )),
    }
}

/// How long a fork may wait for room.
fn queue_wait(seconds: Option<i64>) -> Result<Duration> {
    match seconds.unwrap_or(0) {
        s if (0..=3600).contains(&s) => Ok(Duration::from_secs(s as u64)),
        s => Err(Error::new(
            ErrorCode::InvalidRequest,
            format!("a wait of {s} seconds is out of range"),
            "give --wait between 0s and 1h",
        )),
    }
}

/// Ends a fork or branch: marks the sandbox running with its DSN and records
/// `ready` with `detail`; or, if making it failed, tears down what was made.
async fn finish(
    engine: &Engine,
    mut sb: Sandbox,
    made: Result<i32>,
    password: &str,
    verifier: tokio::task::JoinHandle<String>,
    detail: serde_json::Value,
) -> Result<Forked> {
    let pid = match made {
        Ok(pid) => pid,
        Err(e) => {
            tracing::warn!(sandbox = %sb.id, error = %e, "making a sandbox failed; tearing down");
            teardown(engine, &sb, DeleteReason::Failed).await?;
            return Err(e);
        }
    };
    let url = dsn::sandbox(&instance_dir(engine, &sb.id).socket_dir(), password);
    let verifier = match verifier.await {
        Ok(v) => v,
        Err(e) => {
            teardown(engine, &sb, DeleteReason::Failed).await?;
            return Err(Error::internal(format!("minting the router's verifier failed: {e}")));
        }
    };
    airlock_core::crashpoint::reached("fork.started");
    let ready = {
        let mut store = engine.store();
        store.set_running_with(&sb.id, pid, &url, Some(&verifier))?;
        store.record(NewEvent {
            kind: airlock_core::events::EventKind::Ready,
            sandbox: Some(sb.id.clone()),
            golden: Some(sb.golden.clone()),
            detail,
            ..Default::default()
        })
    };
    if let Err(e) = ready {
        teardown(engine, &sb, DeleteReason::Failed).await?;
        return Err(e);
    }
    sb.state = SandboxState::Running;
    sb.pid = Some(pid);
    sb.dsn = Some(url);
    engine.activity.touch(&sb.id);
    let warnings = engine.fork_warnings();
    for w in &warnings {
        tracing::warn!(sandbox = %sb.id, "{w}");
    }
    Ok(Forked { sandbox: sb, warnings })
}

/// Makes a sandbox from the current generation of a golden.
pub async fn fork(engine: &Engine, req: &ForkRequest) -> Result<Forked> {
    let began = Instant::now();
    let ttl = placement(engine, req.name.as_deref(), &req.labels, req.ttl_seconds)?;
    req.access.validate()?;
    let idle = idle_suspend(engine, req.idle_suspend_seconds)?;
    let wait = queue_wait(req.wait_seconds)?;
    let golden = engine.store().golden(&req.golden)?;
    let mut labels = req.labels.clone();
    if req.for_migration_test {
        labels.insert(MIGRATION_TEST_LABEL.0.to_owned(), MIGRATION_TEST_LABEL.1.to_owned());
    }
    let mut sb = Sandbox::creating(
        &golden.name,
        golden.current_generation,
        req.name.clone(),
        labels,
        req.access,
        ttl,
        idle,
    );
    // A started sandbox from the warm pool if there is one (it needs no room);
    // else a cold fork, once there is room for it.
    let pooled = engine.store().claim_pooled(&sb)?;
    let claimed = pooled.is_some();
    match pooled {
        Some(pooled) => sb = pooled,
        None => {
            let _admitted = capacity::admit(engine, wait, capacity::Need::New, None).await?;
            // The queue may have waited through a refresh: fork the generation that
            // is current now, recorded in the same breath so it is not pruned.
            engine.insert_sandbox(&mut sb, |store, sb| {
                sb.generation = store.golden(&req.golden)?.current_generation;
                Ok(())
            })?;
        }
    }
    if let Some(bytes) = req.disk_allowance {
        engine.headroom.allow(&sb.id, bytes);
    }
    let created = engine.store().record(NewEvent {
        kind: airlock_core::events::EventKind::Created,
        sandbox: Some(sb.id.clone()),
        golden: Some(sb.golden.clone()),
        detail: json!({"generation": sb.generation, "expires_at": sb.expires_at, "labels": sb.labels, "from_pool": claimed}),
        ..Default::default()
    });
    if let Err(e) = created {
        // Nothing is handed out without its record: the sandbox goes again.
        teardown(engine, &sb, DeleteReason::Failed).await?;
        return Err(e);
    }
    airlock_core::crashpoint::reached("fork.created");
    if claimed {
        engine.pool.wanted.notify_one();
    }
    let mut steps = Steps::default();
    // A pool member's credential was minted while the pool filled (the router's
    // verifier takes milliseconds of PBKDF2); it is bound to this fork now.
    let premade = match (&sb.dsn, &sb.verifier) {
        (Some(url), Some(v)) if claimed => dsn::password(url).map(|p| (p, v.clone())),
        _ => None,
    };
    let fresh = premade.is_none();
    let (password, verifier) = match premade {
        Some((password, verifier)) => (password, tokio::task::spawn(async move { verifier })),
        None => {
            let password = secret::password();
            let minting = mint_verifier(&password);
            (password, minting)
        }
    };
    let made = if claimed {
        claim(engine, &sb, &password, fresh, &mut steps).await.map(|_| sb.pid.unwrap_or_default())
    } else {
        bring_up(engine, &sb, Some(&password), &mut steps).await
    };
    let detail = json!({"fork_ms": ms(began), "from_pool": claimed, "steps": steps, "storage": engine.cloner.backend()});
    finish(engine, sb, made, &password, verifier, detail).await
}

/// Computes the router's verifier for `password` on a blocking thread, while
/// the caller goes on making the sandbox.
pub(crate) fn mint_verifier(password: &str) -> tokio::task::JoinHandle<String> {
    let password = password.to_owned();
    tokio::task::spawn_blocking(move || {
        airlock_postgres::scram::verifier(&password, airlock_postgres::scram::ROUTER_ITERATIONS)
    })
}

/// Sets the agent's password inside a sandbox's server back to the one the
/// daemon holds, as the admin: a password changed there (the in-server guard
/// refuses it, but should anything get past it) must not cut the router, the
/// gateway or `exec` off. Clients are not affected either way: the router checks
/// them against its own verifier.
pub async fn restore_credential(layout: &airlock_core::layout::Layout, sb: &Sandbox) -> Result<()> {
    let password = sb
        .dsn
        .as_deref()
        .and_then(dsn::password)
        .ok_or_else(|| Error::internal(format!("sandbox {} has no credential", sb.id)))?;
    let admin =
        Admin::connect(&layout.sandbox_instance(&sb.id), DATABASE, sb.pid.unwrap_or_default()).await?;
    admin.restore_agent_password(&password).await?;
    tracing::warn!(sandbox = %sb.id, "the agent's password inside the server had changed; restored it");
    Ok(())
}

fn instance_dir(engine: &Engine, id: &str) -> InstanceDir {
    engine.layout.sandbox_instance(id)
}

/// Clones and starts one sandbox, and creates its agent role when given a
/// password (pool members get theirs when claimed); returns its pid.
pub(crate) async fn bring_up(
    engine: &Engine,
    sb: &Sandbox,
    password: Option<&str>,
    steps: &mut Steps,
) -> Result<i32> {
    let dir = instance_dir(engine, &sb.id);
    let golden_root = engine.layout.golden_generation(&sb.golden, sb.generation);
    let golden_pgdata = golden_root.join("pgdata");
    let server = match (InstanceDir { root: golden_root.clone() }).has_postgres() {
        true => Some(engine.server_for(&sb.golden, sb.generation)?),
        false => None,
    };
    let t = Instant::now();
    let user = engine.sandbox_user(sb)?;
    let group = engine.socket_group(sb);
    // Cloning is blocking file work done in place: moving it to another thread
    // with block_in_place measured 10-15 ms slower per fork here.
    (|| -> Result<()> {
        make_dir(engine, &dir)?;
        instance::prepare_dir(&dir, &user, group)?;
        if server.is_none() {
            return Ok(());
        }
        engine
            .cloner
            .clone_tree(&golden_pgdata, &dir.pgdata(), Some(&user), Some(engine.daemon_user.uid))
            .map_err(|e| Error::io(format!("cloning {}", golden_pgdata.display()), &e))?;
        instance::write_access_files(&dir, &engine.admin_os_users(), &[])
    })()?;
    let stores = StoreKind::of_generation(&golden_root);
    for store in &stores {
        store.clone_from_golden(engine, &golden_root, &dir, &user)?;
    }
    steps.clone_ms = ms(t);
    let cgroups = engine
        .cgroups
        .create(&sb.id, &engine.config.cgroup_limits)
        .map_err(|e| Error::io(format!("making the cgroups of {}", sb.id), &e))?;
    if let (true, Some(server)) = (stores.is_empty(), server) {
        return start(server, &dir, (&user, group), &cgroups, &sb.access, password, steps).await;
    }
    let password =
        password.ok_or_else(|| Error::internal("a sandbox with other stores is made with its credential"))?;
    for store in &stores {
        store.configure(engine, &dir, sb, password)?;
    }
    // Every store starts at once; the sandbox is ready when all answer.
    let t = Instant::now();
    let postgres = server
        .map(|server| start(server, &dir, (&user, group), &cgroups, &sb.access, Some(password), &mut *steps));
    let pid = stores::start_with(postgres, &stores, &dir, (&user, group), &cgroups).await;
    steps.stores_ms = Some(ms(t));
    pid
}

/// Makes a sandbox's directory (a subvolume with its disk quota where the volume
/// can enforce one); an existing one (a reset) is kept.
pub(crate) fn make_dir(engine: &Engine, dir: &InstanceDir) -> Result<()> {
    match engine.cloner.make_sandbox_dir(&dir.root) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(Error::io(format!("making {}", dir.root.display()), &e)),
    }
    engine.headroom.limit_new(engine, &dir.root)
}

/// Starts the instance in `dir`, waits for it, and creates the agent role with
/// `password` if given; returns the postmaster's pid.
async fn start(
    server: &Server,
    dir: &InstanceDir,
    (user, group): (&Identity, Option<nix::unistd::Gid>),
    cgroups: &[CString],
    access: &Access,
    password: Option<&str>,
    steps: &mut Steps,
) -> Result<i32> {
    let t = Instant::now();
    let mut started = instance::start(&server.bin, dir, user, group, cgroups, Some(&server.guard))?;
    steps.start_ms = ms(t);
    let t = Instant::now();
    started.wait_ready(dir).await?;
    let pid = started.detach();
    steps.ready_ms = ms(t);
    if let Some(password) = password {
        let t = Instant::now();
        Admin::connect(dir, DATABASE, pid).await?.mint_agent(password, access).await?;
        steps.credential_ms = ms(t);
    }
    Ok(pid)
}

/// Binds a pool member's agent role to its fork: nothing to do in the server
/// when the fork asks for the default access and the member's credential was
/// made while filling; else, on the admin session the pool kept open, the role
/// is made again with the fork's access, or given the `fresh` password.
async fn claim(engine: &Engine, sb: &Sandbox, password: &str, fresh: bool, steps: &mut Steps) -> Result<()> {
    let t = Instant::now();
    let kept = engine.pool.admins.lock().unwrap_or_else(|p| p.into_inner()).remove(&sb.id);
    if sb.access == Access::default() && !fresh {
        return Ok(());
    }
    let dir = instance_dir(engine, &sb.id);
    if engine.layout.generation_has_postgres(&sb.golden, sb.generation) {
        let admin = match kept {
            Some(admin) => admin,
            None => Admin::connect(&dir, DATABASE, sb.pid.unwrap_or_default()).await?,
        };
        if sb.access == Access::default() {
            admin.restore_agent_password(password).await?;
        } else {
            admin.remake_agent(password, &sb.access).await?;
        }
    }
    for store in StoreKind::of_sandbox(&dir) {
        store.claim(&dir, sb, fresh.then_some(password)).await?;
    }
    steps.credential_ms = ms(t);
    Ok(())
}

/// Puts a running sandbox back to its golden's state, keeping its id, address and
/// credential: the server is stopped, its data directory cloned again from the
/// generation it was forked from, and the same role created again.
pub async fn reset(engine: &Engine, key: &str) -> Result<Sandbox> {
    let began = Instant::now();
    let id = engine.store().sandbox(key)?.id;
    // Not while a suspend, wake, branch or delete is under way on it.
    let _op = engine.sandbox_lock(&id).await;
    let sb = engine.store().sandbox(&id)?;
    // A suspended sandbox is rebuilt as it lies, never woken first: a server
    // started on the data the reset throws away could not start when that
    // data is what filled its allowance. It needs a running slot all the same.
    let _admitted = match sb.state {
        SandboxState::Suspended => {
            Some(capacity::admit(engine, engine.config.wake_wait, capacity::Need::Start, Some(&id)).await?)
        }
        _ => None,
    };
    // Marked `resetting` while it is rebuilt: deletes wait, the router holds new
    // clients, and a daemon that dies in between completes the reset at start.
    let resettable = matches!(sb.state, SandboxState::Running | SandboxState::Suspended);
    if !resettable || !engine.store().begin_reset(&sb.id)? {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            format!("sandbox {} is {}, not running", sb.id, sb.state.as_str()),
            "wait for the operation in progress to finish, then reset again",
        ));
    }
    airlock_core::crashpoint::reached("reset.begun");
    rebuild(engine, &sb, began, false).await
}

/// Rebuilds a `resetting` sandbox from the generation it was forked from and
/// marks it running with the same address and credential; if that cannot be
/// done, deletes it. Used by `reset`, and at start for a reset a crash cut short
/// (`after_crash`).
pub async fn rebuild(engine: &Engine, sb: &Sandbox, began: Instant, after_crash: bool) -> Result<Sandbox> {
    let dir = instance_dir(engine, &sb.id);
    let mut steps = Steps::default();
    let rebuilt = async {
        let password = sb
            .dsn
            .as_deref()
            .and_then(dsn::password)
            .ok_or_else(|| Error::internal(format!("sandbox {} has no credential to keep", sb.id)))?;
        // The server the reset began with, and one a crash left half-started.
        for pid in sb.pid.into_iter().chain(postmaster_pid(&dir)) {
            instance::kill(pid, &dir.pgdata()).await?;
        }
        let stores = StoreKind::of_sandbox(&dir);
        for store in &stores {
            store.stop(&dir).await;
        }
        kill_cgroup_members(engine, &sb.id).await;
        engine.services.changed(&sb.id, crate::services::Change::Reset);
        airlock_core::crashpoint::reached("reset.stopped");
        // remove_dir_all removes links inside, never what they point at.
        engine.cloner.unlimit(&dir.root);
        if let Err(e) = engine.cloner.remove_tree(&dir.pgdata()) {
            if e.kind() != std::io::ErrorKind::NotFound {
                return Err(Error::from(e));
            }
        }
        for store in &stores {
            store.remove_data(engine, &dir)?;
        }
        engine.headroom.limit_new(engine, &dir.root)?;
        bring_up(engine, sb, Some(&password), &mut steps).await
    }
    .await;
    match rebuilt {
        Ok(pid) => {
            let mut store = engine.store();
            store.set_running(&sb.id, pid, sb.dsn.as_deref().unwrap_or_default())?;
            store.record_or_log(NewEvent {
                kind: airlock_core::events::EventKind::Reset,
                sandbox: Some(sb.id.clone()),
                golden: Some(sb.golden.clone()),
                detail: json!({"reset_ms": ms(began), "steps": steps, "generation": sb.generation,
                    "completed_after_restart": after_crash}),
                ..Default::default()
            });
            store.sandbox(&sb.id)
        }
        Err(e) => {
            tracing::warn!(sandbox = %sb.id, error = %e, "reset failed; deleting the sandbox");
            teardown(engine, sb, DeleteReason::Failed).await?;
            Err(Error::new(
                e.code,
                format!("resetting sandbox {} failed, and it was deleted: {}", sb.id, e.message),
                e.hint,
            ))
        }
    }
}

/// Starts a running sandbox whose process is gone (after a host restart, say),
/// keeping its data and credential.
pub async fn restart(engine: &Engine, sb: &Sandbox) -> Result<i32> {
    let dir = instance_dir(engine, &sb.id);
    // The socket directory is made afresh below, which would cut a store that
    // still runs off from its clients: it saves its data and stops first.
    for store in StoreKind::of_sandbox(&dir).into_iter().filter(|s| s.running(&dir)) {
        if let Err(e) = store.save(&dir).await {
            tracing::warn!(sandbox = %sb.id, store = store.name(), error = %e, "could not save a store before restarting it");
        }
        store.stop(&dir).await;
    }
    // A suspended sandbox was promised nothing; its admission took the floor.
    engine.headroom.limit_new(engine, &dir.root)?;
    if !engine.layout.generation_has_postgres(&sb.golden, sb.generation) {
        return restart_stores(engine, sb, &dir).await;
    }
    // The dead server's lock files name a pid that may live on as a zombie or be
    // reused. Should a server still serve this directory (one the caller missed),
    // it is stopped first: two on one data directory would corrupt it. The System V
    // segment a dead one names would otherwise outlive it.
    if let Some(pid) = postmaster_pid(&dir).filter(|p| instance::is_postmaster_of(*p, &dir.pgdata())) {
        tracing::warn!(sandbox = %sb.id, pid, "a server still ran on a sandbox being restarted; stopping it");
        instance::kill(pid, &dir.pgdata()).await?;
    }
    instance::remove_stale_shared_memory(&dir.pgdata());
    let _ = std::fs::remove_file(dir.pgdata().join("postmaster.pid"));
    let user = engine.sandbox_user(sb)?;
    let group = engine.socket_group(sb);
    instance::prepare_dir(&dir, &user, group)?;
    instance::write_access_files(&dir, &engine.admin_os_users(), &[])?;
    let mut cgroups = engine.cgroups.procs_files(&sb.id);
    if cgroups.is_empty() {
        cgroups = engine.cgroups.create(&sb.id, &engine.config.cgroup_limits)?;
    }
    let server = engine.server_for(&sb.golden, sb.generation)?;
    let mut started = instance::start(&server.bin, &dir, &user, group, &cgroups, Some(&server.guard))?;
    let pid = started.pid;
    let ready = async {
        started.wait_ready(&dir).await?;
        // Ready is not enough: at a full disk a server can start and then
        // refuse every session.
        airlock_postgres::admin::answers(&dir, pid, airlock_postgres::admin::ANSWER_TIMEOUT).await
    }
    .await;
    if let Err(e) = ready {
        let _ = instance::kill(pid, &dir.pgdata()).await;
        return Err(e);
    }
    let pid = started.detach();
    // Its other stores start again from what they last saved (a suspend's
    // data, or the golden's).
    for store in StoreKind::of_sandbox(&dir).into_iter().filter(|s| !s.running(&dir)) {
        if let Err(e) = store.start(&dir, (&user, group), &cgroups).await {
            let _ = instance::kill(pid, &dir.pgdata()).await;
            return Err(e);
        }
    }
    let dsn = sb.dsn.clone().unwrap_or_default();
    engine.store().set_running(&sb.id, pid, &dsn)?;
    Ok(pid)
}

/// `restart` for a sandbox with no PostgreSQL: its stores start from what
/// they last saved; the first store's pid is the sandbox's.
async fn restart_stores(engine: &Engine, sb: &Sandbox, dir: &InstanceDir) -> Result<i32> {
    let user = engine.sandbox_user(sb)?;
    let group = engine.socket_group(sb);
    instance::prepare_dir(dir, &user, group)?;
    let mut cgroups = engine.cgroups.procs_files(&sb.id);
    if cgroups.is_empty() {
        cgroups = engine.cgroups.create(&sb.id, &engine.config.cgroup_limits)?;
    }
    let stores = StoreKind::of_sandbox(dir);
    let pid = stores::start_with(stores::NO_POSTGRES, &stores, dir, (&user, group), &cgroups).await?;
    engine.store().set_running(&sb.id, pid, sb.dsn.as_deref().unwrap_or_default())?;
    Ok(pid)
}

/// Deletes a sandbox by id or name. Waits for a fork in progress to finish first;
/// if another caller is already deleting it, waits for that.
pub async fn delete(engine: &Engine, key: &str, reason: DeleteReason) -> Result<Sandbox> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen: Option<Sandbox> = None;
    // Since when a `deleting` row has had no teardown under way.
    let mut unclaimed_since: Option<Instant> = None;
    loop {
        let sb = match engine.store().sandbox(key) {
            Ok(sb) => sb,
            // Someone else finished deleting it while we waited: that is what was asked.
            Err(e) if e.code == ErrorCode::SandboxNotFound && seen.is_some() => {
                return Ok(seen.take().expect("checked"))
            }
            Err(e) => return Err(e),
        };
        match sb.state {
            SandboxState::Running | SandboxState::Suspended => {
                // Not while a suspend or wake is stopping or starting its server.
                let _op = engine.sandbox_lock(&sb.id).await;
                let sb = engine.store().sandbox(&sb.id)?;
                if engine.store().begin_delete(&sb.id)? {
                    teardown(engine, &sb, reason).await?;
                    return Ok(sb);
                }
            }
            // A teardown that failed left it; take it up (after a moment, so a
            // deletion about to start its own teardown is not raced).
            SandboxState::Deleting if !engine.tearing_down(&sb.id) && Instant::now() < deadline => {
                let since = *unclaimed_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= RESUME_AFTER {
                    teardown(engine, &sb, reason).await?;
                }
            }
            SandboxState::Creating | SandboxState::Resetting | SandboxState::Deleting
                if Instant::now() < deadline =>
            {
                unclaimed_since = None;
            }
            _ => {
                return Err(Error::internal(format!(
                    "sandbox {} is stuck in state {}",
                    sb.id,
                    sb.state.as_str()
                )))
            }
        }
        seen = Some(sb);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How long a `deleting` row must go without a teardown under way before
/// another takes it up.
pub const RESUME_AFTER: Duration = Duration::from_secs(1);

/// Stops a sandbox's processes, removes its files and its state row, and records
/// why. Used for every kind of deletion, including failed forks and orphans.
///
/// A teardown that fails (say, it could not tell whether the server still runs)
/// leaves the row `deleting`; the reaper, or the next `delete`, takes it up
/// again. While one is under way another returns at once.
pub async fn teardown(engine: &Engine, sb: &Sandbox, reason: DeleteReason) -> Result<()> {
    let Some(_claim) = engine.claim_teardown(&sb.id) else { return Ok(()) };
    let began = Instant::now();
    engine.pool.admins.lock().unwrap_or_else(|p| p.into_inner()).remove(&sb.id);
    let dir = instance_dir(engine, &sb.id);
    let pid = sb.pid.or_else(|| postmaster_pid(&dir));
    if let Some(pid) = pid {
        // Files are never removed under a server that may still run.
        instance::kill(pid, &dir.pgdata()).await.map_err(|e| {
            Error::internal(format!("could not tell whether sandbox {}'s server still runs: {e}", sb.id))
        })?;
    }
    for store in StoreKind::of_sandbox(&dir) {
        store.stop(&dir).await;
    }
    kill_cgroup_members(engine, &sb.id).await;
    if let Err(e) = engine.cloner.remove_tree(&dir.root) {
        if e.kind() != std::io::ErrorKind::NotFound {
            return Err(Error::io(format!("removing {}", dir.root.display()), &e));
        }
    }
    {
        let mut store = engine.store();
        store.delete_sandbox(&sb.id)?;
        store.record_or_log(NewEvent {
            kind: airlock_core::events::EventKind::Deleted,
            sandbox: Some(sb.id.clone()),
            golden: Some(sb.golden.clone()),
            reason: Some(reason.as_str()),
            detail: json!({"generation": sb.generation, "expires_at": sb.expires_at, "delete_ms": ms(began)}),
            ..Default::default()
        });
    }
    // Its processes and files are gone: the uid can serve another sandbox.
    engine.release_identity(sb);
    engine.forget_sandbox(&sb.id);
    engine.headroom.forget(&sb.id);
    engine.room.freed.notify_waiters();
    golden::prune(engine, &sb.golden)
}

/// Kills whatever is left in a sandbox's cgroups (backends of a killed server,
/// `exec` processes), then removes the cgroups.
pub async fn kill_cgroup_members(engine: &Engine, id: &str) {
    for _ in 0..200 {
        let members = engine.cgroups.members(id);
        if members.is_empty() {
            break;
        }
        for pid in members {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    engine.cgroups.remove(id);
}

/// The pid in a data directory's `postmaster.pid`, if any (read without
/// following a link: the file is the instance user's).
pub fn postmaster_pid(dir: &InstanceDir) -> Option<i32> {
    let text = airlock_host::storage::tree::read_small(&dir.pgdata().join("postmaster.pid"), 4096).ok()?;
    text.lines().next()?.trim().parse().ok()
}

/// Sets a sandbox to expire `ttl_seconds` from now.
pub fn extend(engine: &Engine, key: &str, ttl_seconds: i64) -> Result<Sandbox> {
    let ttl = validate::ttl_seconds(ttl_seconds, engine.config.max_ttl)?;
    let mut store = engine.store();
    let sb = store.sandbox(key)?;
    if !matches!(sb.state, SandboxState::Running | SandboxState::Suspended) {
        return Err(Error::new(
            ErrorCode::SandboxNotFound,
            format!("sandbox {} is {}", sb.id, sb.state.as_str()),
            "only running or suspended sandboxes can be extended",
        ));
    }
    let expires_at = Timestamp::now().plus(ttl);
    store.set_expiry(&sb.id, expires_at)?;
    let recorded = store.record(NewEvent {
        kind: airlock_core::events::EventKind::Extended,
        sandbox: Some(sb.id.clone()),
        golden: Some(sb.golden.clone()),
        detail: json!({"expires_at": expires_at}),
        ..Default::default()
    });
    if let Err(e) = recorded {
        // Longer access only on record.
        store.set_expiry(&sb.id, sb.expires_at)?;
        return Err(e);
    }
    store.sandbox(&sb.id)
}
