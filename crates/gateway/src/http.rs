//! The task-scoped MCP gateway over streamable HTTP.
//!
//! A fork asked for with `mcp: true` gets a URL `http://HOST:PORT/mcp/TOKEN`: the
//! token is 256 random bits, bound to that one sandbox, and kept only as its
//! SHA-256 in the state store. An agent framework given the URL can call the agent
//! tools on that sandbox and reach nothing else: the gateway port serves no API.
//! A wrong token, or one whose sandbox is gone, gets a bare 404 that says nothing
//! about why. The token is looked up on every request, and the sandbox it names is
//! handed to the tool handler with the request, so a token dies the moment its
//! sandbox does.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use sha2::{Digest, Sha256};

use super::mcp::{BoundSandbox, Gateway};
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_lifecycle::engine::Engine;

/// The gateway's default address.
pub const DEFAULT_ADDR: &str = "127.0.0.1:7433";

/// The gateway's base URL once it listens: the gateway's own state, kept on
/// the engine in its slot ([`airlock_lifecycle::services::Services::state`]).
#[derive(Default)]
struct Base(std::sync::OnceLock<String>);

/// The gateway's base URL, when it listens.
pub fn base(engine: &Engine) -> Option<String> {
    engine.services.state::<Base>().0.get().cloned()
}

/// Mints a token for `sandbox` and returns its URL.
pub fn mint(engine: &Engine, sandbox: &str) -> Result<String> {
    let base = base(engine).ok_or_else(|| {
        Error::new(
            ErrorCode::InvalidRequest,
            "the MCP gateway is off",
            "start the daemon with --gateway HOST:PORT (the default is 127.0.0.1:7433)",
        )
    })?;
    let token = airlock_core::secret::password();
    let sb = engine.store().sandbox(sandbox)?;
    engine.record_credential(&sb, "api:fork", &token, &["mcp_url"])?;
    engine.store().add_mcp_token(sandbox, &digest(&token))?;
    Ok(format!("{base}/mcp/{token}"))
}

fn digest(token: &str) -> String {
    airlock_core::secret::hex(&Sha256::digest(token.as_bytes()))
}

/// The token in a gateway path (`/mcp/TOKEN`).
fn token_of(path: &str) -> Option<&str> {
    path.strip_prefix("/mcp/").filter(|t| !t.is_empty() && !t.contains('/'))
}

/// The live sandbox a token is bound to.
fn sandbox_for(engine: &Engine, token: &str) -> Result<String> {
    engine.store().mcp_token_sandbox(&digest(token))?.ok_or_else(super::mcp::gone)
}

/// Starts the gateway on `addr`; returns the base URL its tokens' URLs start with.
pub async fn start(engine: Arc<Engine>, addr: SocketAddr, advertise: Option<&str>) -> Result<String> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        Error::new(
            ErrorCode::InvalidRequest,
            format!("the MCP gateway cannot listen on {addr}: {e}"),
            "pick another address with --gateway HOST:PORT (port 0 for a free one), or --gateway off",
        )
    })?;
    let bound = listener.local_addr()?;
    let host = match advertise {
        Some(h) => h.to_owned(),
        None if bound.ip().is_ipv6() => format!("[{}]", bound.ip()),
        None => bound.ip().to_string(),
    };
    let mut hosts = vec!["localhost".to_owned(), "127.0.0.1".to_owned(), "::1".to_owned()];
    hosts.push(host.trim_start_matches('[').trim_end_matches(']').to_owned());
    let mut config = StreamableHttpServerConfig::default().with_allowed_hosts(hosts);
    // Stateless: each request stands alone, so no session outlives its sandbox.
    config.legacy_session_mode = false;
    config.json_response = true;
    let tools = Gateway::for_tokens(engine.clone());
    let service =
        StreamableHttpService::new(move || Ok(tools.clone()), LocalSessionManager::default().into(), config);
    let in_flight = Arc::new(InFlight::default());
    let app = Router::new()
        .route_service("/mcp/{token}", service)
        .layer(axum::middleware::from_fn(bounded_body))
        .layer(axum::middleware::from_fn_with_state(in_flight, its_share))
        .layer(axum::middleware::from_fn_with_state(engine.clone(), known_token))
        .fallback(|| async { StatusCode::NOT_FOUND });
    tracing::info!(%bound, "serving the MCP gateway");
    tokio::spawn(airlock_listen::serve::serve(
        listener,
        app,
        airlock_listen::serve::Bounds { deadline: crate::tools::DEADLINE, ..Default::default() },
        std::future::pending(),
    ));
    let base = format!("http://{host}:{}", bound.port());
    let _ = engine.services.state::<Base>().0.set(base.clone());
    Ok(base)
}

