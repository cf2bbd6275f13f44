//! Goldens on many nodes: `POST /v1/goldens/{name}/replicate` asks nodes to
//! fetch a golden generation; a node fetching one reads another's offer and
//! files on the peer listener alone (`/v1/goldens/{name}/replica`,
//! `.../replica/files`), which no other door serves.

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};

use super::{body, ApiResult, AppState};
use airlock_cluster::peer::FromPeer;
use airlock_cluster::replicate::Fetched;
use airlock_core::error::{Error, ErrorCode};
use airlock_lifecycle::golden::replica;
use airlock_listen::serve::Failure;

use super::openapi::ApiErrors;

/// Body of `POST /v1/goldens/{name}/replicate`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReplicateRequest {
    /// The nodes that should hold it.
    pub nodes: Vec<String>,
    /// The generation (the current one of the node it comes from if unset).
    #[serde(default)]
    pub generation: Option<i64>,
}

#[utoipa::path(post, path = "/v1/goldens/{name}/replicate", tag = "cluster", params(("name" = String, Path, description = "the golden's name")), request_body = ReplicateRequest, responses((status = 200, description = "what each node fetched (or held already), in the order asked", body = Vec<Fetched>), ApiErrors))]
pub(super) async fn replicate(
    State(s): State<AppState>,
    Path(name): Path<String>,
    peer: Option<Extension<FromPeer>>,
    req: Result<Json<ReplicateRequest>, axum::extract::rejection::JsonRejection>,
) -> ApiResult<Vec<Fetched>> {
    let req = body(req)?;
    let cluster = s.cluster.clone().ok_or_else(|| {
        Failure(Error::new(
            ErrorCode::InvalidRequest,
            "this daemon is not in a cluster: it has no other node to replicate to",
            "start it with --cluster (docs/CLUSTER.md)",
        ))
    })?;
    if req.nodes.is_empty() {
        return Err(Error::new(
            ErrorCode::InvalidArguments,
            "no node was named",
            "name the nodes that should hold the golden: --nodes b,c (`airlock nodes` lists them)",
        )
        .into());
    }
    let up = cluster.nodes().await?;
    let mut done = Vec::new();
    for node in &req.nodes {
        if node == cluster.name() {
            done.push(cluster.fetch_golden(&name, req.generation).await?);
            continue;
        }
        // A node asked by a peer fetches for itself only.
        let record = up.iter().find(|n| &n.name == node && n.state == "up").filter(|_| peer.is_none());
        let Some(record) = record else {
            return Err(Error::new(
                ErrorCode::ClusterUnavailable,
                format!("node {node:?} is not up in the cluster"),
                "`airlock nodes` lists the nodes and their state",
            )
            .into());
        };
        let ask = ReplicateRequest { nodes: vec![node.clone()], generation: req.generation };
        let ask = serde_json::to_vec(&ask).map_err(|e| Error::internal(e.to_string()))?;
        let path = format!("/v1/goldens/{name}/replicate");
        let answer = cluster.forward(record, "POST", &path, Some("application/json"), ask.into()).await?;
        if answer.status != 200 {
            return Err(airlock_cluster::peer_error(record, &answer).into());
        }
        let mut fetched: Vec<Fetched> = serde_json::from_slice(&answer.body)
            .map_err(|e| Error::internal(format!("node {node} answered what does not read: {e}")))?;
        done.append(&mut fetched);
    }
    Ok(Json(done))
}

/// Which generation a peer asks for.
#[derive(Debug, Deserialize)]
pub(super) struct Which {
    generation: Option<i64>,
}

/// Refuses anything but a peer: a golden's files are another node's to read.
fn from_peer_only(peer: Option<Extension<FromPeer>>) -> Result<(), Failure> {
    match peer {
        Some(_) => Ok(()),
        None => Err(Failure(Error::new(
            ErrorCode::Unauthorized,
            "a golden's files are read by the cluster's other nodes only, on the node-to-node port",
            "replicate it with `airlock golden replicate NAME --nodes ...`",
        ))),
    }
}

/// A generation's offer: its manifest, its source without secrets, and its
/// files' hashes.
pub(super) async fn offer(
    State(s): State<AppState>,
    Path(name): Path<String>,
    Query(which): Query<Which>,
    peer: Option<Extension<FromPeer>>,
) -> Result<Json<replica::Offer>, Failure> {
    from_peer_only(peer)?;
    let engine = s.engine.clone();
    let offer = tokio::task::spawn_blocking(move || replica::offer(&engine, &name, which.generation))
        .await
        .map_err(|e| Error::internal(e.to_string()))??;
    Ok(Json(offer))
}

/// A generation's files, in its inventory's order, as one stream.
pub(super) async fn files(
    State(s): State<AppState>,
    Path(name): Path<String>,
    Query(which): Query<Which>,
    peer: Option<Extension<FromPeer>>,
) -> Result<Response, Failure> {
    from_peer_only(peer)?;
    let engine = s.engine.clone();
    let (generation, inventory) = {
        let engine = engine.clone();
        let name = name.clone();
        tokio::task::spawn_blocking(move || {
            let generation = match which.generation {
                Some(n) => n,
                None => engine.store().golden(&name)?.current_generation,
            };
            replica::inventory(&engine, &name, generation).map(|i| (generation, i))
        })
        .await
        .map_err(|e| Error::internal(e.to_string()))??
    };
    let (send, mut sent) = tokio::sync::mpsc::channel::<std::io::Result<Vec<u8>>>(8);
    tokio::task::spawn_blocking(move || {
        let read = replica::send_files(&engine, &name, generation, &inventory, |chunk| {
            send.blocking_send(Ok(chunk)).is_ok()
        });
        if let Err(e) = read {
            tracing::warn!(golden = %name, generation, error = %e, "sending a golden's files stopped");
            let _ = send.blocking_send(Err(e));
        }
    });
    let stream = futures_util::stream::poll_fn(move |cx| sent.poll_recv(cx));
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], Body::from_stream(stream)).into_response())
}
