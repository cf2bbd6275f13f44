//! Floods of idle, stalled and slow connections on every listener an agent can
//! reach (the router's PostgreSQL and Redis ports, the MCP gateway), sent from
//! the very address the owner connects from, so nothing can tell the two apart
//! by address: the owner must still get in at once, and sessions already at
//! work must not be cut.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::json;

use super::Scene;
use crate::harness::{psql_within, Daemon};

/// `count` connections to `addr` from 127.0.0.1 (the owner's own address):
/// every other one sends `first` and then stalls, the rest send nothing.
fn flood(addr: &str, count: usize, first: &[u8]) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for n in 0..count {
        let Ok(mut c) = TcpStream::connect(addr) else { continue };
        if n % 2 == 0 {
            let _ = c.write_all(first);
        }
        held.push(c);
    }
    held
}

/// Whether, within a few seconds, the far end has closed all but `kept` of
/// `held` (the router closes the connections whose slots it gave away as it
/// goes, so the last of them may still be closing when the flood ends).
fn closes_all_but(held: &mut [TcpStream], kept: usize) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        if closed(held) >= held.len().saturating_sub(kept) {
            return true;
        }
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// How many of `held` the far end has closed (a read that ends or fails at once).
fn closed(held: &mut [TcpStream]) -> usize {
    held.iter_mut()
        .filter_map(|c| {
            c.set_nonblocking(true).unwrap();
            let mut buf = [0u8; 4096];
            loop {
                match c.read(&mut buf) {
                    Ok(0) => return Some(()),
                    Ok(_) => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return None,
                    Err(_) => return Some(()),
                }
            }
        })
        .count()
}

#[test]
fn a_flood_from_the_owners_own_address_holds_no_router_slot_against_it() {
    // Few slots and a long startup timeout: a flood that could hold its slots
    // would keep the owner out for a minute.
    let s = Scene::with(&["--router-max-connections", "24", "--router-startup-timeout", "60s"], &[]);
    // A session already at work is never the one to give its slot up.
    let working = crate::harness::spawn_psql(&s.agent, "SELECT pg_sleep(4), 'still here'");
    std::thread::sleep(Duration::from_millis(500));
    let packet = crate::wire::startup_packet(196608, &[("user", "airlock_agent"), ("database", &s.id)]);
    let mut held = flood(s.router(), 60, &packet);
    for round in 0..5 {
        let answered = psql_within(&s.agent, "SELECT 1", Duration::from_secs(8));
        assert_eq!(answered.as_deref(), Ok("1"), "round {round}: the owner was kept out by the flood");
        // The flood goes on: more stalled logins from the same address.
        held.extend(flood(s.router(), 10, &packet));
    }
    let out = working.wait_with_output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("still here"),
        "the session at work was cut: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The flood churned its own members out: most of them were closed.
    assert!(closes_all_but(&mut held, 24), "the flood kept more than the router's slots");
    s.untouched();
}

#[test]
fn a_flood_from_the_owners_own_address_holds_no_redis_slot_against_it() {
    let d = Daemon::start(&["--router-max-connections", "16", "--router-startup-timeout", "60s"]);
    crate::redis::golden_with_redis(&d, "cache");
    let sb = d.fork("cache", &[]);
    let url = sb["redis_url"].as_str().expect("a routed Redis URL").to_owned();
    let rest = url.split_once("://").unwrap().1;
    let (auth, _) = rest.rsplit_once('@').unwrap();
    let (user, password) = auth.split_once(':').unwrap();
    // An authenticated client at work keeps its connection.
    let mut working = TcpStream::connect(&d.redis_router).unwrap();
    working.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = format!("AUTH {user} {password}\r\n");
    working.write_all(auth.as_bytes()).unwrap();
    let mut ok = [0u8; 5];
    working.read_exact(&mut ok).unwrap();
    assert_eq!(&ok, b"+OK\r\n");
    // Half the flood names the sandbox and never finishes its AUTH line.
    let mut held = flood(&d.redis_router, 40, format!("AUTH {user} ").as_bytes());
    for round in 0..5 {
        let mut c = TcpStream::connect(&d.redis_router).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
        c.write_all(format!("{auth}GET greeting\r\n").as_bytes()).unwrap();
        let mut answer = Vec::new();
        let mut buf = [0u8; 256];
        while !String::from_utf8_lossy(&answer).contains("hello world") {
            match c.read(&mut buf) {
                Ok(n) if n > 0 => answer.extend_from_slice(&buf[..n]),
                other => panic!("round {round}: the owner was kept out: {other:?} after {answer:?}"),
            }
        }
        held.extend(flood(&d.redis_router, 10, format!("AUTH {user} ").as_bytes()));
    }
    working.write_all(b"PING\r\n").unwrap();
    let mut pong = [0u8; 7];
    working.read_exact(&mut pong).expect("the authenticated client keeps its connection");
    assert_eq!(&pong, b"+PONG\r\n");
    assert!(closes_all_but(&mut held, 16), "the flood kept more than the router's slots");
}

