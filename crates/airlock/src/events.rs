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

/// What an event records. (`Created` is the default only so that event
/// literals can fill their other fields with `..Default::default()`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A sandbox was recorded (from the pool or cold).
    #[default]
    Created,
    /// A sandbox answers; the detail has the time of each fork step.
    Ready,
    /// A sandbox's TTL was set anew.
    Extended,
    /// A sandbox is gone; `reason` says why.
    Deleted,
    /// A golden's first generation was built.
    GoldenCreated,
    /// A golden's next generation was built from its source.
    GoldenRefreshed,
    /// A golden was removed.
    GoldenDeleted,
    /// A sandbox's state became a golden generation.
    GoldenPromoted,
    /// A generation no sandbox used was removed.
    GenerationPruned,
    /// A sandbox's server died on its own.
    ServerExited,
    /// A sandbox outgrew its disk allowance.
    DiskLimitExceeded,
    /// The volume reached its free-space reserve.
    DiskReserve,
    /// A sandbox was put back to its golden.
    Reset,
    /// A sandbox's server was stopped; `reason` says why.
    Suspended,
    /// A suspended sandbox was started again.
    Woken,
    /// An agent tool ran.
    ToolCall,
    /// A client connected through the router.
    Connected,
    /// The router refused a client.
    ConnectionRefused,
    /// The watchdog cancelled or ended a backend.
    Watchdog,
    /// Candidate migrations were tested.
    MigrationTested,
    /// A tested migration was applied to a target.
    MigrationPromoted,
}

impl EventKind {
    /// The snake_case name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Created => "created",
            EventKind::Ready => "ready",
            EventKind::Extended => "extended",
            EventKind::Deleted => "deleted",
            EventKind::GoldenCreated => "golden_created",
            EventKind::GoldenRefreshed => "golden_refreshed",
            EventKind::GoldenDeleted => "golden_deleted",
            EventKind::GoldenPromoted => "golden_promoted",
            EventKind::GenerationPruned => "generation_pruned",
            EventKind::ServerExited => "server_exited",
            EventKind::DiskLimitExceeded => "disk_limit_exceeded",
            EventKind::DiskReserve => "disk_reserve",
            EventKind::Reset => "reset",
            EventKind::Suspended => "suspended",
            EventKind::Woken => "woken",
            EventKind::ToolCall => "tool_call",
            EventKind::Connected => "connected",
            EventKind::ConnectionRefused => "connection_refused",
            EventKind::Watchdog => "watchdog",
            EventKind::MigrationTested => "migration_tested",
            EventKind::MigrationPromoted => "migration_promoted",
        }
    }
}

/// One recorded event.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Event {
    /// Increasing sequence number.
    pub id: i64,
    /// When it happened.
    pub at: Timestamp,
    /// What happened (an [`EventKind`], kept as text so that records of a newer
    /// daemon still read).
    #[schema(value_type = EventKind)]
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
    pub kind: EventKind,
    /// See [`Event::sandbox`].
    pub sandbox: Option<String>,
    /// See [`Event::golden`].
    pub golden: Option<String>,
    /// See [`Event::reason`].
    pub reason: Option<&'static str>,
    /// See [`Event::detail`].
    pub detail: serde_json::Value,
}
