//! Errors with stable codes, mapped once to HTTP statuses and CLI exit codes.
//!
//! Every failure a user can see carries an [`ErrorCode`] (a stable snake_case
//! string scripts can match on), a message saying what was wrong, and a hint
//! saying how to fix it. The daemon sends them as JSON; the CLI turns the code
//! back into an exit code (see `docs/CLI.md`).

use serde::{Deserialize, Serialize};

/// The stable, documented kinds of failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The request itself was malformed (bad JSON, missing field, bad combination).
    InvalidRequest,
    /// An agent tool's arguments, as a model sent them, are not what the tool
    /// takes (an unknown or missing argument, a wrong type, a table that does
    /// not exist). The tools answer it as a tool error result, which the model
    /// reads, in REST and MCP alike; it is never raised to the harness.
    InvalidArguments,
    /// A name (golden or sandbox) does not match the allowed pattern.
    InvalidName,
    /// A TTL of zero, negative, unparsable or above the configured maximum.
    InvalidTtl,
    /// A label not of the form `key=value` with an allowed key.
    InvalidLabel,
    /// No golden of that name.
    GoldenNotFound,
    /// No live sandbox with that id or name.
    SandboxNotFound,
    /// A golden of that name exists already.
    GoldenExists,
    /// A live sandbox already has that name.
    NameTaken,
    /// The golden still has sandboxes and `--force` was not given.
    GoldenInUse,
    /// `max_sandboxes` is reached.
    CapacityExhausted,
    /// A schema or seed file failed; the message names file, line and PostgreSQL's error.
    SeedFailed,
    /// Copying from a live database or a dump failed.
    SourceFailed,
    /// The source uses an extension this host's PostgreSQL lacks.
    ExtensionMissing,
    /// A golden built from a source differs from it beyond what was asked.
    FidelityFailed,
    /// The PostgreSQL major version asked for (or a golden's) is not installed
    /// on this host, or cannot be.
    PostgresMissing,
    /// A file named in the request cannot be read.
    FileUnreadable,
    /// The data root cannot be created or written.
    DataRootNotWritable,
    /// Preparing copy-on-write storage failed or was refused.
    StorageFailed,
    /// A PostgreSQL instance failed to start or answer.
    PostgresFailed,
    /// A Redis server failed to start or answer, or the host has none.
    RedisFailed,
    /// The API needs a bearer token and none (or a wrong one) was given.
    Unauthorized,
    /// The CLI could not reach or start a daemon.
    DaemonUnreachable,
    /// `migrate promote` refused: the file changed, its test failed, or the target drifted.
    MigrationRefused,
    /// A migration failed on the target; the message says what was kept.
    MigrationFailed,
    /// `promote` refused: the sandbox carries settings or objects that could
    /// steer other sessions, and keeping them was not asked for.
    PromotionRefused,
    /// The volume (or the sandbox's own allowance) is full: the operation did
    /// not happen, and the message says what state was kept.
    DiskFull,
    /// The audit log could not be written, so the operation that needed its
    /// record (a fork, a credential, a tool call's answer) did not happen.
    AuditUnavailable,
    /// `audit verify` found the log altered, cut short or out of order.
    AuditBroken,
    /// The request ran past its deadline; the message says what became of
    /// the work.
    TimedOut,
    /// No live target of that name.
    TargetNotFound,
    /// A live target of that name exists already.
    TargetExists,
    /// A live target cannot be reached with its DSN, or its role cannot do
    /// what grants need (create roles, create a schema, grant); the message
    /// says which.
    TargetRefused,
    /// No live grant of that id (it may have ended).
    GrantNotFound,
    /// A masking rule or subset cannot apply to the source as it is: a column
    /// that is not there, a transformer that does not fit its type or its
    /// constraints, a condition that does not run. Nothing was built.
    MaskInvalid,
    /// A column the scan calls sensitive has no masking rule; the message names
    /// it. Nothing was built.
    MaskUnmasked,
    /// The leak check found a source value of a masked column in the golden;
    /// the message names where (never the value). Nothing was built.
    MaskLeak,
    /// The cluster cannot be relied on for this: the node has lost touch with
    /// etcd (it takes no new work on stale state), or no node can take it.
    ClusterUnavailable,
    /// The sandbox's node stopped renewing its lease: the sandbox is `lost`
    /// until that node returns and reconciles.
    SandboxLost,
    /// A golden generation copied from another node did not arrive whole: a
    /// file's bytes did not match its recorded hash, or the stream was cut,
    /// every try. Nothing was kept.
    ReplicationFailed,
    /// Anything else: a bug or an unexpected host condition.
    Internal,
}

impl ErrorCode {
    /// The HTTP status the REST API answers with.
    pub fn http_status(self) -> u16 {
        use ErrorCode::*;
        match self {
            InvalidRequest | InvalidArguments | InvalidName | InvalidTtl | InvalidLabel | FileUnreadable => {
                400
            }
            Unauthorized => 401,
            GoldenNotFound | SandboxNotFound | TargetNotFound | GrantNotFound => 404,
            GoldenExists | NameTaken | GoldenInUse | MigrationRefused | PromotionRefused | TargetExists => {
                409
            }
            SeedFailed | SourceFailed | ExtensionMissing | FidelityFailed | PostgresMissing
            | MigrationFailed | TargetRefused | MaskInvalid | MaskUnmasked | MaskLeak => 422,
            CapacityExhausted | AuditUnavailable | ClusterUnavailable | SandboxLost => 503,
            ReplicationFailed => 502,
            AuditBroken => 409,
            DiskFull => 507,
            TimedOut => 504,
            DataRootNotWritable | StorageFailed | PostgresFailed | RedisFailed | DaemonUnreachable
            | Internal => 500,
        }
    }

