//! The agent gateway through the REST API: `run_sql`'s result shape, caps and
//! errors, the sandbox's mode applied to it, the other tools, events, and the
//! task-scoped MCP URL's lifetime. (MCP clients themselves are driven by the
//! official Python SDK in `clients/python/tests`.)

use std::net::TcpStream;

use serde_json::{json, Value};

use crate::harness::{http, Daemon};

/// `POST /v1/sandboxes/{id}/sql`; returns the status and the JSON answer.
fn run_sql(d: &Daemon, id: &str, sql: &str) -> (u16, Value) {
    let (status, body) =
        d.api("POST", &format!("/v1/sandboxes/{id}/sql"), &json!({ "sql": sql }).to_string());
    (status, serde_json::from_str(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}")))
}

/// A SQL call that must succeed; returns its result.
fn ok_sql(d: &Daemon, id: &str, sql: &str) -> Value {
    let (status, r) = run_sql(d, id, sql);
    assert_eq!(status, 200, "{r}");
    assert!(r.get("error").is_none(), "{sql}: {r}");
    r
}

/// `POST /v1/sandboxes/{id}/tools/{tool}`.
fn tool(d: &Daemon, id: &str, name: &str, args: Value) -> (u16, Value) {
    let (status, body) = d.api("POST", &format!("/v1/sandboxes/{id}/tools/{name}"), &args.to_string());
    (status, serde_json::from_str(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}")))
}

fn tags(r: &Value) -> Vec<&str> {
    r["statements"].as_array().unwrap().iter().map(|s| s["tag"].as_str().unwrap()).collect()
}

#[test]
fn run_sql_reports_tags_types_and_rows_and_caps_them_while_streaming() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let id = d.fork("shop", &[])["id"].as_str().unwrap().to_owned();
    let r = ok_sql(
        &d,
        &id,
        "CREATE TABLE t (id int, v text, j jsonb, b bool, n numeric, f float8);
         INSERT INTO t SELECT g, 'v' || g, '{\"a\": 1}', g % 2 = 0, g * 1.5, g / 4.0 FROM generate_series(1, 500) g;
         SELECT * FROM t ORDER BY id",
    );
    assert_eq!(tags(&r), ["CREATE TABLE", "INSERT 0 500", "SELECT 500"]);
    let types: Vec<&str> =
        r["columns"].as_array().unwrap().iter().map(|c| c["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["integer", "text", "jsonb", "boolean", "numeric", "double precision"]);
    assert_eq!(r["rows"][0], json!([1, "v1", {"a": 1}, false, "1.5", 0.25]));
    assert_eq!(r["rows"].as_array().unwrap().len(), 200);
    assert_eq!((r["row_count"].as_u64(), r["truncated"].as_bool()), (Some(500), Some(true)));
    assert!(r["note"].as_str().unwrap().contains("first 200 of 500 rows"), "{r}");

    // The byte cap: 100 rows of 3,000 bytes do not all fit in 64 KB.
    let r = ok_sql(&d, &id, "SELECT g, repeat('x', 3000) FROM generate_series(1, 100) g");
    let kept = r["rows"].as_array().unwrap().len();
    assert!((15..30).contains(&kept), "kept {kept}");
    assert_eq!((r["row_count"].as_u64(), r["truncated"].as_bool()), (Some(100), Some(true)));
    // One long value is cut; a row too large to read is left out, and the
    // session still answers the next call.
    let r = ok_sql(&d, &id, "SELECT repeat('y', 10000)");
    assert!(r["rows"][0][0].as_str().unwrap().ends_with("[5904 more bytes]"), "{r}");
    let r = ok_sql(&d, &id, "SELECT repeat('z', 9000000) AS big, 1 AS small");
    assert!(r["rows"][0][0].as_str().unwrap().contains("bytes was left out"), "{r}");
    assert_eq!(r["row_count"], 1);
    // A result set that is not the last is not returned; the last one is.
    let r = ok_sql(&d, &id, "SELECT 1 AS a; SELECT 'two' AS b");
    assert_eq!((r["columns"][0]["name"].as_str(), &r["rows"]), (Some("b"), &json!([["two"]])));
    // Statements run as the agent role, in the application database.
    assert_eq!(
        ok_sql(&d, &id, "SELECT current_user, current_database()")["rows"],
        json!([["airlock_agent", "app"]])
    );
    // Bad requests are refused with a code.
    let (status, e) = run_sql(&d, &id, "  ");
    assert_eq!((status, e["code"].as_str()), (400, Some("invalid_request")));
    let (status, e) = run_sql(&d, "sb-nope", "SELECT 1");
    assert_eq!((status, e["code"].as_str()), (404, Some("sandbox_not_found")));
    let (status, e) = d.api("POST", &format!("/v1/sandboxes/{id}/sql"), r#"{"query": "SELECT 1"}"#);
    assert_eq!(status, 400, "{e}");
}

#[test]
fn run_sql_errors_carry_postgres_fields_and_say_what_was_rolled_back() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let id = d.fork("shop", &[])["id"].as_str().unwrap().to_owned();
    let error = |sql: &str| {
        let (status, r) = run_sql(&d, &id, sql);
        assert_eq!(status, 200, "{r}");
        r
    };
    let r = error("SELECT * FROM nope");
    assert_eq!(r["error"]["sqlstate"], "42P01");
    assert_eq!(r["error"]["position"], 15);
    let r = error("INSERT INTO orders VALUES (1, 'paid', 1)");
    assert_eq!(r["error"]["sqlstate"], "23505");
    assert!(r["error"]["detail"].as_str().unwrap().contains("Key (id)=(1) already exists"), "{r}");
    let r = error("SELECT lenght('x')");
    assert_eq!(r["error"]["sqlstate"], "42883");
    assert!(r["error"]["hint"].as_str().unwrap().contains("No function matches"), "{r}");

    // One call is one transaction unless it says otherwise.
    let r = error("CREATE TABLE a (x int); INSERT INTO a VALUES (1); SELECT 1 / 0");
    assert_eq!((r["error"]["sqlstate"].as_str(), r["rolled_back"].as_u64()), (Some("22012"), Some(2)));
    assert!(r["note"].as_str().unwrap().contains("rolled back"), "{r}");
    let r = error("BEGIN; CREATE TABLE b (x int)");
    assert_eq!(r["rolled_back"], 1);
    assert!(r["note"].as_str().unwrap().contains("open transaction"), "{r}");
    let r = error("BEGIN; CREATE TABLE c (x int); COMMIT; SELECT 1 / 0");
    assert!(r.get("rolled_back").is_none(), "{r}");
    let r = ok_sql(&d, &id, "SELECT string_agg(tablename, ',' ORDER BY tablename) FROM pg_tables WHERE tablename IN ('a', 'b', 'c')");
    assert_eq!(r["rows"], json!([["c"]]));
}

#[test]
fn run_sql_obeys_the_sandbox_mode_and_its_limits() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let readonly = d.fork("shop", &["--mode", "readonly", "--statement-timeout", "1s"])["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_, r) = run_sql(&d, &readonly, "DELETE FROM orders");
    assert_eq!(r["error"]["sqlstate"], "25006", "{r}");
    let (_, r) = run_sql(&d, &readonly, "SELECT pg_sleep(10)");
    assert_eq!(r["error"]["sqlstate"], "57014", "{r}");
    assert_eq!(ok_sql(&d, &readonly, "SELECT count(*) FROM orders")["rows"], json!([[1000]]));
    // A suspended sandbox is woken by a call.
    d.ok(&["suspend", &readonly]);
    assert_eq!(ok_sql(&d, &readonly, "SELECT 1")["rows"], json!([[1]]));
    assert_eq!(d.json(&["show", &readonly])["state"], "running");
}

#[test]
fn schema_changes_and_reset_tools_compare_with_the_golden() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let id = d.fork("shop", &[])["id"].as_str().unwrap().to_owned();
    let (status, out) = tool(&d, &id, "describe_schema", json!({}));
    assert_eq!(status, 200, "{out}");
    let text = out["text"].as_str().unwrap();
    assert!(text.contains("orders (table, 1000 rows)"), "{text}");
    assert!(text.contains("constraint orders_pkey: PRIMARY KEY (id)"), "{text}");
    assert!(text.contains("<untrusted-data-"), "{text}");
    let (_, one) = tool(&d, &id, "describe_schema", json!({"table": "ORDERS"}));
    assert!(one["text"].as_str().unwrap().contains("status  text not null"), "{one}");
    // A table the model named that does not exist is its mistake: a tool
    // error it reads, with the tables it could name.
    let (status, e) = tool(&d, &id, "describe_schema", json!({"table": "nope"}));
    assert_eq!((status, e["is_error"].as_bool()), (200, Some(true)), "{e}");
    assert_eq!(e["result"]["error"]["code"], "invalid_arguments", "{e}");
    assert!(e["text"].as_str().unwrap().contains("the tables are: orders"), "{e}");

    let (_, empty) = tool(&d, &id, "changes_since_fork", json!({}));
    assert_eq!(
        (&empty["result"]["schema_changes"], &empty["result"]["row_changes"]),
        (&json!([]), &json!([]))
    );
    // What a rolled-back transaction changed is not a change.
    ok_sql(&d, &id, "BEGIN; INSERT INTO orders VALUES (5001, 'new', 1); ROLLBACK");
    ok_sql(&d, &id, "BEGIN; DELETE FROM orders WHERE id > 900; UPDATE orders SET status = 'y'; ROLLBACK");
    let (_, undone) = tool(&d, &id, "changes_since_fork", json!({}));
    assert_eq!(undone["result"]["row_changes"], json!([]), "{undone}");
    ok_sql(
        &d,
        &id,
        "BEGIN; INSERT INTO orders VALUES (5002, 'new', 1); ROLLBACK;
         DELETE FROM orders WHERE id <= 10; UPDATE orders SET status = 'x' WHERE id = 11;
         ALTER TABLE orders ADD COLUMN note text; CREATE TABLE extra (x int); INSERT INTO extra VALUES (1), (2), (3)",
    );
    let (_, changes) = tool(&d, &id, "changes_since_fork", json!(null));
    let result = &changes["result"];
    let lines: Vec<String> = result["schema_changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            format!(
                "{} {} {}",
                c["change"].as_str().unwrap(),
                c["object"].as_str().unwrap(),
                c["name"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(lines, ["added column orders.note", "added table extra"]);
    let orders = result["row_changes"].as_array().unwrap().iter().find(|r| r["table"] == "orders").unwrap();
    assert_eq!(
        (&orders["golden_rows"], &orders["rows"], &orders["deleted"], &orders["updated"]),
        (&json!(1000), &json!(990), &json!(10), &json!(1))
    );
    let extra = result["row_changes"].as_array().unwrap().iter().find(|r| r["table"] == "extra").unwrap();
    assert_eq!((extra.get("golden_rows"), &extra["rows"]), (None, &json!(3)));
    assert!(changes["text"].as_str().unwrap().contains("orders: 1000 -> 990"), "{changes}");

    let (status, out) = tool(&d, &id, "reset_database", json!({}));
    assert_eq!(status, 200, "{out}");
    assert_eq!(ok_sql(&d, &id, "SELECT count(*) FROM orders")["rows"], json!([[1000]]));
    let (_, after) = tool(&d, &id, "changes_since_fork", json!({}));
    assert_eq!(
        (&after["result"]["schema_changes"], &after["result"]["row_changes"]),
        (&json!([]), &json!([]))
    );

    // Tools take only the properties their schemas name; what a model sends
    // wrong (an invented argument, none at all, a wrong type) is a tool error
    // it reads, never an HTTP error the harness must handle.
    for (name, args, said) in [
        (
            "run_sql",
            json!({"sql": "SELECT 1", "database": "postgres"}),
            "run_sql has no argument \"database\"",
        ),
        ("run_sql", json!({}), "run_sql needs `sql`"),
        ("run_sql", json!({"sql": 7}), "`sql` must be a string"),
        ("run_redis", json!({"command": "GET k"}), "run_redis needs `command`"),
        ("test_migration", json!({"sql": "\\set x 1\nSELECT 1;"}), "psql meta-command"),
    ] {
        let (status, e) = tool(&d, &id, name, args.clone());
        assert_eq!((status, e["is_error"].as_bool()), (200, Some(true)), "{args}: {e}");
        assert_eq!(e["result"]["error"]["code"], "invalid_arguments", "{args}: {e}");
        assert!(e["text"].as_str().unwrap().contains(said), "{args}: {e}");
    }
    // A request that is not a tool call at all is the harness's: refused.
    let (status, _) = tool(&d, &id, "drop_everything", json!({}));
    assert_eq!(status, 400);
    let (status, e) = tool(&d, &id, "run_sql", json!(["SELECT 1"]));
    assert_eq!((status, e["code"].as_str()), (400, Some("invalid_request")), "{e}");
}

#[test]
fn every_tool_call_is_an_event_and_nothing_reveals_how_to_reach_the_database() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &["--mcp"]);
    let id = sb["id"].as_str().unwrap().to_owned();
    let mut outputs = Vec::new();
    for (name, args) in [
        ("run_sql", json!({"sql": "SELECT count(*) FROM orders"})),
        ("run_sql", json!({"sql": "SELECT * FROM missing_table"})),
        (
            "run_sql",
            json!({"sql": "SELECT inet_server_addr(), inet_server_port(), current_setting('unix_socket_directories')"}),
        ),
        ("describe_schema", json!({})),
        ("changes_since_fork", json!({})),
        ("reset_database", json!({})),
        ("run_sql", json!({"sql": "SELECT 1", "dsn": "x"})),
    ] {
        outputs.push(tool(&d, &id, name, args).1.to_string());
    }
    let events = d.json(&["events", "--sandbox", &id]);
    let calls: Vec<&Value> = events.as_array().unwrap().iter().filter(|e| e["kind"] == "tool_call").collect();
    assert_eq!(calls.len(), 7, "{events}");
    let first = &calls[0]["detail"];
    assert_eq!(
        (first["tool"].as_str(), first["statement"].as_str()),
        (Some("run_sql"), Some("SELECT count(*) FROM orders"))
    );
    assert_eq!((first["rows"].as_u64(), first["via"].as_str()), (Some(1), Some("rest")));
    assert!(first["duration_ms"].is_u64());
    assert_eq!(calls[1]["detail"]["error"], "42P01");
    assert_eq!(calls[6]["detail"]["error"], "invalid_arguments");
    outputs.push(events.to_string());

    let (_, password) = crate::harness::split_password(sb["dsn"].as_str().unwrap());
    let token = sb["mcp_url"].as_str().unwrap().rsplit('/').next().unwrap().to_owned();
    let home = d.home.display().to_string();
    for out in &outputs {
        for secret in [
            password.as_str(),
            token.as_str(),
            home.as_str(),
            &d.router,
            "postgresql://",
            "host=",
            ".s.PGSQL",
        ] {
            assert!(!out.contains(secret), "{secret:?} leaked in {out}");
        }
    }
    // The server has no TCP address to give away, and its socket directory is not the agent's to read.
    assert!(outputs[2].contains("42501"), "{}", outputs[2]);
}

#[test]
fn an_mcp_url_reaches_its_own_sandbox_only_and_dies_with_it() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &["--mcp"]);
    let url = sb["mcp_url"].as_str().unwrap().to_owned();
    let gateway =
        url.strip_prefix("http://127.0.0.1:").and_then(|rest| rest.split_once("/mcp/")).map(|(port, _)| port);
    let gateway = format!("127.0.0.1:{}", gateway.unwrap_or_else(|| panic!("{url}")));
    let path = url.split_once(&gateway).unwrap().1.to_owned();
    let post = |path: &str| {
        let mut s = TcpStream::connect(&gateway).unwrap();
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
        http(
            &mut s,
            "POST",
            path,
            "Accept: application/json, text/event-stream\r\nHost: 127.0.0.1\r\n",
            &init.to_string(),
        )
    };
    let (status, body) = post(&path);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"airlock\""), "{body}");
    // A wrong token, a different path and a token whose sandbox is gone all get a bare 404.
    let wrong = format!("/mcp/{}", "0".repeat(64));
    for p in [wrong.as_str(), "/mcp/", "/v1/sandboxes", "/"] {
        let (status, body) = post(p);
        assert_eq!((status, body.as_str()), (404, ""), "{p}");
    }
    d.ok(&["rm", sb["id"].as_str().unwrap()]);
    assert_eq!(post(&path), (404, String::new()));
    // Without a gateway, asking for one fails and leaves no sandbox behind.
    let off = Daemon::start(&["--gateway", "off"]);
    off.shop("shop");
    let (code, e) = off.fails(&["fork", "shop", "--mcp"]);
    assert_eq!((code, e["code"].as_str()), (3, Some("invalid_request")));
    assert!(off.json(&["ls"]).as_array().unwrap().is_empty());
}

