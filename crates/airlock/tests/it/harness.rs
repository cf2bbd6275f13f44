//! A real daemon on a private data root, driven through the real CLI, with real
//! PostgreSQL instances and the real psql client.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_airlock");

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Where test data roots go: the XFS volume `make test` mounts (AIRLOCK_TEST_XFS),
/// else the temp directory.
pub fn cow_base() -> Option<PathBuf> {
    std::env::var_os("AIRLOCK_TEST_XFS").map(PathBuf::from).filter(|p| p.is_dir())
}

/// A directory on the host's own filesystem for data roots: /tmp, except as root,
/// where every sandbox gets a private /tmp and so no data root may live there.
pub fn plain_base() -> PathBuf {
    if !nix::unistd::geteuid().is_root() {
        return std::env::temp_dir();
    }
    let base = PathBuf::from("/var/lib/airlock-test-plain");
    std::fs::create_dir_all(&base).unwrap();
    base
}

/// A number no other call in this test process gets.
pub fn counter() -> u32 {
    COUNTER.fetch_add(1, Ordering::SeqCst)
}

/// A fresh, unique directory name under `base`.
pub fn fresh_home(base: &Path) -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let home = base.join(format!("al-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    home
}

/// A CLI run's result.
#[derive(Debug)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Out {
    fn from(o: Output) -> Self {
        Out {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

/// A daemon serving one private data root; everything under it is removed on drop.
pub struct Daemon {
    pub home: PathBuf,
    /// The router's address, the same across restarts so DSNs stay valid.
    pub router: String,
    /// The Redis front door's address, likewise.
    pub redis_router: String,
    /// The MCP gateway's address (port 0: the daemon picks a free one).
    pub gateway: String,
    /// The flags `airlock serve` gets (kept across restarts).
    pub args: Vec<String>,
    child: Option<Child>,
    /// A limit on the daemon's open files (soft and hard), when a test sets one.
    open_files: Option<u64>,
    /// The crash point the next spawned daemon dies at (`AIRLOCK_CRASH_AT`).
    pub crash_at: Option<String>,
    /// A bash script the daemon is started through (it ends with `exec "$@"`),
    /// to leave the daemon something inherited, as a launcher would.
    pub launch_script: Option<String>,
    /// Environment variables the daemon gets besides the harness's own.
    pub env: Vec<(String, String)>,
}

impl Daemon {
    /// A daemon on the copy-on-write test volume if there is one, else on /tmp.
    pub fn start(args: &[&str]) -> Daemon {
        let base = cow_base().unwrap_or_else(plain_base);
        Daemon::start_in(&base, args)
    }

    /// A daemon whose data root is under `base`.
    pub fn start_in(base: &Path, args: &[&str]) -> Daemon {
        let mut d = Daemon::unstarted(fresh_home(base), args);
        d.spawn_fresh();
        d
    }

    /// A daemon that also serves the API on a free loopback TCP port with `token`;
    /// returns it and the `host:port`.
    pub fn start_with_tcp(token: &str) -> (Daemon, String) {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let home = fresh_home(&cow_base().unwrap_or_else(plain_base));
        std::fs::create_dir_all(&home).unwrap();
        let token_file = home.join("token");
        std::fs::write(&token_file, format!("{token}\n")).unwrap();
        let addr = format!("127.0.0.1:{port}");
        let mut d = Daemon::unstarted(home, &["--tcp", &addr, "--token-file", token_file.to_str().unwrap()]);
        d.spawn_fresh();
        let addr = d.args[1].clone();
        (d, addr)
    }

    /// A daemon that may hold at most `limit` open files.
    pub fn start_with_open_files(limit: u64, args: &[&str]) -> Daemon {
        let mut d = Daemon::unstarted(fresh_home(&cow_base().unwrap_or_else(plain_base)), args);
        d.open_files = Some(limit);
        d.spawn_fresh();
        d
    }

    /// The daemon's pid.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("a running daemon").id() as i32
    }

    /// The postmaster serving one sandbox.
    pub fn postmaster_of(&self, id: &str) -> i32 {
        self.postmasters()
            .into_iter()
            .find(|p| cmdline(*p).is_some_and(|c| c.contains(&format!("/{id}/pgdata"))))
            .unwrap_or_else(|| panic!("no postmaster for {id}"))
    }

    /// A data root with no daemon yet (the CLI may start one itself).
    pub fn unstarted(home: PathBuf, args: &[&str]) -> Daemon {
        let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let router = format!("127.0.0.1:{}", free());
        let redis_router = format!("127.0.0.1:{}", free());
        // The gateway picks its own free port: no test needs its URL to survive a restart.
        let gateway = "127.0.0.1:0".to_owned();
        Daemon {
            home,
            router,
            redis_router,
            gateway,
            args: args.iter().map(|s| s.to_string()).collect(),
            child: None,
            open_files: None,
            crash_at: None,
            launch_script: None,
            env: Vec::new(),
        }
    }

    /// One request to the REST API on its unix socket; returns the status and body.
    pub fn api(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        let mut s = std::os::unix::net::UnixStream::connect(self.socket()).unwrap();
        http(&mut s, method, path, "", body)
    }

    pub fn socket(&self) -> PathBuf {
        self.home.join("airlock.sock")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.home.join("daemon.log")).unwrap_or_default()
    }

    /// The daemon's log and the tail of every sandbox's server log, for a failure message.
    pub fn logs(&self) -> String {
        let mut out = format!("daemon log:\n{}", self.log());
        for dir in std::fs::read_dir(self.home.join("volume/sandboxes")).into_iter().flatten().flatten() {
            let log = std::fs::read_to_string(dir.path().join("postgres.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            out.push_str(&format!(
                "\n{}:\n{}",
                dir.file_name().to_string_lossy(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ));
        }
        out
    }

    /// Starts a new daemon's first `airlock serve`. Its ports were found free
    /// by binding and letting go, so a test running beside it can take one in
    /// between: a start that fails so is tried again on other ports.
    fn spawn_fresh(&mut self) {
        for _ in 0..4 {
            let log_len = self.log().len();
            match self.try_spawn() {
                Ok(()) => return,
                Err(_)
                    if self
                        .log()
                        .get(log_len..)
                        .is_some_and(|new| new.contains("Address already in use")) =>
                {
                    let free =
                        || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
                    self.router = format!("127.0.0.1:{}", free());
                    self.redis_router = format!("127.0.0.1:{}", free());
                    if let Some(i) = self.args.iter().position(|a| a == "--tcp") {
                        self.args[i + 1] = format!("127.0.0.1:{}", free());
                    }
                }
                Err(log) => panic!("the daemon did not start; log:\n{log}"),
            }
        }
        panic!("the daemon found no free port; log:\n{}", self.log());
    }

    /// Starts `airlock serve` and waits until its socket answers.
    pub fn spawn(&mut self) {
        if let Err(log) = self.try_spawn() {
            panic!("the daemon did not start; log:\n{log}");
        }
    }

    /// `spawn`, with the daemon's log as the error when it exits or does not answer.
    fn try_spawn(&mut self) -> Result<(), String> {
        std::fs::create_dir_all(&self.home).unwrap();
        // A killed daemon's socket path may still lead to a listener held by a
        // child between fork and exec; only the new daemon's socket counts.
        let _ = std::fs::remove_file(self.socket());
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(self.home.join("daemon.log")).unwrap();
        let mut cmd = match self.open_files {
            // prlimit sets the limit, then becomes the daemon.
            Some(n) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={n}:{n}")).arg("--").arg(BIN);
                c
            }
            None => match &self.launch_script {
                Some(script) => {
                    let mut c = Command::new("bash");
                    c.args(["-c", script, "bash", BIN]);
                    c
                }
                None => Command::new(BIN),
            },
        };
        cmd.arg("serve")
            .args(&self.args)
            .env("AIRLOCK_HOME", &self.home)
            .env("AIRLOCK_LOG", "debug")
            .env("AIRLOCK_ROUTER", &self.router)
            .env("AIRLOCK_REDIS_ROUTER", &self.redis_router)
            .env("AIRLOCK_GATEWAY", &self.gateway)
            .env(airlock_core::crashpoint::ENV, self.crash_at.as_deref().unwrap_or(""))
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0);
        self.child = Some(cmd.spawn().expect("airlock serve starts"));
        self.wait_answering()
    }

    fn wait_answering(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::os::unix::net::UnixStream::connect(self.socket()).is_err() {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                return Err(format!("daemon exited ({status}):\n{}", self.log()));
            }
            if Instant::now() >= deadline {
                return Err(format!("daemon did not answer:\n{}", self.log()));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// Runs `airlock serve` expecting it to refuse to start; returns its output.
    pub fn serve_fails(&mut self) -> String {
        std::fs::create_dir_all(&self.home).unwrap();
        let out = Command::new(BIN)
            .arg("serve")
            .args(&self.args)
            .env("AIRLOCK_HOME", &self.home)
            .env("AIRLOCK_ROUTER", &self.router)
            .env("AIRLOCK_REDIS_ROUTER", &self.redis_router)
            .env("AIRLOCK_GATEWAY", &self.gateway)
            .stdin(Stdio::null())
            .output()
            .expect("airlock serve runs");
        assert!(!out.status.success(), "the daemon started");
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    }

    /// SIGKILL to the daemon only (sandboxes keep running).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits for the daemon to die on its own (at a crash point), then reaps it.
    pub fn wait_died(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let Some(child) = self.child.as_mut() else { return };
        while child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "the daemon did not die; log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child = None;
    }

    /// Starts the CLI against this data root in the background (output discarded).
    pub fn spawn_cli(&self, args: &[&str]) -> Child {
        Command::new(BIN)
            .args(args)
            .env("AIRLOCK_HOME", &self.home)
            .env("AIRLOCK_ROUTER", &self.router)
            .env("AIRLOCK_REDIS_ROUTER", &self.redis_router)
            .env("AIRLOCK_GATEWAY", &self.gateway)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("airlock runs")
    }

    /// Starts the CLI in the background with its output captured.
    pub fn spawn_cli_output(&self, args: &[&str]) -> Child {
        Command::new(BIN)
            .args(args)
            .env("AIRLOCK_HOME", &self.home)
            .env("AIRLOCK_ROUTER", &self.router)
            .env("AIRLOCK_REDIS_ROUTER", &self.redis_router)
            .env("AIRLOCK_GATEWAY", &self.gateway)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("airlock runs")
    }

    /// Runs the CLI against this data root.
    pub fn cli(&self, args: &[&str]) -> Out {
        self.cli_with(args, None)
    }

    /// Runs the CLI with something on stdin.
    pub fn cli_with(&self, args: &[&str], stdin: Option<&str>) -> Out {
        let mut cmd = Command::new(BIN);
        // A daemon the CLI starts itself must not take the router's default port.
        cmd.args(args)
            .env("AIRLOCK_HOME", &self.home)
            .env("AIRLOCK_ROUTER", &self.router)
            .env("AIRLOCK_REDIS_ROUTER", &self.redis_router)
            .env("AIRLOCK_GATEWAY", &self.gateway)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        let mut child = cmd.spawn().expect("airlock runs");
        if let Some(text) = stdin {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        }
        child.wait_with_output().unwrap().into()
    }

    /// Runs a bash script in sandbox `id` through `airlock exec --json`; its result.
    pub fn exec(&self, id: &str, script: &str, timeout: &str) -> Value {
        let out = self.cli(&["exec", "--json", id, "--timeout", timeout, "--", "bash", "-c", script]);
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}"))
    }

    /// Runs the CLI and insists it succeeds; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert_eq!(out.code, 0, "airlock {args:?} failed: {out:?}\nlog:\n{}", self.log());
        out.stdout
    }

    /// Runs the CLI with --json and insists it succeeds.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        let text = self.ok(&all);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
    }

    /// Runs the CLI with --json and insists it fails; returns the exit code and the error object.
    pub fn fails(&self, args: &[&str]) -> (i32, Value) {
        let mut all = args.to_vec();
        all.push("--json");
        let out = self.cli(&all);
        assert_ne!(out.code, 0, "airlock {args:?} should have failed: {out:?}");
        let v: Value =
            serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}"));
        let err = v["error"].clone();
        assert!(err["message"].as_str().is_some_and(|m| !m.is_empty()), "error has a message: {v}");
        assert!(err["hint"].as_str().is_some_and(|m| !m.is_empty()), "error has a hint: {v}");
        (out.code, err)
    }

    /// Makes a golden from SQL text (written to files under the data root).
    pub fn golden(&self, name: &str, schema: &str, seed: &str) -> Value {
        let dir = self.home.join("sql");
        std::fs::create_dir_all(&dir).unwrap();
        let schema_file = dir.join(format!("{name}-schema.sql"));
        let seed_file = dir.join(format!("{name}-seed.sql"));
        std::fs::write(&schema_file, schema).unwrap();
        std::fs::write(&seed_file, seed).unwrap();
        self.json(&[
            "golden",
            "create",
            name,
            "--schema",
            schema_file.to_str().unwrap(),
            "--seed",
            seed_file.to_str().unwrap(),
        ])
    }

    /// A small golden with an `orders` table of 1,000 rows (250 pending).
    pub fn shop(&self, name: &str) -> Value {
        self.golden(
            name,
            "CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL, total numeric NOT NULL);",
            "INSERT INTO orders SELECT g, (ARRAY['pending','paid','shipped','cancelled'])[1 + g % 4], g * 1.5 \
             FROM generate_series(1, 1000) g;",
        )
    }

    /// Forks and returns the JSON answer.
    pub fn fork(&self, golden: &str, extra: &[&str]) -> Value {
        let mut args = vec!["fork", golden];
        args.extend_from_slice(extra);
        self.json(&args)
    }

    /// The kinds of a sandbox's lifecycle events, oldest first (each credential
    /// handed out is an event too, `credential_issued`, left out here: every
    /// `show` and `dsn` makes one; `audit.rs` tests them).
    pub fn event_kinds(&self, sandbox: &str) -> Vec<String> {
        let events = self.json(&["events", "--sandbox", sandbox]);
        lifecycle(&events).into_iter().map(|e| e["kind"].as_str().unwrap().to_owned()).collect()
    }

    /// Branches the sandbox whose DSN is given; returns the branch's DSN.
    pub fn fork_branch(&self, source_dsn: &str) -> String {
        let id = self
            .json(&["ls"])
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_owned())
            .find(|id| source_dsn.contains(&format!("/{id}?")) || source_dsn.contains(&format!("/{id}/run")))
            .expect("source sandbox");
        self.ok(&["branch", &id]).trim().to_owned()
    }

    /// Sandbox ids the daemon lists.
    pub fn ids(&self) -> Vec<String> {
        self.json(&["ls"]).as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_owned()).collect()
    }

    /// Directories under volume/sandboxes.
    /// Ids of warm-pool members (never listed), read from the state store.
    pub fn pooled_ids(&self) -> Vec<String> {
        let db = rusqlite::Connection::open(self.home.join("state.db")).unwrap();
        let mut stmt = db.prepare("SELECT id FROM sandboxes WHERE state = 'pooled'").unwrap();
        stmt.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect()
    }

    pub fn sandbox_dirs(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.home.join("volume/sandboxes"))
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        v.sort();
        v
    }

    /// Pids of postmasters serving data directories under this data root.
    pub fn postmasters(&self) -> Vec<i32> {
        postmasters_under(&self.home)
    }

    /// Pids of Redis servers serving sockets under this data root.
    pub fn redis_servers(&self) -> Vec<i32> {
        redis_servers_under(&self.home)
    }

    /// The cgroups (one per sandbox or build) left under this data root's
    /// parent cgroup, by name, in whichever hierarchy the host has.
    pub fn cgroups(&self) -> Vec<String> {
        let tag = airlock_core::layout::Layout::new(&self.home).tag();
        let parents = [
            PathBuf::from("/sys/fs/cgroup/airlock").join(&tag),
            PathBuf::from("/sys/fs/cgroup/memory/airlock").join(&tag),
            PathBuf::from("/sys/fs/cgroup/pids/airlock").join(&tag),
        ];
        let mut names: Vec<String> = parents
            .iter()
            .filter_map(|p| std::fs::read_dir(p).ok())
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Waits until `cond` holds, for up to `limit`.
    pub fn wait_for(&self, limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + limit;
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}; log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
        // A daemon the CLI started on its own is not our child: find it by its lock.
        for pid in processes_mentioning(&self.home) {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        // Immediate shutdown first: it removes the server's System V segment, which
        // SIGKILL would leave behind until the host runs out of segment ids.
        let servers = postmasters_under(&self.home);
        for pid in &servers {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), nix::sys::signal::Signal::SIGQUIT);
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while servers.iter().any(|p| alive(*p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        for pid in servers {
            let _ =
                nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        // Sandboxes' (and goldens') Redis servers outlive a killed daemon too.
        for pid in redis_servers_under(&self.home) {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(50));
        for parent in ["sandboxes", "staging"] {
            for dir in
                std::fs::read_dir(self.home.join("volume").join(parent)).into_iter().flatten().flatten()
            {
                remove_segment_named_in(&dir.path().join("pgdata/postmaster.pid"));
            }
        }
        let volume = self.home.join("volume");
        if is_mount_point(&volume) {
            let _ = Command::new("umount").arg("-l").arg(&volume).status();
        }
        remove_cgroups(&self.home);
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

/// Removes a killed daemon's cgroups (its sandboxes' and its data root's own),
/// which nobody else would: the next daemon of a data root cleans up after the
/// last, but a test's data root has no next daemon.
fn remove_cgroups(home: &Path) {
    let tag = airlock_core::layout::Layout::new(home).tag();
    let fs = Path::new("/sys/fs/cgroup");
    let hierarchies = std::fs::read_dir(fs).into_iter().flatten().flatten().map(|e| e.path());
    for root in std::iter::once(fs.to_path_buf()).chain(hierarchies) {
        let dir = root.join("airlock").join(&tag);
        for child in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if child.path().is_dir() {
                let _ = std::fs::remove_dir(child.path());
            }
        }
        let _ = std::fs::remove_dir(&dir);
    }
}

/// Removes the System V segment a dead server's `postmaster.pid` names. As root
/// each server has an IPC namespace of its own, whose segments go with it (and
/// whose ids mean nothing here).
fn remove_segment_named_in(pidfile: &Path) {
    if nix::unistd::geteuid().is_root() {
        return;
    }
    let text = std::fs::read_to_string(pidfile).unwrap_or_default();
    let shmid =
        text.lines().nth(6).and_then(|l| l.split_whitespace().nth(1)).and_then(|s| s.parse::<i32>().ok());
    if let Some(shmid) = shmid {
        // SAFETY: IPC_RMID with a null buffer only marks the segment for removal.
        unsafe {
            nix::libc::shmctl(shmid, nix::libc::IPC_RMID, std::ptr::null_mut());
        }
    }
}

pub fn is_mount_point(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(path), path.parent().map(std::fs::metadata)) {
        (Ok(a), Some(Ok(b))) => a.dev() != b.dev(),
        _ => false,
    }
}

fn cmdline(pid: i32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(String::from_utf8_lossy(&raw).replace('\0', " "))
}

fn pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit_once(')').map(|(_, r)| !r.trim_start().starts_with('Z')).unwrap_or(false))
        .unwrap_or(false)
}

