//! Serving HTTP within bounds: the API and the MCP gateway both go through here.
//!
//! A listener a local user can reach must not let that user take the daemon's
//! file descriptors: every descriptor the daemon runs out of is one it cannot
//! open to check a server, remove a sandbox or write its store. So a connection
//! is accepted only while a slot is free (the rest wait in the kernel's listen
//! backlog, costing the daemon nothing), and a connection that does not finish
//! sending a request's headers in time is closed, so idle holders give their
//! slot back.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::Listener;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;

/// How much of the daemon one listener may hold.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Connections open at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// Time a client has to send a request's headers, on a new connection and
    /// between requests on a kept-alive one.
    pub header_timeout: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds { max_connections: 256, header_timeout: Duration::from_secs(10) }
    }
}

/// How long a stopping server waits for requests in flight before it drops them.
const DRAIN: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` within `bounds` until `shutdown` completes, then
/// lets requests in flight finish (for a while).
pub async fn serve<L: Listener>(
    mut listener: L,
    app: Router,
    bounds: Bounds,
    shutdown: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(bounds.max_connections));
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(bounds.header_timeout);
    tokio::pin!(shutdown);
    loop {
        // A slot first, then the accept: over the cap, a connection costs the
        // daemon nothing until one frees.
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let io = tokio::select! {
            (io, _) = listener.accept() => io,
            () = &mut shutdown => break,
        };
        let service = TowerToHyperService::new(app.clone());
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(io), service));
        tokio::spawn(async move {
            let _ = connection.await;
            drop(permit);
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(DRAIN, graceful.shutdown()).await;
}