#[test]
fn each_call_sees_a_fresh_session_though_the_daemon_reuses_one() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let id = d.fork("shop", &["--idle-suspend", "1s"])["id"].as_str().unwrap().to_owned();
    let first = ok_sql(
        &d,
        &id,
        "SET work_mem = '64kB'; SET ROLE airlock_owner; CREATE TEMP TABLE scratch (x int);
         PREPARE p AS SELECT 1; LISTEN somewhere; SELECT pg_advisory_lock(42); SELECT pg_backend_pid()",
    );
    let pid = first["rows"][0][0].clone();
    let state = "SELECT pg_backend_pid(), current_setting('work_mem'), current_user,
                        (SELECT count(*) FROM pg_prepared_statements), (SELECT count(*) FROM pg_listening_channels()),
                        (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'), to_regclass('pg_temp.scratch') IS NULL";
    let second = ok_sql(&d, &id, state);
    assert_eq!(second["rows"][0], json!([pid, "4MB", "airlock_agent", 0, 0, 0, true]), "{second}");
    // A transaction left open is rolled back before the session is used again.
    let (_, open) = run_sql(&d, &id, "BEGIN; CREATE TABLE half (x int)");
    assert_eq!(open["rolled_back"], 1);
    assert_eq!(ok_sql(&d, &id, "SELECT to_regclass('half') IS NULL")["rows"], json!([[true]]));
    // The kept session does not keep the sandbox awake, and is not used after a wake.
    d.wait_for(std::time::Duration::from_secs(20), "idle suspend", || {
        d.json(&["show", &id])["state"] == "suspended"
    });
    let after = ok_sql(&d, &id, "SELECT pg_backend_pid()");
    assert_ne!(after["rows"][0][0], pid);
    // A killed backend is replaced without the caller noticing.
    let steady = d.fork("shop", &["--idle-suspend", "0"])["id"].as_str().unwrap().to_owned();
    let victim = ok_sql(&d, &steady, "SELECT pg_backend_pid()")["rows"][0][0].as_i64().unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(victim as i32), nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    // Long enough for the signal to be handled; the backend may still be exiting.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let again = ok_sql(&d, &steady, "SELECT pg_backend_pid()")["rows"][0][0].as_i64().unwrap();
    assert_ne!(again, victim);
}