/// The gateway's `host:port` and the path of an MCP URL.
fn gateway_of(url: &str) -> (String, String) {
    let rest = url.strip_prefix("http://").unwrap();
    let (addr, path) = rest.split_once('/').unwrap();
    (addr.to_owned(), format!("/{path}"))
}

/// One MCP `tools/call` of `run_sql` through the gateway; the HTTP status and
/// body. An answer must come within 8 s (the gateway's header timeout, which
/// frees a slot an idle connection holds, is 10 s).
fn run_sql(gateway: &str, path: &str, sql: &str) -> (u16, String) {
    let mut s = TcpStream::connect(gateway).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "run_sql", "arguments": {"sql": sql}}});
    crate::harness::http(
        &mut s,
        "POST",
        path,
        "Accept: application/json, text/event-stream\r\nHost: 127.0.0.1\r\nMCP-Protocol-Version: 2025-06-18\r\n",
        &call.to_string(),
    )
}

#[test]
fn the_gateway_gives_idle_slots_to_newcomers_and_one_sandbox_a_share_of_the_rest() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let mine = d.fork("shop", &["--mcp"]);
    let other = d.fork("shop", &["--mcp"]);
    let (gateway, path) = gateway_of(mine["mcp_url"].as_str().unwrap());
    let (_, other_path) = gateway_of(other["mcp_url"].as_str().unwrap());
    let (status, body) = run_sql(&gateway, &path, "SELECT 41 + 1");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("42"), "{body}");

    // A call at work keeps its slot through a flood of idle and trickling
    // connections larger than the gateway's 256.
    let slow = {
        let (gateway, path) = (gateway.clone(), path.clone());
        std::thread::spawn(move || run_sql(&gateway, &path, "SELECT pg_sleep(3), 'slow done'"))
    };
    std::thread::sleep(Duration::from_millis(300));
    let mut held = flood(&gateway, 300, b"POST /mcp/");
    let (status, body) = run_sql(&gateway, &other_path, "SELECT 'other in'");
    assert_eq!(status, 200, "the other tenant was kept out: {body}");
    assert!(body.contains("other in"), "{body}");
    let (status, body) = slow.join().unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("slow done"), "the call at work was cut: {body}");
    assert!(closed(&mut held) >= 300 - 256, "the flood kept more than the gateway's slots");
    drop(held);

    // One sandbox's slow calls hold at most its share; the others are told so
    // at once, and another sandbox's calls still answer.
    let calls: Vec<_> = (0..12)
        .map(|_| {
            let (gateway, path) = (gateway.clone(), path.clone());
            std::thread::spawn(move || run_sql(&gateway, &path, "SELECT pg_sleep(3)"))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1000));
    let (status, body) = run_sql(&gateway, &other_path, "SELECT 'still in'");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("still in"), "{body}");
    let statuses: Vec<u16> = calls.into_iter().map(|c| c.join().unwrap().0).collect();
    let refused = statuses.iter().filter(|&&s| s == 429).count();
    assert!(refused >= 4, "one sandbox had more than its share at work: {statuses:?}");
    assert!(statuses.iter().all(|&s| s == 200 || s == 429), "{statuses:?}");
}

