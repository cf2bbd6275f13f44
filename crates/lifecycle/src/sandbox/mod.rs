//! Sandboxes: one disposable copy of a golden per task, holding the golden's
//! stores (its PostgreSQL, its Redis, ...: see [`stores`]).
//!
//! The fork path: record the sandbox (`creating`) → clone each store's part
//! of the golden → configure each → start them all at once on private sockets
//! → wait until each answers, the agent's credential minted → mark it
//! `running`. Each step's time goes into the `ready` event. Any failure tears
//! down whatever was made.

pub mod branch;
pub mod capacity;
mod delete;
pub mod exec;
pub mod headroom;
mod idle;
pub mod pool;
mod redis_door;
mod reset;
pub mod session;

pub mod stores;
pub mod suspend;
pub mod volume;
mod wake;

pub use airlock_core::records::access::{Access, Limits, Mode};
pub use airlock_core::records::sandbox::{Sandbox, SandboxState, MIGRATION_TEST_LABEL};
pub use branch::BranchRequest;
pub use delete::{delete, kill_cgroup_members, teardown, teardown_claimed, RESUME_AFTER};
pub use exec::{ExecRequest, ExecResult};
pub use idle::suspend_idle;
pub use reset::{rebuild, reset};
pub use suspend::{suspend, SuspendReason};
pub use wake::wake;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::engine::Engine;
use airlock_core::clock::Timestamp;
use airlock_core::dsn::{self, DATABASE};
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::events::{DeleteReason, NewEvent};
use airlock_core::layout::InstanceDir;
use airlock_core::{secret, validate};
use airlock_host::gate::{Gate, Opener};
use airlock_postgres::admin::Admin;
use airlock_postgres::instance;
use stores::{At, Credential, Launch, Stop};

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
#[derive(Debug, Default, Clone, Serialize)]
pub struct Steps {
    clone_ms: f64,
    start_ms: f64,
    ready_ms: f64,
    credential_ms: f64,
    /// Start to every store answering, when the sandbox has others than PostgreSQL.
    #[serde(skip_serializing_if = "Option::is_none")]
    stores_ms: Option<f64>,
}

impl Steps {
    /// Takes the steps another store timed (each store times its own).
    pub(crate) fn merge(&mut self, other: &Steps) {
        for (mine, theirs) in [
            (&mut self.clone_ms, other.clone_ms),
            (&mut self.start_ms, other.start_ms),
            (&mut self.ready_ms, other.ready_ms),
            (&mut self.credential_ms, other.credential_ms),
        ] {
            *mine = mine.max(theirs);
        }
    }
}

pub(crate) fn ms(since: Instant) -> f64 {
    millis(since.elapsed())
}

