//! The router's front door, attacked with startup packets built by hand: every
//! way a packet could name another role or database, or a setting the server
//! would read differently from the router, is refused; the packet the server
//! gets is the router's own.

use super::Scene;
use crate::wire::{startup_packet, Raw};

const V3: i32 = 196608;

/// Sends a startup packet whose `{sb}` is the agent's sandbox id; it must be
/// refused with `code`.
fn refused(params: &[(&str, &str)], code: &str) {
    let s = Scene::new();
    let params: Vec<(String, String)> =
        params.iter().map(|(k, v)| (k.to_string(), v.replace("{sb}", &s.id))).collect();
    let borrowed: Vec<(&str, &str)> = params.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    match Raw::connect(s.router(), &startup_packet(V3, &borrowed), &s.password) {
        Ok(mut session) => {
            let who = session.query("SELECT current_user, current_setting('is_superuser')");
            panic!("{params:?} was let in: {who:?}");
        }
        Err(r) => assert_eq!(r.code, code, "{params:?}: {r:?}"),
    }
    s.untouched();
}

macro_rules! packets_refused {
    ($($name:ident: [$(($k:expr, $v:expr)),*] => $code:expr;)*) => {$(
        #[test]
        fn $name() {
            refused(&[$(($k, $v)),*], $code);
        }
    )*};
}

packets_refused! {
    user_twice_agent_first: [("user", "airlock_agent"), ("user", "airlock_admin"), ("database", "{sb}")] => "08P01";
    user_twice_admin_first: [("user", "airlock_admin"), ("user", "airlock_agent"), ("database", "{sb}")] => "08P01";
    user_twice_in_another_case: [("user", "airlock_agent"), ("USER", "airlock_admin"), ("database", "{sb}")] => "08P01";
    database_twice: [("user", "airlock_agent"), ("database", "{sb}"), ("database", "postgres")] => "08P01";
    role_in_options: [("user", "airlock_agent"), ("database", "{sb}"), ("options", "-c role=airlock_admin")] => "08P01";
    role_in_long_options: [("user", "airlock_agent"), ("database", "{sb}"), ("options", "--role=airlock_admin")] => "08P01";
    session_authorization_in_options: [("user", "airlock_agent"), ("database", "{sb}"), ("options", "-c session_authorization=airlock_admin")] => "08P01";
    setting_hidden_behind_an_escape: [("user", "airlock_agent"), ("database", "{sb}"), ("options", "-c search_path=x\\ -c\\ role=airlock_admin -c role=airlock_admin")] => "08P01";
    role_as_a_parameter: [("user", "airlock_agent"), ("database", "{sb}"), ("role", "airlock_admin")] => "08P01";
    session_authorization_as_a_parameter: [("user", "airlock_agent"), ("database", "{sb}"), ("session_authorization", "airlock_admin")] => "08P01";
    a_setting_twice_through_options: [("user", "airlock_agent"), ("database", "{sb}"), ("search_path", "a"), ("options", "-c search_path=b")] => "08P01";
    replication_connection: [("user", "airlock_agent"), ("database", "{sb}"), ("replication", "database")] => "08P01";
    superuser_setting: [("user", "airlock_agent"), ("database", "{sb}"), ("log_statement", "none")] => "42501";
    superuser_setting_in_options: [("user", "airlock_agent"), ("database", "{sb}"), ("options", "-c session_replication_role=replica")] => "42501";
    the_sandboxs_statement_limit: [("user", "airlock_agent"), ("database", "{sb}"), ("options", "-c airlock.statement_limit=0")] => "42501";
    the_temp_file_limit: [("user", "airlock_agent"), ("database", "{sb}"), ("temp_file_limit", "-1")] => "42501";
    a_read_only_server_setting: [("user", "airlock_agent"), ("database", "{sb}"), ("is_superuser", "on")] => "55P02";
    session_preload_libraries: [("user", "airlock_agent"), ("database", "{sb}"), ("session_preload_libraries", "evil")] => "08P01";
    preload_libraries: [("user", "airlock_agent"), ("database", "{sb}"), ("options", "-c local_preload_libraries=evil")] => "08P01";
    server_switch_in_options: [("user", "airlock_agent"), ("database", "{sb}"), ("options", "-d 5")] => "08P01";
    no_user: [("database", "{sb}")] => "08P01";
    admin_role: [("user", "airlock_admin"), ("database", "{sb}")] => "28000";
    owner_role: [("user", "airlock_owner"), ("database", "{sb}")] => "28000";
    reader_role: [("user", "airlock_reader"), ("database", "{sb}")] => "28000";
    bootstrap_name: [("user", "postgres"), ("database", "{sb}")] => "28000";
    a_template_database: [("user", "airlock_agent"), ("database", "template1")] => "3D000";
    the_inner_database_name: [("user", "airlock_agent"), ("database", "app")] => "3D000";
    a_path_for_a_database: [("user", "airlock_agent"), ("database", "../{sb}")] => "3D000";
}

