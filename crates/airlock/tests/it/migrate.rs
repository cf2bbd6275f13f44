//! The migration airlock: real migrations on forks of a golden with realistic row
//! counts, what each is measured to do, the verdicts, and promote's guards.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::{json, Value};

use crate::harness::{sql, Daemon, BIN};

pub const SCHEMA: &str = "
CREATE TABLE tenants (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE users (id bigserial PRIMARY KEY, tenant_id int NOT NULL REFERENCES tenants(id),
                    email text NOT NULL, nickname text, score int NOT NULL DEFAULT 0);
CREATE TABLE orders (id int PRIMARY KEY, user_id bigint NOT NULL REFERENCES users(id) ON DELETE CASCADE,
                     total numeric(10,2) NOT NULL, note text);
CREATE INDEX orders_user ON orders (user_id);
CREATE VIEW big_orders AS SELECT * FROM orders WHERE total > 500;";

pub const SEED: &str = "
INSERT INTO tenants SELECT g, 'tenant ' || g FROM generate_series(1, 10) g;
INSERT INTO users (tenant_id, email, nickname)
  SELECT 1 + g % 10, 'u' || (g % 19000) || '@x.test', CASE WHEN g % 3 = 0 THEN NULL ELSE 'n' || g END
  FROM generate_series(1, 20000) g;
INSERT INTO orders SELECT g, 1 + g % 20000, g % 1000, NULL FROM generate_series(1, 100000) g;";

/// A daemon with the `app` golden (10 tenants, 20,000 users, 100,000 orders).
pub fn daemon() -> Daemon {
    let d = Daemon::start(&[]);
    d.golden("app", SCHEMA, SEED);
    d
}

/// Writes candidate files under the data root; returns their paths.
pub fn files(d: &Daemon, candidates: &[(&str, &str)]) -> Vec<PathBuf> {
    let dir = d.home.join("migrations");
    std::fs::create_dir_all(&dir).unwrap();
    candidates
        .iter()
        .map(|(name, text)| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            path
        })
        .collect()
}

/// Runs `migrate test --json` with `args`; returns the exit code and the report.
pub fn test(d: &Daemon, args: &[&str]) -> (i32, Value) {
    let mut all = vec!["migrate", "test", "--golden", "app", "--json"];
    all.extend_from_slice(args);
    let out = d.cli(&all);
    let v = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}"));
    (out.code, v)
}

pub fn by_name(report: &Value) -> BTreeMap<String, Value> {
    report["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap().to_owned(), c.clone()))
        .collect()
}

/// Candidate `c`'s hazard of `kind`; fails the test if it has none.
pub fn hazard<'a>(c: &'a Value, kind: &str) -> &'a Value {
    c["hazards"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}: {c}"))
}

pub fn hazard_kinds(c: &Value) -> Vec<&str> {
    c["hazards"].as_array().unwrap().iter().map(|h| h["kind"].as_str().unwrap()).collect()
}

fn change_lines(c: &Value, field: &str) -> Vec<String> {
    c[field]
        .as_array()
        .unwrap()
        .iter()
        .map(|ch| {
            format!(
                "{} {} {}",
                ch["change"].as_str().unwrap(),
                ch["object"].as_str().unwrap(),
                ch["name"].as_str().unwrap()
            )
        })
        .collect()
}

pub fn path_strs(paths: &[PathBuf]) -> Vec<&str> {
    paths.iter().map(|p| p.to_str().unwrap()).collect()
}

