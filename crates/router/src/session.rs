//! One client connection through the router: negotiate TLS, read the startup
//! message, authenticate the client against the sandbox's verifier, find (and
//! wake) the sandbox, give the client a server session (parked or new) and
//! replay what the server told it, then pass bytes both ways until either side
//! closes.

use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::backend::{self, Backend, LoginError};
use super::client::{Client, Plain};
use super::elsewhere::{Door, Header, RelayStream, Remote};
use super::peer::Peer;
use super::protocol::{self, shown, ErrorResponse, FirstPacket, PacketError, Startup};
use super::relay;
use super::scram;
use super::target::{is_sandbox_id, Target};
use super::Shared;
use airlock_core::dsn::AGENT_ROLE;
use airlock_core::error::ErrorCode;
use airlock_core::events::EventKind;
use airlock_lifecycle::sandbox::{self, Sandbox, SandboxState};
use airlock_postgres::scram::Verifier;

/// How a client reached this router.
enum Incoming {
    /// On the router's own port, or its unix socket.
    Direct(Plain),
    /// Through another node's router, on the relay port (its TLS ends there).
    Relayed(Box<tokio_rustls::server::TlsStream<TcpStream>>, Header),
}

/// Serves one client until it or its sandbox hangs up.
pub(super) async fn serve(shared: &Shared, plain: Plain, peer: Peer, slot: airlock_listen::slots::Slot) {
    if let Plain::Tcp(tcp) = &plain {
        let _ = tcp.set_nodelay(true);
    }
    serve_incoming(shared, Incoming::Direct(plain), peer, slot).await
}

/// Serves a client another node's router relayed here, as its own.
pub(super) async fn serve_relayed(
    shared: &Shared,
    tls: tokio_rustls::server::TlsStream<TcpStream>,
    header: Header,
    slot: airlock_listen::slots::Slot,
) {
    let peer = header.peer;
    serve_incoming(shared, Incoming::Relayed(Box::new(tls), header), peer, slot).await
}

async fn serve_incoming(
    shared: &Shared,
    incoming: Incoming,
    peer: Peer,
    mut slot: airlock_listen::slots::Slot,
) {
    let by = Instant::now() + shared.startup_timeout;
    let established =
        tokio::time::timeout(shared.startup_timeout, establish(shared, incoming, peer, &mut slot)).await;
    // A client that has not finished its startup in time is simply dropped.
    let (mut client, backend, open) = match established {
        Ok(Some(Established::Sandbox(client, backend, open, connection))) if backend.offered => {
            return handed_off(shared, client, backend, open, &connection).await
        }
        Ok(Some(Established::Sandbox(client, backend, open, _))) => (client, backend, open),
        Ok(Some(Established::Routed(routed))) => return super::route::serve(shared, routed).await,
        Ok(Some(Established::Elsewhere(client, owner, remote, sandbox))) => {
            let Some(peers) = &shared.peers else { return };
            let marker = slot.marker();
            tokio::select! {
                () = peers.relay_postgres(client, owner, (&sandbox, &remote), by, || marker.prove()) => {}
                // Until the owner accepts it, its slot may go to another client.
                () = slot.given_up() => {}
            }
            return;
        }
        _ => return,
    };
    // When the client goes, whatever its backend is running is cancelled: a
    // dropped client's query must not run on (the backend then finds its
    // connection closed and ends). Harmless if the session ended normally.
    let backend_key = open.backend().cloned();
    let client_gone = async move {
        if let Some(key) = backend_key {
            forward_cancel(shared, &key).await;
        }
    };
    // A session does not outlive its sandbox's expiry, even while the daemon,
    // which deletes the sandbox then, is away: the router cuts it itself.
    let cut = client.socket().try_clone_to_owned().ok();
    let id = open.sandbox().to_owned();
    // The end of the client's authentication, what the server told the
    // session at its start, then the relay.
    let mut replay = scram::authentication_ok();
    replay.extend(backend.replay());
    let relay = async {
        client.write_all(&replay).await?;
        client.flush().await?;
        match client {
            Client::Plain(plain) => relay::plain(plain, backend.stream, client_gone).await,
            Client::Tls(tls) => relay::tls(*tls, backend.stream, client_gone).await,
        }
    };
    tokio::pin!(relay);
    let relayed = tokio::select! {
        relayed = &mut relay => relayed,
        () = expiry(&shared.host, &id) => {
            if let Some(fd) = &cut {
                let _ = nix::sys::socket::shutdown(fd.as_raw_fd(), nix::sys::socket::Shutdown::Both);
            }
            relay.await
        }
    };
    if let Err(e) = relayed {
        tracing::debug!(error = %e, "relay ended with an error");
    }
    let (host, id) = (shared.host.clone(), open.sandbox().to_owned());
    drop(open);
    let _ = tokio::task::spawn_blocking(move || host.touch(&id)).await;
}

