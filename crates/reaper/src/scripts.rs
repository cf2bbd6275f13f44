//! Runaway Redis scripts. Past `busy-reply-threshold` a script that will not
//! end makes its server answer every other client `-BUSY`, but Redis stops
//! nothing by itself: the sandbox's Redis would spin a core until its TTL and
//! refuse the `SAVE` a suspend needs. This loop asks each running sandbox's
//! Redis, as the admin, whether it is busy; a busy one has its script killed
//! (`SCRIPT KILL`, `FUNCTION KILL`), and one that has written (which Redis
//! will not kill half-done), or that answers nothing at all (a script stuck
//! inside one C call, which no kill reaches), is stopped, to start again from
//! the data it last saved. Each step is a `watchdog` event. A script can also
//! fill the server's log (`redis.log`): a log past [`LOG_KEPT`] is emptied.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use airlock_core::error::Result;
use airlock_core::events::{Door, EventKind, NewEvent};
use airlock_core::layout::InstanceDir;
use airlock_lifecycle::engine::Engine;
use airlock_lifecycle::sandbox::{Sandbox, SandboxState};
use airlock_redis::resp::Reply;
use airlock_redis::server::Admin;
use airlock_state::store::SandboxFilter;

/// How often every running sandbox's Redis is asked.
const TICK: Duration = Duration::from_secs(2);

/// How long a Redis may answer nothing before it counts as stuck.
const SILENT_FOR: Duration = Duration::from_secs(10);

/// The longest one sandbox's check may take (a stuck server's stop included).
const CHECK_LIMIT: Duration = Duration::from_secs(30);

/// The most bytes of a sandbox Redis's log kept; a longer one is emptied.
pub const LOG_KEPT: u64 = 16 << 20;

/// Runs the loop until the daemon exits.
pub fn spawn(engine: Arc<Engine>) -> tokio::task::JoinHandle<()> {
    super::spawn_as_reaper(async move {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            round(&engine).await;
        }
    })
}

/// Asks every running sandbox's Redis once, all at once.
async fn round(engine: &Arc<Engine>) {
    let Ok(all) = engine.store().sandboxes(&SandboxFilter::default()) else { return };
    let mut checks = tokio::task::JoinSet::new();
    for sb in all.into_iter().filter(|s| s.state == SandboxState::Running) {
        let dir = engine.layout.sandbox_instance(&sb.id);
        if !airlock_redis::server::configured(&dir) {
            continue;
        }
        let engine = engine.clone();
        checks.spawn(async move {
            match tokio::time::timeout(CHECK_LIMIT, check(&engine, &sb, &dir)).await {
                Ok(Err(e)) => {
                    tracing::debug!(sandbox = %sb.id, error = %e, "could not ask a sandbox's Redis")
                }
                Err(_) => tracing::debug!(sandbox = %sb.id, "asking a sandbox's Redis took too long"),
                Ok(Ok(())) => {}
            }
        });
    }
    while checks.join_next().await.is_some() {}
}

/// Kills the script a busy Redis runs, or stops the server when Redis will
/// not kill it or answers nothing.
async fn check(engine: &Engine, sb: &Sandbox, dir: &InstanceDir) -> Result<()> {
    empty_long_log(dir);
    kill_forks(engine, sb, dir);
    // Not while an operation (a suspend's or a branch's SAVE, say) has the
    // server busy on the daemon's own behalf.
    let Some(_op) = engine.try_sandbox_lock(&sb.id) else { return Ok(()) };
    let asked = async {
        let mut admin = Admin::connect(dir).await?;
        let reply = admin.call(&["PING"]).await?;
        Ok::<_, airlock_core::error::Error>((admin, reply))
    };
    let (mut admin, reply) = match tokio::time::timeout(SILENT_FOR, asked).await {
        Ok(answered) => answered?,
        Err(_) => {
            airlock_redis::server::stop(dir).await;
            record(engine, sb, "server_stopped", "it answered nothing for 10 s");
            return Ok(());
        }
    };
    if !is_busy(&reply) {
        return Ok(());
    }
    for command in [["SCRIPT", "KILL"], ["FUNCTION", "KILL"]] {
        if matches!(admin.call(&command).await?, Reply::Status(_)) {
            record(engine, sb, "script_killed", &command.join(" "));
            return Ok(());
        }
    }
    // Still busy: a script that has written, which only ends with its server.
    if is_busy(&admin.call(&["PING"]).await?) {
        drop(admin);
        airlock_redis::server::stop(dir).await;
        record(engine, sb, "server_stopped", "the script had written, so Redis would not kill it");
    }
    Ok(())
}

/// Kills every process the sandbox's Redis forked. The agent's user may run
/// nothing that forks (no `SCRIPT DEBUG`, `BGSAVE` or replication), and the
/// daemon saves with `SAVE`, in the server itself; a fork would run a script
/// (a debugging session's copy) out of reach of the checks above, which ask
/// the server.
fn kill_forks(engine: &Engine, sb: &Sandbox, dir: &InstanceDir) {
    let Some(server) = airlock_redis::server::find(dir) else { return };
    for pid in engine.cgroups.members(&sb.id) {
        if pid != server && airlock_core::process::parent(pid) == Some(server) {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            record(engine, sb, "fork_killed", "a process the server forked");
        }
    }
}

/// Empties the server's log once it is longer than [`LOG_KEPT`] (the server
/// appends, so it goes on writing at the new end). The log is root's, in the
/// sandbox's root directory, and never opened through a link.
fn empty_long_log(dir: &InstanceDir) {
    let path = dir.redis_log();
    if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file() && m.len() > LOG_KEPT) {
        if let Ok(log) = airlock_host::storage::tree::open_log(&path) {
            let _ = log.set_len(0);
        }
    }
}

fn is_busy(reply: &Reply) -> bool {
    matches!(reply, Reply::Error(e) if e.starts_with("BUSY"))
}

fn record(engine: &Engine, sb: &Sandbox, action: &str, how: &str) {
    tracing::info!(sandbox = %sb.id, action, "watchdog stopped a runaway Redis script");
    engine.store().record_or_log(NewEvent {
        kind: EventKind::Watchdog,
        sandbox: Some(sb.id.clone()),
        golden: Some(sb.golden.clone()),
        reason: Some("redis_script_busy"),
        detail: json!({"store": "redis", "action": action, "how": how}),
        door: Some(Door::Reaper),
    });
}
