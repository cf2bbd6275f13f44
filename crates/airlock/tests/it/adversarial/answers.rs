//! Every request answers, whatever the agent shaped: catalog reads racing the
//! agent's own DDL, a promoted golden with odd tables, the model's own inputs
//! to every tool route (any string, any array), and a migration test from a
//! restricted sandbox. No answer is a 5xx, no panic reaches the daemon's log,
//! and every tool call is on record.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{json, Value};

use super::Scene;
use crate::harness::{psql, sql, Daemon};

/// `POST /v1/sandboxes/{id}/tools/{tool}` with a raw body: (status, body).
fn call(d: &Daemon, id: &str, tool: &str, body: &str) -> (u16, String) {
    d.api("POST", &format!("/v1/sandboxes/{id}/tools/{tool}"), body)
}

fn tool_records(d: &Daemon, id: &str) -> usize {
    d.json(&["audit", "ls", "--sandbox", id, "--kind", "tool_call", "--limit", "100000"])
        .as_array()
        .map_or(0, Vec::len)
}

#[test]
fn catalog_readers_answer_while_the_agent_rewrites_its_catalog() {
    let s = Scene::new();
    let stop = AtomicBool::new(false);
    let (mut asked, mut answered) = (0, 0);
    std::thread::scope(|scope| {
        // The agent makes and drops every kind of object, as fast as it can.
        scope.spawn(|| {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                let _ = psql(
                    &s.agent,
                    &format!(
                        "CREATE FUNCTION f{n}(int) RETURNS int LANGUAGE sql AS 'SELECT $1';
                         CREATE TABLE t{n} (a int DEFAULT f{n}(1) CHECK (a > 0), b text);
                         CREATE INDEX i{n} ON t{n} ((f{n}(a)));
                         CREATE VIEW v{n} AS SELECT f{n}(a) FROM t{n};
                         CREATE TYPE e{n} AS ENUM ('x', 'y');
                         CREATE SEQUENCE s{n};
                         CREATE POLICY p{n} ON t{n} USING (true);
                         ALTER TABLE t{n} RENAME TO u{n};
                         DROP FUNCTION f{n}(int) CASCADE;
                         DROP TABLE u{n} CASCADE; DROP TYPE e{n}; DROP SEQUENCE s{n};"
                    ),
                );
            }
        });
        for _ in 0..40 {
            for tool in ["describe_schema", "changes_since_fork"] {
                asked += 1;
                let (status, body) = call(&s.d, &s.id, tool, "{}");
                assert!(status < 500, "{tool} answered {status}: {body}\n{}", s.d.log());
                answered += 1;
            }
        }
        stop.store(true, Ordering::SeqCst);
    });
    assert_eq!(asked, answered);
    assert!(!s.d.log().contains("panicked"), "{}", s.d.log());
    // Every call is on record, whatever its outcome.
    assert!(tool_records(&s.d, &s.id) >= asked, "calls without a record");
    s.untouched();
}

/// A deterministic source of the model's own inputs.
struct Inputs(u64);

impl Inputs {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn string(&mut self) -> String {
        const PIECES: &[&str] = &[
            "SELECT 1",
            "\u{0}",
            ";",
            "'",
            "\"",
            "$$",
            "\\",
            "DROP TABLE orders",
            "BEGIN",
            "COPY orders TO STDOUT",
            "\u{202e}",
            "é",
            "\u{1F600}",
            "\n",
            "--",
            "/*",
            "SELECT repeat('x', 100000)",
            "HELLO",
            "3",
            "DEBUG",
            "SLEEP",
            "*",
        ];
        let n = self.next() % 6;
        (0..n).map(|_| PIECES[(self.next() % PIECES.len() as u64) as usize]).collect::<Vec<_>>().join(" ")
    }

    fn value(&mut self, depth: u32) -> Value {
        match self.next() % if depth > 2 { 5 } else { 8 } {
            0 => Value::Null,
            1 => json!(self.next() % 2 == 0),
            2 => json!((self.next() as i64).wrapping_sub(i64::MAX / 2)),
            3 => json!(f64::from_bits(self.next() & 0x7fef_ffff_ffff_ffff)),
            4 => json!(self.string()),
            5 => json!("x".repeat((self.next() % 300_000) as usize)),
            6 => Value::Array((0..self.next() % 5).map(|_| self.value(depth + 1)).collect()),
            _ => {
                let keys = ["sql", "command", "args", "table", ""];
                let mut map = serde_json::Map::new();
                for _ in 0..self.next() % 4 {
                    map.insert(
                        keys[(self.next() % keys.len() as u64) as usize].into(),
                        self.value(depth + 1),
                    );
                }
                Value::Object(map)
            }
        }
    }
}

