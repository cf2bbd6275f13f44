//! The router: one TCP port in front of every sandbox, driven with real psql and
//! with raw (hostile) bytes.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::{dsn, psql, spawn_psql, split_password, sql, Daemon};

/// Reads what the router sends until it closes (or `limit` passes); returns the bytes
/// and whether it closed.
fn read_until_closed(s: &mut TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (got, true),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (got, true),
            Err(_) => return (got, false),
        }
    }
}

fn with_sslmode(dsn: &str, mode: &str) -> String {
    let base = dsn.split('?').next().unwrap();
    format!("{base}?sslmode={mode}")
}

#[test]
fn tls_verify_full_and_plaintext_both_reach_the_sandbox() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let url = dsn(&sb);
    assert!(
        url.contains(&format!(
            "@{}/{}?sslmode=verify-full&sslrootcert=",
            d.router,
            sb["id"].as_str().unwrap()
        )),
        "{url}"
    );
    assert_eq!(
        sql(&url, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"),
        "f",
        "TLS ends at the router"
    );
    // The TLS session is the router's: psql reports it.
    let (plain, pw) = split_password(&url);
    let out = Command::new("psql")
        .arg(&plain)
        .args(["-XtAc", "\\conninfo"])
        .env("PGPASSWORD", &pw)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("SSL connection"), "{out:?}");
    // The router authenticates with SCRAM-SHA-256-PLUS, bound to its certificate.
    assert_eq!(sql(&format!("{url}&channel_binding=require"), "SELECT 1"), "1");
    let unbound = psql(&format!("{}&channel_binding=require", with_sslmode(&url, "disable")), "SELECT 1");
    assert!(unbound.unwrap_err().contains("channel binding"));
    // verify-full checks the name: the same address under a name the certificate lacks fails.
    let by_other_name =
        url.replace("@127.0.0.1:", "@router.invalid:").replace("?sslmode", "?hostaddr=127.0.0.1&sslmode");
    assert!(psql(&by_other_name, "SELECT 1").unwrap_err().contains("does not match"));
    // ... and the CA: without the generated one, verification fails.
    let no_ca = url.split("&sslrootcert=").next().unwrap().to_owned() + "&sslrootcert=/dev/null";
    assert!(psql(&no_ca, "SELECT 1").is_err());
    // sslmode=require and plaintext work too (TLS is optional by default).
    assert_eq!(sql(&with_sslmode(&url, "require"), "SELECT count(*) FROM orders"), "1000");
    assert_eq!(sql(&with_sslmode(&url, "disable"), "SELECT count(*) FROM orders"), "1000");
    // By name as well as by id.
    d.fork("shop", &["--name", "alpha"]);
    let alpha = d.ok(&["dsn", "alpha"]);
    let by_name = alpha
        .trim()
        .replace(&format!("/{}?", alpha.split('/').nth(3).unwrap().split('?').next().unwrap()), "/alpha?");
    assert_eq!(sql(&by_name, "SELECT 1"), "1");
}

#[test]
fn required_tls_refuses_plaintext_with_a_hint() {
    let d = Daemon::start(&["--tls", "required"]);
    d.shop("shop");
    let url = dsn(&d.fork("shop", &[]));
    let err = psql(&with_sslmode(&url, "disable"), "SELECT 1").unwrap_err();
    assert!(err.contains("accepts only TLS connections") && err.contains("sslmode=require"), "{err}");
    assert_eq!(sql(&url, "SELECT 1"), "1");
}

#[test]
fn a_cancel_request_reaches_the_right_sandbox() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let url = with_sslmode(&dsn(&d.fork("shop", &[])), "disable");
    let other = dsn(&d.fork("shop", &[]));
    // A plaintext session holds its client itself (the router handed it over):
    // its cancel requests still come through the router.
    assert_eq!(sql(&url, "SHOW airlock.handoff"), "on");
    let slow = spawn_psql(&url, "SELECT pg_sleep(30)");
    // Wait until the query runs, then interrupt psql: it sends a cancel request.
    let deadline = Instant::now() + Duration::from_secs(10);
    while sql(&url, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep%'") != "1" {
        assert!(Instant::now() < deadline, "the slow query never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let t = Instant::now();
    assert!(Command::new("kill").args(["-INT", &slow.id().to_string()]).status().unwrap().success());
    let out = slow.wait_with_output().unwrap();
    assert!(t.elapsed() < Duration::from_secs(10));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("canceling statement due to user request"),
        "{out:?}"
    );
    assert_eq!(sql(&other, "SELECT 1"), "1");
}

