//! Credentials and exposure: no superuser anywhere, admin only by the daemon's OS
//! identity, no TCP port, secrets nowhere but the fork's answer.

use std::process::Command;

use crate::harness::{dsn, psql, split_password, sql, Daemon};

#[test]
fn the_agent_credential_is_not_a_superuser_and_cannot_become_one() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let url = dsn(&sb);
    // An owner may create databases of its own (test runners do: see
    // `databases::*`); the guard keeps them its own.
    assert_eq!(
        sql(&url, "SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = current_user"),
        "f|f|t"
    );
    assert_eq!(sql(&url, "SELECT count(*) FROM pg_roles WHERE rolsuper AND rolname <> 'airlock_admin'"), "0");
    for attempt in [
        "ALTER ROLE airlock_agent SUPERUSER",
        "SET ROLE airlock_admin",
        "SET SESSION AUTHORIZATION airlock_admin",
        "CREATE ROLE intruder SUPERUSER",
        "CREATE ROLE intruder LOGIN",
        "GRANT airlock_admin TO airlock_agent",
        "ALTER ROLE airlock_owner SUPERUSER",
        "CREATE DATABASE other OWNER airlock_owner",
        "CREATE DATABASE other IS_TEMPLATE true",
        "ALTER SYSTEM SET fsync = on",
    ] {
        assert!(psql(&url, attempt).is_err(), "{attempt} should fail");
    }
    assert_eq!(sql(&url, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"), "f");
}

#[test]
fn a_password_changed_inside_a_sandbox_does_not_lock_its_harness_out() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let id = sb["id"].as_str().unwrap();
    let url = dsn(&sb);
    // The agent cannot change its password, in any form the grammar has.
    for attempt in [
        "ALTER ROLE airlock_agent PASSWORD 'mine'",
        "ALTER USER CURRENT_USER WITH ENCRYPTED PASSWORD 'mine'",
        "ALTER ROLE SESSION_USER PASSWORD NULL",
        "ALTER ROLE airlock_agent NOLOGIN",
        "ALTER ROLE airlock_agent VALID UNTIL '2000-01-01'",
    ] {
        assert!(psql(&url, attempt).is_err(), "{attempt} should fail");
    }
    // Should it change anyway (here the admin changes it, as a way past the
    // guard would), the DSN still gets in: the router checks its own verifier,
    // and the router and the gateway log in to the server by peer, which no
    // password (or its expiry) opens or closes.
    let run = d.home.join("volume/sandboxes").join(id).join("run");
    let changed = Command::new("psql")
        .args(["-X", "-q", "-h"])
        .arg(&run)
        .args(["-U", "airlock_admin", "-d", "app", "-c"])
        .arg("ALTER ROLE airlock_agent PASSWORD 'chosen-by-the-agent' VALID UNTIL '2000-01-01'")
        .output()
        .unwrap();
    assert!(changed.status.success(), "{changed:?}");
    assert_eq!(sql(&url, "SELECT count(*) FROM orders"), "1000");
    let (status, body) = d.api("POST", &format!("/v1/sandboxes/{id}/sql"), r#"{"sql": "SELECT 1"}"#);
    assert_eq!(status, 200, "{body}");
    let out = d.exec(id, "psql \"$DATABASE_URL\" -XtAc 'SELECT current_user'", "30s");
    assert_eq!(out["stdout"].as_str().map(str::trim), Some("airlock_agent"), "{out}");
    // The password set inside means nothing at the router.
    let (plain, _) = split_password(&url);
    let out = Command::new("psql")
        .arg(&plain)
        .args(["-X", "-c", "SELECT 1"])
        .env("PGPASSWORD", "chosen-by-the-agent")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("password authentication failed"), "{out:?}");
}

#[test]
fn admin_access_needs_the_daemons_os_identity_and_no_password_exists() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let run = d.home.join("volume/sandboxes").join(sb["id"].as_str().unwrap()).join("run");
    let admin = |uid: Option<(u32, u32)>| {
        let mut cmd = Command::new("psql");
        cmd.args(["-X", "-t", "-A", "-h"]).arg(&run).args(["-U", "airlock_admin", "-d", "app", "-c"]);
        cmd.arg("SELECT count(*) FROM pg_authid WHERE rolpassword IS NOT NULL AND rolsuper");
        cmd.env("PGPASSWORD", "guess");
        if let Some((u, g)) = uid {
            use std::os::unix::process::CommandExt;
            cmd.uid(u).gid(g);
        }
        cmd.output().unwrap()
    };
    // The daemon's own OS user gets in by peer authentication, and no superuser has a password.
    let out = admin(None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0");
    if nix::unistd::geteuid().is_root() {
        // Any other OS user is refused, even the one the instance runs as, password or not.
        let pid = d.postmasters()[0];
        let meta = std::fs::metadata(format!("/proc/{pid}"));
        use std::os::unix::fs::MetadataExt;
        let meta = meta.unwrap();
        let out = admin(Some((meta.uid(), meta.gid())));
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("authentication failed"), "{out:?}");
    }
    // The agent cannot read password hashes either.
    assert!(psql(&dsn(&sb), "SELECT rolpassword FROM pg_authid").is_err());
}

