//! The REST API the daemon serves and every CLI command uses.
//!
//! Work that must not stop half-way (forks, deletes, golden builds) runs in its
//! own task, so a client that hangs up mid-request leaves nothing half-made.
//! Errors are JSON: `{"code", "message", "hint"}` with the status from
//! [`ErrorCode::http_status`](airlock_core::error::ErrorCode::http_status).

use std::future::Future;
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use airlock_core::error::{Error, ErrorCode};
use airlock_core::events::DeleteReason;
use airlock_core::validate;
use airlock_lifecycle::engine::Engine;
use airlock_lifecycle::golden::{self, CreateGolden};
use airlock_lifecycle::sandbox::{self, ForkRequest};
use airlock_listen::serve::Failure;
use airlock_state::store::SandboxFilter;

pub mod cluster;
mod grants;
mod migrations;
pub mod openapi;
mod replicas;

pub use replicas::ReplicateRequest;
mod targets;

use openapi::ApiErrors;

/// What handlers share.
#[derive(Clone)]
pub struct AppState {
    /// The daemon's engine.
    pub engine: Arc<Engine>,
    /// Notified when a client asks the daemon to stop.
    pub shutdown: Arc<Notify>,
    /// The fleet-health service (`/v1/stats`).
    pub metrics: Arc<airlock_telemetry::metrics::Metrics>,
    /// The live-target service (`/v1/targets`).
    pub live: Arc<airlock_live::Live>,
    /// This node's cluster, when the daemon is one (`serve --cluster`).
    pub cluster: Option<Arc<airlock_cluster::Cluster>>,
}

type ApiResult<T> = Result<Json<T>, Failure>;

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
    tokio::spawn(airlock_core::events::DOOR.scope(airlock_core::events::Door::current(), work)).await?
}

/// The largest exec request: its files, base64, and the rest.
const EXEC_BODY_LIMIT: usize = 96 << 20;

/// The API's routes, each registered with its OpenAPI entry ([`openapi`]).
pub fn router(state: AppState) -> Router {
    let (routes, document) = OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(health))
        .routes(routes!(doctor))
        .routes(routes!(shutdown))
        .routes(routes!(list_goldens, create_golden))
        .routes(routes!(scan_source))
        .routes(routes!(show_golden, remove_golden))
        .routes(routes!(refresh_golden))
        .routes(routes!(pool_golden))
        .routes(routes!(golden_progress))
        .routes(routes!(list_sandboxes, fork))
        .routes(routes!(show_sandbox, remove_sandbox))
        .routes(routes!(extend))
        .routes(routes!(reset))
        .routes(routes!(suspend))
        .routes(routes!(wake))
        .routes(routes!(branch))
        .routes(routes!(promote))
        .routes(routes!(sql))
        .routes(routes!(call_tool))
        .routes(routes!(list_tools))
        .routes(routes!(migrations::migrate_test))
        .routes(routes!(migrations::migrate_promote))
        .routes(routes!(events))
        .routes(routes!(stats))
        .routes(routes!(audit_checkpoint))
        .routes(routes!(targets::list_targets, targets::add_target))
        .routes(routes!(targets::show_target, targets::remove_target))
        .routes(routes!(grants::mint_grant))
        .routes(routes!(grants::list_grants))
        .routes(routes!(grants::show_grant, grants::revoke_grant))
        .routes(routes!(grants::grant_tool))
        .routes(routes!(cluster::nodes))
        .routes(routes!(replicas::replicate))
        // An exec carries files both ways (base64, 64 MB each way at most).
        .merge(
            OpenApiRouter::new()
                .routes(routes!(exec))
                .routes(routes!(grants::exec_grant))
                .layer(axum::extract::DefaultBodyLimit::max(EXEC_BODY_LIMIT)),
        )
        .split_for_parts();
    let document = Arc::new(document.to_json().expect("the OpenAPI document serializes"));
    routes
        // The node-to-node half of replication: for peers only, so not in the document.
        .route("/v1/goldens/{name}/replica", get(replicas::offer))
        .route("/v1/goldens/{name}/replica/files", get(replicas::files))
        .route("/v1/migrations/rows", get(migrations::row_record))
        .route(
            "/openapi.json",
            get(move || async move {
                ([(header::CONTENT_TYPE, "application/json")], document.as_str().to_owned())
            }),
        )
        .fallback(|| async {
            Failure(Error::new(
                ErrorCode::InvalidRequest,
                "no such API route",
                "see /openapi.json for the routes",
            ))
        })
        .layer(axum::middleware::from_fn_with_state(state.clone(), cluster::to_owner))
        .layer(axum::middleware::map_response(json_errors))
        .layer(axum::middleware::from_fn(door_of_request))
        .with_state(state)
}

