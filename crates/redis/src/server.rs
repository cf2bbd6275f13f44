//! One `redis-server`: a sandbox's, or a golden build's. It listens on a unix
//! socket in the instance's `run/` directory only, keeps its data in the
//! instance's `redis/` directory (which its user owns), persists nothing unless
//! the daemon asks, and lets in only the ACL users its configuration names:
//! the admin (`airlock`, whose password only root can read) and at most one
//! other, the agent or a build's loader, under [`AGENT_RULES`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::io::BufStream;
use tokio::net::UnixStream;

use crate::resp::{self, Reply};
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::layout::InstanceDir;
use airlock_host::users::Identity;

/// The ACL user the daemon administers a server as.
pub const ADMIN_USER: &str = "airlock";

/// What the agent (and a build's loader) may not do: everything that reaches
/// outside the server or out of reach of the script watch (writing files with
/// `CONFIG SET dir`, `SCRIPT DEBUG`'s forked copy of the server, `MODULE LOAD`,
/// `REPLICAOF`/`SLAVEOF`/`MIGRATE` to another host, `DEBUG`, `SHUTDOWN`), changes
/// who may connect (`ACL`), ends another connection (`CLIENT KILL`), lifts a
/// limit (`CONFIG SET maxmemory`) or feeds the server crafted encodings
/// (`RESTORE`). What an application uses stays, the dangerous-but-local
/// commands of its own data included (`FLUSHALL`, `KEYS`, `SORT`, `INFO`).
pub const AGENT_RULES: &str = "~* &* +@all -@admin -@dangerous +flushall +flushdb +keys +sort +sort_ro \
    +info +role +lastsave +swapdb +client|id +client|getname +client|setname +client|info \
    +client|list +client|reply +client|tracking +client|trackinginfo +client|caching +client|getredir \
    +config|get -restore -restore-asking -migrate -function|restore -script|debug";

/// A sandbox's Redis memory ceiling: a quarter of its memory limit (its
/// PostgreSQL shares the rest), at least 16 MiB.
pub fn max_memory(sandbox_limit: u64) -> u64 {
    (sandbox_limit / 4).max(16 << 20)
}

/// The server binary.
pub fn binary() -> Result<PathBuf> {
    ["/usr/bin/redis-server", "/usr/local/bin/redis-server"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::new(
                ErrorCode::RedisFailed,
                "this host has no redis-server",
                "install it (`apt-get install redis-server`, or run `make demo`), then try again",
            )
        })
}

/// `#` and the SHA-256 of a password, as an ACL rule names it: the
/// configuration file never holds a password.
fn hashed(password: &str) -> String {
    format!("#{}", airlock_core::secret::hex(&Sha256::digest(password.as_bytes())))
}

/// What a read-only credential may not do besides: write anything.
const READ_ONLY_RULES: &str = "-@write -flushall -flushdb -swapdb";

/// The whole rule set of the agent's (or the loader's) user. Rules apply in
/// order and add up, so changing them (a claim's access) rebuilds them from
/// nothing (`-@all`): giving writes back with `+@write` alone would give back
/// `RESTORE`, `MIGRATE` and `FUNCTION RESTORE` too.
fn user_rules(read_only: bool) -> String {
    let extra = if read_only { READ_ONLY_RULES } else { "" };
    format!("-@all {AGENT_RULES} {extra}")
}

/// The most bytes one command may take, arguments and all: well under what
/// a server lets its clients hold together (`maxmemory-clients`), so a
/// command at the limit always fits. The server itself refuses any one
/// argument over it (`proto-max-bulk-len`); the router refuses a whole
/// command over it with an error reply.
pub const MAX_COMMAND: u64 = 8 << 20;

/// One server's settings: its memory ceiling and its users.
pub struct Settings<'a> {
    /// `maxmemory`, in bytes.
    pub max_memory: u64,
    /// The admin's password.
    pub admin_password: &'a str,
    /// The other user and its password, if any.
    pub user: Option<(&'a str, &'a str)>,
    /// Whether that user may only read (a read-only sandbox's agent).
    pub read_only: bool,
}

