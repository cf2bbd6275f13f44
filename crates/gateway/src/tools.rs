//! The agent tools, their input schemas, and one function that runs any of them
//! against a sandbox and records the call.

use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::envelope;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::events::NewEvent;
use airlock_lifecycle::engine::Engine;
use airlock_lifecycle::sandbox::SandboxState;

/// Runs SQL and returns the result.
pub const RUN_SQL: &str = "run_sql";
/// Runs one Redis command on the task's own Redis.
pub const RUN_REDIS: &str = "run_redis";
/// Lists tables, columns, keys, indexes and row counts.
pub const DESCRIBE_SCHEMA: &str = "describe_schema";
/// Puts the database back to its starting state.
pub const RESET_DATABASE: &str = "reset_database";
/// Reports schema and row changes since the fork.
pub const CHANGES_SINCE_FORK: &str = "changes_since_fork";
/// Tests a migration on a fresh fork of the same golden and reports its hazards.
pub const TEST_MIGRATION: &str = "test_migration";
/// The most statements one `test_migration` call takes.
pub const MIGRATION_STATEMENTS: usize = 500;

/// Every tool's name.
pub const ALL: [&str; 6] =
    [RUN_SQL, RUN_REDIS, DESCRIBE_SCHEMA, RESET_DATABASE, CHANGES_SINCE_FORK, TEST_MIGRATION];

/// Longest statement text kept in an event.
const EVENT_STATEMENT_CAP: usize = 2000;

/// A tool as offered to an agent.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ToolSpec {
    /// Its name.
    pub name: &'static str,
    /// What it does, for the model.
    pub description: &'static str,
    /// The JSON schema of its input.
    pub input_schema: Value,
}

/// The tools, in the order they are listed.
pub fn specs() -> Vec<ToolSpec> {
    let no_input = json!({"type": "object", "properties": {}, "additionalProperties": false});
    vec![
        ToolSpec {
            name: RUN_SQL,
            description: "Run SQL on this task's own PostgreSQL database, a disposable copy: any statement \
                is allowed and nothing outside this task is affected. Several statements separated by \
                semicolons run in order; each one's command tag is reported and the last result set is \
                returned (at most 200 rows and about 64 KB; the rest is counted). Errors come back with \
                their SQLSTATE, message, detail, hint and position.",
            input_schema: sql_input_schema(),
        },
        ToolSpec {
            name: RUN_REDIS,
            description: "Run one Redis command on this task's own Redis (when the task has one), a \
                disposable copy like the database: nothing outside this task is affected. Give the command \
                and its arguments as an array of strings, e.g. [\"HGETALL\", \"cart:42\"]. The reply comes \
                back as JSON (at most 200 elements and about 64 KB; the rest is counted); Redis's errors \
                come back as they are. Administrative commands (CONFIG SET, SHUTDOWN, ACL, ...) are refused.",
            input_schema: json!({
                "type": "object",
                "properties": {"command": {
                    "type": "array", "items": {"type": "string"}, "minItems": 1,
                    "description": "The command and its arguments."
                }},
                "required": ["command"],
                "additionalProperties": false
            }),
        },
        ToolSpec {
            name: DESCRIBE_SCHEMA,
            description:
                "Describe the database: tables with their columns, types, keys, indexes and row \
                counts, then views, functions, sequences, types and extensions. Give `table` to see just one, \
                and `database` to describe another database of this task's (one its code created).",
            input_schema: json!({
                "type": "object",
                "properties": {
                    "table": {"type": "string", "description": "A table or view name; omit for all."},
                    "database": {"type": "string", "description": "Another database of this task's; omit for its own."}
                },
                "additionalProperties": false
            }),
        },
        ToolSpec {
            name: RESET_DATABASE,
            description: "Throw away every change and put the database back to its starting state.",
            input_schema: no_input.clone(),
        },
        ToolSpec {
            name: CHANGES_SINCE_FORK,
            description: "Show what changed since the database was created (or last reset): schema \
                objects added, dropped or altered, and per-table row counts then and now, in this task's \
                database and in any other it created or dropped.",
            input_schema: no_input,
        },
        ToolSpec {
            name: TEST_MIGRATION,
            description: "Test a migration before anyone applies it: it runs on a fresh copy of this \
                database's starting state (not on this database), statement by statement, and the report \
                says what it would do to real data: locks and how long they are held, table rewrites, rows \
                deleted, objects dropped (CASCADE included), failures that only real data causes, and the \
                resulting schema changes. Nothing is applied anywhere.",
            input_schema: json!({
                "type": "object",
                "properties": {"sql": {"type": "string", "description": "The migration's SQL."}},
                "required": ["sql"],
                "additionalProperties": false
            }),
        },
    ]
}

