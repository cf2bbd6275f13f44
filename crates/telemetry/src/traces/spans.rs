//! One audit record as a tree of spans.
//!
//! Every record becomes a span named after what it records, ending when the
//! record was written and starting as long before as the work took: a fork
//! (`ready`) with a child per step, a tool call, a migration test with a child
//! per candidate and a grandchild per statement, a router connection with its
//! startup, authentication and wake, a deletion (`reap` when the reaper did it).
//! Each span carries the hash and sequence number of its record, so the chain
//! is anchored outside the host; attributes come from the record, which holds
//! no secret.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};
use serde_json::Value;

use airlock_state::audit::checkpoint::Checkpoint;
use airlock_state::audit::record::Sealed;

fn time_of(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)
}

fn millis(v: Option<&Value>) -> f64 {
    v.and_then(Value::as_f64).unwrap_or(0.0).max(0.0)
}

fn since(end: SystemTime, ms: f64) -> SystemTime {
    end.checked_sub(Duration::from_secs_f64(ms / 1000.0)).unwrap_or(end)
}

/// The attributes every span of a record carries.
fn common(sealed: &Sealed) -> Vec<KeyValue> {
    let r = &sealed.record;
    let mut attrs = vec![
        KeyValue::new("airlock.audit.seq", r.seq as i64),
        KeyValue::new("airlock.audit.hash", sealed.hash.clone()),
        KeyValue::new("airlock.kind", r.kind.clone()),
        KeyValue::new("airlock.door", r.door.as_str()),
    ];
    if let Some(s) = &r.sandbox {
        attrs.push(KeyValue::new("airlock.sandbox", s.clone()));
    }
    if let Some(g) = &r.golden {
        attrs.push(KeyValue::new("airlock.golden", g.clone()));
    }
    if let Some(g) = r.generation {
        attrs.push(KeyValue::new("airlock.generation", g));
    }
    if let Some(reason) = &r.reason {
        attrs.push(KeyValue::new("airlock.reason", reason.clone()));
    }
    attrs
}

/// Starts a span from `start`; a child of `parent` when given.
fn open<T: Tracer>(
    tracer: &T,
    name: String,
    start: SystemTime,
    attrs: Vec<KeyValue>,
    parent: &Context,
) -> Context
where
    T::Span: Send + Sync + 'static,
{
    let span = tracer
        .span_builder(name)
        .with_kind(SpanKind::Internal)
        .with_start_time(start)
        .with_attributes(attrs)
        .start_with_context(tracer, parent);
    parent.with_span(span)
}

/// A child span laid end to end after the ones before it, within its parent.
fn steps<T: Tracer>(tracer: &T, parent: &Context, from: SystemTime, end: SystemTime, steps: &[(&str, f64)])
where
    T::Span: Send + Sync + 'static,
{
    let mut at = from;
    for (name, ms) in steps.iter().filter(|(_, ms)| *ms > 0.0) {
        let until = (at + Duration::from_secs_f64(ms / 1000.0)).min(end);
        let child = open(tracer, (*name).to_owned(), at, vec![KeyValue::new("airlock.step_ms", *ms)], parent);
        child.span().end_with_timestamp(until);
        at = until;
    }
}