/// Writes the server's configuration, and the admin's password readable by
/// root alone, beside (never inside) its data directory.
pub fn write_config(dir: &InstanceDir, settings: &Settings) -> Result<()> {
    let seen = InstanceDir { root: inside(dir) };
    let (socket, data) = (seen.redis_socket(), seen.redis_dir());
    for path in [&socket, &data] {
        let text = path.to_str().unwrap_or_default();
        if text.is_empty() || text.chars().any(|c| c.is_whitespace() || c == '"' || c == '\'') {
            return Err(Error::internal(format!(
                "{} cannot be named in a Redis configuration",
                path.display()
            )));
        }
    }
    let mut conf = format!(
        "# written by airlock at every start\n\
         {tcp}unixsocket {socket}\nunixsocketperm 770\nproc-title-template \"{{title}} {{unixsocket}}\"\n\
         dir {data}\ndbfilename dump.rdb\n\
         pidfile {data}/redis.pid\n\
         save \"\"\nappendonly no\ndaemonize no\nprotected-mode no\nlogfile \"\"\nloglevel warning\n\
         maxmemory {max}\nmaxmemory-policy noeviction\nmaxclients 256\n\
         maxmemory-clients 32mb\nclient-output-buffer-limit normal 32mb 16mb 10\n\
         proto-max-bulk-len {MAX_COMMAND}\n\
         enable-protected-configs no\nenable-debug-command no\nenable-module-command no\n\
         busy-reply-threshold 5000\n\
         user default off resetkeys resetchannels -@all\n\
         user {ADMIN_USER} on {admin} ~* &* +@all\n",
        // It listens on no port: `exec` code reaches it on loopback in the
        // sandbox's own network namespace through the daemon
        // ([`crate::loopback`]), which judges each command's size on the
        // way as the router does. Its title names its socket
        // (`proc-title-template`), which is how [`find`] tells it apart.
        tcp = "port 0\n",
        socket = socket.display(),
        data = data.display(),
        max = settings.max_memory,
        admin = hashed(settings.admin_password),
    );
    if let Some((name, password)) = settings.user {
        airlock_core::validate::name("redis user", name)?;
        conf.push_str(&format!("user {name} on {} {}\n", hashed(password), user_rules(settings.read_only)));
    }
    airlock_host::storage::tree::write_private(&dir.redis_conf(), conf.as_bytes(), 0o644)?;
    airlock_host::storage::tree::write_private(
        &dir.redis_admin(),
        settings.admin_password.as_bytes(),
        0o600,
    )?;
    Ok(())
}

