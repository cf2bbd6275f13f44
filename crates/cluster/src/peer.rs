//! The node-to-node link: each node serves its API to its peers on
//! `--advertise` over TLS 1.3, a client certificate from the cluster CA
//! required; a request one node forwards to another goes over it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::http::{Answer, Ask};
use crate::records::NodeRecord;
use airlock_core::error::{Error, ErrorCode, Result};

/// Marks a request that came in on the peer listener: another node
/// forwarded it, so it is served where it arrives, never forwarded again.
/// Only the peer listener's router sets it (a header would let any client of
/// the daemon's other doors claim it).
#[derive(Debug, Clone, Copy)]
pub struct FromPeer;

/// How long a peer has to finish its TLS handshake.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(5);

/// Handshakes under way at once; a newcomer beyond them takes the stalest one's place.
const HANDSHAKES: usize = 64;

/// Connections whose peer proved a certificate of the cluster's CA, for the
/// API's HTTP server.
pub struct PeerListener {
    accepted: mpsc::Receiver<(PeerStream, SocketAddr)>,
    local: SocketAddr,
}

/// A peer's connection, cut off at its next read once its certificate is
/// revoked: a node kept out cannot go on through a connection it opened
/// before (a kept-open one would otherwise serve it for as long as it
/// sends requests).
pub struct PeerStream {
    tls: TlsStream<TcpStream>,
    /// The peer certificate's fingerprint, taken once at the handshake.
    fingerprint: String,
    revoked: Arc<crate::revoked::Revoked>,
    /// The revoked list's number when the certificate was last looked up
    /// in it, and whether it was listed then: looked up again only when a
    /// newer list is taken, never on every read.
    checked: (u64, bool),
}

impl tokio::io::AsyncRead for PeerStream {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let number = self.revoked.number();
        if number != self.checked.0 {
            self.checked = (number, self.revoked.refuses_fingerprint(&self.fingerprint));
        }
        if self.checked.1 {
            let cut = std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                "the peer's certificate was revoked",
            );
            return std::task::Poll::Ready(Err(cut));
        }
        std::pin::Pin::new(&mut self.tls).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for PeerStream {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.tls).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.tls).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.tls).poll_shutdown(cx)
    }
}

impl PeerListener {
    /// Listens on `addr`; handshakes run beside each other, each within its
    /// limit. A connection is cut off once `revoked` lists its certificate.
    pub async fn bind(
        addr: SocketAddr,
        config: Arc<rustls::ServerConfig>,
        revoked: Arc<crate::revoked::Revoked>,
    ) -> Result<PeerListener> {
        let listener = TcpListener::bind(addr).await.map_err(|e| {
            Error::new(
                ErrorCode::InvalidArguments,
                format!("the node-to-node address {addr} cannot be had: {e}"),
                "give --advertise an address of this host and a free port",
            )
        })?;
        let local = listener.local_addr()?;
        let (tx, accepted) = mpsc::channel(HANDSHAKES);
        let acceptor = TlsAcceptor::from(config);
        // A connection holds a slot only until its handshake is done. When
        // every slot is taken, a newcomer takes the one of the stalest
        // handshake from the address holding most: connections that never
        // finish theirs cannot keep a peer out (see `airlock_listen::slots`).
        let slots = airlock_listen::slots::Slots::new(HANDSHAKES);
        tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!(error = %e, "the node-to-node listener could not accept");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let (acceptor, tx, slots, revoked) =
                    (acceptor.clone(), tx.clone(), slots.clone(), revoked.clone());
                tokio::spawn(async move {
                    let Some(mut slot) = slots.take(Some(peer.ip()), std::time::Instant::now()).await else {
                        return;
                    };
                    let _ = tcp.set_nodelay(true);
                    let handshake = tokio::time::timeout(HANDSHAKE_LIMIT, acceptor.accept(tcp));
                    let done = tokio::select! {
                        done = handshake => done,
                        () = slot.given_up() => return,
                    };
                    drop(slot);
                    match done {
                        Ok(Ok(tls)) => {
                            // The handshake required a certificate: it is there.
                            let fingerprint = tls
                                .get_ref()
                                .1
                                .peer_certificates()
                                .and_then(|c| c.first())
                                .map(|c| crate::revoked::fingerprint(c))
                                .unwrap_or_default();
                            // Looked up at the first read (a list may have come since the handshake).
                            let stream = PeerStream { tls, fingerprint, revoked, checked: (0, false) };
                            let _ = tx.send((stream, peer)).await;
                        }
                        // Anyone who reaches the port can cause these: not worth a warning each.
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "refused a node-to-node connection"),
                        Err(_) => tracing::debug!(%peer, "a node-to-node handshake took too long"),
                    }
                });
            }
        });
        Ok(PeerListener { accepted, local })
    }
}

