//! The one interface a cluster's coordination goes through, and its etcd
//! implementation. A Kubernetes backend (a Lease per node, a custom resource
//! per sandbox) would implement the same trait.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::etcd::Etcd;
use crate::records::{NodeRecord, Placed, SandboxRecord};
use airlock_core::error::{Error, Result};

/// A lease a node holds while it renews it; what it announces under it goes with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease(pub i64);

/// What nodes agree on through a coordinator.
#[async_trait::async_trait]
pub trait Coordinator: Send + Sync + 'static {
    /// Takes a lease that expires `ttl` after its last renewal.
    async fn lease(&self, ttl: Duration) -> Result<Lease>;
    /// Renews it; false once it has expired (the node must join again).
    async fn renew(&self, lease: Lease) -> Result<bool>;
    /// Says what a node is and holds, under its lease.
    async fn announce(&self, lease: Lease, node: &NodeRecord) -> Result<()>;
    /// Every node whose lease holds.
    async fn nodes(&self) -> Result<Vec<NodeRecord>>;
    /// Records that a node owns a sandbox: a record that outlives the lease
    /// (so its loss can be told), and its liveness under the lease.
    async fn publish(&self, lease: Lease, sandbox: &SandboxRecord) -> Result<()>;
    /// Forgets a sandbox (deleted, or gone while its node was away).
    async fn withdraw(&self, sandbox: &SandboxRecord) -> Result<()>;
    /// Every sandbox record, with whether its owner's lease still holds it.
    async fn placed(&self) -> Result<Vec<Placed>>;
    /// One sandbox, by id or name.
    async fn find(&self, key: &str) -> Result<Option<Placed>>;
    /// Marks a sandbox lost; true for the one caller that marked it first.
    async fn report_lost(&self, id: &str) -> Result<bool>;
    /// Holds a sandbox name for a fork under way on `node`, under its lease;
    /// false when any node holds the name (a sandbox's, or another claim).
    async fn claim_name(&self, lease: Lease, name: &str, node: &str) -> Result<bool>;
    /// Lets go of a claim `node` made that no sandbox took over (its fork failed).
    async fn release_name(&self, name: &str, node: &str) -> Result<()>;
    /// The cluster's revoked-certificate list as it travels (signed by the
    /// CA: see [`crate::revoked`]), if one was put.
    async fn revoked(&self) -> Result<Option<Vec<u8>>>;
    /// Puts a newer revoked-certificate list.
    async fn put_revoked(&self, signed: &[u8]) -> Result<()>;
}

/// The coordinator on etcd: keys under `/airlock/v1/`.
///
/// | key | value | lease |
/// |---|---|---|
/// | `nodes/NAME` | the node's record | the node's |
/// | `live/ID` | the owner's name | the owner's |
/// | `names/NAME` | the sandbox's id (`claimed-by:NODE` while its fork is under way) | the owner's (the claimer's) |
/// | `placed/ID` | the sandbox's record | none |
/// | `known/NAME` | the sandbox's id, for finding a lost sandbox by name | none |
/// | `lost/ID` | the node that reported it | none |
/// | `revoked` | the revoked node certificates, signed by the cluster CA | none |
pub struct EtcdCoordinator {
    etcd: Etcd,
    prefix: String,
}

impl EtcdCoordinator {
    /// A coordinator on the etcd members in `urls`, reached with the TLS
    /// files kept in `cluster_dir` when they are `https://` ([`crate::etcd_tls`]).
    pub fn new(urls: &str, cluster_dir: &std::path::Path) -> Result<EtcdCoordinator> {
        let tls = crate::etcd_tls::load(cluster_dir)?;
        Ok(EtcdCoordinator {
            etcd: Etcd::new(urls, Duration::from_secs(2), tls)?,
            prefix: "/airlock/v1/".into(),
        })
    }

    fn key(&self, kind: &str, name: &str) -> String {
        format!("{}{kind}/{name}", self.prefix)
    }

    /// The ids under `kind/`.
    async fn ids(&self, kind: &str) -> Result<BTreeMap<String, Vec<u8>>> {
        let prefix = self.key(kind, "");
        Ok(self
            .etcd
            .under(&prefix)
            .await?
            .into_iter()
            .filter_map(|(k, v)| Some((k.strip_prefix(&prefix)?.to_owned(), v)))
            .collect())
    }

    async fn placed_by_id(&self, id: &str) -> Result<Option<Placed>> {
        let Some(bytes) = self.etcd.get(&self.key("placed", id)).await? else { return Ok(None) };
        let record: SandboxRecord = parse(&bytes)?;
        let alive = self.etcd.get(&self.key("live", id)).await?.is_some();
        let reported_lost = self.etcd.get(&self.key("lost", id)).await?.is_some();
        Ok(Some(Placed { record, alive, reported_lost }))
    }
}

