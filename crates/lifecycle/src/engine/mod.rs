//! What every operation shares: the lifecycle's settings, the state store,
//! the cloner, the PostgreSQL binaries and the OS identities. Golden and
//! sandbox code, and every service above them, take an `&Engine`.

pub mod kept;

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::layout::Layout;
use airlock_core::records::sandbox::Sandbox;
use airlock_host::cgroup::{CgroupLimits, Cgroups};
use airlock_host::storage::{Backend, Cloner, COPY_WARNING};
use airlock_host::users::{Identity, Leases};
use airlock_postgres::majors::{Majors, Server};
use airlock_state::store::Store;

/// The lifecycle's settings (flags of `airlock serve`, or their environment
/// variables); each service's own are the daemon's (`airlock::daemon::Settings`).
#[derive(Debug, Clone)]
pub struct Config {
    /// The data root.
    pub home: PathBuf,
    /// Live sandboxes allowed at once; forks past it fail with `capacity_exhausted`.
    pub max_sandboxes: usize,
    /// TTL of a fork that names none.
    pub default_ttl: Duration,
    /// Longest TTL a fork or extend may ask for.
    pub max_ttl: Duration,
    /// The unprivileged user goldens are built as when the daemon is root.
    pub instance_user: Option<String>,
    /// The uids sandboxes run as when the daemon is root, leased host-wide.
    pub uid_range: airlock_host::users::UidRange,
    /// Where the host-wide identity leases are kept.
    pub lease_dir: PathBuf,
    /// Where the default PostgreSQL binaries are.
    pub pg_bin: Option<PathBuf>,
    /// Where `airlock postgres install` puts other majors.
    pub pg_root: PathBuf,
    /// Copy every byte even where reflinks work (to exercise the fallback).
    pub force_copy: bool,
    /// Memory, pids and CPU weight of each sandbox (applied where cgroups are available).
    pub cgroup_limits: CgroupLimits,
    /// Set `favordynmods` on the host's cgroup2 mount at start (as root), so a
    /// server's move into its cgroups does not wait on the kernel
    /// ([`airlock_host::cgroup_moves`]).
    pub favor_cgroup_moves: bool,
    /// How far a sandbox's files may grow beyond its golden before it is deleted.
    pub disk_limit_bytes: u64,
    /// Where sandboxes have quotas: what every running sandbox can always
    /// write, whatever its neighbours do ([`crate::sandbox::headroom`]).
    pub disk_headroom_bytes: u64,
    /// Warm-pool size of a golden created without one.
    pub default_pool_size: i64,
    /// Sandboxes with a running server allowed at once (pool members count);
    /// past it, idle ones are suspended, least recently used first.
    pub max_running: usize,
    /// Bytes the copy-on-write volume may hold before forks wait; no limit if unset.
    pub max_disk_bytes: Option<u64>,
    /// Free space kept on the volume: below it, forks and wakes wait and the
    /// sandbox that is writing is stopped.
    pub disk_reserve: airlock_core::validate::Reserve,
    /// Idle time after which a sandbox is suspended, unless its fork names one; zero never.
    pub default_idle_suspend: Duration,
    /// How long a wake through the router waits for a running slot.
    pub wake_wait: Duration,
    /// How long the dump of a failed import is kept for the next attempt to resume from.
    pub import_keep: Duration,
    /// How the audit log writes, rotates and checkpoints.
    pub audit: airlock_state::audit::AuditOptions,
}

impl Config {
    /// Defaults for a data root: 100 sandboxes, 15 minute TTL, 24 hour maximum.
    pub fn new(home: impl Into<PathBuf>) -> Config {
        Config {
            home: home.into(),
            max_sandboxes: 100,
            default_ttl: Duration::from_secs(15 * 60),
            max_ttl: Duration::from_secs(24 * 3600),
            instance_user: None,
            uid_range: airlock_host::users::UidRange::default(),
            lease_dir: PathBuf::from(airlock_host::users::DEFAULT_LEASE_DIR),
            pg_bin: None,
            pg_root: airlock_postgres::majors::default_root(),
            force_copy: false,
            cgroup_limits: CgroupLimits::default(),
            favor_cgroup_moves: true,
            disk_limit_bytes: 10 << 30,
            disk_headroom_bytes: 64 << 20,
            default_pool_size: 0,
            max_running: 100,
            max_disk_bytes: None,
            disk_reserve: airlock_core::validate::Reserve::Percent(10),
            default_idle_suspend: Duration::from_secs(10 * 60),
            wake_wait: Duration::from_secs(10),
            import_keep: Duration::from_secs(24 * 3600),
            audit: airlock_state::audit::AuditOptions::default(),
        }
    }
}

