//! Access modes, role limits, network namespaces and noisy neighbours.

use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use crate::harness::{dsn, psql, sql, Daemon};

#[test]
fn readonly_mode_reads_and_every_write_fails_with_postgres_own_error() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let ro = d.fork("shop", &["--mode", "readonly"]);
    assert_eq!(ro["access"]["mode"], "readonly");
    let url = dsn(&ro);
    assert_eq!(sql(&url, "SELECT count(*) FROM orders WHERE status = 'pending'"), "250");
    let err = psql(&url, "DELETE FROM orders").unwrap_err();
    assert!(err.contains("cannot execute DELETE in a read-only transaction"), "{err}");
    // Turning the session read-write does not help: the in-server guard holds
    // every transaction read-only, and the role has SELECT only besides.
    let err = psql(&url, "BEGIN READ WRITE; INSERT INTO orders VALUES (9999, 'x', 1); COMMIT").unwrap_err();
    assert!(err.contains("cannot execute INSERT in a read-only transaction"), "{err}");
    for attempt in [
        "BEGIN READ WRITE; CREATE TABLE t (x int); COMMIT",
        "BEGIN READ WRITE; CREATE TEMP TABLE t (x int); COMMIT",
        "BEGIN READ WRITE; DROP TABLE orders; COMMIT",
        "BEGIN READ WRITE; ALTER TABLE orders ADD COLUMN y int; COMMIT",
        "BEGIN READ WRITE; TRUNCATE orders; COMMIT",
        "SET ROLE airlock_owner",
    ] {
        assert!(psql(&url, attempt).is_err(), "{attempt} should fail in readonly mode");
    }
    assert_eq!(sql(&url, "SELECT count(*) FROM orders"), "1000");
    // The same golden forked in owner mode can write.
    let owner = d.fork("shop", &[]);
    assert_eq!(owner["access"]["mode"], "owner");
    sql(&dsn(&owner), "CREATE TEMP TABLE scratch (x int); INSERT INTO orders VALUES (9999, 'x', 1)");
}

#[test]
fn role_limits_have_defaults_and_can_be_set_per_fork() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let def = dsn(&d.fork("shop", &[]));
    assert_eq!(sql(&def, "SHOW statement_timeout"), "30s");
    assert_eq!(sql(&def, "SHOW lock_timeout"), "10s");
    assert_eq!(sql(&def, "SHOW idle_in_transaction_session_timeout"), "1min");
    assert_eq!(sql(&def, "SHOW work_mem"), "4MB");
    assert_eq!(sql(&def, "SHOW temp_file_limit"), "1GB");
    assert_eq!(sql(&def, "SELECT rolconnlimit FROM pg_roles WHERE rolname = current_user"), "20");
    // temp_file_limit is the superuser's to change.
    assert!(psql(&def, "SET temp_file_limit = -1").is_err());

    let tight = dsn(&d.fork(
        "shop",
        &[
            "--statement-timeout",
            "300ms",
            "--work-mem",
            "64kB",
            "--temp-file-limit",
            "1MB",
            "--connection-limit",
            "2",
        ],
    ));
    let err = psql(&tight, "SELECT pg_sleep(5)").unwrap_err();
    assert!(
        err.contains("canceling statement: the sandbox's statement limit of 300 ms was reached"),
        "{err}"
    );
    let err = psql(&tight, "SET statement_timeout = '30s'; SELECT count(*) FROM (SELECT g FROM generate_series(1, 2000000) g ORDER BY g DESC) s").unwrap_err();
    assert!(err.contains("temporary file size exceeds temp_file_limit"), "{err}");
    assert_eq!(sql(&tight, "SELECT rolconnlimit FROM pg_roles WHERE rolname = current_user"), "2");

    for (flag, value) in [
        ("--connection-limit", "0"),
        ("--statement-timeout", "0s"),
        ("--work-mem", "1kB"),
        ("--mode", "admin"),
    ] {
        let (exit, err) = d.fails(&["fork", "shop", flag, value]);
        assert_eq!(err["code"], "invalid_request", "{flag} {value}: {err}");
        assert_eq!(exit, 3);
    }
    assert_eq!(d.ids().len(), 2);
}

