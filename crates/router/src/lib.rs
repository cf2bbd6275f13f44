//! The router: one TCP port speaking the PostgreSQL wire protocol in front of
//! every sandbox (and, when asked, a unix socket for the host's own clients:
//! `local.rs`; and another port speaking Redis's: `redis.rs`). It reads a
//! client's startup packet, picks the sandbox from the database name (its id
//! or name), authenticates the client itself with SCRAM (channel-bound on
//! TLS) against the verifier the daemon minted, wakes the sandbox if it is
//! suspended, and joins the client to a server session on the sandbox's
//! private socket: one opened ahead for a warm-pool member, or a new one.
//!
//! It never logs a password or a message body. Each client is bounded: its
//! startup must finish within [`RouterConfig::startup_timeout`], its packets
//! are size-limited, and at most [`RouterConfig::max_connections`]
//! connections are open at once.

mod backend;
mod client;
pub mod connections;
pub mod elsewhere;
mod handoff;
pub mod host;
pub mod local;
pub mod parked;
pub mod peer;
pub mod process;
pub mod protocol;
mod redis;
pub mod refusals;
mod relay;
mod relayed;
mod route;
mod scram;
mod session;
pub mod target;
pub mod tls;

pub use airlock_lifecycle::doors::{Address, TlsMode};
pub use connections::{Connections, Open};
pub use elsewhere::{Directory, Relay, Remote};
pub use host::Host;
pub use peer::Peer;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, UnixListener};

use airlock_core::error::{Error, ErrorCode, Result};

/// Router settings (flags of `airlock serve`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouterConfig {
    /// Where to listen; `None` turns the router off.
    pub listen: Option<SocketAddr>,
    /// The host name DSNs carry (and the certificate names); the listen address if unset.
    pub advertise: Option<String>,
    /// TLS policy.
    pub tls: TlsMode,
    /// Operator-supplied certificate instead of a generated one.
    pub cert: Option<tls::CertFiles>,
    /// How long a client has to finish its startup (TLS, authentication included).
    pub startup_timeout: Duration,
    /// Open client connections allowed at once (on each port).
    pub max_connections: usize,
    /// Where the Redis front door listens; `None` turns it off.
    #[serde(default)]
    pub redis_listen: Option<SocketAddr>,
    /// In a cluster: where peer routers relay clients of this node's
    /// sandboxes, and who this node is (see [`elsewhere`]).
    #[serde(default)]
    pub relay: Option<RelaySettings>,
    /// Whether a plaintext client is handed to its server session
    /// (`handoff.rs`) rather than relayed.
    #[serde(default = "handoff_by_default")]
    pub handoff: bool,
    /// A directory where the router also listens on a unix socket,
    /// `.s.PGSQL.<port>` as PostgreSQL names its own, for clients on this
    /// host; `None` for none.
    #[serde(default)]
    pub socket_dir: Option<PathBuf>,
}

fn handoff_by_default() -> bool {
    true
}

/// A cluster node's router settings (`serve --cluster`): what its relay port
/// and its directory need. The router reads none of it itself: the
/// application makes a [`Relay`] of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelaySettings {
    /// Where the relay port listens.
    pub listen: SocketAddr,
    /// This node's name.
    pub node: String,
    /// Where this node's peers reach it (`serve --advertise`); its
    /// certificate names the host.
    pub advertise: String,
    /// The coordinator's client URLs (`serve --cluster`).
    pub coordinator: String,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT))),
            advertise: None,
            tls: TlsMode::Optional,
            cert: None,
            startup_timeout: Duration::from_secs(10),
            max_connections: 1000,
            redis_listen: Some(SocketAddr::from(([127, 0, 0, 1], DEFAULT_REDIS_PORT))),
            relay: None,
            handoff: true,
            socket_dir: None,
        }
    }
}

/// The router's default port.
pub const DEFAULT_PORT: u16 = 7432;
/// The Redis front door's default port.
pub const DEFAULT_REDIS_PORT: u16 = 7434;
/// The relay port's default, in a cluster.
pub const DEFAULT_RELAY_PORT: u16 = 7441;

/// What every connection task shares.
struct Shared {
    host: Arc<Host>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    /// The TLS certificate's `tls-server-end-point` binding, for SCRAM-SHA-256-PLUS.
    end_point: Option<Vec<u8>>,
    /// Sessions opened ahead for warm-pool members.
    parked: Arc<parked::Parked>,
    require_tls: bool,
    startup_timeout: Duration,
    /// Whether plaintext clients are handed to their server sessions.
    handoff: bool,
    /// Routed sessions' backend keys, for their cancel requests.
    routed: route::Keys,
    /// In a cluster: the other nodes' routers, for clients of their sandboxes.
    peers: Option<Arc<elsewhere::Peers>>,
}

