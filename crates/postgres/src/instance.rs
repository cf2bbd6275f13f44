//! One PostgreSQL server process: start it on a private socket, wait until it is
//! ready, stop it cleanly or kill it.
//!
//! Instances listen on no TCP port (`listen_addresses = ''`); their only way in is
//! a unix socket in a directory only their OS user (and root) can enter. Each runs
//! in its own process group so the daemon can die without taking it along, and so
//! one signal reaches every backend of the instance.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

use crate::bin::PgBin;
use airlock_core::dsn::{ADMIN_ROLE, AGENT_ROLE, DATABASE, OWNER_ROLE, SOCKET_PORT};
use airlock_core::error::{Error, Result};
use airlock_core::layout::InstanceDir;
use airlock_host::contain::{contain_at_gate, log_tail, Enter, Who};
use airlock_host::gate::Waiting;
use airlock_host::pidfd::Pidfd;
use airlock_host::rootfs::View;
use airlock_host::users::Identity;

/// How long an instance may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Server settings every instance gets. Sandboxes are disposable, so durability
/// against a host crash is traded for speed (no fsync); commits still reach the
/// kernel at once (synchronous_commit stays on, which without fsync costs only a
/// write), so a killed instance restarts with every committed change.
/// Each with the first major that has it.
const SETTINGS: &[(&str, &str, u32)] = &[
    ("listen_addresses", "", 13),
    ("port", "5432", 13),
    ("unix_socket_permissions", "0700", 13),
    ("fsync", "off", 13),
    ("full_page_writes", "off", 13),
    ("shared_buffers", "16MB", 13),
    ("max_connections", "40", 13),
    ("max_wal_size", "48MB", 13),
    ("min_wal_size", "32MB", 13),
    ("logging_collector", "off", 13),
    ("log_min_messages", "warning", 13),
    ("log_line_prefix", "%m [%p] ", 13),
    ("jit", "off", 13),
    ("session_preload_libraries", "", 13),
    ("local_preload_libraries", "", 13),
    ("archive_mode", "off", 13),
    // No logical replication launcher: a sandbox has no subscription (none is
    // carried into a golden, and only a superuser makes one), and the process
    // cost each start a fork, its set-up and its exit.
    ("max_logical_replication_workers", "0", 13),
    // A client that went away mid-query is noticed within a second.
    ("client_connection_check_interval", "1s", 14),
    // A backend holds a connection slot while it authenticates: not for long.
    ("authentication_timeout", "10s", 13),
];

/// Who may connect and how, all by peer authentication (the OS user the
/// kernel vouches for on the socket; no password is held by the server):
/// - the admin role from the daemon's OS user only (no superuser password exists);
/// - the agent role from [`Peers::agent`]: the sandbox's own OS users (the
///   router and the gateway connect as its server's, `exec` code runs as its
///   second) and the daemon's (a socket DSN used on the host);
/// - during a golden's build, the owner role from its loader OS users, which
///   load what the build is made of: a session that logged in as a
///   non-superuser can never become one (`SET ROLE` and `SET SESSION
///   AUTHORIZATION` need a superuser session).
///
/// Nobody reaches a template or `postgres`. Without agent peers (a build, a
/// bare server for a benchmark) other roles log in by SCRAM; with them, no
/// other role logs in at all.
fn hba(peers: &Peers<'_>, agents: &[(String, bool)]) -> (String, String) {
    let mut hba = format!("# written by airlock at every start\nlocal all {ADMIN_ROLE} peer map=airlock\n");
    if !peers.owner.is_empty() {
        hba.push_str(&format!("local {DATABASE} {OWNER_ROLE} peer map=airlock\n"));
    }
    hba.push_str("local template0,template1,postgres all reject\n");
    match peers.agent.is_empty() {
        true => hba.push_str("local all all scram-sha-256\n"),
        false => hba.push_str(&format!("local all {AGENT_ROLE} peer map=airlock\nlocal all all reject\n")),
    }
    let mut ident = String::from("# written by airlock at every start\n");
    for (users, role) in [(peers.admin, ADMIN_ROLE), (peers.owner, OWNER_ROLE)] {
        for user in users {
            ident.push_str(&format!("airlock {user} {role}\n"));
        }
    }
    for (name, _) in agents {
        ident.push_str(&format!("airlock {name} {AGENT_ROLE}\n"));
    }
    (hba, ident)
}

/// The OS users that log in to a server by peer, each as one role.
#[derive(Default)]
pub struct Peers<'a> {
    /// As the admin role (names: the daemon's own user).
    pub admin: &'a [&'a str],
    /// As the agent role.
    pub agent: &'a [Identity],
    /// As the owner role (names: a golden build's loaders).
    pub owner: &'a [&'a str],
}