/// Runs a request's work with its door set: the API's, or `airlock mcp`'s on
/// stdio when the client says so (a claim that only labels its records).
async fn door_of_request(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    use airlock_core::events::{Door, DOOR};
    let door = match request.headers().get(airlock_listen::client::DOOR_HEADER).map(|v| v.as_bytes()) {
        _ if request.extensions().get::<airlock_cluster::peer::FromPeer>().is_some() => Door::Peer,
        Some(b"mcp_stdio") => Door::McpStdio,
        _ => Door::Api,
    };
    DOOR.scope(door, next.run(request)).await
}

/// Every error answer is the API's JSON error, including those axum makes
/// itself (a malformed path or query, a method a route lacks, a body over its
/// limit), which would otherwise be plain text.
async fn json_errors(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let text = match axum::body::to_bytes(response.into_body(), 4096).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_owned(),
        Err(_) => String::new(),
    };
    let (code, hint) = if status.is_server_error() {
        (ErrorCode::Internal, "this is unexpected; the daemon log ($AIRLOCK_HOME/daemon.log) has details")
    } else {
        (ErrorCode::InvalidRequest, "see /openapi.json for the routes, their parameters and bodies")
    };
    let message = if text.is_empty() { status.to_string() } else { text };
    (status, Json(Error::new(code, message, hint))).into_response()
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
    // An empty token is never a match (serve refuses one besides).
    if !token.is_empty() && constant_time_eq(given.as_bytes(), token.as_bytes()) {
        next.run(req).await
    } else {
        Failure(Error::new(
            ErrorCode::Unauthorized,
            "missing or wrong bearer token",
            "send `Authorization: Bearer TOKEN` (the CLI reads it from AIRLOCK_TOKEN or --token-file)",
        ))
        .into_response()
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What `GET /v1/health` answers.
#[derive(Serialize, Deserialize, utoipa::ToSchema)]
struct Health {
    /// Always true: the daemon answered.
    ok: bool,
    /// The daemon's version.
    version: String,
}

#[utoipa::path(get, path = "/v1/health", tag = "daemon", responses((status = 200, description = "the daemon answers", body = Health), ApiErrors))]
async fn health() -> Json<Health> {
    Json(Health { ok: true, version: env!("CARGO_PKG_VERSION").into() })
}

#[utoipa::path(get, path = "/v1/doctor", tag = "daemon", responses((status = 200, description = "what the host can do", body = airlock_lifecycle::doctor::Doctor), ApiErrors))]
async fn doctor(State(s): State<AppState>) -> Json<airlock_lifecycle::doctor::Doctor> {
    let mut doctor = s.engine.doctor();
    doctor.gateway = airlock_gateway::http::base(&s.engine);
    Json(doctor)
}

#[utoipa::path(post, path = "/v1/shutdown", tag = "daemon", responses((status = 202, description = "the daemon stops; sandboxes keep running"), ApiErrors))]
async fn shutdown(State(s): State<AppState>) -> StatusCode {
    s.shutdown.notify_one();
    StatusCode::ACCEPTED
}

#[utoipa::path(get, path = "/v1/goldens", tag = "goldens", responses((status = 200, description = "every golden", body = Vec<golden::Golden>), ApiErrors))]
async fn list_goldens(State(s): State<AppState>) -> ApiResult<Vec<golden::Golden>> {
    Ok(Json(s.engine.store().goldens()?))
}

#[utoipa::path(post, path = "/v1/goldens", tag = "goldens", request_body = CreateGolden, responses((status = 201, description = "its first generation is built", body = golden::Golden), ApiErrors))]
async fn create_golden(
    State(s): State<AppState>,
    req: Result<Json<CreateGolden>, JsonRejection>,
) -> Result<Response, Failure> {
    let req = body(req)?;
    let engine = s.engine.clone();
    let g = detached(async move { golden::create(&engine, &req).await }).await?;
    cluster::announce(&s).await;
    Ok((StatusCode::CREATED, Json(g)).into_response())
}

#[utoipa::path(post, path = "/v1/scans", tag = "goldens", request_body = golden::scan::ScanRequest, responses((status = 200, description = "the columns that hold personal data, and a rules file that masks them", body = golden::scan::ScanReport), ApiErrors))]
async fn scan_source(
    req: Result<Json<golden::scan::ScanRequest>, JsonRejection>,
) -> Result<Json<golden::scan::ScanReport>, Failure> {
    let req = body(req)?;
    Ok(Json(detached(async move { golden::scan::scan(&req).await }).await?))
}

#[utoipa::path(get, path = "/v1/goldens/{name}", tag = "goldens", params(("name" = String, Path, description = "the golden's name")), responses((status = 200, description = "the golden and its generations", body = golden::Golden), ApiErrors))]
async fn show_golden(State(s): State<AppState>, Path(name): Path<String>) -> ApiResult<golden::Golden> {
    Ok(Json(s.engine.store().golden(&name)?))
}

#[utoipa::path(get, path = "/v1/goldens/{name}/progress", tag = "goldens", params(("name" = String, Path, description = "the golden's name")), responses((status = 200, description = "how far its build under way has got", body = golden::progress::BuildProgress), ApiErrors))]
async fn golden_progress(
    State(s): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<golden::progress::BuildProgress> {
    s.engine.builds.get(&name).map(Json).ok_or_else(|| {
        Failure(Error::new(
            airlock_core::error::ErrorCode::GoldenNotFound,
            format!("no build of golden {name:?} is under way"),
            "progress is shown while `airlock golden create` or `refresh` runs",
        ))
    })
}

/// Query of `DELETE /v1/goldens/{name}`.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct RemoveQuery {
    /// Delete its sandboxes too, instead of refusing while it has any.
    #[serde(default)]
    force: bool,
}

#[utoipa::path(delete, path = "/v1/goldens/{name}", tag = "goldens", params(("name" = String, Path, description = "the golden's name"), RemoveQuery), responses((status = 200, description = "the golden, now removed", body = golden::Golden), ApiErrors))]
async fn remove_golden(
    State(s): State<AppState>,
    Path(name): Path<String>,
    Query(q): Query<RemoveQuery>,
) -> ApiResult<golden::Golden> {
    let engine = s.engine.clone();
    let removed = detached(async move { golden::remove(&engine, &name, q.force).await }).await?;
    cluster::announce(&s).await;
    Ok(Json(removed))
}

#[utoipa::path(post, path = "/v1/goldens/{name}/refresh", tag = "goldens", params(("name" = String, Path, description = "the golden's name")), responses((status = 200, description = "the next generation is built and current", body = golden::Golden), ApiErrors))]
async fn refresh_golden(State(s): State<AppState>, Path(name): Path<String>) -> ApiResult<golden::Golden> {
    let engine = s.engine.clone();
    let refreshed = detached(async move { golden::refresh(&engine, &name).await }).await?;
    cluster::announce(&s).await;
    Ok(Json(refreshed))
}

/// Body of `POST /v1/goldens/{name}/pool`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PoolRequest {
    /// Started sandboxes to keep ready (credentials bound at claim).
    #[schema(minimum = 0)]
    pub size: i64,
}

