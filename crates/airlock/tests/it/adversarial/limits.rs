//! Limits the agent cannot lift: statement time lifted every way PostgreSQL
//! allows (SET, a startup option, a function's SET clause, a fast-path call),
//! an idle transaction with its timeout off, a dropped client, and the
//! connection limit. The in-server guard holds the statement limit whatever
//! the session set, and says so; the watchdog ends what is left from outside,
//! with an event.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::Scene;
use crate::harness::{psql, sql};
use crate::wire::{startup_packet, Raw};

/// A scene whose agent has a 1 s statement timeout and 1 s idle-in-transaction timeout.
fn tight() -> Scene {
    Scene::with(&[], &["--statement-timeout", "1s", "--idle-in-transaction-timeout", "1s"])
}

fn watchdog_events(s: &Scene) -> Vec<Value> {
    let events = s.d.json(&["events", "--sandbox", &s.id]);
    events.as_array().unwrap().iter().filter(|e| e["kind"] == "watchdog").cloned().collect()
}

/// `attempt` (which lifted the limit and then slept 30 s) ended well before 30 s,
/// and the client was told why: the sandbox's limit of 1 s, which SET cannot
/// lift (not "canceling statement due to user request").
fn held(s: &Scene, began: Instant, outcome: Result<String, String>) {
    let took = began.elapsed();
    let err = outcome.expect_err("the runaway finished");
    assert!(took < Duration::from_secs(15), "the runaway ran {took:?}");
    assert!(
        err.contains("canceling statement: the sandbox's statement limit of 1 s was reached"),
        "{err} / {:?}",
        watchdog_events(s)
    );
    s.untouched();
}

#[test]
fn statement_time_lifted_with_set_is_held() {
    let s = tight();
    let began = Instant::now();
    let outcome = psql(&s.agent, "SET statement_timeout = 0; SELECT pg_sleep(30)");
    held(&s, began, outcome);
}

#[test]
fn statement_time_lifted_in_the_startup_packet_is_held() {
    let s = tight();
    let packet =
        startup_packet(196608, &[("user", "airlock_agent"), ("database", &s.id), ("statement_timeout", "0")]);
    let mut session = Raw::connect(s.router(), &packet, &s.password).unwrap();
    let began = Instant::now();
    let outcome = session.query("SELECT pg_sleep(30)").map(|_| String::new()).map_err(|r| r.message);
    held(&s, began, outcome);
}

#[test]
fn statement_time_lifted_by_a_functions_set_clause_is_held() {
    let s = tight();
    sql(&s.agent, "CREATE FUNCTION public.nap() RETURNS void LANGUAGE sql SET statement_timeout = 0 AS 'SELECT pg_sleep(30)'");
    let began = Instant::now();
    let outcome = psql(&s.agent, "SELECT public.nap()");
    held(&s, began, outcome);
}

/// The extended protocol's Execute disarms a timeout the session turned off,
/// after Bind armed it: the statement is held all the same.
#[test]
fn statement_time_lifted_then_run_by_the_extended_protocol_is_held() {
    let s = tight();
    let packet = startup_packet(196608, &[("user", "airlock_agent"), ("database", &s.id)]);
    let mut session = Raw::connect(s.router(), &packet, &s.password).unwrap();
    session.query("SET statement_timeout = 0").unwrap();
    let began = Instant::now();
    let outcome = session.extended("SELECT pg_sleep(30)").map(|_| String::new()).map_err(|r| r.message);
    held(&s, began, outcome);
}

#[test]
fn a_fast_path_call_is_held_too() {
    let s = tight();
    let packet = startup_packet(196608, &[("user", "airlock_agent"), ("database", &s.id)]);
    let mut session = Raw::connect(s.router(), &packet, &s.password).unwrap();
    session.query("SET statement_timeout = 0").unwrap();
    let oid = sql(&s.agent, "SELECT 'pg_sleep(float8)'::regprocedure::oid");
    let began = Instant::now();
    let outcome =
        session.function_call(oid.parse().unwrap(), &["30"]).map(|_| String::new()).map_err(|r| r.message);
    held(&s, began, outcome);
}

/// The limit is a setting the agent can read and not change; a session's own
/// shorter timeout, and its own cancel, keep PostgreSQL's messages.
#[test]
fn the_statement_limit_is_shown_and_cannot_be_changed_and_shorter_timeouts_stay_the_sessions() {
    let s = tight();
    assert_eq!(sql(&s.agent, "SHOW airlock.statement_limit"), "1s");
    for attempt in [
        "SET airlock.statement_limit = 0",
        "SELECT set_config('airlock.statement_limit', '0', false)",
        "RESET airlock.statement_limit",
        "CREATE FUNCTION public.f() RETURNS int LANGUAGE sql SET airlock.statement_limit = 0 AS 'SELECT 1'",
    ] {
        let refused = psql(&s.agent, attempt).expect_err(attempt);
        assert!(refused.contains("permission denied"), "{attempt}: {refused}");
    }
    let own = psql(&s.agent, "SET statement_timeout = '300ms'; SELECT pg_sleep(30)").unwrap_err();
    assert!(own.contains("canceling statement due to statement timeout"), "{own}");
    // Work in a transaction is held statement by statement, the last one too.
    let began = Instant::now();
    let outcome = psql(
        &s.agent,
        "SET statement_timeout = 0; BEGIN; SELECT pg_sleep(0.5); SELECT pg_sleep(0.5); SELECT pg_sleep(30)",
    );
    held(&s, began, outcome);
}