/// Binds the router's port, with a clear error if it is taken.
pub async fn bind(listen: SocketAddr) -> Result<TcpListener> {
    let socket =
        if listen.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(listen).and_then(|()| socket.listen(1024)).map_err(|e| {
        Error::new(
            ErrorCode::InvalidRequest,
            format!("the router cannot listen on {listen}: {e}"),
            "pick another address with `airlock serve --router HOST:PORT` (port 0 picks a free one), or --router off",
        )
    })
}

/// Loads the TLS identity and serves `listener`, `local` for the host's own
/// clients, `redis` for the Redis front door and `relay`'s port in a cluster
/// (in the router's own process); returns the address DSNs name.
pub fn serve(
    host: Arc<Host>,
    config: &RouterConfig,
    (listener, local): (TcpListener, Option<UnixListener>),
    redis: Option<TcpListener>,
    relay: Option<Relay>,
) -> Result<Address> {
    let bound = listener.local_addr()?;
    let advertised = config.advertise.clone().unwrap_or_else(|| match bound.ip() {
        ip if ip.is_unspecified() => nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "localhost".into()),
        ip => ip.to_string(),
    });
    let identity = match config.tls {
        TlsMode::Off => None,
        _ => Some(tls::identity(&host.layout.tls(), config.cert.as_ref(), &advertised)?),
    };
    let redis_port = redis.as_ref().and_then(|l| l.local_addr().ok()).map(|a| a.port());
    let relay_port = relay.as_ref().and_then(|r| r.listener.local_addr().ok()).map(|a| a.port());
    let address = Address {
        host: advertised,
        port: bound.port(),
        tls: config.tls,
        ca: identity.as_ref().and_then(|i| i.ca.clone()),
        redis_port,
        relay_port,
        socket_dir: local.as_ref().and(config.socket_dir.clone()),
    };
    let peers = relay.as_ref().map(|r| Arc::new(elsewhere::Peers::new(r)));
    let redis_shared = Arc::new(redis::Shared {
        host: host.clone(),
        tls: identity.as_ref().map(|i| tokio_rustls::TlsAcceptor::from(i.config.clone())),
        require_tls: config.tls == TlsMode::Required,
        startup_timeout: config.startup_timeout,
        peers: peers.clone(),
    });
    if let Some(redis) = redis {
        let shared = redis_shared.clone();
        tracing::info!(port = redis_port, "Redis router listening");
        let slots = airlock_listen::slots::Slots::new(config.max_connections);
        let refusal = b"-ERR too many connections to the Airlock router\r\n".to_vec();
        tokio::spawn(accept_loop(redis, slots, refusal, move |tcp, peer, slot| {
            let shared = shared.clone();
            async move { redis::serve(&shared, tcp, peer, slot).await }
        }));
    }
    let parked = Arc::new(parked::Parked::default());
    tokio::spawn(parked.clone().keep(host.clone()));
    tokio::spawn(host.clone().keep_refusals());
    let shared = Arc::new(Shared {
        host,
        end_point: identity.as_ref().and_then(|i| i.end_point.clone()),
        parked,
        tls: identity.map(|i| tokio_rustls::TlsAcceptor::from(i.config)),
        require_tls: config.tls == TlsMode::Required,
        startup_timeout: config.startup_timeout,
        handoff: config.handoff,
        routed: route::Keys::default(),
        peers,
    });
    if let Some(relay) = relay {
        tracing::info!(port = relay_port, node = %relay.node, "relay port listening (mutual TLS)");
        let slots = airlock_listen::slots::Slots::new(config.max_connections);
        let relayed = relayed::Port { acceptor: relay.acceptor, slots, revoked: relay.revoked };
        tokio::spawn(relayed::serve(shared.clone(), redis_shared, relay.listener, relayed));
    }
    tracing::info!(%bound, tls = ?config.tls, "router listening");
    let refusal = protocol::ErrorResponse::fatal(
        "53300",
        "too many connections to the Airlock router",
        "close idle connections, or raise `airlock serve --router-max-connections`",
    )
    .encode();
    // The port and the socket share the router's connection slots.
    let slots = airlock_listen::slots::Slots::new(config.max_connections);
    if let Some(local) = local {
        let path = local.local_addr().ok().and_then(|a| a.as_pathname().map(|p| p.display().to_string()));
        tracing::info!(socket = path.as_deref().unwrap_or("?"), "router listening on its unix socket");
        let shared = shared.clone();
        tokio::spawn(accept_loop(local, slots.clone(), refusal.clone(), move |unix, peer, slot| {
            let shared = shared.clone();
            async move { session::serve(&shared, client::Plain::Local(unix), peer, slot).await }
        }));
    }
    tokio::spawn(accept_loop(listener, slots, refusal, move |tcp, peer, slot| {
        let shared = shared.clone();
        async move { session::serve(&shared, client::Plain::Tcp(tcp), peer, slot).await }
    }));
    Ok(address)
}

