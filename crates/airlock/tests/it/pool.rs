//! The warm pool: started, credential-less sandboxes that forks claim.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::harness::{dsn, psql, sql, Daemon};

fn pool_is(d: &Daemon, golden: &str, n: i64) {
    d.wait_for(Duration::from_secs(30), &format!("{golden}'s pool to hold {n}"), || {
        d.json(&["golden", "show", golden])["pooled"] == n
    });
}

fn ready_event(d: &Daemon, id: &str) -> Value {
    d.json(&["events", "--sandbox", id])
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "ready")
        .unwrap()
        .clone()
}

#[test]
fn forks_claim_from_the_pool_which_refills_and_mints_the_credential_at_claim() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    d.json(&["golden", "pool", "shop", "--size", "2"]);
    pool_is(&d, "shop", 2);
    // Pool members are not sandboxes anyone can see or address.
    assert!(d.ids().is_empty());
    assert_eq!(d.postmasters().len(), 2);
    // No pool member has a role that can log in: the credential does not exist yet.
    if nix::unistd::geteuid().is_root() {
        for dir in d.sandbox_dirs() {
            let run = d.home.join("volume/sandboxes").join(&dir).join("run");
            let out = Command::new("psql")
                .args(["-X", "-t", "-A", "-h"])
                .arg(&run)
                .args(["-U", "airlock_admin", "-d", "app", "-c"])
                .arg("SELECT rolcanlogin, rolpassword IS NULL FROM pg_authid WHERE rolname = 'airlock_agent'")
                .output()
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "f|t", "{out:?}");
        }
    }
    let a = d.fork("shop", &["--name", "a", "--label", "k=v", "--ttl", "5m"]);
    let id = a["id"].as_str().unwrap();
    assert_eq!(ready_event(&d, id)["detail"]["from_pool"], true);
    assert_eq!(a["name"], "a");
    assert_eq!(a["labels"]["k"], "v");
    assert_eq!(sql(&dsn(&a), "SELECT count(*) FROM orders"), "1000");
    sql(&dsn(&a), "DELETE FROM orders");
    // A readonly fork from the same pool gets its own access.
    let ro = d.fork("shop", &["--mode", "readonly"]);
    assert!(psql(&dsn(&ro), "DELETE FROM orders").unwrap_err().contains("read-only transaction"));
    assert_eq!(sql(&dsn(&ro), "SELECT count(*) FROM orders"), "1000");
    // The pool refills behind the claims.
    pool_is(&d, "shop", 2);
    assert_eq!(d.ids().len(), 2);
    d.wait_for(Duration::from_secs(10), "two sandboxes and two pool members", || d.postmasters().len() == 4);
    // Deleting the claimed sandboxes works as for any other.
    d.ok(&["rm", id]);
    assert!(psql(&dsn(&a), "SELECT 1").is_err());
}

#[test]
fn a_new_generation_replaces_the_pool_and_removing_the_golden_drains_it() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    d.json(&["golden", "pool", "shop", "--size", "2"]);
    pool_is(&d, "shop", 2);
    std::fs::write(d.home.join("sql/shop-seed.sql"), "INSERT INTO orders VALUES (1, 'paid', 1);").unwrap();
    d.json(&["golden", "refresh", "shop"]);
    d.wait_for(Duration::from_secs(30), "the pool to hold generation 2 only", || {
        let g = d.json(&["golden", "show", "shop"]);
        g["pooled"] == 2 && g["generations"].as_array().unwrap().len() == 1
    });
    let f = d.fork("shop", &[]);
    assert_eq!(f["generation"], 2);
    assert_eq!(sql(&dsn(&f), "SELECT count(*) FROM orders"), "1");
    d.ok(&["golden", "pool", "shop", "--size", "0"]);
    pool_is(&d, "shop", 0);
    d.wait_for(Duration::from_secs(10), "drained members to stop", || d.postmasters().len() == 1);
    d.ok(&["golden", "pool", "shop", "--size", "1"]);
    pool_is(&d, "shop", 1);
    d.ok(&["golden", "rm", "shop", "--force"]);
    assert!(d.postmasters().is_empty());
    assert!(d.sandbox_dirs().is_empty());
    let (_, err) = d.fails(&["golden", "pool", "nope", "--size", "1"]);
    assert_eq!(err["code"], "golden_not_found");
    let (_, err) = d.fails(&["golden", "pool", "shop", "--size", "1"]);
    assert_eq!(err["code"], "golden_not_found");
}

#[test]
fn the_pool_survives_a_daemon_crash_and_counts_toward_capacity() {
    let mut d = Daemon::start(&["--max-sandboxes", "3"]);
    d.shop("shop");
    let (_, err) = d.fails(&["golden", "pool", "shop", "--size", "4"]);
    assert_eq!(err["code"], "invalid_request");
    d.json(&["golden", "pool", "shop", "--size", "2"]);
    pool_is(&d, "shop", 2);
    d.kill9();
    d.spawn();
    assert_eq!(d.json(&["golden", "show", "shop"])["pooled"], 2, "pool members outlive the daemon");
    // A claim after the restart has no kept admin session and still works.
    let f = d.fork("shop", &[]);
    assert_eq!(sql(&dsn(&f), "SELECT count(*) FROM orders"), "1000");
    // One sandbox and two pool members fill a host of three; the next forks still
    // claim, and a fork with an empty pool and a full host is refused.
    pool_is(&d, "shop", 2);
    d.fork("shop", &[]);
    d.fork("shop", &[]);
    d.wait_for(Duration::from_secs(5), "claims to settle", || d.ids().len() == 3);
    let (_, err) = d.fails(&["fork", "shop"]);
    assert_eq!(err["code"], "capacity_exhausted");
}

#[test]
fn shrinking_the_pool_never_takes_a_member_a_fork_just_claimed() {
    let d = Daemon::start(&["--max-sandboxes", "20"]);
    d.shop("shop");
    d.json(&["golden", "pool", "shop", "--size", "8"]);
    pool_is(&d, "shop", 8);
    // The filler starts draining the old members ~150 ms after the size changes,
    // one teardown at a time; forks claim members while it does.
    d.json(&["golden", "pool", "shop", "--size", "0"]);
    std::thread::sleep(Duration::from_millis(170));
    let forks: Vec<Value> = std::thread::scope(|s| {
        let running: Vec<_> = (0..4).map(|_| s.spawn(|| d.fork("shop", &[]))).collect();
        running.into_iter().map(|t| t.join().unwrap()).collect()
    });
    pool_is(&d, "shop", 0);
    for f in &forks {
        let kinds = d.event_kinds(f["id"].as_str().unwrap());
        assert!(!kinds.contains(&"deleted".to_owned()), "a claimed sandbox was drained: {kinds:?}");
        assert_eq!(sql(&dsn(f), "SELECT count(*) FROM orders"), "1000");
    }
    assert_eq!(d.ids().len(), 4);
}
