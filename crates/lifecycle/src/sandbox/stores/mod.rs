//! The stores a sandbox holds: its PostgreSQL, its Redis, a directory of
//! files; whatever its golden carries.
//!
//! Fork, reset, branch, suspend, wake, restart, teardown, the pool, the idle
//! check, `exec` and the reaper handle every store through one interface,
//! [`StoreKind`], and know none of them by name. A new kind is a new
//! implementation added to [`ALL`], never new lifecycle code.
//!
//! A sandbox is known by one pid: its first store's server, in the order of
//! [`ALL`] (PostgreSQL's when it has one).

mod files;
mod postgres;
mod redis;

use std::ffi::CString;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use crate::engine::Engine;
use crate::sandbox::{ms, Sandbox, Steps};
use airlock_core::error::{Error, Result};
use airlock_core::layout::InstanceDir;
use airlock_host::contain::Network;
use airlock_host::gate::Gate;
use airlock_host::storage::{clone::Deferred, Shape};
use airlock_host::users::Identity;

pub use airlock_postgres::admin::Ending;
pub use files::Files;
pub use postgres::{Postgres, TEMPLATE1};
pub use redis::Redis;

/// Every kind, in the order the lifecycle handles them: the first one a
/// sandbox holds with a server gives the sandbox its pid.
pub const ALL: &[&dyn StoreKind] = &[&Postgres, &Redis, &Files];

/// The longest a store's writes are held while a copy is taken: past it
/// they go on by themselves (a daemon that died mid-copy holds nothing).
pub const HOLD_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// One sandbox a store operation acts on.
#[derive(Clone, Copy)]
pub struct At<'a> {
    /// The daemon.
    pub engine: &'a Engine,
    /// The sandbox's record (its pid, access, golden and generation).
    pub sb: &'a Sandbox,
    /// Its instance directory.
    pub dir: &'a InstanceDir,
}

/// Who a store's server runs as, and where: the sandbox's user, the group
/// its socket is shared with, its cgroups, and its network namespace.
pub struct Launch {
    /// The server's user.
    pub user: Identity,
    /// The group its socket is shared with (the exec user's), if any.
    pub group: Option<nix::unistd::Gid>,
    /// The cgroups it runs in.
    pub cgroups: Vec<CString>,
    /// The network namespace the sandbox's servers share (when contained):
    /// `exec` code, which joins it, reaches each on loopback.
    pub network: Option<Network>,
    /// For a new fork: the gate its servers wait at, in their cgroups, until
    /// their files are cloned and configured (see `bring_up`). A store whose
    /// server cannot be spawned before its files exist waits for it to open
    /// ([`Gate::passed`]) before it starts.
    pub gate: Option<Arc<Gate>>,
}

impl Launch {
    /// The launch of sandbox `sb`'s servers in `cgroups`, in a new network
    /// namespace of their own when the daemon is root (made on a blocking
    /// thread: the kernel can take a while over it when many are coming and
    /// going, and the async workers have other sandboxes to serve).
    pub async fn of(engine: &Engine, sb: &Sandbox, cgroups: Vec<CString>) -> Result<Launch> {
        let network = match engine.daemon_user.is_root() {
            true => Some(
                tokio::task::spawn_blocking(Network::new)
                    .await
                    .map_err(|e| Error::internal(format!("making a network namespace stopped: {e}")))?
                    .map_err(|e| Error::io("making a sandbox's network namespace", &e))?,
            ),
            false => None,
        };
        Launch::with(engine, sb, cgroups, network)
    }

    /// The launch of one server started again beside another of the
    /// sandbox's servers, still running (`pid`): in its network namespace.
    pub fn beside(engine: &Engine, sb: &Sandbox, cgroups: Vec<CString>, pid: i32) -> Result<Launch> {
        let network = match engine.daemon_user.is_root() {
            true => {
                Some(Network::of(pid).map_err(|e| Error::io("entering a sandbox's network namespace", &e))?)
            }
            false => None,
        };
        Launch::with(engine, sb, cgroups, network)
    }

