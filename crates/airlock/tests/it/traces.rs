//! Traces: a real OTLP/HTTP receiver, decoding requests with the
//! `opentelemetry-proto` definitions, gets the spans of a fork, a router
//! connection, a tool call and a migration test, with the right parents and
//! attributes, the hash of every audit record, the checkpoints, and no secret.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

use crate::harness::{cow_base, dsn, fresh_home, plain_base, split_password, sql, Daemon};

/// What the receiver got: every span, and every request body as it came.
#[derive(Default)]
struct Received {
    spans: Vec<Span>,
    bodies: Vec<Vec<u8>>,
    service_names: Vec<String>,
}

/// Serves one keep-alive connection of OTLP/HTTP requests.
fn serve(stream: TcpStream, got: Arc<Mutex<Received>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
        let mut length = 0usize;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        assert_eq!(path, "/v1/traces");
        let request = ExportTraceServiceRequest::decode(body.as_slice()).expect("an OTLP trace request");
        {
            let mut got = got.lock().unwrap();
            for resource in request.resource_spans {
                if let Some(r) = &resource.resource {
                    for kv in &r.attributes {
                        if kv.key == "service.name" {
                            if let Some(AnyValue::StringValue(s)) =
                                kv.value.as_ref().and_then(|v| v.value.clone())
                            {
                                got.service_names.push(s);
                            }
                        }
                    }
                }
                for scope in resource.scope_spans {
                    got.spans.extend(scope.spans);
                }
            }
            got.bodies.push(body);
        }
        let answer = ExportTraceServiceResponse::default().encode_to_vec();
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\n\r\n",
            answer.len()
        );
        if writer.write_all(head.as_bytes()).and_then(|()| writer.write_all(&answer)).is_err() {
            return;
        }
    }
}

/// Starts the receiver; its address and what it gets.
fn receiver() -> (String, Arc<Mutex<Received>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let got = Arc::new(Mutex::new(Received::default()));
    let shared = got.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let got = shared.clone();
            std::thread::spawn(move || serve(stream, got));
        }
    });
    (addr, got)
}

fn attr(span: &Span, key: &str) -> Option<String> {
    let value = span.attributes.iter().find(|kv| kv.key == key)?.value.as_ref()?.value.clone()?;
    Some(match value {
        AnyValue::StringValue(s) => s,
        AnyValue::IntValue(i) => i.to_string(),
        AnyValue::BoolValue(b) => b.to_string(),
        AnyValue::DoubleValue(d) => d.to_string(),
        other => format!("{other:?}"),
    })
}

fn children<'a>(spans: &'a [Span], parent: &Span) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.parent_span_id == parent.span_id && s.trace_id == parent.trace_id).collect()
}

fn names(spans: &[&Span]) -> Vec<String> {
    spans.iter().map(|s| s.name.clone()).collect()
}