/// Postmasters (processes run with `-D DIR`) whose DIR is under `root`.
pub fn postmasters_under(root: &Path) -> Vec<i32> {
    let needle = format!("-D {}/", root.display());
    let serves = |p: i32| alive(p) && cmdline(p).is_some_and(|c| c.contains(&needle));
    // A backend the postmaster has just forked carries its command line until it
    // sets its own title: count only processes whose parent is not a server too.
    pids().into_iter().filter(|p| serves(*p) && !parent(*p).is_some_and(serves)).collect()
}

fn parent(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

/// Redis servers serving a socket under this data root (its sandboxes' or
/// its builds', as their servers see them).
fn redis_servers_under(home: &Path) -> Vec<i32> {
    let volume = home.join("volume");
    airlock_redis::server::servers_under(&[volume.join("sandboxes"), volume.join("staging")])
        .into_iter()
        .map(|(pid, _)| pid)
        .collect()
}

/// Airlock daemons whose environment names this data root.
pub fn processes_mentioning(home: &Path) -> Vec<i32> {
    let needle = format!("AIRLOCK_HOME={}", home.display());
    pids()
        .into_iter()
        .filter(|p| {
            cmdline(*p).is_some_and(|c| c.contains(" serve") || c.contains(" router --spec"))
                && std::fs::read(format!("/proc/{p}/environ"))
                    .map(|e| e.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()))
                    .unwrap_or(false)
        })
        .collect()
}