/// Hands the client's own connection to the server session that offered to
/// take it (`handoff.rs`), then waits for the session to end: cancelling what
/// the backend runs when the client hangs up, cutting the session at the
/// sandbox's expiry.
async fn handed_off(shared: &Shared, client: Client, backend: Backend, open: super::Open, connection: &str) {
    let Client::Plain(plain) = client else { return };
    // The router keeps a copy of the client's socket (to cut the session at
    // expiry and to see the client go): without one, no hand-off.
    let handed = async {
        let cut = plain.as_fd().try_clone_to_owned()?;
        super::handoff::hand(&backend.stream, plain.as_fd(), connection).await?;
        std::io::Result::Ok(cut)
    };
    let cut = match handed.await {
        Ok(cut) => cut,
        Err(e) => {
            tracing::warn!(sandbox = %open.sandbox(), error = %e, "a client could not be handed to its session");
            let e = ErrorResponse::fatal(
                "08006",
                format!("the router could not hand the connection to the sandbox's server: {e}"),
                "try again; if it persists, see the router's log",
            );
            refuse(&mut Client::Plain(plain), e).await;
            return;
        }
    };
    // The session's server holds the client now; the router's copy goes.
    drop(plain);
    let id = open.sandbox().to_owned();
    // A dropped client's query must not run on (as with a relayed session).
    let client_gone = async {
        if let Some(key) = &backend.key {
            if super::handoff::hung_up(cut.as_fd()).await.is_ok() {
                forward_cancel(shared, key).await;
            }
        }
        std::future::pending::<()>().await
    };
    let said = tokio::select! {
        said = super::handoff::ended(&backend.stream) => said,
        () = client_gone => Vec::new(),
        () = expiry(&shared.host, &id) => {
            let _ = nix::sys::socket::shutdown(cut.as_raw_fd(), nix::sys::socket::Shutdown::Both);
            // What the backend runs ends too, as a relayed session's does.
            if let Some(key) = &backend.key {
                forward_cancel(shared, key).await;
            }
            super::handoff::ended(&backend.stream).await
        }
    };
    // Anything the server said on the router's connection is why it did not
    // take the client (it never writes there once it has): the client hears it.
    if !said.is_empty() {
        tracing::warn!(sandbox = %id, "a session's server refused its hand-off");
        let mut client = std::fs::File::from(cut);
        let _ = std::io::Write::write_all(&mut client, &said);
        drop(open);
        return;
    }
    // The client's connection closes with the server's copy alone from here.
    drop(cut);
    drop(open);
    let host = shared.host.clone();
    let _ = tokio::task::spawn_blocking(move || host.touch(&id)).await;
}

/// Resolves once the sandbox's expiry has passed, reading it again as it nears
/// (an extension moves it); never, if the sandbox is gone (its server's end
/// ends the session then).
pub(super) async fn expiry(host: &super::Host, id: &str) {
    loop {
        let Ok(sb) = host.store().sandbox(id) else { return std::future::pending().await };
        let now = airlock_core::clock::Timestamp::now();
        if sb.expires_at <= now {
            return;
        }
        let wait = (sb.expires_at.0 - now.0).clamp(0, 30_000) as u64;
        tokio::time::sleep(Duration::from_millis(wait)).await;
    }
}

/// Sends a refusal and closes the connection (with a TLS close_notify).
async fn refuse(client: &mut Client, error: ErrorResponse) {
    let _ = client.write_all(&error.encode()).await;
    close(client).await;
}

/// Closes a client's connection cleanly: flushed, and on TLS with a close_notify,
/// which libpq 17's encrypted cancel requests wait for.
async fn close(client: &mut Client) {
    let _ = client.flush().await;
    let _ = client.shutdown().await;
}

/// Reads a relayed client's startup message (its TLS was the entry router's);
/// answers a cancel request. None when the client is done.
async fn relayed_contact(
    shared: &Shared,
    tls: Box<tokio_rustls::server::TlsStream<TcpStream>>,
) -> Option<(Client, Startup)> {
    let mut client = Client::Tls(tls);
    match protocol::read_first_packet(&mut client).await {
        Ok(FirstPacket::Startup(startup)) => Some((client, startup)),
        Ok(FirstPacket::Cancel(key)) => {
            forward_cancel(shared, &key).await;
            close(&mut client).await;
            None
        }
        Ok(_) => {
            let e = ErrorResponse::fatal("08P01", "a relayed client's first packet was not a startup", "");
            refuse(&mut client, e).await;
            None
        }
        Err(_) => {
            close(&mut client).await;
            None
        }
    }
}