/// A setting off the router's allow-list that the agent may SET is SET for it
/// once the session is open, as PostgreSQL would take it at startup; it never
/// reaches the server's startup message, so it can do nothing SET could not.
#[test]
fn a_setting_the_agent_may_set_is_set_after_login() {
    let s = Scene::new();
    let params = [
        ("user", "airlock_agent"),
        ("database", s.id.as_str()),
        ("work_mem", "7MB"),
        ("options", "-c enable_seqscan=off -c my.flag=x"),
    ];
    let mut session = Raw::connect(s.router(), &startup_packet(V3, &params), &s.password).unwrap();
    let shown = session
        .query("SELECT current_setting('work_mem'), current_setting('enable_seqscan'), current_setting('my.flag'), current_user")
        .unwrap();
    let want = ["7MB", "off", "x", "airlock_agent"].map(|v| Some(v.to_owned())).to_vec();
    assert_eq!(shown, vec![want]);
    s.untouched();
}

#[test]
fn an_oversized_parameter_is_refused() {
    let long = "x".repeat(2000);
    refused(&[("user", "airlock_agent"), ("database", "{sb}"), ("application_name", &long)], "08P01");
}

#[test]
fn what_the_router_accepts_reaches_the_server_as_the_agent_and_nothing_more() {
    let s = Scene::new();
    let packet = startup_packet(
        V3,
        &[
            ("user", "airlock_agent"),
            ("database", &s.id),
            ("application_name", "raw"),
            ("options", "-c search_path=public,pg_catalog --lock_timeout=2s"),
        ],
    );
    let mut session = Raw::connect(s.router(), &packet, &s.password).expect("a plain packet is let in");
    let row = session
        .query(
            "SELECT current_user, session_user, current_setting('is_superuser'), current_setting('search_path'),
                    current_setting('lock_timeout'), current_database()",
        )
        .unwrap();
    let got: Vec<&str> = row[0].iter().map(|v| v.as_deref().unwrap_or("")).collect();
    assert_eq!(got, ["airlock_agent", "airlock_agent", "off", "public,pg_catalog", "2s", "app"]);
    s.untouched();
}

#[test]
fn the_routers_own_identity_cannot_be_the_admin_on_the_socket() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let s = Scene::new();
    // The router and run_sql reach a sandbox's socket as the sandbox's server
    // user; peer authentication maps no role to it, so asking for the admin fails
    // whatever the packet says.
    let run = s.d.home.join("volume/sandboxes").join(&s.id).join("run");
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata(&run).unwrap().uid();
    let out = std::process::Command::new("setpriv")
        .args([format!("--reuid={uid}"), format!("--regid={uid}"), "--clear-groups".into()])
        .args(["psql", "-XtAc", "SELECT 1"])
        .arg(format!("host={} dbname=app user=airlock_admin", run.display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("Peer authentication failed"), "{err}");
    s.untouched();
}

