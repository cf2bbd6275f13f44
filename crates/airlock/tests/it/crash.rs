//! Crashes tell the truth: whatever instant the daemon dies at, the next start
//! leaves every listed sandbox answering, resets completed, migration forks
//! gone and nothing leaked. Targeted kills use the daemon's crash points
//! (`AIRLOCK_CRASH_AT`), which die with SIGKILL exactly where a power cut could;
//! the mixed-load test kills at random instants.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{dsn, psql_within, sql, Daemon};

/// How long a listed sandbox may take to answer after a restart.
const ANSWER: Duration = Duration::from_secs(2);

/// The scheduler state letter of a process (`T` when stopped).
fn process_state(pid: i32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()).unwrap_or('?')
}

/// Restarts a daemon that died at a crash point, without one this time.
fn restart_clean(d: &mut Daemon) {
    d.wait_died(Duration::from_secs(60));
    d.crash_at = None;
    d.spawn();
}

/// Every listed sandbox answers within [`ANSWER`] and nothing is left over:
/// one server per running sandbox, one directory per sandbox, no stopped process.
fn assert_consistent(d: &Daemon, dsns: &std::collections::HashMap<String, String>) {
    // What the restart found half-made or expired is torn down in the
    // background: the state to check is the one after.
    d.wait_for(Duration::from_secs(60), "the restart's deletions to end", || {
        !d.json(&["ls"]).as_array().unwrap().iter().any(|sb| sb["state"] == "deleting")
    });
    let listed = d.json(&["ls"]);
    let listed = listed.as_array().unwrap();
    let mut running = 0;
    for sb in listed {
        let id = sb["id"].as_str().unwrap();
        assert_ne!(sb["state"], "resetting", "{id} is left half-reset");
        assert_ne!(sb["state"], "creating", "{id} is left half-made");
        if sb["state"] == "running" {
            running += 1;
        }
        if let Some(dsn) = dsns.get(id) {
            // A suspended one wakes on this connection; either way it must answer.
            let answer = psql_within(dsn, "SELECT 1", ANSWER + Duration::from_secs(3));
            assert_eq!(answer.as_deref(), Ok("1"), "listed sandbox {id} does not answer; log:\n{}", d.log());
        }
    }
    let ids: Vec<String> = listed.iter().map(|s| s["id"].as_str().unwrap().to_owned()).collect();
    let mut dirs = d.sandbox_dirs();
    dirs.retain(|dir| !d.pooled_ids().contains(dir));
    let mut sorted = ids.clone();
    sorted.sort();
    dirs.sort();
    assert_eq!(dirs, sorted, "a directory for each listed sandbox, and no other");
    for pid in d.postmasters() {
        assert_ne!(process_state(pid), 'T', "server {pid} is left stopped");
    }
    assert!(d.postmasters().len() >= running, "a server for every running sandbox");
    // No cgroup outlives its sandbox, and no half-built golden is left.
    let tag = airlock_core::layout::Layout::new(&d.home).tag();
    let live: Vec<String> = ids.iter().cloned().chain(d.pooled_ids()).collect();
    let fs = std::path::Path::new("/sys/fs/cgroup");
    let hierarchies = std::fs::read_dir(fs).into_iter().flatten().flatten().map(|e| e.path());
    for root in std::iter::once(fs.to_path_buf()).chain(hierarchies) {
        for dir in std::fs::read_dir(root.join("airlock").join(&tag)).into_iter().flatten().flatten() {
            let name = dir.file_name().to_string_lossy().into_owned();
            if dir.path().is_dir() && name.starts_with("sb-") {
                assert!(live.contains(&name), "cgroup {} outlived its sandbox", dir.path().display());
            }
        }
    }
    assert!(std::fs::read_dir(d.home.join("volume/staging")).unwrap().next().is_none(), "staging is empty");
    // Whatever instant the daemon died at, its audit chain holds.
    let verified = d.cli(&["audit", "verify"]);
    assert_eq!(verified.code, 0, "the audit chain is broken: {verified:?}");
}

