//! The watchdog: holds every running sandbox's time and connection ceilings from
//! outside the agent's reach.
//!
//! The agent's role starts each session with its limits (`statement_timeout`,
//! `idle_in_transaction_session_timeout`), but those are user settings: a session
//! may `SET statement_timeout = 0`, or a function may carry its own. So twice a
//! second the watchdog looks at each sandbox from outside. It first reads the
//! process titles of the sandbox's backends (PostgreSQL keeps them current, and
//! only a superuser could turn that off), which costs no connection; only a
//! sandbox with an agent backend that is not idle is asked, over an admin
//! session, when each one's statement or transaction began. A statement running
//! longer than its ceiling (the sandbox's statement timeout and a second) is
//! cancelled, and terminated if it is still running [`TERMINATE_AFTER`] later; a
//! session idle in a transaction past its ceiling is terminated; backends beyond
//! the connection limit are terminated, newest first. Each intervention is a
//! `watchdog` event.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::engine::Engine;
use crate::events::NewEvent;
use crate::pg::admin::Admin;
use crate::pg::dsn::{AGENT_ROLE, DATABASE};
use crate::sandbox::{Sandbox, SandboxState};
use crate::store::SandboxFilter;

/// How often every running sandbox is looked at.
const TICK: Duration = Duration::from_millis(500);
/// How far past its ceiling a statement or idle transaction may go before the
/// watchdog steps in (PostgreSQL's own timeout, when still set, acts first).
const GRACE: Duration = Duration::from_secs(1);
/// How long a cancelled statement has to end before its backend is terminated.
const TERMINATE_AFTER: Duration = Duration::from_secs(2);

/// Runs the watchdog until the daemon exits.
pub fn spawn(engine: Arc<Engine>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut watch = Watchdog::default();
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            watch.round(&engine).await;
        }
    })
}

/// The watchdog's own state: admin sessions to sandboxes with work in progress,
/// and statements it has cancelled.
#[derive(Default)]
pub struct Watchdog {
    sessions: HashMap<String, (i32, Admin)>,
    cancelled: HashMap<(String, i32), Instant>,
}

/// One agent backend as `pg_stat_activity` shows it.
struct Backend {
    pid: i32,
    state: String,
    /// Milliseconds since its statement (or query message) began.
    running_ms: i64,
    /// Milliseconds since its state last changed.
    in_state_ms: i64,
}

impl Watchdog {
    /// Looks at every running sandbox once.
    pub async fn round(&mut self, engine: &Engine) {
        let Ok(all) = engine.store().sandboxes(&SandboxFilter::default()) else { return };
        let running: Vec<Sandbox> = all.into_iter().filter(|s| s.state == SandboxState::Running).collect();
        self.sessions.retain(|id, (pid, _)| running.iter().any(|s| &s.id == id && s.pid == Some(*pid)));
        self.cancelled.retain(|_, at| at.elapsed() < Duration::from_secs(60));
        for sb in running {
            if !agent_busy(engine, &sb) {
                self.sessions.remove(&sb.id);
                continue;
            }
            if let Err(e) = self.check(engine, &sb).await {
                tracing::debug!(sandbox = %sb.id, error = %e, "watchdog could not check a sandbox");
                self.sessions.remove(&sb.id);
            }
        }
    }

