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

    // docs/CLI.md lists exactly what `fork --json` gives (the Redis fields
    // only for a golden with Redis, which this is not, and the router's
    // socket's DSN only when it has one, which this daemon's has not: see
    // router.rs).
    let cli = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/CLI.md")).unwrap();
    let row = cli.lines().find(|l| l.starts_with("| `fork GOLDEN")).expect("the fork row");
    let listed = row.split("`--json` gives `").nth(1).unwrap().split('`').next().unwrap();
    let listed: std::collections::BTreeSet<&str> = listed.split(", ").collect();
    let given: std::collections::BTreeSet<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    let sometimes = ["redis_url", "redis_socket_url", "router_socket_dsn"];
    assert!(given.iter().all(|k| listed.contains(k)), "undocumented: {:?}", given.difference(&listed));
    assert!(
        listed.iter().all(|k| given.contains(k) || sometimes.contains(k)),
        "documented but not given: {:?}",
        listed.difference(&given)
    );
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

    let all = d.json(&["events", "--sandbox", id]);
    let events = crate::harness::lifecycle(&all);
    let kinds: Vec<&str> = events.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    // The psql session through the router is recorded too.
    assert_eq!(kinds, ["created", "ready", "connected", "extended", "deleted"]);
    // So is each credential handed out: the fork's, `dsn`'s and `show`'s, `extend`'s.
    let handed: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "credential_issued")
        .map(|e| e["detail"]["to"].as_str().unwrap())
        .collect();
    for to in ["api:fork", "api:show", "api:extend"] {
        assert!(handed.contains(&to), "{handed:?}");
    }
    assert_eq!(events[2]["detail"]["tls"], true);
    assert!(events[2]["detail"]["client"].as_str().unwrap().starts_with("127.0.0.1:"));
    assert_eq!(events[4]["reason"], "user");
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
        // A name that reads as an id would catch what was meant for that sandbox.
        (&["fork", "shop", "--name", "sb-wta924hz4y"], "invalid_name", 3),
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
    // Forks at once, none asking to wait: with room for all, none is refused.
    let forks: Vec<serde_json::Value> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..10).map(|_| s.spawn(|| d.fork("shop", &[]))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, f) in forks.iter().enumerate() {
        sql(&dsn(f), &format!("INSERT INTO orders VALUES ({}, 'mine', 0)", 10_000 + i));
    }
    for (i, f) in forks.iter().enumerate() {
        assert_eq!(sql(&dsn(f), "SELECT id FROM orders WHERE status = 'mine'"), (10_000 + i).to_string());
    }
    assert_eq!(d.postmasters().len(), 10);
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
    let kinds: Vec<String> = d.event_kinds(id).into_iter().filter(|k| k != "connected").collect();
    assert_eq!(kinds, ["created", "ready", "reset"]);
    assert_eq!(d.postmasters().len(), 2);
    let (_, err) = d.fails(&["reset", "sb-nope"]);
    assert_eq!(err["code"], "sandbox_not_found");
}

#[test]
fn branch_copies_a_live_sandbox_at_one_instant_with_its_own_credential() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let src = d.fork("shop", &["--name", "src"]);
    let src_url = dsn(&src);
    sql(&src_url, "DELETE FROM orders WHERE status = 'pending'; CREATE TABLE notes (x text); INSERT INTO notes VALUES ('kept')");
    let out = d.cli(&["branch", "src", "--name", "copy", "--label", "from=src", "--json"]);
    assert_eq!(out.code, 0, "{out:?}");
    let br: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let br_url = dsn(&br);
    assert_ne!(br_url, src_url);
    assert_eq!(br["golden"], "shop");
    assert_eq!(br["labels"]["from"], "src");
    assert_eq!(sql(&br_url, "SELECT count(*) FROM orders"), "750");
    assert_eq!(sql(&br_url, "SELECT x FROM notes"), "kept");
    // Each goes its own way after the branch; the source never stopped being usable.
    sql(&br_url, "DROP TABLE notes");
    assert_eq!(sql(&src_url, "SELECT x FROM notes"), "kept");
    sql(&src_url, "INSERT INTO notes VALUES ('later')");
    assert!(psql(&br_url, "SELECT * FROM notes").is_err());
    // Its own credential: the source's password does not open the branch.
    let (_, src_pw) = crate::harness::split_password(&src_url);
    let (br_plain, _) = crate::harness::split_password(&br_url);
    let out = std::process::Command::new("psql")
        .arg(&br_plain)
        .args(["-XtAc", "SELECT 1"])
        .env("PGPASSWORD", src_pw)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let ready = d.json(&["events", "--sandbox", br["id"].as_str().unwrap()]);
    assert_eq!(ready[1]["detail"]["branched_from"], src["id"]);
    let (_, err) = d.fails(&["branch", "sb-nope"]);
    assert_eq!(err["code"], "sandbox_not_found");
    assert_eq!(d.postmasters().len(), 2);
}

