//! Building goldens from files, live databases and dumps; refresh, prune and removal.

use std::process::Command;

use crate::harness::{dsn, psql, split_password, sql, Daemon};

#[test]
fn a_failing_seed_names_file_and_line_and_leaves_nothing() {
    let d = Daemon::start(&[]);
    let dir = d.home.join("sql");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("schema.sql"), "CREATE TABLE t (id int PRIMARY KEY);\n").unwrap();
    std::fs::write(
        dir.join("seed.sql"),
        "INSERT INTO t VALUES (1);\n\nINSERT INTO t VALUES (1);\nINSERT INTO t VALUES (3);\n",
    )
    .unwrap();
    let (exit, err) = d.fails(&[
        "golden",
        "create",
        "broken",
        "--schema",
        dir.join("schema.sql").to_str().unwrap(),
        "--seed",
        dir.join("seed.sql").to_str().unwrap(),
    ]);
    assert_eq!(err["code"], "seed_failed");
    assert_eq!(exit, 7);
    let msg = err["message"].as_str().unwrap();
    assert!(msg.contains("seed.sql:3:"), "names file and line: {msg}");
    assert!(msg.contains("duplicate key value"), "carries PostgreSQL's message: {msg}");
    assert!(d.json(&["golden", "ls"]).as_array().unwrap().is_empty());
    let staging: Vec<_> = std::fs::read_dir(d.home.join("volume/staging")).unwrap().collect();
    assert!(staging.is_empty(), "no half-built golden is left");
    assert!(!d.home.join("volume/goldens/broken").exists());
    assert!(d.postmasters().is_empty(), "no build instance is left running");
    // The same name can be used once the file is fixed.
    std::fs::write(dir.join("seed.sql"), "INSERT INTO t VALUES (1);\n").unwrap();
    d.ok(&[
        "golden",
        "create",
        "broken",
        "--schema",
        dir.join("schema.sql").to_str().unwrap(),
        "--seed",
        dir.join("seed.sql").to_str().unwrap(),
    ]);
}

#[test]
fn bad_golden_requests_are_refused() {
    let d = Daemon::start(&[]);
    let (_, err) = d.fails(&["golden", "create", "empty"]);
    assert_eq!(err["code"], "invalid_request");
    let (_, err) = d.fails(&["golden", "create", "missing", "--schema", "/nonexistent/schema.sql"]);
    assert_eq!(err["code"], "file_unreadable");
    let (_, err) = d.fails(&["golden", "create", "Bad!"]);
    assert_eq!(err["code"], "invalid_name");
    d.shop("shop");
    let schema = d.home.join("sql/shop-schema.sql");
    let (exit, err) = d.fails(&["golden", "create", "shop", "--schema", schema.to_str().unwrap()]);
    assert_eq!(err["code"], "golden_exists");
    assert_eq!(exit, 5);
    let (_, err) = d.fails(&["golden", "show", "nope"]);
    assert_eq!(err["code"], "golden_not_found");
}

#[test]
fn goldens_record_a_manifest_and_objects_belong_to_a_non_superuser_owner() {
    let d = Daemon::start(&[]);
    let g = d.shop("shop");
    let m = &g["generations"][0];
    assert_eq!(m["generation"], 1);
    assert!(m["postgres_version"].as_str().unwrap().starts_with("15"));
    assert!(m["size_bytes"].as_u64().unwrap() > 1_000_000);
    assert_eq!(m["schema_hash"].as_str().unwrap().len(), 64);
    assert!(m["created_at"].as_str().is_some());
    assert_eq!(m["source"]["kind"], "files");
    let on_disk: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.home.join("volume/goldens/shop/1/manifest.json")).unwrap())
            .unwrap();
    assert_eq!(on_disk["schema_hash"], m["schema_hash"]);

    let sb = d.fork("shop", &[]);
    let owner = sql(&dsn(&sb), "SELECT tableowner FROM pg_tables WHERE tablename = 'orders'");
    assert_eq!(owner, "airlock_owner");
    assert_eq!(sql(&dsn(&sb), "SELECT rolsuper FROM pg_roles WHERE rolname = 'airlock_owner'"), "f");
    // Only the application database and template1 (closed to connections,
    // copied into a fork only at its first CREATE DATABASE) are kept: the
    // others' files would be cloned at every fork.
    assert_eq!(
        sql(
            &dsn(&sb),
            "SELECT string_agg(datname || ':' || datallowconn, ',' ORDER BY datname) FROM pg_database"
        ),
        "app:true,template1:false"
    );
    // The agent can change what the owner owns: a migration works.
    sql(
        &dsn(&sb),
        "ALTER TABLE orders ADD COLUMN note text; CREATE INDEX ON orders(status); DROP TABLE orders",
    );

    let listed = d.json(&["golden", "ls"]);
    assert_eq!(listed[0]["name"], "shop");
    assert!(d.ok(&["golden", "show", "shop"]).contains("schema"));
}

