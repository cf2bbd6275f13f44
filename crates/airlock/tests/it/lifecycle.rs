//! TTL expiry, crashes and restarts, reconciliation, failed forks, auto-start.

use std::time::{Duration, Instant};

use crate::harness::{dsn, psql, sql, Daemon};

#[test]
fn an_expired_sandbox_is_gone_within_about_a_second() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &["--ttl", "2s"]);
    let keep = d.fork("shop", &["--ttl", "10m"]);
    let id = sb["id"].as_str().unwrap().to_owned();
    assert_eq!(sql(&dsn(&sb), "SELECT 1"), "1");
    let pids_before = d.postmasters().len();
    assert_eq!(pids_before, 2);
    // Expiry is 2 s after the fork; allow the promised second plus scheduling slack.
    d.wait_for(Duration::from_secs(5), "TTL reaping", || !d.ids().contains(&id));
    assert!(!d.sandbox_dirs().contains(&id), "files gone");
    assert_eq!(d.postmasters().len(), 1, "process gone");
    assert!(psql(&dsn(&sb), "SELECT 1").is_err());
    assert_eq!(sql(&dsn(&keep), "SELECT count(*) FROM orders"), "1000");
    let events = d.json(&["events", "--sandbox", &id]);
    let last = events.as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["kind"], "deleted");
    assert_eq!(last["reason"], "ttl");
    // Deleted within about a second of the expiry it was given.
    let expires = sb["expires_at"].as_str().unwrap();
    let deleted = last["at"].as_str().unwrap();
    let lag = parse_ms(deleted) - parse_ms(expires);
    assert!((0..1500).contains(&lag), "deleted {lag} ms after expiry");
    // Its teardown began at its expiry or after, never before (a timer wakes it).
    let began = parse_ms(deleted) - last["detail"]["delete_ms"].as_f64().unwrap().ceil() as i64;
    assert!(
        began >= parse_ms(expires) - 1,
        "its deletion began {} ms before expiry",
        parse_ms(expires) - began
    );
}

fn parse_ms(rfc3339: &str) -> i64 {
    let t = humantime::parse_rfc3339_weak(rfc3339).unwrap();
    t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

#[test]
fn sandboxes_outlive_a_daemon_crash_and_expired_ones_are_reaped_at_restart() {
    let mut d = Daemon::start(&[]);
    d.shop("shop");
    let lives = d.fork("shop", &["--ttl", "10m"]);
    let dies = d.fork("shop", &["--ttl", "2s"]);
    d.kill9();
    std::thread::sleep(Duration::from_millis(2500));
    // With no daemon (so no router), both instances still run.
    assert_eq!(sql(lives["socket_dsn"].as_str().unwrap(), "SELECT count(*) FROM orders"), "1000");
    assert_eq!(d.postmasters().len(), 2);
    d.spawn();
    // The expired one is deleted in the background once the API answers.
    let dies_id = dies["id"].as_str().unwrap().to_owned();
    d.wait_for(Duration::from_secs(10), "the expired sandbox's deletion", || !d.ids().contains(&dies_id));
    let ids = d.ids();
    assert_eq!(ids, [lives["id"].as_str().unwrap()]);
    assert_eq!(d.postmasters().len(), 1);
    assert_eq!(d.sandbox_dirs(), [lives["id"].as_str().unwrap()]);
    assert_eq!(sql(&dsn(&lives), "SELECT count(*) FROM orders"), "1000", "kept running, same credential");
    let events = d.json(&["events", "--sandbox", dies["id"].as_str().unwrap()]);
    assert_eq!(events.as_array().unwrap().last().unwrap()["reason"], "ttl");
}

/// A restart answers at once and deletes what expired while the daemon was
/// down in the background, without waiting for anyone to reap the servers it
/// stops: here nobody does, as under a pid 1 that reaps late.
#[test]
fn a_restart_deletes_what_expired_without_waiting_for_its_servers_to_be_reaped() {
    // The killed daemon's servers come to this process, which never reaps them.
    nix::sys::prctl::set_child_subreaper(true).unwrap();
    let mut d = Daemon::start(&[]);
    crate::redis::golden_with_redis(&d, "kv");
    let lives = d.fork("kv", &["--ttl", "10m"]);
    let dying: Vec<String> =
        (0..4).map(|_| d.fork("kv", &["--ttl", "3s"])["id"].as_str().unwrap().to_owned()).collect();
    let of_dying = |pid: &i32| {
        let cmdline =
            String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default())
                .into_owned();
        dying.iter().any(|id| cmdline.contains(id.as_str()))
    };
    let servers: Vec<i32> = d.postmasters().into_iter().chain(d.redis_servers()).filter(of_dying).collect();
    assert_eq!(servers.len(), 2 * dying.len(), "each sandbox runs a postmaster and a redis-server");
    d.kill9();
    std::thread::sleep(Duration::from_millis(3500));
    d.spawn();
    // Answering, with no expired sandbox running any more: each is being deleted or gone.
    for sb in d.json(&["ls"]).as_array().unwrap() {
        if dying.iter().any(|id| sb["id"] == id.as_str()) {
            assert_eq!(sb["state"], "deleting", "{sb}");
        }
    }
    d.wait_for(Duration::from_secs(20), "the expired sandboxes' deletion", || {
        d.ids() == [lives["id"].as_str().unwrap()]
    });
    for id in &dying {
        let events = d.json(&["events", "--sandbox", id]);
        let last = events.as_array().unwrap().last().unwrap().clone();
        assert_eq!(
            (last["kind"].as_str(), last["reason"].as_str()),
            (Some("deleted"), Some("ttl")),
            "{last}"
        );
        // A server's end is its pidfd's: no teardown waited out the two
        // seconds a server that does not seem to exit is given.
        let took = last["detail"]["delete_ms"].as_f64().unwrap();
        assert!(took < 1000.0, "{id} took {took} ms to delete: {last}");
    }
    // Their servers ended and were never reaped: still zombies, children of this process.
    let mut zombies = 0;
    for pid in &servers {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')) {
            zombies += 1;
        }
    }
    assert_eq!(zombies, servers.len(), "every stopped server left unreaped");
    assert_eq!(sql(&dsn(&lives), "SELECT count(*) FROM t"), "0", "the kept sandbox answers");
    // Reaped now, so nothing of this test lingers.
    while let Ok(status) = nix::sys::wait::waitpid(None, Some(nix::sys::wait::WaitPidFlag::WNOHANG)) {
        if status == nix::sys::wait::WaitStatus::StillAlive {
            break;
        }
    }
}