/// Runs SQL with psql over a DSN; Ok(stdout) or Err(stderr). The password goes by environment.
pub fn psql(dsn: &str, sql: &str) -> Result<String, String> {
    psql_by(Command::new("psql"), dsn, sql)
}

/// [`psql`] run by `psql`, a command that runs psql (inside a network
/// namespace, say) with the arguments it is given.
pub fn psql_by(mut psql: Command, dsn: &str, sql: &str) -> Result<String, String> {
    let (plain, password) = split_password(dsn);
    let out = psql
        .arg(plain)
        .args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .env("PGPASSWORD", password)
        .env("PGCONNECT_TIMEOUT", "10")
        .stdin(Stdio::null())
        .output()
        .expect("psql runs");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Starts psql running `sql` in the background (the password in its environment).
pub fn spawn_psql(dsn: &str, sql: &str) -> std::process::Child {
    spawn_psql_by(Command::new("psql"), dsn, sql)
}

/// [`spawn_psql`] with a command that runs psql (inside a namespace, say).
pub fn spawn_psql_by(mut psql: Command, dsn: &str, sql: &str) -> std::process::Child {
    let (plain, password) = split_password(dsn);
    psql.arg(plain)
        .args(["-XtAc", sql])
        .env("PGPASSWORD", password)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("psql starts")
}

/// Splits `postgresql://user:pw@/db?...` into the DSN without the password, and the password.
pub fn split_password(dsn: &str) -> (String, String) {
    let rest = dsn.strip_prefix("postgresql://").expect("URL DSN");
    let (userinfo, tail) = rest.split_once('@').expect("userinfo");
    let (user, pw) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    (format!("postgresql://{user}@{tail}"), pw.to_owned())
}

/// Runs SQL with psql, giving up (Err) if no answer came within `limit`.
pub fn psql_within(dsn: &str, sql: &str, limit: Duration) -> Result<String, String> {
    let (plain, password) = split_password(dsn);
    let out = Command::new("timeout")
        .arg(format!("{}", limit.as_secs_f64()))
        .arg("psql")
        .arg(plain)
        .args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .env("PGPASSWORD", password)
        .stdin(Stdio::null())
        .output()
        .expect("psql runs");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else if out.status.code() == Some(124) {
        Err(format!("no answer within {limit:?}"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// psql that must succeed.
pub fn sql(dsn: &str, q: &str) -> String {
    psql(dsn, q).unwrap_or_else(|e| panic!("{q} failed: {e}"))
}

/// A list of events without the `credential_issued` ones (see `Daemon::event_kinds`).
pub fn lifecycle(events: &Value) -> Vec<Value> {
    events.as_array().unwrap().iter().filter(|e| e["kind"] != "credential_issued").cloned().collect()
}

/// The DSN field of a fork answer.
pub fn dsn(v: &Value) -> String {
    v["dsn"].as_str().expect("dsn").to_owned()
}

/// One raw HTTP/1.0 request on `stream`; returns the status and the body.
pub fn http(
    stream: &mut dyn ReadWrite,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> (u16, String) {
    let host = if headers.contains("Host:") { "" } else { "Host: x\r\n" };
    let req = format!(
        "{method} {path} HTTP/1.0\r\n{host}Content-Type: application/json\r\nContent-Length: {}\r\n{headers}\r\n{body}",
        body.len()
    );
    stream.write_all(req.as_bytes()).unwrap();
    let mut resp = String::new();
    stream.read_to_string(&mut resp).unwrap();
    let status = resp[9..12].parse().unwrap();
    let body = resp.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

/// A byte stream both ways (a unix or TCP socket).
pub trait ReadWrite: std::io::Read + std::io::Write {}
impl<T: std::io::Read + std::io::Write> ReadWrite for T {}
