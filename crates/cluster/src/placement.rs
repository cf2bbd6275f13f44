//! Where a fork goes: a node that has room and meets the request's
//! constraints, one that holds the golden first; the least loaded of them,
//! this node on a tie (a fork placed here needs no hop). A node that does not
//! hold the golden is chosen only when none that fits and has room does, and
//! some node up holds it: it fetches the golden from that node at the fork
//! ([`crate::replicate`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::records::NodeRecord;
use airlock_core::error::{Error, ErrorCode, Result};

/// What a fork asks of its node.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Want {
    /// The golden to fork.
    pub golden: String,
    /// Only this node.
    #[serde(default)]
    pub node: Option<String>,
    /// Only nodes carrying every one of these labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// The node chosen.
#[derive(Debug)]
pub enum Choice {
    /// This node.
    Here,
    /// Another node.
    Node(NodeRecord),
}

/// Chooses among `nodes` (this one, `me`, among them) for `want`.
pub fn choose(nodes: &[NodeRecord], want: &Want, me: &str) -> Result<Choice> {
    let mut fit: Vec<&NodeRecord> = nodes.iter().filter(|n| n.state == "up").collect();
    if let Some(name) = &want.node {
        fit.retain(|n| &n.name == name);
        if fit.is_empty() {
            return Err(Error::new(
                ErrorCode::ClusterUnavailable,
                format!("node {name:?} is not up in the cluster"),
                "`airlock nodes` lists the nodes and their state",
            ));
        }
    }
    fit.retain(|n| want.labels.iter().all(|(k, v)| n.labels.get(k) == Some(v)));
    if fit.is_empty() {
        return Err(Error::new(
            ErrorCode::ClusterUnavailable,
            format!("no node up carries the labels {}", shown(&want.labels)),
            "`airlock nodes` lists each node's labels (serve --node-label KEY=VALUE sets them)",
        ));
    }
    let golden = want.golden.split('@').next().unwrap_or(&want.golden);
    if !nodes.iter().any(|n| n.state == "up" && n.holds(golden, None)) {
        return Err(Error::new(
            ErrorCode::GoldenNotFound,
            format!("no node up holds golden {golden:?}"),
            "build it on one node (`airlock golden create`); the others fetch it when a fork needs it",
        ));
    }
    // Holders with room first; any fitting node (which fetches the golden) else.
    if fit.iter().any(|n| n.holds(golden, None) && n.has_room()) {
        fit.retain(|n| n.holds(golden, None));
    }
    let with_room: Vec<&NodeRecord> = fit.iter().copied().filter(|n| n.has_room()).collect();
    if with_room.is_empty() {
        // Every node is full: here, if it fits, the fork queues or fails as a lone daemon's would.
        if fit.iter().any(|n| n.name == me) {
            return Ok(Choice::Here);
        }
        return Err(Error::new(
            ErrorCode::CapacityExhausted,
            format!("every node that can fork {golden:?} is full"),
            "delete sandboxes, or add a node (docs/CLUSTER.md)",
        ));
    }
    let load = |n: &NodeRecord| {
        (n.sandboxes as f64 / n.max_sandboxes.max(1) as f64, n.running as f64 / n.max_running.max(1) as f64)
    };
    let best = with_room
        .into_iter()
        .min_by(|a, b| {
            let (la, lb) = (load(a), load(b));
            la.partial_cmp(&lb)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then((a.name != me).cmp(&(b.name != me)))
                .then(a.name.cmp(&b.name))
        })
        .expect("with_room is not empty");
    Ok(if best.name == me { Choice::Here } else { Choice::Node(best.clone()) })
}

