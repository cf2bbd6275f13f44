//! Live targets: a "production" PostgreSQL of the test's own, reachable only
//! over TLS with a password, registered with its admin DSN on standard input;
//! what registering checks and refuses, and that the DSN's secret is kept by
//! the daemon alone.

use std::path::PathBuf;

use serde_json::Value;

use crate::harness::{sql, Daemon};
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
