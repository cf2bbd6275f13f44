//! The grant routes: mint a grant on a live target, list and show live
//! grants, revoke one. Only the answer that mints a grant carries its DSN.

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::{body, detached, ApiErrors, ApiResult, AppState, Failure};
use airlock_lifecycle::sandbox::{ExecRequest, ExecResult};
use airlock_live::grant::{Grant, GrantRequest, Granted};

#[utoipa::path(post, path = "/v1/targets/{name}/grants", tag = "targets", params(("name" = String, Path, description = "the target's name")), request_body = GrantRequest, responses((status = 201, description = "the grant, with its DSN through the router (given this once)", body = Granted), ApiErrors))]
pub(super) async fn mint_grant(
    State(s): State<AppState>,
    Path(name): Path<String>,
    req: Result<Json<GrantRequest>, JsonRejection>,
) -> Result<Response, Failure> {
    let req = body(req)?;
    let live = s.live.clone();
    let granted = detached(async move { live.grant(&name, &req).await }).await?;
    Ok((StatusCode::CREATED, Json(granted)).into_response())
}

#[utoipa::path(get, path = "/v1/grants", tag = "targets", responses((status = 200, description = "every live grant, without credentials", body = Vec<Grant>), ApiErrors))]
pub(super) async fn list_grants(State(s): State<AppState>) -> ApiResult<Vec<Grant>> {
    Ok(Json(s.live.grants()?))
}

#[utoipa::path(get, path = "/v1/grants/{id}", tag = "targets", params(("id" = String, Path, description = "the grant's id")), responses((status = 200, description = "the grant, without credentials", body = Grant), ApiErrors))]
pub(super) async fn show_grant(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult<Grant> {
    Ok(Json(s.live.grant_of(&id)?))
}

#[utoipa::path(delete, path = "/v1/grants/{id}", tag = "targets", params(("id" = String, Path, description = "the grant's id")), responses((status = 200, description = "the grant, now ended: its sessions cut, its role and views dropped", body = Grant), ApiErrors))]
pub(super) async fn revoke_grant(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult<Grant> {
    let live = s.live.clone();
    Ok(Json(detached(async move { live.revoke(&id).await }).await?))
}

#[utoipa::path(post, path = "/v1/grants/{id}/exec", tag = "targets", params(("id" = String, Path, description = "the grant's id")), request_body = ExecRequest, responses((status = 200, description = "the command's exit code, output and files; the grant has ended", body = ExecResult), ApiErrors))]
pub(super) async fn exec_grant(
    State(s): State<AppState>,
    Path(id): Path<String>,
    req: Result<Json<ExecRequest>, JsonRejection>,
) -> ApiResult<ExecResult> {
    let req = body(req)?;
    let live = s.live.clone();
    Ok(Json(detached(async move { live.exec(&id, &req).await }).await?))
}

#[utoipa::path(post, path = "/v1/grants/{id}/tools/{tool}", tag = "targets", params(("id" = String, Path, description = "the grant's id"), ("tool" = String, Path, description = "run_sql or describe_schema")), request_body(content = Option<Object>, description = "the tool's arguments (null for none)"), responses((status = 200, description = "the tool's answer, as on a fork", body = airlock_gateway::tools::ToolOutput), ApiErrors))]
pub(super) async fn grant_tool(
    State(s): State<AppState>,
    Path((id, tool)): Path<(String, String)>,
    args: Result<Json<serde_json::Value>, JsonRejection>,
) -> ApiResult<airlock_gateway::tools::ToolOutput> {
    let args = body(args)?;
    let live = s.live.clone();
    let engine = s.engine.clone();
    Ok(Json(
        detached(async move {
            let grant = live.grant_of(&id)?;
            let dsn = live.client_dsn(&id)?;
            // The grant's own statement timeout ends a statement first.
            let deadline = std::time::Duration::from_millis(grant.statement_timeout_ms as u64)
                + std::time::Duration::from_secs(5);
            let out = airlock_gateway::grants::call(&dsn, &tool, &args, deadline).await;
            let mut detail = serde_json::json!({"grant": id, "target": grant.target, "tool": tool});
            if let Some(sql) = args.get("sql").and_then(|v| v.as_str()) {
                detail["statement"] = serde_json::json!(sql.chars().take(2000).collect::<String>());
            }
            match &out {
                Ok(o) if o.is_error => detail["error"] = o.result.get("error").cloned().unwrap_or_default(),
                Err(e) => {
                    detail["error"] = serde_json::json!({"code": e.code.as_str(), "message": e.message})
                }
                Ok(_) => {}
            }
            engine.store().record_or_log(airlock_core::events::NewEvent {
                kind: airlock_core::events::EventKind::ToolCall,
                detail,
                ..Default::default()
            });
            out
        })
        .await?,
    ))
}