#[test]
fn a_daemon_that_dies_while_a_branch_pauses_its_source_leaves_the_source_answering() {
    let mut d = Daemon::start(&[]);
    d.shop("shop");
    let source = d.fork("shop", &[]);
    let id = source["id"].as_str().unwrap().to_owned();
    d.kill9();
    d.crash_at = Some("branch.paused".into());
    d.spawn();
    let cut = d.cli(&["branch", &id]);
    assert_eq!(cut.code, 9, "{cut:?}");
    assert!(cut.stderr.contains("stopped before it answered"), "a clear error: {cut:?}");
    d.wait_died(Duration::from_secs(60));
    // Frozen by its cgroup's freezer (uninterruptible, `D`), or stopped (`T`)
    // where the host has none.
    let state = process_state(d.postmaster_of(&id));
    assert!(matches!(state, 'D' | 'T'), "the crash left the source frozen: {state}");
    restart_clean(&mut d);
    assert_eq!(psql_within(&dsn(&source), "SELECT count(*) FROM orders", ANSWER).as_deref(), Ok("1000"));
    assert_eq!(d.ids(), [id.as_str()], "the half-made branch is gone");
    let branch = d.json(&["branch", &id]);
    assert_eq!(sql(&dsn(&branch), "SELECT count(*) FROM orders"), "1000");
}

#[test]
fn a_reset_cut_short_is_completed_at_start_keeping_id_address_and_credential() {
    for point in ["reset.begun", "reset.stopped"] {
        let mut d = Daemon::start(&[]);
        d.shop("shop");
        let sb = d.fork("shop", &["--name", "kept"]);
        let id = sb["id"].as_str().unwrap().to_owned();
        sql(&dsn(&sb), "CREATE TABLE scratch (x int); DELETE FROM orders");
        d.kill9();
        d.crash_at = Some(point.into());
        d.spawn();
        let cut = d.cli(&["reset", &id]);
        assert_eq!(cut.code, 9, "{point}: {cut:?}");
        restart_clean(&mut d);
        let shown = d.json(&["show", &id]);
        assert_eq!(shown["state"], "running", "{point}");
        assert_eq!(shown["name"], "kept", "{point}");
        assert_eq!(d.ok(&["dsn", &id]).trim(), dsn(&sb), "{point}: same address and credential");
        let orders = psql_within(&dsn(&sb), "SELECT count(*) FROM orders", ANSWER);
        assert_eq!(orders.as_deref(), Ok("1000"), "{point}: back to the golden's rows");
        assert!(
            psql_within(&dsn(&sb), "SELECT * FROM scratch", ANSWER).is_err(),
            "{point}: its own table gone"
        );
        let events = d.json(&["events", "--sandbox", &id]);
        let reset = events.as_array().unwrap().iter().find(|e| e["kind"] == "reset").expect("a reset event");
        assert_eq!(reset["detail"]["completed_after_restart"], true, "{point}");
        assert_consistent(&d, &[(id.clone(), dsn(&sb))].into_iter().collect());
    }
}

#[test]
fn a_migration_test_cut_by_a_crash_leaves_no_fork_and_its_client_is_told() {
    let mut d = Daemon::start(&[]);
    d.golden(
        "app",
        "CREATE TABLE t (id int PRIMARY KEY, v text);",
        "INSERT INTO t SELECT g, 'x' FROM generate_series(1, 100) g;",
    );
    let keep = d.fork("app", &[]);
    let file = d.home.join("m.sql");
    std::fs::write(&file, "ALTER TABLE t ADD COLUMN w int;").unwrap();
    d.kill9();
    d.crash_at = Some("migrate.forked".into());
    d.spawn();
    let cut = d.cli(&["migrate", "test", "--golden", "app", file.to_str().unwrap()]);
    assert_eq!(cut.code, 9, "{cut:?}");
    assert!(cut.stderr.contains("stopped before it answered"), "{cut:?}");
    restart_clean(&mut d);
    // Torn down in the background once the API answers: within a minute, not
    // at its TTL (the default, 15 minutes).
    let kept = [keep["id"].as_str().unwrap().to_owned()];
    d.wait_for(Duration::from_secs(60), "the test's fork to be gone at start, not at its TTL", || {
        d.ids() == kept
    });
    let events = d.json(&["events", "--limit", "200"]);
    let orphaned =
        events.as_array().unwrap().iter().any(|e| e["kind"] == "deleted" && e["reason"] == "orphan");
    assert!(orphaned, "its deletion is recorded as an orphan's: {events}");
    // The reserved label cannot be used to make a sandbox look like one.
    let (_, err) = d.fails(&["fork", "app", "--label", "airlock=migration-test"]);
    assert_eq!(err["code"], "invalid_label");
}

