//! Where `exec` code reaches its sandbox's Redis: `127.0.0.1:6379` inside the
//! sandbox's network namespace, a socket the daemon makes there and relays
//! to the server's unix socket with [`crate::relay`], so a command over the
//! size limit gets the same error reply in its place as through the router,
//! where the server would only close the connection.

use std::path::PathBuf;
use std::sync::Arc;

/// Connections relayed at once, at most: the server takes no more clients
/// than this anyway (`maxclients`), and each holds two of the daemon's
/// descriptors, which every sandbox shares.
pub const MAX_CONNECTIONS: usize = 256;

/// Relays each connection `listener` accepts to the server at `socket`,
/// until aborted (which ends every connection it relays). A connection past
/// [`MAX_CONNECTIONS`] is closed at once.
pub async fn serve(listener: tokio::net::TcpListener, socket: PathBuf) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut relayed = tokio::task::JoinSet::new();
    while let Ok((inside, _)) = listener.accept().await {
        while relayed.try_join_next().is_some() {}
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            drop(inside);
            continue;
        };
        let socket = socket.clone();
        relayed.spawn(async move {
            let _slot = slot;
            let _ = inside.set_nodelay(true);
            // A server that is not there closes the client's connection.
            if let Ok(server) = tokio::net::UnixStream::connect(&socket).await {
                crate::relay::relay(inside, server).await;
            }
        });
    }
}
