//! Holding grants to their terms while the daemon runs.
//!
//! Twice a second: grants past their expiry are ended (the target's server
//! refuses their roles after `VALID UNTIL` anyway; ending also cuts sessions
//! already open, which `VALID UNTIL` does not), and on each target with live
//! grants a watchdog cancels a statement that has run past its grant's
//! timeout and ends a session idle in a transaction past it: a grantee may
//! `SET statement_timeout = 0`, but not keep the daemon from watching.
//! Every minute, and at start, each target is reconciled: a grant role or
//! schema of this data root that no live grant owns (left by a crash between
//! minting and recording, or by a daemon that was away) is ended.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_core::clock::Timestamp;
use airlock_core::error::Result;
use airlock_core::events::{EventKind, NewEvent};
use airlock_postgres::cell::Cell;

use super::grant::{end_on_target, role_prefix, Grant};
use super::Live;

/// How often grants are looked at.
const TICK: Duration = Duration::from_millis(500);
/// How often targets are reconciled.
const RECONCILE: Duration = Duration::from_secs(60);
/// How often an ending that failed (its target unreachable) is tried again.
const RETRY: Duration = Duration::from_secs(30);
/// How old a session of a grant's role may be before it must be one the
/// router opened (the router writes its pid down just after it logs in).
const NOT_ROUTED_AFTER_MS: i64 = 2000;
/// How long a cancelled statement may go on before its session is ended.
const CANCEL_HEEDED_WITHIN: Duration = Duration::from_secs(2);
/// What a statement may run past its grant's timeout before the watchdog
/// cancels it (the server's own timeout, when the grantee kept it, acts first).
const GRACE_MS: i64 = 250;

/// Starts holding `live`'s grants to their terms, for as long as the daemon runs.
pub fn spawn(live: Arc<Live>) {
    tokio::spawn(async move {
        let mut watch = Watch::default();
        loop {
            watch.tick(&live).await;
            tokio::time::sleep(TICK).await;
        }
    });
}

#[derive(Default)]
struct Watch {
    /// An admin session per target, kept between ticks.
    sessions: HashMap<String, tokio_postgres::Client>,
    reconciled: Option<Instant>,
    retried: Option<Instant>,
    /// Statements already cancelled (pid, start), and when: one still running
    /// a while after (its code caught the cancel) has its session ended.
    cancelled: HashMap<(i32, i64), Instant>,
}

impl Watch {
    async fn tick(&mut self, live: &Arc<Live>) {
        let retry = self.retried.is_none_or(|t| t.elapsed() >= RETRY);
        if retry {
            self.retried = Some(Instant::now());
        }
        let due = live.store().grants_to_end(Timestamp::now());
        match due {
            Ok(due) => {
                for (grant, ending) in due {
                    if ending && !retry {
                        continue;
                    }
                    let reason = if ending { "retried" } else { "expired" };
                    if let Err(e) = live.end(&grant, reason).await {
                        tracing::warn!(grant = %grant.id, error = %e.message, "ending a grant failed");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e.message, "reading grants failed"),
        }
        let grants = live.grants().unwrap_or_default();
        let mut by_target: HashMap<&str, Vec<&Grant>> = HashMap::new();
        for g in &grants {
            by_target.entry(g.target.as_str()).or_default().push(g);
        }
        for (target, grants) in by_target {
            if let Err(e) = self.police(live, target, &grants).await {
                self.sessions.remove(target);
                tracing::debug!(target, error = %e.message, "the grant watchdog could not reach a target");
            }
        }
        if self.reconciled.is_none_or(|t| t.elapsed() >= RECONCILE) {
            self.reconciled = Some(Instant::now());
            for target in live.targets().unwrap_or_default() {
                if let Err(e) = self.reconcile(live, &target.name).await {
                    self.sessions.remove(&target.name);
                    tracing::warn!(target = %target.name, error = %e.message, "reconciling a target's grants failed");
                }
            }
        }
    }
}

/// The admin session on `target` in `sessions`, opened if need be.
async fn session<'a>(
    sessions: &'a mut HashMap<String, tokio_postgres::Client>,
    live: &Live,
    target: &str,
) -> Result<&'a tokio_postgres::Client> {
    if sessions.get(target).is_none_or(|c| c.is_closed()) {
        let dsn = live.store().dsn(target)?.ok_or_else(|| super::target::not_found(target))?;
        let client = super::target::admin(&dsn).await?;
        sessions.insert(target.to_owned(), client);
    }
    Ok(sessions.get(target).expect("just opened"))
}