#[test]
fn kill_9_in_the_middle_of_forks_and_deletes_leaks_nothing() {
    let mut d = Daemon::start(&[]);
    d.shop("shop");
    let existing: Vec<String> =
        (0..3).map(|_| d.fork("shop", &[])["id"].as_str().unwrap().to_owned()).collect();
    // Fire forks and deletes at the daemon and kill it while they are in flight.
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(d.spawn_cli(&["fork", "shop", "--json"]));
    }
    for id in &existing {
        clients.push(d.spawn_cli(&["rm", id]));
    }
    std::thread::sleep(Duration::from_millis(60));
    // The work runs inside the daemon; the clients only wait. Stop them first so
    // none of them starts a fresh daemon when this one vanishes.
    for mut c in clients {
        let _ = c.kill();
        let _ = c.wait();
    }
    d.kill9();
    d.spawn();
    // After reconciliation (and the teardowns it leaves to the background),
    // state, processes and directories agree exactly.
    d.wait_for(Duration::from_secs(20), "the teardowns reconciliation started", || {
        d.json(&["ls"]).as_array().unwrap().iter().all(|sb| sb["state"] == "running")
    });
    let ids = d.ids();
    let mut dirs = d.sandbox_dirs();
    dirs.sort();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(dirs, sorted, "directories match state rows");
    assert_eq!(d.postmasters().len(), ids.len(), "one process per row, none leaked");
    for sb in d.json(&["ls"]).as_array().unwrap() {
        assert_eq!(sb["state"], "running");
        let dsn = d.ok(&["dsn", sb["id"].as_str().unwrap()]);
        assert_eq!(sql(dsn.trim(), "SELECT count(*) FROM orders"), "1000");
    }
    let staging: Vec<_> = std::fs::read_dir(d.home.join("volume/staging")).unwrap().collect();
    assert!(staging.is_empty());
}

#[test]
fn reconcile_removes_what_the_store_does_not_know() {
    let mut d = Daemon::start(&[]);
    d.shop("shop");
    let known = d.fork("shop", &[]);
    let stray = d.fork("shop", &[]);
    let stray_id = stray["id"].as_str().unwrap();
    d.kill9();
    // Make the store forget one running sandbox, and leave a stray directory.
    let db = rusqlite::Connection::open(d.home.join("state.db")).unwrap();
    db.execute("DELETE FROM sandboxes WHERE id = ?1", [stray_id]).unwrap();
    drop(db);
    std::fs::create_dir_all(d.home.join("volume/sandboxes/sb-leftover/pgdata")).unwrap();
    std::fs::create_dir_all(d.home.join("volume/staging/half-built-1-x")).unwrap();
    d.spawn();
    assert_eq!(d.ids(), [known["id"].as_str().unwrap()]);
    assert_eq!(d.sandbox_dirs(), [known["id"].as_str().unwrap()]);
    assert_eq!(d.postmasters().len(), 1);
    assert!(psql(&dsn(&stray), "SELECT 1").is_err());
    assert!(std::fs::read_dir(d.home.join("volume/staging")).unwrap().next().is_none());
    let events = d.ok(&["events", "--json"]);
    assert!(events.contains("sb-leftover"), "orphan removal is recorded");
}