/// A duration in milliseconds, to the microsecond, as a fork's steps are given.
pub(crate) fn millis(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
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
    if claimed {
        engine.expiries.notify_one();
    }
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
        bring_up(engine, &sb, &password, &mut steps).await
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

/// Clones and starts one sandbox, every store of its golden, with the agent's
/// credential `password`; returns its pid.
pub(crate) async fn bring_up(
    engine: &Engine,
    sb: &Sandbox,
    password: &str,
    steps: &mut Steps,
) -> Result<i32> {
    let dir = instance_dir(engine, &sb.id);
    let at = At { engine, sb, dir: &dir };
    let golden_root = engine.layout.golden_generation(&sb.golden, sb.generation);
    let stores = stores::of_generation(&golden_root);
    let t = Instant::now();
    let launch = Launch::of(engine, sb, Vec::new()).await?;
    make_dir(engine, &dir)?;
    instance::prepare_dir(&dir, &launch.user, launch.group)?;
    let cgroups = engine
        .cgroups
        .create(&sb.id, &engine.config.cgroup_limits)
        .map_err(|e| Error::io(format!("making the cgroups of {}", sb.id), &e))?;
    // The servers are spawned first and wait at a gate while the files are
    // cloned: a contained PostgreSQL server in its own program, once the
    // loader has linked it (its libraries' constructors run too), else
    // before exec, in its cgroups. The server's own code runs only once the
    // gate opens.
    let gate = Gate::new().map_err(|e| Error::io("making a fork's gate", &e))?;
    // Shut if this is given up before the gate is decided: no server waits on.
    let _undecided = Opener(gate.clone());
    let launch = Launch { cgroups, gate: Some(gate.clone()), ..launch };
    let mut clone_ms = 0.0;
    let files = async {
        // Cloning is blocking file work done in place: moving it to another
        // thread with block_in_place measured 10-15 ms slower per fork here.
        let made = (|| {
            let mut later = Vec::new();
            for store in &stores {
                later.extend(store.clone_from_golden(at, &golden_root)?);
            }
            for store in &stores {
                store.configure(at, password)?;
            }
            Ok::<_, Error>(later)
        })();
        let later = match made {
            Ok(later) => {
                gate.open();
                later
            }
            Err(e) => {
                gate.shut();
                return Err(e);
            }
        };
        // The servers start meanwhile: what is left is read by none of them
        // before a session, and none opens until this is done (the start is
        // polled again, for its readiness, only once this returns).
        for files in later {
            files.finish().map_err(|e| Error::io("cloning a golden's files", &e))?;
        }
        clone_ms = ms(t);
        Ok(())
    };
    // Every store starts at once; the sandbox is ready when all answer. The
    // start is polled first, so its spawns are under way before the clone
    // blocks this thread.
    let started = stores::start_all(&stores, at, &launch, Credential::Mint(password), steps);
    let (started, files) = futures_util::future::join(started, files).await;
    steps.clone_ms = clone_ms;
    // A clone that failed explains a start that then could not go on.
    files?;
    started
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

/// Binds a pool member's stores to its fork: nothing to do in them when the
/// fork asks for the default access and the member's credential was made
/// while filling; else each store binds the fork's access, or the `fresh`
/// password.
async fn claim(engine: &Engine, sb: &Sandbox, password: &str, fresh: bool, steps: &mut Steps) -> Result<()> {
    let t = Instant::now();
    let changed = sb.access != Access::default() || fresh;
    let dir = instance_dir(engine, &sb.id);
    let at = At { engine, sb, dir: &dir };
    for store in stores::of_sandbox(&dir) {
        store.claim(at, password, fresh, changed).await?;
    }
    if changed {
        steps.credential_ms = ms(t);
    }
    Ok(())
}

/// Starts a running sandbox whose process is gone (after a host restart, say),
/// keeping its data and credential: every store starts again from what it
/// last saved (a suspend's data, or the golden's).
pub async fn restart(engine: &Engine, sb: &Sandbox) -> Result<i32> {
    let dir = instance_dir(engine, &sb.id);
    let at = At { engine, sb, dir: &dir };
    let stores = stores::of_sandbox(&dir);
    // The socket directory is made afresh below, which would cut a store that
    // still runs off from its clients: it saves its data and stops first.
    for store in stores.iter().filter(|s| s.pid(at).is_some()) {
        if let Err(e) = store.save(at).await {
            tracing::warn!(sandbox = %sb.id, store = store.name(), error = %e, "could not save a store before restarting it");
        }
        store.stop(at, Stop::Now).await?;
    }
    // A suspended sandbox was promised nothing; its admission took the floor.
    engine.headroom.limit_new(engine, &dir.root)?;
    let mut cgroups = engine.cgroups.procs_files(&sb.id);
    if cgroups.is_empty() {
        cgroups = engine.cgroups.create(&sb.id, &engine.config.cgroup_limits)?;
    }
    let launch = Launch::of(engine, sb, cgroups).await?;
    instance::prepare_dir(&dir, &launch.user, launch.group)?;
    let pid = stores::start_all(&stores, at, &launch, Credential::Kept, &mut Steps::default()).await?;
    engine.store().set_running(&sb.id, pid, sb.dsn.as_deref().unwrap_or_default())?;
    Ok(pid)
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
    engine.expiries.notify_one();
    store.sandbox(&sb.id)
}
