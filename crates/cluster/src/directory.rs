//! Where each sandbox is, for a process of a node other than its daemon (the
//! router, which relays a client of another node's sandbox to that node's
//! router): the coordinator read directly, the nodes' records kept a moment.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airlock_core::error::{Error, ErrorCode, Result};

use crate::coordinator::{Coordinator, EtcdCoordinator};
use crate::records::{NodeRecord, Placed};

/// How long the nodes' records are kept before they are read again.
const NODES_KEPT: Duration = Duration::from_secs(2);

/// The cluster's directory, as one node sees it.
pub struct Directory {
    coordinator: Arc<dyn Coordinator>,
    node: String,
    nodes: Mutex<Option<(Instant, Vec<NodeRecord>)>>,
}

impl Directory {
    /// The directory of the coordinator at `urls` (reached with what the
    /// node keeps in `cluster_dir`), for node `node`.
    pub fn open(urls: &str, cluster_dir: &std::path::Path, node: &str) -> Result<Directory> {
        Ok(Directory::with(Arc::new(EtcdCoordinator::new(urls, cluster_dir)?), node))
    }

    /// The directory of `coordinator`, for node `node`.
    pub fn with(coordinator: Arc<dyn Coordinator>, node: &str) -> Directory {
        Directory { coordinator, node: node.to_owned(), nodes: Mutex::default() }
    }

    /// The node that holds sandbox `key` (an id or a name) and its relay
    /// port, when another node does; None when none does. A sandbox whose
    /// node is lost, or whose node's router takes no relayed clients, is an
    /// error that says so.
    pub async fn owner(&self, key: &str) -> Result<Option<(String, String)>> {
        if !crate::plausible_key(key) {
            return Ok(None);
        }
        let Some(Placed { record, alive, .. }) = self.coordinator.find(key).await? else { return Ok(None) };
        if record.node == self.node {
            return Ok(None);
        }
        if !alive {
            return Err(record.lost());
        }
        let node = match self.cached(&record.node) {
            Some(node) => node,
            None => {
                let nodes = self.coordinator.nodes().await?;
                let found = nodes.iter().find(|n| n.name == record.node).cloned();
                *self.nodes.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), nodes));
                found.ok_or_else(|| record.lost())?
            }
        };
        let relay = node.relay.ok_or_else(|| {
            Error::new(
                ErrorCode::ClusterUnavailable,
                format!(
                    "sandbox {} is on node {}, whose router takes no relayed clients",
                    record.id, node.name
                ),
                format!(
                    "connect to node {}'s router ({}) directly, or start that node with its router on",
                    node.name,
                    node.router.as_deref().unwrap_or("off")
                ),
            )
        })?;
        Ok(Some((node.name, relay)))
    }

    /// A node's record, if read within the last moment.
    fn cached(&self, name: &str) -> Option<NodeRecord> {
        let nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        let (at, nodes) = nodes.as_ref()?;
        if at.elapsed() > NODES_KEPT {
            return None;
        }
        nodes.iter().find(|n| n.name == name).cloned()
    }
}