#[test]
fn a_running_sandbox_whose_process_died_is_started_again() {
    let mut d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    sql(&dsn(&sb), "CREATE TABLE kept (x int); INSERT INTO kept VALUES (42)");
    d.kill9();
    for pid in d.postmasters() {
        nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    }
    d.wait_for(Duration::from_secs(5), "instance death", || d.postmasters().is_empty());
    d.spawn();
    assert_eq!(sql(&dsn(&sb), "SELECT x FROM kept"), "42", "same data, same credential");
}

#[test]
fn a_failed_fork_leaves_nothing() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    // Break the golden so postgres cannot start from it.
    std::fs::remove_file(d.home.join("volume/goldens/shop/1/pgdata/global/pg_control")).unwrap();
    let (exit, err) = d.fails(&["fork", "shop"]);
    assert_eq!(err["code"], "postgres_failed");
    assert_eq!(exit, 8);
    assert!(d.ids().is_empty());
    assert!(d.sandbox_dirs().is_empty());
    assert!(d.postmasters().is_empty());
    let events = d.json(&["events"]);
    let last = events.as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["kind"], "deleted");
    assert_eq!(last["reason"], "failed");

    // A clone that fails halfway, while the fork's server already waits in
    // its cgroups for its files (at the gate): the server never runs, and
    // nothing is left, no waiting process either.
    d.shop("shop2");
    let fifo = d.home.join("volume/goldens/shop2/1/pgdata/base/fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let (exit, err) = d.fails(&["fork", "shop2"]);
    assert_ne!(exit, 0, "{err}");
    assert!(err["message"].as_str().unwrap().contains("refusing to clone"), "{err}");
    assert!(d.ids().is_empty());
    assert!(d.sandbox_dirs().is_empty());
    assert!(d.postmasters().is_empty());
    assert!(d.cgroups().is_empty(), "cgroups left: {:?}", d.cgroups());
    let children =
        std::fs::read_to_string(format!("/proc/{}/task/{}/children", d.pid(), d.pid())).unwrap_or_default();
    for child in children.split_whitespace() {
        let cmdline = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&cmdline).contains("airlock serve"),
            "a forked child of the daemon never ran its program: {child}"
        );
    }
    std::fs::remove_file(&fifo).unwrap();
    assert_eq!(sql(&dsn(&d.fork("shop2", &[])), "SELECT count(*) FROM orders"), "1000");

    // A clone that fails in its last part, the database's files, cloned
    // while the fork's server already starts: the server is stopped and
    // nothing is left either.
    d.shop("shop3");
    let base = d.home.join("volume/goldens/shop3/1/pgdata/base");
    let database = std::fs::read_dir(&base)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("PG_VERSION").is_file() && p.file_name().unwrap() != "1")
        .expect("the golden's database directory");
    let foreign = database.join("99999");
    std::fs::write(&foreign, b"not the golden's").unwrap();
    std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).unwrap();
    let (exit, err) = d.fails(&["fork", "shop3"]);
    assert_ne!(exit, 0, "{err}");
    assert!(err["message"].as_str().unwrap().contains("belongs to another user"), "{err}");
    assert_eq!(d.ids().len(), 1, "only shop2's fork is left");
    assert_eq!(d.sandbox_dirs().len(), 1);
    assert_eq!(d.postmasters().len(), 1, "the failed fork's server was left running");
    assert_eq!(d.cgroups().len(), 1, "cgroups left: {:?}", d.cgroups());
    std::fs::remove_file(&foreign).unwrap();
    assert_eq!(sql(&dsn(&d.fork("shop3", &[])), "SELECT count(*) FROM orders"), "1000");
}

