//! The migration airlock's second pass: verdicts that do not move with machine
//! load, estimates at production size, the hazards linters catch, what the
//! application would feel, and the report formats — each with real migrations
//! on a golden of 20,000 users and 100,000 orders.

use std::collections::BTreeMap;
use std::process::{Child, Command};

use serde_json::{json, Value};

use crate::harness::sql;
use crate::migrate::{by_name, daemon, files, hazard, hazard_kinds, path_strs, promote, test};

fn kinds_of(report: &Value) -> BTreeMap<String, Vec<String>> {
    by_name(report)
        .into_iter()
        .map(|(name, c)| (name, hazard_kinds(&c).into_iter().map(str::to_owned).collect()))
        .collect()
}

const APP_QUERIES: &str = "SELECT id, nickname FROM users WHERE id = $1;
SELECT * FROM orders WHERE user_id = $1;
SELECT count(*) FROM tenants;";

#[test]
fn the_hazards_linters_catch_and_the_fixes_found_in_use() {
    let d = daemon();
    let mut candidates = vec![
        ("index.sql", "CREATE INDEX orders_total ON orders (total);"),
        ("unique_constraint.sql", "ALTER TABLE users ADD CONSTRAINT users_id_email UNIQUE (id, email);"),
        ("fk.sql", "ALTER TABLE orders ADD CONSTRAINT orders_user_fk FOREIGN KEY (user_id) REFERENCES users (id);"),
        ("check.sql", "ALTER TABLE orders ADD CONSTRAINT total_positive CHECK (total >= 0);"),
        (
            "not_valid.sql",
            // (Committed before the validation, as promote runs a file
            // without transactions of its own in one.)
            "SET lock_timeout = '2s';\nBEGIN;\nALTER TABLE orders ADD CONSTRAINT total_positive CHECK (total >= 0) NOT VALID;\n\
             COMMIT;\nALTER TABLE orders VALIDATE CONSTRAINT total_positive;",
        ),
        (
            "set_not_null.sql",
            "ALTER TABLE users ALTER COLUMN email DROP NOT NULL;\nALTER TABLE users ALTER COLUMN email SET NOT NULL;",
        ),
        ("not_null_default.sql", "ALTER TABLE users ADD COLUMN active boolean NOT NULL DEFAULT true;"),
        ("mass_update.sql", "UPDATE users SET score = score + 1 WHERE id > 0;"),
        ("small_update.sql", "UPDATE users SET score = 1 WHERE id <= 100;"),
        ("rename.sql", "ALTER TABLE users RENAME COLUMN nickname TO handle;"),
        ("drop_index.sql", "DROP INDEX orders_user;"),
        ("invalid_index.sql", "CREATE UNIQUE INDEX CONCURRENTLY users_email_u ON users (email);"),
        (
            "same_run.sql",
            "CREATE TABLE scratch (a int, b int);\nINSERT INTO scratch SELECT g, g FROM generate_series(1, 5000) g;\n\
             ALTER TABLE scratch DROP COLUMN b;",
        ),
        (
            "rolled_back.sql",
            "BEGIN;\nINSERT INTO tenants SELECT g, 't' || g FROM generate_series(100, 199) g;\nDELETE FROM orders;\nROLLBACK;",
        ),
        (
            "drop_column_cascade.sql",
            "ALTER TABLE users ADD CONSTRAINT score_sane CHECK (score >= 0) NOT VALID;\n\
             ALTER TABLE users DROP COLUMN score CASCADE;",
        ),
        (
            "partial.sql",
            "BEGIN;\nALTER TABLE users ADD COLUMN a int;\nUPDATE users SET a = 1 WHERE id = 1;\nCOMMIT;\n\
             ALTER TABLE users ALTER COLUMN nickname SET NOT NULL;",
        ),
    ];
    candidates.extend([
        (
            "validate_same_txn.sql",
            "BEGIN;\nALTER TABLE orders ADD CONSTRAINT total_positive CHECK (total >= 0) NOT VALID;\n\
             ALTER TABLE orders VALIDATE CONSTRAINT total_positive;\nCOMMIT;",
        ),
        (
            "locked_backfill.sql",
            "BEGIN;\nALTER TABLE users ADD COLUMN plan text;\nUPDATE users SET plan = 'free' WHERE id % 4 = 0;\nCOMMIT;",
        ),
        ("retype.sql", "ALTER TABLE users ALTER COLUMN score TYPE text;"),
        // Renamed, rewritten and renamed back: still the golden's orders. The rename's lock held
        // over the rewrite adds nothing to the rewrite's own: one hazard, the rewrite's.
        (
            "rename_around.sql",
            "ALTER TABLE orders RENAME TO orders_tmp;\nALTER TABLE orders_tmp ADD COLUMN public_ref uuid DEFAULT gen_random_uuid();\n\
             ALTER TABLE orders_tmp RENAME TO orders;",
        ),
        // Code run under the lock takes as long as it takes, whatever rows it reads.
        ("sleep_under_lock.sql", "BEGIN;\nALTER TABLE orders ADD COLUMN loyalty int;\nSELECT pg_sleep(0.1);\nCOMMIT;"),
        // Most of a table updated in one transaction, a half at a time.
        (
            "split_update.sql",
            "BEGIN;\nUPDATE users SET score = 2 WHERE id % 2 = 0;\nUPDATE users SET score = 2 WHERE id % 2 = 1;\nCOMMIT;",
        ),
        // COMMIT AND CHAIN opens the next transaction at once, as under psql.
        (
            "chain.sql",
            "BEGIN;\nSELECT 1;\nCOMMIT AND CHAIN;\nALTER TABLE users ADD COLUMN x int;\n\
             UPDATE users SET x = 1 WHERE id % 4 = 0;\nCOMMIT;",
        ),
        // DISCARD ALL runs alone, as psql runs it; it puts back the settings
        // the target's role and database keep, which the test cannot see.
        ("discard.sql", "DISCARD ALL;\nALTER TABLE tenants ADD COLUMN region text;"),
        ("reindex.sql", "REINDEX TABLE orders;"),
        // The owner role the agent may switch to is measured all the same.
        ("set_role.sql", "SET ROLE airlock_owner;\nALTER TABLE users ADD COLUMN z int;"),
        (
            "savepoint.sql",
            "BEGIN;\nSAVEPOINT before_cleanup;\nDELETE FROM orders;\nROLLBACK TO SAVEPOINT before_cleanup;\n\
             INSERT INTO tenants VALUES (500, 'x');\nCOMMIT;",
        ),
    ]);
    candidates.push(("app_queries.sql", APP_QUERIES));
    let paths = files(&d, &candidates);
    let (last, queries) = paths.split_last().unwrap();
    let mut args = path_strs(queries);
    // Locks over --max-lock are the determinism and production tests' subject.
    args.extend(["--app-queries", last.to_str().unwrap(), "--max-lock", "10min"]);
    let (code, report) = test(&d, &args);
    assert_eq!(code, 12, "{report}");
    let kinds = kinds_of(&report);
    let expect: BTreeMap<String, Vec<String>> = [
        ("index.sql", vec!["blocking_index_build"]),
        ("unique_constraint.sql", vec!["blocking_index_build"]),
        ("fk.sql", vec!["constraint_validation"]),
        ("check.sql", vec!["constraint_validation"]),
        ("not_valid.sql", vec![]),
        ("set_not_null.sql", vec!["long_lock", "constraint_validation"]),
        ("not_null_default.sql", vec![]),
        ("mass_update.sql", vec!["mass_update"]),
        ("small_update.sql", vec![]),
        ("rename.sql", vec!["breaks_queries", "breaks_compatibility"]),
        // The only index behind orders' foreign key: each delete of a user now reads all of orders.
        ("drop_index.sql", vec!["key_index_dropped", "plan_regression"]),
        ("invalid_index.sql", vec!["fails_on_data", "invalid_index"]),
        ("same_run.sql", vec![]),
        ("rolled_back.sql", vec![]),
        ("drop_column_cascade.sql", vec!["column_dropped", "breaks_compatibility"]),
        ("partial.sql", vec!["fails_on_data", "partial_commit"]),
        ("validate_same_txn.sql", vec!["long_lock", "constraint_validation"]),
        ("locked_backfill.sql", vec!["long_lock"]),
        ("retype.sql", vec!["table_rewrite", "breaks_compatibility"]),
        ("savepoint.sql", vec![]),
        ("set_role.sql", vec![]),
        ("rename_around.sql", vec!["table_rewrite"]),
        ("sleep_under_lock.sql", vec!["long_lock"]),
        ("split_update.sql", vec!["mass_update"]),
        ("chain.sql", vec!["long_lock"]),
        ("discard.sql", vec!["opaque_code"]),
        ("reindex.sql", vec!["blocking_index_build"]),
    ]
    .into_iter()
    .map(|(n, k)| (n.to_owned(), k.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(kinds, expect, "{report}");
    let c = by_name(&report);

    // A blocking index build: severity by the table's size, a safer form, an estimate.
    let build = hazard(&c["index.sql"], "blocking_index_build");
    assert_eq!(build["severity"], "high", "{build}");
    assert!(build["suggestion"].as_str().unwrap().contains("CONCURRENTLY"), "{build}");
    assert!(build["estimated_ms"].as_f64().unwrap() > 0.0, "{build}");
    assert!(hazard(&c["unique_constraint.sql"], "blocking_index_build")["suggestion"]
        .as_str()
        .unwrap()
        .contains("USING INDEX"));
    // A foreign key checks its table and locks the one it references.
    let fk = hazard(&c["fk.sql"], "constraint_validation");
    assert!(fk["message"].as_str().unwrap().contains("public.users"), "{fk}");
    assert!(fk["suggestion"].as_str().unwrap().contains("NOT VALID"), "{fk}");
    assert_eq!(hazard(&c["set_not_null.sql"], "constraint_validation")["line"], 2);
    // A note, not a hazard: the file sets no lock_timeout.
    let notes = |name: &str| -> Vec<String> {
        c[name]["notes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|n| n["kind"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(notes("index.sql"), ["no_lock_timeout"]);
    assert!(notes("not_valid.sql").is_empty() && notes("small_update.sql").is_empty());
    assert_eq!(c["not_null_default.sql"]["passed"], true);
    // Renames break the running application: its queries no longer plan.
    let broken = hazard(&c["rename.sql"], "breaks_queries");
    assert!(broken["message"].as_str().unwrap().contains("nickname"), "{broken}");
    assert!(hazard(&c["rename.sql"], "breaks_compatibility")["message"]
        .as_str()
        .unwrap()
        .contains("column public.users.nickname is gone"));
    // Which index the lookup used, where it went, and what it reads now.
    let slower = hazard(&c["drop_index.sql"], "plan_regression");
    let said = slower["message"].as_str().unwrap();
    assert!(said.contains("Seq Scan on orders"), "{slower}");
    assert!(
        said.contains(
            "it used index orders_user, which line 1 drops; now each run reads all 100000 rows of orders"
        ),
        "{said}"
    );
    assert_eq!(slower["line"], 1, "{slower}");
    let plans = c["drop_index.sql"]["queries"].as_array().unwrap();
    assert_eq!(plans.len(), 3);
    // A failed concurrent build leaves its index INVALID.
    assert!(hazard(&c["invalid_index.sql"], "invalid_index")["message"]
        .as_str()
        .unwrap()
        .contains("public.users_email_u"));
    let validated = hazard(&c["validate_same_txn.sql"], "constraint_validation");
    assert!(validated["message"].as_str().unwrap().contains("already locked the table"), "{validated}");
    assert!(hazard(&c["retype.sql"], "breaks_compatibility")["message"]
        .as_str()
        .unwrap()
        .contains("score changes type integer -> text"));
    let around = hazard(&c["rename_around.sql"], "table_rewrite");
    assert!(around["message"].as_str().unwrap().contains("rewrites public.orders (100000 rows"), "{around}");
    assert!(hazard(&c["split_update.sql"], "mass_update")["message"]
        .as_str()
        .unwrap()
        .contains("in one transaction (lines 2, 3)"));
    assert!(hazard(&c["reindex.sql"], "blocking_index_build")["message"]
        .as_str()
        .unwrap()
        .contains("public.orders_pkey, public.orders_user"));
    let partial = hazard(&c["partial.sql"], "partial_commit");
    assert!(partial["message"].as_str().unwrap().contains("line 2, 3 had already committed"), "{partial}");
    // Rolled-back rows count nowhere, and a cascade's reach leaves out the column's own check.
    assert_eq!(c["rolled_back.sql"]["statements"][2]["rolled_back"], true);
    assert_eq!(c["savepoint.sql"]["statements"][2]["rolled_back"], true, "{}", c["savepoint.sql"]);
    assert_eq!(c["savepoint.sql"]["statements"][4]["rolled_back"], false, "{}", c["savepoint.sql"]);
    assert!(
        !c["drop_column_cascade.sql"].to_string().contains("\"cascade\":true"),
        "{}",
        c["drop_column_cascade.sql"]
    );
    // The report says which sizes the estimates use.
    assert_eq!(report["scale"]["source"], "golden");
    assert!(report["scale"]["costs"]["scan_us"].as_f64().unwrap() > 0.0, "{}", report["scale"]);
    assert_eq!(d.json(&["ls"]).as_array().unwrap().len(), 0);
}

/// Busy loops on every core until dropped.
struct Hog(Vec<Child>);

impl Hog {
    fn start() -> Hog {
        Hog((0..4).map(|_| Command::new("sh").args(["-c", "while :; do :; done"]).spawn().unwrap()).collect())
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn the_same_file_gets_the_same_verdict_on_an_idle_or_a_busy_machine() {
    let d = daemon();
    let paths = files(
        &d,
        &[
            ("index.sql", "CREATE INDEX orders_total ON orders (total);"),
            ("fk.sql", "ALTER TABLE orders ADD CONSTRAINT orders_user_fk FOREIGN KEY (user_id) REFERENCES users (id);"),
            ("volatile.sql", "ALTER TABLE orders ADD COLUMN created_at timestamptz DEFAULT clock_timestamp();"),
            ("bigint.sql", "ALTER TABLE users ALTER COLUMN score TYPE bigint;"),
            ("mass_update.sql", "UPDATE orders SET note = 'x';"),
            (
                "locked_backfill.sql",
                "BEGIN;\nALTER TABLE orders ADD COLUMN gift boolean;\nUPDATE orders SET gift = false;\n\
                 UPDATE users SET score = score + 1;\nCOMMIT;",
            ),
            ("delete.sql", "DELETE FROM orders WHERE id % 2 = 0;"),
            // Twins that pass: the careless one is applied faster, the careful one ranks first.
            ("twin_careless.sql", "ALTER TABLE users ADD COLUMN nick text;"),
            ("twin_careful.sql", "SET lock_timeout = '2s';\nALTER TABLE users ADD COLUMN nick text;"),
        ],
    );
    let mut idle = path_strs(&paths);
    idle.extend(["--parallel", "1", "--max-lock", "20ms"]);
    let (_, first) = test(&d, &idle);
    let verdicts = |report: &Value| -> BTreeMap<String, (Value, Value)> {
        by_name(report).into_iter().map(|(n, c)| (n, (c["hazards"].clone(), c["notes"].clone()))).collect()
    };
    let calm = verdicts(&first);
    let busy = {
        let _hog = Hog::start();
        let mut args = path_strs(&paths);
        args.extend(["--parallel", "4", "--max-lock", "20ms"]);
        test(&d, &args).1
    };
    let (busy_ranking, busy_best) = (busy["ranking"].clone(), busy["best"].clone());
    let busy = verdicts(&busy);
    for (name, verdict) in &calm {
        assert_eq!(Some(verdict), busy.get(name), "{name} judged differently under load");
    }
    // The ranking is a rule over the verdicts, not the times: the same under load.
    assert_eq!(first["ranking"], busy_ranking, "ranked differently under load");
    assert_eq!(
        (&first["best"], &busy_best),
        (&json!("twin_careful.sql"), &json!("twin_careful.sql")),
        "{first}"
    );
    let ranking: Vec<&str> =
        first["ranking"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert_eq!(ranking[..2], ["twin_careful.sql", "twin_careless.sql"], "{ranking:?}");
    // Measured times did differ; the verdicts did not rest on them.
    assert!(kinds_of(&first).values().any(|k| k.contains(&"long_lock".to_owned())), "{first}");
}

#[test]
fn production_sizes_scale_the_estimates_and_the_thresholds_apply_to_them() {
    let d = daemon();
    // "Production": a database five times the golden's size.
    let prod = d.fork("app", &["--ttl", "30m"]);
    let prod_dsn = prod["socket_dsn"].as_str().unwrap();
    sql(
        prod_dsn,
        "INSERT INTO orders SELECT id + k * 100000, user_id, total, note FROM orders, generate_series(1, 4) k;
         ANALYZE orders",
    );
    let paths =
        files(&d, &[("check.sql", "ALTER TABLE orders ADD CONSTRAINT total_positive CHECK (total >= 0);")]);
    let candidate = paths[0].to_str().unwrap();
    let (_, golden_sized) = test(&d, &[candidate]);
    let estimate = |report: &Value| {
        hazard(&report["candidates"][0], "constraint_validation")["estimated_ms"].as_f64().unwrap()
    };
    let on_golden = estimate(&golden_sized);
    assert_eq!(golden_sized["scale"]["source"], "golden");

    // Between the golden's estimate and production's: no long lock on the golden's sizes, one at production's.
    let max_lock = format!("{}ms", (on_golden * 2.5).ceil().max(1.0) as u64);
    let (_, under) = test(&d, &[candidate, "--max-lock", &max_lock]);
    assert_eq!(hazard_kinds(&under["candidates"][0]), ["constraint_validation"], "{under}");
    let out = d.cli_with(
        &[
            "migrate",
            "test",
            "--golden",
            "app",
            "--json",
            candidate,
            "--max-lock",
            &max_lock,
            "--production-stats",
            "-",
        ],
        Some(prod_dsn),
    );
    let over: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    assert_eq!(over["scale"]["source"], "production", "{over}");
    let factor = estimate(&over) / on_golden;
    assert!((4.0..6.0).contains(&factor), "production is 5x the golden: {factor}");
    let long = hazard(&over["candidates"][0], "long_lock");
    assert!(long["message"].as_str().unwrap().contains("in production"), "{long}");
    // The DSN's password is in no report.
    let (_, password) = crate::harness::split_password(prod_dsn);
    assert!(!over.to_string().contains(&password));

    // The same sizes from a file `migrate stats` wrote, and from CSV.
    let stats = d.cli_with(&["migrate", "stats", "--target", "-"], Some(prod_dsn));
    assert_eq!(stats.code, 0, "{stats:?}");
    let parsed: Value = serde_json::from_str(&stats.stdout).unwrap();
    let rows = parsed["tables"]["public.orders"]["rows"].as_i64().unwrap();
    assert!((450_000..550_000).contains(&rows), "{parsed}");
    let file = d.home.join("prod-stats.json");
    std::fs::write(&file, &stats.stdout).unwrap();
    let (_, from_file) =
        test(&d, &[candidate, "--max-lock", &max_lock, "--production-stats", file.to_str().unwrap()]);
    assert_eq!(hazard_kinds(&from_file["candidates"][0]), hazard_kinds(&over["candidates"][0]));
    let csv = d.home.join("prod-stats.csv");
    std::fs::write(&csv, "table_name,rows,bytes\npublic.orders,50000000,8000000000\n").unwrap();
    let (_, huge) = test(&d, &[candidate, "--production-stats", csv.to_str().unwrap()]);
    let validation = hazard(&huge["candidates"][0], "constraint_validation");
    assert_eq!(validation["severity"], "high");
    assert!(validation["message"].as_str().unwrap().contains("50000000 rows in production"), "{validation}");
    let bad = d.home.join("bad.csv");
    std::fs::write(&bad, "orders 12\n").unwrap();
    let (_, e) = d.fails(&[
        "migrate",
        "test",
        "--golden",
        "app",
        candidate,
        "--production-stats",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(e["code"], "invalid_request", "{e}");
}

#[test]
fn a_workload_feels_a_blocking_index_build_and_not_a_concurrent_one() {
    let d = daemon();
    let paths = files(
        &d,
        &[
            ("blocking.sql", "BEGIN;\nCREATE INDEX orders_total ON orders (total);\nSELECT pg_sleep(1.5);\nCOMMIT;"),
            ("concurrent.sql", "CREATE INDEX CONCURRENTLY orders_total ON orders (total);\nSELECT pg_sleep(1.5);"),
            ("workload.sql", "SELECT count(*) FROM orders WHERE user_id = $1;\nUPDATE orders SET note = 'x' WHERE id = $1;"),
        ],
    );
    let mut args = path_strs(&paths[..2]);
    args.extend(["--workload", "default", "--parallel", "1"]);
    let (_, report) = test(&d, &args);
    let c = by_name(&report);
    let felt = |name: &str, label: &str| -> f64 {
        let w = &c[name]["workload"];
        w["queries"].as_array().unwrap().iter().find(|q| q["label"] == label).unwrap_or_else(|| panic!("{w}"))
            ["max_ms"]
            .as_f64()
            .unwrap()
    };
    assert!(felt("blocking.sql", "writes to public.orders") >= 1_000.0, "{}", c["blocking.sql"]["workload"]);
    assert!(felt("blocking.sql", "reads of public.orders") < 1_000.0, "{}", c["blocking.sql"]["workload"]);
    assert!(
        felt("concurrent.sql", "writes to public.orders") < 1_000.0,
        "{}",
        c["concurrent.sql"]["workload"]
    );
    let summary = c["blocking.sql"]["workload"]["summary"].to_string();
    assert!(summary.contains("writes to public.orders waited up to"), "{summary}");
    // The workload changed no row: nothing unmeasured, the same hazards as without it.
    // (Its pg_sleep ran under the index build's lock: a long_lock, whatever its rows.)
    assert_eq!(hazard_kinds(&c["blocking.sql"]), ["blocking_index_build", "long_lock"]);
    assert!(c["concurrent.sql"]["passed"].as_bool().unwrap(), "{}", c["concurrent.sql"]);

    // The application's own queries as the workload: its UPDATE waits, planned, never run.
    let (_, report) = test(&d, &[paths[0].to_str().unwrap(), "--workload", paths[2].to_str().unwrap()]);
    let w = &report["candidates"][0]["workload"];
    let update = w["queries"].as_array().into_iter().flatten().find(|q| q["kind"] == "write");
    let update = update.unwrap_or_else(|| panic!("no write in {w}"));
    assert!(update["max_ms"].as_f64().unwrap() >= 1_000.0 && update["errors"] == 0, "{w}");
    assert_eq!(hazard_kinds(&report["candidates"][0]), ["blocking_index_build", "long_lock"]);

    // A candidate that ends its own session stops the workload beside it too.
    // (It runs as the golden's owner role, which may not end the agent's
    // session: it puts its role back first.)
    let dies = files(
        &d,
        &[(
            "dies.sql",
            "ALTER TABLE users ADD COLUMN q int;\nRESET ROLE;\nSELECT pg_terminate_backend(pg_backend_pid());",
        )],
    );
    let (code, report) = test(&d, &[dies[0].to_str().unwrap(), "--workload", "default"]);
    assert_eq!(code, 12, "{report}");
    assert_eq!(hazard_kinds(&report["candidates"][0]), ["failed"], "{report}");
}

#[test]
fn commands_are_hashed_with_their_files_and_promoted_only_unchanged() {
    let d = daemon();
    // Outside /tmp, which a command's boundary makes private; readable by its user.
    let dir = std::path::PathBuf::from(format!("/var/tmp/airlock-it-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = dir.join("001_bio.sql");
    std::fs::write(&file, "ALTER TABLE users ADD COLUMN bio text;\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let glob = format!("{}/*.sql", dir.display());
    let cmd = format!("cat {}/*.sql | psql \"$DATABASE_URL\" -v ON_ERROR_STOP=1 -q", dir.display());
    let failing = "psql \"$DATABASE_URL\" -c 'ALTER TABLE nope ADD COLUMN x int'; s=$?; echo 'cleaning up' >&2; exit $s";
    let report = d.home.join("report.json");
    let (code, v) = test(
        &d,
        &["--exec", &cmd, "--exec", failing, "--exec-files", &glob, "--report", report.to_str().unwrap()],
    );
    assert_eq!(code, 12, "{v}");
    let c = by_name(&v);
    // A command is code throughout: its test passes in all else, and a person
    // accepts it by its hash (the command and its files).
    assert_eq!(hazard_kinds(&c["exec-1"]), ["opaque_code"], "{}", c["exec-1"]);
    let accepted = c["exec-1"]["sha256"].as_str().unwrap().to_owned();
    // The failed command's real error, not its last line; its exit code as a number.
    let failed = hazard(&c["exec-2"], "failed")["message"].as_str().unwrap().to_owned();
    assert!(failed.contains("exited 1") && failed.contains("relation \"nope\" does not exist"), "{failed}");
    let text = d.cli(&["migrate", "test", "--golden", "app", "--exec", failing]).stdout;
    assert!(text.contains("command exited 1") && !text.contains("Some("), "{text}");

    let promote_exec = |extra: &[&str]| {
        let target = d.fork("app", &[]);
        let dsn = target["socket_dsn"].as_str().unwrap().to_owned();
        let mut args = vec![
            "migrate",
            "promote",
            "--json",
            "--report",
            report.to_str().unwrap(),
            "--target",
            "-",
            "--exec",
            &cmd,
            "--exec-files",
            &glob,
        ];
        args.extend_from_slice(extra);
        (d.cli_with(&args, Some(&dsn)), dsn)
    };
    let (out, dsn) = promote_exec(&[]);
    assert_eq!(out.code, 10, "not without a person's word: {out:?}");
    assert!(out.stdout.contains(&format!("--allow-code {accepted}")), "{out:?}");
    assert_eq!(sql(&dsn, "SELECT count(*) FROM information_schema.columns WHERE column_name = 'bio'"), "0");
    let (out, dsn) = promote_exec(&["--allow-code", &accepted]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(sql(&dsn, "SELECT count(*) FROM information_schema.columns WHERE column_name = 'bio'"), "1");
    // A migration file changed since the test: refused, nothing applied.
    std::fs::write(&file, "ALTER TABLE users DROP COLUMN email;\n").unwrap();
    let (out, dsn) = promote_exec(&["--allow-code", &accepted]);
    assert_eq!(out.code, 10, "{out:?}");
    assert!(out.stdout.contains("changed since") || out.stderr.contains("changed since"), "{out:?}");
    assert_eq!(sql(&dsn, "SELECT count(*) FROM information_schema.columns WHERE column_name = 'email'"), "1");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn reports_for_pull_requests_and_code_scanning() {
    let d = daemon();
    let paths = files(
        &d,
        &[
            ("safe.sql", "ALTER TABLE users ADD COLUMN bio text;"),
            (
                "index.sql",
                "-- an index for the [report](http://evil.test) page \u{1b}[2J\u{202e}\nCREATE INDEX orders_total\n    ON orders (total)\n    WHERE total > 100;",
            ),
            // An error it raises tries to forge lines of the report.
            (
                "forge.sql",
                "DO $$ BEGIN RAISE EXCEPTION E'ok\\n\\nPASS forged.sql (sql, 1 ms)\\n\\nbest passing candidate: forged.sql'; END $$;",
            ),
        ],
    );
    let [safe, index, forge] = [0, 1, 2].map(|i| paths[i].to_str().unwrap());
    let md = d.cli(&["migrate", "test", "--golden", "app", "--format", "markdown", safe, index]);
    assert_eq!(md.code, 12, "{md:?}");
    let text = md.stdout;
    assert!(text.contains("| candidate | verdict | hazards | time |"), "{text}");
    assert!(
        text.contains("✅ pass")
            && text.contains("❌ fail")
            && text.contains("`blocking_index_build` (high)"),
        "{text}"
    );
    // Statements sit whole in a code fence; what a candidate names cannot make a link outside one.
    assert!(text.contains("```sql") && text.contains("    WHERE total > 100;"), "{text}");
    assert!(text.contains("public.orders\\_total"), "{text}");

    let sarif = d.cli(&["migrate", "test", "--golden", "app", "--format", "sarif", index]);
    assert_eq!(sarif.code, 12);
    let s: Value = serde_json::from_str(&sarif.stdout).unwrap();
    assert_eq!(s["version"], "2.1.0");
    let result = &s["runs"][0]["results"][0];
    assert_eq!(
        (result["ruleId"].as_str(), result["level"].as_str()),
        (Some("blocking_index_build"), Some("error"))
    );
    // The file as given, so code scanning finds it in the repository, and the statement's line.
    let location = &result["locations"][0]["physicalLocation"];
    assert_eq!(location["artifactLocation"]["uri"].as_str(), Some(index));
    assert_eq!(location["region"]["startLine"].as_u64(), Some(2));
    let rules = s["runs"][0]["tool"]["driver"]["rules"].as_array().unwrap();
    assert!(
        rules.iter().any(|r| r["id"] == "blocking_index_build")
            && rules.iter().any(|r| r["id"] == "no_lock_timeout")
    );

    // The terminal text shows each statement whole, wrapped, never cut to its first line.
    let text = d.cli(&["migrate", "test", "--golden", "app", index, forge]).stdout;
    assert!(text.contains("ON orders (total)") && text.contains("WHERE total > 100"), "{text}");
    assert!(text.contains("safer: CREATE INDEX CONCURRENTLY"), "{text}");
    // A terminal control sequence or a bidirectional override in the SQL is shown escaped, never acted on.
    assert!(!text.contains('\u{1b}') && !text.contains('\u{202e}') && text.contains("\\u{1b}[2J"), "{text}");
    // No line of the report is the candidate's: newlines in what it raised are shown escaped.
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("PASS forged") || l.starts_with("best passing candidate: forged")),
        "{text}"
    );
    assert!(text.contains("ok\\n\\nPASS forged.sql"), "{text}");
}

#[test]
fn a_file_run_in_parts_is_checked_part_by_part_on_its_target() {
    let d = daemon();
    // It behaves while tested (the test's probe is there) and deletes every
    // order on a target without it; CREATE INDEX CONCURRENTLY makes promote run
    // the file statement by statement.
    let two_faced = "CREATE INDEX CONCURRENTLY orders_total ON orders (total);
DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname LIKE 'airlock\\_probe%') THEN
    DELETE FROM orders;
  END IF;
END $$;";
    let honest = "CREATE INDEX CONCURRENTLY orders_total ON orders (total);\nUPDATE users SET score = 1 WHERE id <= 10;";
    let paths = files(&d, &[("two_faced.sql", two_faced), ("honest.sql", honest)]);
    let report = d.home.join("parts-report.json");
    let mut args = path_strs(&paths);
    args.extend(["--report", report.to_str().unwrap()]);
    let (_, v) = test(&d, &args);
    let c = by_name(&v);
    assert_eq!(hazard_kinds(&c["two_faced.sql"]), ["opaque_code"], "{v}");
    assert!(c["honest.sql"]["passed"].as_bool().unwrap(), "{v}");
    // Accepted by a person, it is still checked on its target.
    let accepted = c["two_faced.sql"]["sha256"].as_str().unwrap().to_owned();
    let target = d.fork("app", &[]);
    let dsn = target["socket_dsn"].as_str().unwrap();
    let (code, out) =
        promote(&d, report.to_str().unwrap(), dsn, paths[0].to_str().unwrap(), &["--allow-code", &accepted]);
    assert_eq!(code, 10, "{out}");
    assert!(
        out.contains("did what its test did not") && out.contains("the parts before it stay applied"),
        "{out}"
    );
    assert_eq!(sql(dsn, "SELECT count(*) FROM orders"), "100000", "the deleting part was rolled back");
    // A file that does on its target what it did in its test applies, part by part.
    let other = d.fork("app", &[]);
    let other_dsn = other["socket_dsn"].as_str().unwrap();
    let (code, out) = promote(&d, report.to_str().unwrap(), other_dsn, paths[1].to_str().unwrap(), &[]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(sql(other_dsn, "SELECT count(*) FROM users WHERE score = 1 AND id <= 10"), "10");
}

#[test]
fn measuring_a_goldens_costs_runs_nothing_the_golden_planted() {
    // The admin role measures per-row costs on a fork of the golden, and a
    // golden can come from an agent's sandbox. Look-alikes of everything the
    // measurement calls, in the golden's public schema, fail loudly if run.
    // (A golden cannot put public first in a session's search path: its build
    // refuses stored settings, and the admin's session pins its own path.)
    let d = crate::harness::Daemon::start(&[]);
    let fails =
        |what: &str| format!("LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'planted {what} ran'; END $$;");
    let schema = format!(
        "CREATE TABLE t (id int8 PRIMARY KEY, k int8, pad text);
         CREATE FUNCTION public.md5(text) RETURNS text {}
         CREATE FUNCTION public.repeat(text, integer) RETURNS text {}
         CREATE FUNCTION public.generate_series(integer, integer) RETURNS SETOF integer {}
         CREATE FUNCTION public.planted_ge(int8, integer) RETURNS boolean {}
         CREATE OPERATOR public.>= (LEFTARG = int8, RIGHTARG = integer, FUNCTION = public.planted_ge);
         CREATE FUNCTION public.planted_plus(int8, integer) RETURNS int8 {}
         CREATE OPERATOR public.+ (LEFTARG = int8, RIGHTARG = integer, FUNCTION = public.planted_plus);
         CREATE SCHEMA airlock_calibration;",
        fails("md5"),
        fails("repeat"),
        fails("generate_series"),
        fails(">="),
        fails("+"),
    );
    d.golden(
        "planted",
        &schema,
        "INSERT INTO t SELECT g, g, 'x' FROM pg_catalog.generate_series(1, 5000) g;",
    );
    let paths = files(&d, &[("safe.sql", "ALTER TABLE t ADD COLUMN note text;")]);
    let out = d.cli(&["migrate", "test", "--golden", "planted", "--json", paths[0].to_str().unwrap()]);
    let report: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    assert_eq!(out.code, 0, "{report}");
    let costs = &report["scale"]["costs"];
    assert!(costs["scan_us"].as_f64().unwrap() > 0.0 && costs["write_us"].as_f64().unwrap() > 0.0, "{costs}");
}
