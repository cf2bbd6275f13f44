//! The watchdog: holds every running sandbox's time and connection ceilings from
//! outside the agent's reach.
//!
//! The agent's role starts each session with its limits (`statement_timeout`,
//! `idle_in_transaction_session_timeout`), but those are user settings: a session
//! may `SET statement_timeout = 0`, a function may carry its own, a fast-path
//! call or an autovacuum worker running the agent's index expressions obeys none.
//! So twice a second the watchdog looks at each sandbox from outside. It first
//! reads the process titles of the sandbox's processes (PostgreSQL keeps them
//! current, and only a superuser could turn that off), which costs no
//! connection; only a sandbox with a process at work for the agent is asked,
//! over an admin session, when each one's statement or transaction began. Work
//! running longer than its ceiling (the sandbox's statement timeout and a
//! second) is cancelled, and terminated if still running [`TERMINATE_AFTER`]
//! later; a session idle in a transaction past its ceiling is terminated;
//! sessions beyond the connection limit are terminated, newest first. Each
//! intervention is a `watchdog` event. Sandboxes are checked concurrently, each
//! within [`CHECK_LIMIT`], so no sandbox can hold up the watch of another.

use airlock_postgres::cell::Cell;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use airlock_core::dsn::{AGENT_ROLE, DATABASE};
use airlock_core::events::{Door, NewEvent};
use airlock_lifecycle::engine::Engine;
use airlock_lifecycle::sandbox::{Sandbox, SandboxState};
use airlock_postgres::admin::Admin;
use airlock_state::store::SandboxFilter;

/// How often every running sandbox is looked at.
const TICK: Duration = Duration::from_millis(500);
/// How far past its ceiling a statement or idle transaction may go before the
/// watchdog steps in (PostgreSQL's own timeout, when still set, acts first).
const GRACE: Duration = Duration::from_secs(1);
/// How long a cancelled statement has to end before its backend is terminated.
const TERMINATE_AFTER: Duration = Duration::from_secs(2);
/// The longest one sandbox's check may take (its admin session is dropped then).
const CHECK_LIMIT: Duration = Duration::from_secs(5);

/// Runs the watchdog until the daemon exits.
pub fn spawn(engine: Arc<Engine>) -> tokio::task::JoinHandle<()> {
    super::spawn_as_reaper(async move {
        let mut watched: HashMap<String, Watched> = HashMap::new();
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            round(&engine, &mut watched).await;
        }
    })
}

/// What the watchdog keeps for a sandbox with work in progress: an admin session
/// to its server, and the backends it has cancelled.
pub struct Watched {
    postmaster: i32,
    admin: Admin,
    cancelled: HashMap<i32, Instant>,
}

/// One backend as `pg_stat_activity` shows it.
struct Backend {
    pid: i32,
    kind: String,
    state: String,
    /// Milliseconds since its statement (or query message) began.
    running_ms: i64,
    /// Milliseconds since its state last changed.
    in_state_ms: i64,
}

/// Looks at every running sandbox once.
pub async fn round(engine: &Arc<Engine>, watched: &mut HashMap<String, Watched>) {
    let Ok(all) = engine.store().sandboxes(&SandboxFilter::default()) else { return };
    // It watches PostgreSQL sessions; Redis scripts are `scripts`'s.
    let watchable = |s: &Sandbox| engine.layout.generation_has_postgres(&s.golden, s.generation);
    let busy: Vec<Sandbox> = all
        .into_iter()
        .filter(|s| s.state == SandboxState::Running && watchable(s) && agent_busy(engine, s))
        .collect();
    watched.retain(|id, w| busy.iter().any(|s| &s.id == id && s.pid == Some(w.postmaster)));
    let mut checks = tokio::task::JoinSet::new();
    for sb in busy {
        let engine = engine.clone();
        let kept = watched.remove(&sb.id);
        checks.spawn(async move {
            let id = sb.id.clone();
            match tokio::time::timeout(CHECK_LIMIT, check(&engine, &sb, kept)).await {
                Ok(Ok(w)) => (id, Some(w)),
                Ok(Err(e)) => {
                    tracing::debug!(sandbox = %id, error = %e, "watchdog could not check a sandbox");
                    (id, None)
                }
                Err(_) => {
                    tracing::warn!(sandbox = %id, "watchdog check of a sandbox took too long; dropped");
                    (id, None)
                }
            }
        });
    }
    while let Some(done) = checks.join_next().await {
        if let Ok((id, Some(w))) = done {
            watched.insert(id, w);
        }
    }
}

