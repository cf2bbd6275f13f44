//! `airlock exec`: agent-written code inside the sandbox's boundary, and egress.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{dsn, sql, Daemon};

/// Runs a bash script through `airlock exec --json`; the CLI exits with the script's code.
fn exec(d: &Daemon, id: &str, script: &str, timeout: &str) -> Value {
    d.exec(id, script, timeout)
}

#[test]
fn exec_runs_agent_code_with_database_url_and_returns_its_output() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let id = sb["id"].as_str().unwrap();
    let r = exec(
        &d,
        id,
        "psql \"$DATABASE_URL\" -XtAc 'SELECT count(*) FROM orders'; echo oops >&2; exit 3",
        "30s",
    );
    assert_eq!(r["stdout"].as_str().unwrap().trim(), "1000");
    assert_eq!(r["stderr"].as_str().unwrap().trim(), "oops");
    assert_eq!(r["exit_code"], 3);
    assert_eq!(r["timed_out"], false);
    // The plain CLI passes output through and exits with the command's code.
    let out = d.cli(&["exec", id, "--", "bash", "-c", "echo hi; exit 7"]);
    assert_eq!(out.code, 7);
    assert_eq!(out.stdout, "hi\n");
    // Changes it makes land in its own sandbox only.
    exec(&d, id, "psql \"$DATABASE_URL\" -Xqc 'DELETE FROM orders'", "30s");
    assert_eq!(sql(&dsn(&sb), "SELECT count(*) FROM orders"), "0");
    assert_eq!(sql(&dsn(&d.fork("shop", &[])), "SELECT count(*) FROM orders"), "1000");
    // The DSN is in the environment, never on a command line.
    let r = exec(
        &d,
        id,
        "cat /proc/$$/cmdline | tr '\\0' ' '; echo; env | grep -c '^DATABASE_URL=postgresql://'",
        "30s",
    );
    let (_, password) = crate::harness::split_password(&dsn(&sb));
    assert!(!r["stdout"].as_str().unwrap().lines().next().unwrap().contains(&password));
    assert!(r["stdout"].as_str().unwrap().ends_with("1\n"));
}

#[test]
fn exec_times_out_and_leaves_no_process_behind() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let id = d.fork("shop", &[])["id"].as_str().unwrap().to_owned();
    let marker = format!("airlock-stray-{}", std::process::id());
    let t = Instant::now();
    let out = d.cli(&[
        "exec",
        &id,
        "--timeout",
        "1s",
        "--",
        "bash",
        "-c",
        &format!("setsid bash -c 'exec -a {marker} sleep 600' & sleep 600"),
    ]);
    assert_eq!(out.code, 124, "{out:?}");
    assert!(t.elapsed() < Duration::from_secs(10));
    let strays: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("cmdline")).ok())
        .filter(|c| c.contains(&marker))
        .collect();
    if nix::unistd::geteuid().is_root() {
        assert!(strays.is_empty(), "left behind: {strays:?}");
    }
    for (args, code) in [
        (&["exec", "--json", &id, "--timeout", "2h", "--", "true"][..], "invalid_request"),
        (&["exec", "--json", "sb-nope", "--", "true"][..], "sandbox_not_found"),
    ] {
        let out = d.cli(args);
        assert_ne!(out.code, 0);
        assert!(out.stdout.contains(code), "{out:?}");
    }
}

#[test]
fn deleting_a_sandbox_kills_its_running_exec() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let id = d.fork("shop", &[])["id"].as_str().unwrap().to_owned();
    let t = Instant::now();
    std::thread::scope(|s| {
        let running = s.spawn(|| d.cli(&["exec", &id, "--timeout", "10m", "--", "sleep", "600"]));
        std::thread::sleep(Duration::from_millis(500));
        d.ok(&["rm", &id]);
        let out = running.join().unwrap();
        assert_ne!(out.code, 0);
    });
    assert!(t.elapsed() < Duration::from_secs(30), "exec outlived its sandbox");
}

