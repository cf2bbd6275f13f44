//! The service's own state: targets (with their admin DSNs) in SQLite (WAL),
//! in a file readable by the daemon's user alone.

use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension, Row};

use airlock_core::clock::Timestamp;
use airlock_core::error::Result;

use super::grant::Grant;
use super::target::{Checks, Target};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS targets (
    name TEXT PRIMARY KEY,
    dsn TEXT NOT NULL,
    added_at INTEGER NOT NULL,
    checks TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS grants (
    id TEXT PRIMARY KEY,
    target TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    ending INTEGER NOT NULL DEFAULT 0,
    body TEXT NOT NULL
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
        // The credential a grant's executor connects with (the router's, not
        // the role's); a store from before it had none.
        if let Err(e) = conn.execute("ALTER TABLE grants ADD COLUMN password TEXT", []) {
            if !e.to_string().contains("duplicate column") {
                return Err(e.into());
            }
        }
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

impl Store {
    /// Records a live grant, with the password its DSN carries (the router's,
    /// which its executor connects with; the role's own is in its route only).
    pub fn add_grant(&self, grant: &Grant, password: &str) -> Result<()> {
        self.conn.execute(
            "INSERT INTO grants (id, target, expires_at, body, password) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                grant.id,
                grant.target,
                grant.expires_at.0,
                serde_json::to_string(grant).expect("a grant serializes"),
                password
            ],
        )?;
        Ok(())
    }

    /// The password a live grant's DSN carries, for its executor.
    pub fn grant_password(&self, id: &str) -> Result<Option<String>> {
        Ok(self
            .conn
            .query_row("SELECT password FROM grants WHERE id = ?1 AND ending = 0", [id], |r| r.get(0))
            .optional()?
            .flatten())
    }

    /// Every live grant, oldest first.
    pub fn grants(&self) -> Result<Vec<Grant>> {
        self.grants_where("1 = 1", [])
    }

    /// Grants past their expiry, and grants whose ending did not finish.
    pub fn grants_to_end(&self, now: Timestamp) -> Result<Vec<(Grant, bool)>> {
        let mut stmt =
            self.conn.prepare("SELECT body, ending FROM grants WHERE expires_at <= ?1 OR ending = 1")?;
        let rows = stmt.query_map([now.0], |r| Ok((r.get::<_, String>(0)?, r.get::<_, bool>(1)?)))?;
        let mut out = Vec::new();
        for row in rows {
            let (text, ending) = row?;
            out.push((grant_of(&text)?, ending));
        }
        Ok(out)
    }

    /// The roles of every grant on record, those being ended included.
    pub fn all_grant_roles(&self) -> Result<Vec<String>> {
        let mut stmt = self.conn.prepare("SELECT body FROM grants")?;
        let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
        let mut out = Vec::new();
        for row in rows {
            out.push(grant_of(&row?)?.role);
        }
        Ok(out)
    }

    /// Every grant on record on `target`, those being ended included.
    pub fn grants_of_target(&self, target: &str) -> Result<Vec<Grant>> {
        let mut stmt = self.conn.prepare("SELECT body FROM grants WHERE target = ?1")?;
        let rows = stmt.query_map([target], |r| r.get::<_, String>(0))?;
        let mut out = Vec::new();
        for row in rows {
            out.push(grant_of(&row?)?);
        }
        Ok(out)
    }

    /// This data root's own mark on targets: random, made once, so that two
    /// Airlocks on one target (two hosts with the same data root path) never
    /// take each other's grants for orphans.
    pub fn mark(&self) -> Result<String> {
        self.conn
            .execute_batch("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")?;
        let made = airlock_core::secret::hex(&airlock_core::secret::random_bytes::<6>());
        self.conn
            .execute("INSERT INTO meta (key, value) VALUES ('mark', ?1) ON CONFLICT DO NOTHING", [made])?;
        Ok(self.conn.query_row("SELECT value FROM meta WHERE key = 'mark'", [], |r| r.get(0))?)
    }

    /// One live grant.
    pub fn grant(&self, id: &str) -> Result<Option<Grant>> {
        Ok(self.grants_where("id = ?1", [id])?.pop())
    }

    /// Marks a grant as being ended (its route is gone).
    pub fn mark_ending(&self, id: &str) -> Result<()> {
        self.conn.execute("UPDATE grants SET ending = 1 WHERE id = ?1", [id])?;
        Ok(())
    }

    /// Forgets an ended grant.
    pub fn remove_grant(&self, id: &str) -> Result<()> {
        self.conn.execute("DELETE FROM grants WHERE id = ?1", [id])?;
        Ok(())
    }

    fn grants_where<P: rusqlite::Params>(&self, filter: &str, params: P) -> Result<Vec<Grant>> {
        let mut stmt = self
            .conn
            .prepare(&format!("SELECT body FROM grants WHERE {filter} AND ending = 0 ORDER BY rowid"))?;
        let rows = stmt.query_map(params, |r| r.get::<_, String>(0))?;
        let mut out = Vec::new();
        for row in rows {
            out.push(grant_of(&row?)?);
        }
        Ok(out)
    }
}

fn grant_of(text: &str) -> Result<Grant> {
    serde_json::from_str(text)
        .map_err(|e| airlock_core::error::Error::internal(format!("a grant's record does not parse: {e}")))
}

fn target_of(row: &Row) -> rusqlite::Result<Target> {
    let checks: String = row.get(2)?;
    Ok(Target {
        name: row.get(0)?,
        added_at: Timestamp(row.get(1)?),
        checks: serde_json::from_str::<Checks>(&checks).unwrap_or_default(),
    })
}
