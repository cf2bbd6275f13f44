//! Who may log in to a sandbox's server. The agent role logs in by peer
//! authentication only, from the sandbox's own OS users (its server's, which
//! the router and the gateway connect as; its exec user's) and the daemon's:
//! the server holds no password, so none can be read out of it, set inside it
//! or guessed. Every other role, and every other OS user, is refused before
//! a session starts. A golden holds the role made for the default access, so
//! a fork that asks for it makes nothing; one that asks for other access, or
//! whose golden holds no role, makes its own.

use std::process::Command;

use serde_json::Value;

use super::Scene;
use crate::harness::{psql, sql, Daemon};

/// psql on the sandbox's socket as `role`, run as `uid`:`gid` (with no other
/// groups) when given, else as the test's own user (root, the daemon's).
fn login(s: &Scene, role: &str, as_user: Option<(u32, u32)>) -> Result<String, String> {
    login_and_run(s, role, as_user, "SELECT current_user")
}

/// The same, running `sql`: its output, or psql's error.
fn login_and_run(s: &Scene, role: &str, as_user: Option<(u32, u32)>, sql: &str) -> Result<String, String> {
    let run = s.d.home.join("volume/sandboxes").join(&s.id).join("run");
    let mut cmd = match as_user {
        Some((uid, gid)) => {
            let mut c = Command::new("setpriv");
            c.args([
                format!("--reuid={uid}"),
                format!("--regid={gid}"),
                "--clear-groups".into(),
                "psql".into(),
            ]);
            c
        }
        None => Command::new("psql"),
    };
    let out = cmd
        .args(["-X", "-tA", "-h"])
        .arg(&run)
        .args(["-U", role, "-d", "app", "-c", sql])
        .env("PGPASSWORD", &s.password)
        .env("PGCONNECT_TIMEOUT", "10")
        .output()
        .expect("psql runs");
    match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned()),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

/// The socket's owner and group: the sandbox's server uid and its exec gid.
fn socket_owner(s: &Scene) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let run = s.d.home.join("volume/sandboxes").join(&s.id).join("run");
    let meta = std::fs::metadata(&run).unwrap();
    (meta.uid(), meta.gid())
}

#[test]
fn the_agent_logs_in_by_peer_from_its_own_sandbox_alone_and_the_server_holds_no_password() {
    let s = Scene::new();
    // The server holds nothing to log in with.
    // The daemon's user logs in as the admin by peer, and finds no password.
    let with_password = login_and_run(
        &s,
        "airlock_admin",
        None,
        "SELECT count(*) FROM pg_authid WHERE rolpassword IS NOT NULL",
    );
    assert_eq!(with_password.as_deref(), Ok("0"), "a role in the server has a password");

    // The router (as the sandbox's server user), the socket DSN (as the
    // daemon's user) and exec code (as the exec user) are the agent.
    assert_eq!(sql(&s.agent, "SELECT current_user"), "airlock_agent");
    assert_eq!(sql(&s.agent_socket, "SELECT current_user"), "airlock_agent");
    let exec = s.d.exec(&s.id, "id -un; psql \"$DATABASE_URL\" -XtAc 'SELECT current_user'", "30s");
    assert_eq!(exec["exit_code"], 0, "{exec}");
    let lines: Vec<&str> = exec["stdout"].as_str().unwrap().lines().collect();
    assert!(lines[0].starts_with("airlock-"), "the exec user has a name in the server's view: {exec}");
    assert_eq!(lines[1], "airlock_agent", "{exec}");

    // No other role logs in, whoever asks, with the agent's password or not.
    for role in ["airlock_owner", "airlock_reader", "postgres", "nobody_here"] {
        let err = login(&s, role, None).expect_err(role);
        assert!(err.contains("pg_hba.conf rejects connection"), "{role}: {err}");
    }
    // An OS user that reaches the socket (it has the socket's group) but is
    // not the sandbox's: refused as the agent, password or not.
    let (_, group) = socket_owner(&s);
    let err = login(&s, "airlock_agent", Some((65534, group))).expect_err("nobody is not the agent");
    assert!(err.contains("Peer authentication failed"), "{err}");
    // The neighbour's exec user, given the socket's group: its uid has no
    // name in this sandbox's view, and no line in its map.
    let neighbour_id = s.d.json(&["ls"]).as_array().unwrap().iter().find_map(|sb| {
        let id = sb["id"].as_str()?;
        (id != s.id).then(|| id.to_owned())
    });
    let neighbour_run = s.d.home.join("volume/sandboxes").join(neighbour_id.unwrap()).join("run");
    let neighbour_exec = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&neighbour_run).unwrap().gid()
    };
    assert_ne!(neighbour_exec, group);
    let err =
        login(&s, "airlock_agent", Some((neighbour_exec, group))).expect_err("the neighbour's exec user");
    assert!(
        err.contains("could not look up local user") || err.contains("Peer authentication failed"),
        "{err}"
    );

    // A password the agent sets on its role (refused by the guard, or not)
    // opens nothing and closes nothing: the router still logs in.
    let _ = psql(&s.agent, "ALTER ROLE airlock_agent PASSWORD 'chosen-by-the-agent'");
    assert_eq!(sql(&s.agent, "SELECT count(*) FROM orders"), "1000");
    s.untouched();
}

