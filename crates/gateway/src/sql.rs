//! `run_sql`: one query string run as the agent role, with its result capped
//! while it streams.
//!
//! Each call runs on a session on the sandbox's private socket, logged in as the
//! agent role with the sandbox's own credential, so the access mode and its limits
//! (statement timeout, lock timeout, read-only) apply exactly as they do to any
//! client. The session is kept for the next call but reset first
//! ([`super::sessions`]), so every call sees a fresh one. Several statements run in order as one simple query: each one's tag is
//! reported, and the last result set is returned, its first [`ROW_CAP`] rows and
//! at most about [`BYTE_CAP`] bytes; later rows are counted, not kept.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::sessions::SessionCache;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_lifecycle::engine::Engine;
use airlock_postgres::wire::{self, DbError, Field, Session, Sink};

/// Most rows returned from a result set.
pub const ROW_CAP: usize = 200;
/// About the most bytes of row values returned from a result set.
pub const BYTE_CAP: usize = 64 << 10;
/// Longest text kept of one value; the rest is replaced by a note of its length.
pub const VALUE_CAP: usize = 4 << 10;
/// Longest query string accepted.
pub const MAX_SQL: usize = 1 << 20;
/// Time allowed beyond the sandbox's statement timeout before a call is cancelled
/// (several statements each get the full statement timeout).
const GRACE: Duration = Duration::from_secs(5);

/// What one `run_sql` call did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SqlResult {
    /// Each statement that finished, in order, with its command tag.
    pub statements: Vec<Statement>,
    /// The columns of the last result set.
    pub columns: Vec<Column>,
    /// The rows kept of the last result set, as JSON values (numbers, booleans,
    /// JSON for json/jsonb, text otherwise, null for NULL).
    pub rows: Vec<Vec<Value>>,
    /// How many rows the last result set had in all.
    pub row_count: u64,
    /// Whether rows or values were left out.
    pub truncated: bool,
    /// A sentence saying what was left out, when something was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// PostgreSQL's error, when a statement failed; statements after it did not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<DbError>,
    /// How many of the finished statements were undone when the call ended: those
    /// in the transaction a failure aborted, or in one left open (each call is its
    /// own session, so a transaction never spans calls).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rolled_back: u64,
    /// Wall time, milliseconds.
    pub duration_ms: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One finished statement.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Statement {
    /// PostgreSQL's command tag, such as `INSERT 0 3` or `CREATE TABLE`.
    pub tag: String,
    /// Rows affected or returned, when the tag says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<u64>,
}

/// One column of a result set.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Column {
    /// Its name.
    pub name: String,
    /// Its type, as PostgreSQL spells it (`integer`, `character varying(20)`).
    #[serde(rename = "type")]
    pub type_name: String,
}

/// Refuses SQL no server could take: empty, with a NUL byte, or too long.
fn check(sql: &str) -> Result<()> {
    if sql.trim().is_empty() {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            "the sql is empty",
            "send one or more SQL statements",
        ));
    }
    if let Some(at) = sql.find('\0') {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            format!("the sql holds a NUL byte (at byte {at}), which no SQL text can"),
            "remove the NUL byte; to store binary data use a bytea literal such as '\\x00'",
        ));
    }
    if sql.len() > MAX_SQL {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            format!("the sql is {} bytes; at most {MAX_SQL} are accepted", sql.len()),
            "send smaller batches of statements",
        ));
    }
    Ok(())
}