/// A listener the router takes clients from: a TCP port or a unix socket.
pub(crate) trait Accept: Send + 'static {
    /// A client's connection.
    type Stream: tokio::io::AsyncWrite + Unpin + Send + 'static;
    /// The next client, and where it connected from.
    fn next(&self) -> impl std::future::Future<Output = std::io::Result<(Self::Stream, Peer)>> + Send;
}

impl Accept for TcpListener {
    type Stream = tokio::net::TcpStream;

    async fn next(&self) -> std::io::Result<(Self::Stream, Peer)> {
        let (tcp, addr) = self.accept().await?;
        Ok((tcp, Peer::Tcp(addr)))
    }
}

impl Accept for UnixListener {
    type Stream = tokio::net::UnixStream;

    async fn next(&self) -> std::io::Result<(Self::Stream, Peer)> {
        loop {
            let (unix, _) = self.accept().await?;
            // A client the kernel names no user for is not served (never
            // seen on Linux); the others are not held up by it.
            match unix.peer_cred() {
                Ok(cred) => return Ok((unix, Peer::Local { uid: cred.uid(), pid: cred.pid() })),
                Err(e) => tracing::warn!(error = %e, "a client of the router's socket has no credentials"),
            }
        }
    }
}

/// Accepts clients on `listener` for as long as the router runs, `serve`ing
/// each in a slot of `slots`. A client that finds every slot taken takes the
/// one of the stalest client not yet authenticated (see [`airlock_listen::slots`]); when
/// every slot is held by an authenticated session, it gets `refusal` and is
/// closed.
pub(crate) async fn accept_loop<L, F, Fut>(
    listener: L,
    slots: Arc<airlock_listen::slots::Slots>,
    refusal: impl Into<Arc<[u8]>>,
    serve: F,
) where
    L: Accept,
    F: Fn(L::Stream, Peer, airlock_listen::slots::Slot) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let refusal: Arc<[u8]> = refusal.into();
    let serve = Arc::new(serve);
    loop {
        let (tcp, peer) = match listener.next().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors, usually: back off rather than spin.
                tracing::warn!(error = %e, "router accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (slots, refusal, serve) = (slots.clone(), refusal.clone(), serve.clone());
        let arrived = std::time::Instant::now();
        tokio::spawn(async move {
            match slots.take(peer.ip(), arrived).await {
                Some(slot) => serve(tcp, peer, slot).await,
                None => {
                    let mut tcp = tcp;
                    let _ = tokio::time::timeout(Duration::from_secs(1), tcp.write_all(&refusal)).await;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dsns_name_the_sandbox_and_how_to_verify_the_router() {
        let mut a = Address {
            host: "127.0.0.1".into(),
            port: 7432,
            tls: TlsMode::Optional,
            ca: None,
            redis_port: None,
            relay_port: None,
            socket_dir: None,
        };
        assert_eq!(a.dsn("sb-1", "pw"), "postgresql://airlock_agent:pw@127.0.0.1:7432/sb-1?sslmode=require");
        a.ca = Some("/var/lib/air lock/tls/ca.crt".into());
        assert_eq!(
            a.dsn("sb-1", "pw"),
            "postgresql://airlock_agent:pw@127.0.0.1:7432/sb-1?sslmode=verify-full&sslrootcert=/var/lib/air%20lock/tls/ca.crt"
        );
        a.host = "::1".into();
        a.tls = TlsMode::Off;
        assert_eq!(a.dsn("x", "pw"), "postgresql://airlock_agent:pw@[::1]:7432/x?sslmode=disable");
        assert_eq!(a.router_socket_dsn("x", "pw"), None, "no socket, no DSN for it");
        a.socket_dir = Some("/run/air lock".into());
        assert_eq!(
            a.router_socket_dsn("x", "pw").unwrap(),
            "postgresql://airlock_agent:pw@/x?host=/run/air%20lock&port=7432"
        );
    }
}