fn shown(labels: &BTreeMap<String, String>) -> String {
    labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, sandboxes: u64, max: u64, zone: &str, goldens: &[&str]) -> NodeRecord {
        NodeRecord {
            name: name.into(),
            state: "up".into(),
            advertise: format!("10.0.0.{}:7440", name.len()),
            router: None,
            relay: None,
            labels: [("zone".to_string(), zone.to_string())].into(),
            running: sandboxes,
            sandboxes,
            max_sandboxes: max,
            max_running: max,
            free_memory_bytes: 0,
            free_disk_bytes: 0,
            goldens: goldens.iter().map(|g| (g.to_string(), vec![1])).collect(),
            version: String::new(),
            updated_at: airlock_core::clock::Timestamp(0),
        }
    }

    fn chosen(c: Choice) -> String {
        match c {
            Choice::Here => "here".into(),
            Choice::Node(n) => n.name,
        }
    }

    #[test]
    fn a_full_node_sends_forks_to_one_with_room_that_holds_the_golden() {
        let nodes =
            [node("a", 2, 2, "x", &["shop"]), node("b", 1, 4, "y", &["shop"]), node("c", 0, 4, "y", &[])];
        let want = Want { golden: "shop".into(), ..Default::default() };
        assert_eq!(chosen(choose(&nodes, &want, "a").unwrap()), "b");
        // Ties go to the node asked, which needs no hop.
        let nodes = [node("a", 1, 4, "x", &["shop"]), node("b", 1, 4, "y", &["shop"])];
        assert_eq!(chosen(choose(&nodes, &want, "b").unwrap()), "here");
    }

    #[test]
    fn node_and_label_constraints_are_kept_or_refused_clearly() {
        let nodes = [node("a", 0, 4, "x", &["shop"]), node("b", 3, 4, "y", &["shop"])];
        let want = Want { golden: "shop".into(), labels: [("zone".into(), "y".into())].into(), node: None };
        assert_eq!(chosen(choose(&nodes, &want, "a").unwrap()), "b");
        let want = Want { golden: "shop".into(), node: Some("b".into()), ..Default::default() };
        assert_eq!(chosen(choose(&nodes, &want, "a").unwrap()), "b");
        let want = Want { golden: "shop".into(), node: Some("z".into()), ..Default::default() };
        assert_eq!(choose(&nodes, &want, "a").unwrap_err().code, ErrorCode::ClusterUnavailable);
        let want = Want { golden: "crm".into(), ..Default::default() };
        assert_eq!(choose(&nodes, &want, "a").unwrap_err().code, ErrorCode::GoldenNotFound);
        let full = [node("a", 4, 4, "x", &["shop"]), node("b", 4, 4, "y", &["shop"])];
        let want = Want { golden: "shop".into(), ..Default::default() };
        assert_eq!(chosen(choose(&full, &want, "a").unwrap()), "here");
        assert_eq!(choose(&full, &want, "c").unwrap_err().code, ErrorCode::CapacityExhausted);
    }

    #[test]
    fn a_node_without_the_golden_is_chosen_only_when_no_holder_fits_with_room() {
        let want = |node: Option<&str>| Want {
            golden: "shop".into(),
            node: node.map(Into::into),
            ..Default::default()
        };
        // c is the least loaded, but a holds the golden and has room.
        let nodes = [node("a", 2, 4, "x", &["shop"]), node("c", 0, 4, "y", &[])];
        assert_eq!(chosen(choose(&nodes, &want(None), "a").unwrap()), "here");
        // Asked for c, which fetches it from a at the fork.
        assert_eq!(chosen(choose(&nodes, &want(Some("c")), "a").unwrap()), "c");
        // The only holder is full: c takes it.
        let nodes = [node("a", 4, 4, "x", &["shop"]), node("c", 0, 4, "y", &[])];
        assert_eq!(chosen(choose(&nodes, &want(None), "a").unwrap()), "c");
        // No node up holds it: nothing to fetch.
        let mut lost = node("a", 0, 4, "x", &["shop"]);
        lost.state = "lost".into();
        let nodes = [lost, node("c", 0, 4, "y", &[])];
        assert_eq!(choose(&nodes, &want(None), "c").unwrap_err().code, ErrorCode::GoldenNotFound);
    }
}
