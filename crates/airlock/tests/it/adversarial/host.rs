//! What is shared with everyone else on the host: the kernel's tables
//! (pseudo-terminals, open files) and the daemon itself (its descriptors, its
//! judgement of which servers are alive, its deletions). A tenant, or a local
//! user with no credential at all, must not be able to use them up or fool them.

use std::io::Read;
use std::net::TcpStream;
use std::os::unix::fs::MetadataExt;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::Scene;
use crate::harness::{dsn, http, sql, Daemon};

fn root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Open descriptors of a process.
fn descriptors(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// The uid a sandbox's `exec` code runs as (one above its server's).
fn exec_uid(d: &Daemon, id: &str) -> u32 {
    std::fs::metadata(d.home.join("volume/sandboxes").join(id).join("pgdata")).unwrap().uid() + 1
}

/// Live processes of `uid` on the host.
fn processes_of(uid: u32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let running = !status.contains("State:\tZ");
            running
                && status
                    .lines()
                    .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some(&uid.to_string()))
        })
        .collect()
}

#[test]
fn exec_gets_a_few_pseudo_terminals_of_its_own_and_a_dev_with_nothing_else() {
    if !root() {
        return;
    }
    let s = Scene::new();
    let before: u64 = std::fs::read_to_string("/proc/sys/kernel/pty/nr").unwrap().trim().parse().unwrap();
    let r = s.d.exec(
        &s.id,
        "python3 -c '
import os
held = []
try:
    while len(held) < 5000:
        held.append(os.open(\"/dev/ptmx\", os.O_RDWR | os.O_NOCTTY))
except OSError as e:
    print(len(held), e.errno)
print(open(\"/proc/sys/kernel/pty/nr\").read().strip())
'; ls /dev | tr '\\n' ' '",
        "60s",
    );
    let out = r["stdout"].as_str().unwrap();
    let lines: Vec<&str> = out.lines().collect();
    let opened: usize = lines[0].split_whitespace().next().unwrap().parse().unwrap();
    assert!(opened <= 8, "exec code opened {opened} pseudo-terminals: {r}");
    let during: u64 = lines[1].trim().parse().unwrap();
    assert!(during <= before + 8 + 64, "the host's pseudo-terminal count went from {before} to {during}");
    let dev: Vec<&str> = lines[2].split_whitespace().collect();
    for node in &dev {
        let expected =
            ["full", "null", "random", "tty", "urandom", "zero", "pts", "shm", "mqueue", "ptmx", "fd"]
                .iter()
                .chain(&["stdin", "stdout", "stderr"])
                .any(|n| n == node);
        assert!(expected, "exec code sees /dev/{node}: {dev:?}");
    }
    s.untouched();
}

#[test]
fn exec_code_cannot_raise_its_open_file_limit() {
    if !root() {
        return;
    }
    let s = Scene::new();
    let r = s.d.exec(
        &s.id,
        "python3 -c '
import resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
print(soft, hard)
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard * 64, hard * 64))
    print(\"raised\")
except (ValueError, OSError) as e:
    print(\"refused\")
'",
        "30s",
    );
    let out = r["stdout"].as_str().unwrap();
    let limits: Vec<u64> =
        out.lines().next().unwrap().split_whitespace().map(|n| n.parse().unwrap()).collect();
    assert!(limits[1] <= 1024, "exec code may open {} files: {r}", limits[1]);
    assert!(out.contains("refused"), "{r}");
    s.untouched();
}

#[test]
fn a_process_that_keeps_forking_away_dies_with_its_exec() {
    if !root() {
        return;
    }
    let s = Scene::new();
    let uid = exec_uid(&s.d, &s.id);
    // Thirty chains: each generation leaves its process group, forks a successor
    // and exits, so no pid lives long enough to be found on one pass over a process list; all
    // of them hold the exec's output open.
    let script = "python3 -c '
import os, time
for chain in range(30):
    if os.fork() == 0:
        os.setsid()
        while True:
            if os.fork():
                os._exit(0)
            print(\"still here\", flush=True)
time.sleep(1)
'";
    let body = json!({"argv": ["bash", "-c", script], "timeout_seconds": 3}).to_string();
    let mut stream = std::os::unix::net::UnixStream::connect(s.d.socket()).unwrap();
    // An exec waiting on output its killed command left open would never answer.
    stream.set_read_timeout(Some(Duration::from_secs(90))).unwrap();
    let (status, answer) = http(&mut stream, "POST", &format!("/v1/sandboxes/{}/exec", s.id), "", &body);
    assert_eq!(status, 200, "{answer}");
    let result: Value = serde_json::from_str(&answer).unwrap();
    assert!(result["stdout"].as_str().unwrap().contains("still here"), "{result}");
    s.d.wait_for(Duration::from_secs(10), "the exec user's processes to be gone", || {
        processes_of(uid).is_empty()
    });
    // The server (another uid) was left alone.
    assert_eq!(sql(&s.agent, "SELECT 1"), "1");
    s.untouched();
}

#[test]
fn a_client_connecting_while_exec_code_holds_every_process_waits_for_room() {
    if !root() {
        return;
    }
    let d = Daemon::start(&["--pids-limit", "64"]);
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let (id, agent) = (sb["id"].as_str().unwrap().to_owned(), dsn(&sb));
    assert_eq!(sql(&agent, "SELECT 1"), "1");
    // Exec code takes every process the sandbox may have, for a second: its
    // server cannot fork a backend meanwhile, and says so in the old
    // protocol's form, which the router must read as "no room yet".
    let script = "python3 -c '
import os, time
kids = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(1)
            os._exit(0)
        kids += 1
except OSError:
    print(\"full after\", kids, flush=True)
time.sleep(1.5)
'";
    let exec = d.spawn_cli_output(&["exec", "--json", &id, "--timeout", "20s", "--", "bash", "-c", script]);
    std::thread::sleep(Duration::from_millis(400));
    // The agent's tools open their sessions the same way, and wait the same.
    let (status, body) = d.api("POST", &format!("/v1/sandboxes/{id}/sql"), r#"{"sql": "SELECT 1"}"#);
    assert_eq!(status, 200, "{body}\n{}", d.log());
    for _ in 0..3 {
        assert_eq!(sql(&agent, "SELECT 1"), "1", "a session while the sandbox is at its process limit");
    }
    let out = exec.wait_with_output().unwrap();
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(result["stdout"].as_str().unwrap().contains("full after"), "{result}");
}

/// The gateway's `host:port`, from an MCP URL.
fn gateway_of(url: &str) -> String {
    let rest = url.strip_prefix("http://").unwrap();
    rest.split_once("/mcp/").unwrap().0.to_owned()
}

#[test]
fn holding_gateway_connections_leaves_the_daemon_its_descriptors() {
    let s = Scene::new();
    let sb = s.d.fork("shop", &["--mcp"]);
    let url = sb["mcp_url"].as_str().unwrap().to_owned();
    let gateway = gateway_of(&url);
    let baseline = descriptors(s.d.pid());
    // A local user with no token opens connections and sends nothing.
    let held: Vec<TcpStream> = (0..700).filter_map(|_| TcpStream::connect(&gateway).ok()).collect();
    assert!(held.len() >= 600, "could open only {} connections", held.len());
    std::thread::sleep(Duration::from_millis(500));
    let during = descriptors(s.d.pid());
    assert!(
        during < baseline + 300,
        "the daemon holds {during} descriptors (from {baseline}) for 700 idle connections"
    );
    // The sandboxes are fine, and so is the router.
    assert_eq!(sql(&s.agent, "SELECT 1"), "1");
    assert!(!s.d.event_kinds(&s.id).contains(&"server_exited".to_owned()));
    // A connection that never sends a request is closed, so holders give way.
    let mut silent = held.into_iter().next().unwrap();
    silent.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(silent.read(&mut buf).unwrap_or(0), 0, "a silent connection was kept open");
    // With the holders gone, the gateway answers again.
    let path = url.split_once(&gateway).unwrap().1.to_owned();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut c = TcpStream::connect(&gateway).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let headers = "Accept: application/json, text/event-stream\r\nHost: 127.0.0.1\r\n";
        let (status, body) = http(&mut c, "POST", &path, headers, &init.to_string());
        if status == 200 {
            assert!(body.contains("\"airlock\""), "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "the gateway did not come back: {status} {body}");
    }
    s.untouched();
}

#[test]
fn a_daemon_out_of_descriptors_deletes_no_sandbox() {
    let d = Daemon::start_with_open_files(256, &[]);
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let id = sb["id"].as_str().unwrap().to_owned();
    let agent = dsn(&sb);
    sql(&agent, "CREATE TABLE kept AS SELECT 1 AS x");
    // Connections to the API (its own cap is far above this daemon's limit)
    // until the daemon cannot open a file, held while its reaper looks at the
    // servers; reopened as the daemon times them out. (The router runs in a
    // process of its own, so its clients take none of the daemon's descriptors.)
    let mut held = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !d.log().contains("could not check its server") {
        assert!(Instant::now() < deadline, "the daemon never ran out of descriptors:\n{}", d.log());
        held.retain(|c: &std::os::unix::net::UnixStream| {
            let mut probe = [0u8; 1];
            c.set_nonblocking(true).unwrap();
            !matches!((&*c).read(&mut probe), Ok(0))
        });
        while held.len() < 400 {
            match std::os::unix::net::UnixStream::connect(d.socket()) {
                Ok(c) => held.push(c),
                Err(_) => break,
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(held);
    // Give the reaper a few rounds with its descriptors back.
    std::thread::sleep(Duration::from_secs(3));
    let kinds = d.event_kinds(&id);
    assert!(!kinds.contains(&"server_exited".to_owned()), "{kinds:?}\n{}", d.log());
    assert_eq!(d.json(&["show", &id])["state"], "running");
    assert_eq!(sql(&agent, "SELECT x FROM kept"), "1");
}

#[test]
fn a_deletion_that_failed_is_taken_up_again() {
    if !root() {
        return;
    }
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let id = sb["id"].as_str().unwrap().to_owned();
    // A file nobody may remove makes the teardown fail half-way.
    let stuck = d.home.join("volume/sandboxes").join(&id).join("stuck");
    std::fs::write(&stuck, "x").unwrap();
    let chattr =
        |flag: &str| assert!(Command::new("chattr").arg(flag).arg(&stuck).status().unwrap().success());
    chattr("+i");
    let (code, _) = d.fails(&["rm", &id]);
    assert_ne!(code, 0);
    assert_eq!(d.json(&["show", &id])["state"], "deleting");
    // Asked again, the deletion is taken up (and fails again, plainly) rather
    // than waited on.
    let (code, e) = d.fails(&["rm", &id]);
    assert_ne!(code, 0, "{e}");
    chattr("-i");
    // Nobody asks a third time: the reaper finishes it.
    d.wait_for(Duration::from_secs(30), "the stalled deletion to finish", || d.cli(&["show", &id]).code != 0);
    assert!(d.event_kinds(&id).contains(&"deleted".to_owned()));
    assert!(d.postmasters().is_empty(), "a server outlived its sandbox");
}

#[test]
fn descriptors_the_daemon_inherited_reach_no_sandbox() {
    if !root() {
        return;
    }
    let base = crate::harness::cow_base().unwrap_or_else(crate::harness::plain_base);
    let mut d = Daemon::unstarted(crate::harness::fresh_home(&base), &[]);
    std::fs::create_dir_all(&d.home).unwrap();
    let (log, secret) = (d.home.join("root-log"), d.home.join("root-secret"));
    std::fs::write(&secret, "root-only secret\n").unwrap();
    std::fs::write(&log, "").unwrap();
    for f in [&log, &secret] {
        std::fs::set_permissions(f, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    }
    // A launcher that leaves a root-only file open for reading and one for writing.
    d.launch_script = Some(format!("exec 7>>{} 8<{}; exec \"$@\"", log.display(), secret.display()));
    d.spawn();
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let id = sb["id"].as_str().unwrap();
    let out = d.exec(id, "cat <&8; echo written-by-exec >&7; ls -l /proc/self/fd", "20s");
    assert!(!out["stdout"].as_str().unwrap().contains("root-only secret"), "{out}");
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "", "exec code wrote to the daemon's descriptor");
    // Nor does the server hold them.
    let postmaster = d.postmaster_of(id);
    for fd in std::fs::read_dir(format!("/proc/{postmaster}/fd")).unwrap().flatten() {
        let target = std::fs::read_link(fd.path()).unwrap_or_default();
        assert!(target != log && target != secret, "the server holds {}", target.display());
    }
}