/// Whether servers run contained (the daemon is root), and so see their
/// instance directory at [`inside`].
fn contained() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Where the instance directories under `parent` (a data root's sandboxes,
/// or its staging) are, as a contained server sees them: `/airlock/TAG`,
/// a tag derived from the host path, which a server never sees. `CONFIG GET
/// dir`, `INFO server` and `CLIENT LIST` tell a server's paths to any client,
/// so they name nothing of the host. Without containment, `parent` itself.
pub fn inside_prefix(parent: &Path) -> PathBuf {
    if !contained() {
        return parent.to_path_buf();
    }
    let digest = Sha256::digest(parent.as_os_str().as_encoded_bytes());
    Path::new("/airlock").join(airlock_core::secret::hex(&digest[..6]))
}

/// Where a server sees the instance directory `dir` ([`inside_prefix`]).
pub fn inside(dir: &InstanceDir) -> PathBuf {
    match (dir.root.parent(), dir.root.file_name()) {
        (Some(parent), Some(name)) => inside_prefix(parent).join(name),
        _ => dir.root.clone(),
    }
}

/// What a contained server sees of the host: the system trees, the private
/// directories, and its instance directory at [`inside`] (its configuration,
/// data and socket) and at its own path (where a Redis-only sandbox's `exec`
/// code, which joins this view, works and finds the socket).
fn view(dir: &InstanceDir) -> Result<airlock_host::rootfs::View> {
    let mut view = airlock_host::rootfs::View::system(true)?.with_private_dirs()?;
    view.bind(&dir.root, &dir.root, true)?;
    view.bind(&dir.root, &inside(dir), true)?;
    Ok(view)
}

/// Starts the server of `dir` as `user` (in new namespaces and `cgroups` when
/// the daemon is root, like a PostgreSQL server), its output to its log;
/// returns its pid once it answers the admin.
pub async fn start(
    dir: &InstanceDir,
    (user, group): (&Identity, Option<nix::unistd::Gid>),
    cgroups: &[std::ffi::CString],
    network: Option<&airlock_host::contain::Network>,
) -> Result<i32> {
    let log = airlock_host::storage::tree::open_log(&dir.redis_log())?;
    // Its configuration is readable by its own group only (its server, and its
    // own sandbox's `exec` code), never by other sandboxes.
    if nix::unistd::geteuid().is_root() {
        let gid = group.unwrap_or(user.gid);
        nix::unistd::chown(&dir.redis_conf(), None, Some(gid)).map_err(std::io::Error::from)?;
        std::fs::set_permissions(dir.redis_conf(), std::os::unix::fs::PermissionsExt::from_mode(0o640))?;
    }
    let file_limit = file_limit(dir)?;
    let mut cmd = airlock_host::spawn::Command::new(binary()?);
    cmd.arg(InstanceDir { root: inside(dir) }.redis_conf())
        .env("PATH", "/usr/bin:/bin")
        .stdio(None, Some(log.try_clone()?.into()), Some(log.into()))
        .process_group();
    let spawned = if nix::unistd::geteuid().is_root() {
        // The socket is made in the server's primary group: with a socket
        // group (`exec` code's), that one, so `exec` reaches it as it reaches
        // PostgreSQL's.
        let primary = Identity { gid: group.unwrap_or(user.gid), ..user.clone() };
        let who = airlock_host::contain::Who::of(&primary, group);
        let view = view(dir)?;
        let network = network.map(|n| n.try_clone()).transpose()?;
        // SAFETY: containment and the file bound make only system calls on
        // the child itself, and allocate nothing.
        unsafe {
            cmd.spawn(&mut || {
                let enter = airlock_host::contain::Enter::New(&view, network.as_ref());
                airlock_host::contain::contain(who, cgroups, enter)?;
                bound_files(file_limit)
            })
        }
    } else {
        // SAFETY: as above.
        unsafe { cmd.spawn(&mut || bound_files(file_limit)) }
    };
    let mut child = spawned.map_err(|e| {
        Error::new(
            ErrorCode::RedisFailed,
            format!("could not start redis-server: {e}"),
            "see `airlock doctor`",
        )
    })?;
    let pid = child.id();
    let began = std::time::Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(failed(dir, &format!("redis-server exited ({status})")));
        }
        if let Ok(mut admin) = Admin::connect(dir).await {
            if admin.call(&["PING"]).await.is_ok_and(|r| r == Reply::Status("PONG".into())) {
                break;
            }
        }
        if began.elapsed() > Duration::from_secs(30) {
            let _ =
                nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            return Err(failed(dir, "redis-server did not answer within 30 s"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::spawn(async move {
        let _ = child.wait().await;
    });
    Ok(pid)
}

/// The most bytes any file the server writes may hold: as much as the whole
/// sandbox's memory (four times its `maxmemory`), and 64 MiB more. Its saved
/// data never needs more; its log (which a script can fill with `redis.log`)
/// is cut there.
fn file_limit(dir: &InstanceDir) -> Result<u64> {
    let conf = airlock_host::storage::tree::read_small(&dir.redis_conf(), 64 << 10)?;
    let max_memory = conf
        .lines()
        .find_map(|l| l.strip_prefix("maxmemory "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .ok_or_else(|| Error::internal("a Redis configuration names no maxmemory"))?;
    Ok(max_memory.saturating_mul(4).saturating_add(64 << 20))
}

/// Bounds the files the server writes to `limit` bytes; past it a write fails
/// (EFBIG) rather than the server being killed by SIGXFSZ. Run between fork
/// and exec.
fn bound_files(limit: u64) -> std::io::Result<()> {
    use nix::sys::resource::{setrlimit, Resource};
    use nix::sys::signal::{signal, SigHandler, Signal};
    setrlimit(Resource::RLIMIT_FSIZE, limit, limit)?;
    // SAFETY: setting a signal's disposition to ignored is async-signal-safe,
    // and an ignored disposition is kept across exec.
    unsafe { signal(Signal::SIGXFSZ, SigHandler::SigIgn) }.map_err(std::io::Error::from)?;
    Ok(())
}

fn failed(dir: &InstanceDir, what: &str) -> Error {
    let tail = airlock_host::contain::log_tail(&dir.redis_log());
    Error::new(ErrorCode::RedisFailed, format!("{what}: {}", tail.trim()), "the server's log is quoted above")
}

/// The pid of the server of `dir`: the one its pid file names, if that
/// process is a Redis server whose command line names this instance's socket
/// or configuration (the file is the server's, so it is only a hint).
pub fn find(dir: &InstanceDir) -> Option<i32> {
    let text = airlock_host::storage::tree::read_small(&dir.redis_dir().join("redis.pid"), 64).ok()?;
    let pid: i32 = text.trim().parse().ok().filter(|p| *p > 0)?;
    let comm = std::fs::read(format!("/proc/{pid}/comm")).ok()?;
    if !comm.starts_with(b"redis-server") {
        return None;
    }
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let seen = InstanceDir { root: inside(dir) };
    let (conf, socket) = (seen.redis_conf(), seen.redis_socket());
    let marks = [conf.as_os_str().as_encoded_bytes(), socket.as_os_str().as_encoded_bytes()];
    marks.iter().any(|m| cmdline.windows(m.len()).any(|w| w == *m)).then_some(pid)
}

/// Every Redis server whose command line names a path under one of
/// `parents` (as its server sees it: [`inside_prefix`]), with that command
/// line: servers of a data root's sandboxes and builds.
pub fn servers_under(parents: &[PathBuf]) -> Vec<(i32, String)> {
    let marks: Vec<Vec<u8>> = parents
        .iter()
        .map(|p| {
            let mut mark = inside_prefix(p).into_os_string().into_encoded_bytes();
            mark.push(b'/');
            mark
        })
        .collect();
    let Ok(procs) = std::fs::read_dir("/proc") else { return Vec::new() };
    procs
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read(entry.path().join("comm")).ok()?;
            if !comm.starts_with(b"redis-server") {
                return None;
            }
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            marks
                .iter()
                .any(|m| cmdline.windows(m.len()).any(|w| w == m.as_slice()))
                .then(|| (pid, String::from_utf8_lossy(&cmdline).into_owned()))
        })
        .collect()
}

/// Stops the server of `dir`, if one runs, and its process group.
pub async fn stop(dir: &InstanceDir) {
    if let Some(pid) = find(dir) {
        kill(pid).await;
    }
}

/// Stops the server whose pid is `pid` (if it is still `redis-server`) and its
/// process group. The server is held by a pidfd before it is looked at, and
/// its end is the pidfd's: a zombie whose parent (pid 1, for a server an
/// earlier daemon started) has not reaped it yet is not waited for.
pub async fn kill(pid: i32) {
    let Ok(Some(server)) = airlock_host::pidfd::Pidfd::open(pid) else { return };
    let is_redis = std::fs::read(format!("/proc/{pid}/comm"))
        .is_ok_and(|c| String::from_utf8_lossy(&c).trim().starts_with("redis-server"));
    if !is_redis {
        return;
    }
    // Held, so not reaped (a zombie keeps its pid): the pid, and its group,
    // are still its, and the group may hold a child of its own (a BGSAVE's).
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    server.exits_within(Duration::from_secs(2)).await;
}

/// Connects to the server of `dir`, within 5 s, and checks who listens: the
/// socket is in a directory the server's user owns, so a link or another
/// listener could stand there, and would be handed the admin's or the agent's
/// `AUTH`. The peer must run as the owner of the instance's `redis/` directory
/// (an entry of the root-owned instance directory, which that user cannot
/// replace).
pub async fn connect(dir: &InstanceDir) -> std::io::Result<UnixStream> {
    use std::os::unix::fs::MetadataExt;
    let stream = tokio::time::timeout(Duration::from_secs(5), UnixStream::connect(dir.redis_socket()))
        .await
        .map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::TimedOut, "redis-server did not accept within 5 s")
        })??;
    let owner = std::fs::symlink_metadata(dir.redis_dir())?.uid();
    let peer = stream.peer_cred()?.uid();
    if peer != owner {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("the Redis socket is served by uid {peer}, not the instance's user {owner}"),
        ));
    }
    Ok(stream)
}