#[test]
fn the_tool_routes_answer_any_input_without_a_server_error() {
    let d = Daemon::start(&[]);
    crate::redis::golden_with_redis(&d, "fuzz");
    let sb = d.fork("fuzz", &["--statement-timeout", "5s"]);
    let id = sb["id"].as_str().unwrap().to_owned();
    let mut inputs = Inputs(0x5eed_1234_abcd_ef01);
    let tools = ["run_sql", "run_redis", "describe_schema", "changes_since_fork"];
    let mut calls = 0;
    for round in 0..240 {
        let tool = tools[round % tools.len()];
        let body = match round % 3 {
            // What the model means, bent.
            0 if tool == "run_sql" => json!({"sql": inputs.string()}),
            0 if tool == "run_redis" => {
                json!({"command": (0..1 + inputs.next() % 4).map(|_| inputs.string()).collect::<Vec<_>>()})
            }
            // Anything at all where the arguments go.
            1 => json!({"sql": inputs.value(0), "command": inputs.value(0)}),
            _ => inputs.value(0),
        };
        let (status, text) = call(&d, &id, tool, &body.to_string());
        calls += 1;
        assert!(status < 500, "{tool} {body}: {status} {text}\n{}", d.log());
    }
    // Replies of RESP3, and of every shape a script returns.
    for command in [
        json!(["HELLO", "3"]),
        json!(["EVAL", "return {1, {2, {3, {4, {5, {6, {7, {8, {9, {10}}}}}}}}}}", "0"]),
        json!(["EVAL", "return {double = 3.5}", "0"]),
        json!(["EVAL", "return redis.error_reply('mine')", "0"]),
        json!(["DEBUG", "PROTOCOL", "map"]),
        json!(["SUBSCRIBE", "x"]),
    ] {
        let (status, text) = call(&d, &id, "run_redis", &json!({"command": command}).to_string());
        calls += 1;
        assert!(status < 500, "{command}: {status} {text}");
    }
    // The tools that fork or rebuild take the same inputs, fewer times (each
    // call that passes its checks forks or resets).
    for round in 0..16 {
        let tool = if round % 2 == 0 { "test_migration" } else { "reset_database" };
        let body = match round % 4 {
            0 => json!({"sql": inputs.string()}),
            1 | 2 => inputs.value(0),
            _ => json!({"sql": inputs.value(0)}),
        };
        let (status, text) = call(&d, &id, tool, &body.to_string());
        calls += 1;
        assert!(status < 500, "{tool} {body}: {status} {text}\n{}", d.log());
    }
    // A session the agent switched to another client encoding: names and
    // values come back lossily, never as a failure of the daemon's.
    for sql in [
        "SET client_encoding = 'LATIN1'; SELECT 1 AS \"c\u{f6}\", '\u{e9}' AS v",
        "SET client_encoding = 'LATIN1'; SET application_name = '\u{e9}'; SELECT 1",
        "SET client_encoding = 'SJIS'; SELECT '\u{e9}' AS \"\u{e9}\"",
    ] {
        let (status, text) = call(&d, &id, "run_sql", &json!({ "sql": sql }).to_string());
        calls += 1;
        assert_eq!(status, 200, "{sql}: {text}");
    }
    // The session's own backend ended by its own SQL: the call's result.
    for _ in 0..2 {
        let (status, text) = call(
            &d,
            &id,
            "run_sql",
            &json!({"sql": "SELECT pg_terminate_backend(pg_backend_pid())"}).to_string(),
        );
        calls += 1;
        assert_eq!(status, 200, "{text}");
        let out: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(out["is_error"], true, "{out}");
    }
    // SQL with a NUL byte is refused as such, and its record says nothing ran.
    let (status, text) = call(&d, &id, "run_sql", &json!({"sql": "SELECT 1;\u{0} DROP TABLE t"}).to_string());
    calls += 1;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("NUL"), "{text}");
    let records = d.json(&["audit", "ls", "--sandbox", &id, "--kind", "tool_call"]);
    let last = records.as_array().unwrap().last().unwrap();
    assert_eq!(last["detail"]["ran"], 0, "{last}");
    assert_eq!(tool_records(&d, &id), calls, "every call is on record");
    assert!(!d.log().contains("panicked"), "{}", d.log());
    // The sandbox still answers, and no test's fork is left.
    assert_eq!(sql(&crate::harness::dsn(&sb), "SELECT count(*) FROM t"), "0");
    d.wait_for(Duration::from_secs(20), "the tests' forks to go", || d.ids() == [id.clone()]);
}