#[utoipa::path(post, path = "/v1/goldens/{name}/pool", tag = "goldens", params(("name" = String, Path, description = "the golden's name")), request_body = PoolRequest, responses((status = 200, description = "the pool's new size", body = golden::Golden), ApiErrors))]
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

#[utoipa::path(get, path = "/v1/sandboxes", tag = "sandboxes", params(("golden" = Option<String>, Query, description = "only sandboxes of this golden"), ("label" = Option<Vec<String>>, Query, description = "only sandboxes with this label, `key=value`; repeat for several")), responses((status = 200, description = "live sandboxes, without credentials", body = Vec<sandbox::Sandbox>), ApiErrors))]
async fn list_sandboxes(
    State(s): State<AppState>,
    peer: Option<axum::Extension<airlock_cluster::peer::FromPeer>>,
    RawQuery(q): RawQuery,
) -> ApiResult<Vec<sandbox::Sandbox>> {
    let filter = sandbox_filter(q.clone())?;
    let list = s.engine.store().sandboxes(&filter)?;
    // A list never hands out credentials (`show` does, on record).
    let mut list: Vec<sandbox::Sandbox> = list.into_iter().map(without_secrets).collect();
    if let Some(me) = &s.cluster {
        list.iter_mut().for_each(|sb| sb.node = Some(me.name().to_owned()));
    }
    if let Some(cluster) = cluster::deciding(&s, peer.map(|p| p.0)) {
        let others = cluster.others(q.as_deref().unwrap_or("")).await?;
        list.extend(others.into_iter().filter(|sb| {
            filter.golden.as_ref().is_none_or(|g| &sb.golden == g)
                && filter.labels.iter().all(|(k, v)| sb.labels.get(k) == Some(v))
        }));
    }
    Ok(Json(list))
}