#[test]
fn instances_have_their_own_network_namespace_with_only_loopback_when_root() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let d = Daemon::start(&[]);
    d.shop("shop");
    d.fork("shop", &[]);
    d.fork("shop", &[]);
    let host = std::fs::read_link("/proc/self/ns/net").unwrap();
    let mut seen = Vec::new();
    for pid in d.postmasters() {
        let ns = std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
        assert_ne!(ns, host, "postmaster {pid} shares the host's network namespace");
        assert!(!seen.contains(&ns), "two sandboxes share a network namespace");
        seen.push(ns);
        // Only loopback, and it is up: code inside can talk to itself, nothing else.
        let link = std::process::Command::new("nsenter")
            .arg(format!("--net=/proc/{pid}/ns/net"))
            .args(["ip", "-o", "link", "show", "lo"])
            .output()
            .unwrap();
        let link = String::from_utf8_lossy(&link.stdout);
        assert!(link.contains("LOOPBACK") && link.contains(",UP"), "{link}");
        let dev = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).unwrap();
        assert!(dev.lines().skip(2).all(|l| l.trim_start().starts_with("lo:")), "{dev}");
        let routes = std::fs::read_to_string(format!("/proc/{pid}/net/route")).unwrap();
        assert!(routes.lines().count() <= 1, "no routes: {routes}");
    }
}

#[test]
fn a_runaway_neighbour_does_not_stop_another_sandbox_answering() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let noisy = dsn(&d.fork("shop", &["--statement-timeout", "3s"]));
    let quiet = dsn(&d.fork("shop", &[]));
    let started = Instant::now();
    std::thread::scope(|s| {
        let cartesian =
            s.spawn(|| psql(&noisy, "SELECT count(*) FROM orders a, orders b, orders c, orders d"));
        let hog = s.spawn(|| {
            psql(
                &noisy,
                "SELECT length(string_agg(repeat(md5(g::text), 20), '')) FROM generate_series(1, 3000000) g",
            )
        });
        // Meanwhile the quiet sandbox keeps answering simple queries promptly.
        let mut answered = 0;
        while started.elapsed() < Duration::from_millis(2500) {
            let t = Instant::now();
            assert_eq!(sql(&quiet, "SELECT count(*) FROM orders WHERE id < 10"), "9");
            assert!(t.elapsed() < Duration::from_secs(2), "a simple query took {:?}", t.elapsed());
            answered += 1;
        }
        assert!(answered > 5, "only {answered} queries answered");
        // The hog is stopped by PostgreSQL (its statement timeout, or its own
        // allocation failing), or by its sandbox's memory cgroup, whose OOM
        // killer ends the backend; the server then ends every session of its
        // own and starts over. Any of these is containment, so long as it is
        // the server's log that says it was killed.
        let killed_for_memory = || d.logs().contains("was terminated by signal 9: Killed");
        let err = cartesian.join().unwrap().unwrap_err();
        assert!(
            err.contains("the sandbox's statement limit of 3 s was reached")
                || (err.contains("crash of another server process") && killed_for_memory()),
            "the runaway join was cancelled: {err}\n{}",
            d.logs()
        );
        let hog = hog.join().unwrap();
        assert!(
            hog.as_ref().is_err_and(|e| e.contains("the sandbox's statement limit of 3 s was reached")
                || e.contains("out of memory")
                || killed_for_memory()),
            "the memory hog was stopped: {hog:?}\n{}",
            d.logs()
        );
    });
    assert!(started.elapsed() < Duration::from_secs(20));
}

/// The uid a process runs as.
fn uid_of(pid: i32) -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}")).unwrap().uid()
}

