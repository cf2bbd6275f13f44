//! The API in a cluster: `GET /v1/nodes`, forks placed on the node that
//! should hold them, a sandbox's requests sent on to its owner, and listings
//! that ask every node. A request that came in on the peer listener
//! ([`FromPeer`], set there alone by [`from_peer`]) is served where it
//! arrives, never forwarded again.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::{ApiResult, AppState};
use airlock_cluster::peer::FromPeer;
use airlock_cluster::records::NodeRecord;
use airlock_cluster::{Cluster, Owner};
use airlock_core::error::{Error, ErrorCode};
use airlock_listen::serve::Failure;
use std::sync::Arc;

/// The cluster, unless this request came from a peer (then it is served here).
pub(super) fn deciding(s: &AppState, peer: Option<FromPeer>) -> Option<&Arc<Cluster>> {
    s.cluster.as_ref().filter(|_| peer.is_none())
}

/// Every node's events for the same query (each event names its node in
/// `detail.node`), this node's among them: merged by time, oldest first, the
/// newest `limit` kept. A node that does not answer is left out, and said so
/// in the log.
pub(super) async fn events_everywhere(
    cluster: &Cluster,
    here: Vec<airlock_core::events::Event>,
    query: Option<&str>,
    limit: usize,
) -> Result<Vec<airlock_core::events::Event>, Failure> {
    let path = match query {
        Some(q) if !q.is_empty() => format!("/v1/events?{q}"),
        _ => "/v1/events".to_owned(),
    };
    let mut all = here;
    for (node, answer) in cluster.ask_others(&path).await? {
        let listed = answer.and_then(|a| match a.status {
            200 => serde_json::from_slice::<Vec<airlock_core::events::Event>>(&a.body).map_err(|e| {
                Error::internal(format!("node {} listed events that do not read: {e}", node.name))
            }),
            _ => Err(airlock_cluster::peer_error(&node, &a)),
        });
        match listed {
            Ok(events) => all.extend(events),
            Err(e) => tracing::warn!(node = %node.name, error = %e, "a node's events could not be read"),
        }
    }
    // Stable: each node's own order holds among events of the same millisecond.
    all.sort_by_key(|e| e.at);
    let extra = all.len().saturating_sub(limit);
    all.drain(..extra);
    Ok(all)
}

/// Tells the cluster at once what this node holds after its goldens changed,
/// so placement and replication see it before the next round.
pub(super) async fn announce(s: &AppState) {
    if let Some(cluster) = &s.cluster {
        if let Err(e) = cluster.announce_now().await {
            tracing::warn!(error = %e, "could not announce this node's goldens");
        }
    }
}

/// The peer listener's layer: every request on it was forwarded by a node.
pub async fn from_peer(mut request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    request.extensions_mut().insert(FromPeer);
    next.run(request).await
}

#[utoipa::path(get, path = "/v1/nodes", tag = "cluster", responses((status = 200, description = "the cluster's nodes: this one, those whose lease holds, and lost ones that still own sandboxes", body = Vec<NodeRecord>), ApiErrors))]
pub(super) async fn nodes(State(s): State<AppState>) -> ApiResult<Vec<NodeRecord>> {
    let cluster = s.cluster.as_ref().ok_or_else(not_clustered)?;
    Ok(Json(cluster.nodes().await?))
}

use super::openapi::ApiErrors;

fn not_clustered() -> Failure {
    Failure(Error::new(
        ErrorCode::InvalidRequest,
        "this daemon is not in a cluster",
        "start it with --cluster http://ETCD:2379 --node NAME --advertise HOST:PORT (docs/CLUSTER.md)",
    ))
}

/// An answer a peer gave, passed back as if this node had given it.
pub(super) fn relayed(answer: airlock_cluster::http::Answer) -> Response {
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::BAD_GATEWAY);
    let kind = answer.content_type.unwrap_or_else(|| "application/json".into());
    (status, [(header::CONTENT_TYPE, kind)], answer.body).into_response()
}

/// The error for a sandbox whose node is lost.
fn lost(record: &airlock_cluster::records::SandboxRecord) -> Failure {
    Failure(record.lost())
}

/// The largest request body sent on to a peer: an exec's files.
const FORWARD_LIMIT: usize = super::EXEC_BODY_LIMIT;

/// Sends a request about one sandbox (`/v1/sandboxes/{id}/...`) to the node
/// that owns it; serves it here when that is this node. After work done here
/// on a sandbox, the node publishes at once, so every node sees it.
pub(super) async fn to_owner(
    State(s): State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(cluster) = deciding(&s, request.extensions().get::<FromPeer>().copied()).cloned() else {
        return next.run(request).await;
    };
    let path = request.uri().path().to_owned();
    let Some(key) =
        path.strip_prefix("/v1/sandboxes/").and_then(|rest| rest.split('/').next()).filter(|k| !k.is_empty())
    else {
        return next.run(request).await;
    };
    let key = percent_decoded(key);
    match cluster.owner(&key).await {
        Ok(Owner::Here) => {
            let changes = request.method() != axum::http::Method::GET;
            let response = next.run(request).await;
            if changes {
                if let Err(e) = cluster.publish_now().await {
                    tracing::warn!(error = %e, "could not publish this node's sandboxes after a change");
                }
            }
            response
        }
        Ok(Owner::Lost(record)) => lost(&record).into_response(),
        Ok(Owner::Node(node)) => {
            let method = request.method().as_str().to_owned();
            let path_and_query =
                request.uri().path_and_query().map(|p| p.as_str().to_owned()).unwrap_or(path);
            let kind =
                request.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned);
            let body = match axum::body::to_bytes(request.into_body(), FORWARD_LIMIT).await {
                Ok(b) => b,
                Err(e) => {
                    return Failure(Error::new(
                        ErrorCode::InvalidRequest,
                        format!("the request body does not read: {e}"),
                        "see /openapi.json",
                    ))
                    .into_response()
                }
            };
            match cluster.forward(&node, &method, &path_and_query, kind.as_deref(), body).await {
                Ok(answer) => relayed(answer),
                Err(e) => Failure(e).into_response(),
            }
        }
        Err(e) => Failure(e).into_response(),
    }
}

fn percent_decoded(s: &str) -> String {
    form_urlencoded::parse(format!("k={s}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| s.to_owned())
}
