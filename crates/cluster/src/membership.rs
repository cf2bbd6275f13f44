//! A node's membership: its lease, renewed four times a TTL; what it
//! announces of itself; the sandboxes it publishes; and the others' sandboxes
//! it reports lost when their node's lease expires.
//!
//! A node that has not renewed for half a TTL counts itself out of touch and
//! takes no new work, before any peer can count it lost. A node whose lease
//! expired joins again with a new one and reconciles: what it still holds is
//! published again (and said found), what went while it was away is withdrawn.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::records::{NodeRecord, SandboxRecord};
use crate::Cluster;
use airlock_core::clock::Timestamp;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::events::{Door, EventKind, NewEvent};
use airlock_core::records::sandbox::SandboxState;
use airlock_state::store::SandboxFilter;

/// Runs the node's membership for as long as the daemon does.
pub fn spawn(cluster: Arc<Cluster>) {
    tokio::spawn(async move {
        let tick = (cluster.settings.lease_ttl / 4).max(Duration::from_millis(250));
        let mut renewed = Instant::now();
        loop {
            tokio::time::sleep(tick).await;
            let lease = *cluster.lease.lock().unwrap_or_else(|p| p.into_inner());
            let Some(lease) = lease else {
                match rejoin(&cluster).await {
                    Ok(()) => renewed = Instant::now(),
                    Err(e) => {
                        tracing::warn!(error = %e, "could not join the cluster again; taking no new work")
                    }
                }
                continue;
            };
            match cluster.coordinator.renew(lease).await {
                Ok(true) => {
                    renewed = Instant::now();
                    cluster.in_touch.store(true, Ordering::SeqCst);
                    if let Err(e) = round(&cluster).await {
                        tracing::warn!(error = %e, "a cluster round failed");
                    }
                }
                Ok(false) => {
                    tracing::warn!("this node's lease expired; joining the cluster again");
                    cluster.in_touch.store(false, Ordering::SeqCst);
                    *cluster.lease.lock().unwrap_or_else(|p| p.into_inner()) = None;
                }
                Err(e) => {
                    if renewed.elapsed() >= cluster.settings.lease_ttl / 2 {
                        if cluster.in_touch.swap(false, Ordering::SeqCst) {
                            tracing::warn!(error = %e, "out of touch with etcd: taking no new work until it answers");
                        }
                    }
                }
            }
        }
    });
}

/// One round of a node in touch: say its load, publish its sandboxes, report the lost.
async fn round(cluster: &Cluster) -> Result<()> {
    let lease = current(cluster)?;
    cluster.coordinator.announce(lease, &describe(cluster)).await?;
    sync(cluster, false).await?;
    revocations(cluster).await?;
    report_lost(cluster).await
}

/// Brings the revoked-certificate list here and in the coordinator to the
/// newer of the two: a list `cluster revoke` made here goes out, one made on
/// the CA's node comes in. Each is taken only with the CA's signature.
async fn revocations(cluster: &Cluster) -> Result<()> {
    let revoked = cluster.revoked.clone();
    let mut newer = tokio::task::spawn_blocking({
        let revoked = revoked.clone();
        move || revoked.reread()
    })
    .await
    .map_err(|e| Error::internal(e.to_string()))??;
    // The coordinator's list, if it is the CA's (0: none, or a forgery).
    let mut theirs = 0;
    if let Some(signed) = cluster.coordinator.revoked().await? {
        match revoked.offer(&signed) {
            Ok((number, taken)) => (theirs, newer) = (number, newer || taken),
            Err(e) => {
                tracing::warn!(error = %e, "the coordinator's revoked list is not the CA's; kept this node's")
            }
        }
    }
    if newer {
        // Connections kept open to peers were checked before: each shows
        // its certificate again.
        cluster.peers.forget_kept();
    }
    if revoked.number() > theirs {
        if let Some(signed) = revoked.signed() {
            cluster.coordinator.put_revoked(&signed).await?;
        }
    }
    Ok(())
}

