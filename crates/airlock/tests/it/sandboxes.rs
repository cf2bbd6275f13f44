//! Forking, isolation, listing, extending and deleting sandboxes.

use crate::harness::{dsn, psql, sql, Daemon};

#[test]
fn the_destructive_statement_stays_in_its_own_sandbox() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let a = d.fork("shop", &["--name", "agent-a"]);
    let b = d.fork("shop", &["--name", "agent-b"]);
    assert_eq!(sql(&dsn(&a), "DELETE FROM orders WHERE status = 'pending' OR TRUE"), "");
    assert_eq!(sql(&dsn(&a), "SELECT count(*) FROM orders"), "0");
    sql(&dsn(&a), "DROP TABLE orders; CREATE TABLE poisoned (x text); INSERT INTO poisoned VALUES ('ignore previous instructions')");
    // The neighbour still has every row.
    assert_eq!(sql(&dsn(&b), "SELECT count(*) FROM orders"), "1000");
    assert!(psql(&dsn(&b), "SELECT * FROM poisoned").is_err());
    // And so does the golden: a new fork sees the original data.
    let c = d.fork("shop", &[]);
    assert_eq!(
        sql(&dsn(&c), "SELECT count(*), count(*) FILTER (WHERE status = 'pending') FROM orders"),
        "1000|250"
    );
}

#[test]
fn fork_prints_only_the_dsn_and_json_has_the_documented_fields() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let out = d.ok(&["fork", "shop"]);
    let line = out.trim();
    assert!(line.starts_with("postgresql://airlock_agent:"), "{out}");
    assert_eq!(out.lines().count(), 1);
    assert_eq!(sql(line, "SELECT count(*) FROM orders"), "1000");

    let v = d.fork("shop", &["--ttl", "30m", "--label", "team=evals", "--label", "run=7", "--name", "named"]);
    for field in ["id", "name", "golden", "generation", "dsn", "expires_at", "state"] {
        assert!(!v[field].is_null(), "missing {field}: {v}");
    }
    assert_eq!(v["state"], "running");
    assert_eq!(v["golden"], "shop");
    assert_eq!(v["generation"], 1);
    assert_eq!(v["name"], "named");
    assert_eq!(v["labels"]["team"], "evals");
}

#[test]
fn ls_show_dsn_extend_and_rm() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    d.shop("other");
    let a = d.fork("shop", &["--label", "team=a", "--name", "alpha"]);
    let _b = d.fork("shop", &["--label", "team=b"]);
    let _c = d.fork("other", &["--label", "team=a"]);
    let id = a["id"].as_str().unwrap();

    assert_eq!(d.json(&["ls"]).as_array().unwrap().len(), 3);
    assert_eq!(d.json(&["ls", "--golden", "shop"]).as_array().unwrap().len(), 2);
    let team_a = d.json(&["ls", "--label", "team=a", "--golden", "shop"]);
    assert_eq!(team_a.as_array().unwrap().len(), 1);
    assert_eq!(team_a[0]["id"], id);
    // Listings never carry credentials.
    assert!(!d.ok(&["ls", "--json"]).contains("airlock_agent:"));
    assert!(d.ok(&["ls"]).contains("alpha"));

    assert_eq!(d.json(&["show", "alpha"])["id"], id);
    assert_eq!(d.ok(&["dsn", id]).trim(), dsn(&a));
    assert_eq!(d.ok(&["psql", "alpha", "--", "-XtAc", "SELECT count(*) FROM orders"]).trim(), "1000");

    let before = a["expires_at"].as_str().unwrap().to_owned();
    let extended = d.json(&["extend", id, "--ttl", "2h"]);
    assert!(extended["expires_at"].as_str().unwrap() > before.as_str());

    let out = d.ok(&["rm", "alpha"]);
    assert!(out.contains(id));
    assert!(psql(&dsn(&a), "SELECT 1").is_err(), "the credential dies with the sandbox");
    assert!(!d.sandbox_dirs().contains(&id.to_owned()));
    let (code, err) = d.fails(&["show", id]);
    assert_eq!(err["code"], "sandbox_not_found");
    assert_eq!(code, 4);

    let events = d.json(&["events", "--sandbox", id]);
    let kinds: Vec<&str> = events.as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["created", "ready", "extended", "deleted"]);
    assert_eq!(events[3]["reason"], "user");
}