/// An admin connection to a server.
pub struct Admin {
    stream: BufStream<UnixStream>,
}

impl Admin {
    /// Connects to the server of `dir` and authenticates as the admin.
    pub async fn connect(dir: &InstanceDir) -> Result<Admin> {
        let password = std::fs::read_to_string(dir.redis_admin())?;
        let stream =
            connect(dir).await.map_err(|e| Error::internal(format!("reaching redis-server: {e}")))?;
        let mut admin = Admin { stream: BufStream::new(stream) };
        match admin.call(&["AUTH", ADMIN_USER, &password]).await? {
            Reply::Status(_) => Ok(admin),
            other => Err(Error::internal(format!("redis-server refused the admin: {other:?}"))),
        }
    }

    /// Sends a command and reads its reply (within 60 s).
    pub async fn call<S: AsRef<[u8]>>(&mut self, args: &[S]) -> Result<Reply> {
        tokio::time::timeout(Duration::from_secs(60), resp::call(&mut self.stream, args))
            .await
            .map_err(|_| Error::internal("redis-server did not answer within 60 s"))?
            .map_err(|e| Error::internal(format!("talking to redis-server: {e}")))
    }

    /// Keys in every database, and the memory the data takes.
    pub async fn describe(&mut self) -> Result<(u64, u64)> {
        let info = self.call(&["INFO", "ALL"]).await?.text().unwrap_or_default();
        let mut keys = 0;
        let mut memory = 0;
        for line in info.lines() {
            if let Some(rest) = line.strip_prefix("db").and_then(|l| l.split_once(':')).map(|(_, r)| r) {
                keys += rest
                    .split(',')
                    .find_map(|kv| kv.strip_prefix("keys="))
                    .and_then(|k| k.parse::<u64>().ok())
                    .unwrap_or(0);
            }
            if let Some(m) = line.strip_prefix("used_memory:") {
                memory = m.trim().parse().unwrap_or(0);
            }
        }
        Ok((keys, memory))
    }

