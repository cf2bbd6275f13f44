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

/// Production: a real server, its application's owner role (no superuser)
/// owning database `app` with the test schema, `extra` and the seed; and
/// golden `app` built from it, so nothing has drifted. Returns the server
/// and the owner's DSN.
fn production(d: &Daemon, name: &str, extra: &str) -> (crate::imports::Production, String) {
    let prod = crate::imports::Production::start(name);
    sql(&prod.dsn("postgres"), "CREATE ROLE app_owner LOGIN");
    sql(&prod.dsn("postgres"), "CREATE DATABASE app OWNER app_owner");
    let target = prod.dsn("app").replacen("postgres@", "app_owner@", 1);
    for part in [SCHEMA, extra, SEED] {
        crate::harness::psql(&target, part).unwrap();
    }
    let out = d.cli_with(&["golden", "create", "app", "--from-url", "-"], Some(&prod.dsn("app")));
    assert_eq!(out.code, 0, "{out:?}");
    (prod, target)
}

#[test]
fn code_that_can_tell_the_test_apart_needs_a_person_and_is_still_checked_on_its_target() {
    let d = Daemon::start(&[]);
    // Production: a real server, its application's owner role (no
    // superuser), and a function an earlier migration left there that looks
    // where it runs. The golden is built from it, so nothing has drifted.
    let tidy = "CREATE FUNCTION public.tidy() RETURNS void LANGUAGE plpgsql AS $f$ BEGIN
  IF pg_catalog.to_regnamespace('pg_airlock_probe') IS NULL THEN DELETE FROM orders WHERE id <= 10; END IF;
END $f$;";
    let (prod, target) = production(&d, "code", tidy);
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
        } else if *name == "size.sql" {
            // A DO block of plain PL/pgSQL that acts on the data's size acts
            // as plain SQL would: no code, and held to its rows on promote.
            assert!(kinds.is_empty(), "{name}: {}", tested[*name]);
        } else {
            assert_eq!(kinds, ["opaque_code"], "{name}: {}", tested[*name]);
        }
    }
    let why = |name: &str| tested[name]["hazards"][0]["message"].as_str().unwrap().to_owned();
    assert!(why("earlier.sql").contains("tidy()"), "{}", why("earlier.sql"));
    assert!(why("sessions.sql").contains("pg_stat_activity"), "{}", why("sessions.sql"));
    assert!(why("timing.sql").contains("clock_timestamp()"), "{}", why("timing.sql"));
    assert!(why("database.sql").contains("current_database()"), "{}", why("database.sql"));
    // A DO block is named by what in it looks around, or as a whole where
    // it is more than plain PL/pgSQL.
    assert!(why("share.sql").contains("line 1: calls to_regnamespace()"), "{}", why("share.sql"));
    assert!(why("emails.sql").contains("line 1: a DO block (code"), "{}", why("emails.sql"));
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
        ("share.sql", "rows of public.users alike here and in its test before"),
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
        let word: &[&str] = if name == "size.sql" { &[] } else { &["--allow-code", &accepted] };
        let (code, out) = promote(&d, report_path, &target, &path(name), word);
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