    /// The process exit code the CLI ends with (documented in `docs/CLI.md`).
    pub fn exit_code(self) -> i32 {
        use ErrorCode::*;
        match self {
            Internal => 1,
            InvalidRequest | InvalidArguments | InvalidName | InvalidTtl | InvalidLabel | FileUnreadable => 3,
            GoldenNotFound | SandboxNotFound | TargetNotFound | GrantNotFound => 4,
            GoldenExists | NameTaken | GoldenInUse | TargetExists => 5,
            CapacityExhausted => 6,
            SeedFailed | SourceFailed | ExtensionMissing | FidelityFailed | PostgresMissing => 7,
            DataRootNotWritable | StorageFailed | PostgresFailed | RedisFailed => 8,
            Unauthorized | DaemonUnreachable => 9,
            MigrationRefused | PromotionRefused => 10,
            MigrationFailed => 11,
            DiskFull => 13,
            AuditUnavailable => 14,
            AuditBroken => 15,
            TimedOut => 16,
            TargetRefused => 17,
            MaskInvalid | MaskUnmasked | MaskLeak => 18,
            ClusterUnavailable | SandboxLost | ReplicationFailed => 19,
        }
    }

    /// The snake_case string form, as sent on the wire.
    pub fn as_str(self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_else(|| "internal".into())
    }
}

/// A failure with a stable code, a message and a hint.
#[derive(Debug, Clone, thiserror::Error, Serialize, Deserialize, utoipa::ToSchema)]
#[error("{message}")]
pub struct Error {
    /// What kind of failure this is.
    pub code: ErrorCode,
    /// What was wrong, in a sentence.
    pub message: String,
    /// How to fix it.
    pub hint: String,
}

impl Error {
    /// Makes an error from its three parts.
    pub fn new(code: ErrorCode, message: impl Into<String>, hint: impl Into<String>) -> Self {
        Error { code, message: message.into(), hint: hint.into() }
    }

    /// An unexpected failure; the hint points at the daemon log.
    pub fn internal(message: impl Into<String>) -> Self {
        Error::new(
            ErrorCode::Internal,
            message,
            "this is unexpected; the daemon log ($AIRLOCK_HOME/daemon.log) has details",
        )
    }

    /// A full volume or allowance, with what was kept said in `message`.
    pub fn disk_full(message: impl Into<String>) -> Self {
        Error::new(
            ErrorCode::DiskFull,
            message,
            "free space on the volume (delete sandboxes, `airlock ls` shows them) or raise the limit, then try again",
        )
    }

    /// An I/O failure while doing `what`: `disk_full` when the disk or quota ran
    /// out, else `internal`.
    pub fn io(what: impl std::fmt::Display, e: &std::io::Error) -> Self {
        if is_disk_full(e) {
            Error::disk_full(format!("{what} failed: the disk is full ({e})"))
        } else {
            Error::internal(format!("{what} failed: {e}"))
        }
    }

    /// A PostgreSQL instance that would not start or answer, with its log's tail:
    /// `disk_full` when the log says the disk or quota ran out.
    pub fn postgres_with_log(message: impl Into<String>, log_tail: &str) -> Self {
        let message = message.into();
        if DISK_FULL_WORDS.iter().any(|w| log_tail.contains(w)) {
            Error::disk_full(format!("{message} (the disk is full): {log_tail}"))
        } else {
            Error::postgres(format!("{message}: {log_tail}"))
        }
    }

    /// A PostgreSQL instance that would not start or answer.
    pub fn postgres(message: impl Into<String>) -> Self {
        Error::new(
            ErrorCode::PostgresFailed,
            message,
            "check `airlock doctor` and the instance log named in the message",
        )
    }
}

/// How the kernel's ENOSPC and EDQUOT read in a PostgreSQL log.
pub const DISK_FULL_WORDS: [&str; 2] = ["No space left on device", "Disk quota exceeded"];

/// Whether an I/O error is a full disk or an exhausted quota.
pub fn is_disk_full(e: &std::io::Error) -> bool {
    use nix::errno::Errno;
    matches!(e.raw_os_error(), Some(n) if n == Errno::ENOSPC as i32 || n == Errno::EDQUOT as i32)
}

/// Shorthand for results carrying an [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DiskFull) => {
                Error::disk_full(format!("the state store could not be written: the disk is full ({e})"))
            }
            _ => Error::internal(format!("state store: {e}")),
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::io("i/o", &e)
    }
}

impl From<tokio::task::JoinError> for Error {
    fn from(e: tokio::task::JoinError) -> Self {
        Error::internal(format!("background task: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_serialize_as_snake_case() {
        assert_eq!(ErrorCode::GoldenNotFound.as_str(), "golden_not_found");
        assert_eq!(ErrorCode::InvalidTtl.as_str(), "invalid_ttl");
    }

    #[test]
    fn client_errors_are_4xx_and_never_exit_zero() {
        for code in [ErrorCode::InvalidTtl, ErrorCode::InvalidLabel, ErrorCode::NameTaken] {
            assert!((400..500).contains(&code.http_status()));
            assert_ne!(code.exit_code(), 0);
        }
    }
}
