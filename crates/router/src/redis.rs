//! The Redis front door: one TCP port in front of every sandbox's Redis. TLS
//! and plaintext share it, told apart by the first byte (a TLS handshake
//! starts with 0x16, a Redis command never does), with the PostgreSQL port's
//! identity, so `rediss://` URLs verify against the same CA.
//!
//! A client's first command must authenticate: `AUTH <sandbox-id> <password>`
//! or `HELLO <version> AUTH <sandbox-id> <password> ...`. The ACL user is named
//! after the sandbox, so the command goes to that sandbox's server as it was
//! sent and the server checks the password; a suspended sandbox is woken only
//! for a client whose password matches the daemon's verifier. Anything before
//! authentication gets a clear `-NOAUTH`; after three, the connection closes.
//! An unknown sandbox, a sandbox without Redis and a wrong password get the
//! same `-WRONGPASS`. Commands and passwords are never logged.
//!
//! Once authenticated, a session is relayed both ways ([`relay`]), and a
//! command over [`airlock_redis::commands::LIMIT`] is refused with an error reply.

use super::peer::Peer;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{
    AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufStream,
};
use tokio::net::TcpStream;

use super::Host;
use airlock_core::events::EventKind;
use airlock_lifecycle::sandbox::SandboxState;

use airlock_redis::relay;

/// Arguments of a command read before authentication, at most.
const MAX_ARGS: usize = 16;
/// Bytes of one such argument, at most.
const MAX_ARG: usize = 4096;
/// Commands a client may send before it authenticates.
const TRIES: usize = 3;

/// What every Redis connection task shares.
pub struct Shared {
    /// The router's view of its data root.
    pub host: Arc<Host>,
    /// The TLS acceptor, when TLS is on.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// Whether plaintext clients are refused.
    pub require_tls: bool,
    /// How long a client has to authenticate.
    pub startup_timeout: Duration,
    /// In a cluster: the other nodes' routers, for clients of their sandboxes.
    pub(super) peers: Option<Arc<super::elsewhere::Peers>>,
}

const WRONGPASS: &[u8] = b"-WRONGPASS invalid username-password pair or user is disabled.\r\n";

/// Serves one client in its router slot, which it gives up when told to
/// until its credential is accepted (see [`airlock_listen::slots`]).
pub async fn serve(shared: &Shared, tcp: TcpStream, peer: Peer, mut slot: airlock_listen::slots::Slot) {
    let marker = slot.marker();
    tokio::select! {
        () = connection(shared, tcp, peer, &marker) => {}
        () = slot.given_up() => {}
    }
}

/// Serves a client another node's router relayed here (its TLS ended there),
/// as its own.
pub(super) async fn serve_relayed(
    shared: &Shared,
    tls: tokio_rustls::server::TlsStream<TcpStream>,
    header: super::elsewhere::Header,
    mut slot: airlock_listen::slots::Slot,
) {
    let marker = slot.marker();
    let deadline = Instant::now() + shared.startup_timeout;
    let client_at = (header.peer, header.tls.is_some());
    tokio::select! {
        () = session(shared, BufStream::new(tls), deadline, client_at, &marker, Some(&header.node)) => {}
        () = slot.given_up() => {}
    }
}

/// One client: TLS or not, then its session.
async fn connection(shared: &Shared, tcp: TcpStream, peer: Peer, slot: &airlock_listen::slots::Marker) {
    let _ = tcp.set_nodelay(true);
    let deadline = Instant::now() + shared.startup_timeout;
    let mut first = [0u8; 1];
    let peeked = tokio::time::timeout_at(deadline.into(), tcp.peek(&mut first)).await;
    if !matches!(peeked, Ok(Ok(1))) {
        return;
    }
    match (first[0] == 0x16, &shared.tls) {
        (true, Some(tls)) => match tokio::time::timeout_at(deadline.into(), tls.accept(tcp)).await {
            Ok(Ok(stream)) => {
                session(shared, BufStream::new(stream), deadline, (peer, true), slot, None).await
            }
            _ => tracing::debug!(%peer, "a Redis client's TLS handshake failed"),
        },
        (true, None) => {}
        (false, _) if shared.require_tls => {
            let mut tcp = tcp;
            let _ = tcp.write_all(b"-ERR this router takes TLS only: connect with rediss://\r\n").await;
        }
        (false, _) => session(shared, BufStream::new(tcp), deadline, (peer, false), slot, None).await,
    }
}

