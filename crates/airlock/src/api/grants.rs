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