    async fn check(&mut self, engine: &Engine, sb: &Sandbox) -> crate::error::Result<()> {
        let Some(postmaster) = sb.pid else { return Ok(()) };
        if self.sessions.get(&sb.id).is_none_or(|(pid, _)| *pid != postmaster) {
            let admin = Admin::connect(&engine.layout.sandbox_instance(&sb.id), DATABASE).await?;
            self.sessions.insert(sb.id.clone(), (postmaster, admin));
        }
        let (_, admin) = &self.sessions[&sb.id];
        let rows = admin
            .client()
            .query(
                "SELECT pid, state,
                        (extract(epoch FROM clock_timestamp() - query_start) * 1000)::int8,
                        (extract(epoch FROM clock_timestamp() - state_change) * 1000)::int8
                 FROM pg_stat_activity
                 WHERE backend_type = 'client backend' AND usename = $1 AND pid <> pg_backend_pid()
                 ORDER BY backend_start DESC",
                &[&AGENT_ROLE],
            )
            .await
            .map_err(|e| crate::error::Error::postgres(crate::pg::admin::describe(&e)))?;
        let backends: Vec<Backend> = rows
            .iter()
            .map(|r| Backend {
                pid: r.get(0),
                state: r.get::<_, Option<String>>(1).unwrap_or_default(),
                running_ms: r.get::<_, Option<i64>>(2).unwrap_or(0),
                in_state_ms: r.get::<_, Option<i64>>(3).unwrap_or(0),
            })
            .collect();
        let limits = sb.access.limits;
        let statement_ceiling = limits.statement_timeout_ms as i64 + GRACE.as_millis() as i64;
        let idle_ceiling = limits.idle_in_transaction_timeout_ms as i64 + GRACE.as_millis() as i64;
        let extra = backends.len().saturating_sub(limits.connection_limit as usize);
        for (i, b) in backends.iter().enumerate() {
            let key = (sb.id.clone(), b.pid);
            let step = if i < extra {
                // Newest first: the sessions that went over the limit.
                Step {
                    action: "terminated",
                    reason: "connections",
                    detail: json!({"limit": limits.connection_limit}),
                }
            } else if b.state == "active" && b.running_ms > statement_ceiling {
                let detail = json!({"ran_ms": b.running_ms, "limit_ms": limits.statement_timeout_ms});
                match self.cancelled.get(&key) {
                    None => {
                        self.cancelled.insert(key, Instant::now());
                        Step { action: "cancelled", reason: "statement_time", detail }
                    }
                    Some(at) if at.elapsed() > TERMINATE_AFTER => {
                        Step { action: "terminated", reason: "statement_time", detail }
                    }
                    Some(_) => continue,
                }
            } else if b.state.starts_with("idle in transaction") && b.in_state_ms > idle_ceiling {
                let detail =
                    json!({"idle_ms": b.in_state_ms, "limit_ms": limits.idle_in_transaction_timeout_ms});
                Step { action: "terminated", reason: "idle_in_transaction", detail }
            } else {
                continue;
            };
            act(engine, admin, sb, b.pid, step).await;
        }
        Ok(())
    }
}

/// One intervention on one backend.
struct Step {
    /// `cancelled` or `terminated`.
    action: &'static str,
    /// `statement_time`, `idle_in_transaction` or `connections`.
    reason: &'static str,
    /// What was measured against which limit.
    detail: serde_json::Value,
}

/// Cancels or terminates backend `pid` and records it as a `watchdog` event.
async fn act(engine: &Engine, admin: &Admin, sb: &Sandbox, pid: i32, step: Step) {
    let Step { action, reason, mut detail } = step;
    let function = if action == "cancelled" { "pg_cancel_backend" } else { "pg_terminate_backend" };
    let done = admin.client().query_one(&format!("SELECT {function}($1)"), &[&pid]).await;
    if !done.is_ok_and(|r| r.get::<_, bool>(0)) {
        return;
    }
    detail["action"] = json!(action);
    detail["backend"] = json!(pid);
    tracing::info!(sandbox = %sb.id, backend = pid, action, reason, "watchdog stepped in");
    let _ = engine.store().record(NewEvent {
        kind: "watchdog",
        sandbox: Some(sb.id.clone()),
        golden: Some(sb.golden.clone()),
        reason: Some(reason),
        detail,
    });
}

/// Whether a backend of the agent's role is doing something other than idling,
/// as the process titles of the sandbox's processes say. Without cgroups the
/// processes cannot be told apart cheaply, so every sandbox counts as busy.
fn agent_busy(engine: &Engine, sb: &Sandbox) -> bool {
    if !engine.cgroups.available() {
        return true;
    }
    let prefix = format!("postgres: {AGENT_ROLE} ");
    engine.cgroups.members(&sb.id).into_iter().any(|pid| {
        let Ok(title) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
        let title = String::from_utf8_lossy(&title);
        let title = title.trim_end_matches(['\0', ' ']);
        // "postgres: airlock_agent app [local] idle"
        title.strip_prefix(&prefix).is_some_and(|rest| !rest.ends_with(" idle"))
    })
}