#[test]
fn no_egress_from_exec_or_from_the_server() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let (d, api) = Daemon::start_with_tcp("t0ken-of-the-exec-test");
    d.shop("shop");
    let id = d.fork("shop", &[])["id"].as_str().unwrap().to_owned();
    // Something else listening on the host's loopback.
    let outside = TcpListener::bind("127.0.0.1:0").unwrap();
    let outside_port = outside.local_addr().unwrap().port();
    let sock = d.socket();
    for (what, script) in [
        ("the daemon's TCP API", format!("exec 3<>/dev/tcp/{}", api.replace(':', "/"))),
        ("a host service on loopback", format!("exec 3<>/dev/tcp/127.0.0.1/{outside_port}")),
        ("the daemon's unix socket", format!("exec 3<>'{}' || python3 -c 'import socket; s=socket.socket(socket.AF_UNIX); s.connect(\"{}\")'", sock.display(), sock.display())),
        ("DNS", "getent hosts deb.debian.org".to_owned()),
    ] {
        let r = exec(&d, &id, &script, "20s");
        assert_ne!(r["exit_code"], 0, "exec reached {what}: {r}");
    }
    // The same connection from the server's own network namespace fails too.
    let pid = d.postmasters()[0];
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .args(["bash", "-c", &format!("exec 3<>/dev/tcp/127.0.0.1/{outside_port}")])
        .output()
        .unwrap();
    assert!(!out.status.success(), "the server's namespace reached the host");
    // From the host itself both are reachable, so the refusals above are the sandbox's doing.
    assert!(std::net::TcpStream::connect(("127.0.0.1", outside_port)).is_ok());
    assert!(std::net::TcpStream::connect(&api).is_ok());
    drop(d);
}

#[test]
fn exec_wakes_a_suspended_sandbox_and_keeps_it_from_idle_suspend() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let id = d.fork("shop", &["--idle-suspend", "1s"])["id"].as_str().unwrap().to_owned();
    d.ok(&["suspend", &id]);
    // Three seconds of work without a query: past the idle time, yet not suspended.
    let out = exec(&d, &id, "sleep 3; psql \"$DATABASE_URL\" -XtAc 'SELECT count(*) FROM orders'", "30s");
    assert_eq!(out["exit_code"], 0, "{out}");
    assert_eq!(out["stdout"].as_str().unwrap().trim(), "1000");
    let kinds = d.event_kinds(&id);
    assert_eq!(kinds.iter().filter(|k| *k == "woken").count(), 1, "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| *k == "suspended").count(), 1, "{kinds:?}");
}

#[test]
fn files_go_in_and_come_back_and_a_link_left_in_the_workspace_leads_nowhere() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let id = sb["id"].as_str().unwrap();
    let local = std::path::PathBuf::from(format!("/tmp/airlock-exec-files-{}", std::process::id()));
    std::fs::create_dir_all(&local).unwrap();
    let l = |name: &str| local.join(name).display().to_string();
    std::fs::write(local.join("query.sql"), "SELECT count(*) FROM orders").unwrap();
    let (put, get) =
        (format!("{}:sql/query.sql", l("query.sql")), format!("out/count.txt:{}", l("count.txt")));
    let out = d.cli(&[
        "exec",
        id,
        "--put",
        &put,
        "--get",
        &get,
        "--",
        "bash",
        "-c",
        "mkdir -p out && psql \"$DATABASE_URL\" -XtAf sql/query.sql > out/count.txt",
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(std::fs::read_to_string(local.join("count.txt")).unwrap().trim(), "1000");

    // The workspace outlives a run; what the agent plants there is refused.
    let plant = d.cli(&[
        "exec",
        id,
        "--",
        "bash",
        "-c",
        "rm -rf out; ln -s /etc out; ln -s /etc/shadow pw; ln /etc/hostname hard 2>/dev/null; true",
    ]);
    assert_eq!(plant.code, 0, "{plant:?}");
    let r = d.cli(&[
        "exec",
        id,
        "--json",
        "--get",
        "out/shadow:/dev/null",
        "--get",
        "pw:/dev/null",
        "--",
        "true",
    ]);
    let r: Value = serde_json::from_str(&r.stdout).unwrap_or_else(|_| panic!("{r:?}"));
    for f in r["files"].as_array().unwrap() {
        assert!(f["content_base64"].is_null() && f["missing"].is_string(), "{r}");
    }
    let shadow = std::fs::read("/etc/shadow").unwrap();
    std::fs::write(local.join("x"), "mine").unwrap();
    let over_link = format!("{}:pw", l("x"));
    let into_link = format!("{}:out/x", l("x"));
    assert_eq!(d.cli(&["exec", id, "--put", &over_link, "--", "true"]).code, 0);
    assert_eq!(std::fs::read("/etc/shadow").unwrap(), shadow, "a put went through a link");
    let refused = d.cli(&["exec", id, "--put", &into_link, "--json", "--", "true"]);
    assert_eq!(refused.code, 3, "{refused:?}");
    assert!(!std::path::Path::new("/etc/x").exists());
    let escape = d.cli(&["exec", id, "--get", "../../../etc/passwd", "--json", "--", "true"]);
    assert_eq!(escape.code, 3, "{escape:?}");
    std::fs::remove_dir_all(&local).unwrap();
}