#[test]
fn from_url_copies_a_live_database_without_showing_its_password() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let source = d.fork("shop", &[]);
    sql(&dsn(&source), "INSERT INTO orders VALUES (5000, 'special', 1)");
    let (_, password) = split_password(&dsn(&source));
    // The DSN goes through stdin, so it never sits on a command line.
    let out = d.cli_with(&["golden", "create", "copy", "--from-url", "-", "--json"], Some(&dsn(&source)));
    assert_eq!(out.code, 0, "{out:?}\n{}", d.log());
    assert!(!out.stdout.contains(&password));
    let copy = d.fork("copy", &[]);
    assert_eq!(sql(&dsn(&copy), "SELECT count(*) FROM orders"), "1001");
    assert_eq!(
        sql(&dsn(&copy), "SELECT tableowner FROM pg_tables WHERE tablename = 'orders'"),
        "airlock_owner"
    );
    let shown = d.ok(&["golden", "show", "copy", "--json"]);
    assert!(!shown.contains(&password), "golden show redacts");
    assert!(shown.contains("airlock_agent@"), "but keeps the rest of the DSN: {shown}");
    let manifest = std::fs::read_to_string(d.home.join("volume/goldens/copy/1/manifest.json")).unwrap();
    assert!(!manifest.contains(&password));
    assert!(!d.ok(&["events", "--json"]).contains(&password));
    assert!(!d.log().contains(&password), "the daemon log never holds the password");
    // Refresh re-reads the same live source.
    sql(&dsn(&source), "INSERT INTO orders VALUES (5001, 'later', 1)");
    let g = d.json(&["golden", "refresh", "copy"]);
    assert_eq!(g["current_generation"], 2);
    assert_eq!(sql(&dsn(&d.fork("copy", &[])), "SELECT count(*) FROM orders"), "1002");

    // A wrong password fails with a clear error that still hides it.
    let wrong = dsn(&source).replace(&password, "wrongpassword123");
    let out = d.cli_with(&["golden", "create", "bad", "--from-url", "-", "--json"], Some(&wrong));
    assert_eq!(out.code, 7, "{out:?}");
    assert!(out.stdout.contains("source_failed"));
    assert!(!out.stdout.contains("wrongpassword123"));
}

#[test]
fn from_dump_takes_custom_and_plain_dumps() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let source = d.fork("shop", &[]);
    let (plain_dsn, password) = split_password(&dsn(&source));
    for (format, file) in [("custom", "shop.dump"), ("plain", "shop.sql")] {
        let path = d.home.join(file);
        let status = Command::new("pg_dump")
            .args(["--no-owner", "--no-acl", &format!("--format={format}"), "--file"])
            .arg(&path)
            .arg(&plain_dsn)
            .env("PGPASSWORD", &password)
            .status()
            .unwrap();
        assert!(status.success());
        let name = format!("from-{format}");
        d.json(&["golden", "create", &name, "--from-dump", path.to_str().unwrap()]);
        let sb = d.fork(&name, &[]);
        assert_eq!(sql(&dsn(&sb), "SELECT count(*) FROM orders"), "1000", "{format}");
    }
    // A plain dump that fails names its line.
    let bad = d.home.join("bad.sql");
    std::fs::write(&bad, "CREATE TABLE a (x int);\nINSERT INTO nowhere VALUES (1);\n").unwrap();
    let (_, err) = d.fails(&["golden", "create", "bad", "--from-dump", bad.to_str().unwrap()]);
    assert_eq!(err["code"], "source_failed");
    assert!(err["message"].as_str().unwrap().contains("bad.sql:2:"), "{err}");
}

