//! Airlock nodes as one cluster.
//!
//! Each daemon started with `--cluster` is a node: it joins under a lease it
//! renews ([`membership`]), announces its load and the goldens it holds, and
//! publishes where each of its sandboxes lives. Any node then answers for any
//! sandbox: a fork is placed ([`placement`]) and forwarded to the node that
//! will hold it, a sandbox's request goes to its owner, and a listing asks
//! every node. Nodes talk over mutual TLS under the cluster's CA ([`ca`],
//! [`peer`]); what they agree on goes through a [`coordinator::Coordinator`]
//! (etcd today).
//!
//! The lifecycle knows nothing of this: every node runs its own sandboxes as
//! a lone daemon would (TTLs included, which its own reaper keeps whether
//! etcd answers or not); the cluster only decides where work goes and tells
//! the others.

pub mod ca;
pub mod coordinator;
pub mod directory;
pub mod etcd;
pub mod etcd_tls;
pub mod http;
pub mod membership;
pub mod peer;
pub mod placement;
pub mod records;
pub mod replicate;
pub mod revoked;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::records::sandbox::{Sandbox, SandboxState};
use airlock_lifecycle::engine::Engine;

use coordinator::{Coordinator, Lease};
use records::{NodeRecord, Placed, SandboxRecord};

/// What `serve --cluster` starts a node with.
#[derive(Debug, Clone)]
pub struct Settings {
    /// etcd's client URLs, comma-separated.
    pub etcd: String,
    /// This node's name, unique in the cluster.
    pub node: String,
    /// Where peers reach this node's API (`HOST:PORT`), served over mutual TLS.
    pub advertise: String,
    /// Labels forks may ask for (`zone=a`).
    pub labels: BTreeMap<String, String>,
    /// How long the node's lease lives without renewal: its sandboxes are
    /// reported lost this long after it stops.
    pub lease_ttl: Duration,
}

/// A node's place in its cluster, shared by the API and the membership loop.
pub struct Cluster {
    /// This node's settings.
    pub settings: Settings,
    engine: Arc<Engine>,
    coordinator: Arc<dyn Coordinator>,
    peers: peer::Peers,
    /// What this node's peer listener serves with.
    server_config: Arc<rustls::ServerConfig>,
    /// The lease while it holds; None while the node (re)joins.
    lease: Mutex<Option<Lease>>,
    /// Whether the node is in touch with the coordinator (renewed recently).
    in_touch: AtomicBool,
    /// What this node last published of its sandboxes.
    published: Mutex<BTreeMap<String, SandboxRecord>>,
    /// Serializes publishing (the loop's and a fork's).
    publishing: tokio::sync::Mutex<()>,
    /// What the last look for lost sandboxes saw.
    lost_watch: Mutex<membership::LostWatch>,
    /// Goldens being fetched from other nodes.
    fetching: replicate::Fetching,
    /// The node certificates this node refuses (its TLS configurations check them).
    revoked: Arc<revoked::Revoked>,
}

/// Where a request for one sandbox goes.
pub enum Owner {
    /// This node holds it (or no node does, and this one answers so).
    Here,
    /// A peer holds it.
    Node(NodeRecord),
    /// Its node stopped renewing its lease.
    Lost(SandboxRecord),
}

impl Cluster {
    /// Joins the cluster: loads this node's identity, takes its lease and
    /// announces it. A node that cannot reach etcd does not start.
    pub async fn join(engine: Arc<Engine>, settings: Settings) -> Result<Arc<Cluster>> {
        airlock_core::validate::name("node", &settings.node)?;
        let identity = ca::Identity::load(&engine.layout.cluster(), &settings.node, &settings.advertise)?;
        let coordinator: Arc<dyn Coordinator> =
            Arc::new(coordinator::EtcdCoordinator::new(&settings.etcd, &engine.layout.cluster())?);
        let cluster = Arc::new(Cluster {
            peers: peer::Peers::new(identity.client_config()?),
            revoked: identity.revoked(),
            server_config: identity.server_config()?,
            settings,
            engine,
            coordinator,
            lease: Mutex::new(None),
            in_touch: AtomicBool::new(false),
            published: Mutex::new(BTreeMap::new()),
            publishing: tokio::sync::Mutex::new(()),
            lost_watch: Mutex::new(Default::default()),
            fetching: Default::default(),
        });
        let _ = airlock_core::events::NODE.set(cluster.settings.node.clone());
        if let Some(other) =
            cluster.coordinator.nodes().await?.into_iter().find(|n| n.name == cluster.settings.node)
        {
            if other.advertise != cluster.settings.advertise {
                return Err(Error::new(
                    ErrorCode::InvalidArguments,
                    format!(
                        "a node named {:?} already serves the cluster at {}",
                        other.name, other.advertise
                    ),
                    "give this node a name of its own (--node), or stop the other first",
                ));
            }
        }
        membership::rejoin(&cluster).await?;
        Ok(cluster)
    }