fn parse<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| Error::internal(format!("a cluster record does not read: {e}")))
}

fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

#[async_trait::async_trait]
impl Coordinator for EtcdCoordinator {
    async fn lease(&self, ttl: Duration) -> Result<Lease> {
        Ok(Lease(self.etcd.grant(ttl).await?))
    }

    async fn renew(&self, lease: Lease) -> Result<bool> {
        Ok(self.etcd.keep_alive(lease.0).await? > 0)
    }

    async fn announce(&self, lease: Lease, node: &NodeRecord) -> Result<()> {
        self.etcd.put(&self.key("nodes", &node.name), &json(node), Some(lease.0)).await
    }

    async fn nodes(&self) -> Result<Vec<NodeRecord>> {
        self.ids("nodes").await?.values().map(|v| parse(v)).collect()
    }

    async fn publish(&self, lease: Lease, sandbox: &SandboxRecord) -> Result<()> {
        self.etcd.put(&self.key("placed", &sandbox.id), &json(sandbox), None).await?;
        self.etcd.put(&self.key("live", &sandbox.id), sandbox.node.as_bytes(), Some(lease.0)).await?;
        if let Some(name) = &sandbox.name {
            self.etcd.put(&self.key("names", name), sandbox.id.as_bytes(), Some(lease.0)).await?;
            self.etcd.put(&self.key("known", name), sandbox.id.as_bytes(), None).await?;
        }
        // Back under a lease: no longer lost.
        self.etcd.delete(&self.key("lost", &sandbox.id)).await
    }

    async fn withdraw(&self, sandbox: &SandboxRecord) -> Result<()> {
        if let Some(name) = &sandbox.name {
            // Only the name's own entry: another sandbox may have taken the name since.
            for index in ["names", "known"] {
                if self.etcd.get(&self.key(index, name)).await?.as_deref() == Some(sandbox.id.as_bytes()) {
                    self.etcd.delete(&self.key(index, name)).await?;
                }
            }
        }
        self.etcd.delete(&self.key("live", &sandbox.id)).await?;
        self.etcd.delete(&self.key("lost", &sandbox.id)).await?;
        self.etcd.delete(&self.key("placed", &sandbox.id)).await
    }

    async fn placed(&self) -> Result<Vec<Placed>> {
        let placed = self.ids("placed").await?;
        let live: BTreeSet<String> = self.ids("live").await?.into_keys().collect();
        let lost: BTreeSet<String> = self.ids("lost").await?.into_keys().collect();
        placed
            .iter()
            .map(|(id, v)| {
                Ok(Placed { record: parse(v)?, alive: live.contains(id), reported_lost: lost.contains(id) })
            })
            .collect()
    }

    async fn find(&self, key: &str) -> Result<Option<Placed>> {
        if let Some(found) = self.placed_by_id(key).await? {
            return Ok(Some(found));
        }
        if let Some(id) = self.etcd.get(&self.key("names", key)).await? {
            if let Some(found) = self.placed_by_id(&String::from_utf8_lossy(&id)).await? {
                return Ok(Some(found));
            }
        }
        // A lost sandbox's name went with its owner's lease; the index under
        // no lease keeps it. (Point reads only: a key no sandbox has, which
        // any client can name to a router, costs three, never a scan.)
        match self.etcd.get(&self.key("known", key)).await? {
            Some(id) => self.placed_by_id(&String::from_utf8_lossy(&id)).await,
            None => Ok(None),
        }
    }

    async fn report_lost(&self, id: &str) -> Result<bool> {
        self.etcd.put_if_absent(&self.key("lost", id), b"", None).await
    }

    async fn claim_name(&self, lease: Lease, name: &str, node: &str) -> Result<bool> {
        self.etcd.put_if_absent(&self.key("names", name), claim(node).as_bytes(), Some(lease.0)).await
    }

    async fn release_name(&self, name: &str, node: &str) -> Result<()> {
        let key = self.key("names", name);
        if self.etcd.get(&key).await?.as_deref() == Some(claim(node).as_bytes()) {
            self.etcd.delete(&key).await?;
        }
        Ok(())
    }

    async fn revoked(&self) -> Result<Option<Vec<u8>>> {
        self.etcd.get(&format!("{}revoked", self.prefix)).await
    }

    async fn put_revoked(&self, signed: &[u8]) -> Result<()> {
        self.etcd.put(&format!("{}revoked", self.prefix), signed, None).await
    }
}

/// What `names/NAME` holds while a fork of that name is under way on `node`
/// (its sandbox's id once published).
fn claim(node: &str) -> String {
    format!("claimed-by:{node}")
}
