//! Events: written to the journal (the audit log) first, then kept.

use rusqlite::{params, OptionalExtension};

use super::*;

impl Store {
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
            detail: with_node(if e.detail.is_null() { serde_json::json!({}) } else { e.detail }),
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

/// The detail with this daemon's cluster node named in it, when it is one.
fn with_node(mut detail: serde_json::Value) -> serde_json::Value {
    if let (Some(node), Some(fields)) = (airlock_core::events::NODE.get(), detail.as_object_mut()) {
        fields.entry("node").or_insert_with(|| node.clone().into());
    }
    detail
}
