//! Migration tests and promotions. In a cluster, a test's candidates are
//! spread over the nodes that hold the golden's current generation, each
//! node tests its share on its own forks, and the node asked makes one
//! report of their answers, kept and sealed here with the row records each
//! node made (read on the peer listener alone, `/v1/migrations/rows`). A
//! promote is carried out by the node that sealed its report, whichever node
//! is asked.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;

use super::{body, cluster, detached, ApiResult, AppState};
use airlock_cluster::peer::FromPeer;
use airlock_cluster::records::NodeRecord;
use airlock_cluster::Cluster;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_lifecycle::engine::Engine;
use airlock_listen::serve::Failure;
use airlock_migrate::merge::Part;
use airlock_migrate::report::Report;
use airlock_migrate::{rows, TestRequest};

use super::openapi::ApiErrors;

#[utoipa::path(post, path = "/v1/migrations/test", tag = "migrations", request_body = airlock_migrate::TestRequest, responses((status = 200, description = "the report: a verdict per candidate, and a ranking", body = airlock_migrate::report::Report), ApiErrors))]
pub(super) async fn migrate_test(
    State(s): State<AppState>,
    peer: Option<Extension<FromPeer>>,
    req: std::result::Result<Json<TestRequest>, axum::extract::rejection::JsonRejection>,
) -> ApiResult<Report> {
    let req = body(req)?;
    let engine = s.engine.clone();
    match cluster::deciding(&s, peer.map(|p| p.0)).cloned() {
        Some(cluster) => {
            cluster.check_in_touch()?;
            Ok(Json(detached(spread(engine, cluster, req)).await?))
        }
        None => Ok(Json(detached(async move { airlock_migrate::test(engine, req).await }).await?)),
    }
}

#[utoipa::path(post, path = "/v1/migrations/promote", tag = "migrations", request_body = airlock_migrate::promote::PromoteRequest, responses((status = 200, description = "the migration was applied", body = airlock_migrate::promote::Promoted), ApiErrors))]
pub(super) async fn migrate_promote(
    State(s): State<AppState>,
    peer: Option<Extension<FromPeer>>,
    req: std::result::Result<
        Json<airlock_migrate::promote::PromoteRequest>,
        axum::extract::rejection::JsonRejection,
    >,
) -> std::result::Result<Response, Failure> {
    let req = body(req)?;
    // The node that sealed the report holds what promote reads (its key, the
    // row records): a promote asked elsewhere is carried out there.
    if let Some(cluster) = cluster::deciding(&s, peer.map(|p| p.0)) {
        if let Some(sealer) = req.report.node.as_deref().filter(|n| *n != cluster.name()) {
            let node = up_node(cluster, sealer).await?;
            let sent = serde_json::to_vec(&req).map_err(|e| Error::internal(e.to_string()))?;
            let answer = cluster
                .forward(&node, "POST", "/v1/migrations/promote", Some("application/json"), sent.into())
                .await?;
            return Ok(cluster::relayed(answer));
        }
    }
    let engine = s.engine.clone();
    let promoted = detached(async move { airlock_migrate::promote::promote(&engine, &req).await }).await?;
    Ok(Json(promoted).into_response())
}

/// The node `name` if it is up; the error a promote gets when it is not.
async fn up_node(cluster: &Cluster, name: &str) -> Result<NodeRecord> {
    let nodes = cluster.nodes().await?;
    nodes.into_iter().find(|n| n.name == name && n.state == "up").ok_or_else(|| {
        Error::new(
            ErrorCode::ClusterUnavailable,
            format!("the report was sealed by node {name:?}, which is not up in the cluster"),
            "promote when that node is back (it keeps the test's row records), or test the candidates again",
        )
    })
}