#[test]
fn a_sandbox_deleted_while_connected_ends_the_session_at_once() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    // TLS sessions and plaintext ones (relayed by different code) alike.
    for sslmode in ["verify-full", "disable"] {
        let sb = d.fork("shop", &[]);
        let url = if sslmode == "disable" { with_sslmode(&dsn(&sb), "disable") } else { dsn(&sb) };
        let session = spawn_psql(&url, "SELECT pg_sleep(60)");
        std::thread::sleep(Duration::from_millis(500));
        let t = Instant::now();
        d.ok(&["rm", sb["id"].as_str().unwrap()]);
        let out = session.wait_with_output().unwrap();
        assert!(t.elapsed() < Duration::from_secs(10), "the {sslmode} client hung");
        assert!(!out.status.success());
        // And a new connection is told the sandbox is gone, with a hint.
        let err = psql(&url, "SELECT 1").unwrap_err();
        assert!(err.contains("does not exist") && err.contains("fork a new one"), "{err}");
    }
}

#[test]
fn garbage_slow_and_flooding_clients_are_bounded() {
    let d = Daemon::start(&["--router-startup-timeout", "1s", "--router-max-connections", "4"]);
    d.shop("shop");
    let url = dsn(&d.fork("shop", &[]));
    // Garbage: an HTTP request, a huge length, a wrong protocol version.
    for bytes in [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        vec![0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0],
        vec![0, 0, 0, 8, 0, 2, 0, 0],
    ] {
        let mut s = TcpStream::connect(&d.router).unwrap();
        s.write_all(&bytes).unwrap();
        let (got, closed) = read_until_closed(&mut s, Duration::from_secs(5));
        assert!(closed, "the router kept a garbage connection open");
        assert!(got.is_empty() || got[0] == b'E', "{got:?}");
    }
    // A client that never finishes its startup packet is dropped after the timeout.
    let mut slow = TcpStream::connect(&d.router).unwrap();
    slow.write_all(&[0, 0, 0, 40, 0, 3]).unwrap();
    let t = Instant::now();
    let (_, closed) = read_until_closed(&mut slow, Duration::from_secs(5));
    assert!(closed && t.elapsed() < Duration::from_secs(4), "the slow client was kept {:?}", t.elapsed());
    // A flood past the connection limit: a newcomer takes the slot of the
    // client not yet authenticated that came first, so the router serves at once.
    let mut held: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(&d.router).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(psql(&url, "SELECT 1").as_deref(), Ok("1"));
    let (_, closed) = read_until_closed(&mut held[0], Duration::from_secs(5));
    assert!(closed, "the first idle client kept its slot");
    drop(held);
    // Authenticated sessions keep theirs: with every slot held by one, a
    // newcomer is refused at once.
    let sessions: Vec<_> =
        (0..4).map(|_| crate::harness::spawn_psql(&url, "SELECT pg_sleep(4), 'kept'")).collect();
    // (A newcomer before they authenticated could take one's slot.)
    std::thread::sleep(Duration::from_secs(1));
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let mut extra = TcpStream::connect(&d.router).unwrap();
        let (got, closed) = read_until_closed(&mut extra, Duration::from_secs(5));
        if closed && String::from_utf8_lossy(&got).contains("too many connections") {
            break;
        }
        assert!(Instant::now() < deadline, "a newcomer was never refused: {got:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    for session in sessions {
        let out = session.wait_with_output().unwrap();
        assert!(String::from_utf8_lossy(&out.stdout).contains("kept"), "{out:?}");
    }
    assert_eq!(psql(&url, "SELECT 1").as_deref(), Ok("1"));
}

#[test]
fn each_connection_is_an_event_without_secrets() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let url = dsn(&sb);
    sql(&url, "SELECT 1");
    let (plain, _) = split_password(&url);
    let bad = plain.replace("airlock_agent@", "airlock_agent:wrong@");
    assert!(psql(&bad, "SELECT 1").unwrap_err().contains("password authentication failed"));
    // Connection events are written off the client's path: give the last a moment.
    let kinds = || -> Vec<String> {
        let events = crate::harness::lifecycle(&d.json(&["events", "--sandbox", sb["id"].as_str().unwrap()]));
        events.iter().map(|e| e["kind"].as_str().unwrap().to_owned()).collect()
    };
    d.wait_for(std::time::Duration::from_secs(10), "the refusal's event", || kinds().len() >= 4);
    assert_eq!(kinds(), ["created", "ready", "connected", "connection_refused"]);
    let (_, pw) = split_password(&url);
    let all = d.ok(&["events", "--json"]);
    assert!(!all.contains(&pw) && !all.contains("wrong"));
    assert!(!d.log().contains(&pw));
}