#[test]
fn clients_that_never_authenticate_cannot_take_the_servers_slots() {
    let s = Scene::with(&[], &["--statement-timeout", "2s"]);
    // Before the flood: a session of the agent's own, to lift its timeout later.
    let long = crate::harness::spawn_psql(&s.agent, "SET statement_timeout = 0; SELECT pg_sleep(40)");
    std::thread::sleep(std::time::Duration::from_secs(1));
    // Sixty clients that know the sandbox's id and never answer the password challenge.
    let packet = crate::wire::startup_packet(196608, &[("user", "airlock_agent"), ("database", &s.id)]);
    let mut held = Vec::new();
    for _ in 0..60 {
        if let Ok(mut c) = std::net::TcpStream::connect(s.router()) {
            use std::io::Write;
            let _ = c.write_all(&packet);
            held.push(c);
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    // The daemon still reaches the server: its tools answer, and the watchdog
    // still ends the statement that lifted its own timeout.
    let described = s.tool("describe_schema", serde_json::json!({}));
    assert!(described["text"].as_str().is_some_and(|t| t.contains("orders")), "{described}");
    let ended = long.wait_with_output().unwrap();
    let why = String::from_utf8_lossy(&ended.stderr);
    assert!(why.contains("cancel") || why.contains("terminat"), "the watchdog ended the statement: {why}");
    drop(held);
    s.untouched();
}

#[test]
fn a_newer_minor_protocol_version_is_answered_with_3_0() {
    use std::io::{Read, Write};
    let s = Scene::new();
    let packet = startup_packet(V3 + 2, &[("user", "airlock_agent"), ("database", &s.id)]);
    let mut tcp = std::net::TcpStream::connect(s.router()).unwrap();
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    tcp.write_all(&packet).unwrap();
    // NegotiateProtocolVersion first, as PostgreSQL sends it: the version the
    // session speaks, 3.0, as a whole version number (libpq 18 reads a bare
    // minor of 0 as a downgrade to 2.x), and no options.
    let mut message = [0u8; 13];
    tcp.read_exact(&mut message).unwrap();
    assert_eq!(message, [b'v', 0, 0, 0, 12, 0, 3, 0, 0, 0, 0, 0, 0]);
    let mut session = Raw::connect(s.router(), &packet, &s.password).unwrap();
    assert_eq!(session.query("SELECT 1").unwrap(), vec![vec![Some("1".to_owned())]]);
    s.untouched();
}

/// A protocol option (`_pq_.*`) is listed back as unrecognised, as PostgreSQL
/// lists it, and the session goes on as the agent: the option never reaches
/// the server, so it can ask nothing of it.
#[test]
fn a_protocol_option_is_listed_back_and_never_reaches_the_server() {
    use std::io::{Read, Write};
    let s = Scene::new();
    let params = [("user", "airlock_agent"), ("database", s.id.as_str()), ("_pq_.anything", "x")];
    let packet = startup_packet(V3, &params);
    let mut tcp = std::net::TcpStream::connect(s.router()).unwrap();
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    tcp.write_all(&packet).unwrap();
    let mut message = [0u8; 27];
    tcp.read_exact(&mut message).unwrap();
    let mut want = vec![b'v', 0, 0, 0, 26, 0, 3, 0, 0, 0, 0, 0, 1];
    want.extend_from_slice(b"_pq_.anything\0");
    assert_eq!(message.as_slice(), want.as_slice());
    let mut session = Raw::connect(s.router(), &packet, &s.password).unwrap();
    let who = session.query("SELECT current_user, current_setting('is_superuser')").unwrap();
    assert_eq!(who, vec![vec![Some("airlock_agent".to_owned()), Some("off".to_owned())]]);
    s.untouched();
}

/// Anyone who knows a sandbox's name can start logins and never finish them.
/// A flood of those, from one address or from many, holds nothing its owner
/// needs: the owner, from an address of its own, connects at once, every time.
#[test]
fn a_flood_of_unfinished_logins_does_not_slow_the_owner() {
    let s = Scene::new();
    let packet = crate::wire::startup_packet(196608, &[("user", "airlock_agent"), ("database", &s.id)]);
    let router: std::net::SocketAddr = s.router().parse().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
    let mut held = Vec::new();
    // Forty from one address, and eight from each of eight others.
    let sources: Vec<(u8, usize)> = std::iter::once((2u8, 40)).chain((3..11).map(|a| (a, 8))).collect();
    for (last, count) in sources {
        for _ in 0..count {
            let connected = runtime.block_on(async {
                let socket = tokio::net::TcpSocket::new_v4()?;
                socket.bind(format!("127.0.0.{last}:0").parse().unwrap())?;
                socket.connect(router).await?.into_std()
            });
            if let Ok(mut c) = connected {
                c.set_nonblocking(false).unwrap();
                use std::io::Write;
                let _ = c.write_all(&packet);
                held.push(c);
            }
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    for _ in 0..5 {
        let answered = crate::harness::psql_within(&s.agent, "SELECT 1", std::time::Duration::from_secs(4));
        assert_eq!(answered.as_deref(), Ok("1"), "the owner was held up by the flood");
    }
    drop(held);
    s.untouched();
}