#[test]
fn an_idle_transaction_with_its_timeout_off_is_ended() {
    let s = tight();
    let packet = startup_packet(196608, &[("user", "airlock_agent"), ("database", &s.id)]);
    let mut session = Raw::connect(s.router(), &packet, &s.password).unwrap();
    session
        .query("SET idle_in_transaction_session_timeout = 0; BEGIN; LOCK orders IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    std::thread::sleep(Duration::from_secs(5));
    assert!(session.query("SELECT 1").is_err(), "the idle transaction was left open");
    // Its lock went with it.
    assert_eq!(sql(&s.agent, "SELECT count(*) FROM orders"), "1000");
    assert!(watchdog_events(&s).iter().any(|e| e["reason"] == "idle_in_transaction"));
    s.untouched();
}

#[test]
fn a_dropped_clients_query_does_not_run_on() {
    let s = Scene::new();
    let packet = startup_packet(
        196608,
        &[("user", "airlock_agent"), ("database", &s.id), ("application_name", "dropper")],
    );
    let mut session = Raw::connect(s.router(), &packet, &s.password).unwrap();
    session.query("SET client_connection_check_interval = 0").unwrap();
    session.send("SELECT pg_sleep(60)");
    std::thread::sleep(Duration::from_millis(300));
    let running =
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dropper' AND state = 'active'";
    assert_eq!(sql(&s.agent, running), "1");
    session.drop_now();
    let began = Instant::now();
    while sql(&s.agent, running) != "0" {
        assert!(began.elapsed() < Duration::from_secs(10), "the dropped client's query kept running");
        std::thread::sleep(Duration::from_millis(100));
    }
    s.untouched();
}

#[test]
fn the_connection_limit_holds() {
    let s = Scene::with(&[], &["--connection-limit", "2"]);
    let packet = startup_packet(196608, &[("user", "airlock_agent"), ("database", &s.id)]);
    let _one = Raw::connect(s.router(), &packet, &s.password).unwrap();
    let _two = Raw::connect(s.router(), &packet, &s.password).unwrap();
    let third = Raw::connect(s.router(), &packet, &s.password).err().expect("a third session was let in");
    assert_eq!(third.code, "53300", "{third:?}");
    s.untouched();
}

/// Exec code that opens the sandbox's own socket `n` times and sends on each
/// only the first bytes of a startup packet, holding them 25 s: each backend
/// waits for the rest, holding a slot of the postmaster's without having said
/// who it is. (The agent logs in by peer, so a whole startup packet would be
/// a session at once, under the role's connection limit.)
const UNANSWERED: &str = r#"
import os, socket, struct, sys, time, urllib.parse
url = urllib.parse.urlparse(os.environ["DATABASE_URL"])
host = urllib.parse.parse_qs(url.query)["host"][0]
body = struct.pack("!i", 196608) + b"user\0airlock_agent\0database\0app\0\0"
held = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(host + "/.s.PGSQL.5432")
        s.sendall(struct.pack("!i", len(body) + 4) + body[:6])
        held.append(s)
    except OSError:
        pass
print("held", len(held), flush=True)
time.sleep(25)
"#;

#[test]
fn the_daemon_reaches_a_server_whose_slots_are_all_held_by_unauthenticated_clients() {
    let s = super::Scene::new();
    let flood = std::process::Command::new(crate::harness::BIN)
        .args(["exec", &s.id, "--timeout", "40s", "--", "python3", "-c", UNANSWERED, "140"])
        .env("AIRLOCK_HOME", &s.d.home)
        .env("AIRLOCK_ROUTER", &s.d.router)
        .env("AIRLOCK_REDIS_ROUTER", &s.d.redis_router)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(3));
    // Every child slot of the postmaster is taken before a startup packet
    // (2 x its 62 processes, with 40 connections); the daemon's admin session
    // ends those backends and gets in.
    let described = s.tool("describe_schema", serde_json::json!({}));
    assert!(described["text"].as_str().is_some_and(|t| t.contains("orders")), "{described}");
    assert!(s.d.log().contains("ended the backends still authenticating"), "the sweep ran");
    let mut flood = flood;
    let _ = flood.kill();
    let _ = flood.wait();
    s.untouched();
}
