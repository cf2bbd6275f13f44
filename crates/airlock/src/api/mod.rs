//! The REST API the daemon serves and every CLI command uses.
//!
//! Work that must not stop half-way (forks, deletes, golden builds) runs in its
//! own task, so a client that hangs up mid-request leaves nothing half-made.
//! Errors are JSON: `{"code", "message", "hint"}` with the status from
//! [`ErrorCode::http_status`](crate::error::ErrorCode::http_status).

use std::future::Future;
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use crate::engine::Engine;
use crate::error::{Error, ErrorCode};
use crate::events::DeleteReason;
use crate::golden::{self, CreateGolden};
use crate::sandbox::{self, ForkRequest};
use crate::store::SandboxFilter;
use crate::validate;

/// The OpenAPI document served at `/openapi.json`.
pub const OPENAPI: &str = include_str!("openapi.json");

/// What handlers share.
#[derive(Clone)]
pub struct AppState {
    /// The daemon's engine.
    pub engine: Arc<Engine>,
    /// Notified when a client asks the daemon to stop.
    pub shutdown: Arc<Notify>,
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        // An answer that points at the daemon log finds what it points at there.
        if status.is_server_error() {
            tracing::error!(code = %self.code.as_str(), message = %self.message, "a request failed");
        }
        (status, Json(self)).into_response()
    }
}

type ApiResult<T> = Result<Json<T>, Error>;

/// A JSON request body, with a malformed one answered in the API's error format.
fn body<T>(parsed: Result<Json<T>, JsonRejection>) -> Result<T, Error> {
    parsed.map(|Json(v)| v).map_err(|e| {
        Error::new(
            ErrorCode::InvalidRequest,
            format!("bad request body: {}", e.body_text()),
            "see /openapi.json",
        )
    })
}

/// Runs `work` to completion in its own task, whatever happens to the request.
async fn detached<T, F>(work: F) -> Result<T, Error>
where
    T: Send + 'static,
    F: Future<Output = Result<T, Error>> + Send + 'static,
{
    tokio::spawn(work).await?
}

/// The API's routes.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/openapi.json", get(|| async { ([(header::CONTENT_TYPE, "application/json")], OPENAPI) }))
        .route("/v1/health", get(health))
        .route("/v1/doctor", get(doctor))
        .route("/v1/shutdown", post(shutdown))
        .route("/v1/goldens", get(list_goldens).post(create_golden))
        .route("/v1/goldens/{name}", get(show_golden).delete(remove_golden))
        .route("/v1/goldens/{name}/refresh", post(refresh_golden))
        .route("/v1/goldens/{name}/pool", post(pool_golden))
        .route("/v1/sandboxes", get(list_sandboxes).post(fork))
        .route("/v1/sandboxes/{id}", get(show_sandbox).delete(remove_sandbox))
        .route("/v1/sandboxes/{id}/extend", post(extend))
        .route("/v1/sandboxes/{id}/exec", post(exec))
        .route("/v1/sandboxes/{id}/reset", post(reset))
        .route("/v1/sandboxes/{id}/suspend", post(suspend))
        .route("/v1/sandboxes/{id}/wake", post(wake))
        .route("/v1/sandboxes/{id}/branch", post(branch))
        .route("/v1/sandboxes/{id}/promote", post(promote))
        .route("/v1/sandboxes/{id}/sql", post(sql))
        .route("/v1/sandboxes/{id}/tools/{tool}", post(call_tool))
        .route("/v1/tools", get(list_tools))
        .route("/v1/migrations/test", post(migrate_test))
        .route("/v1/migrations/promote", post(migrate_promote))
        .route("/v1/events", get(events))
        .fallback(|| async {
            Error::new(ErrorCode::InvalidRequest, "no such API route", "see /openapi.json for the routes")
        })
        .with_state(state)
}