    /// How many clients other than this session are connected (a busy
    /// server, one running a script, answers with an error instead).
    pub async fn other_clients(&mut self) -> Result<u64> {
        let reply = self.call(&["INFO", "clients"]).await?;
        let info = reply.text().ok_or_else(|| Error::internal(format!("INFO clients answered {reply:?}")))?;
        let connected = info.lines().find_map(|l| l.strip_prefix("connected_clients:"));
        let connected: u64 = connected
            .and_then(|n| n.trim().parse().ok())
            .ok_or_else(|| Error::internal("INFO clients named no connected_clients"))?;
        Ok(connected.saturating_sub(1))
    }

    /// Makes `user` read-only, or lets it write again (a pool member claimed
    /// with other access than it was made with).
    pub async fn set_read_only(&mut self, user: &str, read_only: bool) -> Result<()> {
        let rules = user_rules(read_only);
        let mut args = vec!["ACL", "SETUSER", user];
        args.extend(rules.split_whitespace());
        match self.call(&args).await? {
            Reply::Status(_) => Ok(()),
            other => Err(Error::internal(format!("redis-server did not take the user's rules: {other:?}"))),
        }
    }

    /// Gives `user` the password `password` (and no other).
    pub async fn set_password(&mut self, user: &str, password: &str) -> Result<()> {
        match self.call(&["ACL", "SETUSER", user, "resetpass", &hashed(password)]).await? {
            Reply::Status(_) => Ok(()),
            other => Err(Error::internal(format!("redis-server did not take the new password: {other:?}"))),
        }
    }

    /// Holds every other client's writes (and the expiry and eviction of
    /// keys) for up to `limit`, from now until [`Admin::resume_writes`]: the
    /// data set stays as it is. Reads go on.
    pub async fn hold_writes(&mut self, limit: Duration) -> Result<()> {
        let ms = limit.as_millis().to_string();
        match self.call(&["CLIENT", "PAUSE", ms.as_str(), "WRITE"]).await? {
            Reply::Status(_) => Ok(()),
            other => Err(Error::internal(format!("redis-server could not hold its writes: {other:?}"))),
        }
    }

    /// Lets the writes [`Admin::hold_writes`] held go on.
    pub async fn resume_writes(&mut self) -> Result<()> {
        match self.call(&["CLIENT", "UNPAUSE"]).await? {
            Reply::Status(_) => Ok(()),
            other => Err(Error::internal(format!("redis-server could not resume its writes: {other:?}"))),
        }
    }

    /// Writes the data set to `dump.rdb` in the server's directory, now.
    pub async fn save(&mut self) -> Result<()> {
        match self.call(&["SAVE"]).await? {
            Reply::Status(_) => Ok(()),
            other => Err(Error::internal(format!("redis-server could not save: {other:?}"))),
        }
    }
}

/// The URL a client reaches the server of `dir` with, as `user`.
pub fn socket_url(dir: &InstanceDir, user: &str, password: &str) -> String {
    format!("unix://{user}:{password}@{}", dir.redis_socket().display())
}

/// The port `exec` code reaches a contained server at, on loopback in its
/// sandbox's own network namespace (the daemon's, [`crate::loopback`]).
pub const EXEC_PORT: u16 = 6379;

/// The URL `exec` code reaches the server of `dir` with, as `user`: a
/// `redis://` URL on loopback (inside the sandbox's network namespace, the
/// server's alone), which every client takes (redis-cli, redis-py, ioredis,
/// node-redis), when servers run contained; else the unix socket's.
pub fn exec_url(dir: &InstanceDir, user: &str, password: &str) -> String {
    match contained() {
        true => format!("redis://{user}:{password}@127.0.0.1:{EXEC_PORT}/0"),
        false => socket_url(dir, user, password),
    }
}

/// Whether `dir` holds a Redis server's configuration.
pub fn configured(dir: &InstanceDir) -> bool {
    dir.redis_conf().is_file()
}

/// The RDB file in a generation or sandbox directory's Redis part.
pub fn rdb(root: &Path) -> PathBuf {
    root.join("redis").join("dump.rdb")
}
