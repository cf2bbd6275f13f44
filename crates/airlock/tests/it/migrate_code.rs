//! Code whose effect depends on where it runs: reported as `opaque_code`,
//! promoted only once a person accepts the exact file by its hash, and even
//! then checked on its target for what its test could not see (which rows,
//! sequences, roles' passwords, databases).

use serde_json::Value;

use crate::harness::{sql, Daemon};
use crate::migrate::{by_name, files, hazard_kinds, promote, test, SCHEMA, SEED};

/// The test's own sign: its probe's schema is there only under test.
const UNDER_TEST: &str = "pg_catalog.to_regnamespace('pg_airlock_probe') IS NOT NULL";

/// A DO block that does `quiet` under test and `loud` anywhere else.
fn branches(sign: &str, quiet: &str, loud: &str) -> String {
    format!("DO $do$ BEGIN\n  IF {sign} THEN\n    {quiet}\n  ELSE\n    {loud}\n  END IF;\nEND $do$;\n")
}

/// The candidate's SHA-256 in the report.
fn sha(report: &Value, name: &str) -> String {
    by_name(report)[name]["sha256"].as_str().unwrap().to_owned()
}

#[test]
fn code_that_can_tell_the_test_apart_needs_a_person_and_is_still_checked_on_its_target() {
    let d = Daemon::start(&[]);
    // Production: a real server, its application's owner role (no
    // superuser), and a function an earlier migration left there that looks
    // where it runs. The golden is built from it, so nothing has drifted.
    let prod = crate::imports::Production::start("code");
    let tidy = "CREATE FUNCTION public.tidy() RETURNS void LANGUAGE plpgsql AS $f$ BEGIN
  IF pg_catalog.to_regnamespace('pg_airlock_probe') IS NULL THEN DELETE FROM orders WHERE id <= 10; END IF;
END $f$;";
    sql(&prod.dsn("postgres"), "CREATE ROLE app_owner LOGIN");
    sql(&prod.dsn("postgres"), "CREATE DATABASE app OWNER app_owner");
    let target = prod.dsn("app").replacen("postgres@", "app_owner@", 1);
    for part in [SCHEMA, tidy, SEED] {
        crate::harness::psql(&target, part).unwrap();
    }
    let out = d.cli_with(&["golden", "create", "app", "--from-url", "-"], Some(&prod.dsn("app")));
    assert_eq!(out.code, 0, "{out:?}");
    let password = || {
        sql(&prod.dsn("postgres"), "SELECT rolpassword IS NULL FROM pg_authid WHERE rolname = 'app_owner'")
    };
    assert_eq!(password(), "t");
    let candidates = [
        // The red team's four: rows overwritten within the allowed share...
        (
            "share.sql",
            branches(
                UNDER_TEST,
                "UPDATE users SET score = score WHERE id <= 100;",
                "UPDATE users SET score = 99 WHERE id > 19900;",
            ),
        ),
        // ...every email rewritten through dynamic SQL...
        (
            "emails.sql",
            branches(
                UNDER_TEST,
                "PERFORM 1;",
                "EXECUTE format('UPDATE %I SET email = %L', 'users', 'x@evil.test');",
            ),
        ),
        // ...a sequence set back, so the next insert fails...
        ("sequence.sql", branches(UNDER_TEST, "PERFORM 1;", "PERFORM pg_catalog.setval('users_id_seq', 1);")),
        // ...and the role's own password changed.
        (
            "password.sql",
            branches(
                UNDER_TEST,
                "PERFORM 1;",
                "EXECUTE format('ALTER ROLE %I PASSWORD %L', current_user, 'taken-over');",
            ),
        ),
        // The database closed to every new connection, and the schema
        // opened to everyone.
        (
            "closed.sql",
            branches(
                UNDER_TEST,
                "PERFORM 1;",
                "EXECUTE format('ALTER DATABASE %I CONNECTION LIMIT 0', current_database());",
            ),
        ),
        ("opened.sql", branches(UNDER_TEST, "PERFORM 1;", "GRANT ALL ON SCHEMA public TO PUBLIC;")),
        // Other signs of the test, in plain SQL and in code: the database's
        // name, the data's size, the sessions, the time, a function of an
        // earlier migration.
        (
            "database.sql",
            format!(
                "UPDATE users SET score = 5 WHERE current_database() IS NOT NULL AND NOT ({UNDER_TEST});\n"
            ),
        ),
        (
            "size.sql",
            branches(
                "(SELECT count(*) FROM users) <= 20000",
                "PERFORM 1;",
                "DELETE FROM orders WHERE id <= 50;",
            ),
        ),
        ("sessions.sql", "DELETE FROM orders WHERE (SELECT count(*) FROM pg_stat_activity) > 1000;\n".into()),
        ("timing.sql", "UPDATE users SET score = 3 WHERE clock_timestamp() < '2000-01-01';\n".into()),
        ("earlier.sql", "SELECT public.tidy();\n".into()),
        // The control: plain DDL and DML.
        (
            "plain.sql",
            "ALTER TABLE users ADD COLUMN verified_at timestamptz DEFAULT now();\n\
             UPDATE users SET score = 1 WHERE id <= 10;\n"
                .into(),
        ),
    ];
    let borrowed: Vec<(&str, &str)> = candidates.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let paths = files(&d, &borrowed);
    let path = |name: &str| paths.iter().find(|p| p.ends_with(name)).unwrap().to_str().unwrap().to_owned();
    let report_file = d.home.join("report.json");
    let mut args: Vec<String> = paths.iter().map(|p| p.to_str().unwrap().to_owned()).collect();
    args.extend(["--report".into(), report_file.to_str().unwrap().into()]);
    let (_, report) = test(&d, &args.iter().map(String::as_str).collect::<Vec<_>>());
    let report_path = report_file.to_str().unwrap();
    let tested = by_name(&report);
    for (name, _) in &candidates {
        let kinds = hazard_kinds(&tested[*name]);
        if *name == "plain.sql" {
            assert!(kinds.is_empty(), "the control passes: {}", tested[*name]);
        } else {
            assert_eq!(kinds, ["opaque_code"], "{name}: {}", tested[*name]);
        }
    }
    let why = |name: &str| tested[name]["hazards"][0]["message"].as_str().unwrap().to_owned();
    assert!(why("earlier.sql").contains("tidy()"), "{}", why("earlier.sql"));
    assert!(why("sessions.sql").contains("pg_stat_activity"), "{}", why("sessions.sql"));
    assert!(why("timing.sql").contains("clock_timestamp()"), "{}", why("timing.sql"));
    assert!(why("database.sql").contains("current_database()"), "{}", why("database.sql"));
    assert!(why("share.sql").contains("DO block"), "{}", why("share.sql"));
    // Without a person's word, nothing runs; a hazard's name, or another
    // file's hash, is not that word.
    let other = "0".repeat(64);
    for extra in [vec![], vec!["--allow-hazard", "opaque_code"], vec!["--allow-code", other.as_str()]] {
        let (code, out) = promote(&d, report_path, &target, &path("emails.sql"), &extra);
        assert_eq!(code, 10, "{extra:?}: {out}");
        assert!(out.contains(&format!("--allow-code {}", sha(&report, "emails.sql"))), "{out}");
    }
    assert_eq!(sql(&target, "SELECT count(*) FROM users WHERE email = 'x@evil.test'"), "0");
    // With it, the target must still see what the test saw.
    let checks = [
        ("share.sql", "other rows"),
        ("emails.sql", "updated in public.users"),
        ("sequence.sql", "sequence public.users_id_seq set back"),
        ("password.sql", "pg_authid"),
        ("closed.sql", "connection limit=0"),
        ("opened.sql", "schema public: owner OWNER; grants =UC/OWNER"),
        ("database.sql", "updated in public.users"),
        ("size.sql", "deleted from public.orders"),
        ("earlier.sql", "deleted from public.orders"),
    ];
    // (Each refusal rolls everything back, so one target serves them all.)
    for (name, said) in checks {
        if name == "size.sql" {
            // Production has grown since the golden was taken.
            sql(
                &target,
                "INSERT INTO users (tenant_id, email) SELECT 1, 'new' || g FROM generate_series(1, 10) g",
            );
        }
        let before = sql(&target, "SELECT count(*), sum(score), max(id) FROM users");
        let orders = sql(&target, "SELECT count(*) FROM orders");
        let accepted = sha(&report, name);
        let (code, out) = promote(&d, report_path, &target, &path(name), &["--allow-code", &accepted]);
        assert_eq!(code, 10, "{name}: {out}");
        assert!(out.contains("did what its test did not") && out.contains(said), "{name}: {said}: {out}");
        assert_eq!(
            sql(&target, "SELECT count(*), sum(score), max(id) FROM users"),
            before,
            "{name} rolled back"
        );
        assert_eq!(sql(&target, "SELECT count(*) FROM orders"), orders, "{name} rolled back");
        assert_eq!(
            sql(&target, "SELECT nextval('users_id_seq') > 20000"),
            "t",
            "{name}: the sequence is where it was"
        );
    }
    // The role's password is the one it had, and the database takes
    // connections.
    assert_eq!(password(), "t");
    assert_eq!(
        sql(&prod.dsn("postgres"), "SELECT datconnlimit FROM pg_database WHERE datname = 'app'"),
        "-1"
    );
    // The control promotes with no word from anyone.
    let (code, out) = promote(&d, report_path, &target, &path("plain.sql"), &[]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(sql(&target, "SELECT count(*) FROM users WHERE score = 1"), "10");
}