/// The name a peer has inside the server's view, and whether the host gave
/// it: its host name, or for a leased uid (no host entry) one the instance's
/// own user database gives it.
fn peer_name(user: &Identity) -> (String, bool) {
    match nix::unistd::User::from_uid(user.uid) {
        Ok(Some(host)) => (host.name, true),
        _ => (format!("airlock-{}", user.uid), false),
    }
}

/// Writes the access files of an instance beside its data directory, in the
/// root-owned instance directory: the server reads them (`hba_file`,
/// `ident_file`) but neither it nor anything running as its user can change
/// them. Peers with no host user entry (a sandbox's leased uids) get one in
/// the instance's own `passwd`, which its server's view puts at `/etc/passwd`,
/// since peer authentication needs a user name for the uid.
pub fn write_access_files(dir: &InstanceDir, peers: &Peers<'_>) -> Result<()> {
    // One lookup each: a leased uid is missed by every user database the host has.
    let agents: Vec<(String, bool)> = peers.agent.iter().map(peer_name).collect();
    let (hba, ident) = hba(peers, &agents);
    for (path, text) in [(dir.hba_file(), hba), (dir.ident_file(), ident)] {
        airlock_host::storage::tree::write_private(&path, text.as_bytes(), 0o644)?;
    }
    let unnamed: Vec<(&String, &Identity)> = agents
        .iter()
        .zip(peers.agent)
        .filter(|((_, host), _)| !host)
        .map(|((name, _), user)| (name, user))
        .collect();
    if unnamed.is_empty() {
        match std::fs::remove_file(dir.passwd_file()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => return Ok(()),
        }
    }
    let mut passwd = std::fs::read_to_string("/etc/passwd")?;
    if !passwd.is_empty() && !passwd.ends_with('\n') {
        passwd.push('\n');
    }
    for (name, user) in unnamed {
        passwd.push_str(&format!(
            "{name}:x:{}:{}:airlock sandbox:/nonexistent:/usr/sbin/nologin\n",
            user.uid, user.gid
        ));
    }
    airlock_host::storage::tree::write_private(&dir.passwd_file(), passwd.as_bytes(), 0o644)?;
    Ok(())
}