#[test]
fn a_configured_certificate_is_served_and_a_bad_one_is_a_clear_error() {
    // Another daemon's generated CA and certificate stand in for an operator's own.
    let issuer = Daemon::start(&[]);
    let tls = issuer.home.join("tls");
    let (cert, key) = (tls.join("server.crt"), tls.join("server.key"));
    let d = Daemon::start(&["--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()]);
    d.shop("shop");
    let url = dsn(&d.fork("shop", &[]));
    assert!(url.ends_with("?sslmode=require"), "{url}");
    assert!(!d.home.join("tls/ca.key").exists(), "no CA generated when a certificate is configured");
    assert_eq!(sql(&url, "SELECT 1"), "1");
    let verified = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        url.split('?').next().unwrap(),
        tls.join("ca.crt").display()
    );
    assert_eq!(sql(&verified, "SELECT 1"), "1");
    // A key that is not a key: the daemon refuses to start and says which file.
    let mut bad = Daemon::unstarted(
        crate::harness::fresh_home(&crate::harness::plain_base()),
        &["--tls-cert", cert.to_str().unwrap(), "--tls-key", cert.to_str().unwrap()],
    );
    let out = bad.serve_fails();
    assert!(out.contains("the router's TLS key") && out.contains("server.crt"), "{out}");
}

#[test]
fn large_results_and_copy_pass_through_tls_and_plaintext_intact() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let url = dsn(&d.fork("shop", &[]));
    let rows = d.home.join("rows.csv");
    let text: String = (0..200_000u64).map(|i| format!("{i},{:x}{:x}\n", i * 7919, i * 104_729)).collect();
    std::fs::write(&rows, &text).unwrap();
    for (n, url) in [with_sslmode(&url, "disable"), url.clone()].iter().enumerate() {
        let table = format!("t{n}");
        sql(url, &format!("CREATE TABLE {table} (id int, v text)"));
        // Several MB up (COPY from the client) and down (one large value, then all rows).
        let (plain, pw) = split_password(url);
        let out = Command::new("psql")
            .arg(&plain)
            .args(["-XtAc", &format!("\\copy {table} FROM '{}' CSV", rows.display())])
            .env("PGPASSWORD", &pw)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(sql(url, &format!("SELECT count(*) FROM {table}")), "200000");
        let big = sql(url, "SELECT string_agg(md5(g::text), '') FROM generate_series(1, 100000) g");
        assert_eq!(big.len(), 3_200_000);
        let back = sql(url, &format!("SELECT string_agg(id || ',' || v, E'\\n' ORDER BY id) FROM {table}"));
        assert_eq!(back + "\n", text);
    }
}

/// The router process's pid, from the state it writes.
fn router_pid(d: &Daemon) -> i32 {
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.home.join("router.json")).unwrap()).unwrap();
    state["pid"].as_i64().unwrap() as i32
}