/// Reads the client's first commands until one authenticates, then joins it
/// to its sandbox's server. `client_at` is its address and whether it came by
/// TLS; `entry`, the node whose router passed it on, when another did.
async fn session<S: AsyncRead + AsyncWrite + Unpin + Send>(
    shared: &Shared,
    mut client: BufStream<S>,
    deadline: Instant,
    client_at: (Peer, bool),
    slot: &airlock_listen::slots::Marker,
    entry: Option<&str>,
) {
    for _ in 0..TRIES {
        let Ok(Ok(Some(args))) = tokio::time::timeout_at(deadline.into(), read_command(&mut client)).await
        else {
            return;
        };
        let name = args.first().map(|a| a.to_ascii_uppercase()).unwrap_or_default();
        let credential = match name.as_slice() {
            b"AUTH" if args.len() == 3 => Some((args[1].clone(), args[2].clone())),
            b"HELLO" => {
                let at = args.iter().position(|a| a.eq_ignore_ascii_case(b"AUTH"));
                at.and_then(|i| Some((args.get(i + 1)?.clone(), args.get(i + 2)?.clone())))
            }
            _ => None,
        };
        let reply: &[u8] = match (name.as_slice(), credential) {
            (_, Some((user, password))) => {
                let user = String::from_utf8_lossy(&user).into_owned();
                let password = String::from_utf8_lossy(&password).into_owned();
                // A sandbox this node does not hold may be another node's
                // (never for a client relayed here: that would go round).
                if let (Some(peers), None) = (&shared.peers, entry) {
                    if shared.host.store().sandbox(&user).is_err() {
                        if let Ok(Some(remote)) = peers.owner(&user).await {
                            return pass_on(peers, client, &remote, &args, client_at, slot).await;
                        }
                    }
                }
                join(shared, client, (&user, &password), &args, (client_at, entry), slot).await;
                return;
            }
            (b"QUIT", _) => {
                let _ = client.write_all(b"+OK\r\n").await;
                let _ = client.flush().await;
                return;
            }
            (b"AUTH", _) => {
                b"-WRONGPASS name the sandbox as the user: AUTH <sandbox-id> <password>\r\n"
            }
            _ => b"-NOAUTH Authentication required: send AUTH <sandbox-id> <password> (or HELLO 3 AUTH <sandbox-id> <password>) first\r\n",
        };
        if client.write_all(reply).await.is_err() || client.flush().await.is_err() {
            return;
        }
    }
}

/// Passes a client of another node's sandbox on to that node's router: its
/// authenticating command, after the header saying how it came.
async fn pass_on<S: AsyncRead + AsyncWrite + Unpin + Send>(
    peers: &super::elsewhere::Peers,
    mut client: BufStream<S>,
    remote: &super::elsewhere::Remote,
    command: &[Vec<u8>],
    (peer, tls): (Peer, bool),
    slot: &airlock_listen::slots::Marker,
) {
    let tls = tls.then(|| "tls=yes".to_owned());
    let header = peers.header(super::elsewhere::Door::Redis, peer, tls, None);
    let dialed = async {
        let mut owner = peers.dial(remote, &header).await?;
        owner.write_all(&airlock_redis::resp::command(command)).await?;
        owner.flush().await?;
        std::io::Result::Ok(owner)
    };
    match dialed.await {
        Ok(owner) => super::elsewhere::relay_redis(client, owner, || slot.prove()).await,
        Err(e) => {
            tracing::warn!(node = %remote.node, error = %e, "a Redis client could not be relayed to its sandbox's node");
            let _ = client
                .write_all(b"-ERR the sandbox cannot be reached through this router now; try again\r\n")
                .await;
            let _ = client.flush().await;
        }
    }
}