/// Negotiates TLS (an `SSLRequest`, or a TLS handshake straight away) and reads
/// the startup message; answers a cancel request. None when the client is done.
async fn first_contact(shared: &Shared, plain: Plain) -> Option<(Client, Startup, bool)> {
    let mut client = Client::Plain(plain);
    let mut tls = false;
    // PostgreSQL 17's `sslnegotiation=direct`: a ClientHello instead of an
    // SSLRequest (a TLS handshake record begins with 22).
    if let (Some(acceptor), Client::Plain(Plain::Tcp(tcp))) = (&shared.tls, &client) {
        let mut first = [0u8; 1];
        if tcp.peek(&mut first).await.ok()? == 1 && first[0] == 0x16 {
            let Client::Plain(Plain::Tcp(tcp)) = client else { unreachable!() };
            let session = acceptor.accept(tcp).await.ok()?;
            client = Client::Tls(Box::new(session));
            let Client::Tls(session) = &client else { unreachable!() };
            if session.get_ref().1.alpn_protocol() != Some(super::tls::ALPN) {
                let e = ErrorResponse::fatal(
                    "08P01",
                    "direct TLS connection without ALPN protocol \"postgresql\"",
                    "connect with a PostgreSQL 17+ client, or without sslnegotiation=direct",
                );
                refuse(&mut client, e).await;
                return None;
            }
            tls = true;
        }
    }
    loop {
        match protocol::read_first_packet(&mut client).await {
            Ok(FirstPacket::SslRequest) if !tls => match (&shared.tls, client) {
                (Some(acceptor), Client::Plain(Plain::Tcp(mut tcp))) => {
                    tcp.write_all(b"S").await.ok()?;
                    client = Client::Tls(Box::new(acceptor.accept(tcp).await.ok()?));
                    tls = true;
                }
                (_, mut plain) => {
                    plain.write_all(b"N").await.ok()?;
                    client = plain;
                }
            },
            Ok(FirstPacket::GssEncRequest) if !tls => client.write_all(b"N").await.ok()?,
            Ok(FirstPacket::SslRequest | FirstPacket::GssEncRequest) => {
                let e = ErrorResponse::fatal("08P01", "encryption requested twice", "send one SSLRequest");
                refuse(&mut client, e).await;
                return None;
            }
            Ok(FirstPacket::Cancel(key)) => {
                forward_cancel(shared, &key).await;
                close(&mut client).await;
                return None;
            }
            Ok(FirstPacket::Startup(startup)) => return Some((client, startup, tls)),
            Err(PacketError::Io(_)) => {
                close(&mut client).await;
                return None;
            }
            Err(e) => {
                refuse(&mut client, ErrorResponse::fatal("08P01", e.to_string(), refusal_hint(&e))).await;
                return None;
            }
        }
    }
}

/// How to fix a refused startup packet.
fn refusal_hint(e: &PacketError) -> String {
    let PacketError::Invalid(why) = e else {
        return "connect with a PostgreSQL client (libpq, psql, a driver) using the sandbox's DSN".into();
    };
    if why.starts_with("option ") {
        return "options may carry only settings: -c name=value (or --name=value)".into();
    }
    if why.contains("is not accepted") {
        return format!(
            "connect without it: {} cannot be given at connect time through the router; any other \
             setting is SET as the sandbox's role once the session is open",
            protocol::NEVER_ACCEPTED.join(", ")
        );
    }
    if why.contains("twice") {
        return "give each parameter and setting once (a setting in options counts as a parameter)".into();
    }
    "connect with a PostgreSQL client (libpq, psql, a driver) using the sandbox's DSN".into()
}

/// What a client's startup ends in.
enum Established {
    /// A sandbox's client with its server session (its start not yet
    /// replayed to the client, or, when the server offered to take the
    /// client, not yet handed to it) and its `airlock.connection` text.
    Sandbox(Client, Backend, super::Open, String),
    /// A route's client, authenticated (its session upstream is opened
    /// outside the startup time: the upstream server answers on its own time).
    Routed(super::route::Authenticated),
    /// A client of a sandbox another node holds (the key it named), its
    /// startup passed on to that node's router.
    Elsewhere(Client, RelayStream, Remote, String),
}

/// What a client proved it may reach, or where it goes to prove it.
enum Arrived {
    Sandbox(Authenticated),
    Routed(super::route::Authenticated),
    /// Its sandbox is another node's: the client and its startup, with how it came.
    Elsewhere(Client, Startup, Remote, Header),
}