/// Which door a tool call came through, recorded in its event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    /// The REST API (`/sql`, `/tools/{tool}`).
    #[default]
    Rest,
    /// `airlock mcp` on stdio (through the REST API).
    McpStdio,
    /// The daemon's streamable HTTP gateway.
    McpHttp,
}

impl Via {
    /// The door a call through this way came in by.
    pub fn door(self) -> airlock_core::events::Door {
        match self {
            Via::Rest => airlock_core::events::Door::Api,
            Via::McpStdio => airlock_core::events::Door::McpStdio,
            Via::McpHttp => airlock_core::events::Door::McpHttp,
        }
    }
}

/// `run_sql`'s input: one property, `sql` (on a fork and on a grant alike).
pub fn sql_input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"sql": {"type": "string", "description": "One or more SQL statements."}},
        "required": ["sql"],
        "additionalProperties": false
    })
}

/// `run_sql`'s answer: a summary of what ran, and the result inside the
/// untrusted-data envelope.
pub fn sql_output(result: &super::sql::SqlResult) -> ToolOutput {
    let summary = match &result.error {
        Some(e) => format!(
            "The SQL failed with SQLSTATE {} after {} statement(s) had finished.",
            e.sqlstate,
            result.statements.len()
        ),
        None => {
            let tags: Vec<&str> = result.statements.iter().map(|s| s.tag.as_str()).collect();
            match &result.note {
                Some(note) => format!("{} {note}", tags.join("; ")),
                None => tags.join("; "),
            }
        }
    };
    let value = serde_json::to_value(result).expect("result serializes");
    let text = envelope::wrap(&summary, &serde_json::to_string(&value).expect("json"));
    ToolOutput { is_error: result.error.is_some(), result: value, text }
}

/// What a tool call returned.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ToolOutput {
    /// Whether the call failed in a way the agent should act on (a SQL error).
    pub is_error: bool,
    /// The structured result, for harnesses.
    pub result: Value,
    /// The text for a model, database content inside the untrusted-data envelope.
    pub text: String,
}

impl ToolOutput {
    /// A call refused on what the model sent ([`ErrorCode::InvalidArguments`]):
    /// a tool error whose text tells the model what to send instead.
    pub fn refused(e: &Error) -> ToolOutput {
        ToolOutput {
            is_error: true,
            result: json!({"error": {"code": e.code.as_str(), "message": e.message, "hint": e.hint}}),
            text: error_text(e),
        }
    }
}

/// The longest one tool call may take (a migration test on a large golden
/// included); past it the call answers `timed_out`.
pub const DEADLINE: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// Runs tool `tool` with `args` on sandbox `key`, and records the call as an
/// event, whatever its outcome: a tool that panics or runs past [`DEADLINE`]
/// answers an error and is on record all the same. The call runs on a task
/// of its own, so a caller that goes away (a dropped HTTP request) never cuts
/// its work short halfway: it ends, and is recorded, as if answered.
pub async fn call(engine: &Arc<Engine>, key: &str, tool: &str, args: &Value, via: Via) -> Result<ToolOutput> {
    let (engine, key, tool, args) = (engine.clone(), key.to_owned(), tool.to_owned(), args.clone());
    let door = airlock_core::events::Door::current();
    let work = airlock_core::events::DOOR
        .scope(door, async move { run_and_record(&engine, &key, &tool, &args, via).await });
    tokio::spawn(work)
        .await
        .map_err(|e| Error::internal(format!("a tool call's task ended unexpectedly ({e})")))?
}