impl axum::serve::Listener for PeerListener {
    type Io = PeerStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(accepted) => accepted,
            // The acceptor ended (its runtime is stopping): nothing more comes.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// How long a connection to a peer is kept open with no request on it: well
/// under the peer's own wait for a next request, so it is never closed under
/// a request just sent.
const KEPT_IDLE: Duration = Duration::from_secs(4);
/// Idle connections kept to one peer, at most.
const KEPT_PER_PEER: usize = 8;

/// An open HTTP/1.1 connection to a peer, ready for a request.
type Sender = hyper::client::conn::http1::SendRequest<http_body_util::Full<Bytes>>;

/// This node as a client of its peers. Connections are kept open between
/// requests (a new one costs a TCP connection and a TLS handshake).
pub struct Peers {
    connector: TlsConnector,
    idle: Mutex<HashMap<String, Vec<(Instant, Sender)>>>,
}

impl Peers {
    /// A client with this node's identity.
    pub fn new(config: Arc<rustls::ClientConfig>) -> Peers {
        Peers { connector: TlsConnector::from(config), idle: Mutex::default() }
    }

    /// Sends a request to `node`'s API and brings its answer back whatever its status.
    pub async fn send(
        &self,
        node: &NodeRecord,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Bytes,
        limit: Duration,
    ) -> Result<Answer> {
        let whom = format!("node {}", node.name);
        let broken = |e: &dyn std::fmt::Display| crate::http::silent(&whom, e);
        let mut request = crate::http::request(Ask { method, path, content_type, body }, &whom)?;
        let work = async {
            // A kept connection first. One closed meanwhile gives the request
            // back unsent, and it goes on the next, or a new one.
            // Kept by the name dialled as well as the address: a connection
            // made to one node is never used for a record naming another.
            let key = format!("{}@{}", node.name, node.advertise);
            while let Some(mut sender) = self.take_idle(&key) {
                if sender.ready().await.is_err() {
                    continue;
                }
                match sender.try_send_request(request).await {
                    Ok(response) => {
                        let answer = crate::http::collect(response, &whom).await?;
                        self.keep(&key, sender);
                        return Ok(answer);
                    }
                    Err(mut e) => match e.take_message() {
                        Some(unsent) => request = unsent,
                        None => return Err(broken(&e.into_error())),
                    },
                }
            }
            let tls = self.dial(node).await?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                    .await
                    .map_err(|e| broken(&e))?;
            tokio::spawn(connection);
            let response = sender.send_request(request).await.map_err(|e| broken(&e))?;
            let answer = crate::http::collect(response, &whom).await?;
            self.keep(&key, sender);
            Ok(answer)
        };
        tokio::time::timeout(limit, work).await.unwrap_or_else(|_| Err(crate::http::late(&whom, limit)))
    }

    /// Closes every kept connection (certificates were revoked: the next
    /// request to each peer shows its certificate again).
    pub fn forget_kept(&self) {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// A kept connection to `address` that is still open, if there is one.
    fn take_idle(&self, address: &str) -> Option<Sender> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let kept = idle.get_mut(address)?;
        while let Some((since, sender)) = kept.pop() {
            if since.elapsed() < KEPT_IDLE && !sender.is_closed() {
                return Some(sender);
            }
        }
        None
    }

    /// Keeps a connection whose answer has been read, for the next request.
    fn keep(&self, address: &str, sender: Sender) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let kept = idle.entry(address.to_owned()).or_default();
        kept.retain(|(since, s)| since.elapsed() < KEPT_IDLE && !s.is_closed());
        if kept.len() < KEPT_PER_PEER {
            kept.push((Instant::now(), sender));
        }
    }

    /// Sends a `GET` to `node`'s API; its status and its body, to be read as
    /// it comes. The head must come within `limit`.
    pub async fn open(
        &self,
        node: &NodeRecord,
        path: &str,
        limit: Duration,
    ) -> Result<(u16, hyper::body::Incoming)> {
        let tls = self.dial(node).await?;
        let ask = Ask { method: "GET", path, content_type: None, body: Bytes::new() };
        crate::http::open(tls, ask, limit, &format!("node {}", node.name)).await
    }

    /// A mutually authenticated connection to `node`'s API.
    async fn dial(&self, node: &NodeRecord) -> Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let unreachable = |why: String| {
            Error::new(
                ErrorCode::ClusterUnavailable,
                format!("node {} could not be reached at {}: {why}", node.name, node.advertise),
                "check that its daemon runs and that this node reaches its --advertise address; `airlock nodes` lists the nodes",
            )
        };
        // The node is checked by its name, which its certificate carries:
        // a record that points one node's name at another's address (or a
        // member's certificate served anywhere) does not pass for it.
        let server_name = rustls::pki_types::ServerName::try_from(node.name.clone())
            .map_err(|e| unreachable(e.to_string()))?;
        let tcp = tokio::time::timeout(HANDSHAKE_LIMIT, TcpStream::connect(&node.advertise))
            .await
            .map_err(|_| unreachable("no connection within 5s".into()))?
            .map_err(|e| unreachable(e.to_string()))?;
        let _ = tcp.set_nodelay(true);
        tokio::time::timeout(HANDSHAKE_LIMIT, self.connector.connect(server_name, tcp))
            .await
            .map_err(|_| unreachable("no TLS handshake within 5s".into()))?
            .map_err(|e| unreachable(e.to_string()))
    }
}