/// Everything up to an established session: the client authenticated and a
/// server session ready for it.
async fn establish(
    shared: &Shared,
    incoming: Incoming,
    peer: Peer,
    slot: &mut airlock_listen::slots::Slot,
) -> Option<Established> {
    // Until the client proves it holds the credential, its slot is the first
    // to go when the router has none free: nothing it does before that can
    // hold a slot against anyone.
    let arrived = tokio::select! {
        arrived = authenticate(shared, incoming, peer) => arrived?,
        () = slot.given_up() => return None,
    };
    let authenticated = match arrived {
        Arrived::Sandbox(a) => a,
        Arrived::Routed(routed) => {
            slot.marker().prove();
            return Some(Established::Routed(routed));
        }
        Arrived::Elsewhere(client, startup, remote, header) => {
            return pass_on(shared, client, startup, remote, header).await;
        }
    };
    slot.marker().prove();
    let Authenticated { mut client, startup, target, sb, tls, mut phases, connection, entry } = authenticated;
    let handoff = shared.handoff && may_hand_off(&client, &startup, entry.is_some());
    // Said only to a client that proved it holds the credential.
    if !shared.host.layout.generation_has_postgres(&sb.golden, sb.generation) {
        let e = ErrorResponse::fatal(
            "3D000",
            format!("sandbox \"{}\" has no PostgreSQL: its golden has only a Redis part", sb.id),
            "connect to its Redis instead (`airlock dsn ID --redis` prints the URL)",
        );
        refuse(&mut client, e).await;
        return None;
    }
    let (connecting, suspended) =
        (Instant::now(), sb.state == airlock_lifecycle::sandbox::SandboxState::Suspended);
    // A few authenticated clients of one sandbox at a time open server sessions.
    let authenticating = shared.host.connections.authenticating(&sb.id).await;
    let session = session_for(shared, sb, &startup, &target, &connection, handoff).await;
    drop(authenticating);
    match session {
        Ok((sb, backend, open)) => {
            // Waking, when it was suspended, is most of the server session's time.
            phases[if suspended { "wake_ms" } else { "session_ms" }] = elapsed_ms(connecting).into();
            phases["handoff"] = backend.offered.into();
            let connected = EventKind::Connected;
            if let Err(e) = shared
                .host
                .record_connection(&sb, connected, (peer, tls), None, phases, entry.as_deref())
                .await
            {
                tracing::error!(sandbox = %sb.id, error = %e, "a connection was refused: its record could not be written");
                refuse(&mut client, ErrorResponse::fatal("53300", e.message, e.hint)).await;
                return None;
            }
            Some(Established::Sandbox(client, backend, open, connection))
        }
        Err(message) => {
            let _ = client.write_all(&message).await;
            close(&mut client).await;
            None
        }
    }
}

/// Whether a client's session may be handed its connection (`handoff.rs`): a
/// plaintext client on this router's own port, with no setting the router
/// must SET as the agent.
fn may_hand_off(client: &Client, startup: &Startup, relayed: bool) -> bool {
    matches!(client, Client::Plain(_)) && !relayed && startup.later.is_empty()
}

/// A client that proved it holds its sandbox's credential.
struct Authenticated {
    client: Client,
    startup: Startup,
    /// The database inside the sandbox it asked for.
    target: Target,
    sb: Sandbox,
    /// Whether it came by TLS.
    tls: bool,
    /// How long its startup and authentication took, for its record.
    phases: serde_json::Value,
    /// How it connected, for its session's `airlock.connection`.
    connection: String,
    /// The node whose router passed it on, when another did.
    entry: Option<String>,
}

/// Passes a client of another node's sandbox on to that node's router: its
/// startup, after the header saying how it came.
async fn pass_on(
    shared: &Shared,
    mut client: Client,
    startup: Startup,
    remote: Remote,
    header: Header,
) -> Option<Established> {
    let peers = shared.peers.as_ref()?;
    let dialed = async {
        let mut owner = peers.dial(&remote, &header).await?;
        owner.write_all(&startup.encode()).await?;
        owner.flush().await?;
        std::io::Result::Ok(owner)
    };
    match dialed.await {
        Ok(owner) => Some(Established::Elsewhere(client, owner, remote, startup.database.clone())),
        Err(e) => {
            tracing::warn!(node = %remote.node, relay = %remote.relay, error = %e, "a client could not be relayed to its sandbox's node");
            refuse(&mut client, super::elsewhere::unreachable_now(&startup.database)).await;
            None
        }
    }
}

