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
    /// It outgrew its disk allowance.
    Quota,
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
            DeleteReason::Quota => "quota",
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
    /// A golden generation was copied here from another node of the cluster,
    /// every file checked against its recorded hash.
    GoldenReplicated,
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
    /// A credential was handed out: a DSN, a Redis URL or an MCP URL (the
    /// detail has its fingerprint, never the secret).
    CredentialIssued,
    /// A live target was registered (the detail has its checks, never its DSN).
    TargetAdded,
    /// A live target was forgotten.
    TargetRemoved,
    /// A grant was minted on a live target (the detail has what it may read
    /// and until when, never its credentials).
    GrantMinted,
    /// A grant ended: its role, sessions and views are gone from its target
    /// (the reason says why: expired, revoked, orphaned).
    GrantEnded,
    /// Two sandboxes were found sharing an instance, a directory, a socket or
    /// an OS user.
    Collision,
    /// Records that could not be written when their events happened (the
    /// detail says how many and why); they follow this one.
    AuditGap,
    /// A record the log found cut short (a write a crash interrupted) was
    /// closed; the detail says where.
    AuditRepaired,
    /// A sandbox's cluster node stopped renewing its lease (the detail names
    /// the node); recorded once, by the node that noticed first.
    Lost,
    /// A node back in its cluster found its sandbox again (kept running) or
    /// removed the record of one that was gone (the detail says which).
    Reconciled,
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
            EventKind::GoldenReplicated => "golden_replicated",
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
            EventKind::CredentialIssued => "credential_issued",
            EventKind::TargetAdded => "target_added",
            EventKind::TargetRemoved => "target_removed",
            EventKind::GrantMinted => "grant_minted",
            EventKind::GrantEnded => "grant_ended",
            EventKind::Collision => "collision",
            EventKind::AuditGap => "audit_gap",
            EventKind::AuditRepaired => "audit_repaired",
            EventKind::Lost => "lost",
            EventKind::Reconciled => "reconciled",
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
    /// For `deleted`: `user`, `ttl`, `orphan`, `failed`, `drained` or `quota`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Extra facts (durations, generation, expiry); never secrets.
    #[serde(default)]
    pub detail: serde_json::Value,
    /// The door it came through (`api`, `mcp_stdio`, `mcp_http`, `router`,
    /// `reaper`, `daemon`); absent on events of earlier versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub door: Option<String>,
}

/// The way into the daemon an event came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Door {
    /// The CLI or the REST API.
    Api,
    /// `airlock mcp` on stdio (which reaches the daemon through the API).
    McpStdio,
    /// The daemon's streamable HTTP MCP gateway.
    McpHttp,
    /// The PostgreSQL or Redis router.
    Router,
    /// The reaper: TTLs, idle suspends, dead servers, the watchdog.
    Reaper,
    /// Another node of the cluster, forwarding a request it was asked (over
    /// the node-to-node TLS link).
    Peer,
    /// The daemon on its own: start-up reconciliation, the pool filler.
    Daemon,
}

impl Door {
    /// The snake_case name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Door::Api => "api",
            Door::McpStdio => "mcp_stdio",
            Door::McpHttp => "mcp_http",
            Door::Router => "router",
            Door::Reaper => "reaper",
            Door::Daemon => "daemon",
            Door::Peer => "peer",
        }
    }

    /// The door of the task running now: what [`DOOR`] was scoped to, else the
    /// daemon's own.
    pub fn current() -> Door {
        DOOR.try_with(|d| *d).unwrap_or(Door::Daemon)
    }
}

tokio::task_local! {
    /// The door the work of the current task came through; the API, the MCP
    /// gateways and the reaper scope their work with it, so events deep in a
    /// lifecycle step name their door without passing it down.
    pub static DOOR: Door;
}

/// An event as the journal receives it: everything the store keeps, with the
/// door and the generation resolved.
#[derive(Debug, Clone)]
pub struct JournalEntry {
    /// When it happened.
    pub at: Timestamp,
    /// What happened.
    pub kind: EventKind,
    /// Where it came in.
    pub door: Door,
    /// The sandbox concerned, if any.
    pub sandbox: Option<String>,
    /// The golden concerned, if any.
    pub golden: Option<String>,
    /// The golden generation concerned, if known.
    pub generation: Option<i64>,
    /// Why, for deletions and suspensions.
    pub reason: Option<String>,
    /// Extra facts; never secrets.
    pub detail: serde_json::Value,
}

/// Where the record of an event was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Journaled {
    /// Its sequence number in the journal.
    pub seq: u64,
    /// Its hash (hex), which the next record carries.
    pub hash: String,
}

/// The tamper-evident record every event is written to before the store keeps
/// it (the audit log implements it; the store knows only this trait).
pub trait Journal: Send + Sync {
    /// Writes `entry`; what depends on the event may go ahead only once this
    /// returned `Ok`.
    fn append(&self, entry: &JournalEntry) -> crate::error::Result<Journaled>;
    /// Keeps an entry that could not be written, for the next write to put
    /// after a record of the gap.
    fn defer(&self, entry: JournalEntry, error: &crate::error::Error);
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
    /// The door it came through; the current task's ([`Door::current`]) if unset.
    pub door: Option<Door>,
}

/// The cluster node this daemon is, when it is one: every event it records
/// names it (`detail.node`), so a record read from any node's log says which
/// node acted. Set once, at start.
pub static NODE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Tool calls that ended, and those of them whose `tool_call` record was
/// written: a call that ends without its record (cut short, say) shows in the
/// audit's completeness. Counted for this daemon since it started.
#[derive(Debug, Default)]
pub struct ToolCalls {
    ended: std::sync::atomic::AtomicU64,
    recorded: std::sync::atomic::AtomicU64,
}

/// The daemon's count of tool calls ([`ToolCalls`]).
pub static TOOL_CALLS: ToolCalls =
    ToolCalls { ended: std::sync::atomic::AtomicU64::new(0), recorded: std::sync::atomic::AtomicU64::new(0) };

impl ToolCalls {
    /// A call begins; it counts as ended when the guard drops, whatever happens.
    pub fn begin(&'static self) -> ToolCallGuard {
        ToolCallGuard(self)
    }

    /// A call's record was written.
    pub fn recorded(&self) {
        self.recorded.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Calls that ended without their record.
    pub fn unrecorded(&self) -> u64 {
        let ended = self.ended.load(std::sync::atomic::Ordering::SeqCst);
        ended.saturating_sub(self.recorded.load(std::sync::atomic::Ordering::SeqCst))
    }
}

/// One tool call under way.
pub struct ToolCallGuard(&'static ToolCalls);

impl Drop for ToolCallGuard {
    fn drop(&mut self) {
        self.0.ended.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}
