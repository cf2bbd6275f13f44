//! The service's own state: targets (with their admin DSNs) in SQLite (WAL),
//! in a file readable by the daemon's user alone.

use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension, Row};

use airlock_core::clock::Timestamp;
use airlock_core::error::Result;

use super::target::{Checks, Target};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS targets (
    name TEXT PRIMARY KEY,
    dsn TEXT NOT NULL,
    added_at INTEGER NOT NULL,
    checks TEXT NOT NULL
);
";

/// The open store.
pub struct Store {
    conn: Connection,
}

impl Store {
    /// Opens (or makes) the store at `path`, readable by its owner alone.
    pub fn open(path: &Path) -> Result<Store> {
        let conn = Connection::open(path)?;
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        Ok(Store { conn })
    }

    /// Records a target with its admin DSN; false if the name is taken.
    pub fn add_target(&self, target: &Target, dsn: &str) -> Result<bool> {
        let added = self.conn.execute(
            "INSERT INTO targets (name, dsn, added_at, checks) VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
            params![
                target.name,
                dsn,
                target.added_at.0,
                serde_json::to_string(&target.checks).expect("checks serialize")
            ],
        )?;
        Ok(added == 1)
    }

    /// Every target, by name (never with its DSN).
    pub fn targets(&self) -> Result<Vec<Target>> {
        let mut stmt = self.conn.prepare("SELECT name, added_at, checks FROM targets ORDER BY name")?;
        let rows = stmt.query_map([], target_of)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// One target (never with its DSN).
    pub fn target(&self, name: &str) -> Result<Option<Target>> {
        Ok(self
            .conn
            .query_row("SELECT name, added_at, checks FROM targets WHERE name = ?1", [name], target_of)
            .optional()?)
    }

    /// A target's admin DSN, for the service's own connections.
    pub fn dsn(&self, name: &str) -> Result<Option<String>> {
        Ok(self.conn.query_row("SELECT dsn FROM targets WHERE name = ?1", [name], |r| r.get(0)).optional()?)
    }

    /// Forgets a target; whether it was there.
    pub fn remove_target(&self, name: &str) -> Result<bool> {
        Ok(self.conn.execute("DELETE FROM targets WHERE name = ?1", [name])? == 1)
    }
}

fn target_of(row: &Row) -> rusqlite::Result<Target> {
    let checks: String = row.get(2)?;
    Ok(Target {
        name: row.get(0)?,
        added_at: Timestamp(row.get(1)?),
        checks: serde_json::from_str::<Checks>(&checks).unwrap_or_default(),
    })
}