/// A client's first contact up to its authentication: TLS, the startup
/// message, the sandbox it names and the SCRAM exchange. None when it was
/// refused or went away. A client of a sandbox another node holds stops at
/// its startup.
async fn authenticate(shared: &Shared, incoming: Incoming, peer: Peer) -> Option<Arrived> {
    let began = Instant::now();
    let (mut client, mut startup, tls, relayed) = match incoming {
        Incoming::Direct(plain) => {
            let (client, startup, tls) = first_contact(shared, plain).await?;
            (client, startup, tls, None)
        }
        Incoming::Relayed(tls, header) => {
            let (client, startup) = relayed_contact(shared, tls).await?;
            (client, startup, header.tls.is_some(), Some(header))
        }
    };
    let startup_ms = elapsed_ms(began);
    // A local client's connection never leaves its host (and a relayed one's
    // crossed between nodes over the relay's mutual TLS): TLS is not asked of
    // it, as PostgreSQL asks none on its own unix socket.
    let local = matches!(peer, Peer::Local { .. });
    if shared.require_tls && !tls && !local {
        let e = ErrorResponse::fatal(
            "28000",
            "the Airlock router accepts only TLS connections",
            "connect with sslmode=require or verify-full (the DSN `airlock fork` prints does)",
        );
        refuse(&mut client, e).await;
        return None;
    }
    if super::route::names_a_route(&startup) {
        return super::route::authenticate(shared, client, startup, peer, tls).await.map(Arrived::Routed);
    }
    let user = startup.user.as_str();
    // Only the agent role, or a sandbox's id standing for it. (The server gets
    // a startup message the router builds with the agent role in it, over a
    // connection made with the sandbox's OS identity, which peer
    // authentication maps to no role: asking for another role could never
    // reach the admin's, but is refused here, clearly.)
    let by_id = is_sandbox_id(user);
    if user != AGENT_ROLE && !by_id {
        let e = ErrorResponse::fatal(
            "28000",
            format!("role \"{}\" cannot connect through the router", shown(user)),
            format!("connect as {AGENT_ROLE} with the DSN `airlock fork` printed"),
        );
        refuse(&mut client, e).await;
        return None;
    }
    let target = match by_id {
        false => Target::of(&startup.database),
        true => match Target::for_user(user, &startup.database) {
            Some(target) => target,
            None => {
                let e = ErrorResponse::fatal(
                    "28000",
                    format!(
                        "user \"{}\" names one sandbox and database \"{}\" another",
                        shown(user),
                        shown(&startup.database)
                    ),
                    "with a sandbox id as the user, name a database inside that sandbox",
                );
                refuse(&mut client, e).await;
                return None;
            }
        },
    };
    // A sandbox this node does not hold may be another node's (never for a
    // client relayed here: that would go round).
    if let (Some(peers), None) = (&shared.peers, &relayed) {
        if shared.host.store().sandbox(&target.sandbox).is_err() {
            match peers.owner(&target.sandbox).await {
                Ok(Some(remote)) => {
                    let binding = if tls { shared.end_point.as_deref() } else { None };
                    let header = peers.header(Door::Postgres, peer, tls_of(&client), binding);
                    return Some(Arrived::Elsewhere(client, startup, remote, header));
                }
                Ok(None) => {}
                Err(e) => {
                    refuse(&mut client, e).await;
                    return None;
                }
            }
        }
    }
    let sb = match lookup(shared, &target.sandbox) {
        Ok(sb) => sb,
        Err(e) => {
            refuse(&mut client, e).await;
            return None;
        }
    };
    // The protocol version is settled, as PostgreSQL settles it, before
    // authentication: 3.2 where the client asked for it and the sandbox's
    // server speaks it (PostgreSQL 18), else 3.0.
    if let Some(negotiation) = startup.settle_version(newest_protocol_of(shared, &sb)) {
        client.write_all(&negotiation).await.ok()?;
    }
    // The router authenticates the client itself, before anything is woken or
    // connected to.
    let phases;
    let bound;
    {
        let verifier = match verifier_of(shared, &sb).await {
            Ok(v) => v,
            Err(e) => {
                refuse(&mut client, e).await;
                return None;
            }
        };
        // A relayed client saw the entry router's certificate: its binding.
        let relayed_binding = relayed.as_ref().and_then(Header::binding);
        let binding = match &relayed {
            None if tls => shared.end_point.as_deref(),
            None => None,
            Some(_) => relayed_binding.as_deref(),
        };
        let authenticating = Instant::now();
        let outcome = scram::authenticate(&mut client, &verifier, binding).await;
        phases =
            serde_json::json!({"startup_ms": startup_ms, "authentication_ms": elapsed_ms(authenticating)});
        match outcome {
            Ok(scram::Outcome::Authenticated { channel_bound }) => bound = channel_bound,
            Ok(scram::Outcome::Refused(e)) => {
                let refused = EventKind::ConnectionRefused;
                let entry = relayed.as_ref().map(|h| h.node.as_str());
                let _ = shared.host.record_connection(&sb, refused, (peer, tls), None, phases, entry).await;
                refuse(&mut client, e).await;
                return None;
            }
            Err(PacketError::Io(_)) => {
                close(&mut client).await;
                return None;
            }
            Err(e) => {
                refuse(
                    &mut client,
                    ErrorResponse::fatal("08P01", e.to_string(), "connect with a PostgreSQL client library"),
                )
                .await;
                return None;
            }
        }
    }
    let connection = match &relayed {
        None => describe(tls_of(&client), peer, bound),
        Some(header) => {
            format!("{} entry={}", describe(header.tls.clone(), peer, bound), header.node)
        }
    };
    let entry = relayed.map(|h| h.node);
    Some(Arrived::Sandbox(Authenticated { client, startup, target, sb, tls, phases, connection, entry }))
}