/// Body of `POST /v1/sandboxes`: the fork, and whether the gateway mints it
/// an MCP endpoint (the lifecycle forks; the endpoint is the gateway's).
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ForkBody {
    /// The fork.
    #[serde(flatten)]
    pub fork: ForkRequest,
    /// Also mint a task-scoped MCP endpoint (`mcp_url` in the answer).
    #[serde(default)]
    pub mcp: bool,
    /// In a cluster: fork on this node only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// In a cluster: fork only on a node carrying every one of these labels.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub node_labels: std::collections::BTreeMap<String, String>,
}

/// What `POST /v1/sandboxes` answers: the fork, and its MCP endpoint when asked for.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ForkAnswer {
    /// The new sandbox and the warnings of its fork.
    #[serde(flatten)]
    pub forked: sandbox::Forked,
    /// The task-scoped MCP endpoint, when asked for: a URL whose token is bound
    /// to this sandbox alone. A secret, like the DSN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_url: Option<String>,
}

#[utoipa::path(post, path = "/v1/sandboxes", tag = "sandboxes", request_body = ForkBody, responses((status = 201, description = "the new sandbox and its DSN (a secret)", body = ForkAnswer), ApiErrors))]
async fn fork(
    State(s): State<AppState>,
    peer: Option<axum::Extension<airlock_cluster::peer::FromPeer>>,
    req: Result<Json<ForkBody>, JsonRejection>,
) -> Result<Response, Failure> {
    let fork_body = body(req)?;
    if let Some(cluster) = &s.cluster {
        cluster.check_in_touch()?;
    } else if fork_body.node.is_some() || !fork_body.node_labels.is_empty() {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            "--node and --node-label place forks in a cluster, and this daemon is not in one",
            "leave them out, or start the daemon with --cluster (docs/CLUSTER.md)",
        )
        .into());
    }
    let peer = peer.map(|p| p.0);
    // A name is the cluster's: held for this fork until its sandbox is
    // published (or let go, if the fork fails), so two nodes' forks cannot
    // both take it.
    let claimed = match (cluster::deciding(&s, peer), &fork_body.fork.name) {
        (Some(cluster), Some(name)) => {
            if !matches!(cluster.owner(name).await?, airlock_cluster::Owner::Here) {
                return Err(Error::new(
                    ErrorCode::NameTaken,
                    format!("a sandbox named {name:?} already lives in the cluster"),
                    "pick another name, or delete that sandbox first",
                )
                .into());
            }
            cluster.claim_name(name).await?;
            Some((cluster.clone(), name.clone()))
        }
        _ => None,
    };
    let forked = fork_placed(&s, peer, fork_body).await;
    if let Some((cluster, name)) = claimed {
        if !forked.as_ref().is_ok_and(|r| r.status().is_success()) {
            cluster.release_name(&name).await;
        }
    }
    forked
}

