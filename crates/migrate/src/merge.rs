//! One report from a test run in parts: in a cluster, a test's candidates
//! are spread over the nodes that hold the golden, each node tests its share
//! ([`crate::test`]) and answers with its report, and the node asked makes
//! them one report, in the order the candidates were given, ranked as one
//! run, and sealed with its own key ([`crate::seal`]).
//!
//! The parts' reports come from members over the node-to-node TLS link, so
//! they are taken as their nodes wrote them; what each names as its row
//! records must be fetched and kept here first ([`crate::rows::keep_fetched`]),
//! so that `migrate promote`, which runs where the report was sealed, finds
//! them.

use super::hazards;
use super::report::{CandidateReport, Report};
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::layout::Layout;

/// What one node tested: the indices of its candidates in the request, and
/// its report on them (in the same order).
#[derive(Debug)]
pub struct Part {
    /// Where each of its candidates stands in the whole request.
    pub indices: Vec<usize>,
    /// The node's report.
    pub report: Report,
}

fn differs(what: &str, a: &Report, b: &Report) -> Error {
    Error::new(
        ErrorCode::ClusterUnavailable,
        format!(
            "the nodes that tested golden {:?} held different {what} (nodes {} and {})",
            a.golden,
            a.node.as_deref().unwrap_or("?"),
            b.node.as_deref().unwrap_or("?")
        ),
        "the golden changed on a node during the test (a refresh, say): test again",
    )
}

/// Makes `parts` (of a request of `total` candidates) one report, sealed here.
pub fn merge(layout: &Layout, total: usize, parts: Vec<Part>) -> Result<Report> {
    let Some(first) = parts.first().map(|p| p.report.clone()) else {
        return Err(Error::internal("a test with no part to merge"));
    };
    let mut slots: Vec<Option<CandidateReport>> = vec![None; total];
    for part in parts {
        let report = part.report;
        if report.generation != first.generation {
            return Err(differs("generations", &first, &report));
        }
        if report.rows != first.rows {
            return Err(differs("copies of its generation", &first, &report));
        }
        if report.candidates.len() != part.indices.len() {
            return Err(Error::internal(format!(
                "node {} reported {} candidates of the {} it was given",
                report.node.as_deref().unwrap_or("?"),
                report.candidates.len(),
                part.indices.len()
            )));
        }
        for (i, candidate) in part.indices.into_iter().zip(report.candidates) {
            let slot = slots.get_mut(i).ok_or_else(|| Error::internal("a part's candidate out of range"))?;
            *slot = Some(candidate);
        }
    }
    let candidates: Vec<CandidateReport> = slots.into_iter().flatten().collect();
    if candidates.len() != total {
        return Err(Error::internal(format!("{} of {total} candidates were reported", candidates.len())));
    }
    let ranking = hazards::rank(&candidates);
    let best = ranking.first().filter(|n| candidates.iter().any(|c| &c.name == *n && c.passed)).cloned();
    let mut report = Report {
        passed: candidates.iter().all(|c| c.passed),
        best,
        ranking,
        candidates,
        node: airlock_core::events::NODE.get().cloned(),
        seal: String::new(),
        ..first
    };
    super::seal::seal(layout, &mut report)?;
    Ok(report)
}
