//! The executor attached to a grant: agent code run in a disposable boundary
//! whose only reachable address is the grant.
//!
//! Each run gets, and gives back at its end: an OS identity leased for it
//! alone, cgroups of its own, a network namespace of its own with only
//! loopback, a root of its own (the host's system trees read-only, private
//! temporary directories) with a private workspace at `/work`, the
//! system-call filter, and a timeout. In its namespace one address answers,
//! `127.0.0.1:5432`, which the daemon listens on from outside and joins to the
//! router: `DATABASE_URL` names the grant there, so the code reaches the grant
//! and nothing else (not the target's own address, not the daemon's API, not
//! the internet). When the command ends, or its time is up, every process of
//! its identity is killed, the files asked for are brought back, the
//! workspace, cgroups and namespace go, and the grant ends.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use airlock_core::error::{Error, ErrorCode, Result};
use airlock_host::contain::{Enter, Network, Who};
use airlock_host::users::Identity;
use airlock_lifecycle::doors::TlsMode;
use airlock_lifecycle::executor::{files, run};
use airlock_lifecycle::sandbox::{ExecRequest, ExecResult};

use super::Live;

/// Where code inside reaches the grant.
const INSIDE: ([u8; 4], u16) = ([127, 0, 0, 1], 5432);
/// The workspace, as code inside sees it.
const WORKSPACE: &str = "/work";
/// What the workspace holds at most: a tmpfs of this size, its pages charged
/// to the memory of whoever wrote them (the run's cgroup), so a run fills
/// neither the host's disk nor more than its own memory.
const WORKSPACE_BYTES: u64 = 256 << 20;

fn invalid(message: String, hint: &str) -> Error {
    Error::new(ErrorCode::InvalidRequest, message, hint)
}

/// What a run holds, given back when dropped (also when the request is cut).
struct Boundary<'a> {
    live: &'a Live,
    holder: String,
    user: Identity,
    dir: std::path::PathBuf,
    bridge: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Boundary<'_> {
    fn drop(&mut self) {
        if let Some(bridge) = self.bridge.take() {
            bridge.abort();
        }
        let engine = &self.live.engine;
        let _ = nix::mount::umount2(&self.dir.join("work"), nix::mount::MntFlags::MNT_DETACH);
        engine.cgroups.remove(&self.holder);
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %self.dir.display(), error = %e, "an executor's workspace could not be removed");
            }
        }
        if let Some(leases) = &engine.leases {
            leases.release(self.user.uid.as_raw(), &self.holder);
        }
    }
}

