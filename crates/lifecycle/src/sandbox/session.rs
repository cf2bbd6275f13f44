//! A session on a sandbox's PostgreSQL as its agent: the role and credential
//! the agent was given, on a connection made with the sandbox's OS identity
//! (never the daemon's). The gateway's `run_sql` and the migration airlock's
//! measurements both go through it.

use airlock_core::dsn::{AGENT_ROLE, DATABASE};
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_postgres::wire::{self, Session};

use crate::engine::Engine;
use crate::sandbox::Sandbox;

/// Opens a session as the agent role with the sandbox's own credential, on a
/// connection made with the sandbox's OS identity (never the daemon's). A
/// password changed inside the server is put back once (see
/// [`crate::sandbox::restore_credential`]).
pub async fn connect(engine: &Engine, sb: &Sandbox) -> Result<Session> {
    let mut unstarted = 0;
    let connected = loop {
        match connect_once(engine, sb).await {
            Err(wire::WireError::Refused(db)) if db.sqlstate == "28P01" => {
                crate::sandbox::restore_credential(&engine.layout, sb).await?;
                break connect_once(engine, sb).await;
            }
            // At its process limit (its own code forking, say) the server
            // cannot start a session for a while: wait a little for room.
            Err(wire::WireError::CouldNotStart(_)) if unstarted < wire::UNSTARTED_RETRY.0 => {
                unstarted += 1;
                tokio::time::sleep(wire::UNSTARTED_RETRY.1).await;
            }
            other => break other,
        }
    };
    connected.map_err(|e| match e {
        wire::WireError::CouldNotStart(text) => Error::new(
            ErrorCode::CapacityExhausted,
            format!("sandbox {}'s server could not start a session: {text}", sb.id),
            "the sandbox is at its process limit (code it runs may be forking); try again once it is not",
        ),
        wire::WireError::Refused(db) if db.sqlstate == "53300" => Error::new(
            ErrorCode::CapacityExhausted,
            format!("sandbox {} has no free connection: {}", sb.id, db.message),
            "close other sessions on this sandbox, or fork it with a higher --connection-limit",
        ),
        other => {
            tracing::warn!(sandbox = %sb.id, error = %other, "agent session refused");
            unanswered(sb)
        }
    })
}

async fn connect_once(engine: &Engine, sb: &Sandbox) -> std::result::Result<Session, wire::WireError> {
    let password = sb.dsn.as_deref().and_then(airlock_core::dsn::password).unwrap_or_default();
    let socket = engine.layout.sandbox_instance(&sb.id).socket();
    let user = engine.sandbox_user(sb).map_err(|e| wire::WireError::Protocol(e.message))?;
    let stream =
        airlock_postgres::socket::connect_instance(&socket, Some(&user), sb.pid.unwrap_or_default()).await?;
    Session::connect(stream, AGENT_ROLE, &password, DATABASE).await
}

/// The error an agent sees when its database does not answer; the details go to
/// the daemon log only, since they name paths.
pub fn unanswered(sb: &Sandbox) -> Error {
    Error::new(
        ErrorCode::PostgresFailed,
        format!("the database of sandbox {} did not answer", sb.id),
        "try again; if it keeps failing, the operator can find the cause in the daemon log",
    )
}