#[test]
fn a_file_run_in_parts_is_checked_part_by_part_and_its_report_cannot_be_edited() {
    let d = Daemon::start(&[]);
    // A table without a primary key: its rows are compared by what they hold.
    // And the application's role reads times in a zone of its own, and its
    // database quotes every name it shows.
    let events = "CREATE TABLE events (kind text NOT NULL, n int NOT NULL);
INSERT INTO events SELECT CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END, g FROM generate_series(1, 40) g;
ALTER ROLE app_owner SET TimeZone = 'Pacific/Auckland';
ALTER DATABASE app SET quote_all_identifiers = on;";
    let (_prod, target) = production(&d, "parts", events);
    let quiet = |what: &str| branches(UNDER_TEST, "PERFORM 1;", what);
    let candidates = [
        // Parts: its own transactions, one after the other. The second
        // changes other rows on the target than under test (as many).
        (
            "blocks.sql",
            format!(
                "BEGIN;\nUPDATE users SET score = 2 WHERE id <= 5;\nCOMMIT;\nBEGIN;\nSAVEPOINT s;\n{}RELEASE SAVEPOINT s;\nCOMMIT;\n",
                branches(
                    UNDER_TEST,
                    "UPDATE users SET score = score WHERE id <= 3;",
                    "UPDATE users SET score = 7 WHERE id BETWEEN 100 AND 102;"
                )
            ),
        ),
        // A chained transaction that changes the role's settings on the target only.
        (
            "chain.sql",
            format!(
                "BEGIN;\nUPDATE users SET score = 3 WHERE id = 1;\nCOMMIT AND CHAIN;\n{}COMMIT;\n",
                quiet("EXECUTE format('ALTER ROLE %I SET work_mem = %L', current_user, '1MB');")
            ),
        ),
        // A block that grants the table to everyone on the target, then a
        // statement that cannot run in a transaction.
        (
            "granted.sql",
            format!("BEGIN;\n{}COMMIT;\nVACUUM users;\n", quiet("GRANT ALL ON users TO PUBLIC;")),
        ),
        // A block that rolls itself back but sets a sequence back on the target.
        (
            "rolled.sql",
            format!(
                "BEGIN;\n{}ROLLBACK;\nUPDATE users SET score = 4 WHERE id = 2;\n",
                quiet("PERFORM pg_catalog.setval('users_id_seq', 1);")
            ),
        ),
        // Rows added, then a refusal: the sequence they took stays advanced, and says so.
        (
            "advanced.sql",
            format!(
                "INSERT INTO users (tenant_id, email) SELECT 1, 'adv' || g FROM generate_series(1, 5) g;\n{}",
                quiet("UPDATE orders SET note = 'x' WHERE id <= 3;")
            ),
        ),
        // Rows of a table without a key: as many, but others.
        (
            "nokey.sql",
            branches(
                UNDER_TEST,
                "UPDATE events SET n = n WHERE n <= 4;",
                "UPDATE events SET n = 0 WHERE n > 36;",
            ),
        ),
        // Plain SQL that is only harmful on the target: a schema named after
        // the application's role comes first on its search path.
        ("shadow.sql", "CREATE SCHEMA app_owner;\nCREATE TABLE app_owner.users (id int);\n".into()),
        // A unique index built concurrently, which the target's data will break.
        ("unique.sql", "CREATE UNIQUE INDEX CONCURRENTLY events_n ON events (n);\n".into()),
        // The controls: parts with an index built concurrently, and plain
        // changes to a table without a key.
        (
            "parts.sql",
            "BEGIN;\nINSERT INTO events VALUES ('c', 100);\nCOMMIT;\n\
             CREATE INDEX CONCURRENTLY users_score ON users (score);\n\
             UPDATE users SET score = 5 WHERE id <= 2;\nUPDATE events SET n = n + 1 WHERE kind = 'a';\n"
                .into(),
        ),
        // A file that quotes every name in its own session is read as any other.
        ("quoted.sql", "SET quote_all_identifiers = on;\nUPDATE users SET score = 6 WHERE id = 4;\n".into()),
        // Rows written as they were: changed, by no digest.
        ("same.sql", "UPDATE users SET score = score WHERE id <= 3;\n".into()),
        // A time without a zone means what it meant under test.
        (
            "zone.sql",
            "UPDATE users SET nickname = to_char('2026-06-01 12:00+00'::timestamptz, 'HH24') WHERE id = 3;\n".into(),
        ),
        ("rows.sql", "INSERT INTO events VALUES ('b', 5);\nUPDATE events SET n = 1000 WHERE n = 5;\n".into()),
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
    for name in ["shadow.sql", "parts.sql", "rows.sql", "zone.sql", "same.sql", "quoted.sql", "unique.sql"] {
        assert!(hazard_kinds(&tested[name]).is_empty(), "{name}: {}", tested[name]);
    }
    assert_eq!(tested["parts.sql"]["parts"].as_array().map(Vec::len), Some(4), "{}", tested["parts.sql"]);
    let state = || {
        (
            sql(&target, "SELECT count(*), sum(score) FROM users"),
            sql(&target, "SELECT count(*), sum(n), string_agg(kind, '' ORDER BY kind, n) FROM events"),
            sql(
                &target,
                "SELECT count(*) = 0 FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole
                  WHERE r.rolname = current_user AND array_to_string(s.setconfig, ',') LIKE '%work_mem%'",
            ),
            sql(
                &target,
                "SELECT count(*) FROM information_schema.role_table_grants WHERE grantee = 'PUBLIC'",
            ),
        )
    };
    let checks = [
        ("blocks.sql", "rows of public.users alike here and in its test before", true),
        ("chain.sql", "role app_owner: TimeZone=Pacific/Auckland, work_mem=1MB", true),
        ("granted.sql", "(not so in the test)", true),
        ("rolled.sql", "sequence public.users_id_seq set back", false),
        ("nokey.sql", "rows of public.events alike here and in its test before", false),
        ("advanced.sql", "sequences it advanced stay advanced (public.users_id_seq", false),
    ];
    for (name, said, kept_before) in checks {
        let before = state();
        let (code, out) =
            promote(&d, report_path, &target, &path(name), &["--allow-code", &sha(&report, name)]);
        assert_eq!(code, 10, "{name}: {out}");
        assert!(out.contains("did what its test did not") && out.contains(said), "{name}: {said}: {out}");
        let now = state();
        assert_eq!((now.2.as_str(), now.3.as_str()), ("t", before.3.as_str()), "{name}: undone");
        if !kept_before {
            assert_eq!(now, before, "{name}: nothing applied");
        }
        assert_eq!(sql(&target, "SELECT nextval('users_id_seq') > 20000"), "t", "{name}: the sequence");
    }
    // The first part of blocks.sql and chain.sql stayed, as their refusals said.
    assert_eq!(sql(&target, "SELECT score FROM users WHERE id IN (1, 5) ORDER BY id"), "3\n2");
    let (code, out) = promote(&d, report_path, &target, &path("shadow.sql"), &[]);
    assert_eq!(code, 10, "{out}");
    assert!(out.contains("schema app_owner is named after a role here"), "{out}");
    assert_eq!(sql(&target, "SELECT to_regnamespace('app_owner') IS NULL"), "t");

    // The report is the daemon's: edited, it promotes nothing, not even
    // with the edit undone in another form; a faithful copy promotes.
    let text = std::fs::read_to_string(&report_file).unwrap();
    let mut forged: Value = serde_json::from_str(&text).unwrap();
    let untested = d.home.join("untested.sql");
    std::fs::write(&untested, "DELETE FROM orders;\n").unwrap();
    let untested_sha = {
        use sha2::Digest;
        airlock_core::secret::hex(&sha2::Sha256::digest(b"DELETE FROM orders;\n"))
    };
    let at = forged["candidates"].as_array().unwrap().iter().position(|c| c["name"] == "rows.sql").unwrap();
    forged["candidates"][at]["sha256"] = untested_sha.into();
    forged["candidates"][at]["name"] = "untested.sql".into();
    let forged_file = d.home.join("forged.json");
    std::fs::write(&forged_file, serde_json::to_string(&forged).unwrap()).unwrap();
    let (code, out) = promote(&d, forged_file.to_str().unwrap(), &target, untested.to_str().unwrap(), &[]);
    assert_eq!(code, 10, "{out}");
    assert!(out.contains("seal does not match"), "{out}");
    let mut unkeyed: Value = serde_json::from_str(&text).unwrap();
    let at = unkeyed["candidates"].as_array().unwrap().iter().position(|c| c["name"] == "nokey.sql").unwrap();
    unkeyed["candidates"][at]["row_record"] = "runs/elsewhere.changes".into();
    unkeyed["seal"] = "".into();
    std::fs::write(&forged_file, serde_json::to_string(&unkeyed).unwrap()).unwrap();
    let (code, out) = promote(
        &d,
        forged_file.to_str().unwrap(),
        &target,
        &path("nokey.sql"),
        &["--allow-code", &sha(&report, "nokey.sql")],
    );
    assert_eq!(code, 10, "{out}");
    assert!(out.contains("no seal"), "{out}");
    assert_eq!(sql(&target, "SELECT count(*) FROM orders"), "100000");
    // A copy parsed and written again (other spacing, other key order) is the same report.
    let copy: Value = serde_json::from_str(&text).unwrap();
    let copy_file = d.home.join("copy.json");
    std::fs::write(&copy_file, serde_json::to_string_pretty(&copy).unwrap()).unwrap();
    // A failure outside a transaction says what it left behind.
    sql(&target, "INSERT INTO events VALUES ('z', 7)");
    let (code, out) = promote(&d, copy_file.to_str().unwrap(), &target, &path("unique.sql"), &[]);
    assert_eq!(code, 11, "{out}");
    assert!(
        out.contains("index public.events_n stays behind INVALID: DROP INDEX CONCURRENTLY public.events_n"),
        "{out}"
    );
    sql(&target, "DROP INDEX events_n");
    sql(&target, "DELETE FROM events WHERE kind = 'z'");
    for name in ["rows.sql", "zone.sql", "same.sql", "quoted.sql", "parts.sql"] {
        let (code, out) = promote(&d, copy_file.to_str().unwrap(), &target, &path(name), &[]);
        assert_eq!(code, 0, "{name}: {out}");
    }
    assert_eq!(sql(&target, "SELECT count(*) FROM pg_indexes WHERE indexname = 'users_score'"), "1");
    assert_eq!(sql(&target, "SELECT count(*) FROM events WHERE n = 1000 OR kind = 'c'"), "3");
    let tested_zone = tested["zone.sql"]["session"]["TimeZone"].as_str().unwrap().to_owned();
    assert_ne!(tested_zone, "Pacific/Auckland", "{}", tested["zone.sql"]);
    let hour = sql(
        &target,
        &format!("SELECT to_char('2026-06-01 12:00+00'::timestamptz AT TIME ZONE '{tested_zone}', 'HH24')"),
    );
    assert_eq!(sql(&target, "SELECT nickname FROM users WHERE id = 3"), hour, "shown in the test's zone");
}

/// Plain SQL, no code at all, can still tell the test from production by
/// what the data holds (its size here). What it then does differently to
/// rows alike on both is refused; what production's own new or changed rows
/// meet is not, so a faithful migration of a production that moved on since
/// the golden promotes.
#[test]
fn plain_sql_that_acts_on_a_sign_of_the_test_is_refused_by_what_it_does_to_rows() {
    let d = Daemon::start(&[]);
    let (_prod, target) = production(&d, "rows", "");
    // Production has moved on since the golden: rows added, and one changed.
    sql(&target, "INSERT INTO users (tenant_id, email) SELECT 1, 'new' || g FROM generate_series(1, 10) g");
    sql(&target, "UPDATE users SET email = 'changed@x.test' WHERE id = 7");
    let grown = "(SELECT count(*) FROM users) > 20005";
    let candidates = [
        // Rows alike on both, changed only here.
        (
            "here_only.sql",
            format!("UPDATE users SET email = CASE WHEN {grown} THEN 'x@evil.test' ELSE email END WHERE id <= 100;\n"),
        ),
        // Rows changed on both, to other contents here.
        ("otherwise.sql", format!("UPDATE users SET score = score + CASE WHEN {grown} THEN 100 ELSE 1 END WHERE id <= 50;\n")),
        // A column the file adds, filled by the sign.
        ("added.sql", format!("ALTER TABLE users ADD COLUMN flagged boolean;\nUPDATE users SET flagged = {grown} WHERE id <= 200;\n")),
        // Faithful ones: rows changed alike, a column filled by the clock,
        // rows added (with keys of their own on each side).
        (
            "faithful.sql",
            "ALTER TABLE users ADD COLUMN seen_at timestamptz DEFAULT now();\n\
             UPDATE users SET score = score + 1 WHERE id <= 10;\n\
             INSERT INTO users (tenant_id, email) VALUES (2, 'added@x.test');\n"
                .to_owned(),
        ),
    ];
    let borrowed: Vec<(&str, &str)> = candidates.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let paths = files(&d, &borrowed);
    let path = |name: &str| paths.iter().find(|p| p.ends_with(name)).unwrap().to_str().unwrap().to_owned();
    let report_file = d.home.join("report.json");
    let mut args: Vec<String> = paths.iter().map(|p| p.to_str().unwrap().to_owned()).collect();
    args.extend(["--report".into(), report_file.to_str().unwrap().into()]);
    let (_, report) = test(&d, &args.iter().map(String::as_str).collect::<Vec<_>>());
    let tested = by_name(&report);
    // No code in any of them (a lock held while a file run whole works is
    // another matter, accepted by name).
    for (name, _) in &candidates {
        assert!(!hazard_kinds(&tested[*name]).contains(&"opaque_code"), "{name}: {}", tested[*name]);
    }
    let accept = |name: &str| -> Vec<String> {
        hazard_kinds(&tested[name])
            .iter()
            .flat_map(|k| ["--allow-hazard".to_owned(), k.to_string()])
            .collect()
    };
    let report_path = report_file.to_str().unwrap();
    let state = || {
        sql(&target, "SELECT count(*), sum(score), count(*) FILTER (WHERE email LIKE '%evil%') FROM users")
    };
    for (name, said) in [
        ("here_only.sql", "of the 19999 rows of public.users alike here and in its test before, 99 changed here but not in the test"),
        ("otherwise.sql", "49 came out otherwise than in the test"),
        ("added.sql", "came out otherwise than in the test"),
    ] {
        let before = state();
        let allowed = accept(name);
        let allowed: Vec<&str> = allowed.iter().map(String::as_str).collect();
        let (code, out) = promote(&d, report_path, &target, &path(name), &allowed);
        assert_eq!(code, 10, "{name}: {out}");
        assert!(
            out.contains("alike here and in its test before") && out.contains(said),
            "{name}: {said}: {out}"
        );
        assert_eq!(state(), before, "{name} rolled back");
    }
    // A function of the file reached as a column of its row: code, which
    // needs a person before anything runs.
    let coded = [(
        "attribute.sql",
        format!(
            "CREATE FUNCTION grown(users) RETURNS boolean LANGUAGE sql AS $$ SELECT {grown} $$;\n\
                 UPDATE users u SET score = 5 WHERE u.grown AND id <= 10;\n"
        ),
    )];
    let borrowed: Vec<(&str, &str)> = coded.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let coded_paths = files(&d, &borrowed);
    let coded_report = d.home.join("coded.json");
    let mut args: Vec<String> = coded_paths.iter().map(|p| p.to_str().unwrap().to_owned()).collect();
    args.extend(["--report".into(), coded_report.to_str().unwrap().into()]);
    let (_, report) = test(&d, &args.iter().map(String::as_str).collect::<Vec<_>>());
    for (name, path) in coded.iter().map(|(n, _)| *n).zip(&coded_paths) {
        assert_eq!(hazard_kinds(&by_name(&report)[name]), ["opaque_code"], "{name}");
        let (code, out) = promote(&d, coded_report.to_str().unwrap(), &target, path.to_str().unwrap(), &[]);
        assert_eq!(code, 10, "{name}: {out}");
        assert!(out.contains("--allow-code"), "{name}: {out}");
    }
    // A sequence set by what it finds is plain SQL too: its test sets it
    // where its column is clear, and the target's, set far past, is refused
    // by how far it moved.
    let set_by_count = format!(
        "SELECT setval('users_id_seq', CASE WHEN {grown} THEN 9223372036854775806 ELSE 20010 END);\n"
    );
    let sequence_paths = files(&d, &[("sequence.sql", set_by_count.as_str())]);
    let sequence_report = d.home.join("sequence.json");
    let (_, report) =
        test(&d, &[sequence_paths[0].to_str().unwrap(), "--report", sequence_report.to_str().unwrap()]);
    assert_eq!(hazard_kinds(&by_name(&report)["sequence.sql"]), Vec::<&str>::new(), "{report}");
    let (code, out) =
        promote(&d, sequence_report.to_str().unwrap(), &target, sequence_paths[0].to_str().unwrap(), &[]);
    assert_eq!(code, 10, "{out}");
    assert!(out.contains("sequence public.users_id_seq moved forward by"), "{out}");
    assert!(out.contains("sequences put back where they were: public.users_id_seq"), "{out}");
    assert_eq!(sql(&target, "SELECT last_value < 100000 FROM users_id_seq"), "t");
    let allowed = accept("faithful.sql");
    let allowed: Vec<&str> = allowed.iter().map(String::as_str).collect();
    let (code, out) = promote(&d, report_path, &target, &path("faithful.sql"), &allowed);
    assert_eq!(code, 0, "{out}");
    assert_eq!(sql(&target, "SELECT count(*) FROM users WHERE email = 'added@x.test'"), "1");
    assert_eq!(
        sql(&target, "SELECT score FROM users WHERE id = 7"),
        "1",
        "a row changed since the golden, changed too"
    );
}

/// What an independent attack got past promote with plain SQL, each now
/// refused (or flagged) for the class it belongs to: a row check evaded by
/// a default made to read the clock for a moment, by a key dropped for a
/// moment, by padding a table past the compared size, by moving a row to
/// another key and back; an object shadowing another under a search_path the
/// target stores; a sequence burned by conflicting inserts; promote's own
/// timeouts lifted by the file; a lock held to the end of a file run whole.
#[test]
fn what_an_attack_got_past_promote_is_refused_for_its_class() {
    let d = Daemon::start(&[]);
    let extra = "ALTER TABLE users ADD COLUMN is_admin boolean NOT NULL DEFAULT false;
        CREATE TABLE settings (key text PRIMARY KEY, value text);
        INSERT INTO settings VALUES ('maintenance', 'off'), ('theme', 'light');
        CREATE TABLE codes (id bigserial PRIMARY KEY, code text UNIQUE NOT NULL);
        INSERT INTO codes (code) SELECT 'c' || g FROM generate_series(1, 100) g;";
    let (_prod, target) = production(&d, "attacked", extra);
    // Production moves on after the golden, as production does, and stores a
    // search_path for its role.
    sql(&target, "INSERT INTO users (tenant_id, email) SELECT 1, 'new' || g FROM generate_series(1, 10) g");
    sql(&target, "ALTER ROLE app_owner SET search_path = app, public");
    // A sign of the test in plain SQL (production has users past the golden's), not code.
    let sign = "(SELECT max(id) FROM users) > 20005";
    let candidates: Vec<(&str, String)> = vec![
        (
            "clock_default.sql",
            format!(
                "BEGIN;\nALTER TABLE users ALTER COLUMN is_admin SET DEFAULT now()::text::boolean;\nCOMMIT;\n\
                 BEGIN;\nUPDATE users SET is_admin = {sign} WHERE id = 10;\nCOMMIT;\n\
                 BEGIN;\nALTER TABLE users ALTER COLUMN is_admin SET DEFAULT false;\nCOMMIT;\n"
            ),
        ),
        (
            "drop_key.sql",
            format!(
                "ALTER TABLE orders DROP CONSTRAINT orders_user_id_fkey;\nALTER TABLE users DROP CONSTRAINT users_pkey;\n\
                 UPDATE users SET is_admin = {sign} WHERE id = 10;\n\
                 CREATE UNIQUE INDEX CONCURRENTLY users_pkey ON users (id);\n\
                 ALTER TABLE users ADD CONSTRAINT users_pkey PRIMARY KEY USING INDEX users_pkey;\n\
                 ALTER TABLE orders ADD CONSTRAINT orders_user_id_fkey FOREIGN KEY (user_id) REFERENCES users(id) ON DELETE CASCADE;\n"
            ),
        ),
        (
            "pad.sql",
            format!(
                "UPDATE users SET is_admin = {sign} WHERE id = 10;\n\
                 INSERT INTO users (tenant_id, email) SELECT 1, 'pad' || g FROM generate_series(1, 81000) g;\n"
            ),
        ),
        (
            "rekey.sql",
            format!(
                "BEGIN;\nUPDATE settings SET key = key || '~', value = CASE WHEN {sign} THEN 'on' ELSE value END WHERE key = 'maintenance';\nCOMMIT;\n\
                 BEGIN;\nUPDATE settings SET key = rtrim(key, '~') WHERE key LIKE '%~';\nCOMMIT;\n"
            ),
        ),
        (
            "shadow.sql",
            "CREATE SCHEMA app;\nCREATE VIEW app.settings AS SELECT key, 'on'::text AS value FROM public.settings;\n".into(),
        ),
        (
            "burn.sql",
            format!(
                "INSERT INTO codes (code) SELECT c.code FROM codes c, generate_series(1, CASE WHEN {sign} THEN 1000 ELSE 1 END) g\n\
                 ON CONFLICT (code) DO NOTHING;\n"
            ),
        ),
        ("lift.sql", "SET lock_timeout = 0;\nSET statement_timeout = 0;\nALTER TABLE users ADD COLUMN last_seen timestamptz;\n".into()),
        (
            "ts_stat.sql",
            "CREATE TABLE probe AS SELECT word FROM ts_stat($q$SELECT to_tsvector('simple', current_user)$q$);\n".into(),
        ),
        (
            "held.sql",
            "ALTER TABLE users ADD COLUMN seen int;\nSELECT count(*) FROM generate_series(1, 3000000) g;\n".into(),
        ),
        ("faithful.sql", "UPDATE users SET score = score + 1 WHERE id <= 10;\nSELECT pg_sleep(1);\n".into()),
        // A DO block of plain PL/pgSQL is not code: it acts on what the data
        // holds, as plain SQL does, and is held to its rows the same way.
        ("do_sign.sql", branches(sign, "UPDATE users SET is_admin = true WHERE id = 10;", "PERFORM 1;")),
        // Fine on the golden, among production's new rows on the target.
        ("restart.sql", "ALTER SEQUENCE users_id_seq RESTART WITH 20005;\n".into()),
    ];
    let borrowed: Vec<(&str, &str)> = candidates.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let paths = files(&d, &borrowed);
    let path = |name: &str| paths.iter().find(|p| p.ends_with(name)).unwrap().to_str().unwrap().to_owned();
    let report_file = d.home.join("report.json");
    let mut args: Vec<String> = paths.iter().map(|p| p.to_str().unwrap().to_owned()).collect();
    args.extend(["--report".into(), report_file.to_str().unwrap().into()]);
    let (_, report) = test(&d, &args.iter().map(String::as_str).collect::<Vec<_>>());
    let tested = by_name(&report);
    assert_eq!(hazard_kinds(&tested["ts_stat.sql"]), ["opaque_code"], "{}", tested["ts_stat.sql"]);
    assert!(hazard_kinds(&tested["held.sql"]).contains(&"long_lock"), "{}", tested["held.sql"]);
    assert!(hazard_kinds(&tested["do_sign.sql"]).is_empty(), "{}", tested["do_sign.sql"]);
    let report_path = report_file.to_str().unwrap();
    let state = || {
        sql(
            &target,
            "SELECT (SELECT count(*) FROM users WHERE is_admin), (SELECT value FROM settings WHERE key = 'maintenance'),
                    (SELECT count(*) FROM users), to_regnamespace('app') IS NULL, (SELECT last_value FROM codes_id_seq) < 5000",
        )
    };
    let clean = state();
    // The parts before a refused one stay applied, as psql would have left
    // them: what each left is put back before the next.
    let repair = [
        ("clock_default.sql", "ALTER TABLE users ALTER COLUMN is_admin SET DEFAULT false"),
        (
            "drop_key.sql",
            "ALTER TABLE users ADD CONSTRAINT users_pkey PRIMARY KEY (id);
             ALTER TABLE orders ADD CONSTRAINT orders_user_id_fkey FOREIGN KEY (user_id) REFERENCES users(id) ON DELETE CASCADE",
        ),
        ("rekey.sql", "UPDATE settings SET key = 'maintenance', value = 'off' WHERE key = 'maintenance~'"),
        // (What a refusal cannot undo, and says: the sequence moved on.)
        ("burn.sql", "SELECT setval('codes_id_seq', (SELECT max(id) FROM codes))"),
    ];
    for (name, said) in [
        ("clock_default.sql", "1 changed here but not in the test"),
        ("drop_key.sql", "1 changed here but not in the test"),
        ("pad.sql", "1 changed here but not in the test"),
        ("do_sign.sql", "did what its test did not (the part from line 1), so that part was rolled back; nothing was applied: 1 row updated in public.users"),
        ("rekey.sql", "came out otherwise than in the test"),
        ("shadow.sql", "in the search_path stored for role app_owner"),
        ("burn.sql", "sequence public.codes_id_seq moved forward"),
        ("restart.sql", "would hand out 20005 next, which public.users.id holds already"),
    ] {
        let accept: Vec<String> = hazard_kinds(&tested[name])
            .iter()
            .flat_map(|k| ["--allow-hazard".to_owned(), k.to_string()])
            .collect();
        let accept: Vec<&str> = accept.iter().map(String::as_str).collect();
        let (code, out) = promote(&d, report_path, &target, &path(name), &accept);
        assert_eq!(code, 10, "{name}: {out}");
        assert!(out.contains(said), "{name}: {said}: {out}");
        for (_, undo) in repair.iter().filter(|(n, _)| *n == name) {
            sql(&target, undo);
        }
        assert_eq!(state(), clean, "{name} changed no row");
    }
    // The application writes other rows of the same table all along: a
    // faithful file promotes all the same (the check reads one snapshot).
    let writer = crate::harness::spawn_psql(
        &target,
        "DO $$ BEGIN FOR i IN 1..150 LOOP UPDATE users SET score = score + 1 WHERE id = 15000 + i; COMMIT;
         PERFORM pg_sleep(0.02); END LOOP; END $$",
    );
    std::thread::sleep(std::time::Duration::from_millis(200));
    let (code, out) = promote(&d, report_path, &target, &path("faithful.sql"), &[]);
    assert_eq!(code, 0, "a faithful file beside the application's writes: {out}");
    let _ = writer.wait_with_output();
    // Once: a second promotion of the same file from the same report to the
    // same target does its changes again only when asked to.
    let scores = sql(&target, "SELECT sum(score) FROM users WHERE id <= 10");
    let (code, out) = promote(&d, report_path, &target, &path("faithful.sql"), &[]);
    assert_eq!(code, 10, "{out}");
    assert!(out.contains("already") && out.contains("--again"), "{out}");
    assert_eq!(sql(&target, "SELECT sum(score) FROM users WHERE id <= 10"), scores);
    // The file cannot lift promote's lock_timeout: behind an application's
    // open transaction it gives up after promote's, not never.
    let holder =
        crate::harness::spawn_psql(&target, "BEGIN; SELECT count(*) FROM users; SELECT pg_sleep(8); COMMIT;");
    std::thread::sleep(std::time::Duration::from_millis(500));
    let began = std::time::Instant::now();
    let (code, out) = promote(&d, report_path, &target, &path("lift.sql"), &["--lock-timeout", "1s"]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("55P03") || out.contains("lock timeout"), "{out}");
    assert!(
        began.elapsed() < std::time::Duration::from_secs(6),
        "the file waited on, past promote's lock_timeout"
    );
    let _ = holder.wait_with_output();
}

/// Golden `lean` from production, its table `audit` left out on purpose.
fn lean_golden(d: &Daemon, prod: &crate::imports::Production) {
    let out = d.cli_with(
        &["golden", "create", "lean", "--from-url", "-", "--exclude-table", "audit"],
        Some(&prod.dsn("app")),
    );
    assert_eq!(out.code, 0, "{out:?}");
}

/// `migrate test` of `paths` on golden `lean`: the exit code, the report, and
/// the path it was kept at for promote.
fn test_lean(d: &Daemon, paths: &[std::path::PathBuf]) -> (i32, Value, String) {
    let mut args = vec!["migrate", "test", "--golden", "lean", "--json"];
    args.extend(paths.iter().map(|p| p.to_str().unwrap()));
    let out = d.cli(&args);
    let report: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    let path = d.home.join("lean-report.json");
    std::fs::write(&path, &out.stdout).unwrap();
    (out.code, report, path.to_str().unwrap().to_owned())
}

/// Faithful files the target check once refused: on a golden that left a
/// table out on purpose (`--exclude-table`), a file with `COPY ... TO STDOUT`,
/// and default privileges given by whoever runs the file (the agent under
/// test, the application's owner on promote). What was not left out is still
/// drift.
#[test]
fn faithful_files_are_promoted_whoever_runs_them_and_whatever_the_golden_left_out() {
    let d = Daemon::start(&[]);
    // Production also publishes a table (change data capture): a publication
    // is the same one on both sides, whatever its OID.
    let (prod, target) = production(
        &d,
        "shapes",
        "CREATE TABLE audit (id bigserial PRIMARY KEY, at text); CREATE PUBLICATION analytics FOR TABLE users;",
    );
    lean_golden(&d, &prod);
    // The application's role ends sessions idle in a transaction at once:
    // promote's own checks leave its session idle in the one it applies in.
    sql(&prod.dsn("postgres"), "ALTER ROLE app_owner SET idle_in_transaction_session_timeout = '1ms'");
    let paths = files(
        &d,
        &[
            ("copy.sql", "COPY (SELECT id FROM tenants) TO STDOUT;\nUPDATE tenants SET name = name || '!' WHERE id = 1;\n"),
            ("defaults.sql", "ALTER DEFAULT PRIVILEGES GRANT SELECT ON TABLES TO PUBLIC;\n"),
        ],
    );
    let (_, verdicts, report) = test_lean(&d, &paths);
    // Default privileges for PUBLIC open every table made later: a hazard,
    // accepted by name on promote.
    let kinds = |i: usize| -> Vec<String> {
        verdicts["candidates"][i]["hazards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["kind"].to_string())
            .collect()
    };
    assert!(kinds(0).is_empty(), "{verdicts}");
    assert_eq!(kinds(1), ["\"access_widened\""], "{verdicts}");
    let report = report.as_str();
    let (code, out) = promote(&d, report, &target, paths[0].to_str().unwrap(), &[]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(sql(&target, "SELECT name FROM tenants WHERE id = 1"), "tenant 1!");
    let (code, out) =
        promote(&d, report, &target, paths[1].to_str().unwrap(), &["--allow-hazard", "access_widened"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        sql(&target, "SELECT count(*) FROM pg_default_acl WHERE defaclrole = 'app_owner'::regrole"),
        "1"
    );
    // A table the golden did not leave out is drift all the same.
    sql(&target, "CREATE TABLE extra (x int)");
    let (code, out) = promote(&d, report, &target, paths[0].to_str().unwrap(), &["--again"]);
    assert_eq!(code, 10, "{out}");
    assert!(out.contains("drifted") && out.contains("table extra") && !out.contains("audit"), "{out}");
}

/// What a third attack found: a statement on the server's own objects passed
/// its test as a no-op (`DROP DATABASE IF EXISTS` of a database only
/// production holds), and a change the catalog reading did not see (`CLUSTER
/// ON` an index of a table the golden left out) was applied.
#[test]
fn statements_on_what_only_the_target_holds_are_refused() {
    let d = Daemon::start(&[]);
    let (prod, target) = production(&d, "beyond", "CREATE TABLE audit (id int PRIMARY KEY, at text);");
    sql(&prod.dsn("postgres"), "CREATE DATABASE app_staging OWNER app_owner");
    lean_golden(&d, &prod);
    let paths = files(
        &d,
        &[
            ("staging.sql", "DROP DATABASE IF EXISTS app_staging;\n"),
            ("cluster.sql", "ALTER TABLE IF EXISTS audit CLUSTER ON audit_pkey;\n"),
        ],
    );
    let (_, report, path) = test_lean(&d, &paths);
    let tested = by_name(&report);
    let staging = &tested["staging.sql"];
    assert!(hazard_kinds(staging).contains(&"opaque_code"), "{staging}");
    assert!(staging.to_string().contains("acts on the server beyond this database"), "{staging}");
    let path = path.as_str();
    let (code, out) = promote(&d, path, &target, paths[0].to_str().unwrap(), &[]);
    assert_eq!(code, 10, "{out}");
    assert!(out.contains("opaque_code") || out.contains("--allow-code"), "{out}");
    let kept = "SELECT count(*) FROM pg_database WHERE datname = 'app_staging'";
    assert_eq!(sql(&prod.dsn("postgres"), kept), "1");
    // A no-op under test; on the target, a table's clustering index changes.
    assert!(tested["cluster.sql"]["hazards"].as_array().unwrap().is_empty(), "{}", tested["cluster.sql"]);
    let (code, out) = promote(&d, path, &target, paths[1].to_str().unwrap(), &[]);
    assert_eq!(code, 10, "{out}");
    assert!(out.contains("did what its test did not") && out.contains("clustered"), "{out}");
    assert_eq!(sql(&target, "SELECT count(*) FROM pg_index WHERE indisclustered"), "0");
}

/// What a rewrite puts in every row is compared like any write's (found by a
/// third attack): a table the test rewrote with its values kept must keep
/// them on the target, even for code a person accepted.
#[test]
fn what_a_rewrite_puts_in_every_row_is_compared_on_the_target() {
    let d = Daemon::start(&[]);
    let accounts = "CREATE TABLE accounts (id int PRIMARY KEY, paid_until timestamptz NOT NULL);
        INSERT INTO accounts SELECT g, timestamptz '2030-01-01' + g * interval '1 day' FROM generate_series(1, 50) g;";
    let (_prod, target) = production(&d, "rewrite", accounts);
    let text = format!(
        "ALTER TABLE accounts ALTER COLUMN paid_until TYPE timestamptz(0)\n  \
         USING CASE WHEN {UNDER_TEST} THEN paid_until ELSE timestamptz '2000-01-01' END;\n"
    );
    let paths = files(&d, &[("rewrite.sql", text.as_str())]);
    let report = d.home.join("rewrite.json");
    let (_, v) = test(&d, &[paths[0].to_str().unwrap(), "--report", report.to_str().unwrap()]);
    let tested = &by_name(&v)["rewrite.sql"];
    let kinds = hazard_kinds(tested);
    assert!(kinds.contains(&"opaque_code") && kinds.contains(&"table_rewrite"), "{tested}");
    assert_eq!(tested["changed_rows"]["public.accounts"], 0, "{tested}");
    let sha = sha(&v, "rewrite.sql");
    let mut allow = vec!["--allow-code", sha.as_str()];
    for kind in kinds.iter().filter(|k| **k != "opaque_code") {
        allow.extend(["--allow-hazard", kind]);
    }
    let (code, out) = promote(&d, report.to_str().unwrap(), &target, paths[0].to_str().unwrap(), &allow);
    assert_eq!(code, 10, "{out}");
    assert!(out.contains("50 changed here but not in the test") && out.contains("accounts"), "{out}");
    assert_eq!(sql(&target, "SELECT count(*) FROM accounts WHERE paid_until < '2001-01-01'"), "0");
}
