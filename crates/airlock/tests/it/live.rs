//! Live targets: a "production" PostgreSQL of the test's own, reachable only
//! over TLS with a password, registered with its admin DSN on standard input;
//! what registering checks and refuses, and that the DSN's secret is kept by
//! the daemon alone.

use std::path::PathBuf;

use serde_json::Value;

use crate::harness::{psql, sql, Daemon};
use crate::imports::{newest_postgres_bin, script, Production};

/// A production server on loopback that takes TLS only, with a certificate
/// of the daemon's CA, and password logins; its admin role may make roles
/// and schemas but is no superuser. Returns it, its port and the CA's path.
pub(crate) fn production(d: &Daemon, name: &str) -> (Production, u16, PathBuf) {
    let certs = PathBuf::from(format!("/tmp/airlock-live-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&certs).unwrap();
    let (cert, key) = (certs.join("server.crt"), certs.join("server.key"));
    std::fs::copy(d.home.join("tls/server.crt"), &cert).unwrap();
    std::fs::copy(d.home.join("tls/server.key"), &key).unwrap();
    for f in [&cert, &key] {
        std::os::unix::fs::chown(f, Some(65534), Some(65534)).unwrap();
    }
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let options = format!(
        "-c ssl=on -c ssl_cert_file={} -c ssl_key_file={} -c listen_addresses=127.0.0.1",
        cert.display(),
        key.display()
    );
    let prod = Production::start_with(name, newest_postgres_bin(), port, &options);
    script(
        &prod.dsn("postgres"),
        "CREATE DATABASE prod;
         CREATE ROLE ops LOGIN PASSWORD 'ops-secret-5c1d' CREATEROLE;
         CREATE ROLE weak LOGIN PASSWORD 'weak-secret-9e2a';
         GRANT CREATE ON DATABASE prod TO ops;",
    );
    std::fs::write(
        prod.dir.join("data/pg_hba.conf"),
        "local all all trust\nhostssl all all 127.0.0.1/32 scram-sha-256\nhostnossl all all 127.0.0.1/32 reject\n",
    )
    .unwrap();
    sql(&prod.dsn("postgres"), "SELECT pg_reload_conf()");
    (prod, port, d.home.join("tls/ca.crt"))
}

fn add(d: &Daemon, name: &str, dsn: &str) -> crate::harness::Out {
    d.cli_with(&["target", "add", name, "--from-url", "-", "--json"], Some(dsn))
}

/// The error a `--json` run printed.
fn error(out: &crate::harness::Out) -> Value {
    let printed: Value =
        serde_json::from_str(out.stdout.trim()).unwrap_or_else(|_| panic!("not an error as JSON: {out:?}"));
    printed["error"].clone()
}

#[test]
fn a_target_is_checked_when_added_and_its_dsn_never_shown_again() {
    let d = Daemon::start(&[]);
    let (_prod, port, ca) = production(&d, "targets");
    let ca = ca.display();
    let dsn = |user: &str, password: &str, mode: &str| {
        format!("postgresql://{user}:{password}@localhost:{port}/prod?sslmode={mode}&sslrootcert={ca}")
    };

    let out = add(&d, "prod", &dsn("ops", "ops-secret-5c1d", "verify-full"));
    assert_eq!(out.code, 0, "{out:?}");
    let target: Value = serde_json::from_str(&out.stdout).unwrap();
    let checks = &target["checks"];
    assert_eq!((checks["user"].as_str(), checks["database"].as_str()), (Some("ops"), Some("prod")));
    assert_eq!(checks["tls"], true);
    assert_eq!(checks["superuser"], false);
    assert!(checks["server_version_num"].as_i64().unwrap() >= 130000, "{checks}");
    assert!(!checks["dsn"].as_str().unwrap().contains("ops-secret"), "{checks}");
    // What a grant there cannot take away is said, with how to close it.
    let gaps = checks["cannot_take_away"].to_string();
    assert!(gaps.contains("REVOKE TEMPORARY ON DATABASE prod FROM PUBLIC"), "{gaps}");

    // Listed and shown, never with the password.
    let listed = d.json(&["target", "ls"]);
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    let shown = d.ok(&["target", "show", "prod"]);
    assert!(shown.contains("PostgreSQL") && shown.contains("over TLS"), "{shown}");
    let (_, body) = d.api("GET", "/v1/targets/prod", "");
    assert!(!body.contains("ops-secret"), "{body}");

    // What it refuses, each with its code, and nothing recorded.
    let taken = add(&d, "prod", &dsn("ops", "ops-secret-5c1d", "verify-full"));
    assert_eq!((taken.code, error(&taken)["code"].as_str()), (5, Some("target_exists")), "{taken:?}");
    let weak = add(&d, "weak", &dsn("weak", "weak-secret-9e2a", "verify-full"));
    let said = error(&weak);
    assert_eq!((weak.code, said["code"].as_str()), (17, Some("target_refused")), "{weak:?}");
    assert!(said["hint"].as_str().unwrap().contains("ALTER ROLE weak CREATEROLE"), "{said}");
    assert!(said["hint"].as_str().unwrap().contains("GRANT CREATE ON DATABASE prod TO weak"), "{said}");
    let wrong = add(&d, "wrong", &dsn("ops", "not-the-password", "verify-full"));
    assert_eq!(error(&wrong)["code"], "target_refused", "{wrong:?}");
    assert!(!wrong.stderr.contains("not-the-password"), "{wrong:?}");
    let plain = add(&d, "plain", &dsn("ops", "ops-secret-5c1d", "disable"));
    assert_eq!(error(&plain)["code"], "target_refused", "{plain:?}");
    let bad_name = add(&d, "Bad Name", &dsn("ops", "ops-secret-5c1d", "verify-full"));
    assert_eq!(error(&bad_name)["code"], "invalid_name", "{bad_name:?}");
    let on_the_command_line =
        d.cli(&["target", "add", "cli", "--from-url", &dsn("ops", "x", "require"), "--json"]);
    assert_eq!(error(&on_the_command_line)["code"], "invalid_request", "{on_the_command_line:?}");
    assert_eq!(d.json(&["target", "ls"]).as_array().unwrap().len(), 1);

    // The secret is the daemon's alone: in no log or event, and its store is root's.
    let events = d.ok(&["events", "--json"]);
    assert!(events.contains("target_added"), "{events}");
    for text in [d.logs(), events] {
        assert!(!text.contains("ops-secret-5c1d") && !text.contains("weak-secret-9e2a"), "a secret leaked");
    }
    let mode = std::fs::metadata(d.home.join("live.db")).unwrap();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o077, 0);

    // Forgotten with its DSN.
    d.ok(&["target", "rm", "prod"]);
    let gone = d.cli(&["target", "show", "prod", "--json"]);
    assert_eq!((gone.code, error(&gone)["code"].as_str()), (4, Some("target_not_found")), "{gone:?}");
    assert!(d.ok(&["events", "--json"]).contains("target_removed"));
}

/// Production's data: two tenants' rows in a shared table, a table the grant
/// does not name, a second schema; the admin role may grant on analytics.
/// PUBLIC's temporary tables and large objects are taken away, as LIVE.md
/// says to, so that what a grant refuses can all be seen.
fn seed(prod: &Production) {
    script(
        &prod.dsn("prod"),
        "CREATE SCHEMA analytics;
         CREATE TABLE analytics.accounts (id int PRIMARY KEY, tenant_id int NOT NULL, name text);
         INSERT INTO analytics.accounts SELECT g, CASE WHEN g % 2 = 0 THEN 42 ELSE 7 END, 'acct ' || g
           FROM generate_series(1, 10) g;
         CREATE TABLE analytics.usage_daily (tenant_id int, day date, events int);
         INSERT INTO analytics.usage_daily VALUES (42, '2026-09-01', 5), (7, '2026-09-01', 900);
         CREATE TABLE analytics.salaries (name text, amount int);
         INSERT INTO analytics.salaries VALUES ('ceo', 1000000);
         CREATE SCHEMA billing;
         CREATE TABLE billing.invoices (tenant_id int, total numeric);
         INSERT INTO billing.invoices VALUES (42, 10), (7, 20);
         GRANT USAGE ON SCHEMA analytics TO ops WITH GRANT OPTION;
         GRANT SELECT ON ALL TABLES IN SCHEMA analytics TO ops WITH GRANT OPTION;
         REVOKE TEMPORARY ON DATABASE prod FROM PUBLIC;
         REVOKE EXECUTE ON FUNCTION lo_create(oid), lo_creat(integer), lo_from_bytea(oid, bytea) FROM PUBLIC;",
    );
}

/// A production server with [`seed`]'s data, and `extra` run on it as its
/// superuser, registered as target `prod`; also its port, the CA's path and
/// the admin DSN.
fn registered(d: &Daemon, name: &str, extra: &str) -> (Production, u16, PathBuf, String) {
    let (prod, port, ca) = production(d, name);
    seed(&prod);
    if !extra.is_empty() {
        script(&prod.dsn("prod"), extra);
    }
    let admin = format!(
        "postgresql://ops:ops-secret-5c1d@localhost:{port}/prod?sslmode=verify-full&sslrootcert={}",
        ca.display()
    );
    assert_eq!(add(d, "prod", &admin).code, 0);
    (prod, port, ca, admin)
}

/// psql running each statement as its own query; Ok(stdout) or Err(stderr).
fn psql_each(dsn: &str, statements: &[&str]) -> Result<String, String> {
    let (plain, password) = crate::harness::split_password(dsn);
    let mut cmd = std::process::Command::new("psql");
    cmd.arg(plain).args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1"]);
    for s in statements {
        cmd.args(["-c", s]);
    }
    let out = cmd.env("PGPASSWORD", password).env("PGCONNECT_TIMEOUT", "10").output().unwrap();
    match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned()),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

fn granted(d: &Daemon, args: &[&str]) -> Value {
    let mut all = vec!["grant"];
    all.extend_from_slice(args);
    d.json(&all)
}

/// Roles and schemas of grants on the production server.
fn grant_objects(prod: &Production) -> String {
    sql(
        &prod.dsn("prod"),
        "SELECT coalesce(string_agg(n, ','), '') FROM (
           SELECT rolname::text n FROM pg_roles WHERE rolname LIKE 'airlock_grant_%'
           UNION ALL SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'airlock_grant_%') x",
    )
}

