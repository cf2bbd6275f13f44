//! Goldens on other PostgreSQL majors than the host's: production sources on
//! 13 and 17 imported onto goldens of their own majors, forks of all six
//! majors (13 to 18) running at once, the in-server guard holding on each, a
//! migration tested on the major it will run on, and a TLS source dumped by
//! client tools without TLS. The majors come from `airlock postgres install 13
//! 14 16 17 18` (`make test` runs it), under AIRLOCK_PG_ROOT.

use std::path::PathBuf;

use crate::harness::{dsn, psql, sql, Daemon};
use crate::imports::{script, Production};

/// A major `airlock postgres install` put under the install root.
fn installed(major: u32) -> PathBuf {
    let root = std::env::var_os("AIRLOCK_PG_ROOT")
        .map_or_else(|| PathBuf::from("/opt/airlock/postgresql"), PathBuf::from);
    let bin = root.join(major.to_string()).join("server/native/bin");
    assert!(
        bin.join("postgres").exists(),
        "PostgreSQL {major} is not installed in {}: run `airlock postgres install 13 14 16 17 18` (make test does)",
        root.display()
    );
    bin
}

/// What production holds, in features every major from 13 has.
const PRODUCTION: &str = r#"
CREATE ROLE app_owner NOLOGIN;
CREATE ROLE app_rw NOLOGIN;
CREATE DATABASE prod OWNER app_owner;
\c prod
CREATE EXTENSION pg_trgm;
CREATE EXTENSION citext;
CREATE EXTENSION hstore;
CREATE SCHEMA app AUTHORIZATION app_owner;
SET ROLE app_owner;
CREATE TABLE app.customers (id bigserial PRIMARY KEY, email citext UNIQUE, region text NOT NULL, attrs hstore);
CREATE TABLE app.orders (
  id bigint GENERATED ALWAYS AS IDENTITY, customer_id bigint REFERENCES app.customers,
  total numeric(10,2), placed_at date NOT NULL, PRIMARY KEY (id, placed_at)
) PARTITION BY RANGE (placed_at);
CREATE TABLE app.orders_2025 PARTITION OF app.orders FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');
CREATE TABLE app.orders_2026 PARTITION OF app.orders FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
CREATE INDEX customers_email_trgm ON app.customers USING gin ((email::text) gin_trgm_ops);
CREATE TABLE app.audit_log (id serial PRIMARY KEY, line text);
CREATE FUNCTION app.touch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO app.audit_log (line) VALUES (TG_OP || ' ' || NEW.id); RETURN NEW; END $$;
CREATE TRIGGER customers_touch AFTER INSERT ON app.customers FOR EACH ROW EXECUTE FUNCTION app.touch();
INSERT INTO app.customers (email, region, attrs)
  SELECT 'user' || g || '@example.com', CASE WHEN g % 3 = 0 THEN 'eu' ELSE 'us' END, hstore('tier', (g % 4)::text)
  FROM generate_series(1, 300) g;
INSERT INTO app.orders (customer_id, total, placed_at)
  SELECT 1 + g % 300, g * 1.5, date '2025-06-01' + (g % 400) FROM generate_series(1, 1000) g;
CREATE SEQUENCE app.invoice_no START 1000;
SELECT setval('app.invoice_no', 1234);
CREATE MATERIALIZED VIEW app.revenue AS SELECT customer_id, sum(total) AS revenue FROM app.orders GROUP BY 1;
COMMENT ON TABLE app.customers IS 'people who buy';
SELECT lo_from_bytea(0, 'a large object');
ALTER TABLE app.customers ENABLE ROW LEVEL SECURITY;
CREATE POLICY eu_only ON app.customers FOR SELECT TO app_rw USING (region = 'eu');
GRANT USAGE ON SCHEMA app TO app_rw;
GRANT SELECT ON app.customers TO app_rw;
RESET ROLE;
"#;