/// Rejects TCP requests without the configured bearer token.
pub async fn require_token(
    State(token): State<Arc<String>>,
    headers: HeaderMap,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if constant_time_eq(given.as_bytes(), token.as_bytes()) {
        next.run(req).await
    } else {
        Error::new(
            ErrorCode::Unauthorized,
            "missing or wrong bearer token",
            "send `Authorization: Bearer TOKEN` (the CLI reads it from AIRLOCK_TOKEN or --token-file)",
        )
        .into_response()
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[derive(Serialize, Deserialize)]
struct Health {
    ok: bool,
    version: String,
}

async fn health() -> Json<Health> {
    Json(Health { ok: true, version: env!("CARGO_PKG_VERSION").into() })
}

async fn doctor(State(s): State<AppState>) -> Json<crate::engine::Doctor> {
    Json(s.engine.doctor())
}

async fn shutdown(State(s): State<AppState>) -> StatusCode {
    s.shutdown.notify_one();
    StatusCode::ACCEPTED
}

async fn list_goldens(State(s): State<AppState>) -> ApiResult<Vec<golden::Golden>> {
    Ok(Json(s.engine.store().goldens()?))
}

async fn create_golden(
    State(s): State<AppState>,
    req: Result<Json<CreateGolden>, JsonRejection>,
) -> Result<Response, Error> {
    let req = body(req)?;
    let engine = s.engine.clone();
    let g = detached(async move { golden::create(&engine, &req).await }).await?;
    Ok((StatusCode::CREATED, Json(g)).into_response())
}

async fn show_golden(State(s): State<AppState>, Path(name): Path<String>) -> ApiResult<golden::Golden> {
    Ok(Json(s.engine.store().golden(&name)?))
}

#[derive(Deserialize)]
struct RemoveQuery {
    #[serde(default)]
    force: bool,
}

async fn remove_golden(
    State(s): State<AppState>,
    Path(name): Path<String>,
    Query(q): Query<RemoveQuery>,
) -> ApiResult<golden::Golden> {
    let engine = s.engine.clone();
    Ok(Json(detached(async move { golden::remove(&engine, &name, q.force).await }).await?))
}

async fn refresh_golden(State(s): State<AppState>, Path(name): Path<String>) -> ApiResult<golden::Golden> {
    let engine = s.engine.clone();
    Ok(Json(detached(async move { golden::refresh(&engine, &name).await }).await?))
}

/// Body of `POST /v1/goldens/{name}/pool`.
#[derive(Debug, Serialize, Deserialize)]
pub struct PoolRequest {
    /// Started, credential-less sandboxes to keep ready.
    pub size: i64,
}

async fn pool_golden(
    State(s): State<AppState>,
    Path(name): Path<String>,
    req: Result<Json<PoolRequest>, JsonRejection>,
) -> ApiResult<golden::Golden> {
    let req = body(req)?;
    Ok(Json(golden::set_pool_size(&s.engine, &name, req.size)?))
}

/// Parses `?golden=G&label=k=v&label=k2=v2` (labels repeat, so serde's query form won't do).
fn sandbox_filter(query: Option<String>) -> Result<SandboxFilter, Error> {
    let mut filter = SandboxFilter::default();
    let mut labels = Vec::new();
    for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "golden" => filter.golden = Some(v.into_owned()),
            "label" => labels.push(v.into_owned()),
            _ => {}
        }
    }
    filter.labels = validate::labels(&labels)?;
    Ok(filter)
}

async fn list_sandboxes(
    State(s): State<AppState>,
    RawQuery(q): RawQuery,
) -> ApiResult<Vec<sandbox::Sandbox>> {
    let filter = sandbox_filter(q)?;
    let list = s.engine.store().sandboxes(&filter)?;
    Ok(Json(list.into_iter().map(|sb| s.engine.present(sb)).collect()))
}

