//! What a migration test is asked: the candidates, each a SQL file or a
//! command with the files it runs, and the test's settings.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::PathBuf;

use crate::*;

/// Most candidates in one run.
pub const MAX_CANDIDATES: usize = 32;

/// One candidate migration.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Candidate {
    /// How it is named in the report (a file name, say).
    pub name: String,
    /// Its SQL text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sql: Option<String>,
    /// Or a command run inside the fork's boundary with `DATABASE_URL` set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<String>,
    /// The migration files a command runs (`--exec-files`), each with its
    /// SHA-256: part of the candidate's hash, so a changed file is a changed candidate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exec_files: Vec<HashedFile>,
}

/// A file a command candidate runs, by path and content hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HashedFile {
    /// Its path as given.
    pub path: String,
    /// SHA-256 of its bytes.
    pub sha256: String,
}

impl HashedFile {
    /// Hashes `bytes` read from `path`.
    pub fn new(path: String, bytes: &[u8]) -> HashedFile {
        HashedFile { path, sha256: airlock_core::secret::hex(&Sha256::digest(bytes)) }
    }
}

impl Candidate {
    /// SHA-256 of what will be applied: the file's bytes, or the command and
    /// the files it runs (each by path and content, in path order).
    pub fn sha256(&self) -> String {
        if let (None, Some(cmd)) = (&self.sql, &self.exec) {
            if !self.exec_files.is_empty() {
                let mut files = self.exec_files.clone();
                files.sort_by(|a, b| a.path.cmp(&b.path));
                let mut h = Sha256::new();
                h.update(cmd.as_bytes());
                for f in &files {
                    h.update(b"\0");
                    h.update(f.path.as_bytes());
                    h.update(b"\0");
                    h.update(f.sha256.as_bytes());
                }
                return airlock_core::secret::hex(&h.finalize());
            }
        }
        let bytes = self.sql.as_deref().or(self.exec.as_deref()).unwrap_or_default();
        airlock_core::secret::hex(&Sha256::digest(bytes.as_bytes()))
    }
}

/// Body of `POST /v1/migrations/test`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TestRequest {
    /// The golden to test on (its current generation).
    pub golden: String,
    /// The candidates.
    pub candidates: Vec<Candidate>,
    /// Queries that must each return true, or no rows, after a candidate.
    #[serde(default)]
    pub assertions: Vec<String>,
    /// Compare the result with this golden's schema.
    #[serde(default)]
    pub expect_golden: Option<String>,
    /// Or with the schema these SQL files make (absolute paths).
    #[serde(default)]
    #[schema(value_type = Vec<String>)]
    pub expect_files: Vec<PathBuf>,
    /// Candidates run at once (default 4).
    #[serde(default)]
    pub parallel: Option<usize>,
    /// Each statement's timeout, milliseconds (default 300,000).
    #[serde(default)]
    pub statement_timeout_ms: Option<u64>,
    /// A blocking lock on a table with rows estimated to be held longer than
    /// this (at production size when production statistics are given) is a
    /// hazard, milliseconds (default 1,000).
    #[serde(default)]
    pub lock_threshold_ms: Option<u64>,
    /// Production's table sizes, for estimates at production size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub production_stats: Option<scale::ProductionStats>,
    /// The application's queries, planned before and after each candidate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub app_queries: Vec<String>,
    /// A workload run beside each candidate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<app::WorkloadSpec>,
    /// The sandbox whose agent asked for the test (the `test_migration` tool),
    /// named in the test's audit record; never taken from a request body.
    #[serde(skip)]
    #[schema(ignore)]
    pub on_behalf_of: Option<String>,
}