#[test]
fn sessions_through_the_router_outlive_daemon_restarts() {
    let mut d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let url = dsn(&sb);
    let router = router_pid(&d);
    let script = d.home.join("select.sql");
    std::fs::write(&script, "SELECT count(*) FROM orders;\n").unwrap();
    let (plain, password) = split_password(&url);
    let bench = Command::new("pgbench")
        .args(["-n", "-c", "2", "-T", "8", "-f"])
        .arg(&script)
        .arg(&plain)
        .env("PGPASSWORD", &password)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    // A crash, then a clean stop, each followed by a new daemon.
    d.kill9();
    // With no daemon at all, running sandboxes still take new clients.
    assert_eq!(sql(&url, "SELECT count(*) FROM orders"), "1000");
    std::thread::sleep(Duration::from_millis(500));
    d.spawn();
    std::thread::sleep(Duration::from_secs(1));
    d.ok(&["daemon", "stop"]);
    std::thread::sleep(Duration::from_millis(500));
    d.spawn();
    let out = bench.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "pgbench failed: {text} {}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("number of failed transactions: 0"), "{text}");
    assert_eq!(router_pid(&d), router, "the same router served throughout");
    assert!(d.log().contains("adopted the running router"), "{}", d.log());

    // A router that dies is started again by the daemon.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(router), nix::sys::signal::Signal::SIGKILL).unwrap();
    d.wait_for(Duration::from_secs(10), "a new router", || {
        std::fs::read(d.home.join("router.json")).is_ok()
            && router_pid(&d) != router
            && psql(&url, "SELECT 1").is_ok()
    });
    // A daemon with other router settings replaces the router (which ends its
    // sessions) rather than keep settings it was not given.
    let third = router_pid(&d);
    d.kill9();
    d.args.extend(["--tls".to_owned(), "required".to_owned()]);
    d.spawn();
    assert_ne!(router_pid(&d), third);
    assert!(d.log().contains("the router's settings changed: replacing it"));
    assert!(psql(&with_sslmode(&url, "disable"), "SELECT 1").unwrap_err().contains("only TLS"));
    assert_eq!(sql(&url, "SELECT 1"), "1");
    // `daemon stop --with-router` stops it.
    let stopped = d.json(&["daemon", "stop", "--with-router"]);
    assert_eq!(stopped["router_stopped"], true);
    assert!(!d.home.join("router.json").exists(), "the router is gone");
    assert!(psql(&url, "SELECT 1").is_err());
}

/// The router's lock held by a process that is not the router the data root
/// names (that one died, and another took the lock): stopping it ends at
/// once, and signals nobody again and again.
#[test]
fn stopping_a_router_whose_lock_another_process_holds_ends() {
    let mut d = Daemon::start(&[]);
    let router = router_pid(&d);
    // No daemon to start another router.
    d.kill9();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(router), nix::sys::signal::Signal::SIGKILL).unwrap();
    let lock_path = d.home.join("router.lock");
    let mut held = None;
    d.wait_for(Duration::from_secs(10), "the dead router's lock", || {
        let file = std::fs::File::open(&lock_path).unwrap();
        held = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).ok();
        held.is_some()
    });
    assert!(d.home.join("router.json").exists(), "the dead router's state is left");
    let t = Instant::now();
    let stopped = d.json(&["daemon", "stop", "--with-router"]);
    assert!(t.elapsed() < Duration::from_secs(20), "stopping waited {:?}", t.elapsed());
    assert_eq!(stopped["stopped"], false, "{stopped}");
    drop(held);
}