async fn fork(
    State(s): State<AppState>,
    req: Result<Json<ForkRequest>, JsonRejection>,
) -> Result<Response, Error> {
    let req = body(req)?;
    if req.mcp && s.engine.gateway.get().is_none() {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            "an MCP endpoint was asked for but the MCP gateway is off",
            "start the daemon with --gateway HOST:PORT (the default is 127.0.0.1:7433)",
        ));
    }
    let engine = s.engine.clone();
    let mut forked = detached(async move {
        let mut forked = sandbox::fork(&engine, &req).await?;
        if req.mcp {
            match crate::gateway::http::mint(&engine, &forked.sandbox.id) {
                Ok(url) => forked.mcp_url = Some(url),
                Err(e) => {
                    // Nothing half-made: without its endpoint the sandbox goes too.
                    let _ = sandbox::delete(&engine, &forked.sandbox.id, DeleteReason::Failed).await;
                    return Err(e);
                }
            }
        }
        Ok(forked)
    })
    .await?;
    forked.sandbox = s.engine.present(forked.sandbox);
    Ok((StatusCode::CREATED, Json(forked)).into_response())
}

/// Body of `POST /v1/sandboxes/{id}/sql`.
#[derive(Debug, Serialize, Deserialize)]
pub struct SqlRequest {
    /// One or more SQL statements.
    pub sql: String,
}

async fn sql(
    State(s): State<AppState>,
    Path(id): Path<String>,
    req: Result<Json<SqlRequest>, JsonRejection>,
) -> ApiResult<serde_json::Value> {
    let req = body(req)?;
    let engine = s.engine.clone();
    let args = serde_json::json!({ "sql": req.sql });
    let out = detached(async move {
        crate::gateway::tools::call(&engine, &id, crate::gateway::tools::RUN_SQL, &args, Default::default())
            .await
    })
    .await?;
    Ok(Json(out.result))
}

/// Query of `POST /v1/sandboxes/{id}/tools/{tool}`.
#[derive(Deserialize)]
struct ToolQuery {
    /// The door the call came through, for its event (`airlock mcp` says `mcp_stdio`).
    #[serde(default)]
    via: crate::gateway::tools::Via,
}

async fn call_tool(
    State(s): State<AppState>,
    Path((id, tool)): Path<(String, String)>,
    Query(q): Query<ToolQuery>,
    args: Result<Json<serde_json::Value>, JsonRejection>,
) -> ApiResult<crate::gateway::tools::ToolOutput> {
    let args = body(args)?;
    let engine = s.engine.clone();
    Ok(Json(
        detached(async move { crate::gateway::tools::call(&engine, &id, &tool, &args, q.via).await }).await?,
    ))
}

async fn migrate_test(
    State(s): State<AppState>,
    req: Result<Json<crate::migrate::TestRequest>, JsonRejection>,
) -> ApiResult<crate::migrate::report::Report> {
    let req = body(req)?;
    let engine = s.engine.clone();
    Ok(Json(detached(async move { crate::migrate::test(engine, req).await }).await?))
}

async fn migrate_promote(
    State(s): State<AppState>,
    req: Result<Json<crate::migrate::promote::PromoteRequest>, JsonRejection>,
) -> ApiResult<crate::migrate::promote::Promoted> {
    let req = body(req)?;
    let engine = s.engine.clone();
    Ok(Json(detached(async move { crate::migrate::promote::promote(&engine, &req).await }).await?))
}

async fn list_tools() -> Json<Vec<crate::gateway::tools::ToolSpec>> {
    Json(crate::gateway::tools::specs())
}