#[test]
fn each_candidate_is_measured_on_its_own_fork_of_real_data() {
    let d = daemon();
    let paths = files(
        &d,
        &[
            ("safe.sql", "ALTER TABLE users ADD COLUMN bio text;"),
            ("volatile.sql", "ALTER TABLE orders ADD COLUMN created_at timestamptz DEFAULT clock_timestamp();"),
            ("bigint.sql", "ALTER TABLE users ALTER COLUMN score TYPE bigint;"),
            ("notnull.sql", "-- every user has a nickname, surely\nALTER TABLE users ALTER COLUMN nickname SET NOT NULL;"),
            ("unique.sql", "CREATE UNIQUE INDEX users_email ON users (email);"),
            ("no_tenant_filter.sql", "DELETE FROM users WHERE score = 0;"),
            ("drop_cascade.sql", "DROP TABLE orders CASCADE;"),
            ("concurrently.sql", "CREATE INDEX CONCURRENTLY orders_total ON orders (total);"),
            (
                "dynamic.sql",
                "DO $$\nDECLARE t text;\nBEGIN\n  FOR t IN SELECT unnest(ARRAY['users', 'orders']) LOOP\n    \
                 EXECUTE format('ALTER TABLE %I ADD COLUMN archived boolean NOT NULL DEFAULT false', t);\n  \
                 END LOOP;\nEND $$;",
            ),
            (
                "explicit.sql",
                "BEGIN;\nALTER TABLE users ADD COLUMN plan text;\nUPDATE users SET plan = 'free' WHERE id % 2 = 0;\nCOMMIT;\n\
                 CREATE INDEX CONCURRENTLY users_plan ON users (plan);",
            ),
            ("late_error.sql", "ALTER TABLE users ADD COLUMN a int;\n\nSELECT pg_sleep(0.01);\nALTER TABLE users ADD COLUMN a int;"),
        ],
    );
    // Long locks over --max-lock are judged in migrate_verdicts.rs.
    let mut args = path_strs(&paths);
    args.extend(["--max-lock", "10min"]);
    let (code, report) = test(&d, &args);
    assert_eq!(code, 12, "some candidates fail: {report}");
    assert_eq!(report["passed"], false);
    let c = by_name(&report);

    // A nullable column: fast, no rewrite, only its column in the diff (the probe never shows).
    let safe = &c["safe.sql"];
    assert_eq!((safe["passed"].as_bool(), hazard_kinds(safe).len()), (Some(true), 0), "{safe}");
    assert_eq!(change_lines(safe, "changes"), ["added column users.bio"]);
    assert_eq!(safe["statements"][0]["tag"], "ALTER TABLE");
    assert_eq!(safe["sha256"].as_str().unwrap().len(), 64);

    // A volatile default rewrites the table.
    let volatile = &c["volatile.sql"];
    assert_eq!(hazard_kinds(volatile), ["table_rewrite"]);
    let rewrite = &volatile["statements"][0]["rewrites"][0];
    assert_eq!((rewrite["table"].as_str(), rewrite["rows"].as_i64()), (Some("public.orders"), Some(100000)));
    assert!(rewrite["reason"].as_str().unwrap().contains("volatile default"));
    assert_eq!(volatile["hazards"][0]["severity"], "high");

    // integer to bigint: a rewrite under ACCESS EXCLUSIVE, held until the commit.
    let bigint = &c["bigint.sql"];
    // (A wider integer is no break for the application's running code.)
    assert_eq!(hazard_kinds(bigint), ["table_rewrite"]);
    assert!(bigint["statements"][0]["rewrites"][0]["reason"].as_str().unwrap().contains("type changed"));
    let lock = bigint["statements"][0]["locks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["relation"] == "public.users" && l["mode"] == "ACCESS EXCLUSIVE")
        .expect("ACCESS EXCLUSIVE on users");
    assert_eq!(lock["kind"], "table");
    assert!(lock["held_ms"].as_f64().unwrap() >= bigint["statements"][0]["duration_ms"].as_f64().unwrap());
    assert_eq!(change_lines(bigint, "changes"), ["changed column users.score"]);

    // Failures that only real data causes, with the statement's line and PostgreSQL's error.
    let notnull = &c["notnull.sql"];
    assert_eq!(hazard_kinds(notnull), ["fails_on_data"]);
    assert_eq!(
        (notnull["failure"]["line"].as_u64(), notnull["failure"]["error"]["sqlstate"].as_str()),
        (Some(2), Some("23502"))
    );
    let unique = &c["unique.sql"];
    assert_eq!(hazard_kinds(unique), ["fails_on_data"]);
    assert!(unique["failure"]["error"]["detail"].as_str().unwrap().contains("is duplicated"));

    // A DELETE without a tenant filter: every user, and by cascade every order.
    let delete = &c["no_tenant_filter.sql"];
    assert_eq!(delete["statements"][0]["tag"], "DELETE 20000");
    let rows: BTreeMap<&str, i64> = delete["statements"][0]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["table"].as_str().unwrap(), r["deleted"].as_i64().unwrap()))
        .collect();
    assert_eq!(rows, BTreeMap::from([("public.users", 20000), ("public.orders", 100000)]));
    assert_eq!(hazard_kinds(delete), ["mass_delete", "mass_delete", "rows_deleted", "rows_deleted"]);
    assert!(delete["hazards"][0]["suggestion"].as_str().unwrap().contains("batches"));

    // DROP TABLE ... CASCADE takes a view with it.
    let drop = &c["drop_cascade.sql"];
    // The table's own constraints, indexes and defaults are its parts, not a cascade's reach.
    assert_eq!(hazard_kinds(drop), ["table_dropped", "cascade", "breaks_compatibility"], "{drop}");
    assert!(drop["hazards"][0]["message"].as_str().unwrap().contains("holding 100000 rows"));
    assert!(drop["hazards"][1]["message"].as_str().unwrap().contains("view public.big_orders"));
    assert_eq!(change_lines(drop, "changes"), ["dropped table orders", "dropped view big_orders"]);

    // CREATE INDEX CONCURRENTLY runs outside a transaction, its lock does not block writes.
    let cic = &c["concurrently.sql"];
    assert_eq!(cic["passed"], true, "{cic}");
    assert_eq!(cic["statements"][0]["transaction"], "none");
    // (Its new index is briefly locked exclusively while it is created: nobody else can use it yet.)
    // Its table lock is found by sampling pg_locks every 5 ms during the
    // statement (about 140 ms here), on a thread of the sampler's own: on the
    // daemon's runtime, other candidates' forks cloning files in place held
    // the sampling up past the whole statement in the suite's run.
    let table_locks: Vec<&Value> =
        cic["statements"][0]["locks"].as_array().unwrap().iter().filter(|l| l["kind"] == "table").collect();
    assert!(
        !table_locks.is_empty()
            && table_locks.iter().all(|l| l["blocking"] == false && l["observed"] == true),
        "{} table lock(s) seen: {cic}\n{}",
        table_locks.len(),
        d.log()
    );

    // A DO block with dynamic SQL: both tables altered, without rewrites (a constant default).
    // (Code: a person accepts it by its hash before it is promoted.)
    let dynamic = &c["dynamic.sql"];
    assert_eq!(hazard_kinds(dynamic), ["opaque_code"], "{dynamic}");
    assert_eq!(
        change_lines(dynamic, "changes"),
        ["added column orders.archived", "added column users.archived"]
    );

    // The file's own transaction is respected: locks are held to its COMMIT.
    let explicit = &c["explicit.sql"];
    let statements = explicit["statements"].as_array().unwrap();
    let kinds: Vec<&str> = statements.iter().map(|s| s["transaction"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["explicit", "explicit", "explicit", "explicit", "none"]);
    assert_eq!(statements[2]["rows"][0]["updated"], 10000);
    let users_lock =
        statements[1]["locks"].as_array().unwrap().iter().find(|l| l["relation"] == "public.users").unwrap();
    let held = users_lock["held_ms"].as_f64().unwrap();
    assert!(held >= statements[2]["duration_ms"].as_f64().unwrap(), "{explicit}");
    // ... and held while the UPDATE works through the table: certain, whatever the machine's speed.
    assert_eq!(hazard_kinds(explicit), ["long_lock"]);
    assert!(
        explicit["hazards"][0]["message"].as_str().unwrap().contains("while line(s) 3 read or write"),
        "{explicit}"
    );

    // The first failing statement stops the candidate; its line is the file's.
    let late = &c["late_error.sql"];
    assert_eq!(
        (late["failure"]["line"].as_u64(), late["statements"].as_array().unwrap().len()),
        (Some(4), 3)
    );
    // The file runs whole, in one transaction, as promote runs it: line 4's
    // failure leaves nothing of line 1 behind (no partial commit), and line
    // 1's lock was held while line 3's query ran.
    assert_eq!(hazard_kinds(late), ["failed", "long_lock"]);
    assert!(late["statements"][0]["txn"] == late["statements"][2]["txn"], "{late}");

    // The ranking names the best passing candidate; the golden is untouched.
    let ranking: Vec<&str> =
        report["ranking"].as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect();
    assert!(["safe.sql", "concurrently.sql", "dynamic.sql"].contains(&ranking[0]), "{ranking:?}");
    assert_eq!(report["best"].as_str(), Some(ranking[0]));
    assert_eq!(*ranking.last().unwrap(), "drop_cascade.sql");
    let fresh = d.fork("app", &[]);
    assert_eq!(sql(&crate::harness::dsn(&fresh), "SELECT count(*) FROM orders"), "100000");
    // Every fork it made is gone.
    assert_eq!(d.json(&["ls"]).as_array().unwrap().len(), 1);
}