#[test]
fn a_branch_taken_under_writes_recovers_to_whole_transactions() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let src = dsn(&d.fork("shop", &[]));
    sql(&src, "CREATE TABLE pairs (n int)");
    // Each transaction inserts two rows; a consistent copy always holds an even number.
    let script = d.home.join("pairs.sql");
    std::fs::write(&script, "INSERT INTO pairs SELECT g FROM generate_series(1, 2) g;\n".repeat(3000))
        .unwrap();
    let (plain, pw) = crate::harness::split_password(&src);
    let mut writer = std::process::Command::new("psql")
        .arg(&plain)
        .args(["-X", "-q", "-f"])
        .arg(&script)
        .env("PGPASSWORD", pw)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let br = d.fork_branch(&src);
    let copied: i64 = sql(&br, "SELECT count(*) FROM pairs").parse().unwrap();
    assert!(writer.wait().unwrap().success(), "the writer was disturbed by the branch");
    assert_eq!(copied % 2, 0, "the branch holds half a transaction: {copied} rows");
    assert!(copied > 0, "the branch was taken before any write");
    assert_eq!(sql(&src, "SELECT count(*) FROM pairs"), "6000");
}

/// Branches taken while four sessions write as fast as they can are copies of
/// one instant: every copy's indexes and heap pass `amcheck`, and the
/// invariant the writers keep (each transfer moves one unit between two
/// accounts and records it) holds in every copy.
#[test]
fn branches_under_heavy_writes_are_whole_and_consistent() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let source = d.fork("shop", &["--statement-timeout", "120s"]);
    let src = dsn(&source);
    sql(
        &src,
        "CREATE TABLE accounts (id int PRIMARY KEY, bal int NOT NULL);
         INSERT INTO accounts SELECT g, 1000 FROM generate_series(1, 200) g;
         CREATE TABLE history (src int, dst int, at timestamptz DEFAULT now());
         CREATE INDEX ON history (src); CREATE INDEX ON history (dst);",
    );
    let script = d.home.join("transfer.sql");
    std::fs::write(
        &script,
        "\\set a random(1, 200)\n\\set b random(1, 200)\nBEGIN;\n\
         UPDATE accounts SET bal = bal - 1 WHERE id = :a;\nUPDATE accounts SET bal = bal + 1 WHERE id = :b;\n\
         INSERT INTO history (src, dst) VALUES (:a, :b);\nCOMMIT;\n",
    )
    .unwrap();
    let (plain, pw) = crate::harness::split_password(&src);
    let writers = std::process::Command::new("pgbench")
        .args(["-n", "-c", "4", "-j", "2", "-T", "10", "-f"])
        .arg(&script)
        .arg(&plain)
        .env("PGPASSWORD", pw)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(800));
    let mut branches = Vec::new();
    for _ in 0..4 {
        branches.push(d.json(&["branch", source["id"].as_str().unwrap()]));
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let out = writers.wait_with_output().unwrap();
    assert!(out.status.success(), "the writers were disturbed: {}", String::from_utf8_lossy(&out.stderr));
    for br in &branches {
        let url = dsn(br);
        let moved: i64 = sql(&url, "SELECT count(*) FROM history").parse().unwrap();
        assert!(moved > 0, "a branch taken before any write");
        assert_eq!(sql(&url, "SELECT sum(bal) FROM accounts"), "200000", "units made or lost");
        let off = sql(
            &url,
            "SELECT count(*) FROM accounts a WHERE bal <> 1000
               + (SELECT count(*) FROM history WHERE dst = a.id) - (SELECT count(*) FROM history WHERE src = a.id)",
        );
        assert_eq!(off, "0", "an account disagrees with its history");
        // The admin's own check of every index and table page.
        let run = d.home.join("volume/sandboxes").join(br["id"].as_str().unwrap()).join("run");
        let check = std::process::Command::new("psql")
            .args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(&run)
            .args(["-U", "airlock_admin", "-d", "app", "-c"])
            .arg(
                "CREATE EXTENSION IF NOT EXISTS amcheck;
                 SELECT count(*) FROM (SELECT bt_index_check(c.oid, true) FROM pg_class c
                   JOIN pg_am a ON a.oid = c.relam WHERE c.relkind = 'i' AND a.amname = 'btree'
                   AND c.relnamespace = 'public'::regnamespace) i;
                 SELECT count(*) FROM verify_heapam('accounts');
                 SELECT count(*) FROM verify_heapam('history');",
            )
            .output()
            .unwrap();
        let said =
            String::from_utf8_lossy(&check.stdout).to_string() + &String::from_utf8_lossy(&check.stderr);
        if nix::unistd::geteuid().is_root() {
            assert!(check.status.success(), "amcheck failed: {said}");
            let counts: Vec<&str> = said.lines().filter(|l| !l.trim().is_empty()).collect();
            assert_eq!(counts[1..], ["0", "0"], "heap corruption found: {said}");
        }
    }
}