/// A fork, placed (and sent on) in a cluster, or made here.
async fn fork_placed(
    s: &AppState,
    peer: Option<airlock_cluster::peer::FromPeer>,
    fork_body: ForkBody,
) -> Result<Response, Failure> {
    let ForkBody { fork: req, mcp, node, node_labels } = fork_body;
    if let Some(cluster) = cluster::deciding(s, peer) {
        let want = airlock_cluster::placement::Want { golden: req.golden.clone(), node, labels: node_labels };
        if let airlock_cluster::placement::Choice::Node(peer) = cluster.place(&want).await? {
            let body = ForkBody { fork: req, mcp, node: None, node_labels: Default::default() };
            let body = serde_json::to_vec(&body).map_err(|e| Error::internal(e.to_string()))?;
            let answer = cluster
                .forward(&peer, "POST", "/v1/sandboxes", Some("application/json"), body.into())
                .await?;
            return Ok(cluster::relayed(answer));
        }
    }
    if let Some(cluster) = &s.cluster {
        // Placed here without the golden: fetched from a node that holds it first.
        let (golden, generation) = match req.golden.split_once('@') {
            Some((name, n)) => (name, n.parse().ok()),
            None => (req.golden.as_str(), None),
        };
        if !cluster.holds(golden, generation) && validate::name("golden", golden).is_ok() {
            let fetched = cluster.fetch_golden(golden, generation).await?;
            tracing::info!(golden, generation = fetched.generation, from = ?fetched.from, "fetched a golden for a fork");
        }
    }
    if mcp && airlock_gateway::http::base(&s.engine).is_none() {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            "an MCP endpoint was asked for but the MCP gateway is off",
            "start the daemon with --gateway HOST:PORT (the default is 127.0.0.1:7433)",
        )
        .into());
    }
    let engine = s.engine.clone();
    let mut answer = detached(async move {
        let forked = sandbox::fork(&engine, &req).await?;
        let mut answer = ForkAnswer { forked, mcp_url: None };
        if mcp {
            match airlock_gateway::http::mint(&engine, &answer.forked.sandbox.id) {
                Ok(url) => answer.mcp_url = Some(url),
                Err(e) => {
                    // Nothing half-made: without its endpoint the sandbox goes too.
                    let _ = sandbox::delete(&engine, &answer.forked.sandbox.id, DeleteReason::Failed).await;
                    return Err(e.into());
                }
            }
        }
        Ok(answer)
    })
    .await?;
    let id = answer.forked.sandbox.id.clone();
    answer.forked.sandbox = match s.engine.hand_over(answer.forked.sandbox, "api:fork") {
        Ok(sb) => sb,
        Err(e) => {
            // A sandbox whose credential could not go on record is not handed out.
            let _ = sandbox::delete(&s.engine, &id, DeleteReason::Failed).await;
            return Err(e.into());
        }
    };
    if let Some(cluster) = &s.cluster {
        // Published before the answer, so any node finds the sandbox at once.
        if let Err(e) = cluster.publish_now().await {
            tracing::warn!(error = %e, "could not publish a new sandbox to the cluster");
        }
        answer.forked.sandbox.node = Some(cluster.name().to_owned());
    }
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

/// Body of `POST /v1/sandboxes/{id}/sql`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SqlRequest {
    /// One or more SQL statements.
    pub sql: String,
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/sql", tag = "tools", params(("id" = String, Path, description = "the sandbox's id or name")), request_body = SqlRequest, responses((status = 200, description = "what run_sql answers", body = Object), ApiErrors))]
async fn sql(
    State(s): State<AppState>,
    Path(id): Path<String>,
    req: Result<Json<SqlRequest>, JsonRejection>,
) -> ApiResult<serde_json::Value> {
    let req = body(req)?;
    let engine = s.engine.clone();
    let args = serde_json::json!({ "sql": req.sql });
    let out = detached(async move {
        airlock_gateway::tools::call(&engine, &id, airlock_gateway::tools::RUN_SQL, &args, Default::default())
            .await
    })
    .await?;
    Ok(Json(out.result))
}

/// Query of `POST /v1/sandboxes/{id}/tools/{tool}`.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ToolQuery {
    /// The door the call came through, for its event (`airlock mcp` says `mcp_stdio`).
    #[serde(default)]
    via: airlock_gateway::tools::Via,
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/tools/{tool}", tag = "tools", params(("id" = String, Path, description = "the sandbox's id or name"), ("tool" = String, Path, description = "a tool `GET /v1/tools` lists"), ToolQuery), request_body(content = Option<Object>, description = "the tool's arguments, as its input schema says (null for none)"), responses((status = 200, description = "the tool's answer", body = airlock_gateway::tools::ToolOutput), ApiErrors))]
async fn call_tool(
    State(s): State<AppState>,
    Path((id, tool)): Path<(String, String)>,
    Query(q): Query<ToolQuery>,
    args: Result<Json<serde_json::Value>, JsonRejection>,
) -> ApiResult<airlock_gateway::tools::ToolOutput> {
    // `null` is a call without arguments (MCP clients may send none); anything
    // else must be the object the tool's input schema describes, which the
    // tool checks, so that every call, refused or not, is on record.
    let args = body(args)?;
    let engine = s.engine.clone();
    Ok(Json(
        detached(async move { airlock_gateway::tools::call(&engine, &id, &tool, &args, q.via).await })
            .await?,
    ))
}

