//! The isolation check, from the running processes rather than from the
//! store: each running sandbox must be served by servers of its own — alive,
//! working in its own directory, running as its own OS user — that no other
//! sandbox shares.

use airlock_lifecycle::sandbox::stores;
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use airlock_lifecycle::engine::Engine;
use airlock_lifecycle::sandbox::{Sandbox, SandboxState};
use airlock_state::store::SandboxFilter;

/// What one pass of the check found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Isolation {
    /// Running sandboxes handed to clients (pool members are not sessions).
    pub sessions: usize,
    /// Those served by a dedicated instance of their own.
    pub dedicated: usize,
    /// Every place two sandboxes were found sharing something.
    pub collisions: Vec<Collision>,
    /// Sessions that were not dedicated, and why.
    pub not_dedicated: Vec<String>,
}

impl Isolation {
    /// Dedicated sessions over all sessions (1 when there are none).
    pub fn ratio(&self) -> f64 {
        if self.sessions == 0 {
            1.0
        } else {
            self.dedicated as f64 / self.sessions as f64
        }
    }
}

/// Two sandboxes sharing what each must have alone.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Collision {
    /// What they share: `process`, `directory`, `socket` or `os_user`.
    pub shared: String,
    /// The two sandboxes, in order.
    pub sandboxes: (String, String),
}

/// One server process of a sandbox as the kernel sees it.
struct Observed {
    pid: i32,
    cwd: Option<PathBuf>,
    uid: Option<u32>,
}

fn observe(pid: i32) -> Observed {
    let proc = PathBuf::from(format!("/proc/{pid}"));
    Observed {
        pid,
        cwd: std::fs::read_link(proc.join("cwd")).ok(),
        uid: std::fs::metadata(&proc).ok().map(|m| m.uid()),
    }
}

/// Runs the check over every running sandbox (pool members included: a
/// collision with one counts as much).
pub fn check(engine: &Engine) -> Isolation {
    let Ok(all) = engine.store().sandboxes(&SandboxFilter { pooled: true, ..Default::default() }) else {
        return Isolation::default();
    };
    let running: Vec<&Sandbox> =
        all.iter().filter(|sb| matches!(sb.state, SandboxState::Running | SandboxState::Pooled)).collect();
    let root = engine.daemon_user.is_root();
    let mut result = Isolation::default();
    let mut owners: HashMap<(String, String), Vec<String>> = HashMap::new();
    let mut faults: HashMap<String, Vec<String>> = HashMap::new();
    for sb in &running {
        let dir = engine.layout.sandbox_instance(&sb.id);
        let own_root = engine.layout.sandbox(&sb.id);
        let own_root = std::fs::canonicalize(&own_root).unwrap_or(own_root);
        // Every store's server: the first's is the pid on record, the
        // others' as each store finds its own.
        let at = stores::At { engine, sb, dir: &dir };
        let servers: Vec<_> = stores::of_sandbox(&dir).into_iter().filter(|s| s.has_server()).collect();
        let pids: Vec<(&str, Option<i32>)> = servers
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name(), if i == 0 { sb.pid } else { s.pid(at) }))
            .collect();
        let expected_uid = engine.sandbox_user(sb).ok().map(|u| u.uid.as_raw());
        if root {
            if let Some(uid) = expected_uid {
                owners.entry(("os_user".into(), uid.to_string())).or_default().push(sb.id.clone());
            }
        }
        owners
            .entry(("socket".into(), dir.socket_dir().display().to_string()))
            .or_default()
            .push(sb.id.clone());
        for (server, pid) in pids {
            let Some(pid) = pid else {
                faults.entry(sb.id.clone()).or_default().push(format!("its {server} server has no process"));
                continue;
            };
            let seen = observe(pid);
            owners.entry(("process".into(), seen.pid.to_string())).or_default().push(sb.id.clone());
            match &seen.cwd {
                Some(cwd) => {
                    owners
                        .entry(("directory".into(), cwd.display().to_string()))
                        .or_default()
                        .push(sb.id.clone());
                    // A contained Redis sees its directory where its own root
                    // puts it (`redis::server::inside`).
                    let seen_at = (server == "redis").then(|| airlock_redis::server::inside(&dir));
                    if !cwd.starts_with(&own_root) && !seen_at.is_some_and(|at| cwd.starts_with(at)) {
                        faults.entry(sb.id.clone()).or_default().push(format!(
                            "its {server} server works in {}, not its own directory",
                            cwd.display()
                        ));
                    }
                }
                None => faults
                    .entry(sb.id.clone())
                    .or_default()
                    .push(format!("its {server} server (pid {pid}) is gone")),
            }
            if root && seen.uid.is_some() && seen.uid != expected_uid {
                faults.entry(sb.id.clone()).or_default().push(format!(
                    "its {server} server runs as uid {}, not its own",
                    seen.uid.unwrap_or_default()
                ));
            }
        }
    }
    let mut shared_by: HashMap<String, Vec<String>> = HashMap::new();
    for ((what, _), mut ids) in owners {
        ids.sort();
        ids.dedup();
        for pair in ids.windows(2) {
            result
                .collisions
                .push(Collision { shared: what.clone(), sandboxes: (pair[0].clone(), pair[1].clone()) });
            for id in pair {
                shared_by
                    .entry(id.clone())
                    .or_default()
                    .push(format!("it shares its {what} with another sandbox"));
            }
        }
    }
    result.collisions.sort_by(|a, b| (&a.shared, &a.sandboxes).cmp(&(&b.shared, &b.sandboxes)));
    for sb in running.iter().filter(|sb| sb.state == SandboxState::Running) {
        result.sessions += 1;
        let mut why = faults.remove(&sb.id).unwrap_or_default();
        why.extend(shared_by.remove(&sb.id).unwrap_or_default());
        if why.is_empty() {
            result.dedicated += 1;
        } else {
            result.not_dedicated.push(format!("{}: {}", sb.id, why.join("; ")));
        }
    }
    result
}
