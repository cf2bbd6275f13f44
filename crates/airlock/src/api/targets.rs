//! The live-target routes: register, list, show and forget targets. No
//! answer ever carries a target's admin DSN but redacted.

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::{body, detached, ApiErrors, ApiResult, AppState, Failure};
use airlock_live::target::{AddTarget, Target};

#[utoipa::path(get, path = "/v1/targets", tag = "targets", responses((status = 200, description = "every live target", body = Vec<Target>), ApiErrors))]
pub(super) async fn list_targets(State(s): State<AppState>) -> ApiResult<Vec<Target>> {
    Ok(Json(s.live.targets()?))
}

#[utoipa::path(post, path = "/v1/targets", tag = "targets", request_body = AddTarget, responses((status = 201, description = "the target, checked and registered", body = Target), ApiErrors))]
pub(super) async fn add_target(
    State(s): State<AppState>,
    req: Result<Json<AddTarget>, JsonRejection>,
) -> Result<Response, Failure> {
    let req = body(req)?;
    let live = s.live.clone();
    let target = detached(async move { live.add_target(&req.name, &req.dsn).await }).await?;
    Ok((StatusCode::CREATED, Json(target)).into_response())
}

#[utoipa::path(get, path = "/v1/targets/{name}", tag = "targets", params(("name" = String, Path, description = "the target's name")), responses((status = 200, description = "the target", body = Target), ApiErrors))]
pub(super) async fn show_target(State(s): State<AppState>, Path(name): Path<String>) -> ApiResult<Target> {
    Ok(Json(s.live.target(&name)?))
}

#[utoipa::path(delete, path = "/v1/targets/{name}", tag = "targets", params(("name" = String, Path, description = "the target's name")), responses((status = 200, description = "the target, now forgotten with its DSN, its grants ended", body = Target), ApiErrors))]
pub(super) async fn remove_target(State(s): State<AppState>, Path(name): Path<String>) -> ApiResult<Target> {
    let live = s.live.clone();
    Ok(Json(detached(async move { live.remove_target(&name).await }).await?))
}