    fn with(
        engine: &Engine,
        sb: &Sandbox,
        cgroups: Vec<CString>,
        network: Option<Network>,
    ) -> Result<Launch> {
        Ok(Launch {
            user: engine.sandbox_user(sb)?,
            group: engine.socket_group(sb),
            cgroups,
            network,
            gate: None,
        })
    }
}

/// What a store does about the agent's credential when it starts.
#[derive(Clone, Copy)]
pub enum Credential<'a> {
    /// New data (a fork, a reset, a pool member): the agent's credential is
    /// this password, and its role has the sandbox's access (PostgreSQL's
    /// logs in by peer and holds no password; Redis's user holds it).
    Mint(&'a str),
    /// A copy of another sandbox's data (a branch): the role is there, as the
    /// source had it; the credential becomes this one.
    Rebind(&'a str),
    /// The sandbox's own data started again (a wake, a restart): as it was.
    Kept,
}

/// How a store's server is stopped.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// A clean shutdown (a suspend): everything it holds is written.
    Clean,
    /// At once, writing nothing more (a full disk, a teardown, a restart).
    Now,
}

/// A store whose writes are held since its state was saved: a copy taken
/// now is of the same instant as that state.
pub struct Held(Pin<Box<dyn Future<Output = ()> + Send>>);

impl Held {
    /// A hold that `resume` lets go.
    pub fn new(resume: impl Future<Output = ()> + Send + 'static) -> Held {
        Held(Box::pin(resume))
    }

    /// Lets its writes go on (a failure is logged: the hold ends at
    /// [`HOLD_LIMIT`] anyway).
    pub async fn resume(self) {
        self.0.await
    }
}

/// One kind of store a sandbox may hold.
#[async_trait::async_trait]
pub trait StoreKind: Send + Sync {
    /// Its name, for messages and events.
    fn name(&self) -> &'static str;

    /// Whether a golden generation (its directory) carries it.
    fn in_generation(&self, root: &Path) -> bool;

    /// Whether a sandbox (its instance directory) holds it.
    fn in_sandbox(&self, dir: &InstanceDir) -> bool;

    /// Whether it runs a server process (a directory of files has none).
    fn has_server(&self) -> bool {
        true
    }

    /// Whether its server, should it die under a running sandbox, is started
    /// again from what it last saved; else the sandbox is lost with it.
    fn restarts_alone(&self) -> bool;

