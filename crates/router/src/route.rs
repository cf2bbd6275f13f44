//! Clients of a route: a database outside any sandbox (a live target, through
//! a grant) that a client reaches by naming the route's id as its user (or
//! database).
//!
//! The router authenticates the client against the route's own verifier,
//! opens a session upstream as the route's role (TCP, with TLS as the route's
//! `sslmode` says), and relays. The client never learns the upstream address
//! or credential; it always reaches the route's database, whatever database it
//! names; and its session is cut when the route expires or is removed (a
//! revoke), even while the daemon is away.

use super::peer::Peer;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;

use super::backend::{self, Backend, LoginError};
use super::client::Client;
use super::protocol::{self, ErrorResponse, PacketError, Startup};
use super::scram;
use super::Shared;
use airlock_core::clock::Timestamp;
use airlock_core::events::{EventKind, NewEvent};
use airlock_core::records::route::{self, Route};
use airlock_postgres::outbound::Outbound;
use airlock_postgres::scram::Verifier;

/// How often a session looks whether its route is still there.
const LOOK: Duration = Duration::from_secs(1);

/// Routed sessions' backend keys, for their cancel requests; each route's
/// backend pids are also written beside it
/// ([`route::write_pids`]), so the daemon can end any session of the route's
/// role that the router did not open (a grantee who changed its own password
/// and logged in directly).
#[derive(Default)]
pub(super) struct Keys(Mutex<HashMap<protocol::BackendKey, String>>);

impl Keys {
    fn insert(&self, layout: &airlock_core::layout::Layout, key: protocol::BackendKey, route: &str) {
        let mut keys = self.0.lock().unwrap_or_else(|p| p.into_inner());
        keys.insert(key, route.to_owned());
        write_pids(layout, &keys, route);
    }

    fn remove(&self, layout: &airlock_core::layout::Layout, key: &protocol::BackendKey) {
        let mut keys = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(route) = keys.remove(key) {
            write_pids(layout, &keys, &route);
        }
    }

    fn route_of(&self, key: &protocol::BackendKey) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get(key).cloned()
    }
}

fn write_pids(
    layout: &airlock_core::layout::Layout,
    keys: &HashMap<protocol::BackendKey, String>,
    route: &str,
) {
    let pids: Vec<i32> = keys.iter().filter(|(_, r)| *r == route).map(|(k, _)| k.pid).collect();
    if let Err(e) = route::write_pids(layout, route, &pids) {
        tracing::warn!(grant = %route, error = %e, "a route's sessions could not be written down");
    }
}

/// A client that proved it holds a route's credential.
pub(super) struct Authenticated {
    client: Client,
    startup: Startup,
    route: Route,
    peer: Peer,
    tls: bool,
}

/// Whether a client's startup names a route.
pub(super) fn names_a_route(startup: &Startup) -> bool {
    route::is_route_id(&startup.user) || route::is_route_id(&startup.database)
}

fn refusal(code: &'static str, message: String, hint: &str) -> ErrorResponse {
    ErrorResponse::fatal(code, message, hint)
}

async fn refuse(client: &mut Client, e: ErrorResponse) {
    let _ = client.write_all(&e.encode()).await;
    let _ = client.flush().await;
    let _ = client.shutdown().await;
}

/// The route a client names, checked and authenticated. None when it was
/// refused (and told why) or went away.
pub(super) async fn authenticate(
    shared: &Shared,
    mut client: Client,
    mut startup: Startup,
    peer: Peer,
    tls: bool,
) -> Option<Authenticated> {
    let id = if route::is_route_id(&startup.user) { startup.user.clone() } else { startup.database.clone() };
    if route::is_route_id(&startup.user)
        && route::is_route_id(&startup.database)
        && startup.user != startup.database
    {
        let e = refusal(
            "28000",
            "the user names one grant and the database another".into(),
            "use the grant's DSN as it was given",
        );
        refuse(&mut client, e).await;
        return None;
    }
    let gone = || {
        refusal(
            "28000",
            format!("grant \"{id}\" does not exist or has ended"),
            "ask for a new grant (`airlock grant TARGET --tables ...`) and connect with the DSN it prints",
        )
    };
    let route = match route::read(&shared.host.layout, &id) {
        Ok(Some(r)) if r.expires_at > Timestamp::now() => r,
        Ok(_) => {
            refuse(&mut client, gone()).await;
            return None;
        }
        Err(e) => {
            refuse(&mut client, refusal("XX000", e.message, &e.hint)).await;
            return None;
        }
    };
    // Routes speak 3.0: the upstream server's newest is not known here.
    if let Some(negotiation) = startup.settle_version(protocol::PROTOCOL_3_0) {
        client.write_all(&negotiation).await.ok()?;
    }
    let Some(verifier) = Verifier::parse(&route.verifier) else {
        refuse(&mut client, refusal("XX000", format!("grant {id}'s verifier does not parse"), "")).await;
        return None;
    };
    let binding = if tls { shared.end_point.as_deref() } else { None };
    match scram::authenticate(&mut client, &verifier, binding).await {
        Ok(scram::Outcome::Authenticated { .. }) => {
            client.write_all(&scram::authentication_ok()).await.ok()?
        }
        Ok(scram::Outcome::Refused(e)) => {
            record(shared, EventKind::ConnectionRefused, &id, peer, tls);
            refuse(&mut client, e).await;
            return None;
        }
        Err(PacketError::Io(_)) => return None,
        Err(e) => {
            refuse(&mut client, refusal("08P01", e.to_string(), "connect with a PostgreSQL client library"))
                .await;
            return None;
        }
    }
    Some(Authenticated { client, startup, route, peer, tls })
}