/// Emits the spans of one record.
pub fn emit<T: Tracer>(tracer: &T, sealed: &Sealed)
where
    T::Span: Send + Sync + 'static,
{
    let r = &sealed.record;
    let d = &r.detail;
    let end = time_of(r.at.0);
    let mut attrs = common(sealed);
    let root = Context::new();
    match r.kind.as_str() {
        "ready" => {
            let total = millis(d.get("fork_ms"));
            let start = since(end, total);
            let pooled = d.get("from_pool").and_then(Value::as_bool).unwrap_or(false);
            let source = if d.get("branched_from").is_some() {
                "branch"
            } else if pooled {
                "pool"
            } else {
                "cold"
            };
            attrs.push(KeyValue::new("airlock.source", source));
            let fork = open(tracer, "fork".into(), start, attrs, &root);
            let st = d.get("steps").cloned().unwrap_or_default();
            let step = |key: &str| millis(st.get(key));
            let first = if pooled { "claim" } else { "clone" };
            let claim_or_clone = if pooled { step("credential_ms") } else { step("clone_ms") };
            let mut list = vec![(first, claim_or_clone), ("start", step("start_ms"))];
            if !pooled {
                list.push(("credential", step("credential_ms")));
            }
            list.push(("ready", step("ready_ms")));
            list.push(("stores", step("stores_ms")));
            steps(tracer, &fork, start, end, &list);
            fork.span().end_with_timestamp(end);
        }
        "tool_call" => {
            // Capped: the name is the caller's, and becomes the span's name.
            let tool: String =
                d.get("tool").and_then(Value::as_str).unwrap_or("unknown").chars().take(64).collect();
            attrs.push(KeyValue::new("airlock.tool", tool.clone()));
            let failed = d.get("error").is_some_and(|e| !e.is_null());
            attrs.push(KeyValue::new("airlock.outcome", if failed { "error" } else { "ok" }));
            let call = open(
                tracer,
                format!("tool_call {tool}"),
                since(end, millis(d.get("duration_ms"))),
                attrs,
                &root,
            );
            if failed {
                call.span().set_status(Status::error("the tool call failed"));
            }
            call.span().end_with_timestamp(end);
        }
        "migration_tested" => {
            let test =
                open(tracer, "migration_test".into(), since(end, millis(d.get("test_ms"))), attrs, &root);
            for c in d.get("candidates").and_then(Value::as_array).into_iter().flatten() {
                let passed = c.get("passed").and_then(Value::as_bool).unwrap_or(false);
                let name = c.get("name").and_then(Value::as_str).unwrap_or("candidate").to_owned();
                let took = millis(c.get("duration_ms"));
                let start = since(end, took);
                let candidate_attrs = vec![
                    KeyValue::new("airlock.candidate", name.clone()),
                    KeyValue::new(
                        "airlock.candidate.sha256",
                        c.get("sha256").and_then(Value::as_str).unwrap_or("").to_owned(),
                    ),
                    KeyValue::new("airlock.verdict", if passed { "passed" } else { "failed" }),
                    KeyValue::new(
                        "airlock.hazards",
                        c.get("hazards").map(|h| h.to_string()).unwrap_or_default(),
                    ),
                ];
                let candidate = open(tracer, format!("candidate {name}"), start, candidate_attrs, &test);
                let mut at = start;
                for st in c.get("statements").and_then(Value::as_array).into_iter().flatten() {
                    let ms = millis(st.get("ms"));
                    let until = (at + Duration::from_secs_f64(ms / 1000.0)).min(end);
                    let line = st.get("line").and_then(Value::as_i64).unwrap_or(0);
                    let mut statement_attrs = vec![KeyValue::new("airlock.statement.line", line)];
                    if let Some(tag) = st.get("tag").and_then(Value::as_str) {
                        statement_attrs.push(KeyValue::new("airlock.statement.tag", tag.to_owned()));
                    }
                    let statement =
                        open(tracer, format!("statement line {line}"), at, statement_attrs, &candidate);
                    statement.span().end_with_timestamp(until);
                    at = until;
                }
                if !passed {
                    candidate.span().set_status(Status::error("the candidate failed its test"));
                }
                candidate.span().end_with_timestamp(end);
            }
            test.span().end_with_timestamp(end);
        }
        "connected" | "connection_refused" => {
            let phases = d.get("phases").cloned().unwrap_or_default();
            let list = [
                ("startup", millis(phases.get("startup_ms"))),
                ("authentication", millis(phases.get("authentication_ms"))),
                ("wake", millis(phases.get("wake_ms"))),
                ("server_session", millis(phases.get("session_ms"))),
            ];
            let total: f64 = list.iter().map(|(_, ms)| ms).sum();
            let store = d.get("store").and_then(Value::as_str).unwrap_or("postgres").to_owned();
            attrs.push(KeyValue::new("airlock.store", store));
            attrs.push(KeyValue::new("airlock.tls", d.get("tls").and_then(Value::as_bool).unwrap_or(false)));
            // A router's summary of the refusals it counted rather than recorded.
            if let Some(many) = d.get("refusals").and_then(Value::as_i64) {
                attrs.push(KeyValue::new("airlock.refusals", many));
            }
            let start = since(end, total);
            let connection = open(tracer, "router_connection".into(), start, attrs, &root);
            steps(tracer, &connection, start, end, &list);
            if r.kind == "connection_refused" {
                connection.span().set_status(Status::error("the router refused the client"));
            }
            connection.span().end_with_timestamp(end);
        }
        "deleted" => {
            let name = if r.door == airlock_core::events::Door::Reaper { "reap" } else { "delete" };
            let span = open(tracer, name.into(), since(end, millis(d.get("delete_ms"))), attrs, &root);
            span.span().end_with_timestamp(end);
        }
        other => {
            let span = open(tracer, other.to_owned(), end, attrs, &root);
            span.span().end_with_timestamp(end);
        }
    }
}

/// Emits a signed checkpoint as a span, so it leaves the host too.
pub fn emit_checkpoint<T: Tracer>(tracer: &T, c: &Checkpoint)
where
    T::Span: Send + Sync + 'static,
{
    let at = time_of(c.at.0);
    let attrs = vec![
        KeyValue::new("airlock.audit.checkpoint.seq", c.seq as i64),
        KeyValue::new("airlock.audit.checkpoint.hash", c.hash.clone()),
        KeyValue::new("airlock.audit.checkpoint.key", c.key.clone()),
        KeyValue::new("airlock.audit.checkpoint.signature", c.signature.clone()),
    ];
    let span = open(tracer, "audit_checkpoint".into(), at, attrs, &Context::new());
    span.span().end_with_timestamp(at);
}
