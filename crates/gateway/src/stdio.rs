//! `airlock mcp`: one MCP session over stdio, one sandbox (or, with
//! `--target`, one grant on a live target: [`serve_grant`]).
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

use super::grant_session::OnGrant;
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
    until_ended(gateway, (&mut term, &mut int, &mut hup)).await;
    let deleted: Result<serde_json::Value> =
        client.call(Method::DELETE, &format!("/v1/sandboxes/{id}"), None::<&()>).await;
    match &deleted {
        Ok(_) => eprintln!("airlock mcp: session ended; sandbox {id} deleted"),
        Err(e) => eprintln!("airlock mcp: session ended; deleting sandbox {id} failed ({e}); its TTL will"),
    }
    Ok(0)
}

/// Serves MCP on stdin/stdout until the session ends: end of input, or one
/// of the signals (taken before the session's sandbox or grant was made, so
/// that one arriving meanwhile is not lost).
async fn until_ended(
    gateway: Gateway,
    (term, int, hup): (
        &mut tokio::signal::unix::Signal,
        &mut tokio::signal::unix::Signal,
        &mut tokio::signal::unix::Signal,
    ),
) {
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
}

/// Mints a grant on `target`, serves MCP on stdin/stdout on it until the
/// session ends, then revokes it.
pub async fn serve_grant(
    client: Client,
    home: String,
    target: String,
    request: serde_json::Value,
) -> Result<i32> {
    let client = client.through(airlock_core::events::Door::McpStdio);
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let path = format!("/v1/targets/{}/grants", airlock_listen::client::encode(&target));
    let granted: serde_json::Value = client.call(Method::POST, &path, Some(&request)).await?;
    let grant = granted["id"].as_str().unwrap_or_default().to_owned();
    eprintln!("airlock mcp: grant {grant} on live target {target}; serving MCP on stdio");
    drop(granted); // its DSN is not needed here
    let on = OnGrant::new(client.clone(), home, target, request, grant.clone());
    let gateway = Gateway::for_grant(on);
    until_ended(gateway, (&mut term, &mut int, &mut hup)).await;
    let revoked: Result<serde_json::Value> =
        client.call(Method::DELETE, &format!("/v1/grants/{grant}"), None::<&()>).await;
    match &revoked {
        Ok(_) => eprintln!("airlock mcp: session ended; grant {grant} revoked"),
        Err(e) => {
            eprintln!("airlock mcp: session ended; revoking grant {grant} failed ({e}); its TTL will end it")
        }
    }
    Ok(0)
}
