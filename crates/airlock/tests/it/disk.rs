//! A full disk harms only its filler: a hard quota per sandbox on Btrfs, and a
//! free-space reserve that stops the writer where no quota is possible.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::harness::{dsn, psql, sql, Daemon};
use crate::storage::golden_digest;

/// A daemon on its own loop volume of `fs`, made by `storage init`.
fn on_volume(fs: &str, size: &str, args: &[&str]) -> Option<Daemon> {
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    let mut d = Daemon::unstarted(crate::harness::fresh_home(&crate::harness::plain_base()), args);
    d.env.push(("AIRLOCK_LOG".into(), "info,airlock_lifecycle::sandbox::headroom=debug".into()));
    let report = d.json(&["storage", "init", "--fs", fs, "--size", size]);
    assert_eq!(report["filesystem"], fs, "{report}");
    // What the volume cannot do under the defaults is said before serving.
    let warned = |what: &str| {
        report["warnings"].as_array().unwrap().iter().any(|w| w.as_str().unwrap().contains(what))
    };
    assert_eq!(warned("cannot limit what each sandbox writes"), fs == "xfs", "{report}");
    assert!(warned("smaller than one sandbox's default allowance"), "{report}");
    d.spawn();
    Some(d)
}

/// A neighbour committing one row at a time until `stop`; counts commits and failures.
fn commit_until(url: &str, stop: &AtomicBool, done: &AtomicU64, failed: &AtomicU64) {
    sql(url, "CREATE TABLE ticks (n int)");
    while !stop.load(Ordering::SeqCst) {
        match psql(url, "INSERT INTO ticks VALUES (1)") {
            Ok(_) => done.fetch_add(1, Ordering::SeqCst),
            Err(e) => {
                eprintln!("neighbour failed: {e}");
                failed.fetch_add(1, Ordering::SeqCst)
            }
        };
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_sandbox_filling_its_quota_gets_its_own_error_while_a_neighbour_keeps_committing() {
    let Some(d) = on_volume("btrfs", "3G", &["--disk-limit", "150M"]) else { return };
    let doctor = d.json(&["doctor"]);
    assert_eq!(doctor["storage_backend"], "subvolume", "{doctor}");
    assert_eq!(doctor["disk_quota_per_sandbox"], true);
    d.shop("shop");
    let golden = d.home.join("volume/goldens/shop/1");
    let golden_before = golden_digest(&golden);
    let filler = d.fork("shop", &["--statement-timeout", "120s"]);
    let neighbour = d.fork("shop", &[]);
    let (stop, done, failed) = (AtomicBool::new(false), AtomicU64::new(0), AtomicU64::new(0));
    let filled = std::thread::scope(|s| {
        s.spawn(|| commit_until(&dsn(&neighbour), &stop, &done, &failed));
        std::thread::sleep(Duration::from_millis(300));
        // About 1 GB of rows against a 150 MB allowance.
        let filled = psql(
            &dsn(&filler),
            "CREATE TABLE big AS SELECT g, repeat(md5(g::text), 30) AS pad FROM generate_series(1, 1000000) g",
        );
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::SeqCst);
        filled
    });
    let err = filled.expect_err("the filler wrote past its quota");
    // PostgreSQL's own error for a write past the allowance: EDQUOT, or the short
    // write that reaches the limit in the middle of a block.
    // Or the daemon stopped its server at its own limit first (kept
    // suspended, as below), which ends its session.
    // The reaper says so once it has seen the server gone, which can be a
    // moment after the session ended.
    let stopped_at_its_limit = err.contains("crash of another server process") && {
        let said =
            format!("stopped at a full disk; kept suspended sandbox={}", filler["id"].as_str().unwrap());
        let deadline = Instant::now() + Duration::from_secs(15);
        while !d.log().contains(&said) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        d.log().contains(&said)
    };
    assert!(
        err.contains("Disk quota exceeded") || err.contains("Check free disk space") || stopped_at_its_limit,
        "the filler's own error: {err}\n{}",
        d.logs()
    );
    assert_eq!(failed.load(Ordering::SeqCst), 0, "the neighbour saw errors; {}", d.logs());
    assert!(done.load(Ordering::SeqCst) > 10, "the neighbour kept committing");
    // The filler is still a sandbox (its own problem, not deleted), the neighbour
    // answers, the golden is as it was.
    let ids = d.ids();
    for sb in [&filler, &neighbour] {
        assert!(ids.contains(&sb["id"].as_str().unwrap().to_owned()), "{} went", sb["id"]);
    }
    assert_eq!(sql(&dsn(&neighbour), "SELECT count(*) FROM orders"), "1000");
    // It answers again, or, where its server stopped at its own WAL's
    // limit, it is kept suspended with its data: never deleted.
    let filler_id = filler["id"].as_str().unwrap();
    d.wait_for(Duration::from_secs(30), "the filler to answer again or be kept", || {
        psql(&dsn(&filler), "SELECT count(*) FROM orders").is_ok_and(|n| n == "1000")
            || d.json(&["show", filler_id])["state"] == "suspended"
    });
    // Branch and reset work on subvolumes too, and a reset gives the allowance back.
    let branch = d.fork_branch(&dsn(&neighbour));
    assert_eq!(
        sql(&branch, "SELECT count(*) FROM ticks"),
        sql(&dsn(&neighbour), "SELECT count(*) FROM ticks")
    );
    d.ok(&["reset", filler["id"].as_str().unwrap()]);
    sql(
        &dsn(&filler),
        "CREATE TABLE again AS SELECT g, repeat('y', 500) AS pad FROM generate_series(1, 50000) g",
    );
    assert_eq!(golden_digest(&golden), golden_before, "the golden changed");
}

#[test]
fn where_no_quota_is_possible_the_reserve_stops_the_writer_and_spares_the_neighbour() {
    let Some(d) = on_volume("xfs", "2G", &["--disk-reserve", "600M", "--disk-limit", "10G"]) else { return };
    assert_eq!(d.json(&["doctor"])["disk_quota_per_sandbox"], false);
    d.shop("shop");
    let filler = d.fork("shop", &["--statement-timeout", "120s"]);
    let neighbour = d.fork("shop", &[]);
    let filler_id = filler["id"].as_str().unwrap().to_owned();
    let (stop, done, failed) = (AtomicBool::new(false), AtomicU64::new(0), AtomicU64::new(0));
    let began = Instant::now();
    let filled = std::thread::scope(|s| {
        s.spawn(|| commit_until(&dsn(&neighbour), &stop, &done, &failed));
        std::thread::sleep(Duration::from_millis(300));
        // Far more than the volume holds.
        let filled = psql(
            &dsn(&filler),
            "CREATE TABLE big AS SELECT g, repeat(md5(g::text), 30) AS pad FROM generate_series(1, 3000000) g",
        );
        std::thread::sleep(Duration::from_millis(500));
        let during = done.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::SeqCst);
        (filled, during)
    });
    let (filled, during) = filled;
    assert!(filled.is_err(), "the filler's statement was stopped");
    assert_eq!(failed.load(Ordering::SeqCst), 0, "the neighbour saw errors; {}", d.logs());
    assert!(done.load(Ordering::SeqCst) > during, "the neighbour still commits after the filler stopped");
    let shown = d.json(&["show", &filler_id]);
    assert_eq!(shown["state"], "suspended", "{shown}");
    let events = d.json(&["events", "--sandbox", &filler_id]);
    let stopped = events.as_array().unwrap().iter().find(|e| e["kind"] == "disk_reserve");
    assert!(stopped.is_some_and(|e| e["reason"] == "stopped"), "{events}");
    assert_eq!(d.json(&["show", neighbour["id"].as_str().unwrap()])["state"], "running");
    // Deleting the filler gives its space back.
    d.ok(&["rm", &filler_id]);
    d.wait_for(Duration::from_secs(20), "a fork to fit again", || d.cli(&["fork", "shop"]).code == 0);
    assert!(began.elapsed() < Duration::from_secs(120));
}