#[test]
fn the_cli_starts_a_daemon_when_none_answers_and_daemon_stop_stops_it() {
    let base = crate::harness::cow_base().unwrap_or_else(crate::harness::plain_base);
    let d = Daemon::unstarted(crate::harness::fresh_home(&base), &[]);
    let t = Instant::now();
    assert_eq!(d.json(&["ls"]).as_array().unwrap().len(), 0);
    assert!(t.elapsed() < Duration::from_secs(60));
    assert!(d.socket().exists());
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let status = d.json(&["daemon", "status"]);
    assert_eq!(status["running"], true);
    assert_eq!(status["router"]["port"].as_u64().unwrap().to_string(), d.router.rsplit(':').next().unwrap());
    d.ok(&["daemon", "stop"]);
    assert_eq!(d.cli(&["daemon", "status"]).code, 9);
    // The server keeps running, and so does the router in front of it.
    assert_eq!(sql(sb["socket_dsn"].as_str().unwrap(), "SELECT 1"), "1", "sandboxes outlive the daemon");
    assert_eq!(sql(&dsn(&sb), "SELECT 1"), "1", "the router outlives the daemon");
    // The next command starts it again, and it still knows the sandbox, at the same address.
    assert_eq!(d.ids(), [sb["id"].as_str().unwrap()]);
    assert_eq!(sql(&dsn(&sb), "SELECT 1"), "1");
}

#[test]
fn a_data_root_that_cannot_be_written_is_a_clear_error() {
    let d = Daemon::unstarted("/proc/airlock-cannot-write".into(), &[]);
    let (exit, err) = d.fails(&["ls"]);
    assert_eq!(err["code"], "data_root_not_writable");
    assert_eq!(exit, 8);
    assert!(err["message"].as_str().unwrap().contains("/proc/airlock-cannot-write"));
}

#[test]
fn a_sandbox_whose_server_dies_is_removed_with_a_clear_event() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let doomed = d.fork("shop", &[]);
    let keep = d.fork("shop", &[]);
    let id = doomed["id"].as_str().unwrap().to_owned();
    let pid = d.postmaster_of(&id);
    nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    d.wait_for(Duration::from_secs(10), "the dead sandbox to be removed", || !d.ids().contains(&id));
    assert!(!d.sandbox_dirs().contains(&id));
    let events = crate::harness::lifecycle(&d.json(&["events", "--sandbox", &id]));
    let kinds: Vec<&str> = events.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["created", "ready", "server_exited", "deleted"]);
    assert_eq!(events[3]["reason"], "failed");
    assert_eq!(sql(&dsn(&keep), "SELECT count(*) FROM orders"), "1000");
}

#[test]
fn words_an_agent_logs_cannot_make_a_dead_server_look_like_a_full_disk() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let id = sb["id"].as_str().unwrap().to_owned();
    // The server's log gets the words a full disk writes, from the agent's RAISE.
    let _ = crate::harness::psql(
        &dsn(&sb),
        "DO $$ BEGIN RAISE WARNING 'PANIC: could not write: No space left on device'; END $$",
    );
    let pid = d.postmaster_of(&id);
    nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    d.wait_for(Duration::from_secs(10), "the dead sandbox to be removed", || !d.ids().contains(&id));
    let events = d.json(&["events", "--sandbox", &id]);
    assert!(events.to_string().contains("server_exited"), "{events}");
}