/// How a client reached the router, for its session's `airlock.connection`:
/// its address, and its TLS version, cipher and channel binding.
fn describe(tls: Option<String>, peer: Peer, bound: bool) -> String {
    let tls = tls.unwrap_or_else(|| "tls=none".to_owned());
    let binding = if bound { "tls-server-end-point" } else { "none" };
    format!("via=router client={peer} {tls} channel_binding={binding}")
}

/// A client's TLS version and cipher, when it came by TLS.
fn tls_of(client: &Client) -> Option<String> {
    let Client::Tls(session) = client else { return None };
    let conn = session.get_ref().1;
    let version = conn
        .protocol_version()
        .map(|v| format!("{v:?}").replace("TLSv1_", "TLSv1."))
        .unwrap_or_else(|| "unknown".into());
    let cipher = conn.negotiated_cipher_suite().map(|c| format!("{:?}", c.suite())).unwrap_or_default();
    Some(format!("tls={version} cipher={cipher}"))
}

/// The newest protocol version the sandbox's server speaks, from its golden
/// generation's major as the daemon recorded it (never from a file the
/// sandbox could write). 3.0 when it cannot be read.
fn newest_protocol_of(shared: &Shared, sb: &Sandbox) -> i32 {
    match shared.host.store().generation_major(&sb.golden, sb.generation) {
        Ok(major) if major >= 18 => protocol::PROTOCOL_3_2,
        _ => protocol::PROTOCOL_3_0,
    }
}

fn elapsed_ms(since: Instant) -> f64 {
    (since.elapsed().as_secs_f64() * 1e6).round() / 1e3
}

fn not_found(key: &str) -> ErrorResponse {
    ErrorResponse::fatal(
        "3D000",
        format!("sandbox \"{}\" does not exist", shown(key)),
        "it may have expired or been deleted: fork a new one (`airlock fork GOLDEN`) and connect with the DSN it prints",
    )
}

fn internal(e: airlock_core::error::Error) -> ErrorResponse {
    ErrorResponse::fatal("XX000", e.message, e.hint)
}

/// The sandbox a client names, by id or name; pool members and sandboxes being
/// deleted do not exist for clients.
fn lookup(shared: &Shared, key: &str) -> Result<Sandbox, ErrorResponse> {
    match shared.host.store().sandbox(key) {
        Ok(sb) if matches!(sb.state, SandboxState::Deleting | SandboxState::Pooled) => Err(not_found(key)),
        // The daemon deletes it at its expiry; while the daemon is away the
        // router refuses it all the same.
        Ok(sb) if sb.expires_at <= airlock_core::clock::Timestamp::now() => Err(ErrorResponse::fatal(
            "3D000",
            format!("sandbox \"{}\" has expired", shown(key)),
            "fork a new one (`airlock fork GOLDEN`), or extend a sandbox before it expires (`airlock extend ID`)",
        )),
        Ok(sb) => Ok(sb),
        Err(e) if e.code == ErrorCode::SandboxNotFound || e.code == ErrorCode::InvalidName => Err(not_found(key)),
        Err(e) => Err(internal(e)),
    }
}

/// The router's verifier for a sandbox's credential; one made before the router
/// authenticated clients itself gets one now, once.
async fn verifier_of(shared: &Shared, sb: &Sandbox) -> Result<Verifier, ErrorResponse> {
    if let Some(v) = sb.verifier.as_deref().and_then(Verifier::parse) {
        return Ok(v);
    }
    let password = sb.dsn.as_deref().and_then(airlock_core::dsn::password).ok_or_else(|| {
        internal(airlock_core::error::Error::internal(format!("sandbox {} has no credential", sb.id)))
    })?;
    let made = tokio::task::spawn_blocking(move || {
        airlock_postgres::scram::verifier(&password, airlock_postgres::scram::ROUTER_ITERATIONS)
    })
    .await
    .map_err(|e| internal(airlock_core::error::Error::internal(e.to_string())))?;
    shared.host.store().set_verifier(&sb.id, &made).map_err(internal)?;
    Verifier::parse(&made)
        .ok_or_else(|| internal(airlock_core::error::Error::internal("a verifier did not parse")))
}

