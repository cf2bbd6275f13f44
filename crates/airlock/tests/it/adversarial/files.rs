//! Root's file work on a sandbox's files. `airlock exec` code runs as a user of
//! its own that cannot touch the server's files, processes or socket; and
//! whatever the server's user could plant in its own directories (tried here by
//! the test itself, as root, in that user's place) is never followed, read or
//! honoured by root or by another server: branch and promote fail closed or
//! leave it behind, and nothing outside the sandbox changes.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::Scene;
use crate::harness::{dsn, psql, sql};

fn exec(s: &Scene, script: &str) -> Value {
    s.d.exec(&s.id, script, "30s")
}

fn sandbox_dir(s: &Scene) -> PathBuf {
    s.d.home.join("volume/sandboxes").join(&s.id)
}

/// A file outside every sandbox that must come through unchanged.
fn canary(s: &Scene) -> (PathBuf, Vec<u8>) {
    let path = s.d.home.join("canary.secret");
    let text = b"host secret".to_vec();
    std::fs::write(&path, &text).unwrap();
    (path, text)
}

fn still(canary: &(PathBuf, Vec<u8>)) {
    let meta = std::fs::symlink_metadata(&canary.0).expect("the canary is still there");
    assert_eq!(std::fs::read(&canary.0).unwrap(), canary.1, "the canary changed");
    assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o644), "the canary's owner or mode changed");
}

#[test]
fn exec_code_cannot_read_the_servers_files_trace_it_or_take_its_socket() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let s = Scene::new();
    let dir = sandbox_dir(&s);
    let postmaster = s.d.postmaster_of(&s.id);
    let script = format!(
        "cat {d}/pgdata/PG_VERSION && echo READ;
         echo x >> {d}/pgdata/postgresql.auto.conf && echo WROTE;
         mv {d}/run/.s.PGSQL.5432 {d}/run/moved && echo MOVED;
         ln -s /etc/shadow {d}/run/.s.PGSQL.5432.lock2 && echo PLANTED;
         kill -STOP {postmaster} && echo STOPPED;
         cat /proc/{postmaster}/environ >/dev/null && echo TRACED;
         psql \"$DATABASE_URL\" -XtAc 'SELECT count(*) FROM orders'",
        d = dir.display()
    );
    let r = exec(&s, &script);
    let out = r["stdout"].as_str().unwrap();
    for forbidden in ["READ", "WROTE", "MOVED", "PLANTED", "STOPPED", "TRACED"] {
        assert!(!out.contains(forbidden), "exec code could {forbidden}: {r}");
    }
    assert!(out.contains("1000"), "the socket is still reachable for queries: {r}");
    // The exec user is not the server's.
    let server_uid = std::fs::metadata(dir.join("pgdata")).unwrap().uid();
    let exec_uid = std::fs::metadata(dir.join("exec")).unwrap().uid();
    assert_ne!(server_uid, exec_uid);
    s.untouched();
}

/// Replaces `victim` (a file in the agent's data directory) with a link to `target`.
fn plant_link(victim: &Path, target: &Path) {
    std::fs::remove_file(victim).unwrap();
    std::os::unix::fs::symlink(target, victim).unwrap();
}

/// A data file of the agent's `orders` table.
fn orders_file(s: &Scene) -> PathBuf {
    let rel = sql(&s.agent, "SELECT pg_relation_filepath('orders')");
    sandbox_dir(s).join("pgdata").join(rel)
}

#[test]
fn a_link_in_the_data_directory_fails_a_branch_and_reads_nothing_outside() {
    let s = Scene::new();
    let canary = canary(&s);
    plant_link(&orders_file(&s), &canary.0);
    let (_, err) = s.d.fails(&["branch", &s.id]);
    assert!(err["message"].as_str().unwrap().contains("cloning"), "{err}");
    assert_eq!(s.d.ids().len(), 2, "nothing half-made");
    still(&canary);
    s.untouched();
}

#[test]
fn a_link_in_the_data_directory_fails_a_promotion_and_reads_nothing_outside() {
    let s = Scene::new();
    let canary = canary(&s);
    let dir = sandbox_dir(&s).join("pgdata");
    std::fs::remove_dir_all(dir.join("pg_stat_tmp")).unwrap();
    std::os::unix::fs::symlink(s.d.home.join("tls"), dir.join("pg_stat_tmp")).unwrap();
    let (_, err) = s.d.fails(&["promote", &s.id, "--golden", "stolen"]);
    assert!(err["message"].as_str().unwrap().contains("cloning"), "{err}");
    let staging = std::fs::read_dir(s.d.home.join("volume/staging")).unwrap().count();
    assert_eq!(staging, 0, "a half-built golden was left");
    still(&canary);
    s.untouched();
}