#[test]
fn a_real_otlp_receiver_gets_the_spans_of_each_operation_anchored_in_the_audit_log() {
    let (endpoint, got) = receiver();
    let mut d = Daemon::unstarted(fresh_home(&cow_base().unwrap_or_else(plain_base)), &[]);
    d.env = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), format!("http://{endpoint}")),
        ("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into()),
        ("OTEL_SERVICE_NAME".into(), "airlock-under-test".into()),
    ];
    d.spawn();
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let id = sb["id"].as_str().unwrap().to_owned();
    let password = split_password(&dsn(&sb)).1;
    assert_eq!(sql(&dsn(&sb), "SELECT count(*) FROM orders"), "1000");
    let tool = d.api("POST", &format!("/v1/sandboxes/{id}/sql"), r#"{"sql": "SELECT 1"}"#);
    assert_eq!(tool.0, 200);
    let file = d.home.join("m.sql");
    std::fs::write(
        &file,
        "ALTER TABLE orders ADD COLUMN note text;\nCREATE INDEX CONCURRENTLY orders_status ON orders (status);\n",
    )
    .unwrap();
    d.ok(&["migrate", "test", "--golden", "shop", file.to_str().unwrap()]);
    d.ok(&["rm", &id]);
    let checkpoint = d.json(&["audit", "checkpoint"]);

    // Every record's hash reaches the receiver, and the checkpoint.
    let records = d.json(&["audit", "ls", "--limit", "100000"]);
    let hashes: Vec<String> =
        records.as_array().unwrap().iter().map(|r| r["hash"].as_str().unwrap().to_owned()).collect();
    d.wait_for(Duration::from_secs(30), "every record and the checkpoint to be exported", || {
        let got = got.lock().unwrap();
        let exported: Vec<String> = got.spans.iter().filter_map(|s| attr(s, "airlock.audit.hash")).collect();
        hashes.iter().all(|h| exported.contains(h))
            && got
                .spans
                .iter()
                .any(|s| attr(s, "airlock.audit.checkpoint.hash").as_deref() == checkpoint["hash"].as_str())
    });
    let got = got.lock().unwrap();
    let spans = &got.spans;
    assert!(got.service_names.iter().all(|s| s == "airlock-under-test"), "{:?}", got.service_names);
    let by_kind: HashMap<String, &Span> = spans
        .iter()
        .filter_map(|s| attr(s, "airlock.kind").map(|k| (format!("{k}/{}", s.name), s)))
        .collect();

    // The fork: its steps are its children, in its trace, within its time.
    let fork = spans
        .iter()
        .find(|s| s.name == "fork" && attr(s, "airlock.sandbox").as_deref() == Some(&id))
        .unwrap();
    assert_eq!(attr(fork, "airlock.golden").as_deref(), Some("shop"));
    assert_eq!(attr(fork, "airlock.generation").as_deref(), Some("1"));
    assert_eq!(attr(fork, "airlock.door").as_deref(), Some("api"));
    assert_eq!(attr(fork, "airlock.source").as_deref(), Some("cold"));
    assert!(fork.parent_span_id.is_empty(), "a fork is a trace of its own");
    let ready = records
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == "ready" && r["sandbox"] == id.as_str())
        .unwrap();
    assert_eq!(attr(fork, "airlock.audit.hash").as_deref(), ready["hash"].as_str());
    let steps = children(spans, fork);
    let step_names = names(&steps);
    for step in ["clone", "start", "ready"] {
        assert!(step_names.contains(&step.to_owned()), "{step_names:?}");
    }
    // A default fork of a golden that holds its role makes none: no step of
    // no time is a span.
    assert!(!step_names.contains(&"credential".to_owned()), "{step_names:?}");
    for step in &steps {
        assert!(step.start_time_unix_nano >= fork.start_time_unix_nano, "{step:?}");
        assert!(step.end_time_unix_nano <= fork.end_time_unix_nano, "{step:?}");
    }
    assert!(fork.end_time_unix_nano > fork.start_time_unix_nano);

    // The router connection: startup, authentication, then the server session.
    let connection = by_kind.get("connected/router_connection").expect("a router connection span");
    assert_eq!(attr(connection, "airlock.door").as_deref(), Some("router"));
    let phases = names(&children(spans, connection));
    for phase in ["startup", "authentication", "server_session"] {
        assert!(phases.contains(&phase.to_owned()), "{phases:?}");
    }

    // The tool call, and the migration test with its candidate and statements.
    let call = by_kind.get("tool_call/tool_call run_sql").expect("a tool call span");
    assert_eq!(attr(call, "airlock.tool").as_deref(), Some("run_sql"));
    assert_eq!(attr(call, "airlock.outcome").as_deref(), Some("ok"));
    let test = by_kind.get("migration_tested/migration_test").expect("a migration test span");
    let candidates = children(spans, test);
    assert_eq!(candidates.len(), 1, "{:?}", names(&candidates));
    assert_eq!(attr(candidates[0], "airlock.verdict").as_deref(), Some("passed"));
    let statements = children(spans, candidates[0]);
    let lines: Vec<String> = statements.iter().filter_map(|s| attr(s, "airlock.statement.line")).collect();
    assert_eq!(lines, ["1", "2"], "{:?}", names(&statements));
    assert!(statements.iter().any(|s| attr(s, "airlock.statement.tag").as_deref() == Some("CREATE INDEX")));
    assert!(by_kind.contains_key("deleted/delete"));

    // No secret in anything sent.
    for body in &got.bodies {
        assert!(!body.windows(password.len()).any(|w| w == password.as_bytes()), "the password was exported");
    }
}