/// Runs `sql` in a sandbox as its agent role.
pub async fn run(engine: &Engine, key: &str, sql: &str) -> Result<SqlResult> {
    check(sql)?;
    let began = Instant::now();
    let (sb, _busy) = super::running(engine, key).await?;
    if !engine.layout.generation_has_postgres(&sb.golden, sb.generation) {
        return Err(super::no_postgres(&sb));
    }
    let socket = engine.layout.sandbox_instance(&sb.id).socket();
    let kept = engine.services.state::<SessionCache>().take(&sb.id, sb.pid);
    let reused = kept.is_some();
    let mut session = match kept {
        Some(session) => session,
        None => airlock_lifecycle::sandbox::session::connect(engine, &sb).await?,
    };
    let mut collector = Collector::default();
    let deadline = Duration::from_millis(sb.access.limits.statement_timeout_ms) + GRACE;
    let mut ran = tokio::time::timeout(deadline, session.simple_query(sql, &mut collector)).await;
    // A kept session whose backend went away fails before answering anything:
    // the statement never ran, so it runs once more on a fresh session.
    if reused && matches!(ran, Ok(Err(wire::WireError::Io(_)))) && collector.untouched() {
        session = airlock_lifecycle::sandbox::session::connect(engine, &sb).await?;
        collector = Collector::default();
        ran = tokio::time::timeout(deadline, session.simple_query(sql, &mut collector)).await;
    }
    let mut status = b'I';
    let mut clean = true;
    let ran = match ran {
        Ok(Ok(s)) => {
            status = s;
            Ok(())
        }
        Ok(Err(e)) => Err(e),
        Err(_) => {
            clean = false;
            // Several statements each get the whole statement timeout; the call
            // as a whole does not.
            if let (Some(key), Ok(user)) = (session.backend_key(), engine.sandbox_user(&sb)) {
                wire::cancel(&socket, &user, key).await;
            }
            match tokio::time::timeout(GRACE, session.results(&mut collector)).await {
                Ok(Ok(s)) => status = s,
                _ => return Err(airlock_lifecycle::sandbox::session::unanswered(&sb)),
            }
            collector.error = Some(DbError {
                sqlstate: "57014".into(),
                message: format!(
                    "the statements ran longer than {} s in all and were cancelled",
                    deadline.as_secs()
                ),
                hint: Some("run fewer or cheaper statements per call".into()),
                ..Default::default()
            });
            Ok(())
        }
    };
    match ran {
        // The session's own backend went away mid-call: ended by the agent's
        // own SQL (`pg_terminate_backend(pg_backend_pid())`), or killed for
        // memory. That is the call's result, not the daemon's failure.
        Err(wire::WireError::Io(e)) => {
            tracing::info!(sandbox = %sb.id, error = %e, "a run_sql session's backend went away during the call");
            collector.error.get_or_insert_with(|| DbError {
                sqlstate: "08006".into(),
                message: "the session's server process ended during the call (it was terminated, or killed for                           using more memory than the sandbox has); statements after the last that finished did not run"
                    .into(),
                hint: Some("call again: the next call opens a new session".into()),
                ..Default::default()
            });
            return Ok(collector.finish(&Default::default(), b'I', began));
        }
        Err(e) => {
            tracing::warn!(sandbox = %sb.id, error = %e, "run_sql session failed");
            return Err(airlock_lifecycle::sandbox::session::unanswered(&sb));
        }
        Ok(()) => {}
    }
    let names = type_names(&mut session, &collector.fields).await;
    if clean && super::sessions::reset(&mut session, status).await {
        if let Some(extra) = engine.services.state::<SessionCache>().put(&sb.id, sb.pid, session) {
            extra.close().await;
        }
    } else {
        session.close().await;
    }
    Ok(collector.finish(&names, status, began))
}

/// Runs `sql` on a database outside any sandbox, over `dsn` (a grant's,
/// through the router), with the caps of [`run`]; `deadline` bounds the whole
/// call (the grant's own statement timeout acts first). One session per call.
pub async fn run_through(dsn: &str, sql: &str, deadline: Duration) -> Result<SqlResult> {
    check(sql)?;
    let began = Instant::now();
    // What went wrong can name the router's address: the daemon's log has
    // it, the model does not.
    let unreachable = |why: String| {
        tracing::warn!(error = %why, "run_sql could not reach a grant");
        Error::new(
            ErrorCode::TargetRefused,
            "the grant's database could not be reached",
            "the grant may have ended; the harness must mint a new one",
        )
    };
    let server = airlock_postgres::target::server(dsn)?;
    let stream = airlock_postgres::outbound::connect(&server.host, server.port, server.tls.as_ref())
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let mut session = Session::connect(stream, &server.user, &server.password, &server.database)
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let mut collector = Collector::default();
    let status = match tokio::time::timeout(deadline, session.simple_query(sql, &mut collector)).await {
        Ok(Ok(status)) => status,
        Ok(Err(wire::WireError::Io(_))) => {
            collector.error.get_or_insert_with(|| DbError {
                sqlstate: "08006".into(),
                message: "the session ended during the call (the grant ended, or its server cut it)".into(),
                hint: Some("call again; if the grant has ended, the harness must mint a new one".into()),
                ..Default::default()
            });
            return Ok(collector.finish(&Default::default(), b'I', began));
        }
        Ok(Err(e)) => return Err(unreachable(e.to_string())),
        Err(_) => {
            // The session goes with its statement: the server ends it when it
            // next writes, and the grant's own timeout ends the statement.
            collector.error = Some(DbError {
                sqlstate: "57014".into(),
                message: format!(
                    "the statements ran longer than {} s in all and were cut",
                    deadline.as_secs()
                ),
                hint: Some("run fewer or cheaper statements per call".into()),
                ..Default::default()
            });
            return Ok(collector.finish(&Default::default(), b'I', began));
        }
    };
    let names = type_names(&mut session, &collector.fields).await;
    session.close().await;
    Ok(collector.finish(&names, status, began))
}