/// Everything the daemon's operations share.
pub struct Engine {
    /// The settings it was started with.
    pub config: Config,
    /// Paths under the data root.
    pub layout: Layout,
    /// How data directories are cloned.
    pub cloner: Cloner,
    /// The PostgreSQL majors this host runs, each with its guard and client tools.
    pub postgres: Majors,
    /// The daemon's own OS user (the only one with admin access to instances).
    pub daemon_user: Identity,
    /// The OS user goldens are built as (and sandboxes run as when not root).
    pub instance_user: Identity,
    /// The OS user that jailed client tools read a build's input as, logged
    /// in as the owner role (root only; [`airlock_postgres::jail`]).
    pub loader_user: Option<Identity>,
    /// Host-wide leases of sandbox identities (root only).
    pub leases: Option<Leases>,
    /// The host's cgroups, for per-sandbox limits.
    pub cgroups: Cgroups,
    /// The audit log every event is written to before the store keeps it.
    pub audit: Arc<airlock_state::audit::AuditLog>,
    /// The warm pool's own state: what wakes its filler, and the admin
    /// sessions it keeps open on its members.
    pub pool: kept::Pool,
    /// How far each golden build has got.
    pub builds: crate::golden::progress::Builds,
    /// When each sandbox was last used in the daemon, and how many uses are open.
    pub activity: crate::activity::Activity,
    /// The queue forks and wakes wait in for room, and what wakes it.
    pub room: kept::Room,
    /// The disk headroom promised to each running sandbox, where sandboxes have quotas.
    pub headroom: kept::Headroom,
    /// Woken when a sandbox's expiry may have come nearer (a new sandbox, a
    /// claimed pool member, an extension): whoever keeps TTLs sleeps until the
    /// nearest expiry it knows of, and looks again when this wakes it.
    pub expiries: tokio::sync::Notify,
    /// Where the router listens, once it does.
    pub router: crate::doors::RouterAddress,
    /// The services registered with the engine: what they hear of sandboxes,
    /// what they perform for each other, and their own state.
    pub services: crate::services::Services,
    sandbox_ops: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    tearing_down: Mutex<HashSet<String>>,
    store: Mutex<Store>,
    golden_work: Mutex<std::collections::HashMap<String, GoldenWork>>,
}

/// Makes the host's moves into cgroups cheap where they are not, and says
/// what it did: a daemon that changes a host-wide mount says so.
fn favor_cgroup_moves() {
    use airlock_host::cgroup_moves::{self, CgroupMoves};
    match cgroup_moves::favor() {
        Ok(Some(CgroupMoves::Favored { mount })) => {
            tracing::info!(mount = %mount.display(), "set favordynmods on the host's cgroup2 mount: a server's move into its cgroups no longer waits for the kernel (--favor-cgroup-moves off leaves the host as it is)");
        }
        // Remounted, yet not set: the kernel applies the option only from the
        // host's own cgroup namespace (a daemon in a container is not there).
        Ok(Some(CgroupMoves::Waiting { mount })) => {
            tracing::warn!(mount = %mount.display(), "the host's cgroup2 mount kept no favordynmods (set it from the host's cgroup namespace): each cold fork waits for the kernel to move its server into its cgroups")
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(error = %e, "could not set favordynmods on the host's cgroup2 mount: each cold fork waits for the kernel to move its server into its cgroups")
        }
    }
}

