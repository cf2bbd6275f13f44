//! Serving HTTP within bounds: the API and the MCP gateway both go through here.
//!
//! A listener a local user can reach must not let that user take the daemon's
//! file descriptors: every descriptor the daemon runs out of is one it cannot
//! open to check a server, remove a sandbox or write its store. So each
//! connection holds one of a fixed number of slots (see [`crate::slots`]); one
//! with no request at work gives its slot up to a newcomer when none is free,
//! so idle or trickling holders cannot keep anyone out, and only when every
//! slot has a request at work does a newcomer wait (the rest wait in the
//! kernel's listen backlog, costing the daemon nothing). A connection that
//! does not finish sending a request's headers in time is closed. And every
//! request answers: one that panics is answered `internal` (and logged), one
//! past its deadline `timed_out`, so no request can hold its connection and
//! slot for ever.

use std::future::Future;
use std::time::Duration;

use axum::response::IntoResponse;
use axum::serve::Listener;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;

/// An error on its way out as an HTTP answer: the status its code maps to,
/// and the error itself as the JSON body.
#[derive(Debug)]
pub struct Failure(pub airlock_core::error::Error);

impl From<airlock_core::error::Error> for Failure {
    fn from(e: airlock_core::error::Error) -> Self {
        Failure(e)
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> axum::response::Response {
        let Failure(error) = self;
        let status = axum::http::StatusCode::from_u16(error.code.http_status())
            .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        // An answer that points at the daemon log finds what it points at there.
        if status.is_server_error() {
            tracing::error!(code = %error.code.as_str(), message = %error.message, "a request failed");
        }
        (status, axum::Json(error)).into_response()
    }
}

/// How much of the daemon one listener may hold.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Connections open at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// Time a client has to send a request's headers, on a new connection and
    /// between requests on a kept-alive one.
    pub header_timeout: Duration,
    /// Time one request may take to be answered.
    pub deadline: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds { max_connections: 256, header_timeout: Duration::from_secs(10), deadline: API_DEADLINE }
    }
}

/// The longest an API request may take: past the longest `exec` (an hour) and
/// a large import's build, whose work goes on when its request ends.
pub const API_DEADLINE: Duration = Duration::from_secs(2 * 3600);

/// Answers the request whatever its handler does: a panic is an `internal`
/// error (logged with what panicked), a request past `deadline` is
/// `timed_out`.
async fn answered(
    axum::extract::State(deadline): axum::extract::State<Duration>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use futures_util::FutureExt;
    let route = format!("{} {}", request.method(), request.uri().path());
    let handled = std::panic::AssertUnwindSafe(next.run(request)).catch_unwind();
    match tokio::time::timeout(deadline, handled).await {
        Ok(Ok(response)) => response,
        Ok(Err(panic)) => {
            let what = panic_message(&panic);
            tracing::error!(route = %route, panic = %what, "a request's handler panicked");
            Failure(airlock_core::error::Error::internal(format!(
                "the request failed unexpectedly ({what}); nothing was left half-made"
            )))
            .into_response()
        }
        Err(_) => Failure(airlock_core::error::Error::new(
            airlock_core::error::ErrorCode::TimedOut,
            format!("the request took longer than {}s and was given up", deadline.as_secs()),
            "work the daemon runs on its own (a build, a deletion) goes on: see `airlock events`",
        ))
        .into_response(),
    }
}

/// What a panic said, as text.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

/// How long a stopping server waits for requests in flight before it drops them.
const DRAIN: Duration = Duration::from_secs(10);

/// Where a listener's clients come from, for sharing its slots out fairly.
pub trait Peer {
    /// The client's IP address; None for a unix socket.
    fn ip(&self) -> Option<std::net::IpAddr>;
}

impl Peer for std::net::SocketAddr {
    fn ip(&self) -> Option<std::net::IpAddr> {
        Some(std::net::SocketAddr::ip(self))
    }
}

impl Peer for tokio::net::unix::SocketAddr {
    fn ip(&self) -> Option<std::net::IpAddr> {
        None
    }
}

/// Serves `app` on `listener` within `bounds` until `shutdown` completes, then
/// lets requests in flight finish (for a while).
pub async fn serve<L>(mut listener: L, app: Router, bounds: Bounds, shutdown: impl Future<Output = ()>)
where
    L: Listener,
    L::Addr: Peer,
{
    let app = app.layer(axum::middleware::from_fn_with_state(bounds.deadline, answered));
    let slots = crate::slots::Slots::new(bounds.max_connections);
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(bounds.header_timeout);
    tokio::pin!(shutdown);
    loop {
        let (io, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let arrived = std::time::Instant::now();
        // With every slot at work this waits, and the connections after it
        // wait in the listen backlog.
        let mut slot = tokio::select! {
            slot = slots.take_or_wait(peer.ip(), arrived) => slot,
            () = &mut shutdown => break,
        };
        let service = Marked { inner: TowerToHyperService::new(app.clone()), marker: slot.marker() };
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(io), service));
        tokio::spawn(async move {
            tokio::select! {
                _ = connection => {}
                () = slot.given_up() => {}
            }
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(DRAIN, graceful.shutdown()).await;
}

/// A connection's service that marks each request at work, from its head
/// until the last byte of its answer is sent, so the connection keeps its
/// slot while it works and yields it while it idles.
#[derive(Clone)]
struct Marked<S> {
    inner: S,
    marker: crate::slots::Marker,
}

impl<S, B> hyper::service::Service<hyper::Request<B>> for Marked<S>
where
    S: hyper::service::Service<hyper::Request<B>, Response = axum::response::Response>,
    S::Future: Send + 'static,
{
    type Response = axum::response::Response;
    type Error = S::Error;
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn call(&self, request: hyper::Request<B>) -> Self::Future {
        use http_body_util::BodyExt;
        let working = self.marker.begin();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            // The answer's body owns the mark: it goes when the body is sent
            // (or dropped with its connection).
            Ok(response.map(|body| {
                axum::body::Body::new(body.map_frame(move |frame| {
                    let _at_work = &working;
                    frame
                }))
            }))
        })
    }
}