async fn check(engine: &Engine, sb: &Sandbox, kept: Option<Watched>) -> airlock_core::error::Result<Watched> {
    let postmaster = sb.pid.unwrap_or_default();
    let mut w = match kept {
        Some(w) if w.postmaster == postmaster => w,
        _ => Watched {
            postmaster,
            admin: Admin::connect(&engine.layout.sandbox_instance(&sb.id), DATABASE, postmaster).await?,
            cancelled: HashMap::new(),
        },
    };
    let rows = w
        .admin
        .client()
        .query(
            "SELECT pid, backend_type, coalesce(state, ''),
                    coalesce((extract(epoch FROM clock_timestamp() - query_start) * 1000)::int8, 0),
                    coalesce((extract(epoch FROM clock_timestamp() - state_change) * 1000)::int8, 0)
             FROM pg_stat_activity
             WHERE pid <> pg_backend_pid()
               AND ((backend_type = 'client backend' AND usename = $1)
                    OR backend_type IN ('autovacuum worker', 'parallel worker'))
             ORDER BY backend_start DESC",
            &[&AGENT_ROLE],
        )
        .await
        .map_err(|e| airlock_core::error::Error::postgres(airlock_postgres::admin::describe(&e)))?;
    let backends: Vec<Backend> = rows
        .iter()
        .map(|r| {
            Ok(Backend {
                pid: r.cell(0)?,
                kind: r.cell(1)?,
                state: r.cell(2)?,
                running_ms: r.cell(3)?,
                in_state_ms: r.cell(4)?,
            })
        })
        .collect::<airlock_core::error::Result<_>>()?;
    w.cancelled.retain(|pid, _| backends.iter().any(|b| b.pid == *pid));
    let limits = sb.access.limits;
    let statement_ceiling = limits.statement_timeout_ms as i64 + GRACE.as_millis() as i64;
    let idle_ceiling = limits.idle_in_transaction_timeout_ms as i64 + GRACE.as_millis() as i64;
    let sessions = backends.iter().filter(|b| b.kind == "client backend").count();
    let mut extra = sessions.saturating_sub(limits.connection_limit as usize);
    for b in &backends {
        // A fast-path function call is work as much as a statement is.
        let working = matches!(b.state.as_str(), "active" | "fastpath function call");
        let step = if b.kind == "client backend" && extra > 0 {
            // Newest first: the sessions that went over the limit.
            extra -= 1;
            Step {
                action: "terminated",
                reason: "connections",
                detail: json!({"limit": limits.connection_limit}),
            }
        } else if working && b.running_ms > statement_ceiling {
            let detail =
                json!({"ran_ms": b.running_ms, "limit_ms": limits.statement_timeout_ms, "process": b.kind});
            match w.cancelled.get(&b.pid) {
                None => {
                    w.cancelled.insert(b.pid, Instant::now());
                    Step { action: "cancelled", reason: "statement_time", detail }
                }
                Some(at) if at.elapsed() > TERMINATE_AFTER => {
                    Step { action: "terminated", reason: "statement_time", detail }
                }
                Some(_) => continue,
            }
        } else if b.state.starts_with("idle in transaction") && b.in_state_ms > idle_ceiling {
            let detail = json!({"idle_ms": b.in_state_ms, "limit_ms": limits.idle_in_transaction_timeout_ms});
            Step { action: "terminated", reason: "idle_in_transaction", detail }
        } else {
            continue;
        };
        act(engine, &w.admin, sb, b.pid, step).await;
    }
    Ok(w)
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
    if !done.is_ok_and(|r| r.cell::<bool>(0).unwrap_or(false)) {
        return;
    }
    detail["action"] = json!(action);
    detail["backend"] = json!(pid);
    tracing::info!(sandbox = %sb.id, backend = pid, action, reason, "watchdog stepped in");
    engine.store().record_or_log(NewEvent {
        kind: airlock_core::events::EventKind::Watchdog,
        sandbox: Some(sb.id.clone()),
        golden: Some(sb.golden.clone()),
        reason: Some(reason),
        detail,
        door: Some(Door::Reaper),
    });
}

/// Whether a process of the sandbox is at work for the agent, as the process
/// titles say: a session of the agent's role that is not idle, an autovacuum
/// worker (which may run the agent's index expressions), a parallel worker.
/// Without cgroups the processes cannot be told apart cheaply, so every
/// sandbox counts as busy.
fn agent_busy(engine: &Engine, sb: &Sandbox) -> bool {
    if !engine.cgroups.available() {
        return true;
    }
    let session = format!("postgres: {AGENT_ROLE} ");
    engine.cgroups.members(&sb.id).into_iter().any(|pid| {
        let Ok(title) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
        let title = String::from_utf8_lossy(&title);
        let title = title.trim_end_matches(['\0', ' ']);
        // "postgres: airlock_agent app [local] idle"
        title.strip_prefix(&session).is_some_and(|rest| !rest.ends_with(" idle"))
            || title.starts_with("postgres: autovacuum worker")
            || title.starts_with("postgres: parallel worker")
    })
}