#[test]
fn a_volume_that_cannot_hold_one_running_sandbox_is_refused_at_start() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let mut d = Daemon::unstarted(
        crate::harness::fresh_home(&crate::harness::plain_base()),
        &["--disk-reserve", "900M"],
    );
    let report = d.json(&["storage", "init", "--fs", "btrfs", "--size", "1G"]);
    assert_eq!(report["filesystem"], "btrfs", "{report}");
    let said = d.serve_fails();
    assert!(
        said.contains("invalid_request") && said.contains("less than one running sandbox needs"),
        "{said}"
    );
}

#[test]
fn forks_never_eat_into_the_reserve() {
    let d = Daemon::start(&["--disk-reserve", "100T"]);
    d.shop("shop");
    let (exit, err) = d.fails(&["fork", "shop"]);
    assert_eq!((exit, err["code"].as_str()), (13, Some("disk_full")), "{err}");
    assert!(err["message"].as_str().unwrap().contains("below its reserve"), "{err}");
    assert!(d.ids().is_empty(), "nothing half-made");
    assert!(d.json(&["doctor"])["disk_reserve_bytes"].as_u64().unwrap() >= 100 << 40);
}

#[test]
fn exec_code_cannot_step_outside_its_quota_with_subvolumes_namespaces_or_tracing() {
    let Some(d) = on_volume("btrfs", "3G", &["--disk-limit", "150M"]) else { return };
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let neighbour = d.fork("shop", &[]);
    let id = sb["id"].as_str().unwrap();
    // A subvolume of its own (outside the sandbox's quota group), a read-only flag
    // nobody could remove, a user namespace, tracing: each refused.
    let probe = r#"
import fcntl, os, struct, sys
def attempt(name, f):
    try:
        f(); print(name, "ALLOWED")
    except OSError as e:
        print(name, "refused", e.errno)
attempt("subvolume", lambda: fcntl.ioctl(os.open(".", os.O_RDONLY), 0x5000940e, bytearray(struct.pack("q4088s", 0, b"nest"))))
attempt("readonly", lambda: fcntl.ioctl(os.open(".", os.O_RDONLY), 0x4008941a, struct.pack("Q", 2)))
"#;
    let r = d.exec(
        id,
        &format!("python3 -c '{probe}'; unshare -r true && echo UNSHARED; unshare -rn true || echo NO-NAMESPACE; dd if=/dev/zero of=big bs=1M count=400 2>&1"),
        "120s",
    );
    let out = r["stdout"].as_str().unwrap().to_owned() + r["stderr"].as_str().unwrap();
    assert!(!out.contains("ALLOWED") && !out.contains("UNSHARED") && out.contains("NO-NAMESPACE"), "{out}");
    assert_eq!(out.matches("refused 1").count(), 2, "{out}");
    assert!(out.contains("Disk quota exceeded"), "exec's files count against the quota: {out}");
    // And the sandbox can still be deleted at its full quota, leaving nothing.
    d.ok(&["rm", id]);
    assert!(!d.sandbox_dirs().contains(&id.to_owned()));
    assert_eq!(sql(&dsn(&neighbour), "SELECT count(*) FROM orders"), "1000");
}