#[test]
fn commands_expectations_and_assertions() {
    let d = daemon();
    let paths = files(
        &d,
        &[
            ("add_plan.sql", "ALTER TABLE users ADD COLUMN plan text NOT NULL DEFAULT 'free';"),
            ("expected.sql", &format!("{SCHEMA}\nALTER TABLE users ADD COLUMN plan text NOT NULL DEFAULT 'free';")),
            ("checks.sql", "SELECT count(*) = 20000 FROM users WHERE plan = 'free';\nSELECT id FROM users WHERE plan IS NULL;"),
            ("failing_check.sql", "SELECT count(*) = 0 FROM users;"),
        ],
    );
    let (code, report) = test(
        &d,
        &[
            paths[0].to_str().unwrap(),
            "--exec",
            "psql \"$DATABASE_URL\" -v ON_ERROR_STOP=1 -c \"ALTER TABLE users ADD COLUMN plan text NOT NULL DEFAULT 'free'\"",
            "--exec",
            "psql \"$DATABASE_URL\" -v ON_ERROR_STOP=1 -c 'DELETE FROM orders WHERE id <= 10' -c 'ALTER TABLE users ADD COLUMN plan text'",
            "--exec",
            "echo migrating; exit 3",
            // As the golden's owner, as a SQL candidate runs: a sequence owned by a golden column.
            "--exec",
            "psql \"$DATABASE_URL\" -v ON_ERROR_STOP=1 -Atc 'SELECT current_user' -c 'CREATE SEQUENCE users_no_seq OWNED BY users.id'",
            "--expect",
            paths[1].to_str().unwrap(),
            "--assert",
            paths[2].to_str().unwrap(),
        ],
    );
    assert_eq!(code, 12, "{report}");
    let c = by_name(&report);
    assert_eq!(c["add_plan.sql"]["passed"], true, "{}", c["add_plan.sql"]);
    assert!(c["add_plan.sql"]["assertions"].as_array().unwrap().iter().all(|a| a["passed"] == true));
    // An ORM-style command: run inside the fork's boundary, compared before and after.
    let orm = &c["exec-1"];
    assert_eq!((orm["kind"].as_str(), hazard_kinds(orm)), (Some("exec"), vec!["opaque_code"]), "{orm}");
    assert_eq!(orm["exec"]["exit_code"], 0);
    let sloppy = &c["exec-2"];
    let mut kinds = hazard_kinds(sloppy);
    kinds.sort();
    kinds.dedup();
    assert_eq!(kinds, ["assertion_failed", "opaque_code", "rows_deleted", "schema_drift"], "{sloppy}");
    assert_eq!(sloppy["statements"][0]["rows"][0]["deleted"], 10);
    assert_eq!(change_lines(sloppy, "drift"), ["changed column users.plan"]);
    assert!(sloppy["assertions"].as_array().unwrap().iter().any(|a| a["passed"] == false));
    let broken = &c["exec-3"];
    assert_eq!(hazard_kinds(broken)[0], "failed");
    assert!(broken["exec"]["stdout"].as_str().unwrap().contains("migrating"));
    let owned = &c["exec-4"];
    assert_eq!(owned["exec"]["exit_code"], 0, "{owned}");
    assert!(owned["exec"]["stdout"].as_str().unwrap().starts_with("airlock_owner"), "{owned}");

    // Matching a golden's schema, and an assertion that fails.
    let (_, report) = test(
        &d,
        &[paths[0].to_str().unwrap(), "--expect-golden", "app", "--assert", paths[3].to_str().unwrap()],
    );
    let c = &report["candidates"][0];
    assert_eq!(hazard_kinds(c), ["assertion_failed", "schema_drift"]);
    assert_eq!(change_lines(c, "drift"), ["added column users.plan"]);

    // Bad requests are refused before anything is forked.
    for (args, code) in [
        (vec!["migrate", "test", "--golden", "app"], "invalid_request"),
        (vec!["migrate", "test", "--golden", "nope", paths[0].to_str().unwrap()], "golden_not_found"),
        (vec!["migrate", "test", "--golden", "app", "/nonexistent.sql"], "file_unreadable"),
    ] {
        let (_, e) = d.fails(&args);
        assert_eq!(e["code"], code, "{args:?}");
    }
    let meta = files(&d, &[("meta.sql", "\\set x 1\nSELECT 1;")]);
    let (_, e) = d.fails(&["migrate", "test", "--golden", "app", meta[0].to_str().unwrap()]);
    assert!(e["message"].as_str().unwrap().contains("meta-command"), "{e}");
    assert_eq!(d.json(&["ls"]).as_array().unwrap().len(), 0);
}

