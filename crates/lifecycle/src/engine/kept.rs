//! The state each part of the lifecycle keeps on the [`Engine`](super::Engine):
//! only its data here, so the engine names no module that takes an engine;
//! each part's workings are in its own module.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

use airlock_host::storage::btrfs::Qgroup;
use airlock_postgres::admin::Admin;

/// The queue forks and wakes wait in for room ([`crate::sandbox::capacity`]):
/// tokio's mutex, whose waiters are served first in, first out; what wakes
/// the queue when a sandbox is deleted or suspended; and how many in it wait
/// for room to be freed.
#[derive(Default)]
pub struct Room {
    /// Held by the fork or wake whose turn it is.
    pub admission: tokio::sync::Mutex<()>,
    /// Notified when room is freed.
    pub freed: tokio::sync::Notify,
    /// Forks and wakes in the queue waiting for room to be freed.
    pub waiting: std::sync::atomic::AtomicUsize,
}

/// The warm pool's own state ([`crate::sandbox::pool`]).
#[derive(Default)]
pub struct Pool {
    /// Wakes the filler (a claim took a member, a pool size or generation changed).
    pub wanted: tokio::sync::Notify,
    /// Admin sessions kept open on members, so a claim only has to make the role.
    pub admins: Mutex<HashMap<String, Admin>>,
}

/// The disk headroom promised, between two readings of the volume: the
/// ledger [`crate::sandbox::headroom`] keeps and balances.
#[derive(Default)]
pub struct Headroom {
    pub(crate) ledger: Mutex<Ledger>,
}

/// What was promised to whom, and what was read of the volume.
#[derive(Default)]
pub(crate) struct Ledger {
    /// Bytes of the volume (less its reserve) nobody was promised at the
    /// last reading, less what was promised since; `None` before the first.
    pub(crate) unpromised: Option<u64>,
    /// Each sandbox's quota groups, found once.
    pub(crate) groups: HashMap<String, Groups>,
    /// What each running sandbox's data was charged at the last reading.
    pub(crate) charged: HashMap<String, u64>,
    /// When an over-promise was last said in the log.
    pub(crate) warned: Option<std::time::Instant>,
    /// The golden builds under way: each one's staging directory and quota
    /// group.
    pub(crate) builds: HashMap<PathBuf, Qgroup>,
    /// The builds a reading found at their limit (a failed build is told
    /// `disk_full` by this even once its limit has moved again).
    pub(crate) spent_builds: std::collections::HashSet<PathBuf>,
    /// Sandboxes whose allowance is not `--disk-limit`: a migration test's
    /// fork on a sandbox's behalf gets what is left of that sandbox's.
    pub(crate) allowances: HashMap<String, u64>,
}

/// A sandbox's quota groups: its data's, and its WAL's where that has its own.
#[derive(Clone)]
pub(crate) struct Groups {
    pub(crate) data: Qgroup,
    pub(crate) wal: Option<Qgroup>,
}