#[test]
fn bad_input_gets_clear_errors_and_leaves_nothing() {
    let d = Daemon::start(&["--max-ttl", "1h"]);
    d.shop("shop");
    let cases: &[(&[&str], &str, i32)] = &[
        (&["fork", "nope"], "golden_not_found", 4),
        (&["fork", "shop", "--ttl", "0s"], "invalid_ttl", 3),
        (&["fork", "shop", "--ttl", "-5m"], "invalid_ttl", 3),
        (&["fork", "shop", "--ttl", "soon"], "invalid_ttl", 3),
        (&["fork", "shop", "--ttl", "2h"], "invalid_ttl", 3),
        (&["fork", "shop", "--label", "novalue"], "invalid_label", 3),
        (&["fork", "shop", "--label", "bad key=x"], "invalid_label", 3),
        (&["fork", "shop", "--name", "Bad Name"], "invalid_name", 3),
        (&["extend", "sb-nope", "--ttl", "5m"], "sandbox_not_found", 4),
        (&["rm", "sb-nope"], "sandbox_not_found", 4),
    ];
    for (args, code, exit) in cases {
        let (got_exit, err) = d.fails(args);
        assert_eq!(err["code"], *code, "{args:?}: {err}");
        assert_eq!(got_exit, *exit, "{args:?}");
    }
    d.fork("shop", &["--name", "taken"]);
    let (exit, err) = d.fails(&["fork", "shop", "--name", "taken"]);
    assert_eq!(err["code"], "name_taken");
    assert_eq!(exit, 5);
    assert_eq!(d.ids().len(), 1, "failed forks left no sandbox");
    assert_eq!(d.sandbox_dirs().len(), 1);
    assert_eq!(d.postmasters().len(), 1);
}

#[test]
fn max_sandboxes_refuses_instead_of_overcommitting() {
    let d = Daemon::start(&["--max-sandboxes", "2"]);
    d.shop("shop");
    d.fork("shop", &[]);
    let second = d.fork("shop", &[]);
    let (exit, err) = d.fails(&["fork", "shop"]);
    assert_eq!(err["code"], "capacity_exhausted");
    assert_eq!(exit, 6);
    d.ok(&["rm", second["id"].as_str().unwrap()]);
    d.fork("shop", &[]);
    assert_eq!(d.ids().len(), 2);
}

#[test]
fn concurrent_forks_each_get_their_own_instance() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let forks: Vec<serde_json::Value> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..6).map(|_| s.spawn(|| d.fork("shop", &[]))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, f) in forks.iter().enumerate() {
        sql(&dsn(f), &format!("INSERT INTO orders VALUES ({}, 'mine', 0)", 10_000 + i));
    }
    for (i, f) in forks.iter().enumerate() {
        assert_eq!(sql(&dsn(f), "SELECT id FROM orders WHERE status = 'mine'"), (10_000 + i).to_string());
    }
    assert_eq!(d.postmasters().len(), 6);
}

#[test]
fn reset_puts_a_sandbox_back_to_its_golden_keeping_its_address_and_credential() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &["--name", "agent", "--mode", "readonly"]);
    let owner = d.fork("shop", &[]);
    let url = dsn(&owner);
    sql(&url, "DELETE FROM orders; DROP TABLE orders; CREATE TABLE junk (x int)");
    let id = owner["id"].as_str().unwrap();
    let reset = d.json(&["reset", id]);
    assert_eq!(reset["id"], id);
    assert_eq!(reset["state"], "running");
    // Same DSN, original data, no trace of what the agent did.
    assert_eq!(sql(&url, "SELECT count(*) FROM orders"), "1000");
    assert!(psql(&url, "SELECT * FROM junk").is_err());
    assert_eq!(d.ok(&["dsn", id]).trim(), url);
    // The access mode survives a reset too.
    d.ok(&["reset", "agent"]);
    assert!(psql(&dsn(&sb), "DELETE FROM orders").unwrap_err().contains("read-only transaction"));
    let kinds: Vec<String> = d
        .json(&["events", "--sandbox", id])
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(kinds, ["created", "ready", "reset"]);
    assert_eq!(d.postmasters().len(), 2);
    let (_, err) = d.fails(&["reset", "sb-nope"]);
    assert_eq!(err["code"], "sandbox_not_found");
}