#[test]
fn a_sandbox_listens_on_no_tcp_port() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    assert_eq!(sql(&dsn(&sb), "SHOW listen_addresses"), "");
    let pid = d.postmasters()[0];
    let listening = tcp_listen_inodes();
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap();
    for fd in fds.flatten() {
        let target = std::fs::read_link(fd.path()).unwrap_or_default();
        let t = target.to_string_lossy();
        if let Some(inode) = t.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
            assert!(!listening.contains(&inode.to_owned()), "postmaster {pid} has a listening TCP socket");
        }
    }
    // Its socket directory is the instance's OS user's; as root, the exec user's
    // group may reach the socket inside, and nobody else may even look.
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let run = d.home.join("volume/sandboxes").join(sb["id"].as_str().unwrap()).join("run");
    let meta = std::fs::metadata(&run).unwrap();
    if nix::unistd::geteuid().is_root() {
        assert_eq!(meta.permissions().mode() & 0o777, 0o750);
        assert_eq!(meta.gid(), meta.uid() + 1, "the socket group is the exec user's");
        let socket = std::fs::metadata(run.join(".s.PGSQL.5432")).unwrap();
        assert_eq!((socket.permissions().mode() & 0o777, socket.gid()), (0o770, meta.gid()));
    } else {
        assert_eq!(meta.permissions().mode() & 0o777, 0o700);
    }
}

fn tcp_listen_inodes() -> Vec<String> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for line in std::fs::read_to_string(table).unwrap_or_default().lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.get(3) == Some(&"0A") {
                inodes.push(cols[9].to_owned());
            }
        }
    }
    inodes
}

#[test]
fn each_sandbox_has_its_own_credential_that_is_never_logged_or_kept_in_the_golden() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let a = d.fork("shop", &[]);
    let b = d.fork("shop", &[]);
    let (_, pw_a) = split_password(&dsn(&a));
    let (_, pw_b) = split_password(&dsn(&b));
    assert_ne!(pw_a, pw_b);
    assert!(pw_a.len() >= 32);
    // A's password does not open B.
    let (plain_b, _) = split_password(&dsn(&b));
    let out = Command::new("psql")
        .arg(&plain_b)
        .args(["-XtAc", "SELECT 1"])
        .env("PGPASSWORD", &pw_a)
        .output()
        .unwrap();
    assert!(!out.status.success());
    // Not in the log, the events, the listing or any golden file.
    assert!(!d.log().contains(&pw_a));
    assert!(!d.ok(&["events", "--json"]).contains(&pw_a));
    assert!(!d.ok(&["ls", "--json"]).contains(&pw_a));
    assert!(!d.ok(&["show", a["id"].as_str().unwrap(), "--json"]).contains(&pw_a));
    // The golden holds the agent role for the default access (so a default
    // fork makes nothing), never a credential: no password, no verifier.
    for entry in walk(&d.home.join("volume/goldens")) {
        let bytes = std::fs::read(&entry).unwrap();
        assert!(!contains(&bytes, pw_a.as_bytes()), "{} holds the password", entry.display());
        assert!(!contains(&bytes, b"SCRAM-SHA-256$"), "{} holds a verifier", entry.display());
    }
    let made = std::fs::read_to_string(d.home.join("volume/goldens/shop/1/agent-role.sql")).unwrap();
    assert!(made.contains("CREATE ROLE airlock_agent LOGIN") && !made.contains("PASSWORD"), "{made}");
    // Not in any process's command line.
    for p in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmd) = std::fs::read(p.path().join("cmdline")) {
            assert!(!contains(&cmd, pw_a.as_bytes()), "process {:?} shows the password", p.file_name());
        }
    }
}

fn walk(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p))
        } else {
            out.push(p)
        }
    }
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn instances_run_as_an_unprivileged_user_when_the_daemon_is_root() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    d.fork("shop", &[]);
    let doctor = d.json(&["doctor"]);
    let pid = d.postmasters()[0];
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid: u32 = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    if nix::unistd::geteuid().is_root() {
        assert_ne!(uid, 0, "postgres runs as root");
        assert_eq!(doctor["instance_user"], "airlock");
        // A leased identity of the sandbox range: no passwd entry, not the system range.
        assert!((1_000_000_000..1_000_065_536).contains(&uid), "uid {uid}");
        assert!(nix::unistd::User::from_uid(uid.into()).unwrap().is_none());
        // Goldens belong to the daemon, so the instance user cannot change them.
        use std::os::unix::fs::MetadataExt;
        let golden = std::fs::metadata(d.home.join("volume/goldens/shop/1/pgdata/PG_VERSION")).unwrap();
        assert_eq!(golden.uid(), 0);
    } else {
        assert_eq!(uid, nix::unistd::geteuid().as_raw());
    }
}