/// Sends the authenticating command to the sandbox's server and relays both
/// ways until either side closes. A connection its sandbox's server accepted,
/// or refused the credential of, is an event (as on the PostgreSQL port).
async fn join<S: AsyncRead + AsyncWrite + Unpin + Send>(
    shared: &Shared,
    mut client: BufStream<S>,
    (user, password): (&str, &str),
    command: &[Vec<u8>],
    (client_at, entry): ((Peer, bool), Option<&str>),
    slot: &airlock_listen::slots::Marker,
) {
    let refuse = |mut client: BufStream<S>| async move {
        let _ = client.write_all(WRONGPASS).await;
        let _ = client.flush().await;
    };
    let Ok(sb) = shared.host.store().sandbox(user) else { return refuse(client).await };
    let dir = shared.host.layout.sandbox_instance(&sb.id);
    if sb.id != user || !airlock_redis::server::configured(&dir) {
        return refuse(client).await;
    }
    // Past its expiry a credential is dead, whether the daemon (which deletes
    // the sandbox then) runs or not.
    if sb.expires_at <= airlock_core::clock::Timestamp::now() {
        return refuse(client).await;
    }
    if sb.state == SandboxState::Suspended {
        // Only a client holding the credential wakes a sandbox.
        let known = sb.verifier.as_deref().and_then(airlock_postgres::scram::Verifier::parse);
        if !known.is_some_and(|v| v.accepts(password)) {
            record(shared, &sb, EventKind::ConnectionRefused, client_at, entry).await;
            return refuse(client).await;
        }
        slot.prove();
        if let Err(e) = shared.host.wake(&sb.id, Instant::now() + Duration::from_secs(60)).await {
            let _ = client
                .write_all(format!("-ERR {}\r\n", e.message.replace(['\r', '\n'], " ")).as_bytes())
                .await;
            let _ = client.flush().await;
            return;
        }
    }
    let Ok(backend) = airlock_redis::server::connect(&dir).await else {
        let _ = client.write_all(b"-ERR the sandbox's Redis is not running; try again in a moment\r\n").await;
        let _ = client.flush().await;
        return;
    };
    let mut backend = BufStream::new(backend);
    if backend.write_all(&airlock_redis::resp::command(command)).await.is_err()
        || backend.flush().await.is_err()
    {
        return;
    }
    // A refused credential ends the connection here: it neither counts as
    // the sandbox's use (keeping it from idle suspend) nor gets more tries.
    let answer_by = Instant::now() + Duration::from_secs(10);
    let refused = match tokio::time::timeout_at(answer_by.into(), backend.fill_buf()).await {
        Ok(Ok(reply)) => reply.first() == Some(&b'-'),
        _ => return,
    };
    if refused {
        record(shared, &sb, EventKind::ConnectionRefused, client_at, entry).await;
        let mut line = Vec::new();
        let _ = (&mut backend).take(1024).read_until(b'\n', &mut line).await;
        let _ = client.write_all(&line).await;
        let _ = client.flush().await;
        return;
    }
    slot.prove();
    let _open = shared.host.connections.open(&sb.id);
    // The server's answer to AUTH is still unread: the client hears it only
    // once the connection is on record.
    if !record(shared, &sb, EventKind::Connected, client_at, entry).await {
        let _ = client.write_all(b"-ERR the audit log could not be written; nothing was granted\r\n").await;
        let _ = client.flush().await;
        return;
    }
    // A session does not outlive its sandbox's expiry either: the router cuts
    // it itself, as on the PostgreSQL port.
    tokio::select! {
        ended = relay::relay(client, backend) => {
            if let relay::Ended::Refused { size } = ended {
                tracing::info!(sandbox = %sb.id, size, "a Redis command over the size limit was refused");
            }
        }
        () = super::session::expiry(&shared.host, &sb.id) => {}
    }
    shared.host.touch(&sb.id);
}

/// Records a connection its sandbox's server accepted or refused; whether the
/// record was written.
async fn record(
    shared: &Shared,
    sb: &airlock_lifecycle::sandbox::Sandbox,
    kind: EventKind,
    client_at: (Peer, bool),
    entry: Option<&str>,
) -> bool {
    let store =
        Some(airlock_lifecycle::sandbox::stores::StoreKind::name(&airlock_lifecycle::sandbox::stores::Redis));
    match shared.host.record_connection(sb, kind, client_at, store, serde_json::json!({}), entry).await {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(sandbox = %sb.id, error = %e, "a Redis connection's record could not be written");
            false
        }
    }
}

/// Reads one command, as an array of bulk strings or an inline line; `None`
/// at the end of the stream. Bounded in arguments and in bytes.
async fn read_command(stream: &mut (impl AsyncBufRead + Unpin)) -> std::io::Result<Option<Vec<Vec<u8>>>> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
    let mut head = Vec::new();
    (&mut *stream).take(MAX_ARG as u64 * 4).read_until(b'\n', &mut head).await?;
    if head.is_empty() {
        return Ok(None);
    }
    if !head.ends_with(b"\n") {
        return Err(bad("a line too long"));
    }
    let text = String::from_utf8_lossy(&head).trim_end().to_owned();
    let Some(count) = text.strip_prefix('*') else {
        // An inline command: words separated by spaces.
        let args: Vec<Vec<u8>> = text.split_whitespace().map(|w| w.as_bytes().to_vec()).collect();
        if args.len() > MAX_ARGS {
            return Err(bad("too many arguments"));
        }
        return Ok(Some(args));
    };
    let count: usize = count.parse().map_err(|_| bad("a bad count"))?;
    if count == 0 || count > MAX_ARGS {
        return Err(bad("too many arguments"));
    }
    let mut args = Vec::with_capacity(count);
    for _ in 0..count {
        let mut size = Vec::new();
        (&mut *stream).take(32).read_until(b'\n', &mut size).await?;
        let size = String::from_utf8_lossy(&size);
        let n: usize = size
            .trim_end()
            .strip_prefix('$')
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| bad("a bad length"))?;
        if n > MAX_ARG {
            return Err(bad("an argument too long"));
        }
        let mut arg = vec![0u8; n + 2];
        stream.read_exact(&mut arg).await?;
        arg.truncate(n);
        args.push(arg);
    }
    Ok(Some(args))
}
