//! Goldens from a real database: a "production" PostgreSQL of the test's own
//! with PostGIS, trigram and other extensions, schemas, roles that own objects,
//! grants, row security policies, partitions, a materialized view, large
//! objects, comments, triggers, a sequence mid-way and an event trigger,
//! imported with `--from-url` and checked object by object and row by row.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::harness::{dsn, psql, sql, Daemon};

/// `nobody`: PostgreSQL refuses to run as root.
const NOBODY: u32 = 65534;

/// A PostgreSQL server standing in for production, on a private socket.
pub(crate) struct Production {
    pub(crate) dir: PathBuf,
    bin: PathBuf,
    port: u16,
}

impl Production {
    pub(crate) fn start(name: &str) -> Production {
        Production::start_on(name, newest_postgres_bin())
    }

    /// A server of the binaries in `bin` (another major's, say).
    pub(crate) fn start_on(name: &str, bin: PathBuf) -> Production {
        Production::start_with(name, bin, 5432, "")
    }

    /// A server of `bin` on `port`, with `options` for `postgres` besides.
    pub(crate) fn start_with(name: &str, bin: PathBuf, port: u16, options: &str) -> Production {
        let dir = PathBuf::from(format!("/tmp/airlock-prod-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).unwrap();
        let p = Production { dir, bin, port };
        p.run_as_nobody(
            "initdb",
            &["-D", "data", "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C"],
        );
        let socket = p.dir.display().to_string();
        let settings = format!("-k {socket} -c listen_addresses= -c port={port} {options}");
        let start = ["-D", "data", "-l", "log", "-w", "-o", settings.as_str(), "start"];
        // This stand-in is the test's, not Airlock's: a start that fails
        // (once, under a full suite's load, for a cause its log would have
        // told) is tried once more, its log shown either way.
        if let Err(first) = p.try_as_nobody("pg_ctl", &start) {
            let log = std::fs::read_to_string(p.dir.join("log")).unwrap_or_default();
            eprintln!("the stand-in production server did not start ({first}); its log:\n{log}");
            if let Err(again) = p.try_as_nobody("pg_ctl", &start) {
                let log = std::fs::read_to_string(p.dir.join("log")).unwrap_or_default();
                panic!("the stand-in production server did not start twice ({again}); its log:\n{log}");
            }
        }
        p
    }

    fn run_as_nobody(&self, tool: &str, args: &[&str]) {
        if let Err(e) = self.try_as_nobody(tool, args) {
            panic!("{e}");
        }
    }

    fn try_as_nobody(&self, tool: &str, args: &[&str]) -> Result<(), String> {
        let out = Command::new(self.bin.join(tool))
            .args(args)
            .current_dir(&self.dir)
            .uid(NOBODY)
            .gid(NOBODY)
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        match out.status.success() {
            true => Ok(()),
            false => Err(format!("{tool} failed: {}", String::from_utf8_lossy(&out.stderr))),
        }
    }

    /// The DSN of database `db` as the bootstrap superuser (trusted on the private socket).
    pub(crate) fn dsn(&self, db: &str) -> String {
        format!("postgresql://postgres@/{db}?host={}&port={}", self.dir.display(), self.port)
    }
}

impl Drop for Production {
    fn drop(&mut self) {
        let _ = Command::new(self.bin.join("pg_ctl"))
            .args(["-D", "data", "-m", "immediate", "stop"])
            .current_dir(&self.dir)
            .uid(NOBODY)
            .gid(NOBODY)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(crate) fn newest_postgres_bin() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .unwrap()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, b): &(u32, PathBuf)| b.join("postgres").exists())
        .collect();
    found.sort();
    found.pop().expect("a PostgreSQL server is installed").1
}

/// Runs a script with psql as the source's superuser.
pub(crate) fn script(dsn: &str, sql: &str) {
    let out = Command::new("psql")
        .arg(dsn)
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(sql.as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

const PRODUCTION: &str = r#"
CREATE ROLE app_owner NOLOGIN;
CREATE ROLE app_rw NOLOGIN;
CREATE ROLE app_ro NOLOGIN;
CREATE ROLE reporting NOLOGIN IN ROLE app_ro;
CREATE ROLE legacy_super SUPERUSER NOLOGIN;
GRANT pg_read_server_files TO app_rw;
CREATE DATABASE prod OWNER app_owner;
\c prod
CREATE EXTENSION postgis;
CREATE EXTENSION pg_trgm;
CREATE EXTENSION citext;
CREATE EXTENSION hstore;
CREATE SCHEMA app AUTHORIZATION app_owner;
CREATE SCHEMA reporting AUTHORIZATION app_owner;
SET ROLE app_owner;
CREATE TABLE app.customers (
  id bigserial PRIMARY KEY, email citext UNIQUE, region text NOT NULL, attrs hstore,
  home geometry(Point, 4326));
CREATE TABLE app.orders (
  id bigint GENERATED ALWAYS AS IDENTITY, customer_id bigint REFERENCES app.customers,
  region text, total numeric(10,2), placed_at date NOT NULL, PRIMARY KEY (id, placed_at)
) PARTITION BY RANGE (placed_at);
CREATE TABLE app.orders_2025 PARTITION OF app.orders FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');
CREATE TABLE app.orders_2026 PARTITION OF app.orders FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
CREATE TABLE app.audit_log (id serial PRIMARY KEY, line text);
CREATE INDEX customers_email_trgm ON app.customers USING gin ((email::text) gin_trgm_ops);
CREATE INDEX customers_home ON app.customers USING gist (home);
CREATE FUNCTION app.touch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO app.audit_log (line) VALUES (TG_OP || ' ' || NEW.id); RETURN NEW; END $$;
CREATE TRIGGER customers_touch AFTER INSERT ON app.customers FOR EACH ROW EXECUTE FUNCTION app.touch();
INSERT INTO app.customers (email, region, attrs, home)
  SELECT 'user' || g || '@example.com', CASE WHEN g % 3 = 0 THEN 'eu' ELSE 'us' END,
         hstore('tier', (g % 4)::text), ST_SetSRID(ST_MakePoint(g % 180, g % 90), 4326)
  FROM generate_series(1, 300) g;
INSERT INTO app.orders (customer_id, region, total, placed_at)
  SELECT 1 + g % 300, CASE WHEN g % 3 = 0 THEN 'eu' ELSE 'us' END, g * 1.5, date '2025-06-01' + (g % 400)
  FROM generate_series(1, 1000) g;
CREATE SEQUENCE app.invoice_no START 1000;
SELECT setval('app.invoice_no', 1234);
CREATE MATERIALIZED VIEW reporting.revenue_by_region AS
  SELECT region, sum(total) AS revenue FROM app.orders GROUP BY region;
COMMENT ON TABLE app.customers IS 'people who buy';
SELECT lo_from_bytea(0, 'a large object');
ALTER TABLE app.customers ENABLE ROW LEVEL SECURITY;
CREATE POLICY eu_only ON app.customers FOR SELECT TO app_rw USING (region = 'eu');
GRANT USAGE ON SCHEMA app TO app_rw, app_ro;
GRANT SELECT, INSERT ON app.customers TO app_rw;
GRANT SELECT ON ALL TABLES IN SCHEMA app TO app_ro;
GRANT USAGE ON SCHEMA reporting TO reporting;
GRANT SELECT ON reporting.revenue_by_region TO reporting;
RESET ROLE;
GRANT SELECT ON app.audit_log TO legacy_super;
CREATE FUNCTION public.ddl_note() RETURNS event_trigger LANGUAGE plpgsql AS $$ BEGIN RAISE NOTICE 'ddl'; END $$;
ALTER FUNCTION public.ddl_note() OWNER TO app_owner;
CREATE EVENT TRIGGER note_ddl ON ddl_command_end EXECUTE FUNCTION public.ddl_note();
"#;

#[test]
fn a_production_database_imports_with_its_extensions_roles_policies_and_rows() {
    let prod = Production::start("full");
    script(&prod.dsn("postgres"), PRODUCTION);
    let d = Daemon::start(&[]);
    assert!(
        d.json(&["doctor"])["extensions"].as_array().unwrap().iter().any(|e| e == "postgis"),
        "doctor lists the extensions available"
    );
    // (No password in this DSN, so it may sit on the command line.) While the
    // build runs, its progress names each phase.
    let source = prod.dsn("prod");
    let child = d.spawn_cli_output(&["golden", "create", "prod", "--from-url", &source, "--json"]);
    let mut phases = std::collections::BTreeSet::new();
    let pid = child.id() as i32;
    while std::path::Path::new(&format!("/proc/{pid}/stat")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z ")
    {
        let (status, body) = d.api("GET", "/v1/goldens/prod/progress", "");
        if status == 200 {
            let p: serde_json::Value = serde_json::from_str(&body).unwrap();
            phases.insert(p["phase"].as_str().unwrap().to_owned());
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    assert!(phases.contains("restoring data") || phases.contains("indexing and granting"), "{phases:?}");
    assert_eq!(d.api("GET", "/v1/goldens/prod/progress", "").0, 404, "no progress once it is built");
    let g: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let report = &g["generations"][0]["import"];
    assert_eq!(report["compared"], true, "{report}");
    assert!(
        report.get("catalog_differences").is_none() && report.get("row_differences").is_none(),
        "{report}"
    );
    assert_eq!(report["rows"], 300 + 1000 + 300, "customers, orders and the trigger's audit rows: {report}");
    let roles: Vec<&str> =
        report["imported"]["roles"].as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect();
    for role in ["app_owner", "app_rw", "app_ro", "reporting", "legacy_super"] {
        assert!(roles.contains(&role), "{role} created: {report}");
    }
    let not_carried = report["imported"]["not_carried"].to_string();
    assert!(not_carried.contains("legacy_super is a superuser"), "{not_carried}");
    assert!(not_carried.contains("pg_read_server_files"), "{not_carried}");
    assert!(not_carried.contains("event trigger note_ddl"), "{not_carried}");
    let extensions = report["imported"]["extensions"].to_string();
    for ext in ["postgis", "pg_trgm", "citext", "hstore"] {
        assert!(extensions.contains(ext), "{extensions}");
    }
    assert!(d.ok(&["golden", "show", "prod"]).contains("catalog and row counts match the source"));

    let sb = d.fork("prod", &[]);
    let agent = dsn(&sb);
    // PostGIS and trigram queries answer as the application's would.
    assert_eq!(sql(&agent, "SELECT ST_AsText(home) FROM app.customers WHERE id = 3"), "POINT(3 3)");
    assert_eq!(
        sql(
            &agent,
            "SELECT count(*) FROM app.customers WHERE email::text % 'user12@example.com' AND id = 12"
        ),
        "1"
    );
    assert_eq!(sql(&agent, "SELECT ST_DWithin(home, ST_SetSRID(ST_MakePoint(3, 3), 4326), 0.5) FROM app.customers WHERE id = 3"), "t");
    // The agent, as the owners' owner, sees every row; as the application's role, what the policy allows.
    assert_eq!(sql(&agent, "SELECT count(*) FROM app.customers"), "300");
    assert_eq!(sql(&agent, "SET ROLE app_rw; SELECT count(*) FROM app.customers"), "100");
    assert!(psql(&agent, "SET ROLE app_rw; SELECT count(*) FROM app.orders")
        .unwrap_err()
        .contains("permission denied"));
    assert_eq!(sql(&agent, "SET ROLE reporting; SELECT count(*) FROM reporting.revenue_by_region"), "2");
    // Owners, sequences, comments, large objects, partitions and triggers as production has them.
    assert_eq!(sql(&agent, "SELECT tableowner FROM pg_tables WHERE tablename = 'customers'"), "app_owner");
    assert_eq!(sql(&agent, "SELECT nextval('app.invoice_no')"), "1235");
    assert_eq!(sql(&agent, "SELECT obj_description('app.customers'::regclass)"), "people who buy");
    assert_eq!(
        sql(&agent, "SELECT convert_from(lo_get(oid), 'UTF8') FROM pg_largeobject_metadata"),
        "a large object"
    );
    assert_eq!(
        sql(&agent, "SELECT count(*) FROM app.orders_2026"),
        sql(&source, "SELECT count(*) FROM app.orders_2026")
    );
    sql(&agent, "INSERT INTO app.customers (email, region) VALUES ('new@example.com', 'eu')");
    assert_eq!(sql(&agent, "SELECT line FROM app.audit_log ORDER BY id DESC LIMIT 1"), "INSERT 301");
    // The ceiling: imported roles are never superusers, never log in, never hold
    // predefined roles; no event trigger came along; untrusted extensions stay refused.
    assert_eq!(
        sql(&agent, "SELECT string_agg(rolname, ',' ORDER BY rolname) FROM pg_roles WHERE rolname LIKE 'app%' OR rolname = 'legacy_super' AND NOT rolsuper AND NOT rolcanlogin"),
        "app_owner,app_ro,app_rw,legacy_super"
    );
    assert_eq!(sql(&agent, "SELECT count(*) FROM pg_roles WHERE rolsuper"), "1", "the admin alone");
    assert_eq!(sql(&agent, "SELECT pg_has_role('app_rw', 'pg_read_server_files', 'MEMBER')"), "f");
    assert_eq!(sql(&agent, "SELECT count(*) FROM pg_event_trigger"), "0");
    assert!(psql(&agent, "SET ROLE legacy_super; SELECT pg_read_file('/etc/passwd')")
        .unwrap_err()
        .contains("permission denied"));
    assert!(psql(&agent, "CREATE EXTENSION postgis_topology").unwrap_err().contains("permission denied"));
    assert!(psql(&agent, "ALTER ROLE app_rw LOGIN PASSWORD 'x'").is_err());

    // A dump file of it imports the same way: roles from its DDL, extensions, policies.
    let file = d.home.join("prod.dump");
    let status = Command::new("pg_dump")
        .args(["--format=custom", "--file"])
        .arg(&file)
        .arg(prod.dsn("prod"))
        .status()
        .unwrap();
    assert!(status.success());
    let g = d.json(&["golden", "create", "fromdump", "--from-dump", file.to_str().unwrap()]);
    let report = &g["generations"][0]["import"];
    assert_eq!(report["compared"], false, "{report}");
    assert!(report.get("catalog_differences").is_none(), "every listed table is there: {report}");
    let from_dump = dsn(&d.fork("fromdump", &[]));
    assert_eq!(sql(&from_dump, "SET ROLE app_rw; SELECT count(*) FROM app.customers"), "100");
    assert_eq!(sql(&from_dump, "SELECT ST_AsText(home) FROM app.customers WHERE id = 3"), "POINT(3 3)");

    // Leaving a table out is asked for, so it is no difference.
    let out = d.cli_with(
        &["golden", "create", "lean", "--from-url", "-", "--exclude-table", "app.audit_log", "--json"],
        Some(&prod.dsn("prod")),
    );
    assert_eq!(out.code, 0, "{out:?}");
    let lean = d.fork("lean", &[]);
    assert_eq!(sql(&dsn(&lean), "SELECT to_regclass('app.audit_log') IS NULL"), "t");
}

#[test]
fn a_missing_extension_names_its_package_and_the_build_resumes_from_its_dump() {
    let prod = Production::start("missing");
    let share = String::from_utf8(
        Command::new(prod.bin.join("pg_config")).arg("--sharedir").output().unwrap().stdout,
    )
    .unwrap()
    .trim()
    .to_owned();
    let ext = Path::new(&share).join("extension");
    let name = format!("airlock_probe_{}", std::process::id());
    let files = [
        (
            ext.join(format!("{name}.control")),
            "default_version = '1.0'\nrelocatable = true\ntrusted = false\n".to_owned(),
        ),
        (
            ext.join(format!("{name}--1.0.sql")),
            "CREATE FUNCTION probe_answer() RETURNS int LANGUAGE sql AS 'SELECT 42';\n".to_owned(),
        ),
    ];
    let install = || files.iter().for_each(|(p, text)| std::fs::write(p, text).unwrap());
    let uninstall = || {
        files.iter().for_each(|(p, _)| {
            let _ = std::fs::remove_file(p);
        })
    };
    install();
    script(
        &prod.dsn("postgres"),
        &format!("CREATE DATABASE shop;\n\\c shop\nCREATE EXTENSION {name};\nCREATE TABLE t AS SELECT probe_answer() AS answer;\n"),
    );
    uninstall();
    let d = Daemon::start(&[]);
    let out = d.cli_with(&["golden", "create", "shop", "--from-url", "-", "--json"], Some(&prod.dsn("shop")));
    assert_eq!(out.code, 7, "{out:?}");
    let err: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(err["error"]["code"], "extension_missing", "{err}");
    assert!(err["error"]["message"].as_str().unwrap().contains(&name), "{err}");
    let package = format!("postgresql-{}-{}", newest_major(), name.replace('_', "-"));
    assert!(err["error"]["hint"].as_str().unwrap().contains(&package), "names the package: {err}");
    assert!(d.home.join("volume/imports/shop/complete").exists(), "the dump is kept for the next attempt");
    assert!(d.json(&["golden", "ls"]).as_array().unwrap().is_empty(), "no half-made golden");

    // With the extension installed, the build resumes from the kept dump.
    install();
    let out = d.cli_with(&["golden", "create", "shop", "--from-url", "-", "--json"], Some(&prod.dsn("shop")));
    uninstall();
    assert_eq!(out.code, 0, "{out:?}");
    let g: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(g["generations"][0]["import"]["resumed"], true, "{g}");
    assert!(!d.home.join("volume/imports/shop").exists(), "a finished build keeps no dump");
    assert_eq!(sql(&dsn(&d.fork("shop", &[])), "SELECT answer FROM t"), "42");
}

#[test]
fn a_source_without_a_password_gets_errors_that_read_as_written() {
    let prod = Production::start("nopass");
    let d = Daemon::start(&[]);
    let out =
        d.cli_with(&["golden", "create", "x", "--from-url", "-", "--json"], Some(&prod.dsn("nosuchdb")));
    assert_eq!(out.code, 7, "{out:?}");
    let err: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let message = err["error"]["message"].as_str().unwrap();
    assert!(message.contains("\"nosuchdb\" does not exist"), "{message}");
    assert!(!message.contains("***"), "nothing to redact, nothing redacted: {message}");
}

fn newest_major() -> String {
    newest_postgres_bin().parent().unwrap().file_name().unwrap().to_str().unwrap().to_owned()
}

/// A source whose objects were planted to reach a superuser while the golden is
/// built: the restore runs as the owner role, so nothing in it ever runs as one.
const HOSTILE: &str = r#"
CREATE ROLE app3 NOLOGIN;
CREATE DATABASE evil OWNER app3;
\c evil
CREATE EXTENSION postgis;
CREATE SCHEMA app AUTHORIZATION app3;
-- Runs wherever a row is checked: while restoring, as whoever restores.
CREATE FUNCTION app.pwn(v text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  BEGIN EXECUTE 'GRANT airlock_admin TO app3'; EXCEPTION WHEN OTHERS THEN NULL; END;
  BEGIN EXECUTE 'GRANT pg_execute_server_program TO app3'; EXCEPTION WHEN OTHERS THEN NULL; END;
  RETURN true;
END $$;
-- A body that only mentions an extension installs nothing.
CREATE FUNCTION app.quiet() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
CREATE EXTENSION IF NOT EXISTS dblink WITH SCHEMA app;
END $$;
ALTER FUNCTION app.pwn(text) OWNER TO app3;
ALTER FUNCTION app.quiet() OWNER TO app3;
CREATE TABLE public."spatial_ref_sys x" (v text CHECK (app.pwn(v)));
ALTER TABLE public."spatial_ref_sys x" OWNER TO app3;
INSERT INTO public."spatial_ref_sys x" VALUES ('row');
GRANT EXECUTE ON FUNCTION pg_catalog.pg_read_file(text) TO app3;
COMMENT ON TABLE public."spatial_ref_sys x" IS 'AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA';
"#;

#[test]
fn a_hostile_source_gets_no_superuser_power_in_its_golden() {
    let prod = Production::start("hostile");
    script(&prod.dsn("postgres"), HOSTILE);
    let d = Daemon::start(&[]);
    let out = d.cli_with(&["golden", "create", "evil", "--from-url", "-", "--json"], Some(&prod.dsn("evil")));
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout.contains("grant on pg_catalog FUNCTION pg_read_file"),
        "reported as not carried: {}",
        out.stdout
    );
    let agent = dsn(&d.fork("evil", &[]));
    // The check ran while restoring, as the owner role: it could grant nothing.
    assert_eq!(sql(&agent, "SELECT count(*) FROM public.\"spatial_ref_sys x\""), "1");
    assert_eq!(sql(&agent, "SELECT pg_has_role('app3', 'airlock_admin', 'MEMBER')"), "f");
    assert_eq!(sql(&agent, "SELECT pg_has_role('app3', 'pg_execute_server_program', 'MEMBER')"), "f");
    assert!(psql(&agent, "SET ROLE app3; SET ROLE airlock_admin").is_err());
    assert!(psql(&agent, "SET ROLE app3; SELECT pg_read_file('PG_VERSION')")
        .unwrap_err()
        .contains("permission denied"));
    assert_eq!(sql(&agent, "SELECT count(*) FROM pg_extension WHERE extname = 'dblink'"), "0");
    assert_eq!(sql(&agent, "SELECT proowner::regrole FROM pg_proc WHERE proname = 'pwn'"), "app3");

    // A dump file edited to carry a statement of its own runs it as the owner
    // role, which may grant nothing of the admin's: the build fails, or the
    // grant is not there.
    let file = d.home.join("evil.dump");
    let status = Command::new("pg_dump")
        .args(["--format=custom", "--file"])
        .arg(&file)
        .arg(prod.dsn("evil"))
        .status()
        .unwrap();
    assert!(status.success());
    let mut bytes = std::fs::read(&file).unwrap();
    let comment = b"COMMENT ON TABLE public.\"spatial_ref_sys x\" IS 'AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA';";
    let at = bytes.windows(comment.len()).position(|w| w == comment).expect("the comment is in the archive");
    let mut forged = b"GRANT airlock_admin TO app3; GRANT pg_execute_server_program TO app3; --".to_vec();
    forged.resize(comment.len(), b' ');
    bytes[at..at + comment.len()].copy_from_slice(&forged);
    std::fs::write(&file, &bytes).unwrap();
    let out = d.cli(&["golden", "create", "forged", "--from-dump", file.to_str().unwrap(), "--json"]);
    if out.code == 0 {
        let forged = dsn(&d.fork("forged", &[]));
        assert_eq!(sql(&forged, "SELECT pg_has_role('app3', 'airlock_admin', 'MEMBER')"), "f");
    } else {
        assert!(
            out.stdout.contains("must be superuser") || out.stdout.contains("permission denied"),
            "{out:?}"
        );
    }

    // What only a superuser may create cannot be imported at all.
    script(
        &prod.dsn("postgres"),
        "CREATE DATABASE shell;\n\\c shell\nCREATE EXTENSION file_fdw;\nCREATE SERVER fs FOREIGN DATA WRAPPER file_fdw;\n\
         CREATE FOREIGN TABLE cmd (line text) SERVER fs OPTIONS (program 'id');\n",
    );
    let out =
        d.cli_with(&["golden", "create", "shell", "--from-url", "-", "--json"], Some(&prod.dsn("shell")));
    assert_eq!(out.code, 7, "{out:?}");
    // file_fdw itself is left out (it reads the server's files); named, the
    // owner role still may not make a foreign table running a program.
    assert!(out.stdout.contains("--allow-extension"), "{out:?}");
    let out = d.cli_with(
        &["golden", "create", "shell", "--from-url", "-", "--allow-extension", "file_fdw", "--json"],
        Some(&prod.dsn("shell")),
    );
    assert_eq!(out.code, 7, "{out:?}");
    assert!(out.stdout.contains("only a superuser may create"), "{out:?}");
    script(
        &prod.dsn("postgres"),
        "CREATE DATABASE internal;\n\\c internal\n\
         CREATE FUNCTION rf(text) RETURNS text LANGUAGE internal STRICT AS 'pg_read_file_all';\n",
    );
    let out = d.cli_with(
        &["golden", "create", "internal", "--from-url", "-", "--json"],
        Some(&prod.dsn("internal")),
    );
    assert_eq!(out.code, 7, "{out:?}");
    assert!(d
        .json(&["golden", "ls"])
        .as_array()
        .unwrap()
        .iter()
        .all(|g| g["name"] != "shell" && g["name"] != "internal"));
}

#[test]
fn a_forged_dump_cannot_give_postgresqls_own_objects_away() {
    let prod = Production::start("forged");
    script(
        &prod.dsn("postgres"),
        "CREATE ROLE app_owner NOLOGIN;\nCREATE DATABASE app;\n\\c app\n\
         CREATE SCHEMA xg_catalog AUTHORIZATION app_owner;\n\
         CREATE FUNCTION xg_catalog.lo_export(oid, text) RETURNS integer LANGUAGE sql AS 'SELECT 1';\n\
         ALTER FUNCTION xg_catalog.lo_export(oid, text) OWNER TO app_owner;\n\
         CREATE TABLE public.t (id int);\nALTER TABLE public.t OWNER TO app_owner;\n",
    );
    let d = Daemon::start(&[]);
    let file = d.home.join("forged.dump");
    let status = Command::new("pg_dump")
        .args(["--format=custom", "--file"])
        .arg(&file)
        .arg(prod.dsn("app"))
        .status()
        .unwrap();
    assert!(status.success());
    // pg_restore writes a function's `ALTER ... OWNER TO` from its drop statement,
    // and a schema's from its tag: same-length edits make the dump name
    // PostgreSQL's own function and schema there, while creating its own.
    let mut bytes = std::fs::read(&file).unwrap();
    let mut swap = |from: &[u8], to: &[u8]| {
        let at = bytes.windows(from.len()).position(|w| w == from).expect("found in the archive");
        bytes[at..at + from.len()].copy_from_slice(to);
    };
    swap(b"DROP FUNCTION xg_catalog.", b"DROP FUNCTION pg_catalog.");
    swap(b"xg_catalog\x00\x06\x00\x00\x00SCHEMA", b"pg_catalog\x00\x06\x00\x00\x00SCHEMA");
    std::fs::write(&file, &bytes).unwrap();
    let listed = Command::new("pg_restore").args(["--schema-only", "-f", "-"]).arg(&file).output().unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.contains("ALTER FUNCTION pg_catalog.lo_export(oid, text) OWNER TO app_owner;"),
        "{listed}"
    );
    assert!(listed.contains("ALTER SCHEMA pg_catalog OWNER TO app_owner;"), "{listed}");

    // The archive imports, and the ownership pass finds nothing of PostgreSQL's
    // by those names: it gives away only what the restore made.
    let out = d.cli(&["golden", "create", "forged", "--from-dump", file.to_str().unwrap(), "--json"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout.contains("owners of 2 objects the dump names but the restore did not make"),
        "{}",
        out.stdout
    );
    let agent = dsn(&d.fork("forged", &[]));
    assert_eq!(
        sql(&agent, "SELECT nspowner::regrole FROM pg_namespace WHERE nspname = 'pg_catalog'"),
        "airlock_admin"
    );
    assert_eq!(
        sql(&agent, "SELECT proowner::regrole FROM pg_proc WHERE oid = 'pg_catalog.lo_export(oid, text)'::regprocedure"),
        "airlock_admin"
    );
    assert!(psql(&agent, "CREATE FUNCTION pg_catalog.evil() RETURNS int LANGUAGE sql AS 'SELECT 1'").is_err());
    assert_eq!(
        sql(&agent, "SELECT tableowner FROM pg_tables WHERE tablename = 't'"),
        "app_owner",
        "the rest is faithful"
    );
}

#[test]
fn a_dump_or_a_schema_file_cannot_reach_a_superuser_or_a_shell() {
    let d = Daemon::start(&[]);
    // What a hostile file would do with a superuser session: a function every
    // fork's agent could run anything through.
    let grab = "CREATE TABLE public.t (id int);\n{SWITCH};\n\
        CREATE FUNCTION public.run(q text) RETURNS text SECURITY DEFINER LANGUAGE plpgsql AS $$ BEGIN EXECUTE q; RETURN current_user; END $$;\n";
    for (switch, kind, code) in [
        ("SET ROLE airlock_admin", "--schema", "seed_failed"),
        ("SET SESSION AUTHORIZATION airlock_admin", "--schema", "seed_failed"),
        ("RESET ROLE; SET ROLE airlock_admin", "--from-dump", "source_failed"),
        ("SET SESSION AUTHORIZATION airlock_admin", "--from-dump", "source_failed"),
    ] {
        let file = d.home.join("grab.sql");
        std::fs::write(&file, grab.replace("{SWITCH}", switch)).unwrap();
        let (_, err) = d.fails(&["golden", "create", "grab", kind, file.to_str().unwrap()]);
        assert_eq!(err["code"], code, "{switch} in {kind}: {err}");
        assert!(err["message"].as_str().unwrap().contains("permission denied to set"), "{err}");
    }

    // psql runs as the daemon's user: a file's backslash commands would run a
    // shell or write files as root. The file is SQL and COPY data, nothing more.
    let marker = d.home.join("shell-ran");
    for (command, kind) in [
        (format!("\\! touch {}", marker.display()), "--from-dump"),
        (format!("\\o {}\nSELECT 1;", marker.display()), "--schema"),
        (format!("\\copy (SELECT 1) TO '{}'", marker.display()), "--from-dump"),
        // psql runs as root, which peer authentication maps to the admin.
        ("\\connect - airlock_admin\nALTER ROLE airlock_owner SUPERUSER;".to_owned(), "--from-dump"),
        ("\\restrict abc\n\\! id".to_owned(), "--schema"),
    ] {
        let file = d.home.join("meta.sql");
        std::fs::write(
            &file,
            format!("CREATE TABLE public.t (id int);\nCOPY public.t FROM stdin;\n1\n\\.\n{command}\n"),
        )
        .unwrap();
        let (_, err) = d.fails(&["golden", "create", "meta", kind, file.to_str().unwrap()]);
        assert!(
            err["message"].as_str().unwrap().contains("backslash commands are restricted"),
            "{command}: {err}"
        );
        assert!(!marker.exists(), "{command} ran");
    }

    // An archive whose comment was edited into statements (same length, so
    // pg_restore reads it as written) fails the same way.
    let prod = Production::start("switch");
    let filler = "A".repeat(120);
    script(
        &prod.dsn("postgres"),
        &format!("CREATE DATABASE app;\n\\c app\nCREATE TABLE public.t (id int);\nCOMMENT ON TABLE public.t IS '{filler}';\n"),
    );
    let file = d.home.join("switch.dump");
    let status =
        Command::new("pg_dump").args(["--format=custom", "--file"]).arg(&file).arg(prod.dsn("app")).status();
    assert!(status.unwrap().success());
    let mut bytes = std::fs::read(&file).unwrap();
    let injected =
        "'; SET ROLE airlock_admin; CREATE FUNCTION public.run() RETURNS int LANGUAGE sql AS 'SELECT 1'; --";
    let padded = format!("{injected}{}", " ".repeat(120 - injected.len()));
    let at = bytes.windows(120).position(|w| w == filler.as_bytes()).expect("the comment is in the archive");
    bytes[at..at + 120].copy_from_slice(padded.as_bytes());
    std::fs::write(&file, &bytes).unwrap();
    let (_, err) = d.fails(&["golden", "create", "switch", "--from-dump", file.to_str().unwrap()]);
    assert_eq!(err["code"], "source_failed", "{err}");
    assert!(err["message"].as_str().unwrap().contains("permission denied to set role"), "{err}");
    assert!(d.json(&["golden", "ls"]).as_array().unwrap().is_empty(), "nothing half-made");
}

/// Every process's command line, as any user on the host can read it.
fn command_lines() -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .collect()
}

#[test]
fn files_for_a_build_are_regular_and_psqls_key_is_never_on_a_command_line() {
    let d = Daemon::start(&[]);
    // A FIFO would let whoever holds its other end write more once psql runs
    // (and hold the build open for ever): refused at once, for every kind.
    let fifo = d.home.join("pipe.sql");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    for kind in ["--schema", "--seed", "--from-dump"] {
        let mut child =
            d.spawn_cli_output(&["golden", "create", "piped", kind, fifo.to_str().unwrap(), "--json"]);
        let began = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            assert!(
                began.elapsed() < std::time::Duration::from_secs(30),
                "{kind}: the build waits on the FIFO"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        let err: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(err["error"]["code"], "file_unreadable", "{kind}: {err}");
        assert!(err["error"]["message"].as_str().unwrap().contains("not a regular file"), "{err}");
    }

    // The key that locks psql's backslash commands reaches psql down its input:
    // an owner of the file who reads command lines cannot learn it.
    let slow = d.home.join("slow.sql");
    std::fs::write(&slow, "CREATE TABLE t (id int);\nSELECT pg_sleep(3);\n").unwrap();
    let child = d.spawn_cli_output(&["golden", "create", "slow", "--schema", slow.to_str().unwrap()]);
    let (mut psql_seen, mut key_seen) = (false, Vec::new());
    let began = std::time::Instant::now();
    while began.elapsed() < std::time::Duration::from_secs(20) && !psql_seen {
        for line in command_lines() {
            psql_seen |= line.contains("ON_ERROR_STOP=1");
            if line.contains("restrict") {
                key_seen.push(line);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(psql_seen, "psql was seen running");
    assert!(key_seen.is_empty(), "{key_seen:?}");
}

/// A directory-format dump of one table with rows and a large object, in `dir`.
fn directory_dump(prod: &Production, dir: &Path) -> (String, String) {
    let _ = std::fs::remove_dir_all(dir);
    let status = Command::new("pg_dump")
        .args(["--format=directory", "--compress=0", "--file"])
        .arg(dir)
        .arg(prod.dsn("app"))
        .status()
        .unwrap();
    assert!(status.success());
    let list = Command::new("pg_restore").arg("-l").arg(dir).output().unwrap();
    let list = String::from_utf8_lossy(&list.stdout).into_owned();
    let id = list
        .lines()
        .find(|l| l.contains("TABLE DATA public notes"))
        .and_then(|l| l.split(';').next())
        .expect("the table's data entry")
        .trim()
        .to_owned();
    let blob = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("blob_"))
        .expect("the large object's file");
    (format!("{id}.dat"), blob)
}

#[test]
fn a_directory_dump_cannot_load_the_hosts_files_into_a_golden() {
    let prod = Production::start("dirdump");
    script(
        &prod.dsn("postgres"),
        "CREATE DATABASE app;\n\\c app\nCREATE TABLE public.notes (line text);\n\
         INSERT INTO public.notes VALUES ('kept');\nSELECT lo_from_bytea(0, 'an object');\n",
    );
    let d = Daemon::start(&[]);
    // A host file only root may read, written as COPY data would be.
    let secret = d.home.join("host-secret");
    std::fs::write(&secret, "TOPSECRET-7f3a\n").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let dump = d.home.join("dump.d");
    let (data, blob) = directory_dump(&prod, &dump);

    // As pg_dump wrote it, it imports: rows and the large object.
    let out = d.cli(&["golden", "create", "plain", "--from-dump", dump.to_str().unwrap(), "--json"]);
    assert_eq!(out.code, 0, "{out:?}");
    let agent = dsn(&d.fork("plain", &[]));
    assert_eq!(sql(&agent, "SELECT line FROM notes"), "kept");
    assert_eq!(sql(&agent, "SELECT count(*) FROM pg_largeobject_metadata"), "1");

    // Far enough up from wherever the dump is read, then the secret's own path.
    let climb = format!("{}{}", "../".repeat(24), secret.display().to_string().trim_start_matches('/'));
    type Forgery<'a> = (&'a str, Box<dyn Fn(&Path) + 'a>);
    let forged: Vec<Forgery> = vec![
        // A data file that is a link to the secret.
        (
            "a link",
            Box::new(|d: &Path| {
                std::fs::remove_file(d.join(&data)).unwrap();
                std::os::unix::fs::symlink(&secret, d.join(&data)).unwrap();
            }),
        ),
        // A data file that is a FIFO another process writes.
        (
            "a FIFO",
            Box::new(|d: &Path| {
                std::fs::remove_file(d.join(&data)).unwrap();
                nix::unistd::mkfifo(&d.join(&data), nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
            }),
        ),
        // The large objects' table of contents naming a path that climbs out.
        (
            "a climbing path in blobs.toc",
            Box::new(|d: &Path| {
                let toc = std::fs::read_to_string(d.join("blobs.toc")).unwrap();
                std::fs::write(d.join("blobs.toc"), toc.replace(&blob, &climb)).unwrap();
            }),
        ),
        // toc.dat naming a climbing path as the table's data file (a string
        // there is a sign byte, a 4-byte little-endian length, the bytes).
        (
            "a climbing path in toc.dat",
            Box::new(|d: &Path| {
                let bytes = std::fs::read(d.join("toc.dat")).unwrap();
                let mut from = vec![0u8, data.len() as u8, 0, 0, 0];
                from.extend_from_slice(data.as_bytes());
                let at = bytes.windows(from.len()).position(|w| w == from).expect("the file name in toc.dat");
                let mut to = vec![0u8, climb.len() as u8, 0, 0, 0];
                to.extend_from_slice(climb.as_bytes());
                let forged = [&bytes[..at], &to[..], &bytes[at + from.len()..]].concat();
                std::fs::write(d.join("toc.dat"), forged).unwrap();
            }),
        ),
    ];
    for (what, forge) in forged {
        directory_dump(&prod, &dump);
        forge(&dump);
        let (_, err) = d.fails(&["golden", "create", "stolen", "--from-dump", dump.to_str().unwrap()]);
        let code = err["code"].as_str().unwrap();
        assert!(code == "file_unreadable" || code == "source_failed", "{what}: {err}");
        assert!(!err.to_string().contains("TOPSECRET"), "{what}: {err}");
        assert!(
            d.json(&["golden", "ls"]).as_array().unwrap().iter().all(|g| g["name"] != "stolen"),
            "{what}: nothing half-made"
        );
    }
}

#[test]
fn settings_stored_for_the_database_or_a_role_never_reach_a_golden() {
    let d = Daemon::start(&[]);
    // Stored settings apply to every later session: `role` would run the
    // admin's sessions in forks as the owner, and non-standard strings would
    // change how their SQL reads.
    for (statement, kind, code) in [
        ("ALTER DATABASE app SET role = airlock_owner", "--schema", "seed_failed"),
        ("ALTER DATABASE app SET standard_conforming_strings = off", "--from-dump", "source_failed"),
        ("ALTER ROLE airlock_owner SET search_path = evil, public", "--schema", "seed_failed"),
        (
            "ALTER ROLE airlock_owner IN DATABASE app SET statement_timeout = 1",
            "--from-dump",
            "source_failed",
        ),
    ] {
        let file = d.home.join("settings.sql");
        std::fs::write(&file, format!("CREATE TABLE public.t (id int);\n{statement};\n")).unwrap();
        let (_, err) = d.fails(&["golden", "create", "steered", kind, file.to_str().unwrap()]);
        assert_eq!(err["code"], code, "{statement}: {err}");
        assert!(err["message"].as_str().unwrap().contains("stored settings"), "{statement}: {err}");
        assert!(d.json(&["golden", "ls"]).as_array().unwrap().is_empty(), "{statement}: nothing half-made");
    }
    // Settings a session makes for itself are the application's business.
    let file = d.home.join("session.sql");
    std::fs::write(&file, "SET search_path = public;\nCREATE TABLE public.t (id int);\n").unwrap();
    let out = d.cli(&["golden", "create", "plain", "--schema", file.to_str().unwrap(), "--json"]);
    assert_eq!(out.code, 0, "{out:?}");
}

/// A source's extensions that can reach outside a fork (other servers, the
/// server's files, raw pages) are left out of its golden, each with a note;
/// one the request names is installed, and even then reaches nothing of the
/// host: a host socket anyone may connect to stays unreached from the fork.
#[test]
fn extensions_that_reach_outside_a_fork_are_left_out_unless_named_and_even_then_reach_nothing() {
    let prod = Production::start("reaching");
    script(
        &prod.dsn("postgres"),
        "CREATE DATABASE reaching;\n\\connect reaching\n\
         CREATE EXTENSION dblink; CREATE EXTENSION postgres_fdw; CREATE EXTENSION pageinspect;\n\
         CREATE EXTENSION pg_trgm; CREATE TABLE t (v text); INSERT INTO t VALUES ('kept');\n",
    );
    let d = Daemon::start(&[]);
    let out =
        d.cli_with(&["golden", "create", "plain", "--from-url", "-", "--json"], Some(&prod.dsn("reaching")));
    assert_eq!(out.code, 0, "{out:?}");
    let g: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let not_carried = g["generations"][0]["import"]["imported"]["not_carried"].to_string();
    for name in ["dblink", "postgres_fdw", "pageinspect"] {
        assert!(not_carried.contains(&format!("--allow-extension {name}")), "{name}: {not_carried}");
    }
    let agent = dsn(&d.fork("plain", &[]));
    assert_eq!(
        sql(&agent, "SELECT string_agg(extname, ',' ORDER BY extname) FROM pg_extension"),
        "pg_trgm,plpgsql"
    );
    assert_eq!(sql(&agent, "SELECT v FROM t"), "kept");
    // A custom-format dump naming them is read the same way.
    let file = d.home.join("reaching.dump");
    let status = Command::new("pg_dump")
        .args(["--format=custom", "--file"])
        .arg(&file)
        .arg(prod.dsn("reaching"))
        .status();
    assert!(status.unwrap().success());
    let g = d.json(&["golden", "create", "dumped", "--from-dump", file.to_str().unwrap()]);
    let not_carried = g["generations"][0]["import"]["imported"]["not_carried"].to_string();
    for name in ["dblink", "postgres_fdw", "pageinspect"] {
        assert!(not_carried.contains(&format!("--allow-extension {name}")), "{name}: {not_carried}");
    }
    let agent = dsn(&d.fork("dumped", &[]));
    assert_eq!(
        sql(&agent, "SELECT string_agg(extname, ',' ORDER BY extname) FROM pg_extension"),
        "pg_trgm,plpgsql"
    );
    assert_eq!(sql(&agent, "SELECT v FROM t"), "kept");
    // A bad name is refused before anything is built.
    let (code, err) = d.fails(&[
        "golden",
        "create",
        "bad",
        "--from-url",
        &prod.dsn("reaching"),
        "--allow-extension",
        "x;y",
    ]);
    assert_ne!(code, 0);
    assert_eq!(err["code"], "invalid_request", "{err}");

    // Named, it is installed; the fork still reaches no host socket through it.
    let out = d.cli_with(
        &["golden", "create", "linked", "--from-url", "-", "--allow-extension", "dblink", "--json"],
        Some(&prod.dsn("reaching")),
    );
    assert_eq!(out.code, 0, "{out:?}");
    let bait = std::path::PathBuf::from(format!("/run/airlock-dblink-{}", std::process::id()));
    std::fs::create_dir_all(&bait).unwrap();
    let socket = bait.join(".s.PGSQL.5432");
    let _ = std::fs::remove_file(&socket);
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    listener.set_nonblocking(true).unwrap();
    std::fs::set_permissions(&socket, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let agent = dsn(&d.fork("linked", &[]));
    assert_eq!(sql(&agent, "SELECT count(*) FROM pg_extension WHERE extname = 'dblink'"), "1");
    if nix::unistd::geteuid().is_root() {
        for host in [bait.display().to_string(), prod.dir.display().to_string()] {
            let err = psql(&agent, &format!("SELECT dblink_connect('host={host} dbname=reaching user=postgres password=guess connect_timeout=2')"))
                .expect_err("a host socket was reached");
            assert!(err.contains("No such file or directory"), "{host}: {err}");
        }
        assert!(listener.accept().is_err(), "the host's socket was connected to");
    }
    let _ = std::fs::remove_dir_all(&bait);
}