#[test]
fn without_its_daemon_the_router_keeps_expiry_and_says_why_it_cannot_wake() {
    let mut d = Daemon::start(&[]);
    d.shop("shop");
    let asleep = d.fork("shop", &["--idle-suspend", "0"]);
    d.ok(&["suspend", asleep["id"].as_str().unwrap()]);
    let short = d.fork("shop", &["--ttl", "5s"]);
    let mut held = spawn_psql(&dsn(&short), "SELECT pg_sleep(60)");
    // A plaintext session, which holds its client itself, is cut all the same,
    // and its query cancelled, though it turned off the server's own check.
    let mut handed = spawn_psql(
        &with_sslmode(&dsn(&short), "disable"),
        "SET client_connection_check_interval = 0; SELECT pg_sleep(60)",
    );
    std::thread::sleep(Duration::from_millis(500));
    d.kill9();
    // Waking takes the daemon: the client is told so, not left hanging.
    let e = psql(&dsn(&asleep), "SELECT 1").unwrap_err();
    assert!(e.contains("daemon") && e.contains("suspended"), "{e}");
    // At its expiry the open session is cut and new clients are refused.
    let deadline = Instant::now() + Duration::from_secs(15);
    for session in [&mut held, &mut handed] {
        while session.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "the session outlived its sandbox's expiry");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    assert!(psql(&dsn(&short), "SELECT 1").unwrap_err().contains("has expired"));
    let running = || {
        std::fs::read_dir("/proc").unwrap().flatten().any(|p| {
            std::fs::read(p.path().join("cmdline")).is_ok_and(|c| {
                String::from_utf8_lossy(&c).contains("airlock_agent")
                    && String::from_utf8_lossy(&c).contains("SELECT")
            })
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while running() {
        assert!(Instant::now() < deadline, "a cut session's query ran on");
        std::thread::sleep(Duration::from_millis(100));
    }
    d.spawn();
}

/// The router ends TLS, so from SQL every session would look like a local
/// plaintext one: `airlock.connection` says how its client reached the router
/// (address, TLS version and cipher, channel binding). Only the router
/// can set it: the handshake that lets it is reported to the router alone and
/// readable by no SQL, and the agent can only blank the setting.
#[test]
fn a_session_can_tell_how_its_client_reached_the_router() {
    use crate::wire::{startup_packet, Raw};
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let url = dsn(&sb);
    let shown = "SHOW airlock.connection";
    let tls = sql(&format!("{url}&channel_binding=require"), shown);
    assert!(tls.starts_with("via=router client=127.0.0.1:"), "{tls}");
    assert!(
        tls.contains(" tls=TLSv1.3 cipher=TLS13_") && tls.ends_with(" channel_binding=tls-server-end-point"),
        "{tls}"
    );
    let plain = sql(&with_sslmode(&url, "disable"), shown);
    assert!(
        plain.starts_with("via=router client=127.0.0.1:")
            && plain.ends_with(" tls=none channel_binding=none"),
        "{plain}"
    );
    // Not through the router: nothing to say.
    assert_eq!(sql(sb["socket_dsn"].as_str().unwrap(), shown), "");

    // The agent cannot set it, nor learn the handshake that would let it.
    for (attempt, said) in [
        (
            "SET airlock.connection = 'via=router client=10.0.0.1:1 tls=TLSv1.3'",
            "set by Airlock's router alone",
        ),
        ("SELECT set_config('airlock.connection', 'x:y', false)", "set by Airlock's router alone"),
        ("SHOW airlock.handshake", "must be superuser"),
        ("SELECT current_setting('airlock.handshake')", "must be superuser"),
    ] {
        let refused = psql(&url, attempt).expect_err(attempt);
        assert!(refused.contains(said), "{attempt}: {refused}");
    }
    assert_eq!(sql(&url, "SELECT count(*) FROM pg_settings WHERE name = 'airlock.handshake'"), "0");
    assert_eq!(sql(&url, "RESET airlock.connection; SHOW airlock.connection"), "", "it may only be blanked");
    let (_, password) = split_password(&url);
    let id = sb["id"].as_str().unwrap();
    let session = Raw::connect(
        &d.router,
        &startup_packet(196608, &[("user", "airlock_agent"), ("database", id)]),
        &password,
    )
    .unwrap();
    assert!(session.reported.iter().any(|p| p == "server_version"), "{:?}", session.reported);
    assert!(
        !session.reported.iter().any(|p| p.contains("handshake")),
        "the handshake reached the client: {:?}",
        session.reported
    );
    // A client asking for it at startup is refused, by name.
    let forged = format!("{}&options=-c%20airlock.connection%3Dx", with_sslmode(&url, "disable"));
    assert!(psql(&forged, "SELECT 1").unwrap_err().contains("set by Airlock's router alone"));
    // Parallel workers take their leader's value.
    let parallel = "SET force_parallel_mode = on; SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; \
                    SET min_parallel_table_scan_size = 0; SELECT count(*) FROM orders";
    assert_eq!(sql(&url, parallel), "1000");
    // A client encoding that can swallow a quote's escape puts nothing of a
    // setting's value into SQL: the settings go as parameters.
    let payload = "\u{95}'; SELECT pg_catalog.set_config($$my.owned$$, $$yes$$, false) --";
    let params =
        [("user", "airlock_agent"), ("database", id), ("client_encoding", "SJIS"), ("my.x", payload)];
    if let Ok(mut s) = Raw::connect(&d.router, &startup_packet(196608, &params), &password) {
        let owned = s.query("SELECT coalesce(current_setting('my.owned', true), '')").unwrap();
        assert_eq!(owned, vec![vec![Some(String::new())]], "a setting's value ran as SQL");
    }
    // (A pool member's parked session is told too: `pool::forks_claim_from_the_pool_*`.)
}

/// A plaintext client is handed to its sandbox's server once the router has
/// authenticated it: its bytes pass through no proxy, and every guarantee the
/// router gave still holds. (Cancel requests: `a_cancel_request_reaches_the_right_sandbox`;
/// the cut at expiry: `without_its_daemon_the_router_keeps_expiry_*`.)
#[test]
fn a_plaintext_client_is_handed_to_its_server_and_keeps_every_guarantee() {
    use crate::wire::{startup_packet, Raw};
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &["--idle-suspend", "2s"]);
    let id = sb["id"].as_str().unwrap().to_owned();
    let url = dsn(&sb);
    let plain = with_sslmode(&url, "disable");
    assert_eq!(sql(&plain, "SHOW airlock.handoff"), "on");
    // TLS ends in the router, so a TLS session is relayed; so is one with a
    // setting the router SETs as the agent.
    assert_eq!(sql(&url, "SHOW airlock.handoff"), "off");
    assert_eq!(sql(&format!("{plain}&options=-c%20work_mem%3D8MB"), "SHOW airlock.handoff"), "off");
    // It says what happened, not what was asked: on the private socket, asked
    // for in options (never read as a request), it is off.
    let asked = format!("{}&options=-c%20airlock.handoff%3Don", sb["socket_dsn"].as_str().unwrap());
    assert_eq!(sql(&asked, "SHOW airlock.handoff"), "off");
    // airlock.connection is the router's, and RESET blanks it, as in a relayed session.
    assert_eq!(sql(&plain, "RESET airlock.connection; SHOW airlock.connection"), "");

    // The agent, and nothing more.
    let who = "SELECT current_user || ' ' || session_user || ' ' || rolsuper FROM pg_roles WHERE rolname = current_user";
    assert_eq!(sql(&plain, who), "airlock_agent airlock_agent false");
    for attempt in [
        "SET ROLE airlock_admin",
        "SET SESSION AUTHORIZATION airlock_admin",
        "ALTER ROLE airlock_agent SUPERUSER",
        "SELECT set_config('airlock.connection', 'via=router client=10.0.0.1:1 tls=TLSv1.3', false)",
    ] {
        assert!(psql(&plain, attempt).is_err(), "{attempt} was allowed in a handed-off session");
    }
    // Its handshake never reaches the client, and was spent on what the router said.
    let (_, password) = split_password(&url);
    let mut raw = Raw::connect(
        &d.router,
        &startup_packet(196608, &[("user", "airlock_agent"), ("database", &id)]),
        &password,
    )
    .unwrap();
    assert!(!raw.reported.iter().any(|p| p.contains("handshake")), "{:?}", raw.reported);
    let said = raw
        .query("SELECT current_setting('airlock.handoff'), current_setting('airlock.connection')")
        .unwrap();
    assert_eq!(said[0][0].as_deref(), Some("on"));
    assert!(said[0][1].as_deref().unwrap().starts_with("via=router client=127.0.0.1:"), "{said:?}");

    // No proxy in the way: with the router stopped, the session still answers.
    let router = router_pid(&d);
    assert!(Command::new("kill").args(["-STOP", &router.to_string()]).status().unwrap().success());
    let answered = raw.query("SELECT 41 + 1");
    assert!(Command::new("kill").args(["-CONT", &router.to_string()]).status().unwrap().success());
    assert_eq!(answered.unwrap(), vec![vec![Some("42".to_owned())]]);

    // Its connection is written down, as every connection is.
    let handed_off = || {
        crate::harness::lifecycle(&d.json(&["events", "--sandbox", &id]))
            .into_iter()
            .filter(|e| e["kind"] == "connected" && e["detail"]["phases"]["handoff"] == true)
            .count()
    };
    d.wait_for(Duration::from_secs(10), "the handed-off sessions' events", || handed_off() >= 2);

    // While a handed-off session is open the sandbox is in use, however quiet;
    // once it ends the router sees it, and idle suspend follows.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(d.json(&["show", &id])["state"], "running", "suspended under an open session");
    drop(raw);
    d.wait_for(Duration::from_secs(20), "idle suspend after the session ended", || {
        d.json(&["show", &id])["state"] == "suspended"
    });
    // And it wakes for the next one, handed off again.
    assert_eq!(sql(&plain, "SHOW airlock.handoff"), "on");

    // An operator may have every session relayed.
    let relaying = Daemon::start(&["--router-handoff", "off"]);
    relaying.shop("shop");
    let plain = with_sslmode(&dsn(&relaying.fork("shop", &[])), "disable");
    assert_eq!(sql(&plain, "SHOW airlock.handoff"), "off");
}

#[test]
fn the_routers_unix_socket_serves_any_local_user_with_the_credential_and_every_guarantee() {
    let dir = std::env::temp_dir().join(format!("airlock-router-socket-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // TLS is required on the port; a local client's connection never leaves the host.
    let d = Daemon::start(&["--tls", "required", "--router-socket", dir.to_str().unwrap()]);
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let id = sb["id"].as_str().unwrap().to_owned();
    let port = d.router.rsplit_once(':').unwrap().1;
    // The fork's answer names it, with the same credential; `airlock dsn`
    // prints it when asked, and a listing or a `show` never.
    let local = sb["router_socket_dsn"].as_str().expect("router_socket_dsn").to_owned();
    assert_eq!(split_password(&local).1, split_password(&dsn(&sb)).1);
    assert_eq!(
        local,
        format!("{}@/{id}?host={}&port={port}", local.split_once('@').unwrap().0, dir.display())
    );
    assert_eq!(d.ok(&["dsn", &id, "--router-socket"]).trim(), local);
    for listing in [d.ok(&["ls", "--json"]), d.ok(&["show", &id, "--json"])] {
        assert!(
            !listing.contains("router_socket_dsn") && !listing.contains(&split_password(&local).1),
            "{listing}"
        );
    }
    let issued = d.json(&["events", "--sandbox", &id]);
    let forms = issued.as_array().unwrap().iter().find(|e| e["kind"] == "credential_issued").unwrap()
        ["detail"]["forms"]
        .clone();
    assert!(forms.as_array().unwrap().iter().any(|f| f == "router_socket_dsn"), "{forms}");
    let socket = dir.join(format!(".s.PGSQL.{port}"));
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&socket).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o777, "any local user may connect: the credential admits");
    // The locks (the socket's, the router's, the daemon's) and the daemon's
    // log are root's alone: a user who could open a lock could take it and
    // hold it, and keep the next router from its socket or its port.
    let lock = dir.join(format!(".s.PGSQL.{port}.lock"));
    for private in
        [lock.clone(), d.home.join("router.lock"), d.home.join("daemon.lock"), d.home.join("daemon.log")]
    {
        let mode =
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&private).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o600, "{}", private.display());
    }
    let opened = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c"])
        .arg("import os, sys; os.open(sys.argv[1], os.O_RDONLY)")
        .arg(&lock)
        .output()
        .unwrap();
    assert!(!opened.status.success(), "another user opened the socket's lock");
    assert!(String::from_utf8_lossy(&opened.stderr).contains("PermissionError"), "{opened:?}");

    // Handed to its server: the session runs over a unix socket end to end.
    assert_eq!(sql(&local, "SHOW airlock.handoff"), "on");
    assert_eq!(sql(&local, "SELECT count(*) FROM orders"), "1000");
    let connection = sql(&local, "SHOW airlock.connection");
    assert!(connection.starts_with("via=router client=local:uid=0,pid="), "{connection}");
    // The agent, and nothing more.
    let who = "SELECT current_user || ' ' || session_user || ' ' || rolsuper FROM pg_roles WHERE rolname = current_user";
    assert_eq!(sql(&local, who), "airlock_agent airlock_agent false");
    for attempt in ["SET ROLE airlock_admin", "SET SESSION AUTHORIZATION airlock_admin"] {
        assert!(psql(&local, attempt).is_err(), "{attempt} was allowed");
    }
    // The credential is checked as on the port: a wrong one, or another role, is refused.
    let (base, password) = split_password(&local);
    let wrong = local.replacen(&password, "not-the-password", 1);
    let err = psql(&wrong, "SELECT 1").unwrap_err();
    assert!(err.contains("password authentication failed"), "{err}");
    for role in ["airlock_admin", "postgres"] {
        let err = psql(&local.replacen("airlock_agent:", &format!("{role}:"), 1), "SELECT 1").unwrap_err();
        assert!(err.contains("cannot connect through the router"), "{role}: {err}");
    }
    assert!(base.contains(&id), "{base}");
    // A setting the router SETs as the agent: relayed over the socket instead.
    let relayed = format!("{local}&options=-c%20work_mem%3D8MB");
    assert_eq!(
        sql(&relayed, "SELECT current_setting('airlock.handoff') || ' ' || current_setting('work_mem')"),
        "off 8MB"
    );

    // Another user of the host, with the credential, is served and written down as who it is.
    let nobody = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "psql", &base])
        .args(["-XtAc", "SELECT current_user"])
        .env("PGPASSWORD", &password)
        .output()
        .unwrap();
    assert!(nobody.status.success(), "{nobody:?}");
    assert_eq!(String::from_utf8_lossy(&nobody.stdout).trim(), "airlock_agent");

    // Cancel requests reach a handed-off session of the socket.
    let slow = spawn_psql(&local, "SELECT pg_sleep(30)");
    let deadline = Instant::now() + Duration::from_secs(10);
    while sql(&local, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep%'") != "1" {
        assert!(Instant::now() < deadline, "the slow query never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(Command::new("kill").args(["-INT", &slow.id().to_string()]).status().unwrap().success());
    let out = slow.wait_with_output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("canceling statement due to user request"),
        "{out:?}"
    );

    // A router killed outright leaves its socket's file behind; the one the
    // daemon starts in its place takes the lock and replaces it.
    let killed = router_pid(&d);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(killed), nix::sys::signal::Signal::SIGKILL).unwrap();
    d.wait_for(Duration::from_secs(20), "a new router serving the socket", || {
        std::fs::read(d.home.join("router.json")).is_ok()
            && router_pid(&d) != killed
            && psql(&local, "SELECT 1").is_ok_and(|one| one == "1")
    });
    assert_eq!(sql(&local, "SHOW airlock.handoff"), "on");

    // Every connection is on record with the local user it came from, and refusals too.
    d.wait_for(Duration::from_secs(10), "the socket's connections on record", || {
        let events = d.json(&["events", "--sandbox", &id]);
        let clients = |kind: &str| -> Vec<String> {
            events
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["kind"] == kind)
                .filter_map(|e| e["detail"]["client"].as_str().map(str::to_owned))
                .collect()
        };
        let connected = clients("connected");
        connected.iter().any(|c| c.starts_with("local:uid=0,pid="))
            && connected.iter().any(|c| c.starts_with("local:uid=65534,pid="))
            && clients("connection_refused").iter().any(|c| c.starts_with("local:uid=0"))
    });
    let log = d.log();
    assert!(!log.contains(&password), "the credential reached the log");

    // A router started in a killed one's place that cannot have the socket
    // (its lock held, here by this test) serves its port alone, and the
    // daemon stops handing out the socket's DSN.
    let killed = router_pid(&d);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(killed), nix::sys::signal::Signal::SIGKILL).unwrap();
    let mut held = None;
    d.wait_for(Duration::from_secs(10), "the killed router's socket lock", || {
        let file = std::fs::File::open(&lock).unwrap();
        held = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).ok();
        held.is_some()
    });
    d.wait_for(Duration::from_secs(20), "a new router without the socket", || {
        std::fs::read(d.home.join("router.json")).is_ok()
            && router_pid(&d) != killed
            && psql(&dsn(&sb), "SELECT 1").is_ok_and(|one| one == "1")
            && d.cli(&["dsn", &id, "--router-socket"]).code == 3
    });
    assert!(d.log().contains("unix socket is off"), "{}", d.log());
    assert!(d.fork("shop", &[]).get("router_socket_dsn").is_none());
    drop(held);

    // A daemon without the socket says so when asked for its DSN.
    drop(d);
    let plain = Daemon::start(&[]);
    plain.shop("shop");
    let other = plain.fork("shop", &[]);
    assert!(other.get("router_socket_dsn").is_none(), "{other}");
    let (code, err) = plain.fails(&["dsn", other["id"].as_str().unwrap(), "--router-socket"]);
    assert_eq!((code, err["code"].as_str()), (3, Some("invalid_request")), "{err}");
    assert!(err["hint"].as_str().unwrap().contains("--router-socket"), "{err}");
    drop(plain);
    // A directory others may write, or a relative one, is refused at start.
    let open = std::env::temp_dir().join(format!("airlock-router-socket-open-{}", std::process::id()));
    std::fs::create_dir_all(&open).unwrap();
    std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let mut refused = Daemon::unstarted(
        crate::harness::fresh_home(&std::env::temp_dir()),
        &["--router-socket", open.to_str().unwrap()],
    );
    let said = refused.serve_fails();
    assert!(said.contains("writable by no one else") && said.contains("--router-socket"), "{said}");
    let said = Daemon::unstarted(
        crate::harness::fresh_home(&std::env::temp_dir()),
        &["--router-socket", "relative/dir"],
    )
    .serve_fails();
    assert!(said.contains("absolute path"), "{said}");
    // Nor where a sandbox's processes see (a socket is reached by its path),
    // and nothing is made there.
    let seen = format!("/etc/airlock-router-socket-{}", std::process::id());
    let said =
        Daemon::unstarted(crate::harness::fresh_home(&std::env::temp_dir()), &["--router-socket", &seen])
            .serve_fails();
    assert!(said.contains("sandboxes see /etc"), "{said}");
    assert!(!std::path::Path::new(&seen).exists());
    let _ = std::fs::remove_dir_all(&open);
    let _ = std::fs::remove_dir_all(&dir);
}
