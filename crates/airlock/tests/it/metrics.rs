//! Fleet health: a real Prometheus scrapes `airlock serve --metrics`, the
//! shipped alerting rules load, and the fleet-size alert fires; `promtool`
//! accepts the exposition and the rules; `airlock stats` shows the measures.

use std::io::Read;
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{dsn, http, split_password, sql, Daemon};

const RULES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/prometheus/airlock-rules.yml");

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// One GET over HTTP/1.0; the status and body.
pub(crate) fn get(addr: &str, path: &str, headers: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    http(&mut stream, "GET", path, headers, "")
}

/// A Prometheus server killed on drop.
struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn promtool(args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs (Debian's prometheus package)");
    if let Some(text) = stdin {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    } else {
        drop(child.stdin.take());
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
    )
}

fn start_prometheus(dir: &Path, target: &str, rules: &str) -> (Prometheus, String) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("rules.yml"), rules).unwrap();
    std::fs::write(
        dir.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [rules.yml]\n\
             scrape_configs:\n  - job_name: airlock\n    static_configs:\n      - targets: ['{target}']\n"
        ),
    )
    .unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address={addr}"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("prometheus runs (Debian's prometheus package)");
    (Prometheus(child), addr)
}

/// Asks Prometheus until `check` holds of a JSON answer, or fails with the last one.
fn until(
    prom: &str,
    path: &str,
    limit: Duration,
    what: &str,
    check: impl Fn(&Value) -> bool,
    log: &Path,
) -> Value {
    let deadline = Instant::now() + limit;
    let mut last = Value::Null;
    while Instant::now() < deadline {
        if let Ok(mut s) = TcpStream::connect(prom) {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let (status, body) = http(&mut s, "GET", path, "", "");
            if status == 200 {
                last = serde_json::from_str(&body).unwrap_or(Value::Null);
                if check(&last) {
                    return last;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let mut text = String::new();
    let _ = std::fs::File::open(log).and_then(|mut f| f.read_to_string(&mut text));
    panic!("{what}: Prometheus answered {last}\nits log:\n{text}");
}

fn alert_state(alerts: &Value, name: &str) -> Option<String> {
    alerts["data"]["alerts"]
        .as_array()?
        .iter()
        .find(|a| a["labels"]["alertname"] == name)
        .map(|a| a["state"].as_str().unwrap_or("").to_owned())
}

#[test]
fn a_real_prometheus_scrapes_the_fleet_and_the_fleet_alert_fires() {
    let metrics = format!("127.0.0.1:{}", free_port());
    let d = Daemon::start(&["--metrics", &metrics]);
    d.shop("shop");
    let a = d.fork("shop", &[]);
    let b = d.fork("shop", &[]);
    assert_eq!(sql(&dsn(&a), "SELECT count(*) FROM orders"), "1000");
    let a_id = a["id"].as_str().unwrap().to_owned();
    let tool = d.api("POST", &format!("/v1/sandboxes/{a_id}/sql"), r#"{"sql": "SELECT 1"}"#);
    assert_eq!(tool.0, 200);

    // The exposition: promtool accepts it; it never holds a secret.
    // The metrics follow the audit log, so each record shows up when the follower reaches it.
    d.wait_for(Duration::from_secs(10), "the metrics to count both forks and the tool call", || {
        let text = get(&metrics, "/metrics", "").1;
        text.contains("airlock_provisioning_seconds_count{golden=\"shop\",source=\"cold\",redis=\"no\"} 2")
            && text.contains("airlock_tool_calls_total{tool=\"run_sql\",outcome=\"ok\",door=\"api\"} 1")
            && text.contains("airlock_router_connections_total{outcome=\"accepted\",store=\"postgres\"} 1")
    });
    let (status, text) = get(&metrics, "/metrics", "");
    assert_eq!(status, 200);
    let (ok, out) = promtool(&["check", "metrics"], Some(&text));
    assert!(ok, "promtool check metrics: {out}\n{text}");
    for secret in [split_password(&dsn(&a)).1, split_password(&dsn(&b)).1] {
        assert!(!text.contains(&secret));
    }
    for line in [
        "airlock_isolation_ratio 1.0",
        "airlock_isolation_sessions 2.0",
        "airlock_collisions_current 0.0",
        "airlock_audit_completeness_ratio 1.0",
        "airlock_sandboxes{state=\"running\"} 2",
        "airlock_tool_calls_total{tool=\"run_sql\",outcome=\"ok\",door=\"api\"} 1",
        "airlock_router_connections_total{outcome=\"accepted\",store=\"postgres\"} 1",
    ] {
        assert!(text.contains(line), "no {line:?} in:\n{text}");
    }
    // OpenMetrics for a client that asks for it.
    let (_, open) = get(&metrics, "/metrics", "Accept: application/openmetrics-text; version=1.0.0\r\n");
    assert!(open.trim_end().ends_with("# EOF"), "{open}");

    // The shipped rules load as they are.
    let (ok, out) = promtool(&["check", "rules", RULES], None);
    assert!(ok, "promtool check rules: {out}");
    let shipped = std::fs::read_to_string(RULES).unwrap();
    let fleet = "expr: sum(airlock_sandboxes{state=~\"running|suspended\"}) > 100\n        for: 2m";
    assert!(shipped.contains(fleet), "the fleet-size rule changed: update this test");
    // With the fleet threshold at one sandbox, the alert fires on two.
    let rules = shipped
        .replace(fleet, "expr: sum(airlock_sandboxes{state=~\"running|suspended\"}) > 1\n        for: 0s");
    let dir = d.home.join("prometheus");
    let (_prometheus, prom) = start_prometheus(&dir, &metrics, &rules);
    let log = dir.join("prometheus.log");
    let up = until(
        &prom,
        "/api/v1/query?query=airlock_isolation_ratio",
        Duration::from_secs(60),
        "a scrape",
        |v| v["data"]["result"].as_array().is_some_and(|r| !r.is_empty()),
        &log,
    );
    assert_eq!(up["data"]["result"][0]["value"][1], "1", "{up}");
    let alerts = until(
        &prom,
        "/api/v1/alerts",
        Duration::from_secs(60),
        "the fleet alert to fire",
        |v| alert_state(v, "AirlockFleetTooLarge").as_deref() == Some("firing"),
        &log,
    );
    // A healthy fleet fires nothing else.
    for quiet in
        ["AirlockCollision", "AirlockAuditIncomplete", "AirlockIsolationBelowTarget", "AirlockReapLagHigh"]
    {
        assert_eq!(alert_state(&alerts, quiet), None, "{quiet} fired: {alerts}");
    }
    // Below the threshold again, it resolves.
    d.ok(&["rm", b["id"].as_str().unwrap()]);
    until(
        &prom,
        "/api/v1/alerts",
        Duration::from_secs(60),
        "the fleet alert to resolve",
        |v| alert_state(v, "AirlockFleetTooLarge").is_none(),
        &log,
    );

    // `airlock stats` shows the same measures (the check runs every 2 s).
    d.wait_for(Duration::from_secs(10), "the check to see one session", || {
        d.json(&["stats"])["isolation"]["sessions"] == 1
    });
    let stats = d.json(&["stats"]);
    assert_eq!(stats["isolation"]["ratio"], 1.0, "{stats}");
    assert_eq!(stats["isolation"]["sessions"], 1, "{stats}");
    assert_eq!(stats["collisions"]["total"], 0, "{stats}");
    assert_eq!(stats["audit"]["ratio"], 1.0, "{stats}");
    assert!(stats["audit"]["with_record"].as_u64().unwrap() >= 6, "{stats}");
    let cold = stats["provisioning"].as_array().unwrap().iter().find(|l| l["of"] == "cold").unwrap();
    assert_eq!(cold["count"], 2, "{stats}");
    let text = d.ok(&["stats"]);
    assert!(text.contains("isolation") && text.contains("100.0%"), "{text}");
}

#[test]
fn the_isolation_check_sees_a_server_that_is_not_its_sandboxs_own() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let a = d.fork("shop", &[]);
    let b = d.fork("shop", &[]);
    let (a_id, b_id) = (a["id"].as_str().unwrap().to_owned(), b["id"].as_str().unwrap().to_owned());
    d.wait_for(Duration::from_secs(10), "the check to see two dedicated sessions", || {
        d.json(&["stats"])["isolation"]["dedicated"] == 2
    });
    // Give b's record a's OS user, as a bug in the leases would: the check
    // reads the processes, and sees b's server running as another user than
    // its record says and two sandboxes claiming one user.
    let db = rusqlite::Connection::open(d.home.join("state.db")).unwrap();
    let uid_of = |id: &str| -> Option<i64> {
        db.query_row("SELECT os_uid FROM sandboxes WHERE id = ?1", [id], |r| r.get(0)).unwrap()
    };
    let (uid_a, uid_b) = (uid_of(&a_id), uid_of(&b_id));
    assert!(uid_a.is_some() && uid_a != uid_b, "sandboxes run as uids of their own when root");
    db.execute("UPDATE sandboxes SET os_uid = ?1 WHERE id = ?2", rusqlite::params![uid_a, b_id]).unwrap();
    d.wait_for(Duration::from_secs(10), "the check to see the shared user", || {
        d.json(&["stats"])["collisions"]["total"].as_u64().unwrap_or(0) >= 1
    });
    let stats = d.json(&["stats"]);
    assert!(stats["isolation"]["ratio"].as_f64().unwrap() < 1.0, "{stats}");
    let current = stats["collisions"]["current"].as_array().unwrap();
    assert!(current.iter().any(|c| c["shared"] == "os_user"), "{stats}");
    assert!(stats["isolation"]["not_dedicated"].to_string().contains("not its own"), "{stats}");
    // Each collision is on record once while it lasts (here the process and
    // the directory are both shared).
    std::thread::sleep(Duration::from_secs(5));
    let records = d.json(&["audit", "ls", "--kind", "collision"]);
    let shared: Vec<&str> =
        records.as_array().unwrap().iter().map(|r| r["detail"]["shared"].as_str().unwrap()).collect();
    let mut distinct = shared.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(shared.len(), distinct.len(), "{records}");
    assert!(shared.contains(&"os_user"), "{records}");
    assert!(d.ok(&["stats"]).contains("BAD"));
    // Put right, the check sees it gone (the total stays).
    db.execute("UPDATE sandboxes SET os_uid = ?1 WHERE id = ?2", rusqlite::params![uid_b, b_id]).unwrap();
    d.wait_for(Duration::from_secs(10), "the check to see every session dedicated again", || {
        let stats = d.json(&["stats"]);
        stats["isolation"]["ratio"] == 1.0 && stats["collisions"]["current"].as_array().unwrap().is_empty()
    });
}