fn record(shared: &Shared, kind: EventKind, id: &str, peer: Peer, tls: bool) {
    let event = NewEvent {
        kind,
        detail: serde_json::json!({"grant": id, "store": "grant", "client": peer.to_string(), "tls": tls}),
        ..Default::default()
    };
    match kind {
        EventKind::ConnectionRefused => shared.host.record_refused(id, event),
        _ => shared.host.store().record_or_log(event),
    }
}

/// Opens the authenticated client's session upstream and relays until either
/// side closes, the route expires or it is removed.
pub(super) async fn serve(shared: &Shared, authenticated: Authenticated) {
    let Authenticated { mut client, startup, route, peer, tls } = authenticated;
    let mut backend = match open(&route, &startup).await {
        Ok(b) => b,
        Err(e) => {
            refuse(&mut client, e).await;
            return;
        }
    };
    record(shared, EventKind::Connected, &route.id, peer, tls);
    if let Some(key) = backend.key.clone() {
        shared.routed.insert(&shared.host.layout, key, &route.id);
    }
    let replay = backend.replay();
    let relay = async {
        client.write_all(&replay).await?;
        client.flush().await?;
        tokio::io::copy_bidirectional(&mut client, &mut backend.stream).await.map(|_| ())
    };
    tokio::select! {
        relayed = relay => {
            if let Err(e) = relayed {
                tracing::debug!(error = %e, "a routed session ended with an error");
            }
        }
        () = ended(shared, &route) => tracing::info!(grant = %route.id, "a routed session was cut: its grant ended"),
    }
    if let Some(key) = backend.key.clone() {
        shared.routed.remove(&shared.host.layout, &key);
        // Whatever the session was running when its client went is cancelled,
        // as on a sandbox: a dropped client's statement must not run on
        // (harmless when it ended normally: the backend is gone or idle).
        drop(backend);
        cancel_upstream(&route, &key).await;
    }
}

/// Sends a cancel request for `key` to the route's server.
async fn cancel_upstream(route: &Route, key: &protocol::BackendKey) {
    let Ok(server) = airlock_postgres::target::server(&route.upstream) else { return };
    let connect = airlock_postgres::outbound::connect(&server.host, server.port, server.tls.as_ref());
    if let Ok(Ok(mut upstream)) = tokio::time::timeout(Duration::from_secs(5), connect).await {
        let _ = upstream.write_all(&key.cancel_request()).await;
        let _ = upstream.shutdown().await;
    }
}

/// Resolves when the route has expired or its file is gone.
async fn ended(shared: &Shared, route: &Route) {
    loop {
        if route.expires_at <= Timestamp::now() {
            return;
        }
        if matches!(route::read(&shared.host.layout, &route.id), Ok(None)) {
            return;
        }
        tokio::time::sleep(LOOK.min(route.expires_at.remaining() + Duration::from_millis(1))).await;
    }
}

/// A session upstream as the route's role, on the route's database, with the
/// client's settings. Errors are what the client is told.
async fn open(route: &Route, startup: &Startup) -> Result<Backend<Outbound>, ErrorResponse> {
    // What went wrong upstream (a certificate's name, a file, the server's
    // own words) goes to the log, not to the client.
    let unreachable = |why: String| {
        tracing::warn!(grant = %route.id, error = %why, "a grant's database could not be reached");
        refusal(
            "08006",
            "the grant's database could not be reached".into(),
            "try again; if it persists, its target may be down (`airlock target show`)",
        )
    };
    let server = airlock_postgres::target::server(&route.upstream).map_err(|e| unreachable(e.message))?;
    let began = Instant::now();
    let stream = airlock_postgres::outbound::connect(&server.host, server.port, server.tls.as_ref())
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let first = startup.encode_for(&server.user, &server.database);
    let login = backend::login(stream, &first, &server.password);
    let mut backend = match tokio::time::timeout(Duration::from_secs(10), login).await {
        Ok(Ok(b)) => b,
        Ok(Err(LoginError::Refused { sqlstate, message })) => {
            let text = backend::field(&message[5..], b'M').unwrap_or_default();
            tracing::warn!(grant = %route.id, %sqlstate, error = %text, "a grant's database refused a session");
            return Err(ErrorResponse {
                code: sqlstate,
                ..refusal(
                    "28000",
                    "the grant's database refused the session".into(),
                    "the grant may have ended; ask for a new one",
                )
            });
        }
        Ok(Err(e)) => return Err(unreachable(e.to_string())),
        Err(_) => return Err(unreachable(format!("no answer within {:?}", began.elapsed()))),
    };
    if !startup.later.is_empty() {
        if let Err(e) = backend.apply(&startup.later, &[]).await {
            let text = match e {
                LoginError::Refused { message, .. } => {
                    backend::field(&message[5..], b'M').unwrap_or_default()
                }
                other => other.to_string(),
            };
            return Err(refusal(
                "22023",
                format!("a startup setting was refused: {text}"),
                "connect without that setting",
            ));
        }
    }
    Ok(backend)
}

/// Passes a cancel request on to the route whose session has `key`; false
/// if no routed session has it.
pub(super) async fn forward_cancel(shared: &Shared, key: &protocol::BackendKey) -> bool {
    let Some(id) = shared.routed.route_of(key) else { return false };
    if let Ok(Some(route)) = route::read(&shared.host.layout, &id) {
        cancel_upstream(&route, key).await;
    }
    true
}
