//! Sandboxes another node of the cluster holds. Any node's router takes their
//! clients and relays them, over mutual TLS under the cluster's CA, to the
//! router of the node that holds the sandbox (its owner), which serves them as
//! its own ([`super::relayed`]).
//!
//! The entry router reads only what names the sandbox (the startup packet, or
//! Redis's `AUTH`). The client's TLS ends at the entry router; its
//! authentication is the owner's: the startup and the SCRAM exchange go
//! through untouched, after a [`Header`] saying how the client came (its
//! address, its TLS, and the entry router's certificate binding, so that
//! SCRAM-SHA-256-PLUS binds to the certificate the client saw). The owner
//! believes the header because only a certificate of the cluster's CA opens
//! its relay port, and a member is trusted with the whole cluster already.
//! Neither the client's password nor the sandbox's verifier leaves the owner.
//!
//! The entry router reads the owner's first messages as they pass, for the
//! session's backend key: a cancel request for it, which the client sends to
//! the entry router, is passed to the owner.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::client::Client;
use super::peer::Peer;
use super::protocol::{self, BackendKey, ErrorResponse};
use airlock_core::error::Result;
use airlock_core::secret::{hex, unhex};

/// How long a peer router has to connect and finish its TLS handshake.
pub(super) const HANDSHAKE: Duration = Duration::from_secs(5);
/// The longest [`Header`] line.
pub(super) const MAX_HEADER: usize = 4096;
/// What a relayed stream starts with, before its header's JSON.
const MAGIC: &str = "AIRLOCK-RELAY-1 ";

/// Where the sandboxes other nodes hold are: the cluster's directory, which
/// the application provides (the router knows no coordinator).
#[async_trait::async_trait]
pub trait Directory: Send + Sync {
    /// The node holding sandbox `key` (an id or a name) when another node
    /// does; None when none does. An error (the owner lost, the directory out
    /// of reach) is told to the client.
    async fn owner(&self, key: &str) -> Result<Option<Remote>>;
}

/// Another node's router, as the directory names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    /// The node's name (and its certificate's).
    pub node: String,
    /// Where its router's relay port listens (`HOST:PORT`).
    pub relay: String,
}

/// What a router in a cluster runs with: its relay port, the cluster's
/// mutual TLS, and the directory.
pub struct Relay {
    /// This node's name, told to owners in each relayed client's header.
    pub node: String,
    /// The relay port, bound.
    pub listener: TcpListener,
    /// This node's certificate, and a cluster certificate required of every peer.
    pub acceptor: tokio_rustls::TlsAcceptor,
    /// This node's certificate for its peers, and the cluster's CA as the only root.
    pub connector: tokio_rustls::TlsConnector,
    /// Who holds what.
    pub directory: Arc<dyn Directory>,
    /// Whether a peer's certificate (DER) has been revoked since: a relayed
    /// session that came with it is then cut off.
    pub revoked: Arc<dyn Fn(&[u8]) -> bool + Send + Sync>,
}

/// The entry side, shared by every client task.
pub(super) struct Peers {
    pub node: String,
    pub connector: tokio_rustls::TlsConnector,
    pub directory: Arc<dyn Directory>,
    /// Relayed sessions' backend keys, and the node each is on.
    keys: Mutex<HashMap<BackendKey, Remote>>,
}

/// Which front door a relayed client came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Door {
    Postgres,
    Redis,
}

/// How a relayed client came to the entry router.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Header {
    /// Which port.
    pub door: Door,
    /// The entry router's node.
    pub node: String,
    /// Where the client connected from.
    pub peer: Peer,
    /// The client's TLS (version and cipher), when it came by TLS.
    pub tls: Option<String>,
    /// The entry router's certificate's `tls-server-end-point` binding, in hex.
    pub end_point: Option<String>,
}

impl Header {
    /// The header's line.
    fn encode(&self) -> Vec<u8> {
        let mut line = MAGIC.as_bytes().to_vec();
        line.extend(serde_json::to_vec(self).expect("a header serializes"));
        line.push(b'\n');
        line
    }

    /// Reads a header line, byte by byte (what follows it is the client's).
    pub async fn read<S: AsyncRead + Unpin>(stream: &mut S) -> std::io::Result<Header> {
        let bad = |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_owned());
        let mut line = Vec::with_capacity(256);
        loop {
            let b = stream.read_u8().await?;
            if b == b'\n' {
                break;
            }
            if line.len() >= MAX_HEADER {
                return Err(bad("a relay header too long"));
            }
            line.push(b);
        }
        let json = line.strip_prefix(MAGIC.as_bytes()).ok_or_else(|| bad("not a relay header"))?;
        serde_json::from_slice(json).map_err(|e| bad(&format!("a relay header that does not read: {e}")))
    }

    /// The binding's bytes.
    pub fn binding(&self) -> Option<Vec<u8>> {
        unhex(self.end_point.as_deref()?)
    }
}

