//! The relay port: clients of this node's sandboxes that came to another
//! node's router ([`super::elsewhere`]). Only a peer holding a certificate of
//! the cluster's CA gets past the TLS handshake; each stream then starts with
//! a [`Header`] and goes on as the client's own bytes, served by the same code
//! as a client of this router's own ports.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;

use super::elsewhere::{Door, Header, HANDSHAKE};
use airlock_listen::slots::Slots;

/// How often a relayed session's certificate is checked against the revoked ones.
const REVOCATION_CHECK: Duration = Duration::from_secs(1);

/// What the relay port serves with.
pub(super) struct Port {
    /// This node's certificate, and a cluster certificate required of every peer.
    pub acceptor: tokio_rustls::TlsAcceptor,
    /// Handshakes under way.
    pub slots: Arc<Slots>,
    /// Whether a peer's certificate has been revoked since.
    pub revoked: Arc<dyn Fn(&[u8]) -> bool + Send + Sync>,
}

/// Serves the relay port for as long as the router runs.
pub(super) async fn serve(
    shared: Arc<super::Shared>,
    redis: Arc<super::redis::Shared>,
    listener: TcpListener,
    port: Port,
) {
    let port = Arc::new(port);
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "the relay port's accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let (shared, redis, port) = (shared.clone(), redis.clone(), port.clone());
        tokio::spawn(async move {
            let Some(mut slot) = port.slots.take(Some(peer.ip()), Instant::now()).await else { return };
            let _ = tcp.set_nodelay(true);
            // A second descriptor of the same socket, to cut the session off
            // however it is served (its relay threads own the first).
            let Ok(cut) = tcp.as_fd().try_clone_to_owned() else { return };
            let opened = async {
                let mut tls = port.acceptor.accept(tcp).await.ok()?;
                let header = Header::read(&mut tls).await.ok()?;
                Some((tls, header))
            };
            // Until its handshake and header are done, a connection's slot
            // goes to a newcomer when none is free: one with no cluster
            // certificate cannot hold the port against members.
            let opened = tokio::select! {
                opened = tokio::time::timeout(HANDSHAKE, opened) => opened,
                () = slot.given_up() => return,
            };
            let Ok(Some((tls, header))) = opened else {
                tracing::debug!(%peer, "a relay connection without a cluster certificate or a header was closed");
                return;
            };
            let certificate = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| c.to_vec())
                .unwrap_or_default();
            let session = async {
                match header.door {
                    Door::Postgres => super::session::serve_relayed(&shared, tls, header, slot).await,
                    Door::Redis => super::redis::serve_relayed(&redis, tls, header, slot).await,
                }
            };
            tokio::select! {
                () = session => {}
                () = cut_once_revoked(&port.revoked, &certificate, &cut) => {}
            }
        });
    }
}

/// Shuts the relayed session's socket down both ways once its peer's
/// certificate is revoked: the session, wherever it runs, then ends as if
/// the peer had gone. Never returns (the session's end ends the wait).
async fn cut_once_revoked(
    revoked: &Arc<dyn Fn(&[u8]) -> bool + Send + Sync>,
    certificate: &[u8],
    cut: &OwnedFd,
) {
    loop {
        tokio::time::sleep(REVOCATION_CHECK).await;
        if revoked(certificate) {
            tracing::warn!("a relayed session's node certificate was revoked: the session is cut off");
            let _ = nix::sys::socket::shutdown(
                std::os::fd::AsRawFd::as_raw_fd(cut),
                nix::sys::socket::Shutdown::Both,
            );
            std::future::pending::<()>().await;
        }
    }
}
