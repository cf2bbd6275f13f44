//! The daemon's embedded state: goldens, generations, sandboxes and events in SQLite (WAL).
//!
//! Calls are short and synchronous; the daemon wraps the store in a mutex, which
//! also makes check-then-insert steps (capacity, unique names) atomic.

use std::collections::BTreeMap;
use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension, Row};

use crate::golden::{Golden, Manifest, Source};
use airlock_core::clock::Timestamp;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::events::{Door, Event, Journal, JournalEntry, NewEvent};
use airlock_core::records::sandbox::{Sandbox, SandboxState};

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

    // ---- goldens ----

    /// Records a new golden with its first generation.
    pub fn insert_golden(&mut self, manifest: &Manifest, source: &Source) -> Result<()> {
        let tx = self.conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        tx.execute(
            "INSERT INTO goldens (name, current_generation, source) VALUES (?1, ?2, ?3)",
            params![manifest.name, manifest.generation, to_json(source)],
        )?;
        tx.execute(
            "INSERT INTO generations (golden, generation, manifest) VALUES (?1, ?2, ?3)",
            params![manifest.name, manifest.generation, to_json(manifest)],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Records a new generation and makes it current.
    pub fn add_generation(&mut self, manifest: &Manifest) -> Result<()> {
        let tx = self.conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let present = tx.prepare("SELECT 1 FROM goldens WHERE name = ?1")?.exists([&manifest.name])?;
        if !present {
            return Err(golden_not_found(&manifest.name));
        }
        tx.execute(
            "INSERT INTO generations (golden, generation, manifest) VALUES (?1, ?2, ?3)",
            params![manifest.name, manifest.generation, to_json(manifest)],
        )?;
        tx.execute(
            "UPDATE goldens SET current_generation = ?2 WHERE name = ?1",
            params![manifest.name, manifest.generation],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// The stored source of a golden, secrets included (for refresh only).
    pub fn golden_source(&self, name: &str) -> Result<Source> {
        let text: Option<String> = self
            .conn
            .query_row("SELECT source FROM goldens WHERE name = ?1", [name], |r| r.get(0))
            .optional()?;
        match text {
            Some(t) => from_json(&t),
            None => Err(golden_not_found(name)),
        }
    }

    /// Records where a golden's Redis part comes from (a URL with its password:
    /// the store is root's alone), for refresh.
    pub fn set_redis_source(
        &mut self,
        name: &str,
        source: Option<&airlock_core::records::redis::RedisSource>,
    ) -> Result<()> {
        self.conn.execute(
            "UPDATE goldens SET redis_source = ?2 WHERE name = ?1",
            params![name, source.map(to_json)],
        )?;
        Ok(())
    }

    /// Where a golden's Redis part comes from, if it has one.
    pub fn golden_redis_source(
        &self,
        name: &str,
    ) -> Result<Option<airlock_core::records::redis::RedisSource>> {
        let text: Option<Option<String>> = self
            .conn
            .query_row("SELECT redis_source FROM goldens WHERE name = ?1", [name], |r| r.get(0))
            .optional()?;
        match text {
            Some(Some(t)) => from_json(&t).map(Some),
            Some(None) => Ok(None),
            None => Err(golden_not_found(name)),
        }
    }

    /// The manifest of one generation of a golden.
    pub fn manifest(&self, name: &str, generation: i64) -> Result<Manifest> {
        let text: Option<String> = self
            .conn
            .query_row(
                "SELECT manifest FROM generations WHERE golden = ?1 AND generation = ?2",
                params![name, generation],
                |r| r.get(0),
            )
            .optional()?;
        match text {
            Some(t) => from_json(&t),
            None => Err(golden_not_found(name)),
        }
    }

    /// The PostgreSQL major of one generation of a golden, read from its
    /// manifest in the store (forks ask for it: no whole manifest is parsed).
    pub fn generation_major(&self, name: &str, generation: i64) -> Result<u32> {
        let row: Option<(Option<i64>, Option<String>)> = self
            .conn
            .query_row(
                "SELECT json_extract(manifest, '$.postgres_major'), json_extract(manifest, '$.postgres_version')
                 FROM generations WHERE golden = ?1 AND generation = ?2",
                params![name, generation],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let (major, version) = row.ok_or_else(|| golden_not_found(name))?;
        let field = major.and_then(|m| u32::try_from(m).ok()).unwrap_or(0);
        Ok(crate::golden::recorded_major(field, version.as_deref().unwrap_or("")))
    }

    /// One golden with its generations and sandbox count.
    pub fn golden(&self, name: &str) -> Result<Golden> {
        let row: Option<(i64, String, i64)> = self
            .conn
            .query_row(
                "SELECT current_generation, source, pool_size FROM goldens WHERE name = ?1",
                [name],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let (current_generation, source, pool_size) = row.ok_or_else(|| golden_not_found(name))?;
        let source: Source = from_json(&source)?;
        let mut stmt =
            self.conn.prepare("SELECT manifest FROM generations WHERE golden = ?1 ORDER BY generation")?;
        let generations = stmt
            .query_map([name], |r| r.get::<_, String>(0))?
            .map(|t| from_json(&t?))
            .collect::<Result<Vec<Manifest>>>()?;
        let (sandboxes, pooled): (i64, i64) = self.conn.query_row(
            "SELECT count(*) FILTER (WHERE state <> 'pooled'), count(*) FILTER (WHERE state = 'pooled')
             FROM sandboxes WHERE golden = ?1",
            [name],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        Ok(Golden {
            name: name.to_owned(),
            current_generation,
            sandboxes,
            pool_size,
            pooled,
            generations,
            source: source.redacted(),
        })
    }

    /// Sets how many sandboxes a golden's warm pool keeps.
    pub fn set_pool_size(&mut self, name: &str, size: i64) -> Result<()> {
        if self.conn.execute("UPDATE goldens SET pool_size = ?2 WHERE name = ?1", params![name, size])? == 0 {
            return Err(golden_not_found(name));
        }
        Ok(())
    }

    /// Every golden, by name.
    pub fn goldens(&self) -> Result<Vec<Golden>> {
        let names: Vec<String> = self
            .conn
            .prepare("SELECT name FROM goldens ORDER BY name")?
            .query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        names.iter().map(|n| self.golden(n)).collect()
    }

    /// Generations of a golden that some sandbox still uses.
    pub fn generations_in_use(&self, name: &str) -> Result<Vec<i64>> {
        let mut stmt = self.conn.prepare("SELECT DISTINCT generation FROM sandboxes WHERE golden = ?1")?;
        let rows = stmt.query_map([name], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    /// Forgets a generation just added, making the newest left current again
    /// (a refresh or promotion that could not go on record).
    pub fn undo_generation(&mut self, name: &str, generation: i64) -> Result<()> {
        let tx = self.conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        tx.execute(
            "DELETE FROM generations WHERE golden = ?1 AND generation = ?2",
            params![name, generation],
        )?;
        tx.execute(
            "UPDATE goldens SET current_generation = (SELECT max(generation) FROM generations WHERE golden = ?1) WHERE name = ?1",
            [name],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Forgets one generation.
    pub fn delete_generation(&mut self, name: &str, generation: i64) -> Result<()> {
        self.conn.execute(
            "DELETE FROM generations WHERE golden = ?1 AND generation = ?2",
            params![name, generation],
        )?;
        Ok(())
    }

    /// Forgets a golden and all its generations.
    pub fn delete_golden(&mut self, name: &str) -> Result<()> {
        self.conn.execute("DELETE FROM goldens WHERE name = ?1", [name])?;
        Ok(())
    }

    // ---- sandboxes ----

    /// Records a sandbox in state `creating`, refusing past `max_sandboxes` or on a
    /// taken name.
    pub fn insert_sandbox(&mut self, sb: &mut Sandbox, max_sandboxes: usize) -> Result<()> {
        let tx = self.conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let count: i64 = tx.query_row("SELECT count(*) FROM sandboxes", [], |r| r.get(0))?;
        if count as usize >= max_sandboxes {
            return Err(Error::new(
                ErrorCode::CapacityExhausted,
                format!("this host already has {count} sandboxes, the configured maximum"),
                "delete sandboxes you no longer need (`airlock rm`), or start the daemon with a larger --max-sandboxes",
            ));
        }
        let inserted = tx.execute(
            "INSERT INTO sandboxes (id, name, golden, generation, state, labels, created_at, expires_at, access, os_uid, idle_suspend)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            params![
                sb.id,
                sb.name,
                sb.golden,
                sb.generation,
                sb.state.as_str(),
                to_json(&sb.labels),
                sb.created_at.0,
                sb.expires_at.0,
                to_json(&sb.access),
                sb.uid,
                sb.idle_suspend_seconds as i64
            ],
        );
        match inserted {
            Ok(_) => {}
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                return Err(name_taken(sb.name.as_deref()));
            }
            Err(e) => return Err(e.into()),
        }
        tx.commit()?;
        Ok(())
    }

    /// Marks a sandbox running, with its postmaster pid and connection string.
    pub fn set_running(&mut self, id: &str, pid: i32, dsn: &str) -> Result<()> {
        self.set_running_with(id, pid, dsn, None)
    }

    /// As [`Store::set_running`], also recording the router's verifier when given
    /// (one write on the fork path).
    pub fn set_running_with(&mut self, id: &str, pid: i32, dsn: &str, verifier: Option<&str>) -> Result<()> {
        self.conn.execute(
            "UPDATE sandboxes SET state = 'running', pid = ?2, dsn = ?3, verifier = COALESCE(?4, verifier)
             WHERE id = ?1",
            params![id, pid, dsn, verifier],
        )?;
        Ok(())
    }

    /// Records when a sandbox was last used through the router.
    pub fn set_active(&mut self, id: &str, at: Timestamp) -> Result<()> {
        self.conn.execute("UPDATE sandboxes SET active_at = ?2 WHERE id = ?1", params![id, at.0])?;
        Ok(())
    }

    /// Records the router's verifier for a sandbox's credential.
    pub fn set_verifier(&mut self, id: &str, verifier: &str) -> Result<()> {
        self.conn.execute("UPDATE sandboxes SET verifier = ?2 WHERE id = ?1", params![id, verifier])?;
        Ok(())
    }

    /// Moves a running sandbox to `deleting`; false if it was not running (someone
    /// else is deleting it, or it is still being made).
    pub fn begin_delete(&mut self, id: &str) -> Result<bool> {
        let n = self.conn.execute(
            "UPDATE sandboxes SET state = 'deleting' WHERE id = ?1 AND state IN ('running', 'pooled', 'suspended')",
            [id],
        )?;
        Ok(n == 1)
    }

    /// Moves a running or pooled sandbox whose server (`pid`) died to `deleting`;
    /// false if it changed meanwhile (suspended, deleted, restarted).
    pub fn begin_delete_dead(&mut self, id: &str, pid: Option<i32>) -> Result<bool> {
        let n = self.conn.execute(
            "UPDATE sandboxes SET state = 'deleting' WHERE id = ?1 AND state IN ('running', 'pooled') AND pid IS ?2",
            params![id, pid],
        )?;
        Ok(n == 1)
    }

    /// Moves a warm-pool member that no fork has claimed to `deleting`; false if a
    /// fork claimed it meanwhile (a claimed member is a user's sandbox now).
    pub fn begin_drain(&mut self, id: &str) -> Result<bool> {
        let n = self
            .conn
            .execute("UPDATE sandboxes SET state = 'deleting' WHERE id = ?1 AND state = 'pooled'", [id])?;
        Ok(n == 1)
    }

    /// Marks a sandbox built for the pool as ready to be claimed.
    pub fn set_pooled(&mut self, id: &str, pid: i32, dsn: &str, verifier: &str) -> Result<()> {
        self.conn.execute(
            "UPDATE sandboxes SET state = 'pooled', pid = ?2, dsn = ?3, verifier = ?4 WHERE id = ?1",
            params![id, pid, dsn, verifier],
        )?;
        Ok(())
    }

    /// Every warm-pool member no fork has claimed.
    pub fn pooled(&self) -> Result<Vec<Sandbox>> {
        let mut stmt = self.conn.prepare(&format!("{SELECT_SANDBOX} WHERE state = 'pooled'"))?;
        let all = stmt.query_map([], sandbox_from_row)?.collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(all)
    }

    /// Takes one pooled sandbox of a golden generation for a fork, giving it the
    /// fork's name, labels, access and times, in state `creating`. None when the
    /// pool is empty.
    pub fn claim_pooled(&mut self, fork: &Sandbox) -> Result<Option<Sandbox>> {
        let tx = self.conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let id: Option<String> = tx
            .query_row(
                "SELECT id FROM sandboxes WHERE golden = ?1 AND generation = ?2 AND state = 'pooled'
                 ORDER BY created_at LIMIT 1",
                params![fork.golden, fork.generation],
                |r| r.get(0),
            )
            .optional()?;
        let Some(id) = id else { return Ok(None) };
        let updated = tx.execute(
            "UPDATE sandboxes SET state = 'creating', name = ?2, labels = ?3, access = ?4, created_at = ?5, expires_at = ?6,
             idle_suspend = ?7 WHERE id = ?1",
            params![
                id,
                fork.name,
                to_json(&fork.labels),
                to_json(&fork.access),
                fork.created_at.0,
                fork.expires_at.0,
                fork.idle_suspend_seconds as i64
            ],
        );
        match updated {
            Ok(_) => {}
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                return Err(name_taken(fork.name.as_deref()));
            }
            Err(e) => return Err(e.into()),
        }
        let sb = tx.query_row(&format!("{SELECT_SANDBOX} WHERE id = ?1"), [&id], sandbox_from_row)?;
        tx.commit()?;
        Ok(Some(sb))
    }

    /// Moves a running or suspended sandbox to `resetting`; false if it was neither.
    pub fn begin_reset(&mut self, id: &str) -> Result<bool> {
        let n = self.conn.execute(
            "UPDATE sandboxes SET state = 'resetting' WHERE id = ?1 AND state IN ('running', 'suspended')",
            [id],
        )?;
        Ok(n == 1)
    }

    /// Moves a running sandbox to `suspended` (its process about to stop); false if
    /// it was not running.
    pub fn begin_suspend(&mut self, id: &str) -> Result<bool> {
        let n = self.conn.execute(
            "UPDATE sandboxes SET state = 'suspended', pid = NULL WHERE id = ?1 AND state = 'running'",
            [id],
        )?;
        Ok(n == 1)
    }

    /// Moves a running sandbox whose server `pid` died to `suspended`; false if
    /// the row changed meanwhile.
    pub fn suspend_dead(&mut self, id: &str, pid: Option<i32>) -> Result<bool> {
        let n = self.conn.execute(
            "UPDATE sandboxes SET state = 'suspended', pid = NULL WHERE id = ?1 AND state = 'running' AND pid IS ?2",
            params![id, pid],
        )?;
        Ok(n == 1)
    }

    /// Marks a sandbox `suspended` with no process (one whose server could not start).
    pub fn set_suspended(&mut self, id: &str) -> Result<()> {
        self.conn.execute("UPDATE sandboxes SET state = 'suspended', pid = NULL WHERE id = ?1", [id])?;
        Ok(())
    }

    /// How many sandboxes exist, and how many of them have (or are about to have)
    /// a running server: all but the suspended ones.
    pub fn counts(&self) -> Result<(usize, usize)> {
        let (all, running): (i64, i64) = self.conn.query_row(
            "SELECT count(*), count(*) FILTER (WHERE state <> 'suspended') FROM sandboxes",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        Ok((all as usize, running as usize))
    }

    /// How many sandboxes are in each state.
    pub fn counts_by_state(&self) -> Result<Vec<(String, i64)>> {
        let mut stmt =
            self.conn.prepare("SELECT state, count(*) FROM sandboxes GROUP BY state ORDER BY state")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    /// Changes a sandbox's state.
    pub fn set_state(&mut self, id: &str, state: SandboxState) -> Result<()> {
        self.conn.execute("UPDATE sandboxes SET state = ?2 WHERE id = ?1", params![id, state.as_str()])?;
        Ok(())
    }

    /// Binds an MCP gateway token (by its hash) to a sandbox.
    pub fn add_mcp_token(&mut self, sandbox: &str, hash: &str) -> Result<()> {
        self.conn
            .execute("INSERT INTO mcp_tokens (hash, sandbox) VALUES (?1, ?2)", params![hash, sandbox])?;
        Ok(())
    }

    /// The live sandbox an MCP gateway token (by its hash) is bound to.
    pub fn mcp_token_sandbox(&self, hash: &str) -> Result<Option<String>> {
        Ok(self
            .conn
            .query_row(
                "SELECT t.sandbox FROM mcp_tokens t JOIN sandboxes s ON s.id = t.sandbox
                 WHERE t.hash = ?1 AND s.state IN ('running', 'suspended', 'resetting')",
                [hash],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// Sets a sandbox's expiry.
    pub fn set_expiry(&mut self, id: &str, expires_at: Timestamp) -> Result<()> {
        self.conn.execute("UPDATE sandboxes SET expires_at = ?2 WHERE id = ?1", params![id, expires_at.0])?;
        Ok(())
    }

    /// Forgets a sandbox (its credential goes with the row).
    pub fn delete_sandbox(&mut self, id: &str) -> Result<()> {
        self.conn.execute("DELETE FROM mcp_tokens WHERE sandbox = ?1", [id])?;
        self.conn.execute("DELETE FROM sandboxes WHERE id = ?1", [id])?;
        Ok(())
    }

    /// A sandbox by id or by name.
    pub fn sandbox(&self, id_or_name: &str) -> Result<Sandbox> {
        self.conn
            .query_row(
                &format!("{SELECT_SANDBOX} WHERE (id = ?1 OR name = ?1) AND state <> 'pooled'"),
                [id_or_name],
                sandbox_from_row,
            )
            .optional()?
            .ok_or_else(|| {
                Error::new(
                    ErrorCode::SandboxNotFound,
                    format!("no sandbox with id or name {id_or_name:?}"),
                    "list live sandboxes with `airlock ls`; deleted and expired ones are gone",
                )
            })
    }

    /// Sandboxes matching a filter, oldest first.
    pub fn sandboxes(&self, filter: &SandboxFilter) -> Result<Vec<Sandbox>> {
        let mut stmt = self.conn.prepare(&format!(
            "{SELECT_SANDBOX} WHERE (?1 IS NULL OR golden = ?1) ORDER BY created_at, id"
        ))?;
        let all =
            stmt.query_map([&filter.golden], sandbox_from_row)?.collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(all
            .into_iter()
            .filter(|s| filter.pooled || s.state != SandboxState::Pooled)
            .filter(|s| filter.labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .collect())
    }

    /// Ids of sandboxes whose expiry has passed and that are not already being deleted.
    pub fn expired(&self, now: Timestamp) -> Result<Vec<String>> {
        let mut stmt = self.conn.prepare(
            "SELECT id FROM sandboxes WHERE expires_at <= ?1 AND state IN ('running', 'suspended') ORDER BY expires_at",
        )?;
        let ids = stmt.query_map([now.0], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?;
        Ok(ids)
    }

    // ---- events ----

    /// Records an event that something depends on (a fork, a credential, a tool
    /// call's answer): it is written to the journal first, and if it cannot be,
    /// nothing is kept and the error says so.
    pub fn record(&mut self, e: NewEvent) -> Result<()> {
        let entry = self.journal_entry(e);
        let seq = match &self.journal {
            Some(journal) => Some(journal.append(&entry)?.seq),
            None => None,
        };
        self.keep_event(&entry, seq)
    }

    /// Records an event about work that goes on whether or not it is recorded (a
    /// teardown, a watchdog step): an entry the journal cannot take now is
    /// kept for its next write, after a record of the gap, and said in the
    /// daemon log; it is never dropped silently.
    pub fn record_or_log(&mut self, e: NewEvent) {
        let entry = self.journal_entry(e);
        let seq = match &self.journal {
            Some(journal) => match journal.append(&entry) {
                Ok(written) => Some(written.seq),
                Err(error) => {
                    tracing::error!(kind = entry.kind.as_str(), sandbox = entry.sandbox.as_deref().unwrap_or("-"), %error,
                        "an event could not be written to the audit log; it will be written after a gap record");
                    journal.defer(entry.clone(), &error);
                    None
                }
            },
            None => None,
        };
        if let Err(error) = self.keep_event(&entry, seq) {
            tracing::error!(kind = entry.kind.as_str(), sandbox = entry.sandbox.as_deref().unwrap_or("-"), %error, "an event could not be recorded");
        }
    }

    /// The journal's view of an event: its time, door and generation resolved
    /// (the generation from the detail, else the sandbox's, else the golden's
    /// current one).
    fn journal_entry(&self, e: NewEvent) -> JournalEntry {
        let known = e.golden.is_some() && e.detail.get("generation").is_some_and(|g| g.is_i64());
        // Looked up only when the event does not say (most on the fork path do).
        let of_sandbox: Option<(i64, String)> = e.sandbox.as_ref().filter(|_| !known).and_then(|id| {
            self.conn
                .query_row("SELECT generation, golden FROM sandboxes WHERE id = ?1", [id], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()
                .ok()
                .flatten()
        });
        let golden = e.golden.clone().or_else(|| of_sandbox.as_ref().map(|(_, g)| g.clone()));
        let generation = e.detail.get("generation").and_then(|g| g.as_i64()).or_else(|| {
            of_sandbox.as_ref().map(|(g, _)| *g).or_else(|| {
                let golden = golden.as_ref()?;
                self.conn
                    .query_row("SELECT current_generation FROM goldens WHERE name = ?1", [golden], |r| {
                        r.get(0)
                    })
                    .optional()
                    .ok()
                    .flatten()
            })
        });
        JournalEntry {
            at: Timestamp::now(),
            kind: e.kind,
            door: e.door.unwrap_or_else(Door::current),
            sandbox: e.sandbox,
            golden,
            generation,
            reason: e.reason.map(str::to_owned),
            detail: if e.detail.is_null() { serde_json::json!({}) } else { e.detail },
        }
    }

    fn keep_event(&mut self, e: &JournalEntry, audit_seq: Option<u64>) -> Result<()> {
        self.conn.execute(
            "INSERT INTO events (at, kind, sandbox, golden, reason, detail, door, audit_seq) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                e.at.0,
                e.kind.as_str(),
                e.sandbox,
                e.golden,
                e.reason,
                e.detail.to_string(),
                e.door.as_str(),
                audit_seq.map(|s| s as i64),
            ],
        )?;
        Ok(())
    }

    /// The id of the newest event (0 when there is none).
    pub fn last_event_id(&self) -> Result<i64> {
        Ok(self.conn.query_row("SELECT coalesce(max(id), 0) FROM events", [], |r| r.get(0))?)
    }

    /// Events after `after_id` (at most `limit`), each with the sequence number
    /// of its audit record, for the completeness check.
    pub fn events_with_audit(&self, after_id: i64, limit: i64) -> Result<Vec<AuditedEvent>> {
        let mut stmt = self
            .conn
            .prepare("SELECT id, kind, sandbox, audit_seq FROM events WHERE id > ?1 ORDER BY id LIMIT ?2")?;
        let rows = stmt
            .query_map(params![after_id, limit], |r| {
                Ok(AuditedEvent {
                    id: r.get(0)?,
                    kind: r.get(1)?,
                    sandbox: r.get(2)?,
                    audit_seq: r.get::<_, Option<i64>>(3)?.map(|s| s as u64),
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Deletes all but the newest `keep` events; returns how many went.
    pub fn trim_events(&mut self, keep: i64) -> Result<usize> {
        Ok(self.conn.execute("DELETE FROM events WHERE id <= (SELECT max(id) FROM events) - ?1", [keep])?)
    }

    /// Events, oldest first, optionally for one sandbox (by id), the most recent `limit`.
    pub fn events(&self, sandbox: Option<&str>, limit: i64) -> Result<Vec<Event>> {
        let mut stmt = self.conn.prepare(
            "SELECT id, at, kind, sandbox, golden, reason, detail, door FROM (
                SELECT * FROM events WHERE (?1 IS NULL OR sandbox = ?1) ORDER BY id DESC LIMIT ?2
             ) ORDER BY id",
        )?;
        let rows = stmt
            .query_map(params![sandbox, limit], |r| {
                let detail: String = r.get(6)?;
                Ok(Event {
                    id: r.get(0)?,
                    at: Timestamp(r.get(1)?),
                    kind: r.get(2)?,
                    sandbox: r.get(3)?,
                    golden: r.get(4)?,
                    reason: r.get(5)?,
                    detail: serde_json::from_str(&detail).unwrap_or_default(),
                    door: r.get(7)?,
                })
            })?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
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

const SELECT_SANDBOX: &str =
    "SELECT id, name, golden, generation, state, labels, created_at, expires_at, pid, dsn, access, slot, idle_suspend, os_uid, verifier, active_at FROM sandboxes";

fn sandbox_from_row(r: &Row) -> rusqlite::Result<Sandbox> {
    let state: String = r.get(4)?;
    let labels: String = r.get(5)?;
    Ok(Sandbox {
        id: r.get(0)?,
        name: r.get(1)?,
        golden: r.get(2)?,
        generation: r.get(3)?,
        state: SandboxState::parse(&state).unwrap_or(SandboxState::Deleting),
        labels: serde_json::from_str(&labels).unwrap_or_default(),
        created_at: Timestamp(r.get(6)?),
        expires_at: Timestamp(r.get(7)?),
        pid: r.get(8)?,
        dsn: r.get(9)?,
        socket_dsn: None,
        redis_url: None,
        redis_socket_url: None,
        access: serde_json::from_str(&r.get::<_, String>(10)?).unwrap_or_default(),
        idle_suspend_seconds: r.get::<_, i64>(12)?.max(0) as u64,
        slot: r.get(11)?,
        uid: r.get(13)?,
        verifier: r.get(14)?,
        active_at: r.get::<_, Option<i64>>(15)?.map(Timestamp),
    })
}

fn name_taken(name: Option<&str>) -> Error {
    Error::new(
        ErrorCode::NameTaken,
        format!("a live sandbox is already named {:?}", name.unwrap_or("")),
        "pick another --name, or delete the other sandbox first",
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_from_the_first_schema_is_migrated() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE goldens (name TEXT PRIMARY KEY, current_generation INTEGER NOT NULL, source TEXT NOT NULL);
             CREATE TABLE sandboxes (id TEXT PRIMARY KEY, name TEXT UNIQUE, golden TEXT NOT NULL,
                 generation INTEGER NOT NULL, state TEXT NOT NULL, labels TEXT NOT NULL,
                 created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL, pid INTEGER, dsn TEXT);
             CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, at INTEGER NOT NULL, kind TEXT NOT NULL,
                 sandbox TEXT, golden TEXT, reason TEXT, detail TEXT NOT NULL);
             INSERT INTO sandboxes VALUES ('sb-old', NULL, 'shop', 1, 'running', '{}', 0, 0, NULL, NULL);
             INSERT INTO events (at, kind, sandbox, detail) VALUES (0, 'created', 'sb-old', '{}');",
        )
        .unwrap();
        migrate(&conn).unwrap();
        migrate(&conn).unwrap();
        let store = Store { conn, journal: None };
        let sb = store.sandbox("sb-old").unwrap();
        assert_eq!(sb.access, airlock_core::records::access::Access::default());
        assert_eq!(sb.slot, None);
        assert_eq!(sb.idle_suspend_seconds, 0);
        // Events of before the audit log have neither a door nor a record.
        let events = store.events(None, 10).unwrap();
        assert_eq!((events.len(), events[0].door.as_deref()), (1, None));
        assert_eq!(store.events_with_audit(0, 10).unwrap()[0].audit_seq, None);
    }

    #[test]
    fn trimming_keeps_the_newest_events() {
        let dir = std::env::temp_dir().join(format!("airlock-store-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut store = Store::open(&dir.join("state.db")).unwrap();
        for i in 0..10 {
            store
                .record(NewEvent {
                    kind: airlock_core::events::EventKind::Connected,
                    detail: serde_json::json!({"n": i}),
                    ..Default::default()
                })
                .unwrap();
        }
        assert_eq!(store.trim_events(4).unwrap(), 6);
        let left = store.events(None, 100).unwrap();
        let kept: Vec<i64> = left.iter().map(|e| e.detail["n"].as_i64().unwrap()).collect();
        assert_eq!(kept, [6, 7, 8, 9]);
        assert_eq!(store.trim_events(4).unwrap(), 0);
        let _ = std::fs::remove_dir_all(dir);
    }
}