fn mkdir(path: &Path, mode: u32) -> Result<()> {
    std::fs::create_dir_all(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

impl Engine {
    /// Prepares the data root (mounting the volume if `storage init` made one),
    /// opens the store, probes storage and finds PostgreSQL.
    pub fn open(config: Config) -> Result<Engine> {
        let layout = Layout::new(&config.home);
        airlock_core::layout::prepare_home(layout.home())?;
        let root = nix::unistd::geteuid().is_root();
        if let (true, Some(dir)) = (root, airlock_host::rootfs::under_private_dir(layout.home())) {
            return Err(Error::new(
                ErrorCode::DataRootNotWritable,
                format!(
                    "the data root {} is under {dir}, which every sandbox gets a private, empty copy of",
                    layout.home().display()
                ),
                "put the data root elsewhere (the default for root is /var/lib/airlock)",
            ));
        }
        airlock_host::storage::volume::ensure_mounted(&layout)?;
        // What the data root holds beside the volume is root's alone: the image
        // holds every sandbox's data, the log their ids; the root itself is only
        // traversable (0711), so a name known is a file reachable.
        for private in [layout.storage_image(), layout.daemon_log(), layout.daemon_lock(), layout.state_db()]
        {
            if std::fs::symlink_metadata(&private).is_ok_and(|m| m.is_file()) {
                std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600))?;
            }
        }
        // Instance users must traverse into their own sandbox directory; goldens stay private.
        mkdir(layout.home(), 0o711)?;
        mkdir(&layout.lib(), 0o755)?;
        mkdir(&layout.volume(), 0o711)?;
        mkdir(&layout.goldens(), 0o700)?;
        mkdir(&layout.sandboxes(), 0o711)?;
        mkdir(&layout.staging(), 0o711)?;
        let audit = Arc::new(airlock_state::audit::AuditLog::open(&layout.audit(), config.audit.clone())?);
        let store = Store::open(&layout.state_db())?.with_journal(audit.clone());
        let cloner = if config.force_copy {
            Cloner::copying(&layout.volume())
        } else {
            Cloner::probe(&layout.volume())?
        };
        let postgres = Majors::discover(config.pg_bin.as_deref(), &config.pg_root, &layout.lib())?;
        let daemon_user = Identity::current()?;
        let instance_user = Identity::for_instances(config.instance_user.as_deref())?;
        let leases = match root {
            true => Some(Leases::open(&config.lease_dir, config.uid_range, layout.home())?),
            false => None,
        };
        let loader_user = match root {
            true => Some(Identity::ensure(&format!("{}-load", instance_user.name))?),
            false => None,
        };
        let cgroups = Cgroups::detect(&layout.tag());
        if root && cgroups.available() && config.favor_cgroup_moves {
            favor_cgroup_moves();
        }
        Ok(Engine {
            config,
            layout,
            cloner,
            postgres,
            daemon_user,
            instance_user,
            loader_user,
            leases,
            cgroups,
            audit,
            pool: Default::default(),
            builds: Default::default(),
            activity: Default::default(),
            room: Default::default(),
            headroom: Default::default(),
            expiries: Default::default(),
            router: Default::default(),
            services: Default::default(),
            sandbox_ops: Mutex::new(HashMap::new()),
            tearing_down: Mutex::new(HashSet::new()),
            store: Mutex::new(store),
            golden_work: Mutex::new(Default::default()),
        })
    }

    /// The state store, locked for a short synchronous use.
    pub fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The server forks of one golden generation run on: its major's.
    pub fn server_for(&self, golden: &str, generation: i64) -> Result<&Server> {
        let major = self.store().generation_major(golden, generation)?;
        self.postgres.server(major)
    }

    /// Serializes suspend, wake and delete of one sandbox.
    pub async fn sandbox_lock(&self, id: &str) -> tokio::sync::OwnedMutexGuard<()> {
        self.ops_lock(id).lock_owned().await
    }

    fn ops_lock(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.sandbox_ops.lock().unwrap_or_else(|p| p.into_inner()).entry(id.to_owned()).or_default().clone()
    }

    /// The sandbox's operation lock, if no suspend, wake, branch, reset or
    /// delete holds it now.
    pub fn try_sandbox_lock(&self, id: &str) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        self.ops_lock(id).try_lock_owned().ok()
    }

    /// Claims the teardown of one sandbox; `None` while another is under way, so
    /// two never remove the same files. The claim ends when the guard drops.
    pub fn claim_teardown(&self, id: &str) -> Option<TeardownClaim<'_>> {
        let mut claimed = self.tearing_down.lock().unwrap_or_else(|p| p.into_inner());
        claimed.insert(id.to_owned()).then(|| TeardownClaim { engine: self, id: id.to_owned() })
    }

    /// Whether a teardown of `id` is under way.
    pub fn tearing_down(&self, id: &str) -> bool {
        self.tearing_down.lock().unwrap_or_else(|p| p.into_inner()).contains(id)
    }

    /// Forgets a deleted sandbox's lock and activity, and tells the services.
    pub fn forget_sandbox(&self, id: &str) {
        self.sandbox_ops.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
        self.activity.forget(id);
        self.services.changed(id, crate::services::Change::Deleted);
    }

    /// A sandbox as clients see it: its DSN through the router when the router is
    /// on (the private socket's in `socket_dsn`). Private: credentials leave
    /// only through [`Engine::hand_over`], which puts them on record.
    fn present(&self, mut sb: Sandbox) -> Sandbox {
        let password = sb.dsn.as_deref().and_then(airlock_core::dsn::password);
        let dir = self.layout.sandbox_instance(&sb.id);
        // One reading of the router's address for every form, so none of them
        // comes from a router started in its place meanwhile.
        let router = self.router.get();
        if let (Some(password), true) = (&password, airlock_redis::server::configured(&dir)) {
            sb.redis_socket_url = Some(airlock_redis::server::socket_url(&dir, &sb.id, password));
            sb.redis_url = router.as_ref().and_then(|r| r.redis_url(&sb.id, password));
        }
        // With no PostgreSQL, the stored DSN only holds the credential.
        if !self.layout.generation_has_postgres(&sb.golden, sb.generation) {
            sb.dsn = None;
        }
        if let (Some(router), Some(socket)) = (router, sb.dsn.take()) {
            let password = password.unwrap_or_default();
            sb.dsn = Some(router.dsn(&sb.id, &password));
            sb.router_socket_dsn = router.router_socket_dsn(&sb.id, &password);
            sb.socket_dsn = Some(socket);
        }
        sb
    }

    /// A sandbox as handed to a client, its credentials in it (see
    /// [`Engine::present`]), once a `credential_issued` record says so: which
    /// forms went to whom, and the credential's fingerprint, never the secret.
    /// No record, no credential.
    pub fn hand_over(&self, sb: Sandbox, to: &str) -> Result<Sandbox> {
        // The stored DSN holds the credential, whatever forms it is shown in.
        let password = sb.dsn.as_deref().and_then(airlock_core::dsn::password);
        let sb = self.present(sb);
        let Some(password) = password else { return Ok(sb) };
        let forms: Vec<&str> = [
            ("dsn", sb.dsn.is_some()),
            ("socket_dsn", sb.socket_dsn.is_some()),
            ("router_socket_dsn", sb.router_socket_dsn.is_some()),
            ("redis_url", sb.redis_url.is_some() || sb.redis_socket_url.is_some()),
        ]
        .into_iter()
        .filter_map(|(form, present)| present.then_some(form))
        .collect();
        if !forms.is_empty() {
            self.record_credential(&sb, to, &password, &forms)?;
        }
        Ok(sb)
    }

    /// Records that the credential `secret` of `sb` was handed to `to` in `forms`.
    pub fn record_credential(&self, sb: &Sandbox, to: &str, secret: &str, forms: &[&str]) -> Result<()> {
        self.store().record(airlock_core::events::NewEvent {
            kind: airlock_core::events::EventKind::CredentialIssued,
            sandbox: Some(sb.id.clone()),
            golden: Some(sb.golden.clone()),
            detail: serde_json::json!({
                "to": to,
                "forms": forms,
                "fingerprint": airlock_core::secret::fingerprint(secret),
            }),
            ..Default::default()
        })
    }

    /// OS users allowed to connect as the admin role: the daemon's own, and no other.
    pub fn admin_os_users(&self) -> Vec<&str> {
        vec![self.daemon_user.name.as_str()]
    }

    /// The OS users that log in to a sandbox's server as its agent role, by
    /// peer: its server's (the router and the gateway connect as it), its
    /// exec user's, and the daemon's (a socket DSN used on the host).
    pub fn agent_os_users(&self, sb: &Sandbox) -> Result<Vec<Identity>> {
        let mut users = vec![self.sandbox_user(sb)?, self.exec_user(sb)?, self.daemon_user.clone()];
        users.sort_by_key(|u| u.uid.as_raw());
        users.dedup_by_key(|u| u.uid.as_raw());
        Ok(users)
    }

    /// The OS user a sandbox runs as: its own leased uid when root, so no
    /// instance can read or signal a neighbour's (of any data root on the host);
    /// otherwise the daemon's own user.
    pub fn sandbox_user(&self, sb: &Sandbox) -> Result<Identity> {
        Identity::of_sandbox(self.daemon_user.is_root(), &self.instance_user, sb.uid, sb.slot)
    }

    /// The OS user `airlock exec` runs as in a sandbox: the second uid of its
    /// pair (not the server's, so exec code cannot read the server's files or
    /// trace it); the server's own where there is no pair.
    pub fn exec_user(&self, sb: &Sandbox) -> Result<Identity> {
        match (self.daemon_user.is_root(), sb.uid) {
            (true, Some(uid)) if uid.wrapping_sub(self.config.uid_range.first).is_multiple_of(2) => {
                Ok(Identity::leased(uid + 1))
            }
            _ => self.sandbox_user(sb),
        }
    }

    /// The group the sandbox's socket directory and socket belong to, so the
    /// exec user can connect: the exec user's own group, when it has one.
    pub fn socket_group(&self, sb: &Sandbox) -> Option<nix::unistd::Gid> {
        let (exec, server) = (self.exec_user(sb).ok()?, self.sandbox_user(sb).ok()?);
        (exec.uid != server.uid).then_some(exec.gid)
    }

    /// Records a new sandbox (state `creating`), leasing it an identity first when
    /// root; `settle` runs on the store in the same breath, just before the
    /// record is made. The lease goes back if the record cannot be made.
    pub fn insert_sandbox(
        &self,
        sb: &mut Sandbox,
        settle: impl FnOnce(&Store, &mut Sandbox) -> Result<()>,
    ) -> Result<()> {
        if let Some(leases) = &self.leases {
            sb.uid = Some(leases.take(&sb.id)?);
        }
        let inserted = {
            let mut store = self.store();
            // A golden being removed makes no new sandbox: its removal would not
            // see it (checked under the store's lock, as the removal lists them).
            if self.golden_being_removed(&sb.golden) {
                Err(Error::new(
                    ErrorCode::GoldenNotFound,
                    format!("golden {:?} is being removed", sb.golden),
                    "fork another golden (`airlock golden ls`)",
                ))
            } else {
                settle(&store, sb).and_then(|()| store.insert_sandbox(sb, self.config.max_sandboxes))
            }
        };
        match inserted {
            Ok(()) => self.expiries.notify_one(),
            Err(_) => self.release_identity(sb),
        }
        inserted
    }

    /// Gives a sandbox's identity back (once its processes and files are gone).
    pub fn release_identity(&self, sb: &Sandbox) {
        if let (Some(leases), Some(uid)) = (&self.leases, sb.uid) {
            leases.release(uid, &sb.id);
        }
    }

    /// Warnings every fork carries (the copy fallback).
    pub fn fork_warnings(&self) -> Vec<String> {
        match self.cloner.backend() {
            Backend::Reflink | Backend::Subvolume => vec![],
            Backend::Copy => vec![COPY_WARNING.to_owned()],
        }
    }

    /// Reserves a golden name for a build or a removal; fails at once, saying
    /// what is under way, while another holds it. Builds, promotions and
    /// removals of one golden therefore never interleave.
    pub fn reserve_golden(&self, name: &str, work: GoldenWork) -> Result<GoldenGuard<'_>> {
        let mut reserved = self.golden_work.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(under_way) = reserved.get(name) {
            return Err(Error::new(
                ErrorCode::GoldenInUse,
                format!("golden {name:?} is being {} right now", under_way.as_str()),
                "wait for that to finish, then try again",
            ));
        }
        reserved.insert(name.to_owned(), work);
        Ok(GoldenGuard { engine: self, name: name.to_owned() })
    }

    /// Whether a golden is being removed (no new sandbox of it may be made).
    pub fn golden_being_removed(&self, name: &str) -> bool {
        self.golden_work.lock().unwrap_or_else(|p| p.into_inner()).get(name) == Some(&GoldenWork::Remove)
    }
}