/// Names for the result's column types: built-in ones from a table, others asked
/// of the server (after the query, on the same session).
async fn type_names(session: &mut Session, fields: &[Field]) -> HashMap<u32, String> {
    let mut names: HashMap<u32, String> = HashMap::new();
    let unknown: Vec<String> = fields
        .iter()
        .filter(|f| builtin_type(f.type_oid).is_none())
        .map(|f| f.type_oid.to_string())
        .collect();
    if unknown.is_empty() {
        return names;
    }
    let query = format!(
        "SELECT oid::int8, pg_catalog.format_type(oid, NULL) FROM pg_catalog.pg_type WHERE oid IN ({})",
        unknown.join(",")
    );
    let mut lookup = Collector::default();
    if session.simple_query(&query, &mut lookup).await.is_ok() && lookup.error.is_none() {
        for row in &lookup.raw {
            if let [Some(oid), Some(name)] = row.as_slice() {
                if let Ok(oid) = oid.parse() {
                    names.insert(oid, name.clone());
                }
            }
        }
    }
    names
}

/// The name of a common built-in type, by OID.
fn builtin_type(oid: u32) -> Option<&'static str> {
    Some(match oid {
        16 => "boolean",
        17 => "bytea",
        18 => "\"char\"",
        19 => "name",
        20 => "bigint",
        21 => "smallint",
        23 => "integer",
        25 => "text",
        26 => "oid",
        114 => "json",
        700 => "real",
        701 => "double precision",
        869 => "inet",
        1000 => "boolean[]",
        1005 => "smallint[]",
        1007 => "integer[]",
        1009 => "text[]",
        1016 => "bigint[]",
        1042 => "character",
        1043 => "character varying",
        1082 => "date",
        1083 => "time without time zone",
        1114 => "timestamp without time zone",
        1184 => "timestamp with time zone",
        1186 => "interval",
        1700 => "numeric",
        2950 => "uuid",
        3802 => "jsonb",
        _ => return None,
    })
}

/// Keeps what a result needs while the server streams it.
#[derive(Default)]
struct Collector {
    statements: Vec<Statement>,
    fields: Vec<Field>,
    rows: Vec<Vec<Value>>,
    /// Text values, kept only for the type-name lookup (a handful of rows).
    raw: Vec<Vec<Option<String>>>,
    bytes: usize,
    seen: u64,
    rows_cut: bool,
    values_cut: bool,
    error: Option<DbError>,
}

impl Sink for Collector {
    fn columns(&mut self, fields: Vec<Field>) {
        // A new result set replaces the previous one: only the last is returned.
        self.fields = fields;
        self.rows.clear();
        self.raw.clear();
        self.bytes = 0;
        self.seen = 0;
        self.rows_cut = false;
        self.values_cut = false;
    }

    fn row(&mut self, values: std::result::Result<Vec<Option<&[u8]>>, usize>) {
        self.seen += 1;
        if self.rows_cut || self.rows.len() >= ROW_CAP {
            self.rows_cut = true;
            return;
        }
        let (row, size) = match values {
            Ok(values) => {
                if self.raw.len() < ROW_CAP && self.fields.len() == 2 {
                    let text = values.iter().map(|v| v.map(|b| String::from_utf8_lossy(b).into_owned()));
                    self.raw.push(text.collect());
                }
                let mut size = 0;
                let mut row = Vec::with_capacity(values.len());
                for (i, v) in values.iter().enumerate() {
                    let oid = self.fields.get(i).map_or(25, |f| f.type_oid);
                    let (value, cut) = to_json(oid, *v);
                    self.values_cut |= cut;
                    size += v.map_or(4, |b| b.len().min(VALUE_CAP) + 8);
                    row.push(value);
                }
                (row, size)
            }
            Err(len) => {
                self.values_cut = true;
                let note = Value::String(format!("[a row of {len} bytes was left out]"));
                (vec![note; self.fields.len().max(1)], 64)
            }
        };
        if self.bytes + size > BYTE_CAP {
            self.rows_cut = true;
            return;
        }
        self.bytes += size;
        self.rows.push(row);
    }

    fn complete(&mut self, tag: &str) {
        let rows = tag.rsplit(' ').next().and_then(|n| n.parse().ok());
        self.statements.push(Statement { tag: tag.to_owned(), rows });
    }

    fn error(&mut self, error: DbError) {
        self.error = Some(error);
    }
}

impl Collector {
    /// Whether nothing of the query's own has arrived: no result, and no error but
    /// the notice of a server ending the session (SQLSTATE 57P01-57P03), which a
    /// killed backend sends before it goes.
    fn untouched(&self) -> bool {
        let ended = self.error.as_ref().is_none_or(|e| e.sqlstate.starts_with("57P"));
        self.statements.is_empty() && self.fields.is_empty() && self.seen == 0 && ended
    }