/// `migrate promote` with the target DSN on stdin; returns the exit code and output.
pub fn promote(d: &Daemon, report: &str, target: &str, candidate: &str, extra: &[&str]) -> (i32, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(["migrate", "promote", "--json", "--report", report, "--target", "-", candidate])
        .args(extra)
        .env("AIRLOCK_HOME", &d.home)
        .env("AIRLOCK_ROUTER", &d.router)
        .env("AIRLOCK_REDIS_ROUTER", &d.redis_router)
        .env("AIRLOCK_GATEWAY", &d.gateway)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    child.stdin.take().unwrap().write_all(target.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn promote_applies_only_the_tested_passing_file_to_a_target_that_has_not_drifted() {
    let d = daemon();
    let paths = files(
        &d,
        &[
            (
                "add_bio.sql",
                "ALTER TABLE users ADD COLUMN bio text;\nCOMMENT ON COLUMN users.bio IS 'about the user';",
            ),
            ("rewrite.sql", "ALTER TABLE users ALTER COLUMN score TYPE bigint;"),
        ],
    );
    let report = d.home.join("report.json");
    let (code, _) = test(
        &d,
        &[paths[0].to_str().unwrap(), paths[1].to_str().unwrap(), "--report", report.to_str().unwrap()],
    );
    assert_eq!(code, 12);
    let report = report.to_str().unwrap();
    // Targets: forks of the golden, reached on their sockets (no TLS).
    let clean = d.fork("app", &[]);
    let target = clean["socket_dsn"].as_str().unwrap();
    let (_, password) = crate::harness::split_password(target);

    // A changed file is refused.
    let changed = files(&d, &[("add_bio.sql", "ALTER TABLE users ADD COLUMN bio varchar(10);")]);
    let edited = d.home.join("edited");
    std::fs::create_dir_all(&edited).unwrap();
    std::fs::copy(&changed[0], edited.join("add_bio.sql")).unwrap();
    let (code, out) = promote(&d, report, target, edited.join("add_bio.sql").to_str().unwrap(), &[]);
    assert_eq!(code, 10, "{out}");
    assert!(out.contains("changed since it was tested"), "{out}");
    std::fs::write(
        &paths[0],
        "ALTER TABLE users ADD COLUMN bio text;\nCOMMENT ON COLUMN users.bio IS 'about the user';",
    )
    .unwrap();

    // A failed test is refused unless each hazard is accepted by name.
    let (code, out) = promote(&d, report, target, paths[1].to_str().unwrap(), &[]);
    assert_eq!(code, 10, "{out}");
    assert!(out.contains("--allow-hazard table_rewrite"), "{out}");

    // The passing file applies, in one transaction, and an event records it without the password.
    let (code, out) = promote(&d, report, target, paths[0].to_str().unwrap(), &[]);
    assert_eq!(code, 0, "{out}");
    let done: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((done["statements"].as_u64(), done["single_transaction"].as_bool()), (Some(2), Some(true)));
    assert!(!out.contains(&password));
    assert_eq!(sql(target, "SELECT count(*) FROM information_schema.columns WHERE column_name = 'bio'"), "1");
    let events = d.json(&["events"]).to_string();
    assert!(events.contains("migration_promoted") && events.contains("migration_tested"));
    assert!(!events.contains(&password));

    // The same target has now drifted from the golden: the next promote is refused with the diff.
    let (code, out) = promote(
        &d,
        report,
        target,
        paths[1].to_str().unwrap(),
        &["--allow-hazard", "table_rewrite", "--allow-hazard", "breaks_compatibility"],
    );
    assert_eq!(code, 10, "{out}");
    assert!(out.contains("drifted") && out.contains("+ column users.bio"), "{out}");
    // On a clean target, an accepted hazard applies.
    let other = d.fork("app", &[]);
    let other_dsn = other["socket_dsn"].as_str().unwrap();
    let (code, out) = promote(
        &d,
        report,
        other_dsn,
        paths[1].to_str().unwrap(),
        &["--allow-hazard", "table_rewrite", "--allow-hazard", "breaks_compatibility"],
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        sql(other_dsn, "SELECT data_type FROM information_schema.columns WHERE column_name = 'score'"),
        "bigint"
    );

    // Targets over TLS (through the router): verify-full with its CA, or a CA that did
    // not sign it (refused), and require (encrypted, not verified, as libpq).
    let tls = d.fork("app", &[]);
    let verified = tls["dsn"].as_str().unwrap();
    assert!(verified.contains("sslmode=verify-full"), "{verified}");
    let (base, _) = verified.split_once('?').unwrap();
    let wrong_ca = format!("{base}?sslmode=verify-full&sslrootcert=/etc/ssl/certs/ca-certificates.crt");
    let (code, out) = promote(&d, report, &wrong_ca, paths[0].to_str().unwrap(), &[]);
    assert_eq!(code, 7, "{out}");
    assert!(
        out.contains("source_failed") && !out.contains(&crate::harness::split_password(verified).1),
        "{out}"
    );
    let (code, out) = promote(&d, report, verified, paths[0].to_str().unwrap(), &[]);
    assert_eq!(code, 0, "{out}");
    let required = d.fork("app", &[]);
    let (base, _) = required["dsn"].as_str().unwrap().split_once('?').unwrap();
    let (code, out) =
        promote(&d, report, &format!("{base}?sslmode=require"), paths[0].to_str().unwrap(), &[]);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn the_test_migration_tool_reports_without_touching_the_agents_database() {
    let d = daemon();
    let id = d.fork("app", &[])["id"].as_str().unwrap().to_owned();
    let args = json!({"sql": "ALTER TABLE orders ADD COLUMN at timestamptz DEFAULT clock_timestamp(); DELETE FROM tenants WHERE id = 1;"});
    let (status, body) =
        d.api("POST", &format!("/v1/sandboxes/{id}/tools/test_migration"), &args.to_string());
    assert_eq!(status, 200, "{body}");
    let out: Value = serde_json::from_str(&body).unwrap();
    let text = out["text"].as_str().unwrap();
    assert!(
        text.contains("FAILED") && text.contains("table_rewrite") && text.contains("<untrusted-data-"),
        "{text}"
    );
    let kinds = hazard_kinds(&out["result"]["candidates"][0]);
    assert!(kinds.contains(&"table_rewrite") && kinds.contains(&"fails_on_data"), "{kinds:?}");
    assert!(out["result"].get("golden_catalog").is_none());
    // Nothing reached the agent's own database.
    let (_, r) = d.api(
        "POST",
        &format!("/v1/sandboxes/{id}/sql"),
        r#"{"sql": "SELECT count(*) FROM information_schema.columns WHERE column_name = 'at'"}"#,
    );
    assert!(r.contains("[[0]]"), "{r}");
    assert_eq!(d.json(&["ls"]).as_array().unwrap().len(), 1);
    // One test at a time per agent: each takes a fork.
    let path = format!("/v1/sandboxes/{id}/tools/test_migration");
    std::thread::scope(|scope| {
        let slow = scope.spawn(|| d.api("POST", &path, r#"{"sql": "SELECT pg_sleep(2)"}"#));
        std::thread::sleep(std::time::Duration::from_millis(500));
        let (status, body) = d.api("POST", &path, r#"{"sql": "SELECT 1"}"#);
        assert_eq!(status, 503, "{body}");
        assert!(body.contains("still running"), "{body}");
        assert_eq!(slow.join().unwrap().0, 200);
    });
}

#[test]
fn a_migration_that_behaves_otherwise_on_its_target_is_rolled_back_and_refused() {
    let d = daemon();
    // It does its damage only where the test's machinery is absent.
    let paths = files(
        &d,
        &[(
            "sly.sql",
            "ALTER TABLE tenants ADD COLUMN region text;
DO $$ BEGIN
  IF pg_catalog.to_regnamespace('pg_airlock_probe') IS NULL THEN
    DELETE FROM orders;
    CREATE FUNCTION public.trojan() RETURNS int LANGUAGE sql AS 'SELECT 1';
  END IF;
END $$;",
        )],
    );
    let report = d.home.join("report.json");
    let (_, v) = test(&d, &[paths[0].to_str().unwrap(), "--report", report.to_str().unwrap()]);
    // It is code (and, in the one transaction promote runs it in, runs
    // under its own lock); a person who accepts it anyway is still protected
    // by the target check.
    assert_eq!(hazard_kinds(&v["candidates"][0]), ["long_lock", "opaque_code"], "{v}");
    let accepted = v["candidates"][0]["sha256"].as_str().unwrap().to_owned();
    let target = d.fork("app", &[]);
    let target = target["socket_dsn"].as_str().unwrap();
    let (code, out) = promote(&d, report.to_str().unwrap(), target, paths[0].to_str().unwrap(), &[]);
    assert_eq!(code, 10, "{out}");
    assert!(out.contains(&format!("--allow-code {accepted}")), "{out}");
    let (code, out) = promote(
        &d,
        report.to_str().unwrap(),
        target,
        paths[0].to_str().unwrap(),
        &["--allow-code", &accepted, "--allow-hazard", "long_lock"],
    );
    assert_eq!(code, 10, "{out}");
    assert!(out.contains("did what its test did not"), "{out}");
    assert!(out.contains("deleted from public.orders") && out.contains("trojan"), "{out}");
    // Nothing was kept.
    assert_eq!(sql(target, "SELECT count(*) FROM orders"), "100000");
    assert_eq!(
        sql(target, "SELECT count(*) FROM information_schema.columns WHERE column_name = 'region'"),
        "0"
    );
}

#[test]
fn deferred_work_that_defers_more_work_is_still_measured() {
    let d = daemon();
    let paths = files(
        &d,
        &[(
            "chain.sql",
            "CREATE TABLE app_events (kind text);
CREATE FUNCTION app_events_tick() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.kind = 'a' THEN
    SET CONSTRAINTS ALL DEFERRED;
    INSERT INTO app_events (kind) VALUES ('b');
  ELSIF NEW.kind = 'b' THEN
    DELETE FROM orders;
  END IF;
  RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER app_events_tick AFTER INSERT ON app_events
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION app_events_tick();
BEGIN;
INSERT INTO app_events (kind) VALUES ('a');
COMMIT;
DROP TRIGGER app_events_tick ON app_events;
DROP FUNCTION app_events_tick();
DROP TABLE app_events;",
        )],
    );
    let (code, v) = test(&d, &[paths[0].to_str().unwrap()]);
    assert_eq!(code, 12, "{v}");
    let hazards = v["candidates"][0]["hazards"].to_string();
    assert!(hazards.contains("100000") && hazards.contains("orders"), "{hazards}");
}

/// A file that runs whole is one transaction under test, as promote runs it:
/// what works only once an earlier statement has committed fails in its test,
/// not first on the target; with its own COMMIT between, it passes.
#[test]
fn a_file_that_runs_whole_is_tested_in_the_one_transaction_promote_runs_it_in() {
    let d = daemon();
    let paths = files(
        &d,
        &[
            (
                "pending.sql",
                "CREATE TABLE notes (user_id bigint REFERENCES users DEFERRABLE INITIALLY DEFERRED);
INSERT INTO notes VALUES (1);
ALTER TABLE notes ADD COLUMN body text;",
            ),
            (
                "committed.sql",
                "BEGIN;
CREATE TABLE notes (user_id bigint REFERENCES users DEFERRABLE INITIALLY DEFERRED);
INSERT INTO notes VALUES (1);
COMMIT;
ALTER TABLE notes ADD COLUMN body text;",
            ),
        ],
    );
    let (_, v) = test(&d, &path_strs(&paths));
    let c = by_name(&v);
    let failed = &c["pending.sql"];
    assert_eq!(failed["passed"], false, "{failed}");
    assert_eq!(failed["failure"]["line"], 3, "{failed}");
    let message = failed["failure"]["error"]["message"].as_str().unwrap();
    assert!(message.contains("pending trigger events"), "{message}");
    // Every statement of it was in the one transaction, and none was kept
    // (nor marked undone by the file: fixed, they would run and be kept).
    let statements = failed["statements"].as_array().unwrap();
    assert!(statements.iter().all(|s| s["txn"] == 1), "{failed}");
    assert!(statements.iter().all(|s| s["rolled_back"] == false), "{failed}");
    assert_eq!(failed["changes"], json!([]), "{failed}");
    assert!(!hazard_kinds(failed).contains(&"partial_commit"), "{failed}");
    let ok = &c["committed.sql"];
    assert!(ok["failure"].is_null(), "{ok}");
    assert!(!hazard_kinds(ok).contains(&"failed"), "{ok}");
}

#[test]
fn a_test_one_candidate_breaks_still_deletes_every_fork() {
    let d = daemon();
    let paths = files(
        &d,
        &[
            ("slow.sql", "SELECT pg_sleep(2);"),
            ("slow2.sql", "SELECT pg_sleep(2);"),
            ("breaks.sql", "SELECT pg_sleep(0.3);\nSET statement_timeout = '1ms';\nSELECT 1;"),
        ],
    );
    let (code, report) = test(&d, &path_strs(&paths));
    assert_eq!(code, 12, "{report}");
    // The candidate that broke its own measuring fails alone; the others are reported.
    let c = by_name(&report);
    assert_eq!(
        (c["slow.sql"]["passed"].as_bool(), c["slow2.sql"]["passed"].as_bool()),
        (Some(true), Some(true))
    );
    assert_eq!(hazard_kinds(&c["breaks.sql"]), ["failed"], "{}", c["breaks.sql"]);
    let why = c["breaks.sql"]["hazards"][0]["message"].as_str().unwrap();
    assert!(why.contains("could not be completed") || why.contains("statement timeout"), "{why}");
    assert_eq!(d.json(&["ls"]).as_array().unwrap().len(), 0, "no fork is left behind");
}

/// A migration that changes more, or otherwise, where the test's probe is absent.
fn two_faced(body: &str) -> String {
    format!(
        "ALTER TABLE tenants ADD COLUMN region text;
UPDATE users SET score = 1 WHERE id = 1;
CREATE FUNCTION public.audit() RETURNS int LANGUAGE sql AS 'SELECT 1';
DO $do$ BEGIN
  IF pg_catalog.to_regnamespace('pg_airlock_probe') IS NULL THEN
    {body}
  END IF;
END $do$;"
    )
}

#[test]
fn on_its_target_a_migration_must_change_what_its_test_changed_and_no_more() {
    let d = daemon();
    let paths = files(
        &d,
        &[
            // Every row where the test updated one.
            ("wider.sql", &two_faced("UPDATE users SET score = 1;")),
            // The same function, another body.
            (
                "swapped.sql",
                &two_faced(
                    "CREATE OR REPLACE FUNCTION public.audit() RETURNS int LANGUAGE sql AS 'SELECT 2';",
                ),
            ),
            // The same table, open to everyone.
            ("granted.sql", &two_faced("GRANT ALL ON users TO PUBLIC;")),
            // Settings every later session of the role would get.
            ("settings.sql", &two_faced("ALTER ROLE airlock_admin SET search_path = nowhere;")),
            // The control: the same file without a second face.
            ("plain.sql", &two_faced("PERFORM 1;")),
        ],
    );
    let report = d.home.join("report.json");
    let mut args: Vec<&str> = paths.iter().map(|p| p.to_str().unwrap()).collect();
    args.extend(["--report", report.to_str().unwrap()]);
    let (_, v) = test(&d, &args);
    // Each is code, and passes in all else; each is accepted by its hash.
    let tested = by_name(&v);
    let accepted: Vec<String> = paths
        .iter()
        .map(|p| {
            let c = &tested[p.file_name().unwrap().to_str().unwrap()];
            assert!(hazard_kinds(c).contains(&"opaque_code"), "{c}");
            c["sha256"].as_str().unwrap().to_owned()
        })
        .collect();
    let report = report.to_str().unwrap();
    let fresh = || d.fork("app", &[])["socket_dsn"].as_str().unwrap().to_owned();
    for (i, expected) in [(0, "updated in public.users"), (1, "function"), (2, "grants")] {
        let target = fresh();
        let (code, out) = promote(
            &d,
            report,
            &target,
            paths[i].to_str().unwrap(),
            &["--allow-code", &accepted[i], "--allow-hazard", "long_lock"],
        );
        assert_eq!(code, 10, "{expected}: {out}");
        assert!(out.contains("did what its test did not") && out.contains(expected), "{expected}: {out}");
        assert_eq!(sql(&target, "SELECT count(*) FROM users WHERE score = 1"), "0", "rolled back");
    }
    // A superuser's session is refused before anything runs, unless allowed;
    // allowed, a setting it plants for a role is a difference like any other.
    let target = fresh();
    let admin = target.replacen(
        &format!("airlock_agent:{}@", crate::harness::split_password(&target).1),
        "airlock_admin@",
        1,
    );
    let code_ok = ["--allow-code", accepted[3].as_str(), "--allow-hazard", "long_lock"];
    let (code, out) = promote(&d, report, &admin, paths[3].to_str().unwrap(), &code_ok);
    assert_eq!(code, 10, "{out}");
    assert!(out.contains("is a superuser"), "{out}");
    let (code, out) = promote(
        &d,
        report,
        &admin,
        paths[3].to_str().unwrap(),
        &["--allow-superuser", code_ok[0], code_ok[1], code_ok[2], code_ok[3]],
    );
    assert_eq!(code, 10, "{out}");
    assert!(out.contains("search_path=nowhere"), "{out}");
    // The control applies.
    let target = fresh();
    let (code, out) = promote(
        &d,
        report,
        &target,
        paths[4].to_str().unwrap(),
        &["--allow-code", &accepted[4], "--allow-hazard", "long_lock"],
    );
    assert_eq!(code, 0, "{out}");
}

#[test]
fn a_golden_built_from_the_target_is_no_drift_from_it() {
    let d = daemon();
    let target = d.fork("app", &[]);
    let target = target["socket_dsn"].as_str().unwrap();
    // A table of the target's own role (a golden's tables are its owner role's).
    sql(target, "CREATE TABLE audit_log (id int PRIMARY KEY, line text)");
    // The refusal's own advice: build a golden from the target, test on it, promote.
    let out = d.cli_with(&["golden", "create", "fromtarget", "--from-url", "-"], Some(target));
    assert_eq!(out.code, 0, "{out:?}");
    let paths = files(&d, &[("bio.sql", "ALTER TABLE users ADD COLUMN bio text;")]);
    let report = d.home.join("report.json");
    let out = d.cli(&[
        "migrate",
        "test",
        "--golden",
        "fromtarget",
        paths[0].to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    let (code, out) = promote(&d, report.to_str().unwrap(), target, paths[0].to_str().unwrap(), &[]);
    assert_eq!(code, 0, "owners alone are no drift: {out}");
}