#[test]
fn the_reserve_sees_writers_that_come_and_go() {
    let Some(d) = on_volume("xfs", "2G", &["--disk-reserve", "600M", "--disk-limit", "10G"]) else { return };
    d.shop("shop");
    let filler = d.fork("shop", &[]);
    let neighbour = d.fork("shop", &[]);
    let id = filler["id"].as_str().unwrap().to_owned();
    // Each file written by a process that exits at once: no live counter shows it.
    let _ = d.exec(
        &id,
        "i=0; while dd if=/dev/zero of=f$i bs=1M count=16 conv=fsync 2>/dev/null; do i=$((i+1)); done",
        "120s",
    );
    let events = d.json(&["events", "--sandbox", &id]);
    assert!(events.as_array().unwrap().iter().any(|e| e["kind"] == "disk_reserve"), "{events}");
    assert_eq!(d.json(&["show", &id])["state"], "suspended");
    assert_eq!(sql(&dsn(&neighbour), "INSERT INTO orders VALUES (5001, 'x', 1) RETURNING id"), "5001");
}

/// Fills the volume's free space with one file (as the root operator might by
/// mistake); returns its path.
fn fill_volume(d: &Daemon) -> std::path::PathBuf {
    let volume = d.home.join("volume");
    let stat = nix::sys::statvfs::statvfs(&volume).unwrap();
    let mut size = (stat.blocks_available() * stat.fragment_size()).saturating_sub(4 << 20);
    let filler = volume.join("filler");
    // The free count moves as the file system works: ask for less until it fits.
    while size > 1 << 20 {
        let done = std::process::Command::new("fallocate")
            .args(["-l", &size.to_string()])
            .arg(&filler)
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        if done.success() {
            break;
        }
        size /= 2;
    }
    // Whatever fallocate could not take, a plain write takes.
    let _ = std::process::Command::new("dd")
        .args(["if=/dev/zero", "bs=64k", "status=none"])
        .arg(format!("of={}", volume.join("filler-tail").display()))
        .status();
    filler
}

/// The answer's error code, when the CLI failed (`--json` prints it on stdout).
fn error_code(out: &crate::harness::Out) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(&out.stdout).ok()?;
    v["error"]["code"].as_str().map(str::to_owned)
}

#[test]
fn at_a_full_disk_every_answer_tells_the_truth() {
    let Some(d) = on_volume("xfs", "1G", &["--disk-reserve", "0%", "--disk-limit", "10G"]) else { return };
    d.shop("shop");
    let dirty = d.fork("shop", &[]);
    let dirty_id = dirty["id"].as_str().unwrap().to_owned();
    let spare = d.fork("shop", &[]);
    let spare_id = spare["id"].as_str().unwrap().to_owned();
    // Dirty buffers the shutdown checkpoint must write into blocks it shares with the golden.
    sql(&dsn(&dirty), "UPDATE orders SET total = total + 1");
    let filler = fill_volume(&d);

    // Suspend: the server stops either way; the answer says whether it was clean.
    let out = d.cli(&["suspend", &dirty_id, "--json"]);
    eprintln!("suspend at a full disk: {out:?}");
    let shown = d.json(&["show", &dirty_id]);
    assert_eq!(shown["state"], "suspended", "{shown}");
    let events = d.json(&["events", "--sandbox", &dirty_id]);
    let suspended = events.as_array().unwrap().iter().rfind(|e| e["kind"] == "suspended").cloned().unwrap();
    // The shutdown checkpoint cannot create its files: the server panics.
    assert_eq!(error_code(&out).as_deref(), Some("disk_full"), "{out:?}");
    assert_eq!(out.code, 13);
    assert!(out.stdout.contains("is suspended, but"), "the answer says what was kept: {out:?}");
    assert_eq!(suspended["detail"]["clean"], false, "{events}");

    // Wake: success only for a server that answers.
    let out = d.cli(&["wake", &dirty_id, "--json"]);
    eprintln!("wake at a full disk: {out:?}");
    let state = d.json(&["show", &dirty_id])["state"].clone();
    if out.code == 0 {
        assert_eq!(state, "running");
        assert_eq!(psql_within_ok(&dsn(&dirty)), "1000");
    } else {
        let code = error_code(&out);
        assert!(matches!(code.as_deref(), Some("disk_full") | Some("postgres_failed")), "{out:?}");
        assert_eq!(state, "suspended", "a sandbox that cannot run is not listed as running");
    }

    // Fork and branch: a success answers; a failure is disk_full and leaves nothing.
    let before: Vec<String> = d.ids();
    for args in [vec!["fork", "shop", "--json"], vec!["branch", spare_id.as_str(), "--json"]] {
        let out = d.cli(&args);
        eprintln!("{args:?} at a full disk: {out:?}");
        if out.code == 0 {
            let made: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
            assert_eq!(psql_within_ok(&dsn(&made)), "1000", "{args:?}");
            d.ok(&["rm", made["id"].as_str().unwrap()]);
        } else {
            assert_eq!(error_code(&out).as_deref(), Some("disk_full"), "{args:?}: {out:?}\n{}", d.log());
            assert_eq!(out.code, 13, "{args:?}");
        }
        assert_eq!(d.ids(), before, "{args:?} left nothing half-made");
        assert_eq!(
            d.sandbox_dirs(),
            {
                let mut v = before.clone();
                v.sort();
                v
            },
            "{args:?}"
        );
    }
    // A server that dies writing at the full disk is kept, suspended, not
    // deleted; so is one killed there, whose log says nothing (at a full disk a
    // dying server may not be able to write its last words either).
    let _ = psql(&dsn(&spare), "INSERT INTO orders SELECT g, 'x', 1 FROM generate_series(100000, 400000) g");
    std::thread::sleep(Duration::from_secs(2));
    let state = d.json(&["show", &spare_id])["state"].clone();
    assert!(state == "running" || state == "suspended", "{state}");
    if state == "running" {
        let pid = nix::unistd::Pid::from_raw(d.postmaster_of(&spare_id));
        nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    }
    d.wait_for(Duration::from_secs(10), "the dead server's sandbox to be kept", || {
        d.json(&["show", &spare_id])["state"] == "suspended"
    });
    // Every 5xx answer points at the daemon log, and the log has it.
    for line in d.log().lines().filter(|l| l.contains("a request failed")) {
        assert!(line.contains("code="), "{line}");
    }

    // With space again, the suspended sandbox wakes with what it had committed.
    std::fs::remove_file(&filler).unwrap();
    let _ = std::fs::remove_file(d.home.join("volume/filler-tail"));
    if d.json(&["show", &dirty_id])["state"] == "suspended" {
        d.ok(&["wake", &dirty_id]);
    }
    assert_eq!(sql(&dsn(&dirty), "SELECT count(*) FROM orders"), "1000");
    assert_eq!(sql(&dsn(&spare), "SELECT count(*) FROM orders"), "1000");
}