#[test]
fn planted_configuration_is_never_honoured_by_a_branch_or_a_promotion() {
    let s = Scene::new();
    let marker = s.d.home.join("restore-ran");
    let pgdata = sandbox_dir(&s).join("pgdata");
    let library = s.d.home.join("evil.so");
    std::fs::write(&library, b"not a library").unwrap();
    let planted = format!(
        "\nspy.owned = 'yes'\nrestore_command = 'touch {m}'\nsession_preload_libraries = '{l}'\nshared_preload_libraries = '{l}'\n",
        m = marker.display(),
        l = library.display()
    );
    let mut auto = std::fs::read_to_string(pgdata.join("postgresql.auto.conf")).unwrap();
    auto.push_str(&planted);
    std::fs::write(pgdata.join("postgresql.auto.conf"), auto).unwrap();
    std::fs::write(pgdata.join("recovery.signal"), "").unwrap();
    std::fs::write(pgdata.join("evil.sh"), "touch /etc/evil").unwrap();
    let branch = s.d.json(&["branch", &s.id]);
    let branched = sandbox_dir(&s).with_file_name(branch["id"].as_str().unwrap()).join("pgdata");
    for absent in ["recovery.signal", "evil.sh"] {
        assert!(!branched.join(absent).exists(), "{absent} was carried into the branch");
    }
    assert!(psql(&dsn(&branch), "SHOW spy.owned").is_err(), "the branch honours a planted setting");
    s.d.json(&["promote", &s.id, "--golden", "clean"]);
    let fork = s.d.fork("clean", &[]);
    assert!(psql(&dsn(&fork), "SHOW spy.owned").is_err(), "the promoted golden carries a planted setting");
    assert_eq!(sql(&dsn(&fork), "SELECT count(*) FROM orders"), "1000");
    assert!(!marker.exists(), "a planted restore command ran");
    s.untouched();
}

#[test]
fn a_fifo_for_a_pid_file_cannot_hang_the_daemon() {
    let s = Scene::new();
    s.d.ok(&["suspend", &s.id]);
    let pidfile = sandbox_dir(&s).join("pgdata/postmaster.pid");
    let _ = std::fs::remove_file(&pidfile);
    nix::unistd::mkfifo(&pidfile, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let began = Instant::now();
    let _ = s.d.cli(&["wake", &s.id]);
    let _ = s.d.cli(&["rm", &s.id]);
    assert!(began.elapsed() < Duration::from_secs(60), "the daemon waited on a FIFO");
    assert!(s.d.json(&["doctor"])["version"].is_string(), "the daemon answers");
    s.untouched();
}

/// The pid file is the sandbox user's to write, and a deletion reads it for
/// the server to stop: naming the daemon itself, one of the daemon's threads
/// or pid 1 there stops none of them, and the deletion still ends.
#[test]
fn a_pid_file_naming_another_process_or_a_thread_never_stops_it_or_the_deletion() {
    let s = Scene::new();
    let daemon = s.d.pid();
    let thread = std::fs::read_dir(format!("/proc/{daemon}/task"))
        .unwrap()
        .flatten()
        .filter_map(|t| t.file_name().to_str()?.parse::<i32>().ok())
        .find(|tid| {
            *tid != daemon
                && std::fs::read_to_string(format!("/proc/{daemon}/task/{tid}/comm"))
                    .is_ok_and(|c| c.trim() == "tokio-rt-worker")
        })
        .expect("the daemon has worker threads");
    let mut planted = Vec::new();
    for named in [daemon, thread, 1] {
        let sb = s.d.fork("shop", &[]);
        let id = sb["id"].as_str().unwrap().to_owned();
        let pidfile = s.d.home.join("volume/sandboxes").join(&id).join("pgdata/postmaster.pid");
        let text = std::fs::read_to_string(&pidfile).unwrap();
        let rest = text.split_once('\n').unwrap().1;
        std::fs::write(&pidfile, format!("{named}\n{rest}")).unwrap();
        planted.push(id);
    }
    for id in &planted {
        let out = s.d.cli(&["rm", id]);
        assert_eq!(out.code, 0, "{id}: {out:?}");
    }
    assert!(planted.iter().all(|id| !s.d.ids().contains(id)), "every planted sandbox is gone");
    assert!(std::path::Path::new(&format!("/proc/{thread}")).exists(), "the daemon's thread lives on");
    assert!(s.d.json(&["doctor"])["version"].is_string(), "the daemon answers");
    s.untouched();
}

#[test]
fn what_exec_leaves_in_its_directory_is_never_followed_by_root() {
    let s = Scene::new();
    let canary = canary(&s);
    // Links to a host file, in every place exec can write, then every operation
    // that touches the sandbox's files.
    let script = format!(
        "cd \"$HOME\"; ln -s {c} link; ln -s {c} postgres.log; mkdir -p deep; ln -s / deep/root; echo done",
        c = canary.0.display()
    );
    assert!(exec(&s, &script)["stdout"].as_str().unwrap().contains("done"));
    s.d.ok(&["suspend", &s.id]);
    s.d.ok(&["wake", &s.id]);
    s.d.json(&["branch", &s.id]);
    s.d.ok(&["reset", &s.id]);
    s.d.ok(&["rm", &s.id]);
    still(&canary);
    s.untouched();
}