/// [`call`]'s work, on its own task.
async fn run_and_record(
    engine: &Arc<Engine>,
    key: &str,
    tool: &str,
    args: &Value,
    via: Via,
) -> Result<ToolOutput> {
    use futures_util::FutureExt;
    let _counted = airlock_core::events::TOOL_CALLS.begin();
    let began = Instant::now();
    let mut detail = json!({"tool": tool, "via": via});
    // The server the call reached, once it has one (see `running`).
    let served = Arc::new(std::sync::Mutex::new(None));
    let work = std::panic::AssertUnwindSafe(dispatch(engine, key, tool, args, &mut detail)).catch_unwind();
    let outcome = match tokio::time::timeout(
        DEADLINE,
        SERVED_BY.scope(served.clone(), airlock_core::events::DOOR.scope(via.door(), work)),
    )
    .await
    {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(panic)) => {
            let what = airlock_listen::serve::panic_message(&panic);
            tracing::error!(sandbox = %key, tool, panic = %what, "a tool call panicked");
            Err(Error::internal(format!("the tool failed unexpectedly ({what})")))
        }
        Err(_) => Err(Error::new(
            airlock_core::error::ErrorCode::TimedOut,
            format!("{tool} took longer than {} minutes and was given up", DEADLINE.as_secs() / 60),
            "ask for less at once",
        )),
    };
    // The model's own mistake in its arguments is a result it reads, never
    // an error the harness has to handle.
    let outcome = match outcome {
        Err(e) if e.code == ErrorCode::InvalidArguments => Ok(ToolOutput::refused(&e)),
        other => other,
    };
    let outcome = outcome.map_err(|e| {
        for_agent(
            engine,
            key,
            tool,
            changed_meanwhile(engine, key, tool, *served.lock().unwrap_or_else(|p| p.into_inner()), e),
        )
    });
    detail["duration_ms"] = json!(began.elapsed().as_millis() as u64);
    match &outcome {
        Ok(out) if out.is_error => {
            // A SQLSTATE, or the code a Redis error starts with (NOPERM, ERR, ...).
            let redis_code = || {
                let text = out.result.get("error")?.as_str()?;
                Some(json!(text
                    .split_whitespace()
                    .next()
                    .unwrap_or("error")
                    .chars()
                    .take(32)
                    .collect::<String>()))
            };
            detail["error"] = out
                .result
                .pointer("/error/sqlstate")
                .or_else(|| out.result.pointer("/error/code"))
                .cloned()
                .or_else(redis_code)
                .unwrap_or(json!("error"));
        }
        Ok(_) => {}
        Err(e) => detail["error"] = json!(e.code.as_str()),
    }
    let sandbox = engine.store().sandbox(key).map(|sb| sb.id).unwrap_or_else(|_| key.to_owned());
    // The answer leaves only once the call is on record.
    engine.store().record(NewEvent {
        kind: airlock_core::events::EventKind::ToolCall,
        sandbox: Some(sandbox),
        detail,
        door: Some(via.door()),
        ..Default::default()
    })?;
    airlock_core::events::TOOL_CALLS.recorded();
    outcome
}