/// Runs a count of orders, which must answer within a few seconds.
fn psql_within_ok(url: &str) -> String {
    crate::harness::psql_within(url, "SELECT count(*) FROM orders", Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("no answer: {e}"))
}

/// The attack on a shared volume, at the default settings (a 10 GiB allowance
/// each) on a small Btrfs volume: one sandbox fills it with rows as fast as it
/// can, a second with buffered writes from `exec` (which reach the free-space
/// count only after writeback), while a neighbour commits throughout and four
/// others sit idle. Only the fillers may see an error: the volume never fills,
/// every neighbour's server keeps running and answering, and a fork that
/// cannot be promised room says `disk_full` instead of taking a neighbour's.
#[test]
fn two_fillers_at_the_default_allowance_harm_no_neighbour() {
    let Some(d) = on_volume("btrfs", "4G", &[]) else { return };
    let doctor = d.json(&["doctor"]);
    assert_eq!(doctor["disk_quota_per_sandbox"], true, "{doctor}");
    assert!(
        doctor["warnings"].to_string().contains("more than the"),
        "a 10 GiB allowance on a 4 GiB volume is said plainly: {doctor}"
    );
    let reserve = doctor["disk_reserve_bytes"].as_u64().unwrap();
    d.shop("shop");
    let fast = d.fork("shop", &["--statement-timeout", "300s"]);
    let buffered = d.fork("shop", &[]);
    let neighbour = d.fork("shop", &[]);
    let idle: Vec<serde_json::Value> = (0..4).map(|_| d.fork("shop", &[])).collect();
    let idle_pids: Vec<i32> = idle.iter().map(|sb| d.postmaster_of(sb["id"].as_str().unwrap())).collect();
    let volume = d.home.join("volume");
    let (stop, done, failed) = (AtomicBool::new(false), AtomicU64::new(0), AtomicU64::new(0));
    let least_free = AtomicU64::new(u64::MAX);
    let (rows, written) = std::thread::scope(|s| {
        s.spawn(|| commit_until(&dsn(&neighbour), &stop, &done, &failed));
        s.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                let st = nix::sys::statvfs::statvfs(&volume).unwrap();
                least_free.fetch_min(st.blocks_available() * st.fragment_size(), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        std::thread::sleep(Duration::from_millis(300));
        let rows = s.spawn(|| {
            psql(
                &dsn(&fast),
                "CREATE TABLE big AS SELECT g, repeat(md5(g::text), 30) AS pad FROM generate_series(1, 5000000) g",
            )
        });
        let id = buffered["id"].as_str().unwrap();
        let written = d.exec(id, "dd if=/dev/zero of=blob bs=1M count=4000 2>&1; echo dd-exit=$?", "300s");
        let rows = rows.join().unwrap();
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::SeqCst);
        (rows, written)
    });
    let err = rows.expect_err("the fast filler wrote past what the volume holds");
    assert!(err.contains("Disk quota exceeded") || err.contains("Check free disk space"), "{err}");
    let out = written["stdout"].as_str().unwrap();
    assert!(out.contains("Disk quota exceeded") && !out.contains("dd-exit=0"), "{out}");
    assert_eq!(failed.load(Ordering::SeqCst), 0, "the neighbour saw errors; {}", d.logs());
    assert!(done.load(Ordering::SeqCst) > 20, "the neighbour kept committing");
    let least = least_free.load(Ordering::SeqCst);
    eprintln!("least free: {} MiB; the fillers said: {err} / {out}", least >> 20);
    assert!(least > 64 << 20, "the volume came down to {least} bytes free");
    // And the fillers did fill it: all but the reserve and the neighbours'
    // promises (five servers' floors and WALs) went to them.
    assert!(least < reserve + (5 * 192 << 20) + (300 << 20), "the fillers stopped early: {least} bytes free");
    for (sb, pid) in idle.iter().zip(&idle_pids) {
        let id = sb["id"].as_str().unwrap();
        assert_eq!(d.postmaster_of(id), *pid, "idle neighbour {id}'s server was restarted");
        assert_eq!(sql(&dsn(sb), "SELECT count(*) FROM orders"), "1000");
    }
    assert_eq!(sql(&dsn(&neighbour), "SELECT count(*) FROM orders"), "1000");
    for sb in idle.iter().chain([&neighbour]) {
        let log = std::fs::read_to_string(
            d.home.join("volume/sandboxes").join(sb["id"].as_str().unwrap()).join("postgres.log"),
        )
        .unwrap_or_default();
        assert!(!log.contains("PANIC") && !log.contains("No space left"), "{log}");
    }
    // With the volume promised away, a fork is told so and leaves nothing; once
    // a filler goes, forks fit again.
    let before = d.ids();
    let (code, err) = d.fails(&["fork", "shop"]);
    assert_eq!((code, err["code"].as_str()), (13, Some("disk_full")), "{err}");
    assert_eq!(d.ids(), before, "nothing half-made");
    d.ok(&["rm", fast["id"].as_str().unwrap()]);
    d.ok(&["rm", buffered["id"].as_str().unwrap()]);
    d.wait_for(Duration::from_secs(20), "a fork to fit again", || d.cli(&["fork", "shop"]).code == 0);
}