#[test]
fn each_sandbox_runs_as_its_own_user_and_cannot_read_a_neighbours_files() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let d = Daemon::start(&[]);
    d.shop("shop");
    let a = d.fork("shop", &[]);
    let b = d.fork("shop", &[]);
    let pids = d.postmasters();
    let uids: Vec<u32> = pids.iter().map(|p| uid_of(*p)).collect();
    assert_eq!(uids.len(), 2);
    assert_ne!(uids[0], uids[1], "two sandboxes share a uid");
    assert!(uids.iter().all(|u| *u != 0));
    // As sandbox A's user, B's data directory, and the golden, cannot be read.
    let a_dir = d.home.join("volume/sandboxes").join(a["id"].as_str().unwrap());
    let b_dir = d.home.join("volume/sandboxes").join(b["id"].as_str().unwrap());
    use std::os::unix::fs::MetadataExt;
    let a_meta = std::fs::metadata(a_dir.join("pgdata")).unwrap();
    let golden = d.home.join("volume/goldens/shop/1/pgdata/PG_VERSION");
    for target in [b_dir.join("pgdata/PG_VERSION"), golden] {
        let out = std::process::Command::new("cat")
            .arg(&target)
            .uid(a_meta.uid())
            .gid(a_meta.gid())
            .output()
            .unwrap();
        assert!(!out.status.success(), "A's user read {}", target.display());
    }
    // A fork reuses a freed user only after its sandbox and files are gone.
    d.ok(&["rm", a["id"].as_str().unwrap()]);
    let c = d.fork("shop", &[]);
    assert_eq!(sql(&dsn(&c), "SELECT count(*) FROM orders"), "1000");
}

/// The cgroup2 line of this host's mountinfo: its mount point, its own
/// options and its hierarchy's options.
fn cgroup2_mount() -> Option<(String, String, std::collections::BTreeSet<String>)> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mountinfo.lines().find_map(|line| {
        let (mine, theirs) = line.split_once(" - ")?;
        let theirs: Vec<&str> = theirs.split(' ').collect();
        let mine: Vec<&str> = mine.split(' ').collect();
        (theirs[0] == "cgroup2").then(|| {
            (mine[4].to_owned(), mine[5].to_owned(), theirs[2].split(',').map(str::to_owned).collect())
        })
    })
}

/// A daemon started as root makes moves into cgroups cheap (`favordynmods`
/// on the host's cgroup2 mount), with every other option of that mount kept;
/// told not to, it leaves the mount alone. (Other tests' daemons may set the
/// option meanwhile, so the "off" daemon is judged by what it says it did.)
#[test]
fn a_daemon_favors_cgroup_moves_unless_told_not_to() {
    assert!(nix::unistd::geteuid().is_root(), "this test remounts the host's cgroup2: run it as root");
    let Some((point, mount_options, super_options)) = cgroup2_mount() else {
        let d = Daemon::start(&[]);
        assert_eq!(d.json(&["doctor"])["cgroup_moves"]["state"], "no_hierarchy");
        return;
    };
    // Take the option off, keeping the rest (the kernel keeps its cheaper
    // lock until reboot; only the option goes).
    use nix::mount::MsFlags;
    let mut flags = MsFlags::MS_REMOUNT;
    for (name, flag) in [
        ("nosuid", MsFlags::MS_NOSUID),
        ("nodev", MsFlags::MS_NODEV),
        ("noexec", MsFlags::MS_NOEXEC),
        ("relatime", MsFlags::MS_RELATIME),
        ("ro", MsFlags::MS_RDONLY),
    ] {
        if mount_options.split(',').any(|o| o == name) {
            flags |= flag;
        }
    }
    let kept: Vec<&str> = super_options
        .iter()
        .map(String::as_str)
        .filter(|o| !matches!(*o, "rw" | "ro" | "favordynmods"))
        .collect();
    nix::mount::mount(None::<&str>, point.as_str(), None::<&str>, flags, Some(kept.join(",").as_str()))
        .unwrap();
    assert!(!cgroup2_mount().unwrap().2.contains("favordynmods"));

    let off = Daemon::start(&["--favor-cgroup-moves", "off"]);
    assert!(!off.log().contains("set favordynmods"), "{}", off.log());
    let doctor = off.json(&["doctor"]);
    assert!(["waiting", "favored"].contains(&doctor["cgroup_moves"]["state"].as_str().unwrap()), "{doctor}");
    drop(off);

    let on = Daemon::start(&[]);
    let (point_now, options_now, super_now) = cgroup2_mount().unwrap();
    assert_eq!((point_now, options_now), (point.clone(), mount_options));
    let mut expected = super_options.clone();
    expected.insert("favordynmods".into());
    assert_eq!(super_now, expected);
    let doctor = on.json(&["doctor"]);
    assert_eq!(doctor["cgroup_moves"]["state"], "favored", "{doctor}");
    assert_eq!(doctor["cgroup_moves"]["mount"], point.as_str(), "{doctor}");
    assert!(!doctor["warnings"].to_string().contains("favordynmods"), "{doctor}");
}

