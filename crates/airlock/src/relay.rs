//! A cluster node's router relay, made of the cluster's parts: its node's
//! mutual TLS identity, and the directory of who holds which sandbox. The
//! router and the cluster know nothing of each other; this is where they meet.

use std::sync::Arc;

use airlock_cluster::directory::Directory;
use airlock_core::error::Result;
use airlock_core::layout::Layout;
use airlock_router::{Relay, RelaySettings, Remote};

/// The cluster's directory, as the router asks it.
struct ClusterDirectory(Directory);

#[async_trait::async_trait]
impl airlock_router::Directory for ClusterDirectory {
    async fn owner(&self, key: &str) -> Result<Option<Remote>> {
        Ok(self.0.owner(key).await?.map(|(node, relay)| Remote { node, relay }))
    }
}

/// The relay of the node `settings` name, on `listener`.
pub fn make(layout: &Layout, settings: &RelaySettings, listener: tokio::net::TcpListener) -> Result<Relay> {
    let identity =
        airlock_cluster::ca::Identity::load(&layout.cluster(), &settings.node, &settings.advertise)?;
    // The node's daemon keeps the revoked list current; the router follows it.
    let revoked = identity.revoked();
    revoked.follow(std::time::Duration::from_secs(2));
    Ok(Relay {
        node: settings.node.clone(),
        listener,
        acceptor: tokio_rustls::TlsAcceptor::from(identity.server_config()?),
        connector: tokio_rustls::TlsConnector::from(identity.client_config()?),
        directory: Arc::new(ClusterDirectory(Directory::open(
            &settings.coordinator,
            &layout.cluster(),
            &settings.node,
        )?)),
        revoked: Arc::new(move |certificate: &[u8]| revoked.refuses(certificate)),
    })
}