#[test]
fn refresh_keeps_generations_in_use_and_prunes_the_rest() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let old = d.fork("shop", &[]);
    let seed = d.home.join("sql/shop-seed.sql");
    std::fs::write(&seed, "INSERT INTO orders SELECT g, 'paid', 1 FROM generate_series(1, 10) g;").unwrap();
    let g = d.json(&["golden", "refresh", "shop"]);
    assert_eq!(g["current_generation"], 2);
    assert_eq!(g["generations"].as_array().unwrap().len(), 2, "generation 1 is still in use");
    let new = d.fork("shop", &[]);
    assert_eq!(new["generation"], 2);
    assert_eq!(sql(&dsn(&new), "SELECT count(*) FROM orders"), "10");
    assert_eq!(sql(&dsn(&old), "SELECT count(*) FROM orders"), "1000");
    d.ok(&["rm", old["id"].as_str().unwrap()]);
    let g = d.json(&["golden", "show", "shop"]);
    assert_eq!(g["generations"].as_array().unwrap().len(), 1, "unused generation 1 is pruned: {g}");
    assert!(!d.home.join("volume/goldens/shop/1").exists());
    d.json(&["golden", "refresh", "shop"]);
    let g = d.json(&["golden", "show", "shop"]);
    let gens: Vec<i64> =
        g["generations"].as_array().unwrap().iter().map(|m| m["generation"].as_i64().unwrap()).collect();
    assert_eq!(gens, [2, 3], "generation 2 is kept for its sandbox");
}

#[test]
fn golden_rm_refuses_while_in_use_unless_forced() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let (exit, err) = d.fails(&["golden", "rm", "shop"]);
    assert_eq!(err["code"], "golden_in_use");
    assert_eq!(exit, 5);
    assert_eq!(sql(&dsn(&sb), "SELECT count(*) FROM orders"), "1000");
    d.ok(&["golden", "rm", "shop", "--force"]);
    assert!(psql(&dsn(&sb), "SELECT 1").is_err());
    assert!(d.ids().is_empty());
    assert!(d.postmasters().is_empty());
    assert!(!d.home.join("volume/goldens/shop").exists());
    assert!(d.json(&["golden", "ls"]).as_array().unwrap().is_empty());
}

#[test]
fn promote_turns_a_sandbox_into_a_golden_without_its_credential() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let url = dsn(&sb);
    sql(&url, "DELETE FROM orders WHERE status = 'cancelled'; CREATE TABLE agent_made (x int); INSERT INTO agent_made VALUES (7)");
    let id = sb["id"].as_str().unwrap();
    let g = d.json(&["promote", id, "--golden", "curated"]);
    assert_eq!(g["name"], "curated");
    assert_eq!(g["current_generation"], 1);
    assert_eq!(g["source"]["kind"], "promoted");
    // Forks of it hold the sandbox's state, under the owner role, with a fresh credential.
    let f = d.fork("curated", &[]);
    assert_eq!(sql(&dsn(&f), "SELECT count(*) FROM orders"), "750");
    assert_eq!(sql(&dsn(&f), "SELECT x FROM agent_made"), "7");
    assert_eq!(
        sql(&dsn(&f), "SELECT tableowner FROM pg_tables WHERE tablename = 'agent_made'"),
        "airlock_owner"
    );
    let (_, old_pw) = split_password(&url);
    let (plain, _) = split_password(&dsn(&f));
    let out = Command::new("psql")
        .arg(&plain)
        .args(["-XtAc", "SELECT 1"])
        .env("PGPASSWORD", old_pw)
        .output()
        .unwrap();
    assert!(!out.status.success(), "the promoted sandbox's password opens a fork of its golden");
    // The source sandbox carries on untouched.
    sql(&url, "INSERT INTO agent_made VALUES (8)");
    // Promoting into an existing golden adds a generation; a promoted golden has no source to refresh.
    let g = d.json(&["promote", id, "--golden", "curated"]);
    assert_eq!(g["current_generation"], 2);
    assert_eq!(sql(&dsn(&d.fork("curated", &[])), "SELECT count(*) FROM agent_made"), "2");
    let (_, err) = d.fails(&["golden", "refresh", "curated"]);
    assert_eq!(err["code"], "invalid_request");
    let (_, err) = d.fails(&["promote", "sb-nope", "--golden", "x"]);
    assert_eq!(err["code"], "sandbox_not_found");
}

#[test]
fn a_password_given_under_an_encoded_key_is_hidden_like_any_other() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let source = d.fork("shop", &[]);
    let (_, password) = split_password(&dsn(&source));
    // libpq reads `%70assword` as `password`: the redaction must too.
    let encoded = format!("{}&%70assword={password}", dsn(&source).replace(&format!(":{password}@"), "@"));
    let out = d.cli_with(&["golden", "create", "copy", "--from-url", "-", "--json"], Some(&encoded));
    assert_eq!(out.code, 0, "the password was used: {out:?}\n{}", d.log());
    assert!(!out.stdout.contains(&password), "{out:?}");
    assert!(!d.ok(&["golden", "show", "copy", "--json"]).contains(&password));
    let manifest = std::fs::read_to_string(d.home.join("volume/goldens/copy/1/manifest.json")).unwrap();
    assert!(!manifest.contains(&password));
    assert!(!d.ok(&["events", "--json"]).contains(&password));
    assert!(!d.log().contains(&password));
}