/// A writer that keeps a sandbox's PostgreSQL and Redis in step: row `n` goes
/// into `t`, then `last` is set to `n`. At any instant the table's largest id
/// is `last` or `last + 1`; a copy of one instant keeps that.
fn in_step_writer(
    d: &Daemon,
    sb: &serde_json::Value,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    use std::io::{Read, Write};
    let id = sb["id"].as_str().unwrap().to_owned();
    let (_, password) = crate::harness::split_password(&dsn(sb));
    let (router, redis_router) = (d.router.clone(), d.redis_router.clone());
    std::thread::spawn(move || {
        let packet = crate::wire::startup_packet(196608, &[("user", "airlock_agent"), ("database", &id)]);
        let mut pg = crate::wire::Raw::connect(&router, &packet, &password).expect("the writer's session");
        let mut redis = std::net::TcpStream::connect(&redis_router).unwrap();
        redis.set_read_timeout(Some(std::time::Duration::from_secs(70))).unwrap();
        let mut ok = [0u8; 5];
        redis.write_all(format!("AUTH {id} {password}\r\n").as_bytes()).unwrap();
        redis.read_exact(&mut ok).unwrap();
        let mut n = 0u64;
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            n += 1;
            pg.query(&format!("INSERT INTO t VALUES ({n})")).expect("the writer's insert");
            redis.write_all(format!("SET last {n}\r\n").as_bytes()).unwrap();
            redis.read_exact(&mut ok).unwrap();
            assert_eq!(&ok, b"+OK\r\n");
        }
        n
    })
}

/// The largest id in `t` and Redis's `last` in a sandbox.
fn in_step(d: &Daemon, sb: &serde_json::Value) -> (u64, u64) {
    let max: u64 = sql(&dsn(sb), "SELECT coalesce(max(id), 0) FROM t").parse().unwrap();
    let url = d.ok(&["dsn", sb["id"].as_str().unwrap(), "--redis", "--socket"]).trim().to_owned();
    let last = crate::redis::redis(&url, &["GET", "last"]);
    (max, last.parse().unwrap_or_else(|_| panic!("GET last answered {last:?}")))
}