/// Makes an instance directory ready for a server, or takes an existing one
/// back before a restart: the directory itself root's (0711, so the instance
/// user can reach inside but not rename or plant anything there), and its socket
/// directory `run/` empty and the instance user's (0700, or 0750 with the
/// `socket_group` that may reach its socket). An entry of the
/// directory that is not what it should be (a link planted under an older
/// layout, say) is removed, never followed.
pub fn prepare_dir(dir: &InstanceDir, user: &Identity, socket_group: Option<nix::unistd::Gid>) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::create_dir(&dir.root) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e.into()),
    }
    let root = nix::unistd::geteuid();
    nix::unistd::fchownat(
        nix::fcntl::AT_FDCWD,
        &dir.root,
        Some(root),
        None,
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(std::io::Error::from)?;
    if !std::fs::symlink_metadata(&dir.root)?.is_dir() {
        return Err(Error::internal(format!("{} is not a directory", dir.root.display())));
    }
    std::fs::set_permissions(&dir.root, std::fs::Permissions::from_mode(0o711))?;
    let run = dir.socket_dir();
    match std::fs::symlink_metadata(&run) {
        Ok(m) if m.is_dir() => airlock_host::storage::tree::empty_dir(&run)?,
        Ok(_) => {
            std::fs::remove_file(&run)?;
            std::fs::create_dir(&run)?;
        }
        Err(_) => std::fs::create_dir(&run)?,
    }
    // With a socket group (the exec user's), its members may reach the socket
    // but not change the directory: nothing but the server can put a socket there.
    let mode = if socket_group.is_some() { 0o750 } else { 0o700 };
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(mode))?;
    nix::unistd::fchownat(
        nix::fcntl::AT_FDCWD,
        &run,
        Some(user.uid),
        Some(socket_group.unwrap_or(user.gid)),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(std::io::Error::from)?;
    for name in ["postgres.log", "pg_hba.conf", "pg_ident.conf", "passwd"] {
        let path = dir.root.join(name);
        if std::fs::symlink_metadata(&path).is_ok_and(|m| !m.is_file()) {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

/// Makes a new data directory with the admin role as bootstrap superuser and
/// peer authentication only. Runs as `instance_user` when `daemon_user` is root.
pub async fn initdb(
    bin: &PgBin,
    pgdata: &Path,
    daemon_user: &Identity,
    instance_user: &Identity,
) -> Result<()> {
    let mut args =
        vec!["--auth-local=peer", "--auth-host=reject", "--no-locale", "--encoding=UTF8", "--no-sync"];
    // PostgreSQL 13's initdb has no --no-instructions (its output is discarded anyway).
    args.extend(bin.major().filter(|m| *m >= 14).map(|_| "--no-instructions"));
    let args: Vec<&str> = ["-U", ADMIN_ROLE].into_iter().chain(args).collect();
    run_on_data_dir(bin, "initdb", pgdata, &args, (daemon_user, instance_user)).await
}

/// Empties a cleanly stopped server's write-ahead log (`pg_resetwal`): its
/// old segments, which hold every row version ever written (a masked
/// golden's source values among them), are removed and one empty segment
/// starts it again. Nothing is lost: a clean shutdown left nothing to replay.
pub async fn reset_wal(bin: &PgBin, pgdata: &Path, daemon_user: &Identity, owner: &Identity) -> Result<()> {
    run_on_data_dir(bin, "pg_resetwal", pgdata, &[], (daemon_user, owner)).await
}

/// Runs PostgreSQL's `tool -D pgdata args...` as the data directory's owner
/// (when the daemon is root), with a bare environment; its error output is the error.
async fn run_on_data_dir(
    bin: &PgBin,
    tool: &str,
    pgdata: &Path,
    args: &[&str],
    (daemon_user, owner): (&Identity, &Identity),
) -> Result<()> {
    let mut cmd = tokio::process::Command::new(bin.tool(tool));
    cmd.arg("-D")
        .arg(pgdata)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("LC_ALL", "C")
        .stdin(Stdio::null());
    if daemon_user.is_root() {
        cmd.uid(owner.uid.as_raw()).gid(owner.gid.as_raw());
    }
    let out = cmd.output().await?;
    if !out.status.success() {
        return Err(Error::postgres(format!(
            "{tool} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// What a sandbox's (or a build's) server sees of the host: the system trees,
/// its own binaries and guard (read-only), its instance directory, and the
/// private directories ([`airlock_host::rootfs`]). `exec` code joins this view.
pub fn server_view(bin: &PgBin, dir: &InstanceDir, guard: Option<&Path>) -> Result<View> {
    let mut view = View::system(true)?.with_private_dirs()?;
    // A major `postgres install` added lives outside /usr: its whole tree
    // (binaries, libraries, extension files) comes along.
    if let Some(tree) = bin.dir().parent().and_then(Path::parent).filter(|t| !t.starts_with("/usr")) {
        view.bind(tree, tree, false)?;
    }
    if let Some(lib) = guard.and_then(Path::parent).filter(|l| !l.starts_with("/usr")) {
        view.bind(lib, lib, false)?;
    }
    view.bind(&dir.root, &dir.root, true)?;
    // Over the host's, so peers' leased uids have names (see write_access_files).
    let passwd = dir.passwd_file();
    if passwd.is_file() {
        view.bind(&passwd, Path::new("/etc/passwd"), false)?;
    }
    Ok(view)
}

#[derive(Debug)]
pub struct Started {
    /// The postmaster's pid (also its process group id).
    pub pid: i32,
    child: airlock_host::spawn::Child,
}

/// Starts `postgres` on `dir` as `user`, in its own process group, logging to
/// `dir/postgres.log`, with its access files from beside the data directory and,
/// when given, the in-server guard preloaded. As root it also joins the cgroups
/// whose `cgroup.procs` files are given and gets namespaces of its own
/// ([`contain`]), in the sandbox's `network` namespace when one is given.
/// `template`, a golden's template1, is given to the guard to copy from
/// (bound read-only into the server's view when contained). Behind `gate`,
/// the server waits, in its cgroups, until the gate opens.
#[allow(clippy::too_many_arguments)]
pub fn start(
    bin: &PgBin,
    dir: &InstanceDir,
    user: &Identity,
    socket_group: Option<nix::unistd::Gid>,
    cgroups: &[std::ffi::CString],
    guard: Option<&Path>,
    network: Option<&airlock_host::contain::Network>,
    template: Option<&Path>,
    gate: Option<&airlock_host::gate::Gate>,
) -> Result<Started> {
    let log = airlock_host::storage::tree::open_log(&dir.log())?;
    // Behind a gate, the server waits for its files (a fork's clone) before
    // anything reads them: contained and with its guard, in the server's
    // program once it is loaded and linked (the guard, preloaded, waits
    // before PostgreSQL's own code runs); else in the child, before exec.
    let pass = gate.map(|g| g.enlist()).transpose()?.flatten();
    let contained = nix::unistd::geteuid().is_root();
    // LD_PRELOAD splits on `:` and spaces and expands `$ORIGIN` and the like.
    let preloadable = |p: &Path| {
        p.to_str().is_some_and(|p| !p.contains(|c: char| c == ':' || c == '$' || c.is_whitespace()))
    };
    let waiting = pass.map(|pass| match (contained, guard) {
        (true, Some(guard)) if preloadable(guard) => Waiting::InProgram(pass),
        _ => Waiting::BeforeExec(pass),
    });
    let mut cmd = airlock_host::spawn::Command::new(bin.tool("postgres"));
    cmd.arg("-D").arg(dir.pgdata());
    let major = bin.major().unwrap_or(0);
    for (k, v, _) in SETTINGS.iter().filter(|(_, _, since)| major >= *since) {
        cmd.arg("-c").arg(format!("{k}={v}"));
    }
    // Dynamic shared memory: as root, in the instance's own /dev/shm (a private
    // tmpfs that goes with it; never a file on the volume, whose pages would
    // fault with SIGBUS on a full disk); otherwise in the data directory, so
    // nothing is left in the host's /dev/shm when an instance is killed.
    let shared_memory = if nix::unistd::geteuid().is_root() { "posix" } else { "mmap" };
    cmd.arg("-c").arg(format!("dynamic_shared_memory_type={shared_memory}"));
    // A build (the one instance started without the guard) takes every
    // object of the database in one transaction (a promotion's REASSIGN
    // OWNED, its checks): room to lock tens of thousands, for it alone.
    if guard.is_none() {
        cmd.arg("-c").arg("max_locks_per_transaction=1024");
    }
    for (setting, path) in [
        ("unix_socket_directories", dir.socket_dir()),
        ("hba_file", dir.hba_file()),
        ("ident_file", dir.ident_file()),
    ] {
        cmd.arg("-c").arg(format!("{setting}={}", setting_path(&path)?));
    }
    // Libraries come from the command line only (a setting in the data
    // directory's files is overridden), and nothing is archived or restored.
    let guard_path = guard;
    let guard = guard.map(setting_path).transpose()?.unwrap_or_default();
    cmd.arg("-c").arg(format!("shared_preload_libraries={guard}"));
    // A build (the one server without the guard) vacuums and analyses itself,
    // as the owner role: no autovacuum worker, a superuser's session, runs a
    // promoted sandbox's index expressions there.
    if guard_path.is_none() {
        cmd.arg("-c").arg("autovacuum=off");
    }
    if let Some(template) = template {
        let seen = if contained { Path::new(TEMPLATE_INSIDE) } else { template };
        cmd.arg("-c").arg(format!("airlock.template_source={}", setting_path(seen)?));
    }
    if let Some(group) = socket_group {
        cmd.arg("-c").arg(format!("unix_socket_group={group}"));
        cmd.arg("-c").arg("unix_socket_permissions=0770");
    }
    cmd.env("LC_ALL", "C")
        .env("PATH", "/usr/bin:/bin")
        .stdio(None, Some(log.try_clone()?.into()), Some(log.into()))
        .process_group();
    if let (Some(Waiting::InProgram(_)), Some(guard)) = (waiting, guard_path) {
        // The server's view has the guard at the same path.
        cmd.env("LD_PRELOAD", guard)
            .env(airlock_host::gate::PROGRAM_FD_VARIABLE, airlock_host::gate::PROGRAM_FD.to_string())
            .env(airlock_host::gate::PARENT_VARIABLE, std::process::id().to_string());
    }
    let spawned = if contained {
        let who = Who::of(user, socket_group);
        let mut view = server_view(bin, dir, guard_path)?;
        if let Some(template) = template {
            view.bind(template, Path::new(TEMPLATE_INSIDE), false)?;
        }
        let network = network.map(|n| n.try_clone()).transpose()?;
        // SAFETY: containment makes only system calls on the child itself,
        // and allocates nothing.
        unsafe {
            cmd.spawn(&mut || contain_at_gate(who, cgroups, waiting, Enter::New(&view, network.as_ref())))
        }
    } else {
        // SAFETY: Pass::wait makes only system calls on the child itself.
        unsafe { cmd.spawn(&mut || pass.map_or(Ok(()), |pass| pass.wait())) }
    };
    let child = spawned
        .map_err(|e| Error::postgres(format!("could not start postgres for {}: {e}", dir.root.display())))?;
    let pid = child.id();
    Ok(Started { pid, child })
}

/// Where a contained server sees its golden's template1 (read-only).
const TEMPLATE_INSIDE: &str = "/run/airlock/template1";

/// A path as a server setting's value: one the server would read differently
/// (a list separator, a quote, a space) is refused rather than mangled.
fn setting_path(path: &Path) -> Result<String> {
    let text = path.to_str().unwrap_or_default();
    if text.is_empty() || text.chars().any(|c| matches!(c, ',' | '\'' | '"' | '\\') || c.is_whitespace()) {
        return Err(Error::new(
            airlock_core::error::ErrorCode::InvalidRequest,
            format!("the path {} cannot be given to PostgreSQL as a setting", path.display()),
            "use a data root whose path has no spaces, commas or quotes",
        ));
    }
    Ok(text.to_owned())
}

impl Started {
    /// Waits until the server says it is ready to accept connections, on its
    /// `postmaster.pid`: read again each time the kernel tells of a write to
    /// it (the line turns `ready` the moment the postmaster can take
    /// sessions), and at least every 10 ms; fails with the log's tail if the
    /// server exits first.
    pub async fn wait_ready(&mut self, dir: &InstanceDir) -> Result<()> {
        let pgdata = dir.pgdata();
        let pidfile = pgdata.join("postmaster.pid");
        let watch = airlock_host::watch::FileWatch::new(&pgdata, std::ffi::OsStr::new("postmaster.pid"));
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(text) = airlock_host::storage::tree::read_small(&pidfile, 4096) {
                if text.lines().nth(7).is_some_and(|l| l.trim() == "ready") {
                    return Ok(());
                }
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(Error::postgres_with_log(
                    format!("postgres exited ({status}) before it was ready"),
                    &log_tail(&dir.log()),
                ));
            }
            if Instant::now() > deadline {
                return Err(Error::postgres_with_log(
                    format!("postgres was not ready after {READY_TIMEOUT:?}"),
                    &log_tail(&dir.log()),
                ));
            }
            match &watch {
                Ok(watch) => {
                    watch.written(Duration::from_millis(10)).await;
                }
                // No inotify (out of instances, say): read it every millisecond.
                Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
            }
        }
    }

    /// Hands the child to a background task that reaps it when it exits, so no
    /// zombie is left; the process keeps running if the daemon dies first.
    pub fn detach(self) -> i32 {
        let mut child = self.child;
        tokio::spawn(async move {
            let _ = child.wait().await;
        });
        self.pid
    }

    /// Stops the server cleanly (fast shutdown: a checkpoint, no waiting for
    /// clients) and waits for it to exit.
    pub async fn stop_clean(mut self, dir: &InstanceDir) -> Result<()> {
        let _ = signal::kill(Pid::from_raw(self.pid), Signal::SIGINT);
        match tokio::time::timeout(READY_TIMEOUT, self.child.wait()).await {
            Ok(Ok(status)) if status.success() => Ok(()),
            Ok(Ok(status)) => Err(Error::postgres(format!(
                "postgres shut down uncleanly ({status}): {}",
                log_tail(&dir.log())
            ))),
            _ => {
                let _ = kill(self.pid, &dir.pgdata()).await;
                Err(Error::postgres("postgres did not shut down in time; it was killed"))
            }
        }
    }
}

/// How a fork's clone keeps the golden's relation cache init files across its
/// server's start: made under another name (PostgreSQL removes them at every
/// start in case a crash left them stale, but a clone of a golden that shut
/// down cleanly holds the very catalogs they describe), while a kept file the
/// golden itself holds (from a sandbox whose own restore failed, then
/// promoted, so describing older catalogs) is not taken. Put back by
/// [`restore_relcache_init`] once the server is ready, the first session reads
/// them instead of building the cache from the catalogs (about 4 ms, on the
/// first query's clock).
pub const RELCACHE_KEPT_AT_CLONE: (&str, &str) = ("pg_internal.init", "pg_internal.init.kept");
/// What a fork's clone leaves out: [`RELCACHE_KEPT_AT_CLONE`]'s stale files.
pub const RELCACHE_NOT_CLONED: &str = RELCACHE_KEPT_AT_CLONE.1;

/// Puts kept init files back under their own name (a file the server wrote
/// meanwhile, from the same catalogs, is replaced).
pub fn restore_relcache_init(pgdata: &Path) -> std::io::Result<usize> {
    use airlock_host::storage::tree::rename_in;
    let name = |n: &str| std::ffi::CString::new(n).expect("no NUL in a constant name");
    let (own, kept) = (name(RELCACHE_KEPT_AT_CLONE.0), name(RELCACHE_KEPT_AT_CLONE.1));
    let (kept, own) = (kept.as_c_str(), own.as_c_str());
    Ok(rename_in(&pgdata.join("global"), kept, own, false)?
        + rename_in(&pgdata.join("base"), kept, own, true)?)
}

/// Ends the backends of the server `postmaster` that have not logged in,
/// which hold connection slots without having proven anything: those still
/// authenticating (their process title says so) and those still waiting for
/// their startup packet (their title is not yet their own: a forked backend
/// keeps the postmaster's until it has read one). Used when the admin finds
/// every slot taken. Returns how many were signalled.
pub fn end_unauthenticated(postmaster: i32) -> usize {
    let Ok(procs) = std::fs::read_dir("/proc") else { return 0 };
    let Ok(own) = std::fs::read(format!("/proc/{postmaster}/cmdline")) else { return 0 };
    let mut ended = 0;
    for pid in procs.flatten().filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok()) {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let parent = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok());
        if parent != Some(postmaster) {
            continue;
        }
        let title = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let authenticating =
            String::from_utf8_lossy(&title).trim_end_matches('\0').ends_with(" authentication");
        if authenticating || title == own {
            let _ = signal::kill(Pid::from_raw(pid), Signal::SIGTERM);
            ended += 1;
        }
    }
    ended
}

/// Whether the server of `pgdata` last shut down cleanly: its control file says
/// "shut down", so it starts without recovery. A server that died, or panicked
/// writing its shutdown checkpoint (a full disk), leaves "in production".
pub fn shut_down_cleanly(pgdata: &Path) -> bool {
    // ControlFileData begins with the system identifier (8 bytes), the control
    // and catalog versions (4 each), then the state, a C enum in which 1 is
    // DB_SHUTDOWNED and 2 DB_SHUTDOWNED_IN_RECOVERY.
    let Ok(bytes) = airlock_host::storage::tree::read_small_bytes(&pgdata.join("global/pg_control"), 32)
    else {
        return false;
    };
    bytes
        .get(16..20)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_ne_bytes)
        .is_some_and(|s| s == 1 || s == 2)
}

/// Stops a detached instance cleanly (fast shutdown: running sessions are
/// ended, a checkpoint written), killing it if it has not exited in time.
pub async fn stop(pid: i32, pgdata: &Path) {
    let Ok(Some(server)) = hold(pid, pgdata) else { return };
    let _ = server.signal(Signal::SIGINT);
    if !server.exits_within(Duration::from_secs(10)).await {
        let _ = kill(pid, pgdata).await;
    }
}

/// Stops an instance for good: immediate shutdown (which also removes its shared
/// memory), then SIGKILL to the whole process group if it lingers. Safe to call
/// on a pid that is gone or that belongs to someone else: it only signals the
/// process it holds by a pidfd, once that process's command line names
/// `pgdata`. Its end is the pidfd's, so a server whose parent reaps it late
/// (pid 1, for a server a previous daemon started) is not waited for. Fails
/// only when `/proc` cannot be read (out of descriptors, say), since then
/// nobody can tell whether the server still runs, and a caller must not
/// remove files under a live one.
pub async fn kill(pid: i32, pgdata: &Path) -> std::io::Result<()> {
    let Some(server) = held_settled(pid, pgdata).await? else {
        remove_stale_shared_memory(pgdata);
        return Ok(());
    };
    let _ = server.signal(Signal::SIGQUIT);
    if !server.exits_within(Duration::from_secs(2)).await {
        // Still running, so not reaped: its pid (and group) is still its own.
        let _ = signal::killpg(Pid::from_raw(pid), Signal::SIGKILL);
        server.exits_within(Duration::from_secs(5)).await;
    }
    remove_stale_shared_memory(pgdata);
    Ok(())
}

/// The postmaster `pid` of `pgdata`, held by a pidfd; `None` when that pid is
/// not (or no longer) such a server. Who it is is read only once it is held:
/// read first, the pid could be used again before the pidfd was opened.
fn hold(pid: i32, pgdata: &Path) -> std::io::Result<Option<Pidfd>> {
    let Some(server) = Pidfd::open(pid)? else { return Ok(None) };
    // Still running once `/proc` was read: that was the held process's.
    Ok((serves(pid, pgdata)? && !server.exited()).then_some(server))
}

/// `hold`, retried for a second while `/proc` cannot be read.
async fn held_settled(pid: i32, pgdata: &Path) -> std::io::Result<Option<Pidfd>> {
    let mut tries = 0;
    loop {
        match hold(pid, pgdata) {
            Err(_) if tries < 20 => tries += 1,
            outcome => return outcome,
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether `pid` is a running (not zombie) postmaster serving `pgdata`, or an
/// error when `/proc` could not be read: "could not look" is never "gone".
pub fn serves(pid: i32, pgdata: &Path) -> std::io::Result<bool> {
    Ok(pid > 0
        && airlock_core::process::running(pid)?
        && postmaster_data_dir(pid)?.as_deref() == Some(pgdata))
}

/// `serves`, with "could not look" counted as "no": for callers that only ask
/// whether they may use the server.
pub fn is_postmaster_of(pid: i32, pgdata: &Path) -> bool {
    serves(pid, pgdata).unwrap_or(false)
}

/// Reads a file of `/proc/PID`; `None` when the process is gone.
fn read_proc(pid: i32, file: &str) -> std::io::Result<Option<Vec<u8>>> {
    match std::fs::read(format!("/proc/{pid}/{file}")) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                || e.raw_os_error() == Some(nix::errno::Errno::ESRCH as i32) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The `-D` argument of a running postgres process, `None` if `pid` is not one.
pub fn postmaster_data_dir(pid: i32) -> std::io::Result<Option<PathBuf>> {
    let Some(cmdline) = read_proc(pid, "cmdline")? else { return Ok(None) };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    if !args.first().is_some_and(|a| a.ends_with(b"postgres")) {
        return Ok(None);
    }
    let dir = args
        .iter()
        .position(|a| *a == b"-D")
        .and_then(|i| args.get(i + 1))
        .and_then(|d| std::str::from_utf8(d).ok());
    Ok(dir.map(PathBuf::from))
}

/// Whether a process exists and is not a zombie ("could not look" counts as yes,
/// so a waiter keeps waiting rather than acting on a live process).
pub fn is_alive(pid: i32) -> bool {
    airlock_core::process::running(pid).unwrap_or(true)
}

/// After an instance died without shutting down, its small System V segment
/// would stay behind; `postmaster.pid` names it, so remove it. As root each
/// instance has an IPC namespace of its own, whose segments go with it, and a
/// segment id read from a file the instance's user can write is never acted on.
pub fn remove_stale_shared_memory(pgdata: &Path) {
    if nix::unistd::geteuid().is_root() {
        return;
    }
    let Ok(text) = airlock_host::storage::tree::read_small(&pgdata.join("postmaster.pid"), 4096) else {
        return;
    };
    let Some(line) = text.lines().nth(6) else { return };
    let Some(shmid) = line.split_whitespace().nth(1).and_then(|s| s.parse::<i32>().ok()) else { return };
    // SAFETY: IPC_RMID with a null buffer only marks the segment for removal.
    unsafe {
        nix::libc::shmctl(shmid, nix::libc::IPC_RMID, std::ptr::null_mut());
    }
}

/// Settings every admin session fixes when it connects. A startup packet's
/// settings take precedence over the database's and the role's, so nothing set
/// inside an instance (by an agent, or carried in a golden) steers the admin's
/// name resolution, transactions or timeouts; and with `pg_catalog` first and
/// `pg_temp` last, no name in the admin's SQL can resolve to an object an agent
/// made. `role=none` keeps a stored `role` setting from running the session as
/// another role, and standard strings keep its literals reading as written.
pub const ADMIN_SESSION_OPTIONS: &str =
    "-c search_path=pg_catalog,pg_temp -c role=none -c standard_conforming_strings=on \
     -c default_transaction_read_only=off \
     -c statement_timeout=0 -c lock_timeout=0 -c idle_in_transaction_session_timeout=0 \
     -c default_transaction_isolation=read\\ committed -c session_replication_role=origin";

/// What an owner-role session of the daemon's pins ([`ADMIN_SESSION_OPTIONS`]
/// but for the one setting only a superuser may make).
pub const OWNER_SESSION_OPTIONS: &str =
    "-c search_path=pg_catalog,pg_temp -c role=none -c standard_conforming_strings=on \
     -c default_transaction_read_only=off \
     -c statement_timeout=0 -c lock_timeout=0 -c idle_in_transaction_session_timeout=0 \
     -c default_transaction_isolation=read\\ committed";

/// A tokio-postgres configuration for the admin role over an instance's socket.
pub fn admin_config(dir: &InstanceDir, database: &str) -> tokio_postgres::Config {
    let mut config = tokio_postgres::Config::new();
    config
        .host_path(dir.socket_dir())
        .port(SOCKET_PORT)
        .user(ADMIN_ROLE)
        .dbname(database)
        .application_name("airlock")
        .options(ADMIN_SESSION_OPTIONS)
        .connect_timeout(Duration::from_secs(10));
    config
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_host::gate::Gate;
    use std::os::unix::process::CommandExt;
    use std::sync::Arc;

    /// A contained server behind a gate runs its program at once (the spawn
    /// returns with the gate still shut) and waits in it, its libraries
    /// loaded, before PostgreSQL's own code reads anything: no pid file until
    /// the gate opens, then ready, with no descriptor of the gate's left. At a
    /// gate shut instead, it ends without ever starting.
    #[tokio::test]
    async fn a_server_behind_a_gate_runs_its_program_and_waits_in_it_until_the_gate_opens() {
        use std::os::unix::fs::PermissionsExt;
        assert!(nix::unistd::geteuid().is_root(), "this test starts a contained server: run it as root");
        let bin = PgBin::locate(None).expect("a PostgreSQL server");
        let scratch = PathBuf::from(format!("/var/lib/airlock-unit-gate-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&scratch);
        std::fs::create_dir_all(&scratch).unwrap();
        std::fs::set_permissions(&scratch, std::fs::Permissions::from_mode(0o755)).unwrap();
        let nobody = Identity { name: "nobody".into(), uid: 65534.into(), gid: 65534.into() };
        let dir = InstanceDir { root: scratch.join("instance") };
        prepare_dir(&dir, &nobody, None).unwrap();
        std::fs::create_dir(dir.pgdata()).unwrap();
        std::os::unix::fs::chown(dir.pgdata(), Some(65534), Some(65534)).unwrap();
        std::fs::set_permissions(dir.pgdata(), std::fs::Permissions::from_mode(0o700)).unwrap();
        initdb(&bin, &dir.pgdata(), &Identity::current().unwrap(), &nobody).await.unwrap();
        write_access_files(&dir, &Peers::default()).unwrap();
        let guard =
            crate::guard::for_major(&scratch.join("guard"), bin.major().unwrap(), None, None).unwrap();
        let pid_file = dir.pgdata().join("postmaster.pid");
        // A failed assertion leaves no server running.
        struct Leftovers(std::sync::Mutex<Vec<i32>>);
        impl Drop for Leftovers {
            fn drop(&mut self) {
                for pid in self.0.lock().unwrap().iter() {
                    let _ = signal::killpg(Pid::from_raw(*pid), Signal::SIGKILL);
                }
            }
        }
        let leftovers = Leftovers(Default::default());

        let spawn_behind = |gate: &Arc<Gate>| {
            let (bin, dir, guard, gate) = (bin.clone(), dir.clone(), guard.clone(), gate.clone());
            let nobody = nobody.clone();
            std::thread::spawn(move || {
                start(&bin, &dir, &nobody, None, &[], Some(&guard), None, None, Some(&gate))
            })
        };
        let returned = |spawning: &std::thread::JoinHandle<_>| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !spawning.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            spawning.is_finished()
        };

        let pipes = |pid: &str| -> std::collections::HashSet<String> {
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .unwrap()
                .flatten()
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .map(|l| l.to_string_lossy().into_owned())
                .filter(|l| l.starts_with("pipe:"))
                .collect()
        };
        let before = pipes("self");
        let gate = Gate::new().unwrap();
        let gates_pipe: Vec<String> = pipes("self").difference(&before).cloned().collect();
        assert_eq!(gates_pipe.len(), 1, "{gates_pipe:?}");
        let spawning = spawn_behind(&gate);
        assert!(returned(&spawning), "the spawn waited for the gate: the server did not run its program");
        let mut started = spawning.join().unwrap().unwrap();
        leftovers.0.lock().unwrap().push(started.pid);
        let exe = std::fs::read_link(format!("/proc/{}/exe", started.pid)).unwrap();
        assert_eq!(exe, bin.tool("postgres").canonicalize().unwrap(), "the server runs its program");
        std::thread::sleep(Duration::from_millis(300));
        assert!(started.child.try_wait().unwrap().is_none(), "the server ended at a closed gate");
        assert!(!pid_file.exists(), "PostgreSQL's own code ran before the gate opened");
        gate.open();
        started.wait_ready(&dir).await.unwrap();
        assert!(
            !pipes(&started.pid.to_string()).contains(&gates_pipe[0]),
            "the gate's descriptor outlived the wait"
        );
        let environ = std::fs::read(format!("/proc/{}/environ", started.pid)).unwrap();
        assert!(
            String::from_utf8_lossy(&environ).contains("AIRLOCK_GATE_FD"),
            "the server was not handed the gate"
        );
        kill(started.pid, &dir.pgdata()).await.unwrap();
        let _ = started.child.wait().await;
        let _ = std::fs::remove_file(&pid_file);

        // A gate shut: the server ends before PostgreSQL's code runs.
        let gate = Gate::new().unwrap();
        let spawning = spawn_behind(&gate);
        assert!(returned(&spawning));
        let mut started = spawning.join().unwrap().unwrap();
        leftovers.0.lock().unwrap().push(started.pid);
        gate.shut();
        let status =
            tokio::time::timeout(Duration::from_secs(10), started.child.wait()).await.unwrap().unwrap();
        assert_eq!(std::os::unix::process::ExitStatusExt::into_raw(status) >> 8, 3, "{status:?}");
        assert!(!pid_file.exists(), "a server behind a shut gate started");

        // The daemon gone (its end of the pipe closed) while the server
        // waits: it ends too, never left waiting.
        let gate = Gate::new().unwrap();
        let spawning = spawn_behind(&gate);
        assert!(returned(&spawning));
        let mut started = spawning.join().unwrap().unwrap();
        leftovers.0.lock().unwrap().push(started.pid);
        drop(gate);
        let status =
            tokio::time::timeout(Duration::from_secs(10), started.child.wait()).await.unwrap().unwrap();
        assert_eq!(std::os::unix::process::ExitStatusExt::into_raw(status) >> 8, 3, "{status:?}");
        assert!(!pid_file.exists(), "a server whose gate went away started");

        // A server told of a gate whose guard was not preloaded (the loader
        // ignored it) ends when shared_preload_libraries loads the guard,
        // rather than wait there, late.
        let late = std::process::Command::new(bin.tool("postgres"))
            .arg("-D")
            .arg(dir.pgdata())
            .args(["-c", "listen_addresses="])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", dir.socket_dir().display()))
            .arg("-c")
            .arg(format!("shared_preload_libraries={}", guard.display()))
            .env_clear()
            .env(airlock_host::gate::PROGRAM_FD_VARIABLE, "3")
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        assert_eq!(late.status.code(), Some(3), "{late:?}");
        assert!(String::from_utf8_lossy(&late.stderr).contains("not held at its gate"), "{late:?}");
        let _ = std::fs::remove_file(&pid_file);
        let _ = std::fs::remove_dir_all(&scratch);
    }
}
