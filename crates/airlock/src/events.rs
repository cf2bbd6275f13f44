//! The event record: what happened to which sandbox or golden, and why.
//!
//! Events hold no secrets: never a password, a DSN or a file's contents.

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;

/// Why a sandbox was deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeleteReason {
    /// A user or client asked (`airlock rm`, `golden rm --force`).
    User,
    /// Its TTL passed.
    Ttl,
    /// The daemon found it half-made or unknown when it started.
    Orphan,
    /// Making it failed.
    Failed,
    /// A warm-pool member no longer needed (pool shrunk, new golden generation).
    Drained,
}

impl DeleteReason {
    /// The snake_case name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            DeleteReason::User => "user",
            DeleteReason::Ttl => "ttl",
            DeleteReason::Orphan => "orphan",
            DeleteReason::Failed => "failed",
            DeleteReason::Drained => "drained",
        }
    }
}

/// One recorded event.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Event {
    /// Increasing sequence number.
    pub id: i64,
    /// When it happened.
    pub at: Timestamp,
    /// `created`, `ready`, `extended`, `deleted`, `golden_created`, `golden_refreshed`,
    /// `golden_deleted`, `generation_pruned`.
    pub kind: String,
    /// The sandbox concerned, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// The golden concerned, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub golden: Option<String>,
    /// For `deleted`: `user`, `ttl`, `orphan` or `failed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Extra facts (durations, generation, expiry); never secrets.
    #[serde(default)]
    pub detail: serde_json::Value,
}

/// An event about to be recorded.
#[derive(Debug, Clone, Default)]
pub struct NewEvent {
    /// See [`Event::kind`].
    pub kind: &'static str,
    /// See [`Event::sandbox`].
    pub sandbox: Option<String>,
    /// See [`Event::golden`].
    pub golden: Option<String>,
    /// See [`Event::reason`].
    pub reason: Option<&'static str>,
    /// See [`Event::detail`].
    pub detail: serde_json::Value,
}