#[test]
fn killed_at_random_under_mixed_load_the_daemon_restarts_to_sandboxes_that_answer() {
    let mut d = Daemon::start(&[]);
    d.shop("shop");
    let file = d.home.join("m.sql");
    std::fs::write(&file, "ALTER TABLE orders ADD COLUMN note text;").unwrap();
    let mut dsns = std::collections::HashMap::new();
    let mut rng = 0x9e3779b97f4a7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let began = Instant::now();
    for round in 0..6 {
        // Some sandboxes to work on.
        while dsns.len() < 3 {
            let sb = d.fork("shop", &[]);
            dsns.insert(sb["id"].as_str().unwrap().to_owned(), dsn(&sb));
        }
        let ids: Vec<String> = dsns.keys().cloned().collect();
        let mut load = vec![
            d.spawn_cli(&["branch", &ids[0]]),
            d.spawn_cli(&["reset", &ids[1]]),
            d.spawn_cli(&["migrate", "test", "--golden", "shop", file.to_str().unwrap()]),
            d.spawn_cli(&["suspend", &ids[2]]),
            d.spawn_cli(&["fork", "shop"]),
        ];
        if round % 2 == 1 {
            load.push(d.spawn_cli(&["wake", &ids[2]]));
            load.push(d.spawn_cli(&["rm", &ids[0]]));
        }
        std::thread::sleep(Duration::from_millis(50 + next() % 700));
        // The work runs inside the daemon; the clients only wait. They go first,
        // so none of them starts a daemon of its own when this one vanishes.
        for mut c in load {
            let _ = c.kill();
            let _ = c.wait();
        }
        d.kill9();
        d.spawn();
        // What the clients made meanwhile is listed now; learn their DSNs.
        // One the restart found half-made is `deleting`, torn down in the
        // background, and may be gone by the time it is asked about.
        let listed = d.json(&["ls"]);
        let live: Vec<&str> = listed
            .as_array()
            .unwrap()
            .iter()
            .filter(|sb| sb["state"] != "deleting")
            .map(|sb| sb["id"].as_str().unwrap())
            .collect();
        dsns.retain(|id, _| live.contains(&id.as_str()));
        for id in live {
            if !dsns.contains_key(id) {
                dsns.insert(id.to_owned(), d.ok(&["dsn", id]).trim().to_owned());
            }
        }
        assert_consistent(&d, &dsns);
    }
    assert!(began.elapsed() < Duration::from_secs(600), "the rounds stay bounded");
}

#[test]
fn races_between_golden_operations_end_in_clear_errors_and_leave_nothing_half_made() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    for round in 0..3 {
        let refresh = d.spawn_cli_output(&["golden", "refresh", "shop", "--json"]);
        std::thread::sleep(Duration::from_millis(30 * round));
        let rm = d.spawn_cli_output(&["golden", "rm", "shop", "--force", "--json"]);
        let pool = d.spawn_cli_output(&["golden", "pool", "shop", "--size", "1", "--json"]);
        for (what, child) in [("refresh", refresh), ("rm", rm), ("pool", pool)] {
            let out: crate::harness::Out = child.wait_with_output().unwrap().into();
            if out.code != 0 {
                let err: Value = serde_json::from_str(&out.stdout)
                    .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {out:?}"));
                let code = err["error"]["code"].as_str().unwrap();
                assert!(
                    ["golden_in_use", "golden_not_found"].contains(&code),
                    "{what} answered {code}: {out:?}\nlog:\n{}",
                    d.log()
                );
            }
        }
        let listed = d.json(&["golden", "ls"]);
        let exists = listed.as_array().unwrap().iter().any(|g| g["name"] == "shop");
        let dir = d.home.join("volume/goldens/shop");
        if exists {
            let golden = d.json(&["golden", "show", "shop"]);
            for g in golden["generations"].as_array().unwrap() {
                let generation = g["generation"].as_i64().unwrap().to_string();
                assert!(
                    dir.join(generation).join("pgdata/PG_VERSION").exists(),
                    "a listed generation has its files"
                );
            }
            let sb = d.fork("shop", &[]);
            assert_eq!(sql(&dsn(&sb), "SELECT count(*) FROM orders"), "1000");
            d.ok(&["rm", sb["id"].as_str().unwrap()]);
        } else {
            assert!(!dir.exists(), "round {round}: a removed golden leaves no directory");
            d.shop("shop");
        }
    }
}

#[test]
fn the_cli_ends_quietly_when_its_reader_goes() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    for _ in 0..3 {
        d.fork("shop", &[]);
    }
    for args in [&["ls"][..], &["events", "--json"], &["golden", "ls"]] {
        let mut child = std::process::Command::new(crate::harness::BIN)
            .args(args)
            .env("AIRLOCK_HOME", &d.home)
            .env("AIRLOCK_ROUTER", &d.router)
            .env("AIRLOCK_REDIS_ROUTER", &d.redis_router)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The reader goes before a byte is read, as `| head -0` would.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
    }
}
