//! One client connection through the router: negotiate TLS, read the startup
//! message, find (and wake) the sandbox, relay authentication, then pass bytes
//! both ways until either side closes.

use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

use super::protocol::{self, shown, ErrorResponse, FirstPacket, PacketError, Startup};
use super::relay;
use super::Shared;
use crate::error::ErrorCode;
use crate::events::NewEvent;
use crate::pg::dsn::{AGENT_ROLE, DATABASE};
use crate::sandbox::{self, Sandbox, SandboxState};

/// A client stream, plaintext or TLS.
enum Client {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl AsyncRead for Client {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Client::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Client::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Client {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Client::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Client::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Client::Plain(s) => Pin::new(s).poll_flush(cx),
            Client::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Client::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Client::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Serves one client until it or its sandbox hangs up.
pub(super) async fn serve(shared: &Shared, tcp: TcpStream, peer: SocketAddr) {
    let _ = tcp.set_nodelay(true);
    let established = tokio::time::timeout(shared.startup_timeout, establish(shared, tcp, peer)).await;
    // A client that has not finished its startup in time is simply dropped.
    let Ok(Some((client, server, open))) = established else { return };
    // When the client goes, whatever its backend is running is cancelled: a
    // dropped client's query must not run on (the backend then finds its
    // connection closed and ends). Harmless if the session ended normally.
    let client_gone = async {
        if let Some((pid, key)) = open.backend() {
            forward_cancel(shared, pid, key).await;
        }
    };
    let relayed = match client {
        Client::Plain(tcp) => relay::plain(tcp, server, client_gone).await,
        Client::Tls(tls) => relay::tls(*tls, server, client_gone).await,
    };
    if let Err(e) = relayed {
        tracing::debug!(error = %e, "relay ended with an error");
    }
    drop(open);
}

/// Sends a refusal and flushes it; the caller then drops the connection.
async fn refuse(client: &mut Client, error: ErrorResponse) {
    let _ = client.write_all(&error.encode()).await;
    let _ = client.flush().await;
    let _ = client.shutdown().await;
}

async fn establish(
    shared: &Shared,
    tcp: TcpStream,
    peer: SocketAddr,
) -> Option<(Client, UnixStream, super::Open)> {
    let mut client = Client::Plain(tcp);
    let mut tls = false;
    let startup = loop {
        match protocol::read_first_packet(&mut client).await {
            Ok(FirstPacket::SslRequest) if !tls => match (&shared.tls, client) {
                (Some(acceptor), Client::Plain(mut tcp)) => {
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
            Ok(FirstPacket::Cancel { pid, key }) => {
                forward_cancel(shared, pid, key).await;
                return None;
            }
            Ok(FirstPacket::Startup(startup)) => break startup,
            Err(PacketError::Io(_)) => return None,
            Err(e) => {
                let hint = "connect with a PostgreSQL client (libpq, psql, a driver) using the sandbox's DSN";
                refuse(&mut client, ErrorResponse::fatal("08P01", e.to_string(), hint)).await;
                return None;
            }
        }
    };
    if shared.require_tls && !tls {
        let e = ErrorResponse::fatal(
            "28000",
            "the Airlock router accepts only TLS connections",
            "connect with sslmode=require or verify-full (the DSN `airlock fork` prints does)",
        );
        refuse(&mut client, e).await;
        return None;
    }
    let user = startup.user.as_str();
    // Only the agent role. (The server gets a startup message the router builds
    // with the agent role in it, over a connection made with the sandbox's OS
    // identity, which peer authentication maps to no role: asking for another
    // role could never reach the admin's, but is refused here, clearly.)
    if user != AGENT_ROLE {
        let e = ErrorResponse::fatal(
            "28000",
            format!("role \"{}\" cannot connect through the router", shown(user)),
            format!("connect as {AGENT_ROLE} with the DSN `airlock fork` printed"),
        );
        refuse(&mut client, e).await;
        return None;
    }
    let key = startup.database.clone();
    // One of the sandbox's few places for clients not yet authenticated (by id,
    // whichever of id or name the client gave).
    let place = shared.engine.store().sandbox(&key).map(|sb| sb.id).unwrap_or_else(|_| key.clone());
    let _authenticating = shared.engine.connections.authenticating(&place).await;
    let (sb, server, mut open) = match connect(shared, &key).await {
        Ok(connected) => connected,
        Err(e) => {
            refuse(&mut client, e).await;
            return None;
        }
    };
    match authenticate(&mut client, server, &startup, &mut open).await {
        Ok(Some(server)) => {
            record(shared, &sb, crate::events::EventKind::Connected, peer, tls);
            Some((client, server, open))
        }
        Ok(None) => {
            record(shared, &sb, crate::events::EventKind::ConnectionRefused, peer, tls);
            None
        }
        Err(_) => None,
    }
}

/// Records the connection off the client's path: the client's first query is
/// already on its way and must not wait for the store.
fn record(shared: &Shared, sb: &Sandbox, kind: crate::events::EventKind, peer: SocketAddr, tls: bool) {
    let event = NewEvent {
        kind,
        sandbox: Some(sb.id.clone()),
        golden: Some(sb.golden.clone()),
        detail: json!({"client": peer.to_string(), "tls": tls}),
        ..Default::default()
    };
    let engine = shared.engine.clone();
    tokio::task::spawn_blocking(move || {
        if let Err(e) = engine.store().record(event) {
            tracing::warn!(error = %e, "recording a router connection failed");
        }
    });
}

fn not_found(key: &str) -> ErrorResponse {
    ErrorResponse::fatal(
        "3D000",
        format!("sandbox \"{}\" does not exist", shown(key)),
        "it may have expired or been deleted: fork a new one (`airlock fork GOLDEN`) and connect with the DSN it prints",
    )
}

/// Finds the sandbox, wakes it if suspended, waits out a reset in progress, and
/// opens its socket. A sandbox suspended between lookup and connect is woken on
/// the next round.
async fn connect(shared: &Shared, key: &str) -> Result<(Sandbox, UnixStream, super::Open), ErrorResponse> {
    let engine = &shared.engine;
    loop {
        let sb = match engine.store().sandbox(key) {
            Ok(sb) => sb,
            Err(e) if e.code == ErrorCode::SandboxNotFound || e.code == ErrorCode::InvalidName => {
                return Err(not_found(key))
            }
            Err(e) => return Err(ErrorResponse::fatal("XX000", e.message, e.hint)),
        };
        match sb.state {
            SandboxState::Running => {}
            SandboxState::Suspended => {
                if let Err(e) = sandbox::suspend::wake(engine, &sb.id).await {
                    let code = if e.code == ErrorCode::CapacityExhausted { "53300" } else { "57P03" };
                    return Err(ErrorResponse::fatal(
                        code,
                        format!("waking sandbox {} failed: {}", sb.id, e.message),
                        e.hint,
                    ));
                }
                continue;
            }
            // A reset or wake in progress: the sandbox comes back at the same address.
            SandboxState::Creating | SandboxState::Resetting => {
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
            SandboxState::Deleting | SandboxState::Pooled => return Err(not_found(key)),
        }
        let open = engine.connections.open(&sb.id);
        let socket = engine.layout.sandbox_instance(&sb.id).socket();
        let user = engine.sandbox_user(&sb).map_err(|e| ErrorResponse::fatal("XX000", e.message, e.hint))?;
        match crate::pg::socket::connect_instance(&socket, Some(&user), sb.pid.unwrap_or_default()).await {
            Ok(server) => return Ok((sb, server, open)),
            // Suspended or deleted since the lookup: look again.
            Err(_) => {
                drop(open);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

/// Sends the startup message (with the sandbox's database) and relays
/// authentication until the server is ready for queries; returns the server
/// stream then, or `None` if the server refused (its error already passed on).
///
/// Server messages are read through a buffer and passed on in batches, flushed
/// only when the client must answer or the server is done: a session start is a
/// dozen small messages, and one write each would cost a segment each.
async fn authenticate(
    client: &mut Client,
    server: UnixStream,
    startup: &Startup,
    open: &mut super::Open,
) -> Result<Option<UnixStream>, PacketError> {
    let mut server = tokio::io::BufReader::new(server);
    server.get_mut().write_all(&startup.encode_for(AGENT_ROLE, DATABASE)).await?;
    let mut pending = Vec::new();
    loop {
        let m = protocol::read_server_message(&mut server).await?;
        pending.extend_from_slice(&m.bytes);
        match m.tag {
            b'R' if m.auth_code().is_some_and(protocol::expects_client_answer) => {
                client.write_all(&pending).await?;
                client.flush().await?;
                pending.clear();
                let answer = protocol::read_client_auth(client).await?;
                server.get_mut().write_all(&answer.bytes).await?;
            }
            b'K' => {
                if let Some((pid, key)) = m.backend_key() {
                    open.set_backend(pid, key);
                }
            }
            b'Z' | b'E' => {
                // Nothing follows until the client speaks, but pass on anything buffered.
                pending.extend_from_slice(server.buffer());
                client.write_all(&pending).await?;
                client.flush().await?;
                return Ok((m.tag == b'Z').then(|| server.into_inner()));
            }
            _ => {}
        }
    }
}

/// Passes a cancel request to the sandbox whose backend has this key; unknown
/// keys are dropped silently, as PostgreSQL does.
async fn forward_cancel(shared: &Shared, pid: i32, key: i32) {
    let engine = &shared.engine;
    let Some(owner) = engine.connections.backend_owner(pid, key) else { return };
    let Ok(user) = engine.store().sandbox(&owner).and_then(|sb| engine.sandbox_user(&sb)) else { return };
    let socket = engine.layout.sandbox_instance(&owner).socket();
    let Ok(mut server) = crate::pg::socket::connect_as(&socket, &user).await else { return };
    let mut packet = Vec::with_capacity(16);
    packet.extend_from_slice(&16i32.to_be_bytes());
    packet.extend_from_slice(&80877102i32.to_be_bytes());
    packet.extend_from_slice(&pid.to_be_bytes());
    packet.extend_from_slice(&key.to_be_bytes());
    let _ = server.write_all(&packet).await;
    let _ = server.shutdown().await;
}