/// Says what this node is and holds now, between rounds (a golden it just received).
pub async fn announce_now(cluster: &Cluster) -> Result<()> {
    let lease = current(cluster)?;
    cluster.coordinator.announce(lease, &describe(cluster)).await
}

pub(crate) fn current(cluster: &Cluster) -> Result<crate::coordinator::Lease> {
    cluster.lease.lock().unwrap_or_else(|p| p.into_inner()).ok_or_else(|| {
        Error::new(
            ErrorCode::ClusterUnavailable,
            "this node holds no cluster lease now",
            "it joins again by itself once etcd answers",
        )
    })
}

/// Takes a new lease, announces the node and reconciles its sandboxes.
pub async fn rejoin(cluster: &Cluster) -> Result<()> {
    let lease = cluster.coordinator.lease(cluster.settings.lease_ttl).await?;
    *cluster.lease.lock().unwrap_or_else(|p| p.into_inner()) = Some(lease);
    cluster.published.lock().unwrap_or_else(|p| p.into_inner()).clear();
    cluster.coordinator.announce(lease, &describe(cluster)).await?;
    sync(cluster, true).await?;
    cluster.in_touch.store(true, Ordering::SeqCst);
    tracing::info!(node = %cluster.settings.node, "joined the cluster");
    Ok(())
}