/// The largest request body a tool call may send: the largest SQL text, JSON-escaped.
const MAX_BODY: usize = 4 * super::sql::MAX_SQL;

/// Time a client has to send a request's body once its headers are in.
const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// Reads a request's body whole, within `MAX_BODY` and `BODY_TIMEOUT`, before
/// any tool sees it: a client that trickles a body cannot hold a connection
/// (and the daemon's descriptor) for longer than that.
async fn bounded_body(request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, MAX_BODY)).await {
        Ok(Ok(bytes)) => next.run(Request::from_parts(parts, axum::body::Body::from(bytes))).await,
        Ok(Err(_)) => StatusCode::PAYLOAD_TOO_LARGE.into_response(),
        Err(_) => StatusCode::REQUEST_TIMEOUT.into_response(),
    }
}

/// Requests one sandbox may have at work on the gateway at once. The
/// gateway's connections are shared by every tenant; a request at work keeps
/// its connection's slot (see [`airlock_listen::slots`]), so without this one agent's
/// slow calls could hold them all.
pub const IN_FLIGHT_PER_SANDBOX: usize = 8;

/// Requests at work per sandbox.
#[derive(Debug, Default)]
struct InFlight {
    per_sandbox: std::sync::Mutex<std::collections::HashMap<String, usize>>,
}

/// One request at work, counted against its sandbox until it drops.
struct AtWork {
    in_flight: Arc<InFlight>,
    sandbox: String,
}

impl InFlight {
    fn begin(self: &Arc<Self>, sandbox: &str) -> Option<AtWork> {
        let mut counts = self.per_sandbox.lock().unwrap_or_else(|p| p.into_inner());
        let count = counts.entry(sandbox.to_owned()).or_default();
        if *count >= IN_FLIGHT_PER_SANDBOX {
            return None;
        }
        *count += 1;
        Some(AtWork { in_flight: self.clone(), sandbox: sandbox.to_owned() })
    }
}

impl Drop for AtWork {
    fn drop(&mut self) {
        let mut counts = self.in_flight.per_sandbox.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = counts.get_mut(&self.sandbox) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.sandbox);
            }
        }
    }
}

/// Answers 429 to a sandbox's request past its [`IN_FLIGHT_PER_SANDBOX`]; the
/// count covers the request until its answer is written.
async fn its_share(State(in_flight): State<Arc<InFlight>>, request: Request, next: Next) -> Response {
    let sandbox = request.extensions().get::<BoundSandbox>().map(|b| b.0.clone()).unwrap_or_default();
    let Some(at_work) = in_flight.begin(&sandbox) else {
        let message = format!(
            "this sandbox already has {IN_FLIGHT_PER_SANDBOX} requests at work on the gateway; wait for one to answer"
        );
        return (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")], message).into_response();
    };
    let response = next.run(request).await;
    response.map(|body| {
        use http_body_util::BodyExt;
        axum::body::Body::new(body.map_frame(move |frame| {
            let _counted = &at_work;
            frame
        }))
    })
}

/// Answers 404, and nothing else, unless the URL's token is bound to a live
/// sandbox; passes that sandbox on with the request.
async fn known_token(State(engine): State<Arc<Engine>>, mut request: Request, next: Next) -> Response {
    match token_of(request.uri().path()).and_then(|t| sandbox_for(&engine, t).ok()) {
        Some(sandbox) => {
            request.extensions_mut().insert(BoundSandbox(sandbox));
            next.run(request).await
        }
        None => StatusCode::NOT_FOUND.into_response(),
    }
}