/// A tool call that meets its sandbox being suspended (or reset) under it is
/// answered as that, for the caller to ask again: never a server error. Each
/// round suspends the sandbox while `describe_schema` calls run on it.
#[test]
fn a_tool_call_cut_by_a_suspend_or_reset_says_so_and_is_never_a_server_error() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let id = d.fork("shop", &["--name", "kept"])["id"].as_str().unwrap().to_owned();
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let answered = std::sync::Arc::new(AtomicUsize::new(0));
    let callers: Vec<_> = (0..2)
        .map(|_| {
            let (socket, stop, answered) = (d.socket(), stop.clone(), answered.clone());
            std::thread::spawn(move || {
                let mut answers = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let mut s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
                    let (status, body) =
                        http(&mut s, "POST", "/v1/sandboxes/kept/tools/describe_schema", "", "{}");
                    if status == 200 {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                    answers.push((status, body));
                }
                answers
            })
        })
        .collect();
    for round in 0..12 {
        match round % 3 {
            0 | 1 => d.ok(&["suspend", &id]),
            _ => d.ok(&["reset", &id]),
        };
        std::thread::sleep(std::time::Duration::from_millis(150));
    }
    // Once the suspends and resets stop, calls are answered again (a loaded
    // host may take the whole of the rounds to wake the sandbox each time).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while answered.load(Ordering::Relaxed) < 6 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    let answers: Vec<(u16, String)> = callers.into_iter().flat_map(|c| c.join().unwrap()).collect();
    assert!(answers.iter().filter(|(s, _)| *s == 200).count() >= 6, "too few calls answered: {answers:?}");
    for (status, body) in &answers {
        assert!(*status < 500, "a server error: {status} {body}\nlog:\n{}", d.log());
        if *status != 200 {
            let said = ["while describe_schema ran", " is resetting", " is suspended", "not running"];
            assert!(said.iter().any(|s| body.contains(s)), "{status} {body}");
        }
    }
    let cut = answers.iter().filter(|(_, b)| b.contains("while describe_schema ran")).count();
    eprintln!("{} calls, {cut} cut by a suspend or reset", answers.len());
}