#[utoipa::path(get, path = "/v1/tools", tag = "tools", responses((status = 200, description = "the agent's tools and their input schemas", body = Vec<airlock_gateway::tools::ToolSpec>), ApiErrors))]
async fn list_tools() -> Json<Vec<airlock_gateway::tools::ToolSpec>> {
    Json(airlock_gateway::tools::specs())
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}", tag = "sandboxes", params(("id" = String, Path, description = "the sandbox's id or name")), responses((status = 200, description = "the sandbox, with its DSN", body = sandbox::Sandbox), ApiErrors))]
async fn show_sandbox(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult<sandbox::Sandbox> {
    let sb = s.engine.store().sandbox(&id)?;
    Ok(Json(s.engine.hand_over(sb, "api:show")?))
}

#[utoipa::path(delete, path = "/v1/sandboxes/{id}", tag = "sandboxes", params(("id" = String, Path, description = "the sandbox's id or name")), responses((status = 200, description = "the sandbox, now deleted", body = sandbox::Sandbox), ApiErrors))]
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
    Ok(Json(without_secrets(detached(work).await?)))
}

/// A sandbox with its connection strings left out.
fn without_secrets(sb: sandbox::Sandbox) -> sandbox::Sandbox {
    sb.without_credentials()
}

/// Body of `POST /v1/sandboxes/{id}/extend`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExtendRequest {
    /// The sandbox expires this many seconds from now.
    #[schema(minimum = 1)]
    pub ttl_seconds: i64,
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/extend", tag = "sandboxes", params(("id" = String, Path, description = "the sandbox's id or name")), request_body = ExtendRequest, responses((status = 200, description = "the sandbox with its new expiry", body = sandbox::Sandbox), ApiErrors))]
async fn extend(
    State(s): State<AppState>,
    Path(id): Path<String>,
    req: Result<Json<ExtendRequest>, JsonRejection>,
) -> ApiResult<sandbox::Sandbox> {
    let req = body(req)?;
    let sb = sandbox::extend(&s.engine, &id, req.ttl_seconds)?;
    Ok(Json(s.engine.hand_over(sb, "api:extend")?))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/reset", tag = "sandboxes", params(("id" = String, Path, description = "the sandbox's id or name")), responses((status = 200, description = "back to its golden, same id, address and credential", body = sandbox::Sandbox), ApiErrors))]
async fn reset(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult<sandbox::Sandbox> {
    let engine = s.engine.clone();
    without_credential(async move { sandbox::reset(&engine, &id).await }).await
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/branch", tag = "sandboxes", params(("id" = String, Path, description = "the sandbox's id or name")), request_body = sandbox::BranchRequest, responses((status = 201, description = "a new sandbox holding the source's state at one instant", body = sandbox::Forked), ApiErrors))]
async fn branch(
    State(s): State<AppState>,
    Path(id): Path<String>,
    req: Result<Json<sandbox::BranchRequest>, JsonRejection>,
) -> Result<Response, Failure> {
    let req = body(req)?;
    let engine = s.engine.clone();
    let mut forked = detached(async move { sandbox::branch::branch(&engine, &id, &req).await }).await?;
    let id = forked.sandbox.id.clone();
    forked.sandbox = match s.engine.hand_over(forked.sandbox, "api:branch") {
        Ok(sb) => sb,
        Err(e) => {
            let _ = sandbox::delete(&s.engine, &id, DeleteReason::Failed).await;
            return Err(e.into());
        }
    };
    Ok((StatusCode::CREATED, Json(forked)).into_response())
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/suspend", tag = "sandboxes", params(("id" = String, Path, description = "the sandbox's id or name")), responses((status = 200, description = "suspended: files, credential and address kept", body = sandbox::Sandbox), ApiErrors))]
async fn suspend(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult<sandbox::Sandbox> {
    let engine = s.engine.clone();
    without_credential(async move { sandbox::suspend(&engine, &id, sandbox::SuspendReason::User).await })
        .await
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/wake", tag = "sandboxes", params(("id" = String, Path, description = "the sandbox's id or name")), responses((status = 200, description = "running and answering again", body = sandbox::Sandbox), ApiErrors))]
async fn wake(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult<sandbox::Sandbox> {
    let engine = s.engine.clone();
    without_credential(async move { sandbox::wake(&engine, &id).await }).await
}

/// Body of `POST /v1/sandboxes/{id}/promote`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PromoteRequest {
    /// The golden to make (or to add a generation to).
    #[schema(pattern = "^[a-z][a-z0-9_-]{0,47}$")]
    pub golden: String,
    /// Keep settings and catalog-shadowing objects the sandbox carries instead
    /// of refusing (they are listed in the new generation's manifest).
    #[serde(default)]
    pub allow_planted: bool,
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/promote", tag = "goldens", params(("id" = String, Path, description = "the sandbox's id or name")), request_body = PromoteRequest, responses((status = 200, description = "the golden with the sandbox's state as its current generation", body = golden::Golden), ApiErrors))]
async fn promote(
    State(s): State<AppState>,
    Path(id): Path<String>,
    req: Result<Json<PromoteRequest>, JsonRejection>,
) -> ApiResult<golden::Golden> {
    let req = body(req)?;
    let engine = s.engine.clone();
    let promoted =
        detached(async move { golden::promote(&engine, &id, &req.golden, req.allow_planted).await }).await?;
    cluster::announce(&s).await;
    Ok(Json(promoted))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", tag = "sandboxes", params(("id" = String, Path, description = "the sandbox's id or name")), request_body = sandbox::ExecRequest, responses((status = 200, description = "the command's exit code and output", body = sandbox::ExecResult), ApiErrors))]
async fn exec(
    State(s): State<AppState>,
    Path(id): Path<String>,
    req: Result<Json<sandbox::ExecRequest>, JsonRejection>,
) -> ApiResult<sandbox::ExecResult> {
    let req = body(req)?;
    let engine = s.engine.clone();
    Ok(Json(detached(async move { sandbox::exec::exec(&engine, &id, &req).await }).await?))
}

/// Query of `GET /v1/events`.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct EventsQuery {
    /// Only events of this sandbox (id, or a live sandbox's name).
    sandbox: Option<String>,
    /// At most this many of the newest (1 to 100,000; 1,000 by default).
    limit: Option<i64>,
}

#[utoipa::path(get, path = "/v1/events", tag = "events", params(EventsQuery), responses((status = 200, description = "events, oldest first", body = Vec<airlock_core::events::Event>), ApiErrors))]
async fn events(
    State(s): State<AppState>,
    peer: Option<axum::Extension<airlock_cluster::peer::FromPeer>>,
    RawQuery(raw): RawQuery,
    Query(q): Query<EventsQuery>,
) -> ApiResult<Vec<airlock_core::events::Event>> {
    let limit = q.limit.unwrap_or(1000).clamp(1, 100_000);
    let here = {
        let store = s.engine.store();
        // Accept a live sandbox's name as well as an id.
        let id =
            q.sandbox.as_ref().map(|key| store.sandbox(key).map(|sb| sb.id).unwrap_or_else(|_| key.clone()));
        store.events(id.as_deref(), limit)?
    };
    match cluster::deciding(&s, peer.map(|p| p.0)) {
        Some(cluster) => {
            Ok(Json(cluster::events_everywhere(cluster, here, raw.as_deref(), limit as usize).await?))
        }
        None => Ok(Json(here)),
    }
}

#[utoipa::path(get, path = "/v1/stats", tag = "events", responses((status = 200, description = "the five measures of fleet health", body = airlock_telemetry::metrics::stats::Stats), ApiErrors))]
async fn stats(State(s): State<AppState>) -> ApiResult<airlock_telemetry::metrics::stats::Stats> {
    let (engine, metrics) = (s.engine.clone(), s.metrics.clone());
    Ok(Json(tokio::task::spawn_blocking(move || metrics.stats(&engine)).await.map_err(Error::from)?))
}

#[utoipa::path(post, path = "/v1/audit/checkpoint", tag = "events", responses((status = 200, description = "a checkpoint of the audit chain's head, signed now (or the newest, when nothing was written since)", body = airlock_state::audit::checkpoint::Checkpoint), ApiErrors))]
async fn audit_checkpoint(
    State(s): State<AppState>,
) -> ApiResult<airlock_state::audit::checkpoint::Checkpoint> {
    let engine = s.engine.clone();
    let checkpoint =
        tokio::task::spawn_blocking(move || engine.audit.checkpoint_now()).await.map_err(Error::from)??;
    checkpoint.map(Json).ok_or_else(|| {
        Failure(Error::new(
            ErrorCode::InvalidRequest,
            "the audit log has no record yet",
            "checkpoints cover records: fork a sandbox first",
        ))
    })
}
