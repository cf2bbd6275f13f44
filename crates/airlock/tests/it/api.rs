//! The REST API itself: its OpenAPI document, its error format, and TCP with a bearer token.

use serde_json::Value;

use crate::harness::{http, Daemon};

fn unix(d: &Daemon, method: &str, path: &str, body: &str) -> (u16, String) {
    d.api(method, path, body)
}

#[test]
fn openapi_documents_every_route() {
    let d = Daemon::start(&[]);
    let (status, body) = unix(&d, "GET", "/openapi.json", "");
    assert_eq!(status, 200);
    let doc: Value = serde_json::from_str(&body).unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc["paths"].as_object().unwrap();
    for (path, methods) in [
        ("/v1/health", &["get"][..]),
        ("/v1/doctor", &["get"]),
        ("/v1/shutdown", &["post"]),
        ("/v1/goldens", &["get", "post"]),
        ("/v1/goldens/{name}", &["get", "delete"]),
        ("/v1/goldens/{name}/refresh", &["post"]),
        ("/v1/goldens/{name}/pool", &["post"]),
        ("/v1/sandboxes", &["get", "post"]),
        ("/v1/sandboxes/{id}", &["get", "delete"]),
        ("/v1/sandboxes/{id}/extend", &["post"]),
        ("/v1/sandboxes/{id}/exec", &["post"]),
        ("/v1/sandboxes/{id}/reset", &["post"]),
        ("/v1/sandboxes/{id}/branch", &["post"]),
        ("/v1/sandboxes/{id}/promote", &["post"]),
        ("/v1/sandboxes/{id}/sql", &["post"]),
        ("/v1/sandboxes/{id}/tools/{tool}", &["post"]),
        ("/v1/tools", &["get"]),
        ("/v1/migrations/test", &["post"]),
        ("/v1/migrations/promote", &["post"]),
        ("/v1/events", &["get"]),
    ] {
        for m in methods {
            assert!(paths[path][m].is_object(), "{m} {path} is not documented");
        }
    }
    // Every error code is documented, and so is the status each maps to, on every operation.
    let codes = doc["components"]["schemas"]["ErrorCode"]["enum"].as_array().unwrap();
    assert!(codes.iter().any(|c| c == "capacity_exhausted") && codes.iter().any(|c| c == "disk_full"));
    for (path, item) in paths {
        for (method, op) in item.as_object().unwrap() {
            for status in ["400", "404", "500", "507"] {
                assert!(op["responses"][status].is_object(), "{method} {path} does not document {status}");
            }
        }
    }
    // Every event kind a record can carry is in the document.
    let kinds = doc["components"]["schemas"]["EventKind"]["enum"].as_array().unwrap();
    for kind in ["connection_refused", "watchdog", "disk_reserve", "migration_promoted", "woken"] {
        assert!(kinds.iter().any(|k| k == kind), "{kind} missing");
    }
}

#[test]
fn errors_axum_makes_itself_are_json_too() {
    let d = Daemon::start(&[]);
    for (method, path, status) in [("PUT", "/v1/goldens", 405), ("GET", "/v1/events?limit=many", 400)] {
        let mut s = std::os::unix::net::UnixStream::connect(d.socket()).unwrap();
        let (got, body) = http(&mut s, method, path, "", "");
        assert_eq!(got, status, "{method} {path}: {body}");
        let v: Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {body}"));
        assert!(v["code"].is_string() && v["hint"].is_string(), "{body}");
    }
}

