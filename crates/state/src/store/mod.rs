//! The daemon's embedded state: goldens, generations, sandboxes and events in SQLite (WAL).
//!
//! Calls are short and synchronous; the daemon wraps the store in a mutex, which
//! also makes check-then-insert steps (capacity, unique names) atomic.

use std::collections::BTreeMap;
use std::path::Path;

use rusqlite::{params, Connection, Row};

use crate::golden::{Golden, Manifest, Source};
use airlock_core::clock::Timestamp;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::events::{Door, Event, Journal, JournalEntry, NewEvent};
use airlock_core::records::sandbox::{Sandbox, SandboxState};

mod events;
mod goldens;
mod sandboxes;
#[cfg(test)]
mod tests;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS goldens (
    name TEXT PRIMARY KEY,
    current_generation INTEGER NOT NULL,
    source TEXT NOT NULL,
    pool_size INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS generations (
    golden TEXT NOT NULL REFERENCES goldens(name) ON DELETE CASCADE,
    generation INTEGER NOT NULL,
    manifest TEXT NOT NULL,
    PRIMARY KEY (golden, generation)
);
CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT PRIMARY KEY,
    name TEXT UNIQUE,
    golden TEXT NOT NULL,
    generation INTEGER NOT NULL,
    state TEXT NOT NULL,
    labels TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    pid INTEGER,
    dsn TEXT,
    access TEXT NOT NULL DEFAULT '{}',
    slot INTEGER,
    idle_suspend INTEGER NOT NULL DEFAULT 0,
    os_uid INTEGER
);
CREATE INDEX IF NOT EXISTS sandboxes_expiry ON sandboxes(expires_at);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at INTEGER NOT NULL,
    kind TEXT NOT NULL,
    sandbox TEXT,
    golden TEXT,
    reason TEXT,
    detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_sandbox ON events(sandbox);
CREATE TABLE IF NOT EXISTS mcp_tokens (
    hash TEXT PRIMARY KEY,
    sandbox TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS mcp_tokens_sandbox ON mcp_tokens(sandbox);
";

/// The open state database.
pub struct Store {
    conn: Connection,
    /// Where every event is written before it is kept here (the audit log).
    journal: Option<std::sync::Arc<dyn Journal>>,
}

/// An event as the audit completeness check sees it.
#[derive(Debug, Clone)]
pub struct AuditedEvent {
    /// The event's id in the store.
    pub id: i64,
    /// Its kind, as stored.
    pub kind: String,
    /// The sandbox concerned, if any.
    pub sandbox: Option<String>,
    /// The sequence number of its audit record; `None` when it got none.
    pub audit_seq: Option<u64>,
}

/// Filters for listing sandboxes.
#[derive(Debug, Default, Clone)]
pub struct SandboxFilter {
    /// Include warm-pool members (never shown to users).
    pub pooled: bool,
    /// Only sandboxes of this golden.
    pub golden: Option<String>,
    /// Only sandboxes carrying every one of these labels.
    pub labels: BTreeMap<String, String>,
}

impl Store {
    /// Opens (creating if needed) the store at `path`, readable by its owner only.
    pub fn open(path: &Path) -> Result<Store> {
        let conn = Connection::open(path)?;
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        migrate(&conn)?;
        Ok(Store { conn, journal: None })
    }

    /// This store, writing every event to `journal` before keeping it.
    pub fn with_journal(mut self, journal: std::sync::Arc<dyn Journal>) -> Store {
        self.journal = Some(journal);
        self
    }
}

/// Brings a store made by an earlier version up to the current schema.
fn migrate(conn: &Connection) -> Result<()> {
    // Columns added after the first release of the schema, with their definitions.
    for (table, column, definition) in [
        ("sandboxes", "access", "TEXT NOT NULL DEFAULT '{}'"),
        ("sandboxes", "slot", "INTEGER"),
        ("goldens", "pool_size", "INTEGER NOT NULL DEFAULT 0"),
        ("sandboxes", "idle_suspend", "INTEGER NOT NULL DEFAULT 0"),
        ("sandboxes", "os_uid", "INTEGER"),
        ("sandboxes", "verifier", "TEXT"),
        ("sandboxes", "active_at", "INTEGER"),
        ("goldens", "redis_source", "TEXT"),
        ("goldens", "mask_key", "TEXT"),
        ("events", "door", "TEXT"),
        ("events", "audit_seq", "INTEGER"),
    ] {
        let present = conn
            .prepare("SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2")?
            .exists(params![table, column])?;
        if !present {
            conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {definition}"))?;
        }
    }
    Ok(())
}

fn golden_not_found(name: &str) -> Error {
    Error::new(
        ErrorCode::GoldenNotFound,
        format!("no golden named {name:?}"),
        "list goldens with `airlock golden ls`, or make one with `airlock golden create`",
    )
}

fn to_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("state values serialize")
}

fn from_json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| Error::internal(format!("state store holds bad JSON: {e}")))
}