async fn dispatch(
    engine: &Arc<Engine>,
    key: &str,
    tool: &str,
    args: &Value,
    detail: &mut Value,
) -> Result<ToolOutput> {
    let args = arguments(tool, args)?;
    match tool {
        RUN_SQL => {
            let sql = string_arg(&args, "sql")?.ok_or_else(|| {
                bad_argument("run_sql needs `sql`", "call run_sql with {\"sql\": \"SELECT ...\"}")
            })?;
            detail["statement"] = json!(cut(sql, EVENT_STATEMENT_CAP));
            // How many of its statements ran to their end: none until it has run.
            detail["ran"] = json!(0);
            let result = super::sql::run(engine, key, sql).await?;
            detail["ran"] = json!(result.statements.len());
            detail["rows"] = json!(result.row_count);
            Ok(sql_output(&result))
        }
        RUN_REDIS => {
            let command: Vec<String> = match args.get("command") {
                Some(Value::Array(items)) => items
                    .iter()
                    .map(|v| v.as_str().map(str::to_owned))
                    .collect::<Option<_>>()
                    .ok_or_else(|| bad_argument("`command` must hold only strings", "send [\"GET\", \"key\"]"))?,
                _ => {
                    return Err(bad_argument(
                        "run_redis needs `command`, an array of strings",
                        "call run_redis with {\"command\": [\"GET\", \"key\"]}",
                    ))
                }
            };
            detail["command"] = json!(cut(&super::redis::for_event(&command), EVENT_STATEMENT_CAP));
            let result = super::redis::run(engine, key, &command).await?;
            let summary = match (&result.error, &result.note) {
                (Some(_), _) => "Redis answered with an error.".to_owned(),
                (None, Some(note)) => format!("Redis answered. {note}"),
                (None, None) => "Redis answered.".to_owned(),
            };
            let value = serde_json::to_value(&result).expect("result serializes");
            let text = envelope::wrap(&summary, &serde_json::to_string(&result.reply).expect("json"));
            Ok(ToolOutput { is_error: result.error.is_some(), result: value, text })
        }
        DESCRIBE_SCHEMA => {
            let table = string_arg(&args, "table")?;
            let database = string_arg(&args, "database")?;
            let schema = super::schema::describe(engine, key, table, database).await?;
            let text = envelope::wrap("The database schema:", schema.text.trim_end());
            Ok(ToolOutput { is_error: false, result: serde_json::to_value(&schema).expect("json"), text })
        }
        RESET_DATABASE => {
            let sb = airlock_lifecycle::sandbox::reset(engine, key).await?;
            let text = format!(
                "The database is back to its starting state (golden {} generation {}): everything written since is gone.",
                sb.golden, sb.generation
            );
            let result = json!({"reset": true, "golden": sb.golden, "generation": sb.generation});
            Ok(ToolOutput { is_error: false, result, text })
        }
        CHANGES_SINCE_FORK => {
            let changes = super::changes::changes(engine, key).await?;
            let text = envelope::wrap("Changes since the database was created:", &changes.text());
            Ok(ToolOutput { is_error: false, result: serde_json::to_value(&changes).expect("json"), text })
        }
        TEST_MIGRATION => {
            let sql = string_arg(&args, "sql")?.ok_or_else(|| {
                bad_argument(
                    "test_migration needs `sql`",
                    "call test_migration with {\"sql\": \"ALTER TABLE ...\"}",
                )
            })?;
            detail["statement"] = json!(cut(sql, EVENT_STATEMENT_CAP));
            // Each statement is tested on a fork at scale: a model's file of
            // thousands would hold a test (and a fork) for many minutes.
            let statements = airlock_postgres::split::split(sql).map_err(|e| bad_argument(e.message, e.hint))?.len();
            if statements > MIGRATION_STATEMENTS {
                return Err(bad_argument(
                    format!(
                        "the migration has {statements} statements; test_migration takes at most \
                         {MIGRATION_STATEMENTS}"
                    ),
                    "test it in parts, or run it through `airlock migrate test`, which has no such cap",
                ));
            }
            let sb = engine.store().sandbox(key)?;
            // Each test takes a fork: one at a time per agent, and each statement
            // bounded by the agent's own statement timeout, so an agent cannot tie
            // up the host's room with tests.
            let _only = engine.services.state::<InFlight>().begin(&sb.id).ok_or_else(|| {
                Error::new(
                    ErrorCode::CapacityExhausted,
                    "a migration test from this session is still running",
                    "wait for its report, then test the next migration",
                )
            })?;
            let tested = engine.services.migrations()?.test(&sb, sql).await?;
            let mut value = tested.report;
            // The golden's whole catalog is there for promote, not for the model.
            if let Some(o) = value.as_object_mut() {
                o.remove("golden_catalog");
            }
            let summary = if tested.passed {
                "The migration passed its test on a copy of the data."
            } else {
                "The migration FAILED its test on a copy of the data; see the hazards."
            };
            let text = envelope::wrap(summary, tested.text.trim_end());
            Ok(ToolOutput { is_error: false, result: value, text })
        }
        other => Err(invalid(
            format!("no tool named {other:?}"),
            "the tools are run_sql, run_redis, describe_schema, reset_database, changes_since_fork and test_migration",
        )),
    }
}

/// The arguments as an object holding only the properties the tool's schema names.
fn arguments(tool: &str, args: &Value) -> Result<Map<String, Value>> {
    let map = match args {
        Value::Null => Map::new(),
        Value::Object(m) => m.clone(),
        _ => return Err(invalid(format!("{tool} takes a JSON object"), "send the arguments as an object")),
    };
    if let Some(spec) = specs().into_iter().find(|s| s.name == tool) {
        let allowed = spec.input_schema["properties"].as_object().cloned().unwrap_or_default();
        if let Some(extra) = map.keys().find(|k| !allowed.contains_key(k.as_str())) {
            let names: Vec<&String> = allowed.keys().collect();
            return Err(bad_argument(
                format!("{tool} has no argument {extra:?}"),
                if names.is_empty() {
                    format!("{tool} takes no arguments")
                } else {
                    format!("{tool} takes only {names:?}")
                },
            ));
        }
    }
    Ok(map)
}

fn string_arg<'a>(args: &'a Map<String, Value>, name: &str) -> Result<Option<&'a str>> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(bad_argument(format!("`{name}` must be a string"), "send it as a JSON string")),
    }
}

fn invalid(message: impl Into<String>, hint: impl Into<String>) -> Error {
    Error::new(ErrorCode::InvalidRequest, message, hint)
}

/// What the model sent is not what the tool takes: said to the model as a
/// tool error ([`ToolOutput::refused`]).
fn bad_argument(message: impl Into<String>, hint: impl Into<String>) -> Error {
    Error::new(ErrorCode::InvalidArguments, message, hint)
}

fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// Codes whose messages say only what the agent asked for and how to ask better.
const AGENT_FACING: &[ErrorCode] = &[
    ErrorCode::InvalidRequest,
    ErrorCode::SandboxNotFound,
    ErrorCode::CapacityExhausted,
    ErrorCode::GoldenNotFound,
];

