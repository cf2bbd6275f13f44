//! The agent gateway: the tools an agent is given instead of a connection string.
//!
//! An agent never chooses its database or sees how to reach it: a tool call names
//! a tool and its arguments, and the sandbox is fixed by whoever holds the task —
//! the `airlock mcp` process that forked it, or the token in a task's MCP URL.
//! The same [`tools::call`] serves all three doors: MCP over stdio (through the
//! daemon's REST API), MCP over streamable HTTP (in the daemon), and REST
//! `POST /v1/sandboxes/{id}/sql` and `/tools/{tool}` for harnesses that call tools
//! themselves. Every call is an event; no output carries a connection string,
//! host, port, socket path or password.

pub mod changes;
pub mod envelope;
pub mod grant_session;
pub mod grants;
pub mod http;
pub mod mcp;
pub mod redis;
pub mod schema;
pub mod sessions;
pub mod sql;
pub mod stdio;
pub mod tools;

use airlock_core::error::{Error, ErrorCode, Result};
use airlock_lifecycle::activity::Busy;
use airlock_lifecycle::engine::Engine;
use airlock_lifecycle::sandbox::{Sandbox, SandboxState};

/// Registers the gateway's state with the engine: the lifecycle tells its
/// kept `run_sql` sessions when a sandbox's server goes, and idle suspend
/// does not count them as use. The daemon calls this once at start.
pub fn register(engine: &Engine) {
    engine.services.watch(engine.services.state::<sessions::SessionCache>());
}

/// A sandbox ready for a tool call, woken if it was suspended, and counted as
/// in use (not idle, not suspended for room) while the guard lives.
pub(crate) async fn running(engine: &Engine, key: &str) -> Result<(Sandbox, Busy)> {
    let id = engine.store().sandbox(key)?.id;
    let busy = engine.activity.open(&id);
    let mut sb = engine.store().sandbox(&id)?;
    if sb.state == SandboxState::Suspended {
        sb = airlock_lifecycle::sandbox::wake(engine, &id).await?;
    }
    if sb.state != SandboxState::Running {
        return Err(Error::new(
            ErrorCode::SandboxNotFound,
            format!("sandbox {} is {}", sb.id, sb.state.as_str()),
            "tools need a running sandbox; wait for the operation in progress, or fork a new one",
        ));
    }
    let _ = tools::SERVED_BY.try_with(|served| *served.lock().unwrap_or_else(|p| p.into_inner()) = sb.pid);
    Ok((sb, busy))
}

/// The error for a PostgreSQL tool called on a sandbox that has none.
pub(crate) fn no_postgres(sb: &Sandbox) -> Error {
    Error::new(
        ErrorCode::InvalidRequest,
        format!("sandbox {} has no PostgreSQL: its golden has only a Redis part", sb.id),
        "use run_redis (or the sandbox's redis_url); describe_schema summarises its key space",
    )
}