#[test]
fn cgroup_limits_contain_a_memory_hog_to_its_own_sandbox() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let d = Daemon::start(&["--memory-limit", "200M", "--pids-limit", "64"]);
    let doctor = d.json(&["doctor"]);
    if doctor["cgroups"] == "unavailable" {
        panic!("running as root but no usable cgroups: {doctor}");
    }
    d.shop("shop");
    let hog = d.fork("shop", &["--statement-timeout", "60s", "--work-mem", "1GB"]);
    let quiet = dsn(&d.fork("shop", &[]));
    let hog_id = hog["id"].as_str().unwrap();
    // The postmaster is in its sandbox's cgroups.
    let pid = d.postmaster_of(hog_id);
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(cg.contains(&format!("/{hog_id}\n")) && cg.contains("/airlock/"), "{cg}");
    // A query that wants far more memory than the limit fails in that sandbox only.
    let err = psql(&dsn(&hog), "SELECT count(DISTINCT x) FROM (SELECT repeat(md5(g::text), 30) || g AS x FROM generate_series(1, 3000000) g) s").unwrap_err();
    assert!(
        err.contains("terminated")
            || err.contains("closed the connection")
            || err.contains("connection to server was lost")
            || err.contains("out of memory"),
        "{err}"
    );
    assert_eq!(sql(&quiet, "SELECT count(*) FROM orders"), "1000");
    // The hog's sandbox recovers and answers again.
    d.wait_for(Duration::from_secs(20), "the hog's sandbox to recover", || {
        psql(&dsn(&hog), "SELECT 1").is_ok()
    });
    let events = d.ok(&["events", "--json"]);
    assert!(!events.contains("\"reason\": \"failed\""));
    // Deleting the sandbox removes its cgroups.
    let memory_line = cg.lines().find(|l| l.contains(":memory:") || l.starts_with("0::")).unwrap();
    let cgroup_dir = match memory_line.split_once(":memory:") {
        Some((_, path)) => format!("/sys/fs/cgroup/memory{path}"),
        None => format!("/sys/fs/cgroup{}", memory_line.trim_start_matches("0::")),
    };
    assert!(std::path::Path::new(&cgroup_dir).exists(), "{cgroup_dir}");
    d.ok(&["rm", hog_id]);
    assert!(!std::path::Path::new(&cgroup_dir).exists(), "{cgroup_dir} is left behind");
}

#[test]
fn a_sandbox_that_outgrows_its_disk_limit_is_removed_with_a_clear_event() {
    let d = Daemon::start(&["--disk-limit", "20M"]);
    d.shop("shop");
    let fat = d.fork("shop", &[]);
    let thin = d.fork("shop", &[]);
    let id = fat["id"].as_str().unwrap().to_owned();
    // Small writes stay within the limit.
    sql(&dsn(&fat), "CREATE TABLE little AS SELECT g FROM generate_series(1, 1000) g");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(d.ids().contains(&id));
    let _ = psql(
        &dsn(&fat),
        "CREATE TABLE big AS SELECT g, repeat('x', 1000) AS pad FROM generate_series(1, 60000) g",
    );
    d.wait_for(Duration::from_secs(15), "the oversized sandbox to be removed", || !d.ids().contains(&id));
    let events = d.json(&["events", "--sandbox", &id]);
    let kinds: Vec<&str> = events.as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"disk_limit_exceeded"), "{kinds:?}");
    assert_eq!(events.as_array().unwrap().last().unwrap()["reason"], "quota");
    assert_eq!(sql(&dsn(&thin), "SELECT count(*) FROM orders"), "1000");
    assert!(d.ids().contains(&thin["id"].as_str().unwrap().to_owned()));
}
