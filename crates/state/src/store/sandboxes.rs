//! Sandboxes in the store: one row each, from `creating` to deleted.

use rusqlite::{params, OptionalExtension};

use super::*;

impl Store {
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

    /// Moves a sandbox in any state to `deleting` (at start-up, for what is
    /// to be torn down: a teardown that then fails is taken up again from
    /// that state, as any other).
    pub fn mark_deleting(&mut self, id: &str) -> Result<()> {
        self.conn.execute("UPDATE sandboxes SET state = 'deleting' WHERE id = ?1", [id])?;
        Ok(())
    }

    /// Moves a running or suspended sandbox whose TTL has passed by `now` to
    /// `deleting`; false if it is not (its TTL was extended meanwhile, say).
    pub fn begin_expiry_delete(&mut self, id: &str, now: Timestamp) -> Result<bool> {
        let n = self.conn.execute(
            "UPDATE sandboxes SET state = 'deleting' WHERE id = ?1 AND state IN ('running', 'suspended') AND expires_at <= ?2",
            params![id, now.0],
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

    /// The nearest expiry after `now` of a sandbox that will be running or
    /// suspended (one being made or reset counts), if any: when the next
    /// TTL comes due.
    pub fn next_expiry(&self, now: Timestamp) -> Result<Option<Timestamp>> {
        let at: Option<i64> = self.conn.query_row(
            "SELECT min(expires_at) FROM sandboxes
             WHERE expires_at > ?1 AND state IN ('creating', 'running', 'suspended', 'resetting')",
            [now.0],
            |r| r.get(0),
        )?;
        Ok(at.map(Timestamp))
    }
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
        node: None,
        pid: r.get(8)?,
        dsn: r.get(9)?,
        socket_dsn: None,
        router_socket_dsn: None,
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