#[test]
fn the_mcp_gateway_answers_any_json_rpc_without_a_server_error() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &["--mcp"]);
    let url = sb["mcp_url"].as_str().unwrap();
    let (gateway, path) = url.strip_prefix("http://").unwrap().split_once('/').unwrap();
    let path = format!("/{path}");
    let mut inputs = Inputs(0x0dd_ba11_cafe_f00d);
    let methods =
        ["tools/call", "tools/list", "initialize", "ping", "resources/list", "prompts/get", "", "x"];
    let tools = ["run_sql", "describe_schema", "changes_since_fork", "nope"];
    let mut answered = 0;
    for round in 0..120usize {
        let tool = tools[round / 4 % tools.len()];
        let body = match round % 4 {
            // A call of a tool the model knows, with bent arguments.
            0 => json!({"jsonrpc": "2.0", "id": round, "method": "tools/call",
                "params": {"name": tool,
                           "arguments": inputs.value(0)}}),
            // A request of any method, any params.
            1 => json!({"jsonrpc": "2.0", "id": inputs.value(2),
                "method": methods[(inputs.next() % methods.len() as u64) as usize], "params": inputs.value(0)}),
            // Anything at all.
            2 => inputs.value(0),
            _ => json!(inputs.string()),
        };
        let mut s = std::net::TcpStream::connect(gateway).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let (status, text) = crate::harness::http(
            &mut s,
            "POST",
            &path,
            "Accept: application/json, text/event-stream\r\nHost: 127.0.0.1\r\nMCP-Protocol-Version: 2025-06-18\r\n",
            &body.to_string(),
        );
        assert!(status < 500, "{body}: {status} {text}\n{}", d.log());
        answered += usize::from(status == 200 && text.contains("\"jsonrpc\""));
    }
    assert!(answered >= 30, "the gateway answered only {answered} requests: the fuzz reached no tool");
    assert!(!d.log().contains("panicked"), "{}", d.log());
    assert_eq!(sql(&crate::harness::dsn(&sb), "SELECT count(*) FROM orders"), "1000");
}

#[test]
fn a_promoted_golden_with_empty_partitioned_tables_tests_migrations_and_leaves_no_fork() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let id = sb["id"].as_str().unwrap().to_owned();
    sql(
        &crate::harness::dsn(&sb),
        "CREATE TABLE events (at date, n int) PARTITION BY RANGE (at);
         CREATE TABLE measures (k int, v int) PARTITION BY HASH (k);
         CREATE TABLE measures_0 PARTITION OF measures FOR VALUES WITH (MODULUS 2, REMAINDER 0);",
    );
    d.ok(&["promote", &id, "--golden", "parts"]);
    let agent = d.fork("parts", &[]);
    let agent_id = agent["id"].as_str().unwrap();
    let (status, body) = call(
        &d,
        agent_id,
        "test_migration",
        &json!({"sql": "ALTER TABLE orders ADD COLUMN note text"}).to_string(),
    );
    assert_eq!(status, 200, "{body}");
    let out: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(out["result"]["passed"], true, "{out}");
    // The test's fork is gone; the two sandboxes are all there is.
    d.wait_for(Duration::from_secs(10), "the test's fork to be deleted", || d.ids().len() == 2);
}

