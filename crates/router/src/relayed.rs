//! The relay port: clients of this node's sandboxes that came to another
//! node's router ([`super::elsewhere`]). Only a peer holding a certificate of
//! the cluster's CA gets past the TLS handshake; each stream then starts with
//! a [`Header`] and goes on as the client's own bytes, served by the same code
//! as a client of this router's own ports.

use std::sync::Arc;
use std::time::Instant;

use tokio::net::TcpListener;

use super::elsewhere::{Door, Header, HANDSHAKE};
use airlock_listen::slots::Slots;

/// Serves the relay port for as long as the router runs.
pub(super) async fn serve(
    shared: Arc<super::Shared>,
    redis: Arc<super::redis::Shared>,
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    slots: Arc<Slots>,
) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "the relay port's accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let (shared, redis, acceptor, slots) =
            (shared.clone(), redis.clone(), acceptor.clone(), slots.clone());
        tokio::spawn(async move {
            let Some(mut slot) = slots.take(Some(peer.ip()), Instant::now()).await else { return };
            let _ = tcp.set_nodelay(true);
            let opened = async {
                let mut tls = acceptor.accept(tcp).await.ok()?;
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
            match header.door {
                Door::Postgres => super::session::serve_relayed(&shared, tls, header, slot).await,
                Door::Redis => super::redis::serve_relayed(&redis, tls, header, slot).await,
            }
        });
    }
}