    /// Clones the golden generation's part (`golden_root`) into a new or reset
    /// sandbox; returns files left to clone while its server starts (files no
    /// process reads before the sandbox's first session), which the caller
    /// finishes before any session is opened.
    fn clone_from_golden(&self, at: At<'_>, golden_root: &Path) -> Result<Option<Deferred>>;

    /// Binds new data to the sandbox before it first starts: its access
    /// files or configuration, with the agent's `password`.
    fn configure(&self, at: At<'_>, password: &str) -> Result<()>;

    /// Starts its server and waits until it answers, doing what `credential`
    /// says; returns the server's pid. Its step times go into `steps`.
    async fn start(
        &self,
        at: At<'_>,
        launch: &Launch,
        credential: Credential<'_>,
        steps: &mut Steps,
    ) -> Result<Option<i32>>;

    /// Its running server's pid, checked to be its server.
    fn pid(&self, at: At<'_>) -> Option<i32>;

    /// Whether the server the sandbox's record names is still this store's
    /// server (for the store that gives the sandbox its pid); an error when
    /// that could not be looked at. The recorded pid itself must be the one
    /// the store finds: a server that merely runs is not enough, since the
    /// recorded pid is what `exec` enters.
    fn serves(&self, at: At<'_>) -> std::io::Result<bool> {
        Ok(at.sb.pid.is_some() && self.pid(at) == at.sb.pid)
    }

    /// Whether its server runs and answers (reconciliation at start).
    async fn answers(&self, at: At<'_>) -> bool;

    /// Writes its state into the sandbox's own directory (suspend, restart),
    /// where its next start begins from.
    async fn save(&self, at: At<'_>) -> Result<()>;

    /// Readies a running store for a copy taken while the sandbox's processes
    /// are frozen (a branch, a promotion); returns what holds its writes
    /// until the copy is made, if anything must.
    async fn prepare_copy(&self, at: At<'_>) -> Result<Option<Held>>;

    /// Copies its data from a frozen sandbox (`from`) into a new one (`to`),
    /// taking only files of the source's own user.
    fn copy_frozen(&self, from: At<'_>, to: At<'_>) -> Result<()>;

    /// Lets go writes a copy held, should a daemon that died mid-copy have
    /// left them held (reconciliation; harmless otherwise).
    async fn resume_writes(&self, _at: At<'_>) -> Result<()> {
        Ok(())
    }

    /// Ends its clients' sessions before a stop, telling each why, where its
    /// server can; waits a moment for them to be gone.
    async fn end_sessions(&self, _at: At<'_>, _why: Ending) -> Result<()> {
        Ok(())
    }

    /// Stops its server, if it runs; returns whether it shut down cleanly.
    /// An error says it could not tell whether the server still runs.
    async fn stop(&self, at: At<'_>, how: Stop) -> Result<bool>;

    /// Binds a pool member to the fork that claimed it: its access, and a
    /// `fresh` password when one was minted. `changed` is false when the
    /// fork asked for what the member was made with.
    async fn claim(&self, at: At<'_>, password: &str, fresh: bool, changed: bool) -> Result<()>;

    /// Readies a new pool member for a quick claim (caches, a kept session).
    async fn warm(&self, _at: At<'_>) -> Result<()> {
        Ok(())
    }

    /// Removes its data from a sandbox (a reset, before cloning again).
    fn remove_data(&self, at: At<'_>) -> Result<()>;

    /// How many client sessions it has besides the daemon's own; None when it
    /// cannot be asked (counted as in use).
    async fn clients(&self, at: At<'_>) -> Option<u64>;

    /// Stops every server of its kind under the data root that belongs to no
    /// sandbox in `live` (builds cut short, sandboxes a crash left behind);
    /// returns how many (reconciliation, before anything is served).
    async fn stop_unknown(
        &self,
        _engine: &Engine,
        _live: &std::collections::HashSet<String>,
    ) -> Result<usize> {
        Ok(0)
    }

    /// What `exec` code is given to reach it: an environment variable, its
    /// value, and the credential form it hands over (if it holds the password).
    fn exec_env(&self, at: At<'_>, password: &str) -> Option<(&'static str, String, Option<&'static str>)>;
}

/// The stores a golden generation (its directory) carries.
pub fn of_generation(root: &Path) -> Vec<&'static dyn StoreKind> {
    ALL.iter().copied().filter(|s| s.in_generation(root)).collect()
}

/// The stores a sandbox (its instance directory) holds.
pub fn of_sandbox(dir: &InstanceDir) -> Vec<&'static dyn StoreKind> {
    ALL.iter().copied().filter(|s| s.in_sandbox(dir)).collect()
}

/// The store that gives a sandbox holding `stores` its pid: the first with a server.
pub fn first_server(stores: &[&'static dyn StoreKind]) -> Option<&'static dyn StoreKind> {
    stores.iter().copied().find(|s| s.has_server())
}

/// Starts every store at once; returns, once all answer, the pid the sandbox
/// is known by (its first server's), or the first failure, with every store
/// stopped again.
pub async fn start_all(
    stores: &[&'static dyn StoreKind],
    at: At<'_>,
    launch: &Launch,
    credential: Credential<'_>,
    steps: &mut Steps,
) -> Result<i32> {
    let t = Instant::now();
    let started = futures_util::future::join_all(stores.iter().map(|store| async move {
        let mut own = Steps::default();
        let pid = store.start(at, launch, credential, &mut own).await;
        (pid, own)
    }))
    .await;
    let mut first = None;
    let mut failed = None;
    for (pid, own) in started {
        steps.merge(&own);
        match pid {
            Ok(pid) => {
                first = first.or(pid);
            }
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    if stores.len() > 1 || steps.start_ms == 0.0 {
        steps.stores_ms = Some(ms(t));
    }
    let failed = match (failed, first) {
        (None, Some(pid)) => return Ok(pid),
        (Some(e), _) => e,
        (None, None) => Error::internal(format!("sandbox {} has no store with a server", at.sb.id)),
    };
    stop_all(stores, at, Stop::Now).await;
    Err(failed)
}

/// How long ending a sandbox's sessions may take before a stop goes on without it.
const ENDING_LIMIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Ends the clients' sessions of every store, telling each why, before they
/// are stopped; best effort (a failure is logged, and the stop ends them
/// anyway, without the reason).
pub async fn end_sessions_all(stores: &[&'static dyn StoreKind], at: At<'_>, why: Ending) {
    for store in stores {
        match tokio::time::timeout(ENDING_LIMIT, store.end_sessions(at, why)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::debug!(sandbox = %at.sb.id, store = store.name(), error = %e, "could not end sessions with a reason")
            }
            Err(_) => {
                tracing::debug!(sandbox = %at.sb.id, store = store.name(), "ending sessions took too long")
            }
        }
    }
}

/// Stops every store's server (what could not be stopped is logged); returns
/// whether all shut down cleanly.
pub async fn stop_all(stores: &[&'static dyn StoreKind], at: At<'_>, how: Stop) -> bool {
    let mut clean = true;
    for store in stores {
        match store.stop(at, how).await {
            Ok(c) => clean &= c,
            Err(e) => {
                clean = false;
                tracing::warn!(sandbox = %at.sb.id, store = store.name(), error = %e, "could not stop a store");
            }
        }
    }
    clean
}

/// Readies every store of a running sandbox for a frozen copy (see
/// [`StoreKind::prepare_copy`]); none is left held when one fails.
pub async fn prepare_copy_all(stores: &[&'static dyn StoreKind], at: At<'_>) -> Result<Vec<Held>> {
    let mut held = Vec::new();
    for store in stores {
        match store.prepare_copy(at).await {
            Ok(h) => held.extend(h),
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

/// Clones the tree `from` into `to` for `owner`, taking only directories and
/// regular files of `source_uid`, never a link (the source may be a sandbox's,
/// whose code can be swapping its files right now); `what` names it in errors.
fn clone_owned(
    engine: &Engine,
    (from, to): (&Path, &Path),
    owner: &Identity,
    source_uid: nix::unistd::Uid,
    what: &str,
) -> Result<()> {
    let later = clone_owned_shaped(engine, (from, to), owner, source_uid, what, &Shape::default())?;
    later.finish().map(drop).map_err(|e| Error::io(format!("cloning {what}"), &e))
}

/// [`clone_owned`] shaped by `shape` ([`Shape`]); returns the files it left
/// for later.
fn clone_owned_shaped(
    engine: &Engine,
    (from, to): (&Path, &Path),
    owner: &Identity,
    source_uid: nix::unistd::Uid,
    what: &str,
    shape: &Shape<'_>,
) -> Result<Deferred> {
    engine
        .cloner
        .clone_shaped(from, to, Some(owner), Some(source_uid), shape)
        .map(|(_, later)| later)
        .map_err(|e| Error::io(format!("cloning {what}"), &e))
}

/// Removes a tree a store cloned, if it is there.
fn remove_tree(engine: &Engine, path: &Path) -> Result<()> {
    match engine.cloner.remove_tree(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(Error::io(format!("removing {}", path.display()), &e))
        }
        _ => Ok(()),
    }
}