/// What a golden's name is reserved for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GoldenWork {
    /// Building a generation (create, refresh, promote).
    Build,
    /// Removing the golden.
    Remove,
    /// Removing the dump a failed import kept, once it expired.
    ExpireDump,
    /// Receiving a generation from another node.
    Replicate,
}

impl GoldenWork {
    fn as_str(self) -> &'static str {
        match self {
            GoldenWork::Build => "built",
            GoldenWork::Remove => "removed",
            GoldenWork::ExpireDump => "cleared of an expired import dump",
            GoldenWork::Replicate => "replicated from another node",
        }
    }
}

/// Releases a golden name reserved by [`Engine::reserve_golden`] when dropped.
pub struct GoldenGuard<'a> {
    engine: &'a Engine,
    name: String,
}

impl Drop for GoldenGuard<'_> {
    fn drop(&mut self) {
        let mut reserved = self.engine.golden_work.lock().unwrap_or_else(|p| p.into_inner());
        reserved.remove(&self.name);
    }
}

/// A claimed teardown (see [`Engine::claim_teardown`]).
pub struct TeardownClaim<'a> {
    engine: &'a Engine,
    id: String,
}

impl Drop for TeardownClaim<'_> {
    fn drop(&mut self) {
        self.engine.tearing_down.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.id);
    }
}