#[test]
fn sources_of_13_and_17_import_onto_their_majors_and_forks_of_six_majors_run_at_once() {
    let sources: Vec<(u32, Production)> =
        [13, 17].into_iter().map(|m| (m, Production::start_on(&format!("major{m}"), installed(m)))).collect();
    for major in [14, 16, 18] {
        installed(major);
    }
    for (_, prod) in &sources {
        script(&prod.dsn("postgres"), PRODUCTION);
    }
    let d = Daemon::start(&[]);
    let listed = d.json(&["postgres", "ls"]);
    let majors: Vec<u64> = listed.as_array().unwrap().iter().map(|m| m["major"].as_u64().unwrap()).collect();
    for m in 13..=18 {
        assert!(majors.contains(&m), "{listed}");
    }

    // Each source's major is detected and becomes its golden's.
    for (major, prod) in &sources {
        let name = format!("prod{major}");
        let out =
            d.cli_with(&["golden", "create", &name, "--from-url", "-", "--json"], Some(&prod.dsn("prod")));
        assert_eq!(out.code, 0, "{out:?}\n{}", d.log());
        let g: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        let m = &g["generations"][0];
        assert_eq!(m["postgres_major"], *major, "{m}");
        let report = &m["import"];
        assert_eq!(report["compared"], true, "{report}");
        assert!(
            report.get("catalog_differences").is_none() && report.get("row_differences").is_none(),
            "{report}"
        );
        assert!(report.get("major_note").is_none(), "same major, nothing to note: {report}");
        assert_eq!(report["rows"], 300 + 1000 + 300, "{report}");
    }
    // Files build on the host's own major unless another is asked for.
    let schema = d.home.join("s.sql");
    std::fs::write(&schema, "CREATE TABLE t (id int PRIMARY KEY);").unwrap();
    let schema = schema.to_str().unwrap();
    let g15 = d.json(&["golden", "create", "files15", "--schema", schema]);
    assert_eq!(g15["generations"][0]["postgres_major"], 15, "{g15}");
    for major in ["14", "16", "18"] {
        let g =
            d.json(&["golden", "create", &format!("files{major}"), "--schema", schema, "--postgres", major]);
        assert_eq!(g["generations"][0]["postgres_major"].to_string(), major, "{g}");
    }

    // Forks of all six majors at once, each on its golden's major, each with the guard.
    let goldens =
        [("prod13", 13), ("files14", 14), ("files15", 15), ("files16", 16), ("prod17", 17), ("files18", 18)];
    let forks: Vec<(u32, String)> =
        goldens.into_iter().map(|(golden, major)| (major, dsn(&d.fork(golden, &[])))).collect();
    for (major, agent) in &forks {
        let version: u32 = sql(agent, "SHOW server_version_num").parse().unwrap();
        assert_eq!(version / 10000, *major, "{agent}");
        // A plaintext client is handed to its server on every major.
        let plain = format!("{}?sslmode=disable", agent.split('?').next().unwrap());
        assert_eq!(sql(&plain, "SHOW airlock.handoff"), "on", "the hand-off on {major}");
        assert_eq!(
            sql(&plain, "SELECT count(*) FROM pg_roles WHERE rolsuper AND rolname = current_user"),
            "0"
        );
        let refused = psql(agent, "ALTER ROLE CURRENT_USER SET work_mem = '1MB'").unwrap_err();
        assert!(refused.contains("in an Airlock sandbox"), "the guard holds on {major}: {refused}");
        assert!(
            psql(agent, "CREATE EXTENSION plpython3u").is_err(),
            "untrusted extensions stay refused on {major}"
        );
        // An owner's database of its own, template1 copied into place on each major.
        sql(agent, "CREATE DATABASE scratch");
        sql(agent, "DROP DATABASE scratch");
        let refused = psql(agent, "DROP DATABASE app").unwrap_err();
        assert!(refused.contains("permission denied to drop database"), "{major}: {refused}");
    }
    for (major, agent) in forks.iter().filter(|(m, _)| [13, 17].contains(m)) {
        assert_eq!(
            sql(
                agent,
                "SELECT count(*) FROM app.customers WHERE email::text % 'user12@example.com' AND id = 12"
            ),
            "1",
            "trigram on {major}"
        );
        assert_eq!(sql(agent, "SELECT count(*) FROM app.customers"), "300");
        assert_eq!(
            sql(agent, "SET ROLE app_rw; SELECT count(*) FROM app.customers"),
            "100",
            "RLS on {major}"
        );
        assert_eq!(sql(agent, "SELECT nextval('app.invoice_no')"), "1235");
        assert_eq!(
            sql(agent, "SELECT convert_from(lo_get(oid), 'UTF8') FROM pg_largeobject_metadata"),
            "a large object"
        );
        assert_eq!(sql(agent, "SELECT tableowner FROM pg_tables WHERE tablename = 'customers'"), "app_owner");
        sql(agent, "INSERT INTO app.customers (email, region) VALUES ('new@example.com', 'eu')");
        assert_eq!(sql(agent, "SELECT line FROM app.audit_log ORDER BY id DESC LIMIT 1"), "INSERT 301");
        assert!(psql(agent, "ALTER ROLE app_rw LOGIN PASSWORD 'x'").is_err());
    }
    // A read-only fork of 13, which has no pg_read_all_data.
    let readonly = dsn(&d.fork("prod13", &["--mode", "readonly"]));
    assert_eq!(sql(&readonly, "SELECT count(*) FROM app.orders"), "1000");
    let refused = psql(&readonly, "DELETE FROM app.audit_log").unwrap_err();
    assert!(refused.contains("read-only"), "{refused}");

    // A migration is tested on the major it will run on: MERGE ... RETURNING is
    // PostgreSQL 17's, so it passes on the 17 golden and fails on the 13 one.
    let file = d.home.join("tier.sql");
    std::fs::write(
        &file,
        "ALTER TABLE app.customers ADD COLUMN tier text;\n\
         MERGE INTO app.customers c USING (SELECT 1 AS id) s ON c.id = s.id\n\
           WHEN MATCHED THEN UPDATE SET tier = 'gold' RETURNING c.id;\n",
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let on17 = d.cli(&["migrate", "test", "--golden", "prod17", "--json", file]);
    let report: serde_json::Value = serde_json::from_str(&on17.stdout).unwrap();
    // It writes a table whose triggers run the source's code: opaque, and
    // nothing else (it runs on 17).
    let kinds: Vec<&str> = report["candidates"][0]["hazards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["opaque_code"], "{report}");
    let on13 = d.cli(&["migrate", "test", "--golden", "prod13", "--json", file]);
    let report: serde_json::Value = serde_json::from_str(&on13.stdout).unwrap();
    assert_eq!(report["passed"], false, "{report}");
    assert!(report.to_string().contains("syntax error"), "{report}");
}

#[test]
fn a_tls_source_on_a_newer_major_is_dumped_through_airlocks_own_tls() {
    // PostgreSQL 18's client tools from PyPI have no TLS: the dump of a source
    // that accepts nothing but TLS goes through Airlock's tunnel.
    // The source serves a certificate of the daemon's own CA (any CA would do).
    let d = Daemon::start(&[]);
    let certs = PathBuf::from(format!("/tmp/airlock-tls-{}", std::process::id()));
    std::fs::create_dir_all(&certs).unwrap();
    let (cert, key) = (certs.join("server.crt"), certs.join("server.key"));
    std::fs::copy(d.home.join("tls/server.crt"), &cert).unwrap();
    std::fs::copy(d.home.join("tls/server.key"), &key).unwrap();
    for f in [&cert, &key] {
        std::os::unix::fs::chown(f, Some(65534), Some(65534)).unwrap();
    }
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let ca = d.home.join("tls/ca.crt");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let options = format!(
        "-c ssl=on -c ssl_cert_file={} -c ssl_key_file={} -c listen_addresses=127.0.0.1",
        cert.display(),
        key.display()
    );
    let prod = Production::start_with("tls17", installed(17), port, &options);
    script(&prod.dsn("postgres"), PRODUCTION);
    // Over TCP, TLS or nothing.
    std::fs::write(
        prod.dir.join("data/pg_hba.conf"),
        "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostnossl all all 127.0.0.1/32 reject\n",
    )
    .unwrap();
    sql(&prod.dsn("postgres"), "SELECT pg_reload_conf()");
    let plain = format!("postgresql://postgres@localhost:{port}/prod?sslmode=disable");
    assert!(psql(&plain, "SELECT 1").unwrap_err().contains("no encryption"), "plaintext is refused");

    let source = format!(
        "postgresql://postgres@localhost:{port}/prod?sslmode=verify-full&sslrootcert={}",
        ca.display()
    );
    let out = d.cli_with(&["golden", "create", "tls17", "--from-url", "-", "--json"], Some(&source));
    assert_eq!(out.code, 0, "{out:?}\n{}", d.log());
    let g: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let report = &g["generations"][0]["import"];
    assert_eq!(g["generations"][0]["postgres_major"], 17, "{g}");
    assert!(
        report.get("catalog_differences").is_none() && report.get("row_differences").is_none(),
        "{report}"
    );
    assert_eq!(report["rows"], 300 + 1000 + 300, "{report}");
    assert_eq!(sql(&dsn(&d.fork("tls17", &[])), "SELECT count(*) FROM app.orders"), "1000");
    assert!(
        !d.home.join("volume/imports/tls17").exists(),
        "the dump and its tunnel are gone after the build"
    );

    // A certificate that does not verify stops the import before anything is copied.
    let wrong = format!("postgresql://postgres@localhost:{port}/prod?sslmode=verify-full");
    let (code, err) = d.fails(&["golden", "create", "wrong", "--from-url", &wrong]);
    assert_eq!(
        (code, err["code"].as_str()),
        (7, Some("source_failed")),
        "not signed by the system's CAs: {err}"
    );
    assert!(!d.home.join("volume/imports/wrong/dump").exists(), "{err}");
    drop(prod);
    let _ = std::fs::remove_dir_all(&certs);
}

#[test]
fn majors_that_are_missing_or_not_installable_fail_with_what_to_do() {
    let d = Daemon::start(&[]);
    let schema = d.home.join("s.sql");
    std::fs::write(&schema, "CREATE TABLE t (id int);").unwrap();
    let schema = schema.to_str().unwrap();
    let (code, err) = d.fails(&["golden", "create", "old", "--schema", schema, "--postgres", "12"]);
    assert_eq!((code, err["code"].as_str()), (3, Some("invalid_request")), "{err}");
    // An installed major has PostgreSQL's own extensions only: a dump that needs
    // PostGIS is pointed at the host's PostgreSQL, whose packages have it.
    let prod = Production::start("postgis-for-17");
    script(
        &prod.dsn("postgres"),
        "CREATE DATABASE geo;\n\\c geo\nCREATE EXTENSION postgis;\nCREATE TABLE t (g geometry);",
    );
    let file = d.home.join("geo.dump");
    let dumped = std::process::Command::new("pg_dump")
        .args(["--format=custom", "--file"])
        .arg(&file)
        .arg(prod.dsn("geo"))
        .status();
    assert!(dumped.unwrap().success());
    let (code, err) =
        d.fails(&["golden", "create", "geo", "--from-dump", file.to_str().unwrap(), "--postgres", "17"]);
    assert_eq!((code, err["code"].as_str()), (7, Some("extension_missing")), "{err}");
    let listed = d.json(&["postgres", "ls"]);
    let host = listed.as_array().unwrap().iter().find(|m| m["default"] == true).unwrap()["major"].clone();
    assert!(err["hint"].as_str().unwrap().contains(&format!("--postgres {host}")), "{err}");

    // The same from a live source: the dump is kept for the next attempt, and
    // goes once it has been kept longer than --import-keep.
    let brief = Daemon::start(&["--import-keep", "2s"]);
    let (code, err) =
        brief.fails(&["golden", "create", "geo", "--from-url", &prod.dsn("geo"), "--postgres", "17"]);
    assert_eq!((code, err["code"].as_str()), (7, Some("extension_missing")), "{err}");
    let kept = brief.home.join("volume/imports/geo");
    assert!(kept.join("complete").exists(), "kept for a retry");
    brief.wait_for(std::time::Duration::from_secs(20), "the kept dump to expire", || !kept.exists());

    // A major not installed under this daemon's install root.
    let bare = Daemon::start(&["--pg-root", "/nonexistent-airlock-majors"]);
    let (code, err) = bare.fails(&["golden", "create", "g17", "--schema", schema, "--postgres", "17"]);
    assert_eq!((code, err["code"].as_str()), (7, Some("postgres_missing")), "{err}");
    assert!(err["hint"].as_str().unwrap().contains("airlock postgres install 17"), "{err}");
    assert!(bare.json(&["golden", "ls"]).as_array().unwrap().is_empty(), "nothing half-made");
    // A major Airlock does not run on is refused before anything is fetched.
    let (code, err) = d.fails(&["postgres", "install", "12"]);
    assert_eq!((code, err["code"].as_str()), (3, Some("invalid_request")), "{err}");
    assert!(err["hint"].as_str().unwrap().contains("13"), "{err}");
}

/// Protocol 3.2 end to end on a PostgreSQL 18 sandbox: the client asking for
/// it gets no negotiation, the server's long cancel key reaches it whole, and a
/// cancel request carrying that key through the router ends the statement,
/// where the same key with its last byte changed, or cut to its first four
/// bytes, cancels nothing. A 3.0 client of the same sandbox keeps its 4-byte
/// key, and a 15 sandbox negotiates a 3.2 client down to 3.0.
#[test]
fn protocol_3_2_runs_end_to_end_on_an_18_sandbox_and_is_negotiated_down_on_15() {
    use crate::harness::split_password;
    use crate::wire::{startup_packet, Raw};
    installed(18);
    let d = Daemon::start(&[]);
    let schema = d.home.join("s.sql");
    std::fs::write(&schema, "CREATE TABLE t (id int PRIMARY KEY);").unwrap();
    let schema = schema.to_str().unwrap();
    d.json(&["golden", "create", "g18", "--schema", schema, "--postgres", "18"]);
    d.json(&["golden", "create", "g15", "--schema", schema]);
    let connect = |golden: &str, version: i32| {
        let forked = d.fork(golden, &[]);
        let (_, password) = split_password(&dsn(&forked));
        let id = forked["id"].as_str().unwrap().to_owned();
        let packet = startup_packet(version, &[("user", "airlock_agent"), ("database", &id)]);
        (Raw::connect(&d.router, &packet, &password).unwrap(), dsn(&forked))
    };
    let sleeping = |agent: &str| {
        sql(
            agent,
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query = 'SELECT pg_sleep(60)'",
        )
    };
    let v3_2 = (3 << 16) | 2;

    let (mut s, agent) = connect("g18", v3_2);
    assert_eq!(s.negotiated, None, "3.2 is spoken, not negotiated");
    let key = s.backend_key.clone().expect("BackendKeyData");
    assert_eq!(key.len(), 4 + 32, "PostgreSQL 18's 32-byte key reaches the client whole");
    assert_eq!(s.query("SHOW server_version_num").unwrap()[0][0].as_deref().unwrap()[..2], *"18");
    let sleep_on = |s: &mut Raw, agent: &str| {
        s.send("SELECT pg_sleep(60)");
        while sleeping(agent) != "1" {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    sleep_on(&mut s, &agent);
    let mut altered = key[4..].to_vec();
    *altered.last_mut().unwrap() ^= 1;
    s.cancel(&d.router, Some(&altered));
    s.cancel(&d.router, Some(&key[4..8]));
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(sleeping(&agent), "1", "a key that is not the session's cancelled it");
    s.cancel(&d.router, None);
    let cancelled = s.results().unwrap_err();
    assert_eq!(cancelled.code, "57014", "{cancelled:?}");
    assert_eq!(s.query("SELECT 1").unwrap()[0][0].as_deref(), Some("1"), "the session goes on");

    // A 3.0 client of an 18 sandbox: 3.0, with a 4-byte key that cancels.
    let (mut s, agent) = connect("g18", 3 << 16);
    assert_eq!((s.negotiated.clone(), s.backend_key.clone().unwrap().len()), (None, 8));
    sleep_on(&mut s, &agent);
    s.cancel(&d.router, None);
    assert_eq!(s.results().unwrap_err().code, "57014");

    // A 15 sandbox: the 3.2 client is told 3.0 (a whole version number, no
    // options), and gets a 4-byte key that cancels.
    let (mut s, agent) = connect("g15", v3_2);
    assert_eq!(s.negotiated.as_deref(), Some(&[0, 3, 0, 0, 0, 0, 0, 0][..]));
    assert_eq!(s.backend_key.clone().unwrap().len(), 8);
    sleep_on(&mut s, &agent);
    s.cancel(&d.router, None);
    assert_eq!(s.results().unwrap_err().code, "57014");
}