#[test]
fn a_restricted_sandboxs_migration_tests_keep_its_mode_and_limits() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &["--mode", "readonly", "--temp-file-limit", "1MB", "--work-mem", "64kB"]);
    let id = sb["id"].as_str().unwrap();
    let test = |sql: &str| -> Value {
        let (status, body) = call(&d, id, "test_migration", &json!({"sql": sql}).to_string());
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    };
    let wrote = test("CREATE TABLE notes (n int); INSERT INTO notes VALUES (1);");
    assert_eq!(wrote["result"]["passed"], false, "{wrote}");
    assert!(wrote.to_string().contains("read-only"), "the test's fork is read-only too: {wrote}");
    let sorted = test(
        "SELECT count(*) FROM (SELECT g FROM generate_series(1, 1500000) g ORDER BY g DESC OFFSET 0) s;",
    );
    assert_eq!(sorted["result"]["passed"], false, "{sorted}");
    assert!(sorted.to_string().contains("temp_file_limit"), "its limits too: {sorted}");
    // A branch of it is as restricted: read-only, with the same limits.
    let branch = d.json(&["branch", id]);
    assert_eq!(branch["access"], sb["access"], "{branch}");
    let url = crate::harness::dsn(&branch);
    let wrote = psql(&url, "CREATE TABLE notes (n int)").unwrap_err();
    assert!(wrote.contains("read-only"), "{wrote}");
    let sorted = psql(
        &url,
        "SELECT count(*) FROM (SELECT g FROM generate_series(1, 1500000) g ORDER BY g DESC OFFSET 0) s",
    )
    .unwrap_err();
    assert!(sorted.contains("temp_file_limit") || sorted.contains("temporary file size"), "{sorted}");
    assert_eq!(sql(&url, "SHOW work_mem"), "64kB");
}

/// The agent's own open transaction holds a lock a catalog read needs, and a
/// model writes a migration of thousands of statements: both tools answer at
/// once, saying what to do, instead of holding the call for minutes.
#[test]
fn the_agents_own_locks_and_sizes_never_hold_a_tool_call() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let id = sb["id"].as_str().unwrap().to_owned();
    let url = crate::harness::dsn(&sb);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        // An ALTER TABLE left open: its ACCESS EXCLUSIVE lock is held until
        // the session ends.
        s.spawn(|| {
            let _ = psql(&url, "BEGIN; ALTER TABLE orders ADD COLUMN note text; SELECT pg_sleep(60); COMMIT");
        });
        d.wait_for(Duration::from_secs(10), "the lock to be held", || {
            sql(&url, "SELECT count(*) FROM pg_locks WHERE mode = 'AccessExclusiveLock' AND relation = 'orders'::regclass")
                != "0"
        });
        for tool in ["describe_schema", "changes_since_fork"] {
            let began = std::time::Instant::now();
            let (status, text) = call(&d, &id, tool, "{}");
            assert!(began.elapsed() < Duration::from_secs(20), "{tool} waited {:?}", began.elapsed());
            assert_eq!(status, 400, "{tool}: {text}");
            assert!(text.contains("holds a lock") && text.contains("commit or roll back"), "{text}");
        }
        sql(&url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'BEGIN; ALTER%'");
        stop.store(true, Ordering::SeqCst);
    });
    let (status, text) = call(&d, &id, "describe_schema", "{}");
    assert_eq!(status, 200, "the lock gone, the schema answers: {text}");
    // A migration of more statements than a test takes is refused before
    // any fork is made: a tool error the model reads.
    let huge: String = (0..600).map(|i| format!("CREATE TABLE t{i} (a int);\n")).collect();
    let before = d.ids();
    let (status, text) = call(&d, &id, "test_migration", &json!({"sql": huge}).to_string());
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("\"is_error\":true") && text.contains("invalid_arguments"), "{text}");
    assert!(text.contains("600 statements") && text.contains("at most 500"), "{text}");
    assert_eq!(d.ids(), before, "no fork was made");
}

#[test]
fn a_tool_call_whose_client_goes_away_runs_to_its_end_and_leaves_no_fork() {
    use std::io::Write;
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &["--mcp"]);
    let id = sb["id"].as_str().unwrap().to_owned();
    let url = sb["mcp_url"].as_str().unwrap();
    let (gateway, path) = url.strip_prefix("http://").unwrap().split_once('/').unwrap();
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "test_migration", "arguments": {"sql": "ALTER TABLE orders ADD COLUMN note text"}}})
    .to_string();
    // Gone while the test's fork is being made, and while it is measured.
    for after in [Duration::from_millis(30), Duration::from_millis(400)] {
        let mut s = std::net::TcpStream::connect(gateway).unwrap();
        let request = format!(
            "POST /{path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-06-18\r\n\
             Content-Length: {}\r\n\r\n{call}",
            call.len()
        );
        s.write_all(request.as_bytes()).unwrap();
        std::thread::sleep(after);
        drop(s);
    }
    // Each call ran to its end: on record, and its fork deleted.
    d.wait_for(Duration::from_secs(60), "both calls' records", || tool_records(&d, &id) >= 2);
    d.wait_for(Duration::from_secs(20), "the tests' forks to be deleted", || {
        d.ids() == [id.clone()] && d.postmasters().len() == 1
    });
}