/// Wrong passwords as fast as a client can send them, on the router's Redis
/// and PostgreSQL ports, by someone who knows only the sandbox's name: the
/// audit log records the first few one by one and then one record a window
/// that counts the rest, so it grows by a bounded number of records however
/// many come, while every refusal is still counted (in the log and in the
/// metrics) and the owner's own connections are recorded as ever.
#[test]
fn a_flood_of_wrong_passwords_is_counted_in_the_audit_log_not_written_one_by_one() {
    let metrics = format!("127.0.0.1:{}", crate::metrics::free_port());
    let d = Daemon::start(&["--metrics", &metrics]);
    crate::redis::golden_with_redis(&d, "cache");
    let sb = d.fork("cache", &[]);
    let id = sb["id"].as_str().unwrap().to_owned();
    let (redis_tries, psql_tries) = (400, 40);
    let began = std::time::Instant::now();
    for n in 0..redis_tries {
        let mut c = TcpStream::connect(&d.redis_router).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(format!("AUTH {id} wrong{n}\r\n").as_bytes()).unwrap();
        let mut answer = [0u8; 10];
        c.read_exact(&mut answer).unwrap();
        assert_eq!(&answer, b"-WRONGPASS", "try {n}");
    }
    let (agent, _) = crate::harness::split_password(&crate::harness::dsn(&sb));
    let wrong = agent.replace("airlock_agent@", "airlock_agent:wrong@");
    let tries = std::process::Command::new("sh")
        .args(["-c", &format!("seq {psql_tries} | xargs -P4 -I{{}} psql '{wrong}' -Atc 'SELECT 1' 2>&1")])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&tries.stdout);
    assert_eq!(said.matches("password authentication failed").count(), psql_tries, "{said}");
    // The owner gets in, on record.
    let owner = crate::harness::dsn(&sb);
    assert_eq!(crate::harness::sql(&owner, "SELECT 1"), "1");
    let refused = || -> Vec<serde_json::Value> {
        let events = d.json(&["events", "--sandbox", &id, "--limit", "100000"]);
        events.as_array().unwrap().iter().filter(|e| e["kind"] == "connection_refused").cloned().collect()
    };
    let counted = |records: &[serde_json::Value]| -> u64 {
        records.iter().map(|e| e["detail"]["refusals"].as_u64().unwrap_or(1)).sum()
    };
    // Windows close every 10 s; the last one's record comes then.
    d.wait_for(Duration::from_secs(30), "every refusal counted", || {
        counted(&refused()) == (redis_tries + psql_tries) as u64
    });
    let records = refused();
    // In each 10 s window: at most 10 one by one and one summary, for each store.
    let windows = began.elapsed().as_secs() / 10 + 2;
    assert!(
        records.len() >= 10 && records.len() as u64 <= 2 * 11 * windows,
        "{} records for {} refusals in {windows} windows: {records:#?}",
        records.len(),
        redis_tries + psql_tries
    );
    let summaries: Vec<_> = records.iter().filter(|e| e["detail"]["refusals"].is_u64()).collect();
    assert!(!summaries.is_empty());
    for s in &summaries {
        let d = &s["detail"];
        assert!(d["first_at"].is_string() && d["last_at"].is_string(), "{s}");
        // Every refusal came from the test's own address.
        assert_eq!(d["sources"]["127.0.0.1"], d["refusals"], "{s}");
        let said = s.to_string();
        assert!(!said.contains("wrong"), "a password reached the log: {said}");
    }
    // Each store's refusals are counted as that store's.
    let of_store = |store: &str| -> u64 {
        let mine: Vec<_> = records
            .iter()
            .filter(|e| e["detail"]["store"].as_str().unwrap_or("postgres") == store)
            .cloned()
            .collect();
        counted(&mine)
    };
    assert_eq!((of_store("redis"), of_store("postgres")), (redis_tries as u64, psql_tries as u64));
    let kinds: Vec<String> = d
        .json(&["events", "--sandbox", &id])
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_owned())
        .collect();
    assert!(kinds.iter().any(|k| k == "connected"), "the owner's connection is not on record: {kinds:?}");
    // The metrics count each refusal once.
    d.wait_for(Duration::from_secs(10), "the metrics to count every refusal", || {
        let text = crate::metrics::get(&metrics, "/metrics", "").1;
        let refused = |store: &str| -> f64 {
            let labels = format!("airlock_router_connections_total{{outcome=\"refused\",store=\"{store}\"}}");
            text.lines()
                .filter(|l| l.starts_with(&labels))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        refused("redis") == redis_tries as f64 && refused("postgres") == psql_tries as f64
    });
}
