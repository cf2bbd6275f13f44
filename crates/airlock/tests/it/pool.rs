//! The warm pool: started sandboxes, each with a credential bound to no one and a
//! parked agent session, that forks claim.

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

/// The agent sessions open on a pool member or sandbox, as its admin sees them.
fn agent_backends(d: &Daemon, id: &str) -> Vec<String> {
    backends(d, id, "usename = 'airlock_agent'")
}

/// The client sessions open on a sandbox, as its admin sees them, of every role
/// but the admin's (one whose role was dropped included).
fn client_backends(d: &Daemon, id: &str) -> Vec<String> {
    backends(d, id, "backend_type = 'client backend' AND usename IS DISTINCT FROM 'airlock_admin'")
}

fn backends(d: &Daemon, id: &str, which: &str) -> Vec<String> {
    let run = d.home.join("volume/sandboxes").join(id).join("run");
    let out = Command::new("psql")
        .args(["-X", "-t", "-A", "-h"])
        .arg(&run)
        .args(["-U", "airlock_admin", "-d", "app", "-c"])
        .arg(format!("SELECT pid FROM pg_stat_activity WHERE {which} ORDER BY pid"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect()
}

#[test]
fn forks_claim_from_the_pool_which_refills_and_first_clients_get_a_parked_session() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    d.json(&["golden", "pool", "shop", "--size", "2"]);
    pool_is(&d, "shop", 2);
    // Pool members are not sandboxes anyone can see or address.
    assert!(d.ids().is_empty());
    assert_eq!(d.postmasters().len(), 2);
    let members = d.sandbox_dirs();
    for id in &members {
        let url = format!("postgresql://airlock_agent:x@{}/{id}?sslmode=disable", d.router);
        assert!(
            psql(&url, "SELECT 1").unwrap_err().contains("does not exist"),
            "a pool member is not reachable"
        );
    }
    // Each member has one agent session open, parked for its first client.
    let mut parked = std::collections::HashMap::new();
    if nix::unistd::geteuid().is_root() {
        for id in &members {
            d.wait_for(Duration::from_secs(10), "a parked session on each member", || {
                agent_backends(&d, id).len() == 1
            });
            parked.insert(id.clone(), agent_backends(&d, id).remove(0));
        }
    }
    let a = d.fork("shop", &["--name", "a", "--label", "k=v", "--ttl", "5m"]);
    let id = a["id"].as_str().unwrap();
    assert_eq!(ready_event(&d, id)["detail"]["from_pool"], true);
    assert_eq!(a["name"], "a");
    assert_eq!(a["labels"]["k"], "v");
    // Its first client was given the parked session: no backend started for it,
    // and the client's own settings were applied to it.
    if let Some(pid) = parked.get(id) {
        // A list-valued setting stays a list, as it would at a session's start.
        let with_path = format!("{}&options=-c%20search_path%3Dpublic%2C%5C%20pg_catalog", dsn(&a));
        assert_eq!(
            sql(&with_path, "SELECT pg_backend_pid()::text || ' ' || current_setting('application_name') || ' ' || current_setting('search_path') || ' ' || split_part(current_setting('airlock.connection'), ' ', 1)"),
            format!("{pid} psql public, pg_catalog via=router"),
            "the parked session is told how its client connected"
        );
    }
    assert_eq!(sql(&dsn(&a), "SELECT count(*) FROM orders"), "1000");
    sql(&dsn(&a), "DELETE FROM orders");
    // A readonly fork from the same pool gets its own access.
    // (The parked session was opened with the default access, so it is not used.)
    let ro = d.fork("shop", &["--mode", "readonly"]);
    assert!(psql(&dsn(&ro), "DELETE FROM orders").unwrap_err().contains("read-only transaction"));
    if let Some(pid) = parked.get(ro["id"].as_str().unwrap()) {
        // Under any role: the role it was opened as is gone, not only changed.
        d.wait_for(Duration::from_secs(5), "the parked session of another role to end", || {
            !client_backends(&d, ro["id"].as_str().unwrap()).contains(pid)
        });
    }
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

/// The state store is written by two processes (the daemon and the router).
/// Two clients forking, querying through the router and deleting as fast as
/// they can while the pool refills: every step succeeds (no `database is
/// locked` for a transaction that read before it wrote), and the pool refills.
#[test]
fn fork_claim_and_delete_churn_from_two_clients_never_meets_a_locked_store() {
    let d = Daemon::start(&["--pool-size", "2"]);
    d.shop("shop");
    pool_is(&d, "shop", 2);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..12 {
                    let out = d.cli(&["fork", "shop", "--json"]);
                    assert_eq!(out.code, 0, "{out:?}");
                    let sb: Value = serde_json::from_str(&out.stdout).unwrap();
                    assert_eq!(psql(&dsn(&sb), "SELECT count(*) FROM orders").as_deref(), Ok("1000"));
                    let out = d.cli(&["rm", sb["id"].as_str().unwrap()]);
                    assert_eq!(out.code, 0, "{out:?}");
                }
            });
        }
    });
    pool_is(&d, "shop", 2);
    assert!(!d.logs().contains("database is locked"), "{}", d.logs());
}