#[test]
fn a_grant_reads_only_what_it_names_for_as_long_as_it_lasts() {
    let mut d = Daemon::start(&[]);
    let (prod, port, ca, admin) = registered(&d, "grants", "");

    // A tenant's rows of two tables, through views of the grant's own.
    let g = granted(
        &d,
        &[
            "prod",
            "--tables",
            "analytics.accounts,analytics.usage_daily",
            "--where",
            "tenant_id = 42",
            "--ttl",
            "5m",
            "--statement-timeout",
            "2s",
        ],
    );
    let dsn = g["dsn"].as_str().unwrap().to_owned();
    let id = g["id"].as_str().unwrap().to_owned();
    assert!(
        dsn.contains(&format!("{id}:")) && !dsn.contains(&port.to_string()) && !dsn.contains("ops"),
        "{dsn}"
    );
    assert_eq!(g["tables"], serde_json::json!(["analytics.accounts", "analytics.usage_daily"]));
    assert_eq!(g["cannot_take_away"], serde_json::json!([]), "{g}");
    assert_eq!(sql(&dsn, "SELECT count(*), min(tenant_id), max(tenant_id) FROM accounts"), "5|42|42");
    assert_eq!(sql(&dsn, "SELECT sum(events) FROM usage_daily"), "5");
    assert!(sql(&dsn, "SELECT current_user").starts_with("airlock_grant_"));
    // No condition of the grantee's reaches the table's index, where "rows
    // removed by filter" would say which ids the other tenant has.
    let plan = psql_each(
        &dsn,
        &[
            "SET enable_seqscan = off",
            "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) SELECT * FROM accounts WHERE id = 1",
        ],
    )
    .unwrap();
    assert!(!plan.contains("Index Cond: (id = 1)"), "{plan}");
    // Through the router's TLS, whatever database the client names.
    assert_eq!(sql(&dsn.replace(&format!("/{id}?"), "/postgres?"), "SELECT current_database()"), "prod");

    // What it refuses, each in PostgreSQL's own words.
    let refused = |statements: &[&str], says: &str| {
        let e = psql_each(&dsn, statements).expect_err(&format!("{statements:?} was allowed"));
        assert!(e.contains(says), "{statements:?}: {e}");
    };
    refused(&["SELECT * FROM analytics.accounts"], "permission denied for schema analytics");
    refused(&["SELECT * FROM analytics.salaries"], "permission denied");
    refused(&["SELECT * FROM billing.invoices"], "permission denied for schema billing");
    // Its views are not updatable at all (their filter sits under a fence).
    refused(&["INSERT INTO accounts VALUES (99, 42, 'x')"], "cannot insert into view \"accounts\"");
    assert_eq!(sql(&dsn, "SHOW default_transaction_read_only"), "on");
    refused(
        &["SET default_transaction_read_only = off", "INSERT INTO accounts VALUES (99, 42, 'x')"],
        "cannot insert into view \"accounts\"",
    );
    refused(
        &["COMMIT", "SET default_transaction_read_only = off", "DELETE FROM usage_daily"],
        "cannot delete from view \"usage_daily\"",
    );
    refused(
        &["SET default_transaction_read_only = off", "CREATE TABLE public.x (i int)"],
        "permission denied for schema public",
    );
    refused(
        &["SET default_transaction_read_only = off", "CREATE TEMP TABLE t (i int)"],
        "permission denied to create temporary tables",
    );
    refused(
        &["SET default_transaction_read_only = off", "SELECT lo_create(0)"],
        "permission denied for function lo_create",
    );
    refused(&["SELECT pg_read_file('/etc/passwd')"], "permission denied for function pg_read_file");
    refused(&["SELECT * FROM pg_read_file('/etc/passwd') f"], "permission denied for function pg_read_file");
    refused(&["COPY (SELECT 1) TO PROGRAM 'id'"], "pg_execute_server_program");
    refused(&["SET ROLE ops"], "permission denied to set role");
    // A runaway is cancelled at the grant's timeout, though the grantee set its own to 0.
    let began = std::time::Instant::now();
    refused(&["SET statement_timeout = 0", "SELECT pg_sleep(60)"], "canceling statement");
    assert!(began.elapsed() < std::time::Duration::from_secs(20), "{:?}", began.elapsed());
    // A filter that would end its WHERE, and a table that is not there, are refused before anything is made.
    let bad = d.cli(&[
        "grant",
        "prod",
        "--tables",
        "analytics.accounts",
        "--where",
        "true) UNION SELECT * FROM analytics.salaries WHERE (true",
        "--json",
    ]);
    assert_eq!((bad.code, error(&bad)["code"].as_str()), (3, Some("invalid_request")), "{bad:?}");
    let missing = d.cli(&["grant", "prod", "--tables", "analytics.nope", "--json"]);
    assert_eq!(error(&missing)["code"], "target_refused", "{missing:?}");
    let none = d.cli(&["grant", "nowhere", "--tables", "t", "--json"]);
    assert_eq!(error(&none)["code"], "target_not_found", "{none:?}");

    // Revoking cuts a live session and leaves no role, schema or privilege behind.
    let whole = granted(&d, &["prod", "--tables", "analytics.usage_daily", "--statement-timeout", "1m"]);
    let whole_dsn = whole["dsn"].as_str().unwrap().to_owned();
    assert_eq!(sql(&whole_dsn, "SELECT count(*) FROM analytics.usage_daily"), "2");
    let held = crate::harness::spawn_psql(&whole_dsn, "SELECT pg_sleep(50)");
    let role = whole["role"].as_str().unwrap().to_owned();
    d.wait_for(std::time::Duration::from_secs(10), "the session to run", || {
        sql(
            &prod.dsn("prod"),
            &format!("SELECT count(*) FROM pg_stat_activity WHERE usename = '{role}' AND state = 'active'"),
        ) == "1"
    });
    d.ok(&["revoke", whole["id"].as_str().unwrap()]);
    let out = held.wait_with_output().unwrap();
    assert!(!out.status.success(), "the session outlived its grant");
    let acl = sql(
        &prod.dsn("prod"),
        &format!(
            "SELECT (SELECT count(*) FROM pg_class WHERE relacl::text LIKE '%{role}%')
                       + (SELECT count(*) FROM pg_namespace WHERE nspacl::text LIKE '%{role}%')
                       + (SELECT count(*) FROM pg_roles WHERE rolname = '{role}')"
        ),
    );
    assert_eq!(acl, "0");
    let after = psql(&whole_dsn, "SELECT 1").unwrap_err();
    assert!(after.contains("does not exist or has ended"), "{after}");

    // The server itself refuses the role after VALID UNTIL, with the daemon gone.
    let brief = granted(&d, &["prod", "--tables", "analytics.usage_daily", "--ttl", "4s"]);
    let brief_id = brief["id"].as_str().unwrap().to_owned();
    let route: Value =
        serde_json::from_slice(&std::fs::read(d.home.join(format!("routes/{brief_id}.json"))).unwrap())
            .unwrap();
    let upstream = route["upstream"].as_str().unwrap().to_owned();
    let direct = |sql: &str| {
        let out = std::process::Command::new("psql")
            .arg(&upstream)
            .args(["-XtAc", sql])
            .env("PGSSLROOTCERT", &ca)
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    assert!(direct("SELECT 1").0, "the role works before its expiry");
    d.kill9();
    std::thread::sleep(std::time::Duration::from_secs(5));
    let (ok, said) = direct("SELECT 1");
    assert!(!ok && said.contains("password authentication failed"), "{said}");
    let expired = psql(brief["dsn"].as_str().unwrap(), "SELECT 1").unwrap_err();
    assert!(expired.contains("does not exist or has ended"), "{expired}");

    // A grant role and schema no grant owns (a crash between minting and
    // recording) are dropped when the daemon comes back, as is the expired one.
    let prefix = &role[..role.len() - 10];
    let orphan = format!("{prefix}zzzzzzzzzz");
    psql_each(
        &admin,
        &[
            &format!("CREATE ROLE {orphan} LOGIN"),
            &format!("CREATE SCHEMA {orphan}"),
            &format!("CREATE VIEW {orphan}.v AS SELECT * FROM analytics.accounts"),
            &format!("GRANT USAGE ON SCHEMA analytics TO {orphan}"),
        ],
    )
    .unwrap();
    d.spawn();
    d.wait_for(std::time::Duration::from_secs(20), "orphans to be dropped", || {
        let left = grant_objects(&prod);
        // The first grant is still live.
        left.split(',').filter(|n| !n.is_empty()).all(|n| n == g["role"].as_str().unwrap())
    });
    let events = d.ok(&["events", "--json"]);
    assert!(
        events.contains("\"orphaned\"") && events.contains("\"expired\"") && events.contains("grant_minted"),
        "{events}"
    );
    let password = crate::harness::split_password(&dsn).1;
    assert!(!events.contains(&password) && !d.logs().contains(&password), "a grant's password leaked");
    assert_eq!(d.json(&["grants"]).as_array().unwrap().len(), 1);
}

/// What an agent writes for "chart this tenant's usage": pandas over
/// DATABASE_URL, a matplotlib PNG and a CSV; and what it tries besides,
/// reaching past its grant, and leaving a process behind.
const JOB: &str = r#"
import json, os, socket, subprocess, sys
import pandas as pd, psycopg2
import matplotlib.pyplot as plt

target_port, router_port, home = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
with psycopg2.connect(os.environ["DATABASE_URL"]) as conn:
    df = pd.read_sql("SELECT a.id, a.name, a.tenant_id, u.events FROM accounts a JOIN usage_daily u USING (tenant_id) ORDER BY a.id", conn)
extra = pd.read_csv("in/extra.csv")
os.makedirs("out", exist_ok=True)
df.merge(extra, on="id", how="left").to_csv("out/summary.csv", index=False)
df.plot.bar(x="name", y="events").get_figure().savefig("chart.png")

def reach(host, port):
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect((host, port))
        return True
    except OSError:
        return False
    finally:
        s.close()

def unix(path):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        return True
    except OSError:
        return False

stray = subprocess.Popen(["sleep", "300"], start_new_session=True)
print(json.dumps({
    "rows": len(df), "tenants": sorted(set(df.tenant_id.tolist())),
    "target": reach("127.0.0.1", target_port), "router": reach("127.0.0.1", router_port),
    "internet": reach("1.1.1.1", 443), "api": unix(home + "/airlock.sock"), "home": os.path.exists(home),
    "stray": stray.pid, "user": os.getuid(), "cwd": os.getcwd(),
}))
"#;

#[test]
fn an_executor_on_a_grant_reaches_only_the_grant_brings_files_back_and_leaves_nothing() {
    let d = Daemon::start(&[]);
    let (prod, port, _, _) = registered(&d, "executor", "");
    let g = granted(
        &d,
        &["prod", "--tables", "analytics.accounts,analytics.usage_daily", "--where", "tenant_id = 42"],
    );
    let id = g["id"].as_str().unwrap().to_owned();
    let local = PathBuf::from(format!("/tmp/airlock-executor-{}", std::process::id()));
    std::fs::create_dir_all(&local).unwrap();
    std::fs::write(local.join("job.py"), JOB).unwrap();
    std::fs::write(local.join("extra.csv"), "id,note\n2,two\n4,four\n").unwrap();
    let router_port = d.json(&["doctor"])["router"]["port"].as_u64().unwrap().to_string();
    let home = d.home.display().to_string();
    let l = |name: &str| local.join(name).display().to_string();
    let (put_job, put_extra) =
        (format!("{}:job.py", l("job.py")), format!("{}:in/extra.csv", l("extra.csv")));
    let (get_chart, get_summary) =
        (format!("chart.png:{}", l("chart.png")), format!("out/summary.csv:{}", l("summary.csv")));
    let port_text = port.to_string();
    let out = d.cli(&[
        "exec",
        "--grant",
        &id,
        "--timeout",
        "90s",
        "--put",
        &put_job,
        "--put",
        &put_extra,
        "--get",
        &get_chart,
        "--get",
        &get_summary,
        "--get",
        "nothing.txt",
        "--",
        "python3",
        "job.py",
        &port_text,
        &router_port,
        &home,
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    let said: Value =
        serde_json::from_str(out.stdout.trim().lines().last().unwrap()).unwrap_or_else(|_| panic!("{out:?}"));
    // Its tenant's rows only, through the grant.
    assert_eq!(
        (said["rows"].as_i64(), said["tenants"].clone()),
        (Some(5), serde_json::json!([42])),
        "{said}"
    );
    // Nothing else is reachable.
    for probe in ["target", "router", "internet", "api", "home"] {
        assert_eq!(said[probe], false, "{probe} was reachable: {said}");
    }
    assert_ne!(said["user"], 0, "{said}");
    assert_eq!(said["cwd"], "/work");
    // The files came back; one that was never made is said to be missing.
    assert!(std::fs::read(local.join("chart.png")).unwrap().starts_with(b"\x89PNG"));
    let summary = std::fs::read_to_string(local.join("summary.csv")).unwrap();
    assert!(summary.starts_with("id,name,tenant_id,events,note") && summary.contains("two"), "{summary}");
    assert!(out.stderr.contains("nothing.txt was not brought back"), "{out:?}");
    // Nothing is left: no process, no workspace, no grant.
    let stray = said["stray"].as_i64().unwrap();
    // Killed: gone, or a zombie its new parent has not reaped yet.
    let state = std::fs::read_to_string(format!("/proc/{stray}/stat")).unwrap_or_default();
    assert!(state.is_empty() || state.contains(") Z "), "a process outlived its executor: {state}");
    let executors = std::fs::read_dir(d.home.join("executors")).map(|e| e.count()).unwrap_or(0);
    assert_eq!(executors, 0, "a workspace was left");
    assert!(!d.cgroups().iter().any(|c| c.contains("exec-")), "{:?}", d.cgroups());
    assert_eq!(d.json(&["grants"]).as_array().unwrap().len(), 0);
    assert_eq!(grant_objects(&prod), "");
    let ended = psql(g["dsn"].as_str().unwrap(), "SELECT 1").unwrap_err();
    assert!(ended.contains("does not exist or has ended"), "{ended}");
    assert!(d.ok(&["events", "--json"]).contains("executor_ended"));

    // A runaway is killed at its timeout, with its children; stderr comes back.
    let g = granted(&d, &["prod", "--tables", "analytics.usage_daily"]);
    let id = g["id"].as_str().unwrap();
    let began = std::time::Instant::now();
    let out = d.cli(&[
        "exec",
        "--grant",
        id,
        "--timeout",
        "2s",
        "--",
        "sh",
        "-c",
        "echo oops >&2; sleep 301 & sleep 301",
    ]);
    assert_eq!(out.code, 124, "{out:?}");
    assert!(out.stderr.contains("oops") && out.stderr.contains("killed after 2s"), "{out:?}");
    assert!(began.elapsed() < std::time::Duration::from_secs(30));
    assert_eq!(sleepers("sleep\x00301\x00"), 0, "a sleeper outlived its executor");
    // The workspace is bounded: filling it fails in the run, not on the host.
    let g = granted(&d, &["prod", "--tables", "analytics.usage_daily"]);
    let fill = d.cli(&[
        "exec",
        "--grant",
        g["id"].as_str().unwrap(),
        "--",
        "dd",
        "if=/dev/zero",
        "of=big",
        "bs=1M",
        "count=400",
    ]);
    assert_ne!(fill.code, 0, "{fill:?}");
    assert!(fill.stderr.contains("No space left"), "{fill:?}");
    // A path out of the workspace is refused before anything runs.
    let g = granted(&d, &["prod", "--tables", "analytics.usage_daily"]);
    let escape = d.cli(&[
        "exec",
        "--grant",
        g["id"].as_str().unwrap(),
        "--get",
        "../../etc/shadow",
        "--json",
        "--",
        "true",
    ]);
    assert_eq!(error(&escape)["code"], "invalid_request", "{escape:?}");
    std::fs::remove_dir_all(&local).unwrap();
}

/// Processes whose command line is `cmdline` (NUL-separated, as /proc has it).
fn sleepers(cmdline: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == cmdline.as_bytes()))
        .filter(|e| !std::fs::read_to_string(e.path().join("stat")).unwrap_or_default().contains(") Z "))
        .count()
}

#[test]
fn a_grantees_own_code_never_runs_as_the_targets_admin_nor_outlasts_the_watchdog() {
    let d = Daemon::start(&[]);
    // As before PostgreSQL 15: every role may create in schema public.
    let (prod, port, _, _) = registered(&d, "hijack", "GRANT CREATE ON SCHEMA public TO PUBLIC");
    let g = granted(&d, &["prod", "--tables", "analytics.usage_daily", "--statement-timeout", "1s"]);
    assert!(g["cannot_take_away"].to_string().contains("REVOKE CREATE ON SCHEMA public FROM PUBLIC"), "{g}");
    let dsn = g["dsn"].as_str().unwrap().to_owned();
    // Operators and functions the daemon's own queries would find first on
    // the default search path, each granting what the grant was not given
    // if it ever ran as the admin role.
    let trap = |name: &str, args: &str, ret: &str, body: &str| {
        format!(
            "CREATE FUNCTION public.{name}({args}) RETURNS {ret} LANGUAGE plpgsql AS $f$ BEGIN \
             EXECUTE 'GRANT SELECT ON analytics.salaries TO PUBLIC'; {body} END $f$"
        )
    };
    let planted = psql_each(
        &dsn,
        &[
            "SET default_transaction_read_only = off",
            &trap("times", "numeric, integer", "numeric", "RETURN $1 * $2::numeric;"),
            "CREATE OPERATOR public.* (LEFTARG = numeric, RIGHTARG = integer, FUNCTION = public.times)",
            &trap("count", "boolean", "bigint", "RETURN 0;"),
            &trap("starts_with", "text, text", "boolean", "RETURN true;"),
        ],
    );
    assert!(planted.is_ok(), "{planted:?}");
    // A statement that catches its cancel, over and over, with the grantee's
    // own timeout off: its session is ended.
    let began = std::time::Instant::now();
    let caught = psql_each(
        &dsn,
        &[
            "SET statement_timeout = 0",
            "DO $$ BEGIN LOOP BEGIN PERFORM pg_sleep(0.2); EXCEPTION WHEN query_canceled THEN NULL; END; END LOOP; END $$",
        ],
    );
    let e = caught.expect_err("the loop ran on");
    assert!(e.contains("terminat") || e.contains("closed"), "{e}");
    assert!(began.elapsed() < std::time::Duration::from_secs(30), "{:?}", began.elapsed());
    // A fastpath function call, which no statement timeout covers, is
    // cancelled all the same.
    let began = std::time::Instant::now();
    let fastpath =
        std::process::Command::new("/usr/bin/python3").args(["-c", FASTPATH, &dsn]).output().unwrap();
    let said = String::from_utf8_lossy(&fastpath.stdout).into_owned();
    assert!(
        said.contains("canceling") || said.contains("terminat") || said.contains("server closed"),
        "{said} {fastpath:?}"
    );
    assert!(began.elapsed() < std::time::Duration::from_secs(15), "{:?}", began.elapsed());
    // PostgreSQL lets any role set its own password: a grantee that does and
    // logs in past the router has its sessions ended, in its database or any
    // other, and what it made elsewhere does not keep its role alive.
    let role = g["role"].as_str().unwrap().to_owned();
    psql_each(&dsn, &["BEGIN READ WRITE", "ALTER ROLE CURRENT_USER PASSWORD 'pwned-7c1'", "COMMIT"]).unwrap();
    let direct = |db: &str| format!("postgresql://{role}:pwned-7c1@localhost:{port}/{db}?sslmode=require");
    let elsewhere = psql_each(&direct("postgres"), &["SELECT lo_from_bytea(0, 'persist me')"]);
    assert!(elsewhere.is_ok(), "{elsewhere:?}");
    for db in ["prod", "postgres"] {
        let began = std::time::Instant::now();
        // Short statements, none past the grant's timeout: only not having
        // come through the router ends this session.
        let held = psql_each(&direct(db), &["SELECT pg_sleep(0.5)"; 30]);
        assert!(held.is_err() && began.elapsed() < std::time::Duration::from_secs(15), "{db}: {held:?}");
        let said = held.unwrap_err();
        assert!(said.contains("terminat") || said.contains("closed"), "{db}: {said}");
    }
    let events = d.ok(&["events", "--json"]);
    for reason in ["grant_statement_not_cancelled", "grant_session_not_routed", "grant_session_elsewhere"] {
        assert!(events.contains(reason), "{reason}: {events}");
    }
    // Removing the target ends its grants first: nothing is left on it.
    d.ok(&["target", "rm", "prod"]);
    assert_eq!(grant_objects(&prod), "");
    assert_eq!(sql(&prod.dsn("postgres"), "SELECT count(*) FROM pg_largeobject_metadata"), "0");
    // And no trap ever ran as the admin role.
    let leaked =
        sql(&prod.dsn("prod"), "SELECT has_table_privilege('public', 'analytics.salaries', 'SELECT')");
    assert_eq!(leaked, "f", "a grantee's function ran as the target's admin");
}

/// A fastpath function call (libpq's PQfn, as large-object clients use it)
/// of pg_sleep(20) after turning the grantee's own timeouts off; prints how
/// it ended.
const FASTPATH: &str = r#"
import ctypes, struct, sys
pq = ctypes.CDLL("libpq.so.5")
pq.PQconnectdb.restype = ctypes.c_void_p; pq.PQconnectdb.argtypes = [ctypes.c_char_p]
pq.PQstatus.argtypes = [ctypes.c_void_p]
pq.PQerrorMessage.restype = ctypes.c_char_p; pq.PQerrorMessage.argtypes = [ctypes.c_void_p]
pq.PQexec.restype = ctypes.c_void_p; pq.PQexec.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
pq.PQresultErrorMessage.restype = ctypes.c_char_p; pq.PQresultErrorMessage.argtypes = [ctypes.c_void_p]
class U(ctypes.Union): _fields_ = [("ptr", ctypes.c_void_p), ("integer", ctypes.c_int)]
class Arg(ctypes.Structure): _fields_ = [("len", ctypes.c_int), ("isint", ctypes.c_int), ("u", U)]
pq.PQfn.restype = ctypes.c_void_p
pq.PQfn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.POINTER(Arg), ctypes.c_int]
c = pq.PQconnectdb(sys.argv[1].encode())
if pq.PQstatus(c) != 0:
    print("connect failed", pq.PQerrorMessage(c)); sys.exit(1)
for q in ["SET statement_timeout = 0", "SET idle_in_transaction_session_timeout = 0", "BEGIN", "SELECT count(*) FROM usage_daily"]:
    pq.PQexec(c, q.encode())
buf = ctypes.create_string_buffer(struct.pack(">d", 20.0))
a = (Arg * 1)(); a[0].len = 8; a[0].isint = 0; a[0].u.ptr = ctypes.cast(buf, ctypes.c_void_p)
out = ctypes.create_string_buffer(64); n = ctypes.c_int(0)
r = pq.PQfn(c, 2626, out, ctypes.byref(n), 0, a, 1)
print("ended:", (pq.PQresultErrorMessage(r) or b"") + (pq.PQerrorMessage(c) or b""))
"#;