/// Tests `req` in a cluster: spread over the nodes that hold the golden's
/// current generation when it can be, else here.
async fn spread(engine: Arc<Engine>, cluster: Arc<Cluster>, req: TestRequest) -> Result<Report> {
    // A request no node could test is refused here, before any is asked.
    airlock_migrate::check(&req)?;
    let me = cluster.name().to_owned();
    let here = engine.store().golden(&req.golden).ok().map(|g| g.current_generation);
    // A test that reads this host's files (commands run in a fork's boundary
    // here, expected-schema files), or one asked on a sandbox's behalf, runs
    // on this node, which fetches the golden first if it must.
    let reads_this_host = req.on_behalf_of.is_some()
        || !req.expect_files.is_empty()
        || req.candidates.iter().any(|c| c.exec.is_some());
    if reads_this_host || (req.candidates.len() < 2 && here.is_some()) {
        if here.is_none() {
            cluster.fetch_golden(&req.golden, None).await?;
        }
        return airlock_migrate::test(engine, req).await;
    }
    let nodes = cluster.nodes().await?;
    let up = || nodes.iter().filter(|n| n.state == "up");
    let Some(generation) = here.or_else(|| up().filter_map(|n| n.current(&req.golden)).max()) else {
        return Err(Error::new(
            ErrorCode::GoldenNotFound,
            format!("no node up holds golden {:?}", req.golden),
            "build it on one node (`airlock golden create`), then test",
        ));
    };
    let expected_too = |n: &NodeRecord| req.expect_golden.as_deref().is_none_or(|g| n.holds(g, None));
    let mut holders: Vec<&NodeRecord> = up()
        .filter(|n| n.current(&req.golden) == Some(generation) && expected_too(n))
        .filter(|n| n.has_room() || n.name == me)
        .collect();
    let load = |n: &NodeRecord| n.sandboxes as f64 / n.max_sandboxes.max(1) as f64;
    holders.sort_by(|a, b| {
        load(a).total_cmp(&load(b)).then((a.name != me).cmp(&(b.name != me))).then(a.name.cmp(&b.name))
    });
    if holders.is_empty() && here.is_none() {
        return Err(Error::new(
            ErrorCode::CapacityExhausted,
            format!("every node that holds golden {:?} (generation {generation}) is full", req.golden),
            "delete sandboxes on those nodes, or replicate the golden to another (`airlock golden replicate`)",
        ));
    }
    if holders.is_empty() {
        return airlock_migrate::test(engine, req).await;
    }
    // Candidates dealt out in turn, the least loaded node first.
    let mut shares: Vec<Vec<usize>> = vec![Vec::new(); holders.len()];
    for i in 0..req.candidates.len() {
        shares[i % holders.len()].push(i);
    }
    let runs = holders.iter().zip(shares).filter(|(_, share)| !share.is_empty()).map(|(node, indices)| {
        let (engine, cluster, req, holders) = (&engine, &cluster, &req, &holders);
        async move {
            match test_share(engine, cluster, node, req, indices.clone()).await {
                // A node that could not be reached: its share goes to another.
                Err(e) if e.code == ErrorCode::ClusterUnavailable => {
                    let Some(other) = holders.iter().find(|n| n.name != node.name) else { return Err(e) };
                    tracing::warn!(node = %node.name, instead = %other.name, error = %e, "a migration test's share is tested on another node");
                    test_share(engine, cluster, other, req, indices).await
                }
                tested => tested,
            }
        }
    });
    let mut parts = Vec::new();
    let mut first_error = None;
    for tested in futures_util::future::join_all(runs).await {
        match tested {
            Ok(part) => parts.push(part),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    let layout = engine.layout.clone();
    let total = req.candidates.len();
    tokio::task::spawn_blocking(move || airlock_migrate::merge::merge(&layout, total, parts))
        .await
        .map_err(|e| Error::internal(e.to_string()))?
}

/// Has `node` (this one, or a peer) test the candidates at `indices`.
async fn test_share(
    engine: &Arc<Engine>,
    cluster: &Cluster,
    node: &NodeRecord,
    req: &TestRequest,
    indices: Vec<usize>,
) -> Result<Part> {
    if node.name == cluster.name() {
        let report = airlock_migrate::test(engine.clone(), share_of(req, &indices)).await?;
        return Ok(Part { indices, report });
    }
    on_peer(engine, cluster, node, req, indices).await
}

/// The request for the candidates at `indices` alone.
fn share_of(req: &TestRequest, indices: &[usize]) -> TestRequest {
    TestRequest { candidates: indices.iter().map(|i| req.candidates[*i].clone()).collect(), ..req.clone() }
}

/// Has `node` test the candidates at `indices`, and keeps here the row
/// records its report names.
async fn on_peer(
    engine: &Engine,
    cluster: &Cluster,
    node: &NodeRecord,
    req: &TestRequest,
    indices: Vec<usize>,
) -> Result<Part> {
    let sent = serde_json::to_vec(&share_of(req, &indices)).map_err(|e| Error::internal(e.to_string()))?;
    let answer =
        cluster.forward(node, "POST", "/v1/migrations/test", Some("application/json"), sent.into()).await?;
    if answer.status != 200 {
        return Err(airlock_cluster::peer_error(node, &answer));
    }
    let report: Report = serde_json::from_slice(&answer.body).map_err(|e| {
        Error::internal(format!("node {} answered a report that does not read: {e}", node.name))
    })?;
    let mut names: Vec<&str> = report.candidates.iter().map(|c| c.row_record.as_str()).collect();
    names.push(&report.rows);
    for name in names.into_iter().filter(|n| !n.is_empty()) {
        if name.ends_with(".rows") && rows::record_path(&engine.layout, name)?.is_file() {
            continue;
        }
        let query: String =
            form_urlencoded::Serializer::new(String::new()).append_pair("name", name).finish();
        let path = format!("/v1/migrations/rows?{query}");
        let answer = cluster.forward(node, "GET", &path, None, bytes::Bytes::new()).await?;
        if answer.status != 200 {
            return Err(airlock_cluster::peer_error(node, &answer));
        }
        let (layout, name) = (engine.layout.clone(), name.to_owned());
        tokio::task::spawn_blocking(move || rows::keep_fetched(&layout, &name, &answer.body))
            .await
            .map_err(|e| Error::internal(e.to_string()))??;
    }
    Ok(Part { indices, report })
}

/// Which kept record a peer asks for.
#[derive(Debug, Deserialize)]
pub(super) struct RecordName {
    name: String,
}

/// A row record this node kept (`GET /v1/migrations/rows?name=...`), for the
/// node that merges a test this node took part in; peers only.
pub(super) async fn row_record(
    State(s): State<AppState>,
    Query(q): Query<RecordName>,
    peer: Option<Extension<FromPeer>>,
) -> std::result::Result<Response, Failure> {
    if peer.is_none() {
        return Err(Failure(Error::new(
            ErrorCode::Unauthorized,
            "a migration test's row records are read by the cluster's other nodes only, on the node-to-node port",
            "promote with the report, on any node: it is carried out where the report was sealed",
        )));
    }
    let path = rows::record_path(&s.engine.layout, &q.name)?;
    let bytes = tokio::fs::read(&path).await.map_err(|e| {
        Error::new(
            ErrorCode::MigrationRefused,
            format!("the row record {} cannot be read here: {e}", q.name),
            "test the candidates again",
        )
    })?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}