/// `promote`, `branch`, `reset`, `suspend` and `rm` on one sandbox (with a
/// Redis beside its PostgreSQL), all at once, round after round: each ends in
/// success or a clear error (never `internal`), and nothing is left over: no
/// uid lease, directory, cgroup or process of a sandbox or build that is gone.
#[test]
fn racing_operations_on_one_sandbox_end_clearly_and_leak_nothing() {
    let leases = crate::harness::fresh_home(&crate::harness::plain_base());
    let d = Daemon::start(&["--lease-dir", leases.to_str().unwrap()]);
    crate::redis::golden_with_redis(&d, "race");
    for round in 0..6 {
        let sb = d.fork("race", &[]);
        let id = sb["id"].as_str().unwrap().to_owned();
        if nix::unistd::geteuid().is_root() {
            // (So that finding none at the end means something.)
            assert!(d.cgroups().contains(&id), "{id} not in {:?}", d.cgroups());
        }
        let target = format!("promoted-{round}");
        let runs: Vec<Vec<String>> = vec![
            vec!["promote".into(), id.clone(), "--golden".into(), target.clone()],
            vec!["branch".into(), id.clone()],
            vec!["reset".into(), id.clone()],
            vec!["suspend".into(), id.clone()],
            vec!["rm".into(), id.clone()],
        ];
        let outs: Vec<(Vec<String>, crate::harness::Out)> = std::thread::scope(|s| {
            let handles: Vec<_> = runs
                .iter()
                .enumerate()
                .map(|(i, args)| {
                    let d = &d;
                    s.spawn(move || {
                        // A different order each round.
                        std::thread::sleep(Duration::from_millis(((i + round) % 5) as u64 * 15));
                        let mut with_json: Vec<&str> = args.iter().map(String::as_str).collect();
                        with_json.push("--json");
                        (args.clone(), d.cli(&with_json))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (args, out) in &outs {
            if out.code != 0 {
                assert!(
                    ![1, 101].contains(&out.code) && !out.stdout.contains("\"internal\""),
                    "{args:?} ended unclearly: {out:?}\n{}",
                    d.log()
                );
            }
        }
        // Whatever is left is whole: every listed sandbox answers once awake.
        for other in d.ids() {
            if d.json(&["show", &other])["state"] == "suspended" {
                let _ = d.cli(&["wake", &other]);
            }
            if d.json(&["show", &other])["state"] == "running" {
                let url = d.ok(&["dsn", &other]).trim().to_owned();
                assert_eq!(sql(&url, "SELECT count(*) FROM t"), "0", "{other}");
            }
            d.ok(&["rm", &other]);
        }
        let _ = d.cli(&["golden", "rm", &target, "--force"]);
    }
    // Nothing of any of them is left.
    // (A released pair leaves a tombstone, its quarantine, not a lease.)
    d.wait_for(Duration::from_secs(20), "every lease to be given back", || {
        let held = |e: &std::fs::DirEntry| e.file_name().to_str().is_some_and(|n| n.parse::<u32>().is_ok());
        std::fs::read_dir(&leases).map(|r| r.flatten().filter(held).count()).unwrap_or(0) == 0
    });
    assert!(d.sandbox_dirs().is_empty(), "{:?}", d.sandbox_dirs());
    assert!(
        std::fs::read_dir(d.home.join("volume/staging")).unwrap().next().is_none(),
        "a build's files are left"
    );
    assert!(d.postmasters().is_empty(), "servers left: {:?}", d.postmasters());
    assert!(d.redis_servers().is_empty(), "Redis servers left: {:?}", d.redis_servers());
    d.wait_for(Duration::from_secs(5), "every cgroup to go", || d.cgroups().is_empty());
    drop(d);
    let _ = std::fs::remove_dir_all(&leases);
}

/// The golden's relation cache init files, by the directory under `pgdata` that holds each.
fn relcache_files(pgdata: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut found = Vec::new();
    let mut dirs = vec![pgdata.join("global")];
    dirs.extend(std::fs::read_dir(pgdata.join("base")).unwrap().flatten().map(|e| e.path()));
    for dir in dirs {
        for name in ["pg_internal.init", "pg_internal.init.kept"] {
            if let Ok(bytes) = std::fs::read(dir.join(name)) {
                let at = dir.strip_prefix(pgdata).unwrap().join(name);
                found.push((at.display().to_string(), bytes));
            }
        }
    }
    found.sort();
    found
}

#[test]
fn a_fork_starts_with_the_goldens_relation_cache_files_which_postgresql_removes_at_every_start() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let golden = relcache_files(&d.home.join("volume/goldens/shop/1/pgdata"));
    assert!(
        golden.iter().any(|(at, _)| at.starts_with("global/"))
            && golden.iter().any(|(at, _)| at.starts_with("base/")),
        "the golden holds the files its last session wrote: {:?}",
        golden.iter().map(|(at, _)| at).collect::<Vec<_>>()
    );
    // A kept file the golden itself carries (a sandbox whose restore failed,
    // promoted) describes other catalogs: it is never what a fork reads.
    let golden_pgdata = d.home.join("volume/goldens/shop/1/pgdata");
    for (at, _) in &golden {
        std::fs::write(golden_pgdata.join(format!("{at}.kept")), b"stale").unwrap();
    }
    for access in [&[][..], &["--mode", "readonly"][..]] {
        let forked = d.fork("shop", access);
        let pgdata = d.home.join("volume/sandboxes").join(forked["id"].as_str().unwrap()).join("pgdata");
        // Before any session: the very files, under their own names, none kept aside.
        assert_eq!(relcache_files(&pgdata), golden, "{access:?}");
        assert_eq!(sql(&dsn(&forked), "SELECT count(*) FROM orders"), "1000");
    }
    // A restart of a sandbox's own data starts as PostgreSQL does.
    let forked = d.fork("shop", &[]);
    let id = forked["id"].as_str().unwrap();
    sql(&dsn(&forked), "CREATE TABLE later (x int)");
    d.ok(&["suspend", id]);
    d.ok(&["wake", id]);
    assert_eq!(sql(&dsn(&forked), "SELECT count(*) FROM later"), "0");
}