async fn show_sandbox(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult<sandbox::Sandbox> {
    let sb = s.engine.store().sandbox(&id)?;
    Ok(Json(s.engine.present(sb)))
}

async fn remove_sandbox(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult<sandbox::Sandbox> {
    let engine = s.engine.clone();
    without_credential(async move { sandbox::delete(&engine, &id, DeleteReason::User).await }).await
}

/// Runs a sandbox operation to completion (see [`detached`]) and answers with the
/// sandbox, its connection strings left out.
async fn without_credential<F>(work: F) -> ApiResult<sandbox::Sandbox>
where
    F: Future<Output = Result<sandbox::Sandbox, Error>> + Send + 'static,
{
    let mut sb = detached(work).await?;
    sb.dsn = None;
    sb.socket_dsn = None;
    Ok(Json(sb))
}

/// Body of `POST /v1/sandboxes/{id}/extend`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ExtendRequest {
    /// The sandbox expires this many seconds from now.
    pub ttl_seconds: i64,
}

async fn extend(
    State(s): State<AppState>,
    Path(id): Path<String>,
    req: Result<Json<ExtendRequest>, JsonRejection>,
) -> ApiResult<sandbox::Sandbox> {
    let req = body(req)?;
    let sb = sandbox::extend(&s.engine, &id, req.ttl_seconds)?;
    Ok(Json(s.engine.present(sb)))
}

async fn reset(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult<sandbox::Sandbox> {
    let engine = s.engine.clone();
    without_credential(async move { sandbox::reset(&engine, &id).await }).await
}

async fn branch(
    State(s): State<AppState>,
    Path(id): Path<String>,
    req: Result<Json<sandbox::BranchRequest>, JsonRejection>,
) -> Result<Response, Error> {
    let req = body(req)?;
    let engine = s.engine.clone();
    let mut forked = detached(async move { sandbox::branch::branch(&engine, &id, &req).await }).await?;
    forked.sandbox = s.engine.present(forked.sandbox);
    Ok((StatusCode::CREATED, Json(forked)).into_response())
}

async fn suspend(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult<sandbox::Sandbox> {
    let engine = s.engine.clone();
    without_credential(async move { sandbox::suspend(&engine, &id, sandbox::SuspendReason::User).await })
        .await
}

async fn wake(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult<sandbox::Sandbox> {
    let engine = s.engine.clone();
    without_credential(async move { sandbox::wake(&engine, &id).await }).await
}

/// Body of `POST /v1/sandboxes/{id}/promote`.
#[derive(Debug, Serialize, Deserialize)]
pub struct PromoteRequest {
    /// The golden to make (or to add a generation to).
    pub golden: String,
    /// Keep settings and catalog-shadowing objects the sandbox carries instead
    /// of refusing (they are listed in the new generation's manifest).
    #[serde(default)]
    pub allow_planted: bool,
}

async fn promote(
    State(s): State<AppState>,
    Path(id): Path<String>,
    req: Result<Json<PromoteRequest>, JsonRejection>,
) -> ApiResult<golden::Golden> {
    let req = body(req)?;
    let engine = s.engine.clone();
    Ok(Json(
        detached(async move { golden::promote(&engine, &id, &req.golden, req.allow_planted).await }).await?,
    ))
}

async fn exec(
    State(s): State<AppState>,
    Path(id): Path<String>,
    req: Result<Json<sandbox::ExecRequest>, JsonRejection>,
) -> ApiResult<sandbox::ExecResult> {
    let req = body(req)?;
    let engine = s.engine.clone();
    Ok(Json(detached(async move { sandbox::exec::exec(&engine, &id, &req).await }).await?))
}

#[derive(Deserialize)]
struct EventsQuery {
    sandbox: Option<String>,
    limit: Option<i64>,
}

async fn events(
    State(s): State<AppState>,
    Query(q): Query<EventsQuery>,
) -> ApiResult<Vec<crate::events::Event>> {
    let store = s.engine.store();
    // Accept a live sandbox's name as well as an id.
    let id = q.sandbox.as_ref().map(|key| store.sandbox(key).map(|sb| sb.id).unwrap_or_else(|_| key.clone()));
    Ok(Json(store.events(id.as_deref(), q.limit.unwrap_or(1000).clamp(1, 100_000))?))
}
