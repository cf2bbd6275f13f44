//! What nodes tell each other through the coordinator: each node's record,
//! and where each sandbox lives.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use airlock_core::clock::Timestamp;
use airlock_core::records::sandbox::{Sandbox, SandboxState};

/// One node, as it announces itself (under its lease) for placement and `airlock nodes`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct NodeRecord {
    /// Its name (`serve --node`).
    pub name: String,
    /// `up`, or `lost` for a node whose lease expired while it still owns sandboxes.
    #[serde(default = "up")]
    pub state: String,
    /// Where other nodes reach its API over mutual TLS (`serve --advertise`).
    pub advertise: String,
    /// Its router's PostgreSQL address, when its router is on.
    #[serde(default)]
    pub router: Option<String>,
    /// Its router's relay port (`HOST:PORT`, mutual TLS), where other nodes'
    /// routers pass on clients of its sandboxes.
    #[serde(default)]
    pub relay: Option<String>,
    /// Its labels (`serve --node-label zone=a`), which forks may ask for.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Sandboxes whose servers run.
    pub running: u64,
    /// Sandboxes it holds, running or suspended (pool members included).
    pub sandboxes: u64,
    /// `--max-sandboxes`.
    pub max_sandboxes: u64,
    /// `--max-running`.
    pub max_running: u64,
    /// Memory the host has available, in bytes.
    pub free_memory_bytes: u64,
    /// Free space on its volume, in bytes.
    pub free_disk_bytes: u64,
    /// The goldens it holds: each one's generations, the current last.
    pub goldens: BTreeMap<String, Vec<i64>>,
    /// The daemon's version.
    pub version: String,
    /// When it last said all this.
    pub updated_at: Timestamp,
}

fn up() -> String {
    "up".into()
}

impl NodeRecord {
    /// A node known only from the sandboxes it still owns: its lease expired.
    pub fn lost(name: &str, since: Timestamp) -> NodeRecord {
        NodeRecord {
            name: name.to_owned(),
            state: "lost".into(),
            advertise: String::new(),
            router: None,
            relay: None,
            labels: BTreeMap::new(),
            running: 0,
            sandboxes: 0,
            max_sandboxes: 0,
            max_running: 0,
            free_memory_bytes: 0,
            free_disk_bytes: 0,
            goldens: BTreeMap::new(),
            version: String::new(),
            updated_at: since,
        }
    }

    /// Whether it can take one more fork now.
    pub fn has_room(&self) -> bool {
        self.sandboxes < self.max_sandboxes && self.running < self.max_running
    }

    /// The generation of `golden` it holds as its current one (its list ends with it).
    pub fn current(&self, golden: &str) -> Option<i64> {
        self.goldens.get(golden).and_then(|gens| gens.last().copied())
    }

    /// Whether it holds `golden` (at `generation`, or its current one when none is asked).
    pub fn holds(&self, golden: &str, generation: Option<i64>) -> bool {
        match (self.goldens.get(golden), generation) {
            (Some(gens), Some(g)) => gens.contains(&g),
            (Some(gens), None) => !gens.is_empty(),
            (None, _) => false,
        }
    }
}

/// Where a sandbox lives, as its owner publishes it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SandboxRecord {
    /// Its id.
    pub id: String,
    /// Its name, if it has one.
    pub name: Option<String>,
    /// The node that owns it.
    pub node: String,
    /// Its golden.
    pub golden: String,
    /// Its generation.
    pub generation: i64,
    /// Its state on its owner.
    pub state: SandboxState,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// When it was made.
    pub created_at: Timestamp,
    /// When it expires (its owner deletes it then, cluster or not).
    pub expires_at: Timestamp,
}

impl SandboxRecord {
    /// The error for this sandbox while its node is lost.
    pub fn lost(&self) -> airlock_core::error::Error {
        airlock_core::error::Error::new(
            airlock_core::error::ErrorCode::SandboxLost,
            format!("sandbox {} is on node {}, which stopped renewing its cluster lease", self.id, self.node),
            "it comes back if that node does (its TTL still holds there); `airlock nodes` shows the node's state",
        )
    }

    /// The record of a sandbox `node` owns.
    pub fn of(sb: &Sandbox, node: &str) -> SandboxRecord {
        SandboxRecord {
            id: sb.id.clone(),
            name: sb.name.clone(),
            node: node.to_owned(),
            golden: sb.golden.clone(),
            generation: sb.generation,
            state: sb.state,
            labels: sb.labels.clone(),
            created_at: sb.created_at,
            expires_at: sb.expires_at,
        }
    }

    /// As a sandbox listing shows it (never with credentials), in `state`.
    pub fn shown_as(&self, state: SandboxState) -> Sandbox {
        let mut sb = Sandbox::creating(
            &self.golden,
            self.generation,
            self.name.clone(),
            self.labels.clone(),
            Default::default(),
            std::time::Duration::ZERO,
            std::time::Duration::ZERO,
        );
        sb.id = self.id.clone();
        sb.state = state;
        sb.created_at = self.created_at;
        sb.expires_at = self.expires_at;
        sb.node = Some(self.node.clone());
        sb
    }
}

/// A sandbox record with what the coordinator knows of its owner.
#[derive(Debug, Clone)]
pub struct Placed {
    /// The record its owner published.
    pub record: SandboxRecord,
    /// Whether its owner's lease still holds it.
    pub alive: bool,
    /// Whether a node has reported it lost.
    pub reported_lost: bool,
}