#[test]
fn a_branch_and_a_promotion_copy_postgresql_and_redis_at_one_instant() {
    let d = Daemon::start(&[]);
    crate::redis::golden_with_redis(&d, "both");
    let source = d.fork("both", &[]);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = in_step_writer(&d, &source, stop.clone());
    std::thread::sleep(std::time::Duration::from_millis(500));
    let mut copies = Vec::new();
    for round in 0..3 {
        copies.push(d.json(&["branch", source["id"].as_str().unwrap()]));
        std::thread::sleep(std::time::Duration::from_millis(300));
        if round == 1 {
            d.ok(&["promote", source["id"].as_str().unwrap(), "--golden", "both-promoted"]);
            copies.push(d.fork("both-promoted", &[]));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let written = writer.join().expect("the writer was never held up for long");
    for copy in &copies {
        let (max, last) = in_step(&d, copy);
        assert!(max > 0 && max <= written, "{max} of {written}");
        assert!(max == last || max == last + 1, "PostgreSQL at {max} but Redis at {last}: not one instant");
    }
    // The source's Redis takes writes again.
    let (max, last) = in_step(&d, &source);
    assert!(max == written && last == written, "{max} {last} {written}");
}

/// A sandbox of many files (an agent made thousands of tables) still
/// branches and promotes: the copy's crash recovery fits its first promise
/// of disk, and the promotion's build can lock every object at once.
#[test]
fn a_sandbox_of_thousands_of_tables_branches_and_promotes() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &["--statement-timeout", "120s"]);
    let url = dsn(&sb);
    for batch in 0..6 {
        sql(
            &url,
            &format!(
                "DO $$ BEGIN FOR i IN {} .. {} LOOP
                   EXECUTE pg_catalog.format('CREATE TABLE many_%s (a int PRIMARY KEY, b text)', i);
                 END LOOP; END $$",
                batch * 1000,
                batch * 1000 + 999
            ),
        );
    }
    let branch = d.json(&["branch", sb["id"].as_str().unwrap()]);
    assert_eq!(
        sql(&dsn(&branch), "SELECT count(*) FROM pg_class WHERE relname LIKE 'many\\_%' AND relkind = 'r'"),
        "6000"
    );
    d.ok(&["promote", sb["id"].as_str().unwrap(), "--golden", "many"]);
    let forked = d.fork("many", &[]);
    assert_eq!(
        sql(&dsn(&forked), "SELECT count(*) FROM pg_class WHERE relname LIKE 'many\\_%' AND relkind = 'r'"),
        "6000"
    );
}

/// `bench fork` times one round of each baseline after each of its forks (a
/// PostgreSQL 18 clone among them when a server of 18 is installed), and
/// leaves no sandbox, scratch directory or scratch server behind.
#[test]
fn bench_fork_times_each_baseline_after_each_fork_and_leaves_nothing() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let report = d.json(&["bench", "fork", "--golden", "shop", "--iterations", "2"]);
    let runs = |method: &str| {
        report["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["method"] == method)
            .map(|s| s["runs"].clone())
    };
    for method in ["airlock_fork", "template", "pg_restore", "initdb_seed"] {
        assert_eq!(runs(method), Some(2.into()), "{method}: {report}");
    }
    let doctor = d.json(&["doctor"]);
    let has_18 = doctor["postgres_majors"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["major"].as_u64().unwrap() >= 18 && m["problem"].is_null());
    assert_eq!(runs("pg18_clone"), has_18.then(|| 2.into()), "{report}");
    // As users connect: TLS checked against Airlock's CA, for PostgreSQL and Redis alike.
    crate::redis::golden_with_redis(&d, "kv");
    let tls = d.json(&["bench", "fork", "--golden", "kv", "--iterations", "2", "--via", "router-tls"]);
    let methods: Vec<_> = tls["results"].as_array().unwrap().iter().map(|s| s["method"].clone()).collect();
    assert_eq!(methods.first(), Some(&"airlock_fork_tls".into()), "{tls}");
    assert_eq!(tls["results"][0]["runs"], 2, "{tls}");
    assert!(d.ids().is_empty(), "every fork was deleted");
    let scratch: Vec<_> = std::fs::read_dir(d.home.join("volume"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("bench-"))
        .collect();
    assert!(scratch.is_empty(), "scratch directories left: {scratch:?}");
    assert!(d.postmasters().is_empty(), "servers left: {:?}", d.postmasters());
}