    /// The node certificates this node refuses.
    pub fn revoked(&self) -> Arc<revoked::Revoked> {
        self.revoked.clone()
    }

    /// The TLS settings of this node's peer listener.
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        self.server_config.clone()
    }

    /// This node's name.
    pub fn name(&self) -> &str {
        &self.settings.node
    }

    /// Refuses new work while the node is out of touch with the coordinator:
    /// it would place and name things on a view that may be stale.
    pub fn check_in_touch(&self) -> Result<()> {
        if self.in_touch.load(Ordering::SeqCst) {
            return Ok(());
        }
        Err(Error::new(
            ErrorCode::ClusterUnavailable,
            format!("node {} is out of touch with etcd and takes no new work", self.settings.node),
            "it resumes by itself once etcd answers again; meanwhile ask another node (`airlock nodes`)",
        ))
    }

    /// Every node whose lease holds, with this one as it is now.
    async fn up(&self) -> Result<Vec<NodeRecord>> {
        let mut nodes = self.coordinator.nodes().await?;
        let me = membership::describe(self);
        nodes.retain(|n| n.name != me.name);
        nodes.push(me);
        Ok(nodes)
    }

    /// The nodes that are up, and those that still own sandboxes but whose
    /// lease expired (state `lost`), by name.
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>> {
        let mut nodes = self.up().await?;
        let known: std::collections::BTreeSet<String> = nodes.iter().map(|n| n.name.clone()).collect();
        let mut lost: BTreeMap<String, NodeRecord> = BTreeMap::new();
        for placed in self.coordinator.placed().await? {
            if placed.alive || known.contains(&placed.record.node) {
                continue;
            }
            let node = lost
                .entry(placed.record.node.clone())
                .or_insert_with(|| NodeRecord::lost(&placed.record.node, placed.record.created_at));
            node.sandboxes += 1;
        }
        nodes.extend(lost.into_values());
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(nodes)
    }

    /// Where a fork goes: this node, or a peer (see [`placement`]).
    pub async fn place(&self, want: &placement::Want) -> Result<placement::Choice> {
        self.check_in_touch()?;
        // The nodes' records only: placing a fork reads no sandbox record.
        placement::choose(&self.up().await?, want, &self.settings.node)
    }

    /// Who holds the sandbox `key` (an id or a name).
    pub async fn owner(&self, key: &str) -> Result<Owner> {
        if !plausible_key(key) || self.engine.store().sandbox(key).is_ok() {
            return Ok(Owner::Here);
        }
        let Some(Placed { record, alive, .. }) = self.coordinator.find(key).await? else {
            return Ok(Owner::Here);
        };
        if record.node == self.settings.node {
            return Ok(Owner::Here);
        }
        if !alive {
            return Ok(Owner::Lost(record));
        }
        match self.coordinator.nodes().await?.into_iter().find(|n| n.name == record.node) {
            Some(node) => Ok(Owner::Node(node)),
            None => Ok(Owner::Lost(record)),
        }
    }

    /// Sends a request on to `node` (see [`peer::Peers::send`]).
    pub async fn forward(
        &self,
        node: &NodeRecord,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: bytes::Bytes,
    ) -> Result<http::Answer> {
        self.peers.send(node, method, path, content_type, body, airlock_listen::serve::API_DEADLINE).await
    }

    /// Asks every other node that is up for `path` (a `GET`), all at once;
    /// each node's answer, or why it gave none.
    pub async fn ask_others(&self, path: &str) -> Result<Vec<(NodeRecord, Result<http::Answer>)>> {
        let peers: Vec<NodeRecord> =
            self.coordinator.nodes().await?.into_iter().filter(|n| n.name != self.settings.node).collect();
        let asks = peers.iter().map(|node| {
            self.peers.send(node, "GET", path, None, bytes::Bytes::new(), Duration::from_secs(10))
        });
        let answers = futures_util::future::join_all(asks).await;
        Ok(peers.into_iter().zip(answers).collect())
    }

    /// The sandboxes every other node lists for `query`, and those of lost nodes.
    pub async fn others(&self, query: &str) -> Result<Vec<Sandbox>> {
        let path =
            if query.is_empty() { "/v1/sandboxes".to_owned() } else { format!("/v1/sandboxes?{query}") };
        let peers: Vec<NodeRecord> =
            self.coordinator.nodes().await?.into_iter().filter(|n| n.name != self.settings.node).collect();
        let asks = peers.iter().map(|node| {
            let path = path.clone();
            async move {
                let answer = self
                    .peers
                    .send(node, "GET", &path, None, bytes::Bytes::new(), Duration::from_secs(10))
                    .await?;
                if answer.status != 200 {
                    return Err(peer_error(node, &answer));
                }
                let mut list: Vec<Sandbox> = serde_json::from_slice(&answer.body).map_err(|e| {
                    Error::internal(format!("node {} listed what does not read: {e}", node.name))
                })?;
                for sb in &mut list {
                    sb.node = Some(node.name.clone());
                }
                Ok(list)
            }
        });
        let answers = futures_util::future::join_all(asks).await;
        let placed = self.coordinator.placed().await?;
        let mut all = Vec::new();
        for (node, listed) in peers.iter().zip(answers) {
            match listed {
                Ok(list) => all.extend(list),
                // A node that does not answer (dying, or cut off) is listed
                // from what it last published, until its lease says more.
                Err(e) => {
                    tracing::warn!(node = %node.name, error = %e, "a node did not answer a listing; showing what it last published");
                    all.extend(
                        placed
                            .iter()
                            .filter(|p| p.record.node == node.name)
                            .map(|p| p.record.shown_as(p.record.state)),
                    );
                }
            }
        }
        let live: std::collections::BTreeSet<String> = peers.iter().map(|n| n.name.clone()).collect();
        for placed in &placed {
            let record = &placed.record;
            if placed.alive || live.contains(&record.node) || record.node == self.settings.node {
                continue;
            }
            all.push(record.shown_as(SandboxState::Lost));
        }
        Ok(all)
    }

    /// Holds `name` for a fork this node is placing, so that no other node's
    /// fork takes it meanwhile (`name_taken` if one has).
    pub async fn claim_name(&self, name: &str) -> Result<()> {
        let lease = membership::current(self)?;
        if !self.coordinator.claim_name(lease, name, &self.settings.node).await? {
            return Err(Error::new(
                ErrorCode::NameTaken,
                format!("a sandbox named {name:?} already lives in the cluster, or is being forked"),
                "pick another name, or delete that sandbox first",
            ));
        }
        Ok(())
    }

    /// Lets go of a name this node claimed for a fork that failed.
    pub async fn release_name(&self, name: &str) {
        if let Err(e) = self.coordinator.release_name(name, &self.settings.node).await {
            tracing::warn!(name, error = %e, "a claimed sandbox name could not be released; it goes with the lease");
        }
    }

    /// Says what this node is and holds now, between rounds.
    pub async fn announce_now(&self) -> Result<()> {
        membership::announce_now(self).await
    }

    /// Publishes this node's sandboxes now (a fork does before it answers, so
    /// any node finds the new sandbox at once).
    pub async fn publish_now(&self) -> Result<()> {
        membership::sync(self, false).await
    }
}

/// Whether `key` could be a sandbox's id or name. A key no id or name could
/// be (a `/` would reach other records' keys) is never looked up in the
/// coordinator.
pub fn plausible_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 200
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The error a peer answered with, as this node answers it.
pub fn peer_error(node: &NodeRecord, answer: &http::Answer) -> Error {
    serde_json::from_slice::<Error>(&answer.body).unwrap_or_else(|_| {
        Error::new(
            ErrorCode::ClusterUnavailable,
            format!(
                "node {} answered {}: {}",
                node.name,
                answer.status,
                String::from_utf8_lossy(&answer.body).trim()
            ),
            "see that node's daemon log",
        )
    })
}
