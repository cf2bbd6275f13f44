//! `airlock mcp`: one MCP session over stdio, one sandbox.
//!
//! The sandbox is forked before the first message is read (from the golden's warm
//! pool when it has one), so the first tool call does not wait for it. It is
//! deleted when the session ends — end of input, SIGTERM, SIGINT or SIGHUP — and
//! its TTL deletes it should this process be killed outright. The process never
//! sees the sandbox's connection string: tool calls go to the daemon's API by
//! sandbox id, and the API runs them.

use axum::http::Method;
use rmcp::ServiceExt;
use tokio::signal::unix::{signal, SignalKind};

use super::mcp::Gateway;
use airlock_core::error::Result;
use airlock_lifecycle::sandbox::{ForkRequest, Forked};
use airlock_listen::client::Client;

/// Forks, serves MCP on stdin/stdout until the session ends, then deletes the sandbox.
pub async fn serve(client: Client, home: String, request: ForkRequest) -> Result<i32> {
    let client = client.through(airlock_core::events::Door::McpStdio);
    // Taken before the fork, so a signal that arrives meanwhile is not lost: it
    // ends the session as soon as the sandbox exists, and the sandbox goes.
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let forked: Forked = client.call(Method::POST, "/v1/sandboxes", Some(&request)).await?;
    let id = forked.sandbox.id.clone();
    for w in &forked.warnings {
        eprintln!("airlock mcp: warning: {w}");
    }
    eprintln!("airlock mcp: sandbox {id} forked from golden {}; serving MCP on stdio", forked.sandbox.golden);
    drop(forked); // its DSN is not needed here

    let gateway = Gateway::for_sandbox(client.clone(), id.clone(), home);
    let session = async {
        match gateway.serve(rmcp::transport::stdio()).await {
            Ok(running) => {
                let _ = running.waiting().await;
            }
            // Most often the client went away before initializing: nothing to serve.
            Err(e) => eprintln!("airlock mcp: the session did not start: {e}"),
        }
    };
    tokio::select! {
        _ = session => {}
        _ = term.recv() => {}
        _ = int.recv() => {}
        _ = hup.recv() => {}
    }
    let deleted: Result<serde_json::Value> =
        client.call(Method::DELETE, &format!("/v1/sandboxes/{id}"), None::<&()>).await;
    match &deleted {
        Ok(_) => eprintln!("airlock mcp: session ended; sandbox {id} deleted"),
        Err(e) => eprintln!("airlock mcp: session ended; deleting sandbox {id} failed ({e}); its TTL will"),
    }
    Ok(0)
}