/// What a client of a sandbox this router cannot reach now is told, before it
/// has authenticated.
pub(super) fn unreachable_now(key: &str) -> ErrorResponse {
    ErrorResponse::fatal(
        "57P03",
        format!("sandbox \"{}\" cannot be reached through this router now", protocol::shown(key)),
        "try again in a moment, or connect with the DSN its fork returned",
    )
}

impl Peers {
    pub fn new(relay: &Relay) -> Peers {
        Peers {
            node: relay.node.clone(),
            connector: relay.connector.clone(),
            directory: relay.directory.clone(),
            keys: Mutex::default(),
        }
    }

    /// The node holding `key`, if another does: None when none does; an
    /// error to tell the client otherwise. The client has not authenticated
    /// yet, so it is told that the sandbox cannot be reached now, not which
    /// node holds it or where etcd is (the log has those).
    pub async fn owner(&self, key: &str) -> std::result::Result<Option<Remote>, ErrorResponse> {
        self.directory.owner(key).await.map_err(|e| {
            tracing::warn!(sandbox = %protocol::shown(key), error = %e.message, "the owner of a sandbox could not be found");
            unreachable_now(key)
        })
    }

    /// A stream to `remote`'s relay port, its header sent.
    pub async fn dial(&self, remote: &Remote, header: &Header) -> std::io::Result<RelayStream> {
        let late =
            |what: &str| std::io::Error::new(std::io::ErrorKind::TimedOut, format!("no {what} within 5s"));
        // The owner is checked by its node's name, which its certificate
        // carries: a record pointing the name at another member does not pass.
        let name = rustls::pki_types::ServerName::try_from(remote.node.clone())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        let tcp = tokio::time::timeout(HANDSHAKE, TcpStream::connect(&remote.relay))
            .await
            .map_err(|_| late("connection"))??;
        let _ = tcp.set_nodelay(true);
        let mut tls = tokio::time::timeout(HANDSHAKE, self.connector.connect(name, tcp))
            .await
            .map_err(|_| late("TLS"))??;
        tls.write_all(&header.encode()).await?;
        Ok(tls)
    }

    /// A header for a client that came to this router.
    pub fn header(&self, door: Door, peer: Peer, tls: Option<String>, end_point: Option<&[u8]>) -> Header {
        Header { door, node: self.node.clone(), peer, tls, end_point: end_point.map(hex) }
    }

    /// Passes a cancel request to the node whose session has this key; true
    /// if one has.
    pub async fn cancel(&self, key: &BackendKey) -> bool {
        let remote = self.keys.lock().unwrap_or_else(|p| p.into_inner()).get(key).cloned();
        let Some(remote) = remote else { return false };
        let header = self.header(Door::Postgres, Peer::none(), None, None);
        if let Ok(mut stream) = self.dial(&remote, &header).await {
            let _ = stream.write_all(&key.cancel_request()).await;
            let _ = stream.flush().await;
            let _ = stream.shutdown().await;
        }
        true
    }

    /// Relays a PostgreSQL client (its startup read, and the same startup
    /// already passed to the owner) until either side ends. The owner's
    /// messages up to its first ReadyForQuery are read as they pass: its
    /// AuthenticationOk proves the client (`proved`), and its backend key is
    /// kept for cancel requests. `by` bounds that start. The session then
    /// goes on the threads a local session's relay uses ([`super::relay`]).
    pub async fn relay_postgres(
        &self,
        mut client: Client,
        mut owner: RelayStream,
        (sandbox, remote): (&str, &Remote),
        by: Instant,
        proved: impl FnOnce(),
    ) {
        let mut key = None;
        let mut answered = false;
        let started = tokio::time::timeout_at(
            by.into(),
            self.start(&mut client, &mut owner, remote, (&mut key, &mut answered), proved),
        )
        .await;
        if let Ok(Err(e)) = &started {
            tracing::warn!(node = %remote.node, relay = %remote.relay, error = %e, "a relayed client's start failed");
            // The owner never answered (its relay port refused this node, say):
            // the client is told so, as when the owner cannot be dialled.
            if !answered {
                let _ = client.write_all(&unreachable_now(sandbox).encode()).await;
            }
        }
        if matches!(started, Ok(Ok(true))) {
            let entering = match client {
                Client::Plain(plain) => super::relay::Entering::Plain(plain),
                Client::Tls(tls) => {
                    let (tcp, conn) = tls.into_inner();
                    super::relay::Entering::Tls(tcp, conn)
                }
            };
            // The client going ends the owner's session, which cancels what it ran.
            if let Err(e) = super::relay::between(entering, owner, async {}).await {
                tracing::debug!(error = %e, "a relayed session ended with an error");
            }
        } else {
            let _ = client.flush().await;
            let _ = client.shutdown().await;
        }
        if let Some(key) = key {
            self.keys.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
        }
    }