/// Records the least free space the volume at `volume` showed until `stop`.
fn watch_free(volume: &std::path::Path, stop: &AtomicBool, least: &AtomicU64) {
    while !stop.load(Ordering::SeqCst) {
        let st = nix::sys::statvfs::statvfs(volume).unwrap();
        least.fetch_min(st.blocks_available() * st.fragment_size(), Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Many small files are metadata alone. Where metadata has a pool of its own,
/// one tenant's files can use it up while the volume still shows free space,
/// and then every neighbour's commit fails. In one pool (mixed block groups)
/// they count against the writer's quota like any other write: the writer
/// meets its limit, the neighbour keeps committing.
#[test]
fn small_files_cannot_starve_the_volume_for_neighbours() {
    let Some(d) = on_volume("btrfs", "2G", &[]) else { return };
    let volume = d.home.join("volume");
    let df = std::process::Command::new("btrfs").args(["filesystem", "df"]).arg(&volume).output().unwrap();
    let df = String::from_utf8_lossy(&df.stdout).to_string();
    assert!(df.contains("Data+Metadata"), "data and metadata share one pool: {df}");
    d.shop("shop");
    let filler = d.fork("shop", &[]);
    let neighbour = d.fork("shop", &[]);
    let (stop, done, failed) = (AtomicBool::new(false), AtomicU64::new(0), AtomicU64::new(0));
    let least = AtomicU64::new(u64::MAX);
    let written = std::thread::scope(|s| {
        s.spawn(|| commit_until(&dsn(&neighbour), &stop, &done, &failed));
        s.spawn(|| watch_free(&volume, &stop, &least));
        std::thread::sleep(Duration::from_millis(300));
        // Files small enough to live inline in the metadata, in many
        // directories, until the first refusal.
        let script = r#"python3 - <<'PY'
import os
n = 0
try:
    while n < 4000000:
        if n % 10000 == 0:
            os.mkdir(f"d{n // 10000}")
        with open(f"d{n // 10000}/f{n}", "w") as f:
            f.write("x" * 1500)
        n += 1
    print("wrote all", n)
except OSError as e:
    print("stopped after", n, e)
PY"#;
        let written = d.exec(filler["id"].as_str().unwrap(), script, "400s");
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::SeqCst);
        written
    });
    let out = written["stdout"].as_str().unwrap_or_default();
    eprintln!("the filler said: {out}; least free {} MiB", least.load(Ordering::SeqCst) >> 20);
    assert!(out.contains("stopped after") && out.contains("Disk quota exceeded"), "{written}");
    assert_eq!(failed.load(Ordering::SeqCst), 0, "the neighbour saw errors; {}", d.logs());
    assert!(done.load(Ordering::SeqCst) > 20, "the neighbour kept committing");
    assert!(least.load(Ordering::SeqCst) > 64 << 20, "the volume came down to {:?} free", least);
    let log = std::fs::read_to_string(
        d.home.join("volume/sandboxes").join(neighbour["id"].as_str().unwrap()).join("postgres.log"),
    )
    .unwrap_or_default();
    assert!(!log.contains("PANIC") && !log.contains("No space left"), "{log}");
    // Deleting the filler gives the room back, as Btrfs frees the deleted
    // subvolume's hundreds of thousands of files in the background: a fork
    // that waits for room gets it.
    d.ok(&["rm", filler["id"].as_str().unwrap()]);
    let asked = std::time::Instant::now();
    let fork = d.cli(&["fork", "shop", "--wait", "300s", "--json"]);
    eprintln!("a fork waiting for room got it after {:?}", asked.elapsed());
    assert_eq!(fork.code, 0, "{}; {}", fork.stderr, d.logs());
}

/// A golden build writes on the sandboxes' volume too: it is held to a
/// promise like a sandbox's, so a build larger than what is spare fails with
/// `disk_full`, leaving nothing, while a neighbour keeps committing; a build
/// that fits becomes a golden that forks as usual.
#[test]
fn a_golden_build_is_held_to_a_promise_like_a_sandbox() {
    let Some(d) = on_volume("btrfs", "3G", &["--disk-limit", "1G"]) else { return };
    d.shop("shop");
    let neighbour = d.fork("shop", &[]);
    let volume = d.home.join("volume");
    let sql_dir = d.home.join("sql");
    std::fs::write(sql_dir.join("huge-schema.sql"), "CREATE TABLE big (g int, pad text);").unwrap();
    // About 5 GB of rows on a 3 GB volume.
    std::fs::write(
        sql_dir.join("huge-seed.sql"),
        "INSERT INTO big SELECT g, repeat(md5(g::text), 15) FROM generate_series(1, 10000000) g;",
    )
    .unwrap();
    let (stop, done, failed) = (AtomicBool::new(false), AtomicU64::new(0), AtomicU64::new(0));
    let least = AtomicU64::new(u64::MAX);
    let (code, err) = std::thread::scope(|s| {
        s.spawn(|| commit_until(&dsn(&neighbour), &stop, &done, &failed));
        s.spawn(|| watch_free(&volume, &stop, &least));
        std::thread::sleep(Duration::from_millis(300));
        let schema = sql_dir.join("huge-schema.sql");
        let seed = sql_dir.join("huge-seed.sql");
        let failed_build = d.fails(&[
            "golden",
            "create",
            "huge",
            "--schema",
            schema.to_str().unwrap(),
            "--seed",
            seed.to_str().unwrap(),
        ]);
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::SeqCst);
        failed_build
    });
    eprintln!("least free {} MiB; the build said {err}", least.load(Ordering::SeqCst) >> 20);
    assert_eq!((code, err["code"].as_str()), (13, Some("disk_full")), "{err}");
    assert_eq!(failed.load(Ordering::SeqCst), 0, "the neighbour saw errors; {}", d.logs());
    assert!(done.load(Ordering::SeqCst) > 20, "the neighbour kept committing");
    assert!(least.load(Ordering::SeqCst) > 64 << 20, "the volume came down to {:?} free", least);
    // Nothing of the build is left, and the room is back.
    let staged: Vec<_> =
        std::fs::read_dir(volume.join("staging")).map(|d| d.flatten().collect()).unwrap_or_default();
    assert!(staged.is_empty(), "the build left {staged:?}");
    assert!(d.json(&["golden", "ls"]).to_string().find("\"huge\"").is_none());
    // (Btrfs frees a deleted subvolume's space in the background.)
    d.wait_for(Duration::from_secs(60), "the build's room to be back", || {
        let st = nix::sys::statvfs::statvfs(&volume).unwrap();
        st.blocks_available() * st.fragment_size() > 2 << 30
    });
    // A build that fits is a golden whose forks write as usual.
    d.golden(
        "fits",
        "CREATE TABLE t (g int, pad text);",
        "INSERT INTO t SELECT g, repeat('z', 400) FROM generate_series(1, 200000) g;",
    );
    let fork = d.fork("fits", &[]);
    assert_eq!(sql(&dsn(&fork), "SELECT count(*) FROM t"), "200000");
    sql(&dsn(&fork), "INSERT INTO t SELECT g, repeat('y', 400) FROM generate_series(1, 100000) g");
    assert_eq!(sql(&dsn(&neighbour), "SELECT count(*) FROM orders"), "1000");
}

/// The WAL limit Btrfs holds for `path` under the volume (its `max_excl`).
fn wal_limit(volume: &std::path::Path, path: &str) -> String {
    qgroup_column(volume, path, 4)
}

/// Column `column` of `btrfs qgroup show -re --raw`'s line for `path` under
/// the volume (2: what it owns, 4: its limit on that).
fn qgroup_column(volume: &std::path::Path, path: &str, column: usize) -> String {
    let out = std::process::Command::new("btrfs")
        .args(["qgroup", "show", "-re", "--raw"])
        .arg(volume)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let line = text.lines().find(|l| l.ends_with(path)).unwrap_or_else(|| panic!("no {path} in {text}"));
    line.split_whitespace().nth(column).unwrap().to_owned()
}

/// A sandbox's server user owns its data directory, so it can put a link
/// where its WAL was, pointing at a neighbour's. Root limits and unlimits
/// subvolumes by path (a delete lifts every limit first): it never follows
/// that link, so the neighbour's WAL keeps its limit.
#[test]
fn a_link_in_a_sandboxs_data_directory_never_moves_a_neighbours_limit() {
    let Some(d) = on_volume("btrfs", "3G", &["--disk-limit", "500M"]) else { return };
    d.shop("shop");
    let (a, b) = (d.fork("shop", &[]), d.fork("shop", &[]));
    let volume = d.home.join("volume");
    let b_wal = format!("sandboxes/{}/pgdata/pg_wal", b["id"].as_str().unwrap());
    let before = wal_limit(&volume, &b_wal);
    assert_ne!(before, "none", "the neighbour's WAL is limited");
    // What A's server user could do in its own data directory.
    let a_pgdata = volume.join("sandboxes").join(a["id"].as_str().unwrap()).join("pgdata");
    std::fs::rename(a_pgdata.join("pg_wal"), a_pgdata.join("pg_wal.moved")).unwrap();
    std::os::unix::fs::symlink(volume.join(&b_wal), a_pgdata.join("pg_wal")).unwrap();
    d.ok(&["rm", a["id"].as_str().unwrap()]);
    assert_eq!(wal_limit(&volume, &b_wal), before, "the neighbour's WAL limit moved");
    assert_eq!(sql(&dsn(&b), "SELECT count(*) FROM orders"), "1000");
}

/// A migration test made on a sandbox's behalf (its agent's `test_migration`)
/// forks a sandbox of its own; what that fork may write is what the sandbox
/// has left of its allowance, not a fresh allowance.
#[test]
fn a_migration_test_on_a_sandboxs_behalf_writes_within_what_it_has_left() {
    let Some(d) = on_volume("btrfs", "3G", &["--disk-limit", "300M"]) else { return };
    d.shop("shop");
    let sb = d.fork("shop", &["--statement-timeout", "120s"]);
    let id = sb["id"].as_str().unwrap().to_owned();
    let fill = |table: &str| {
        format!("CREATE TABLE {table} AS SELECT g, repeat(md5(g::text), 30) AS pad FROM generate_series(1, 200000) g")
    };
    sql(&dsn(&sb), &fill("big"));
    // (The quota counts a write once the volume commits it.)
    let _ = std::process::Command::new("sync").arg("-f").arg(d.home.join("volume")).status();
    std::thread::sleep(Duration::from_millis(500));
    let (status, body) = d.api(
        "POST",
        &format!("/v1/sandboxes/{id}/tools/test_migration"),
        &serde_json::json!({ "sql": fill("more") }).to_string(),
    );
    assert_eq!(status, 200, "{body}");
    let out: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(out["result"]["candidates"][0]["passed"], false, "{out}");
    // The quota says so, or cuts a write short (`wrote only 4096 of 8192
    // bytes`): either way PostgreSQL's disk_full (53100). Or a write of the
    // WAL meets it, a PANIC that ends the session with no error of its own:
    // the report reads the fork's log and says the quota stopped it.
    let text = out["text"].as_str().unwrap();
    let met =
        text.contains("quota") || out["result"]["candidates"][0]["failure"]["error"]["sqlstate"] == "53100";
    assert!(met, "the test's fork met its limit: {out}\nLOG:\n{}", d.logs());
    // Nearly full, the sandbox's tests are told so before anything forks.
    sql(&dsn(&sb), &fill("bigger").replace("200000", "80000"));
    let _ = std::process::Command::new("sync").arg("-f").arg(d.home.join("volume")).status();
    std::thread::sleep(Duration::from_millis(500));
    let (status, body) = d.api(
        "POST",
        &format!("/v1/sandboxes/{id}/tools/test_migration"),
        &serde_json::json!({ "sql": "CREATE TABLE t (a int)" }).to_string(),
    );
    assert!(status == 507 || body.contains("disk_full"), "{status} {body}");
    d.wait_for(Duration::from_secs(20), "the tests' forks to go", || d.ids() == [id.clone()]);
}

/// The subvolume (tree) id of `path`.
fn tree_id(path: &std::path::Path) -> String {
    let out =
        std::process::Command::new("btrfs").args(["inspect-internal", "rootid"]).arg(path).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// What the subvolume `path` (under the volume) owns now, in bytes.
fn owned(volume: &std::path::Path, path: &str) -> u64 {
    qgroup_column(volume, path, 2).parse().unwrap()
}

/// The names in the volume's stock of empty subvolumes, once none is
/// still being emptied.
fn stocked(d: &Daemon, volume: &std::path::Path) -> Vec<String> {
    let names = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(volume.join(".stock"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    d.wait_for(Duration::from_secs(30), "the stock to be emptied", || {
        !names().iter().any(|n| n.starts_with("emptying."))
    });
    names()
}

/// A deleted sandbox's subvolumes are emptied and kept for later forks
/// instead of deleted (each deletion made the kernel commit a transaction).
/// The fork that takes one finds nothing of the sandbox before it and its
/// whole allowance; forks at once never share one; a sandbox whose
/// subvolume's top was marked is deleted, not kept.
#[test]
fn a_subvolume_used_again_holds_nothing_of_its_last_sandbox_and_is_never_shared() {
    let Some(d) = on_volume("btrfs", "3G", &["--disk-limit", "300M"]) else { return };
    d.shop("shop");
    let volume = d.home.join("volume");
    let stock = volume.join(".stock");
    let a = d.fork("shop", &[]);
    let a_id = a["id"].as_str().unwrap().to_owned();
    let a_dir = volume.join("sandboxes").join(&a_id);
    sql(&dsn(&a), "CREATE TABLE secret AS SELECT 'a-secret' AS s, repeat('x', 900) AS pad FROM generate_series(1, 60000)");
    let wrote = d.exec(
        &a_id,
        "echo a-was-here > marker && mkdir -p deep/a/b && echo x > deep/a/b/f && ln -s / rootlink",
        "30s",
    );
    assert_eq!(wrote["exit_code"], 0, "{wrote}");
    let _ = std::process::Command::new("sync").arg("-f").arg(&volume).status();
    let a_trees = (tree_id(&a_dir), tree_id(&a_dir.join("pgdata/pg_wal")));
    assert!(owned(&volume, &format!("sandboxes/{a_id}")) > 40 << 20, "A owns what it wrote");
    d.ok(&["rm", &a_id]);
    assert!(!a_dir.exists());
    let kept = stocked(&d, &volume);
    assert_eq!(kept.iter().filter(|n| n.starts_with("sandbox.")).count(), 1, "{kept:?}");
    assert_eq!(kept.iter().filter(|n| n.starts_with("wal.")).count(), 1, "{kept:?}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&stock).unwrap().permissions().mode() & 0o777, 0o700);
    for name in &kept {
        assert_eq!(std::fs::read_dir(stock.join(name)).unwrap().count(), 0, "{name} is empty");
    }
    // Once the kernel has counted A's writes gone, the next fork takes A's.
    let settled = || kept.iter().all(|n| owned(&volume, &format!(".stock/{n}")) <= 16 << 10);
    d.wait_for(Duration::from_secs(40), "the stock to settle", settled);
    let b = d.fork("shop", &[]);
    let b_id = b["id"].as_str().unwrap().to_owned();
    let b_dir = volume.join("sandboxes").join(&b_id);
    assert_eq!((tree_id(&b_dir), tree_id(&b_dir.join("pgdata/pg_wal"))), a_trees, "B took A's subvolumes");
    assert!(stocked(&d, &volume).is_empty());
    let mut left: Vec<String> = std::fs::read_dir(&b_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert!(!left.iter().any(|n| ["marker", "deep", "rootlink"].contains(&n.as_str())), "{left:?}");
    let seen = d.exec(&b_id, "ls -a; cat marker 2>&1", "30s");
    assert!(!seen["stdout"].as_str().unwrap().contains("a-was-here"), "{seen}");
    assert_eq!(sql(&dsn(&b), "SELECT count(*) FROM pg_class WHERE relname = 'secret'"), "0");
    assert_eq!(sql(&dsn(&b), "SELECT count(*) FROM orders"), "1000");
    assert!(owned(&volume, &format!("sandboxes/{b_id}")) < 8 << 20, "B starts with its whole allowance");
    assert_ne!(wal_limit(&volume, &format!("sandboxes/{b_id}/pgdata/pg_wal")), "none", "B's WAL is limited");
    let b_meta = std::fs::metadata(&b_dir).unwrap();
    assert_eq!(
        (b_meta.permissions().mode() & 0o7777, std::os::unix::fs::MetadataExt::uid(&b_meta)),
        (0o711, 0)
    );

    // Four deleted, then four forks at once: four subvolumes, none shared.
    let four: Vec<String> = (0..4).map(|_| d.fork("shop", &[])["id"].as_str().unwrap().to_owned()).collect();
    for id in &four {
        d.ok(&["rm", id]);
    }
    d.wait_for(Duration::from_secs(40), "the stock to settle", || {
        stocked(&d, &volume).iter().all(|n| owned(&volume, &format!(".stock/{n}")) <= 16 << 10)
    });
    let forks: Vec<_> = (0..4).map(|_| d.spawn_cli_output(&["fork", "shop", "--json"])).collect();
    let mut trees = vec![tree_id(&b_dir), tree_id(&b_dir.join("pgdata/pg_wal"))];
    for fork in forks {
        let out = fork.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let sb: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let dir = volume.join("sandboxes").join(sb["id"].as_str().unwrap());
        trees.extend([tree_id(&dir), tree_id(&dir.join("pgdata/pg_wal"))]);
        assert_eq!(sql(&dsn(&sb), "SELECT count(*) FROM orders"), "1000");
    }
    let distinct: std::collections::HashSet<_> = trees.iter().collect();
    assert_eq!(distinct.len(), trees.len(), "{trees:?}");

    // A fork right after a writer's deletion, before the kernel has counted
    // its writes gone, still starts with its whole allowance.
    let e = d.fork("shop", &[]);
    sql(&dsn(&e), "CREATE TABLE big AS SELECT repeat('x', 900) AS pad FROM generate_series(1, 60000)");
    let _ = std::process::Command::new("sync").arg("-f").arg(&volume).status();
    d.ok(&["rm", e["id"].as_str().unwrap()]);
    let f = d.fork("shop", &[]);
    let f_id = f["id"].as_str().unwrap();
    assert!(owned(&volume, &format!("sandboxes/{f_id}")) < 8 << 20, "F starts with its whole allowance");
    // A reset keeps its old WAL's subvolume too, and takes one.
    sql(&dsn(&f), "CREATE TABLE gone (n int)");
    let f_wal = volume.join("sandboxes").join(f_id).join("pgdata/pg_wal");
    let old_wal = tree_id(&f_wal);
    d.ok(&["reset", f_id]);
    assert_eq!(sql(&dsn(&f), "SELECT count(*) FROM pg_class WHERE relname = 'gone'"), "0");
    assert_eq!(sql(&dsn(&f), "SELECT count(*) FROM orders"), "1000");
    assert_ne!(tree_id(&f_wal), old_wal);
    let kept: Vec<String> = stocked(&d, &volume)
        .iter()
        .filter(|n| n.starts_with("wal."))
        .map(|n| tree_id(&stock.join(n)))
        .collect();
    assert!(kept.contains(&old_wal), "the old WAL subvolume is kept: {old_wal} not in {kept:?}");

    // A sandbox whose WAL top carries an attribute is deleted, not kept.
    let before = stocked(&d, &volume).len();
    let wal = b_dir.join("pgdata/pg_wal");
    let set = std::process::Command::new("python3")
        .args(["-c", "import os, sys; os.setxattr(sys.argv[1], 'user.mark', b'1')"])
        .arg(&wal)
        .status()
        .unwrap();
    assert!(set.success());
    d.ok(&["rm", &b_id]);
    assert_eq!(stocked(&d, &volume).len(), before, "the marked sandbox is deleted whole");
    assert!(!b_dir.exists());
}

/// A sandbox's code can make a tree far deeper than a recursion's stack
/// holds (a daemon that removed it by recursion aborted, and again at every
/// start while it was left to empty): it is removed whole, and the daemon
/// goes on serving.
#[test]
fn a_tree_thirty_thousand_levels_deep_is_removed_and_the_daemon_goes_on() {
    let Some(d) = on_volume("btrfs", "3G", &[]) else { return };
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let id = sb["id"].as_str().unwrap().to_owned();
    let deep = "import os\nfor i in range(30000):\n    os.mkdir(\"d\"); os.chdir(\"d\")\nopen(\"f\", \"w\").write(\"x\")";
    let made = d.exec(&id, &format!("printf '{deep}' | python3 - && echo MADE"), "120s");
    assert!(made["stdout"].as_str().unwrap().contains("MADE"), "{made}");
    d.ok(&["rm", &id]);
    let volume = d.home.join("volume");
    assert!(!volume.join("sandboxes").join(&id).exists());
    let names = |dir: std::path::PathBuf| -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    d.wait_for(Duration::from_secs(60), "the stock to empty it", || {
        !names(volume.join(".stock")).iter().any(|n| n.starts_with("emptying."))
    });
    let next = d.fork("shop", &[]);
    assert_eq!(sql(&dsn(&next), "SELECT count(*) FROM orders"), "1000");
    assert!(d.log().lines().all(|l| !l.contains("overflowed its stack")));
}