#[test]
fn errors_are_json_with_code_message_and_hint() {
    let d = Daemon::start(&[]);
    for (method, path, body, status, code) in [
        ("GET", "/v1/nowhere", "", 400, "invalid_request"),
        ("POST", "/v1/sandboxes", "{not json", 400, "invalid_request"),
        ("POST", "/v1/sandboxes", r#"{"golden":"none"}"#, 404, "golden_not_found"),
        ("GET", "/v1/sandboxes/sb-none", "", 404, "sandbox_not_found"),
        ("POST", "/v1/sandboxes/sb-none/extend", r#"{"ttl_seconds":0}"#, 400, "invalid_ttl"),
        ("GET", "/v1/sandboxes?label=bad", "", 400, "invalid_label"),
        ("POST", "/v1/goldens", r#"{"name":"x","schema":["relative.sql"]}"#, 400, "invalid_request"),
    ] {
        let (got, body) = unix(&d, method, path, body);
        assert_eq!(got, status, "{method} {path}: {body}");
        let v: Value =
            serde_json::from_str(&body).unwrap_or_else(|_| panic!("{method} {path}: not JSON: {body}"));
        assert_eq!(v["code"], code, "{method} {path}: {body}");
        assert!(!v["message"].as_str().unwrap().is_empty());
        assert!(!v["hint"].as_str().unwrap().is_empty());
    }
}

/// Settings that would open a door are refused before anything listens: a
/// TCP API whose token is empty or short (an empty one matched a request with
/// no header at all), and metrics on an address other than loopback unless
/// asked for by name.
#[test]
fn configuration_that_would_open_a_door_is_refused() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    for token in ["", "\n", "short-token"] {
        let home = crate::harness::fresh_home(&crate::harness::plain_base());
        std::fs::create_dir_all(&home).unwrap();
        let file = home.join("token");
        std::fs::write(&file, token).unwrap();
        let mut d = Daemon::unstarted(home, &["--tcp", &addr, "--token-file", file.to_str().unwrap()]);
        let said = d.serve_fails();
        assert!(said.contains("invalid_request") && said.contains("at least 16"), "{token:?}: {said}");
        assert!(std::net::TcpStream::connect(&addr).is_err(), "nothing listens on {addr}");
    }
    let mut d = Daemon::unstarted(
        crate::harness::fresh_home(&crate::harness::plain_base()),
        &["--metrics", "0.0.0.0:0"],
    );
    let said = d.serve_fails();
    assert!(said.contains("--metrics-public"), "{said}");
    // The gateway's clients send tokens in plain HTTP.
    let mut d = Daemon::unstarted(
        crate::harness::fresh_home(&crate::harness::plain_base()),
        &["--gateway", "0.0.0.0:0"],
    );
    let said = d.serve_fails();
    assert!(said.contains("invalid_request") && said.contains("--gateway-public"), "{said}");
    let mut d =
        Daemon::unstarted(crate::harness::fresh_home(&crate::harness::plain_base()), &["--tcp", &addr]);
    let said = d.serve_fails();
    assert!(said.contains("token"), "{said}");
    // Plain HTTP or plaintext sessions off loopback carry secrets in clear.
    let home = crate::harness::fresh_home(&crate::harness::plain_base());
    std::fs::create_dir_all(&home).unwrap();
    let file = home.join("token");
    std::fs::write(&file, "a-token-long-enough-to-pass").unwrap();
    let public = format!("0.0.0.0:{port}");
    let mut d = Daemon::unstarted(home, &["--tcp", &public, "--token-file", file.to_str().unwrap()]);
    let said = d.serve_fails();
    assert!(said.contains("--tcp-public"), "{said}");
    for flag in ["--router", "--redis-router"] {
        let mut d = Daemon::unstarted(
            crate::harness::fresh_home(&crate::harness::plain_base()),
            &[flag, "0.0.0.0:0", "--tls", "off"],
        );
        let said = d.serve_fails();
        assert!(said.contains("--plaintext-public") && said.contains(flag), "{flag}: {said}");
    }
    // Said on purpose, the same addresses are served.
    let d = Daemon::start(&[
        "--metrics",
        "0.0.0.0:0",
        "--metrics-public",
        "--gateway",
        "0.0.0.0:0",
        "--gateway-public",
    ]);
    let doctor = d.json(&["doctor"]);
    assert!(doctor.to_string().contains("0.0.0.0") || d.log().contains("0.0.0.0"), "{doctor}");
    d.shop("shop");
    let sb = d.fork("shop", &["--mcp"]);
    assert!(sb["mcp_url"].as_str().is_some_and(|u| u.starts_with("http://")), "{sb}");
}

#[test]
fn tcp_needs_the_bearer_token() {
    let (_d, addr) = Daemon::start_with_tcp("s3cret-token-of-the-harness");
    let tcp = |headers: &str| {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        http(&mut s, "GET", "/v1/sandboxes", headers, "")
    };
    let (status, body) = tcp("");
    assert_eq!(status, 401);
    assert!(body.contains("unauthorized"));
    assert_eq!(tcp("Authorization: Bearer wrong\r\n").0, 401);
    let (status, body) = tcp("Authorization: Bearer s3cret-token-of-the-harness\r\n");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, "[]");
    // The CLI reaches it too, with the token from the environment.
    let out = std::process::Command::new(crate::harness::BIN)
        .args(["--url", &addr, "ls", "--json"])
        .env("AIRLOCK_TOKEN", "s3cret-token-of-the-harness")
        .env("AIRLOCK_HOME", "/nonexistent")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}