    /// Passes bytes both ways until the owner's first ReadyForQuery: true
    /// then; false if either side ended before (a refusal, say). The owner's
    /// messages are read whole as they pass; the client's bytes (its SCRAM
    /// answers) are passed on as they come. Each read can be given up without
    /// losing bytes, so the session can be handed over at that point.
    async fn start(
        &self,
        client: &mut Client,
        owner: &mut RelayStream,
        remote: &Remote,
        (key, answered): (&mut Option<BackendKey>, &mut bool),
        proved: impl FnOnce(),
    ) -> std::io::Result<bool> {
        let bad = |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_owned());
        let mut proved = Some(proved);
        let (mut down, mut up) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
        let mut from_owner: Vec<u8> = Vec::new();
        loop {
            tokio::select! {
                read = owner.read(&mut down) => {
                    let n = read?;
                    if n == 0 {
                        client.write_all(&from_owner).await?;
                        return Ok(false);
                    }
                    from_owner.extend_from_slice(&down[..n]);
                    let mut whole = 0;
                    let mut ready = false;
                    while from_owner.len() - whole >= 5 && !ready {
                        let at = &from_owner[whole..];
                        let len = i32::from_be_bytes([at[1], at[2], at[3], at[4]]);
                        if !(4..=protocol::MAX_SERVER_STARTUP_MESSAGE as i32).contains(&len) {
                            return Err(bad("the owner's router sent a message of no sensible length"));
                        }
                        if at.len() < 1 + len as usize {
                            break;
                        }
                        let (tag, body) = (at[0], &at[5..1 + len as usize]);
                        if tag == b'R' && body.get(..4) == Some(&[0, 0, 0, 0]) {
                            if let Some(proved) = proved.take() {
                                proved();
                            }
                        }
                        if let Some(k) = (tag == b'K').then(|| BackendKey::read(body)).flatten() {
                            self.keys.lock().unwrap_or_else(|p| p.into_inner()).insert(k.clone(), remote.clone());
                            *key = Some(k);
                        }
                        ready = tag == b'Z';
                        whole += 1 + len as usize;
                    }
                    // Whole messages go on at once (authentication asks the
                    // client); after ReadyForQuery, everything read.
                    let upto = if ready { from_owner.len() } else { whole };
                    *answered |= upto > 0;
                    client.write_all(&from_owner[..upto]).await?;
                    client.flush().await?;
                    from_owner.drain(..upto);
                    if ready {
                        return Ok(true);
                    }
                }
                read = client.read(&mut up) => {
                    let n = read?;
                    if n == 0 {
                        return Ok(false);
                    }
                    owner.write_all(&up[..n]).await?;
                    owner.flush().await?;
                }
            }
        }
    }
}

/// A stream to another node's relay port.
pub(super) type RelayStream = tokio_rustls::client::TlsStream<TcpStream>;

/// Relays a Redis client (its authenticating command already passed to the
/// owner) until either side ends; `proved` once the owner accepted it.
pub(super) async fn relay_redis<C>(client: C, owner: RelayStream, proved: impl FnOnce())
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    use tokio::io::AsyncBufReadExt;
    let mut owner = tokio::io::BufStream::new(owner);
    let mut client = client;
    let answered = tokio::time::timeout(Duration::from_secs(10), owner.fill_buf()).await;
    let refused = match answered {
        Ok(Ok(answer)) if !answer.is_empty() => answer[0] == b'-',
        _ => {
            let _ = client.write_all(b"-ERR the sandbox's node did not answer; try again\r\n").await;
            let _ = client.flush().await;
            return;
        }
    };
    if refused {
        // The owner's refusal, whole, then a clean close (as on the owner's own port).
        let mut line = Vec::new();
        let _ = (&mut owner).take(1024).read_until(b'\n', &mut line).await;
        let _ = client.write_all(&line).await;
        let _ = client.flush().await;
        let _ = client.shutdown().await;
        return;
    }
    proved();
    // The owner ends a session without a close_notify at times: what was
    // read before still reaches the client, flushed, before it is closed.
    let _ = tokio::io::copy_bidirectional(&mut client, &mut owner).await;
    let _ = client.flush().await;
    let _ = client.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_header_reads_back_and_nothing_else_passes_for_one() {
        let header = Header {
            door: Door::Postgres,
            node: "c".into(),
            peer: "10.0.0.9:5555".parse().unwrap(),
            tls: Some("tls=TLSv1.3".into()),
            end_point: Some(hex(&[0, 1, 0xab, 0xff])),
        };
        let mut bytes = header.encode();
        bytes.extend_from_slice(b"the client's bytes");
        let mut stream = &bytes[..];
        let read = Header::read(&mut stream).await.unwrap();
        assert_eq!(read.binding(), Some(vec![0, 1, 0xab, 0xff]));
        assert_eq!((read.node.as_str(), read.peer, read.door), ("c", header.peer, Door::Postgres));
        assert_eq!(stream, b"the client's bytes", "the header's reader takes nothing after it");
        for bad in [&b"GET / HTTP/1.1\n"[..], b"AIRLOCK-RELAY-1 {}\n", &[b'x'; MAX_HEADER + 10]] {
            assert!(Header::read(&mut &bad[..]).await.is_err());
        }
    }
}