impl Live {
    /// Runs a command attached to grant `id`, then ends the grant.
    pub async fn exec(&self, id: &str, req: &ExecRequest) -> Result<ExecResult> {
        if req.argv.is_empty() || req.argv[0].is_empty() {
            return Err(invalid(
                "no command given".into(),
                "put the command after `--`, e.g. `airlock exec --grant ID -- python3 job.py`",
            ));
        }
        let timeout = req.timeout_seconds.unwrap_or(60);
        if !(1..=3600).contains(&timeout) {
            return Err(invalid(
                format!("a timeout of {timeout}s is out of range"),
                "give between 1s and 1h",
            ));
        }
        let put = files::check(&req.files, &req.get)?;
        let grant = self.grant_of(id)?;
        let password = self.store().grant_password(id)?.ok_or_else(|| super::grant::grant_not_found(id))?;
        let engine = &self.engine;
        let (Some(leases), true) = (&engine.leases, engine.daemon_user.is_root()) else {
            return Err(Error::new(
                ErrorCode::InvalidRequest,
                "an executor needs the daemon to run as root (an identity and a network of its own)",
                "run `airlock serve` as root",
            ));
        };
        let router = engine.router.get().ok_or_else(|| {
            invalid("the router is off, and a grant is reached only through it".into(), "start the router")
        })?;
        let holder = format!(
            "exec-{}-{}",
            &id[3..],
            airlock_core::secret::hex(&airlock_core::secret::random_bytes::<4>())
        );
        let user = Identity::leased(leases.take(&holder)?);
        let dir = engine.layout.home().join("executors").join(&holder);
        let mut boundary = Boundary {
            live: self,
            holder: holder.clone(),
            user: user.clone(),
            dir: dir.clone(),
            bridge: None,
        };
        let work = dir.join("work");
        airlock_host::storage::tree::private_dir(&work)?;
        let options = format!("size={WORKSPACE_BYTES},mode=0700,uid={},gid={}", user.uid, user.gid);
        nix::mount::mount(
            Some("tmpfs"),
            &work,
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some(options.as_str()),
        )
        .map_err(|e| Error::io("mounting the executor's workspace", &std::io::Error::from(e)))?;
        files::put(&work, &put, &user)?;
        let cgroups = engine
            .cgroups
            .create(&holder, &engine.config.cgroup_limits)
            .map_err(|e| Error::io("making the executor's cgroups", &e))?;
        let network = Network::new().map_err(|e| Error::io("making the executor's network", &e))?;
        let listener = network
            .listen(std::net::SocketAddr::from(INSIDE))
            .and_then(tokio::net::TcpListener::from_std)
            .map_err(|e| Error::io("listening in the executor's network", &e))?;
        let upstream = (router.host.clone(), router.port);
        boundary.bridge = Some(tokio::spawn(bridge(listener, upstream)));
        let sslmode = if router.tls == TlsMode::Off { "disable" } else { "require" };
        let dsn = format!("postgresql://{id}:{password}@127.0.0.1:{}/{id}?sslmode={sslmode}", INSIDE.1);
        let mut view = airlock_host::rootfs::View::system(true)
            .and_then(|v| v.with_private_dirs())
            .map_err(|e| Error::io("composing the executor's root", &e))?;
        view.bind(&work, Path::new(WORKSPACE), true)
            .map_err(|e| Error::io("composing the executor's root", &e))?;
        let mut cmd = tokio::process::Command::new(&req.argv[0]);
        cmd.args(&req.argv[1..])
            .current_dir("/")
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", WORKSPACE)
            .env("LANG", "C.UTF-8")
            .env("MPLBACKEND", "Agg")
            .env("DATABASE_URL", &dsn)
            .stdin(if req.stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let who = Who::of(&user, None);
        // SAFETY: only async-signal-safe system calls run between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                airlock_host::contain::contain(who, &cgroups, Enter::NewIn(&view, &network, c"/work"))
            });
        }
        let started = Instant::now();
        let child = cmd.spawn().map_err(|e| {
            invalid(
                format!("could not run {:?}: {e}", req.argv[0]),
                "check the program exists in the executor's view (the host's /usr, /bin and /lib, read-only; \
                 PATH is /usr/local/bin:/usr/bin:/bin)",
            )
        })?;
        let kill_rest = run::kill_user(&user, || run::left_in(&engine.cgroups, &holder, user.uid));
        let ended = run::to_the_end(child, req.stdin.clone(), Duration::from_secs(timeout), kill_rest).await;
        let duration_ms = started.elapsed().as_millis() as u64;
        let files = files::get(&work, &req.get, &user);
        drop(boundary);
        if let Err(e) = self.end(&grant, "executor_ended").await {
            tracing::warn!(grant = %grant.id, error = %e.message, "ending a grant after its executor failed");
        }
        Ok(ExecResult::of(ended, duration_ms, files))
    }
}

/// Joins each connection made inside to the router, until aborted (which
/// ends every connection it joined).
async fn bridge(listener: tokio::net::TcpListener, (host, port): (String, u16)) {
    let mut joined = tokio::task::JoinSet::new();
    while let Ok((mut inside, _)) = listener.accept().await {
        let host = host.clone();
        while joined.try_join_next().is_some() {}
        joined.spawn(async move {
            let Ok(mut router) = tokio::net::TcpStream::connect((host.as_str(), port)).await else { return };
            let _ = router.set_nodelay(true);
            let _ = inside.set_nodelay(true);
            let _ = tokio::io::copy_bidirectional(&mut inside, &mut router).await;
        });
    }
}