/// This node as it announces itself now.
pub fn describe(cluster: &Cluster) -> NodeRecord {
    let engine = &cluster.engine;
    let (all, goldens) = {
        let store = engine.store();
        (
            store.sandboxes(&SandboxFilter { pooled: true, ..Default::default() }).unwrap_or_default(),
            store.goldens().unwrap_or_default(),
        )
    };
    let running =
        all.iter().filter(|s| !matches!(s.state, SandboxState::Suspended | SandboxState::Deleting)).count();
    let address = engine.router.get();
    NodeRecord {
        name: cluster.settings.node.clone(),
        state: "up".into(),
        advertise: cluster.settings.advertise.clone(),
        router: address.as_ref().map(|a| format!("{}:{}", a.host, a.port)),
        relay: address.as_ref().and_then(|a| a.relay_port).and_then(|port| {
            let host = crate::ca::host_of(&cluster.settings.advertise).ok()?;
            Some(if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") })
        }),
        labels: cluster.settings.labels.clone(),
        running: running as u64,
        sandboxes: all.len() as u64,
        max_sandboxes: engine.config.max_sandboxes as u64,
        max_running: engine.config.max_running as u64,
        free_memory_bytes: available_memory(),
        free_disk_bytes: nix::sys::statvfs::statvfs(&engine.layout.volume())
            .map(|s| s.blocks_available() as u64 * s.fragment_size() as u64)
            .unwrap_or(0),
        goldens: goldens
            .into_iter()
            .map(|g| {
                let mut gens: Vec<i64> = g
                    .generations
                    .iter()
                    .map(|m| m.generation)
                    .filter(|n| *n != g.current_generation)
                    .collect();
                gens.push(g.current_generation);
                (g.name, gens)
            })
            .collect(),
        version: env!("CARGO_PKG_VERSION").into(),
        updated_at: Timestamp::now(),
    }
}

fn available_memory() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// Publishes what changed of this node's sandboxes since the last time, and
/// withdraws those gone. With `reconcile` (a node joining), records of this
/// node it no longer holds are withdrawn too, and each is said in an event.
pub async fn sync(cluster: &Cluster, reconcile: bool) -> Result<()> {
    let _one_at_a_time = cluster.publishing.lock().await;
    let lease = current(cluster)?;
    let me = cluster.settings.node.as_str();
    let local: Vec<SandboxRecord> = {
        let store = cluster.engine.store();
        store.sandboxes(&SandboxFilter::default())?.iter().map(|sb| SandboxRecord::of(sb, me)).collect()
    };
    let held: BTreeSet<&str> = local.iter().map(|r| r.id.as_str()).collect();
    if reconcile {
        for placed in cluster.coordinator.placed().await? {
            if placed.record.node != me {
                continue;
            }
            let found = held.contains(placed.record.id.as_str());
            if !found {
                cluster.coordinator.withdraw(&placed.record).await?;
            }
            if !placed.alive {
                note(
                    cluster,
                    EventKind::Reconciled,
                    &placed.record,
                    json!({
                        "found": found,
                        "was_reported_lost": placed.reported_lost,
                        "outcome": if found { "kept: it runs on this node again" } else { "gone while the node was away (expired or deleted); its record is withdrawn" },
                    }),
                );
            }
        }
    }
    let published = cluster.published.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for record in &local {
        if published.get(&record.id) != Some(record) {
            cluster.coordinator.publish(lease, record).await?;
            cluster
                .published
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(record.id.clone(), record.clone());
        }
    }
    for (id, record) in published {
        if !held.contains(id.as_str()) {
            cluster.coordinator.withdraw(&record).await?;
            cluster.published.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        }
    }
    Ok(())
}

/// How often every sandbox record is read even when no node went.
const FULL_SCAN_EVERY: Duration = Duration::from_secs(60);

/// What the last look for lost sandboxes saw.
#[derive(Default)]
pub(crate) struct LostWatch {
    /// The nodes up then.
    up: BTreeSet<String>,
    /// When every sandbox record was last read.
    scanned: Option<Instant>,
}

/// Reports each sandbox whose node's lease expired, once across the cluster;
/// withdraws the records of lost sandboxes a lease past their expiry (their
/// node deletes them when it returns, its reaper's TTL being its own).
///
/// Every sandbox record is read only when a node this one saw up is gone,
/// and once a minute besides (for records to withdraw, and losses it missed
/// while it was itself away): a round costs one read of the nodes' records
/// otherwise, whatever the number of sandboxes.
async fn report_lost(cluster: &Cluster) -> Result<()> {
    let up: BTreeSet<String> = cluster.coordinator.nodes().await?.into_iter().map(|n| n.name).collect();
    {
        let watch = cluster.lost_watch.lock().unwrap_or_else(|p| p.into_inner());
        let someone_gone = watch.up.iter().any(|n| !up.contains(n));
        let recent = watch.scanned.is_some_and(|at| at.elapsed() < FULL_SCAN_EVERY);
        if !someone_gone && recent {
            drop(watch);
            cluster.lost_watch.lock().unwrap_or_else(|p| p.into_inner()).up = up;
            return Ok(());
        }
    }
    let now = Timestamp::now();
    let grace = cluster.settings.lease_ttl.as_millis() as i64;
    for placed in cluster.coordinator.placed().await? {
        let record = &placed.record;
        if placed.alive || up.contains(&record.node) || record.node == cluster.settings.node {
            continue;
        }
        if record.expires_at.0 + grace < now.0 {
            cluster.coordinator.withdraw(record).await?;
            continue;
        }
        if !placed.reported_lost && cluster.coordinator.report_lost(&record.id).await? {
            tracing::warn!(sandbox = %record.id, node = %record.node, "a sandbox's node stopped renewing its lease: lost");
            note(
                cluster,
                EventKind::Lost,
                record,
                json!({
                    "owner": record.node,
                    "expires_at": record.expires_at,
                    "why": "its node stopped renewing its lease",
                }),
            );
        }
    }
    *cluster.lost_watch.lock().unwrap_or_else(|p| p.into_inner()) =
        LostWatch { up, scanned: Some(Instant::now()) };
    Ok(())
}

/// Records an event about a sandbox of the cluster in this node's audit log.
fn note(cluster: &Cluster, kind: EventKind, sandbox: &SandboxRecord, mut detail: serde_json::Value) {
    detail["generation"] = sandbox.generation.into();
    cluster.engine.store().record_or_log(NewEvent {
        kind,
        sandbox: Some(sandbox.id.clone()),
        golden: Some(sandbox.golden.clone()),
        reason: None,
        detail,
        door: Some(Door::Daemon),
    });
}
