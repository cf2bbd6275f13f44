//! Where `exec` code reaches its sandbox's Redis: `127.0.0.1:6379` inside the
//! sandbox's network namespace, a socket the daemon makes there and relays
//! to the server's unix socket with [`crate::relay`], so a command over the
//! size limit gets the same error reply in its place as through the router,
//! where the server would only close the connection.

use std::path::PathBuf;

/// Relays each connection `listener` accepts to the server at `socket`,
/// until aborted (which ends every connection it relays).
pub async fn serve(listener: tokio::net::TcpListener, socket: PathBuf) {
    let mut relayed = tokio::task::JoinSet::new();
    while let Ok((inside, _)) = listener.accept().await {
        while relayed.try_join_next().is_some() {}
        let socket = socket.clone();
        relayed.spawn(async move {
            let _ = inside.set_nodelay(true);
            // A server that is not there closes the client's connection.
            if let Ok(server) = tokio::net::UnixStream::connect(&socket).await {
                crate::relay::relay(inside, server).await;
            }
        });
    }
}
