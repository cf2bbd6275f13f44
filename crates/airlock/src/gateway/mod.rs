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

pub mod envelope;
pub mod http;
pub mod mcp;
pub mod redis;
pub mod schema;
pub mod sessions;
pub mod sql;
pub mod stdio;
pub mod tools;

use crate::engine::Engine;
use crate::router::connections::Open;
use crate::sandbox::{Sandbox, SandboxState};
use airlock_core::error::{Error, ErrorCode, Result};

/// A sandbox ready for a tool call, woken if it was suspended, and counted as
/// in use (not idle, not suspended for room) while the guard lives.
pub(crate) async fn running(engine: &Engine, key: &str) -> Result<(Sandbox, Open)> {
    let id = engine.store().sandbox(key)?.id;
    let busy = engine.connections.open(&id);
    let mut sb = engine.store().sandbox(&id)?;
    if sb.state == SandboxState::Suspended {
        sb = crate::sandbox::wake(engine, &id).await?;
    }
    if sb.state != SandboxState::Running {
        return Err(Error::new(
            ErrorCode::SandboxNotFound,
            format!("sandbox {} is {}", sb.id, sb.state.as_str()),
            "tools need a running sandbox; wait for the operation in progress, or fork a new one",
        ));
    }
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