impl Watch {
    /// Cancels statements past their grant's timeout; ends sessions idle in
    /// a transaction past it, sessions that went on after a cancel, and any
    /// session of a grant's role the router did not open (one on another
    /// database, or a direct login with a password the grantee set itself,
    /// which PostgreSQL lets every role do).
    async fn police(&mut self, live: &Live, target: &str, grants: &[&Grant]) -> Result<()> {
        let prefix = role_prefix(live);
        let database = live.target(target)?.checks.database;
        let client = session(&mut self.sessions, live, target).await?;
        let rows = tokio::time::timeout(
            super::grant::TARGET_WITHIN,
            client.query(
                "SELECT pid, usename::text, coalesce(state, ''), coalesce(datname::text, ''),
                        coalesce((extract(epoch FROM now() - state_change) * 1000)::int8, 0),
                        coalesce((extract(epoch FROM now() - backend_start) * 1000)::int8, 0),
                        coalesce((extract(epoch FROM state_change) * 1000)::int8, 0)
                   FROM pg_catalog.pg_stat_activity
                  WHERE pg_catalog.starts_with(usename::text, $1) AND pid <> pg_catalog.pg_backend_pid()",
                &[&prefix],
            ),
        )
        .await
        .map_err(|_| airlock_core::error::Error::internal("the target did not answer the watchdog"))?
        .map_err(|e| airlock_core::error::Error::internal(e.to_string()))?;
        let mut acted = Vec::new();
        let mut routed: HashMap<String, Vec<i32>> = HashMap::new();
        for row in rows {
            let (pid, role, state, datname): (i32, String, String, String) =
                (row.cell(0)?, row.cell(1)?, row.cell(2)?, row.cell(3)?);
            let (in_state_ms, age_ms, started): (i64, i64, i64) = (row.cell(4)?, row.cell(5)?, row.cell(6)?);
            let Some(grant) = grants.iter().find(|g| g.role == role) else { continue };
            let limit = grant.statement_timeout_ms + GRACE_MS;
            let pids = routed
                .entry(grant.id.clone())
                .or_insert_with(|| airlock_core::records::route::read_pids(&live.engine.layout, &grant.id));
            let (action, reason) = if datname != database {
                ("terminated", "grant_session_elsewhere")
            } else if age_ms > NOT_ROUTED_AFTER_MS && !pids.contains(&pid) {
                ("terminated", "grant_session_not_routed")
            } else {
                match state.as_str() {
                    "idle" | "" => continue,
                    s if s.starts_with("idle in transaction") => {
                        if in_state_ms <= limit {
                            continue;
                        }
                        ("terminated", "grant_idle_timeout")
                    }
                    // `active`, and a fastpath function call, which no
                    // statement timeout covers.
                    _ if in_state_ms > limit => match self.cancelled.get(&(pid, started)) {
                        None => {
                            self.cancelled.insert((pid, started), Instant::now());
                            ("cancelled", "grant_statement_timeout")
                        }
                        // A cancel is an error a PL/pgSQL block may catch and
                        // go on; ending the session is not.
                        Some(at) if at.elapsed() >= CANCEL_HEEDED_WITHIN => {
                            ("terminated", "grant_statement_not_cancelled")
                        }
                        Some(_) => continue,
                    },
                    _ => continue,
                }
            };
            let function = if action == "cancelled" { "pg_cancel_backend" } else { "pg_terminate_backend" };
            let _ = client.execute(&format!("SELECT pg_catalog.{function}($1)"), &[&pid]).await;
            acted.push((grant.id.clone(), action, reason, pid, in_state_ms));
        }
        for (id, action, reason, pid, ms) in acted {
            live.engine.store().record_or_log(NewEvent {
                kind: EventKind::Watchdog,
                reason: Some(reason),
                detail: serde_json::json!({"grant": id, "target": target, "action": action, "pid": pid, "ran_ms": ms}),
                ..Default::default()
            });
        }
        if self.cancelled.len() > 10_000 {
            self.cancelled.clear();
        }
        Ok(())
    }

    /// Ends grant roles and schemas of this data root on `target` that no
    /// grant owns.
    async fn reconcile(&mut self, live: &Live, target: &str) -> Result<()> {
        let prefix = role_prefix(live);
        let dsn = live.store().dsn(target)?.ok_or_else(|| super::target::not_found(target))?;
        let client = session(&mut self.sessions, live, target).await?;
        let rows = client
            .query(
                "SELECT rolname::text FROM pg_catalog.pg_roles WHERE pg_catalog.starts_with(rolname::text, $1)
                 UNION SELECT nspname::text FROM pg_catalog.pg_namespace WHERE pg_catalog.starts_with(nspname::text, $1)",
                &[&prefix],
            )
            .await
            .map_err(|e| airlock_core::error::Error::internal(e.to_string()))?;
        let found: Vec<String> = rows.iter().map(|r| r.cell(0)).collect::<Result<_>>()?;
        // Minting is looked at before the records: a grant that finished
        // minting meanwhile is recorded by then.
        let minting: Vec<bool> = found.iter().map(|role| live.is_minting(role)).collect();
        let owned: HashSet<String> = live.store().all_grant_roles()?.into_iter().collect();
        let mut ended = Vec::new();
        for (role, minting) in found.into_iter().zip(minting) {
            if minting || owned.contains(&role) {
                continue;
            }
            end_on_target(client, &dsn, &role).await?;
            ended.push(role);
        }
        for role in ended {
            tracing::info!(target, role, "ended an orphaned grant role");
            live.engine.store().record_or_log(NewEvent {
                kind: EventKind::GrantEnded,
                reason: Some("orphaned"),
                detail: serde_json::json!({"target": target, "role": role}),
                ..Default::default()
            });
        }
        Ok(())
    }
}