fn ready_steps(d: &Daemon, id: &str) -> Value {
    let events = d.json(&["events", "--sandbox", id]);
    let ready =
        events.as_array().unwrap().iter().find(|e| e["kind"] == "ready").cloned().expect("a ready event");
    ready["detail"]["steps"].clone()
}

#[test]
fn a_golden_holds_the_default_agent_role_so_a_fork_that_asks_for_it_makes_nothing() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let made = d.home.join("volume/goldens/shop/1/agent-role.sql");
    assert!(made.is_file(), "the golden notes the role it holds");

    // The default access: the role is the golden's, and is what it should be.
    let forked = d.fork("shop", &[]);
    let (id, dsn) = (forked["id"].as_str().unwrap(), crate::harness::dsn(&forked));
    assert_eq!(ready_steps(&d, id)["credential_ms"], 0.0, "a default fork made its role");
    assert_eq!(sql(&dsn, "SHOW statement_timeout"), "30s");
    assert_eq!(
        sql(&dsn, "SELECT rolconnlimit FROM pg_roles WHERE rolname = current_user"),
        forked["access"]["limits"]["connection_limit"].to_string()
    );
    sql(&dsn, "CREATE TABLE mine (x int); INSERT INTO mine VALUES (1)");

    // Other access: the fork makes the role it asked for, in place of the golden's.
    let forked =
        d.fork("shop", &["--mode", "readonly", "--statement-timeout", "5s", "--connection-limit", "3"]);
    let (id, dsn) = (forked["id"].as_str().unwrap(), crate::harness::dsn(&forked));
    assert!(ready_steps(&d, id)["credential_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(sql(&dsn, "SHOW statement_timeout"), "5s");
    assert_eq!(sql(&dsn, "SELECT rolconnlimit FROM pg_roles WHERE rolname = current_user"), "3");
    let err = psql(&dsn, "DELETE FROM orders").expect_err("read-only");
    assert!(err.contains("read-only"), "{err}");

    // A golden made before goldens held the role (no note), or whose note is
    // not what this daemon would run: the fork makes its own.
    for note in [None, Some("CREATE ROLE airlock_agent LOGIN SUPERUSER;")] {
        match note {
            None => std::fs::remove_file(&made).unwrap(),
            Some(text) => std::fs::write(&made, text).unwrap(),
        }
        let forked = d.fork("shop", &[]);
        let (id, dsn) = (forked["id"].as_str().unwrap(), crate::harness::dsn(&forked));
        assert!(ready_steps(&d, id)["credential_ms"].as_f64().unwrap() > 0.0, "{note:?}");
        assert_eq!(sql(&dsn, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"), "f");
        assert_eq!(sql(&dsn, "SELECT count(*) FROM orders"), "1000");
    }
}