    fn finish(self, names: &HashMap<u32, String>, status: u8, began: Instant) -> SqlResult {
        let columns = self
            .fields
            .iter()
            .map(|f| Column {
                name: f.name.clone(),
                type_name: builtin_type(f.type_oid)
                    .map(str::to_owned)
                    .or_else(|| names.get(&f.type_oid).cloned())
                    .unwrap_or_else(|| format!("oid {}", f.type_oid)),
            })
            .collect();
        let kept = self.rows.len() as u64;
        // Statements since the last transaction end were undone if the call ended
        // in an error (the implicit or explicit transaction aborted) or inside an
        // open transaction (closing the session rolls it back).
        let undone = if self.error.is_some() || status != b'I' {
            let after_end =
                self.statements.iter().rev().take_while(|s| s.tag != "COMMIT" && s.tag != "ROLLBACK");
            after_end.filter(|s| s.tag != "BEGIN" && s.tag != "START TRANSACTION").count() as u64
        } else {
            0
        };
        let undone_note = match (undone, self.error.is_some()) {
            (0, _) => None,
            (n, true) => Some(format!(
                "The {n} statement(s) before the error in this call were rolled back with it: a call runs as one transaction unless it has its own BEGIN/COMMIT."
            )),
            (n, false) => Some(format!(
                "The call ended inside an open transaction, so its {n} statement(s) were rolled back: each call is its own session, so put BEGIN and COMMIT in the same call."
            )),
        };
        let note = match (self.rows_cut, self.values_cut) {
            (true, _) => Some(format!(
                "Result truncated: showing the first {kept} of {} rows (at most {ROW_CAP} rows and about {} KB are returned). Add a WHERE clause, LIMIT or aggregate to see the rest.",
                self.seen,
                BYTE_CAP >> 10
            )),
            (false, true) => Some(format!(
                "Some values were longer than {VALUE_CAP} bytes and were cut; select substrings or lengths to see them."
            )),
            _ => None,
        };
        let note = match (note, undone_note) {
            (Some(a), Some(b)) => Some(format!("{a} {b}")),
            (a, b) => a.or(b),
        };
        SqlResult {
            statements: self.statements,
            columns,
            rows: self.rows,
            row_count: self.seen,
            truncated: self.rows_cut || self.values_cut,
            note,
            error: self.error,
            rolled_back: undone,
            duration_ms: began.elapsed().as_millis() as u64,
        }
    }
}

/// One value as JSON, and whether its text was cut at [`VALUE_CAP`].
fn to_json(oid: u32, value: Option<&[u8]>) -> (Value, bool) {
    let Some(bytes) = value else { return (Value::Null, false) };
    let text = String::from_utf8_lossy(bytes);
    match oid {
        16 => return (Value::Bool(text == "t"), false),
        20 | 21 | 23 | 26 => {
            if let Ok(n) = text.parse::<i64>() {
                return (Value::from(n), false);
            }
        }
        700 | 701 => {
            if let Some(n) = text.parse::<f64>().ok().and_then(serde_json::Number::from_f64) {
                return (Value::Number(n), false);
            }
        }
        114 | 3802 if bytes.len() <= VALUE_CAP => {
            if let Ok(v) = serde_json::from_slice(bytes) {
                return (v, false);
            }
        }
        _ => {}
    }
    if text.len() <= VALUE_CAP {
        return (Value::String(text.into_owned()), false);
    }
    let mut end = VALUE_CAP;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (Value::String(format!("{}… [{} more bytes]", &text[..end], text.len() - end)), true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_take_their_json_shape_and_long_text_is_cut() {
        assert_eq!(to_json(23, Some(b"42")).0, Value::from(42));
        assert_eq!(to_json(16, Some(b"f")).0, Value::Bool(false));
        assert_eq!(to_json(1700, Some(b"1.10")).0, Value::from("1.10"));
        assert_eq!(to_json(701, Some(b"NaN")).0, Value::from("NaN"));
        assert_eq!(to_json(3802, Some(br#"{"a": 1}"#)).0, serde_json::json!({"a": 1}));
        assert_eq!(to_json(25, None).0, Value::Null);
        let long = "é".repeat(VALUE_CAP);
        let (v, cut) = to_json(25, Some(long.as_bytes()));
        assert!(cut && v.as_str().unwrap().contains("more bytes]"));
    }

    #[test]
    fn rows_past_the_cap_are_counted_not_kept() {
        let mut c = Collector::default();
        c.columns(vec![Field { name: "n".into(), type_oid: 23, type_modifier: -1 }]);
        for _ in 0..(ROW_CAP + 50) {
            c.row(Ok(vec![Some(b"1")]));
        }
        c.complete("SELECT 250");
        let r = c.finish(&HashMap::new(), b'I', Instant::now());
        assert_eq!((r.rows.len(), r.row_count, r.truncated), (ROW_CAP, 250, true));
        assert!(r.note.unwrap().contains("first 200 of 250"));
        assert_eq!(r.statements[0].rows, Some(250));
    }
}