/// Waits until the sandbox is running: wakes it if suspended, waits out a reset
/// or wake in progress. `sb` is as last read; it is read again after each wait.
async fn running(shared: &Shared, mut sb: Sandbox) -> Result<Sandbox, ErrorResponse> {
    loop {
        match sb.state {
            SandboxState::Running => return Ok(sb),
            SandboxState::Suspended => {
                // Within the client's startup time, so it hears why if this fails.
                let deadline = Instant::now() + shared.startup_timeout / 2;
                if let Err(e) = shared.host.wake(&sb.id, deadline).await {
                    let code = if e.code == ErrorCode::CapacityExhausted { "53300" } else { "57P03" };
                    return Err(ErrorResponse::fatal(
                        code,
                        format!("waking sandbox {} failed: {}", sb.id, e.message),
                        e.hint,
                    ));
                }
            }
            // A reset or wake in progress: the sandbox comes back at the same address.
            _ => tokio::time::sleep(Duration::from_millis(5)).await,
        }
        sb = lookup(shared, &sb.id)?;
    }
}

/// How long a client's session is looked for while its sandbox's server is
/// between states (shutting down for a suspend or reset, not yet up).
const TRANSITION_WAIT: Duration = Duration::from_secs(2);

/// A server session for an authenticated client: the sandbox's parked one if it
/// has one (its first client after a claim), else one opened now with the
/// client's settings. Errors are the messages to send the client.
async fn session_for(
    shared: &Shared,
    sb: Sandbox,
    startup: &Startup,
    target: &Target,
    connection: &str,
    handoff: bool,
) -> Result<(Sandbox, Backend, super::Open), Vec<u8>> {
    let host = &shared.host;
    let id = sb.id.clone();
    let mut known = Some(sb);
    let (mut restored, mut unstarted) = (false, 0);
    // A server between a suspend and a wake, or shutting down for a reset,
    // is looked for again until then: a suspend's shutdown checkpoint on a
    // loaded host can outlast the 100 ms that twenty tries of 5 ms gave it.
    let look_again_until = Instant::now() + TRANSITION_WAIT;
    loop {
        let last = match known.take() {
            Some(sb) => sb,
            None => lookup(shared, &id).map_err(|e| e.encode())?,
        };
        let sb = running(shared, last).await.map_err(|e| e.encode())?;
        let mut open = host.connections.open(&sb.id);
        // Parked sessions speak 3.0, on the sandbox's own database: a 3.2
        // session, or one on another database, is opened now.
        let parkable = startup.version == protocol::PROTOCOL_3_0 && target.is_own_database();
        let parked = if parkable { shared.parked.take(&sb) } else { None };
        if let Some(mut parked) = parked {
            // Airlock's own first, before anything the client asked for.
            let mut settings: Vec<_> = parked.connection_setting(connection).into_iter().collect();
            settings.extend(startup.settings.iter().chain(&startup.later).cloned());
            if parked.apply(&settings, super::parked::OPENED_WITH).await.is_ok() {
                if let Some(key) = parked.key.clone() {
                    open.set_backend(key);
                }
                return Ok((sb, parked, open));
            }
        }
        let socket = host.layout.sandbox_instance(&sb.id).socket();
        let user = host.sandbox_user(&sb).map_err(|e| internal(e).encode())?;
        let password = sb.dsn.as_deref().and_then(airlock_core::dsn::password).unwrap_or_default();
        let asked: &[(&str, &str)] = match handoff {
            true => &[(backend::HANDOFF, "on")],
            false => &[],
        };
        let attempt = async {
            let stream =
                airlock_postgres::socket::connect_instance(&socket, Some(&user), sb.pid.unwrap_or_default())
                    .await?;
            backend::login(stream, &startup.encode_with(AGENT_ROLE, &target.database, asked), &password).await
        };
        match attempt.await {
            Ok(backend) if backend.offered && !handoff => {
                return Err(ErrorResponse::fatal(
                    "08P01",
                    "the sandbox's server offered a hand-off that was not asked for",
                    "try again; if it persists, see the daemon's log",
                )
                .encode());
            }
            Ok(backend) if backend.offered => {
                if let Some(key) = backend.key.clone() {
                    open.set_backend(key);
                }
                return Ok((sb, backend, open));
            }
            Ok(mut backend) => {
                // Airlock's own first, before anything the client asked for.
                let mut later: Vec<_> = backend.connection_setting(connection).into_iter().collect();
                later.extend(startup.later.iter().cloned());
                match backend.apply(&later, &[]).await {
                    Ok(()) => {
                        if let Some(key) = backend.key.clone() {
                            open.set_backend(key);
                        }
                        return Ok((sb, backend, open));
                    }
                    // A session the server ended before the client heard of
                    // it (its server stopping for a suspend the lookup did not
                    // see yet) is opened again, as a failed login is.
                    Err(LoginError::Broken(e)) if Instant::now() < look_again_until => {
                        tracing::debug!(sandbox = %sb.id, error = %e, "a new server session ended; retrying");
                        drop(open);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err(e) => return Err(later_refused(e)),
                }
            }
            // The role's password inside the server is not the one the daemon
            // holds: put it back (as the admin) and try once more. Access is the
            // router's verifier's business; the server's password only joins the
            // router to the server.
            Err(LoginError::Refused { sqlstate, .. }) if sqlstate == "28P01" && !restored => {
                restored = true;
                if let Err(e) = sandbox::restore_credential(&host.layout, &sb).await {
                    tracing::warn!(sandbox = %sb.id, error = %e, "restoring the agent's password failed");
                }
            }
            // The server is shutting down (a suspend began after the lookup) or
            // not yet up: look again, and wait for it or wake it, a few times.
            Err(LoginError::Refused { sqlstate, .. })
                if sqlstate == "57P03" && Instant::now() < look_again_until =>
            {
                drop(open);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(LoginError::Refused { message, .. }) => return Err(message),
            // At its process limit (its own code forking, say) the server
            // cannot start a session for a while: wait a little for room.
            Err(LoginError::CouldNotStart(e)) if unstarted < airlock_postgres::wire::UNSTARTED_RETRY.0 => {
                unstarted += 1;
                tracing::debug!(sandbox = %sb.id, error = %e, "the server could not start a session; retrying");
                drop(open);
                tokio::time::sleep(airlock_postgres::wire::UNSTARTED_RETRY.1).await;
            }
            Err(LoginError::CouldNotStart(e)) => {
                return Err(ErrorResponse::fatal(
                    "53300",
                    format!("the sandbox's server could not start a process for the session: {e}"),
                    "the sandbox is at its process limit (code it runs may be forking); try again once it is not",
                )
                .encode());
            }
            // Suspended, reset or deleted since the lookup: look again, a few times.
            Err(LoginError::Broken(e)) if Instant::now() < look_again_until => {
                tracing::debug!(sandbox = %sb.id, error = %e, "opening a server session failed; retrying");
                drop(open);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(LoginError::Broken(e)) => {
                let hint = "try again; if it persists, see `airlock show ID` and the daemon's log";
                return Err(ErrorResponse::fatal(
                    "08006",
                    format!("the sandbox's server did not answer: {e}"),
                    hint,
                )
                .encode());
            }
        }
    }
}

/// What the client hears when the startup settings the router did not put in
/// the server's startup message (SET as the agent once the session is open)
/// fail: one the agent may not set (a superuser's, one fixed at server start,
/// an unknown one) ends the connection with the server's own words, which
/// name it.
fn later_refused(e: LoginError) -> Vec<u8> {
    let refused = match e {
        LoginError::Refused { sqlstate, message } => {
            let text = backend::field(&message[5..], b'M').unwrap_or_default();
            ErrorResponse {
                code: sqlstate,
                ..ErrorResponse::fatal(
                    "22023",
                    format!("a startup setting was refused: {text}"),
                    "connect without that setting, or with a value the session may SET: the router SETs startup \
                     settings as the sandbox's role once the session is open, so a setting that role may not \
                     change is refused as SET would refuse it",
                )
            }
        }
        e => ErrorResponse::fatal("08006", format!("the sandbox's server did not answer: {e}"), "try again"),
    };
    refused.encode()
}

/// Passes a cancel request to the sandbox whose backend has this key; unknown
/// keys are dropped silently, as PostgreSQL does.
async fn forward_cancel(shared: &Shared, key: &protocol::BackendKey) {
    if super::route::forward_cancel(shared, key).await {
        return;
    }
    if let Some(peers) = &shared.peers {
        if peers.cancel(key).await {
            return;
        }
    }
    let host = &shared.host;
    let Some(owner) = host.connections.backend_owner(key) else { return };
    let Ok(user) = host.store().sandbox(&owner).and_then(|sb| host.sandbox_user(&sb)) else { return };
    let socket = host.layout.sandbox_instance(&owner).socket();
    let Ok(mut server) = airlock_postgres::socket::connect_as(&socket, &user).await else { return };
    let _ = server.write_all(&key.cancel_request()).await;
    let _ = server.shutdown().await;
}