/// An error as the model may see it. Airlock's own failures (a server that would
/// not start, a file that could not be cloned) carry paths, socket names and log
/// lines that are the operator's, not the model's: those go to the daemon log,
/// and the model gets the code and a sentence. Any message that still names the
/// data root, a socket or a log is treated the same way.
fn for_agent(engine: &Engine, key: &str, tool: &str, e: Error) -> Error {
    let home = engine.layout.home().to_string_lossy().into_owned();
    let internal = |text: &str| {
        text.contains(home.as_str())
            || text.contains(".s.PGSQL")
            || text.contains("postgres.log")
            || text.contains("pgdata")
    };
    if AGENT_FACING.contains(&e.code) && !internal(&e.message) && !internal(&e.hint) {
        return e;
    }
    tracing::warn!(sandbox = key, tool, code = e.code.as_str(), error = %e.message, "a tool call failed");
    Error::new(
        e.code,
        format!("{tool} could not finish: Airlock's own work on this database failed ({})", e.code.as_str()),
        "try again; if it keeps failing, the operator can find the cause in the daemon log",
    )
}

tokio::task_local! {
    /// The pid of the server a tool call reached (set by `running` once the
    /// sandbox is running), so a failure can be told apart from the server
    /// going away under the call.
    pub(crate) static SERVED_BY: Arc<std::sync::Mutex<Option<i32>>>;
}

/// A server failure during a call that the sandbox's own lifecycle explains
/// (the server the call reached, `served`, was suspended, reset, restarted or
/// deleted meanwhile, by its owner or its TTL) is said as that, for the caller
/// to ask again: the call met a server being stopped, not a fault of Airlock's.
fn changed_meanwhile(engine: &Engine, key: &str, tool: &str, served: Option<i32>, e: Error) -> Error {
    // A call that never reached a running server (a wake that failed, say)
    // failed for itself.
    if !matches!(e.code, ErrorCode::PostgresFailed | ErrorCode::RedisFailed) || served.is_none() {
        return e;
    }
    let now = engine.store().sandbox(key).ok().map(|sb| (sb.state, sb.pid));
    if now == Some((SandboxState::Running, served)) {
        return e;
    }
    tracing::info!(sandbox = key, tool, error = %e.message, "a tool call met its sandbox changing");
    match now {
        None => Error::new(
            ErrorCode::SandboxNotFound,
            format!("sandbox {key} was deleted while {tool} ran"),
            "fork a new sandbox",
        ),
        Some((state, _)) => Error::new(
            ErrorCode::InvalidRequest,
            format!(
                "sandbox {key} was suspended, reset or restarted while {tool} ran (it is {} now), and its \
                 server stopped under the call",
                state.as_str()
            ),
            "ask again: a suspended sandbox wakes for the call",
        ),
    }
}

/// The text an agent sees for an Airlock error (not a SQL one): code, message, hint.
pub fn error_text(e: &Error) -> String {
    format!("{} ({}). {}", e.message, e.code.as_str(), e.hint)
}

/// Sandboxes whose agent has a `test_migration` running: at most one each.
#[derive(Default)]
pub struct InFlight(std::sync::Mutex<std::collections::HashSet<String>>);

/// Marks a sandbox's test as running until dropped.
pub struct Running(std::sync::Arc<InFlight>, String);

impl InFlight {
    /// Marks `sandbox`'s test as running, unless one already is.
    pub fn begin(self: std::sync::Arc<Self>, sandbox: &str) -> Option<Running> {
        let fresh = self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(sandbox.to_owned());
        fresh.then(|| Running(self, sandbox.to_owned()))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0 .0.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_of_names_is_the_tools_offered() {
        let mut offered: Vec<&str> = specs().iter().map(|s| s.name).collect();
        let mut named = ALL.to_vec();
        offered.sort();
        named.sort();
        assert_eq!(offered, named);
    }

    #[test]
    fn run_sql_takes_exactly_one_property() {
        let spec = specs().into_iter().find(|s| s.name == RUN_SQL).unwrap();
        let props = spec.input_schema["properties"].as_object().unwrap();
        assert_eq!(props.keys().collect::<Vec<_>>(), ["sql"]);
        assert!(arguments(RUN_SQL, &json!({"sql": "select 1", "dsn": "x"})).is_err());
        assert!(arguments(RESET_DATABASE, &json!({"x": 1})).is_err());
        assert!(arguments(RESET_DATABASE, &Value::Null).is_ok());
    }
}
