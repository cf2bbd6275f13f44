//! The volume's free-space reserve: a full volume must harm only what filled it.
//!
//! Where each sandbox has a hard quota (Btrfs) a sandbox cannot write past its
//! own limit; where none is possible (XFS here, plain directories) its disk use
//! is only watched. Either way the sum of what sandboxes may write can exceed the
//! volume. So each tick the reaper compares the volume's free space with its
//! reserve (`--disk-reserve`). Nearing it, it samples, for each running sandbox,
//! how many bytes its processes have written (`/proc/<pid>/io`, summed over its
//! cgroup) and how much its directory takes on disk (walked by descriptor): the
//! first sees a long-lived writer between two syncs, the second what short-lived
//! processes wrote, which their counters no longer show;
//! below it, every sandbox writing fast enough to use up the remaining free space
//! within seconds is stopped at once (immediate shutdown, no checkpoint: nothing
//! more is written) and marked suspended with a `disk_reserve` event, and forks
//! and wakes wait for room (see `sandbox::capacity`). The reserve is the
//! neighbours' margin: a sandbox that writes slowly is never stopped, even while
//! the space a stopped writer left behind keeps the volume below its reserve.

use std::collections::HashMap;

use serde_json::json;

use airlock_core::events::NewEvent;
use airlock_lifecycle::engine::Engine;
use airlock_lifecycle::sandbox::volume::Space;
use airlock_lifecycle::sandbox::{suspend, SandboxState, SuspendReason};
use airlock_state::store::SandboxFilter;

/// Sampling starts when free space is below this many reserves.
const NEAR: u64 = 2;
/// A sandbox is filling the volume if, between two samples (a reaper tick
/// apart), it wrote more than this share of the free space (at that pace the
/// volume is full within about 50 ticks, ten seconds) and at least [`FAST_MIN`].
const FAST_SHARE: u64 = 50;
/// The least a sandbox must write between two samples to count as filling.
const FAST_MIN: u64 = 1 << 20;

/// What the reserve watch remembers between ticks.
#[derive(Default)]
pub struct Watch {
    /// Each running sandbox's bytes written and bytes on disk at the last sample.
    written: HashMap<String, (u64, u64)>,
}

impl Watch {
    /// One tick: sample near the reserve, stop the writer below it.
    pub async fn check(&mut self, engine: &Engine) {
        // Where sandboxes have quotas, their headroom keeps the volume whole.
        if airlock_lifecycle::sandbox::headroom::Headroom::applies(engine) {
            return;
        }
        let Space { free, reserve, .. } = Space::of(engine);
        if reserve == 0 || free >= reserve.saturating_mul(NEAR) {
            self.written.clear();
            return;
        }
        let Ok(all) = engine.store().sandboxes(&SandboxFilter::default()) else { return };
        let running: Vec<_> = all.into_iter().filter(|s| s.state == SandboxState::Running).collect();
        let children = (!engine.cgroups.available()).then(children_by_parent);
        let now: HashMap<String, (u64, u64)> = running
            .iter()
            .map(|sb| {
                let pids = match &children {
                    None => engine.cgroups.members(&sb.id),
                    // Without cgroups: the postmaster and its children.
                    Some(map) => sb
                        .pid
                        .into_iter()
                        .chain(sb.pid.and_then(|p| map.get(&p)).into_iter().flatten().copied())
                        .collect(),
                };
                let on_disk = airlock_host::storage::tree::allocated(&engine.layout.sandbox(&sb.id));
                (sb.id.clone(), (written(&pids), on_disk))
            })
            .collect();
        let before = std::mem::replace(&mut self.written, now);
        if free >= reserve {
            return;
        }
        // The writers: every sandbox that wrote fast since the last sample (a
        // sandbox seen for the first time has no rate yet).
        let fast = (free / FAST_SHARE).max(FAST_MIN);
        let writers: Vec<(u64, String)> = self
            .written
            .iter()
            .filter_map(|(id, (io, disk))| {
                let (io_before, disk_before) = before.get(id)?;
                Some((io.saturating_sub(*io_before).max(disk.saturating_sub(*disk_before)), id.clone()))
            })
            .filter(|(delta, _)| *delta >= fast)
            .collect();
        for (delta, id) in writers {
            self.written.remove(&id);
            tracing::warn!(sandbox = %id, free, reserve, "the volume reached its reserve; stopping a sandbox writing to it");
            engine.store().record_or_log(NewEvent {
                kind: airlock_core::events::EventKind::DiskReserve,
                sandbox: Some(id.clone()),
                reason: Some("stopped"),
                detail: json!({"free_bytes": free, "reserve_bytes": reserve, "written_bytes": delta}),
                ..Default::default()
            });
            if let Err(e) = suspend(engine, &id, SuspendReason::DiskFull).await {
                tracing::error!(sandbox = %id, error = %e, "could not stop a sandbox filling the volume");
            }
        }
    }
}

/// Bytes these processes have written (or dirtied) so far.
fn written(pids: &[i32]) -> u64 {
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/io")).ok())
        .filter_map(|io| {
            io.lines().find_map(|l| l.strip_prefix("write_bytes:").map(|v| v.trim().parse::<u64>().ok()))?
        })
        .sum()
}

/// Every process's children, by parent pid.
fn children_by_parent() -> HashMap<i32, Vec<i32>> {
    let mut map: HashMap<i32, Vec<i32>> = HashMap::new();
    for pid in std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
    {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        if let Some(ppid) =
            stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok())
        {
            map.entry(ppid).or_default().push(pid);
        }
    }
    map
}
