//! Disk headroom: what each sandbox may still write, kept so that all of them
//! together can never fill the volume, and enforced by the kernel.
//!
//! Where each sandbox's directory is a Btrfs subvolume with a quota group
//! (`storage::Backend::Subvolume`), its limit is not its whole allowance
//! (`--disk-limit`) but what it owns now plus a headroom the daemon promised
//! it, never more than the allowance. The promises are kept within the
//! volume's free space less its reserve, so every promise can be kept: a
//! sandbox writes into its headroom at any speed, buffered or not (the kernel
//! counts a buffered write against the limit when it is made, not when it
//! reaches the disk), and the first write past it fails in that sandbox alone
//! with `Disk quota exceeded`. Every running server's WAL is a subvolume of
//! its own, limited to [`WAL_LIMIT`] and promised whole, so a WAL write always
//! finds room: a neighbour never stops for a full disk.
//!
//! A fork or wake takes the floor (`--disk-headroom`) and a WAL's worth from
//! what nobody was promised ([`Headroom::promise`]), and waits or fails with
//! `disk_full` when that is gone. Each tick ([`Headroom::balance`]) what is
//! spare first tops floors up again, the neighbours that wrote least first,
//! then half of the rest is shared by the sandboxes that wrote since the last
//! tick, so a bulk load keeps its pace while room remains and the other half
//! stays for forks; a sandbox that stopped writing is brought back to the
//! floor. Nothing is promised that is not spare: once the volume is promised
//! away, a filler writes into what it was already given and then meets its
//! limit, and where the volume holds less than was promised (its count lags
//! its writes) the writers give back first. A suspended sandbox is
//! promised nothing. Promises are the kernel's limits, so they hold whether
//! the daemon runs or not.

use std::path::{Path, PathBuf};

pub use crate::engine::kept::Headroom;
use crate::engine::kept::{Groups, Ledger};
use crate::engine::Engine;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_host::storage::btrfs::{Qgroup, Usage};
use airlock_host::storage::WAL_LIMIT;
use airlock_state::store::SandboxFilter;

use super::volume::Space;
use super::SandboxState;

/// A golden build's claim on the volume; given back (its limit lifted, so
/// the golden it becomes is never limited) when dropped.
pub struct BuildPromise<'a> {
    engine: &'a Engine,
    dir: Option<PathBuf>,
}

impl BuildPromise<'_> {
    /// Whether the build wrote up to its limit: what failed then failed for
    /// want of room, whatever it said (a server that cannot write its WAL
    /// cannot write its log either).
    pub fn spent(&self) -> bool {
        let Some(dir) = self.dir.as_deref() else { return false };
        let ledger = self.engine.headroom.ledger.lock().unwrap_or_else(|p| p.into_inner());
        ledger.spent_builds.contains(dir) || Qgroup::of(dir).and_then(|g| g.usage()).is_ok_and(near_limit)
    }
}

impl Drop for BuildPromise<'_> {
    fn drop(&mut self) {
        let Some(dir) = self.dir.take() else { return };
        let mut ledger = self.engine.headroom.ledger.lock().unwrap_or_else(|p| p.into_inner());
        ledger.builds.remove(&dir);
        ledger.spent_builds.remove(&dir);
        ledger.charged.remove(&build_key(&dir));
        // What the build was promised is spare again: the next promise reads
        // the volume afresh rather than wait for the next tick.
        ledger.unpromised = None;
        drop(ledger);
        self.engine.cloner.unlimit(&dir);
    }
}

/// What one balance gives a sandbox.
struct Plan {
    reading: usize,
    /// What it is charged now.
    charged: u64,
    /// The most its limit may be (a build's is the volume's spare room).
    most: u64,
    /// Whether it wrote since the last reading.
    wrote: bool,
    /// What it may still write after the balance.
    give: u64,
}

/// One sandbox (or golden build) at a reading.
struct Reading {
    /// Its id, or a build's key.
    id: String,
    /// Its directory, whose subvolume's limit the balance sets.
    dir: PathBuf,
    /// A build: no allowance, and no WAL of its own.
    build: bool,
    /// Its server runs (or is being made): what it may write is promised.
    live: bool,
    /// Its limits are the balance's to change (it runs; one being made or
    /// reset has its first promise).
    adjust: bool,
    data: Usage,
    wal: Option<Usage>,
    groups: Groups,
}

impl Headroom {
    /// Whether headroom is kept on this data root (a subvolume per sandbox).
    pub fn applies(engine: &Engine) -> bool {
        engine.cloner.hard_quota()
    }

    /// Takes a new server's promise (the floor, and a WAL's worth) from what
    /// nobody was promised; false when it is not there.
    pub fn promise(&self, engine: &Engine) -> bool {
        self.promise_of(engine, first_promise(engine))
    }

    /// Takes `need` bytes from what nobody was promised; false when they are
    /// not there.
    fn promise_of(&self, engine: &Engine, need: u64) -> bool {
        if !Self::applies(engine) {
            return true;
        }
        // Until the next reading: admissions are one at a time and each holds
        // its turn until its sandbox is on record, which a reading then counts.
        let take = |ledger: &mut Ledger| match ledger.unpromised {
            Some(left) if left >= need => {
                ledger.unpromised = Some(left - need);
                true
            }
            _ => false,
        };
        if take(&mut self.ledger.lock().unwrap_or_else(|p| p.into_inner())) {
            return true;
        }
        // A refusal is made on a fresh reading only: the last tick's may be up
        // to a tick old, from before a delete gave space back.
        self.balance(engine);
        take(&mut self.ledger.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Gives the subvolume at `dir` (a sandbox's directory, just made or
    /// taken back for a wake or reset) its first promise: what it owns and
    /// the floor.
    pub fn limit_new(&self, engine: &Engine, dir: &std::path::Path) -> Result<()> {
        if !Self::applies(engine) {
            return Ok(());
        }
        let group =
            Qgroup::of(dir).map_err(|e| Error::io(format!("reading the quota of {}", dir.display()), &e))?;
        let usage =
            group.usage().map_err(|e| Error::io(format!("reading the quota of {}", dir.display()), &e))?;
        let id = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let own = self.ledger.lock().unwrap_or_else(|p| p.into_inner()).allowances.get(id).copied();
        let limit = usage.charged().saturating_add(floor(engine)).min(allowance(engine, own, &usage));
        tracing::debug!(dir = %dir.display(), limit, "a sandbox's first promise");
        airlock_host::storage::btrfs::limit(dir, limit)
            .map_err(|e| Error::io(format!("limiting {}", dir.display()), &e))
    }

    /// Makes the staging directory `dir` of a golden build, a subvolume held
    /// to a promise like a sandbox's (see the module's documentation), or a
    /// plain directory where no headroom is kept. Fails with `disk_full`
    /// when the volume cannot promise it the floor.
    pub fn build<'a>(&self, engine: &'a Engine, dir: &Path) -> Result<BuildPromise<'a>> {
        let io = |e: std::io::Error| Error::io(format!("making {}", dir.display()), &e);
        if !Self::applies(engine) {
            std::fs::create_dir(dir).map_err(io)?;
            return Ok(BuildPromise { engine, dir: None });
        }
        if !self.promise_of(engine, floor(engine)) {
            return Err(Error::new(
                ErrorCode::DiskFull,
                format!(
                    "the volume cannot promise a golden build the {} MiB it starts with",
                    floor(engine) >> 20
                ),
                "delete or suspend sandboxes you no longer need, or give the volume more space, and build again",
            ));
        }
        engine.cloner.make_sandbox_dir(dir).map_err(io)?;
        // From here on the promise removes what it made.
        let promise = BuildPromise { engine, dir: Some(dir.to_owned()) };
        self.limit_new(engine, dir)?;
        let group = Qgroup::of(dir).map_err(io)?;
        self.ledger.lock().unwrap_or_else(|p| p.into_inner()).builds.insert(dir.to_owned(), group);
        Ok(promise)
    }

    /// Promises nothing more to a sandbox whose server stopped: its limit
    /// becomes what it owns.
    pub fn withdraw(&self, engine: &Engine, id: &str) {
        if !Self::applies(engine) {
            return;
        }
        let dir = engine.layout.sandbox(id);
        if let Ok(usage) = Qgroup::of(&dir).and_then(|g| g.usage()) {
            tracing::debug!(sandbox = %id, limit = usage.charged() + (1 << 20), "a suspended sandbox's promise withdrawn");
            let _ = airlock_host::storage::btrfs::limit(&dir, usage.charged() + (1 << 20));
        }
        let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        ledger.charged.remove(id);
    }

    /// Forgets where a sandbox's quota groups are, for a reset that gave it
    /// another WAL subvolume (its old one may be another sandbox's next).
    pub fn regroup(&self, id: &str) {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner()).groups.remove(id);
    }

    /// Forgets a sandbox that is gone.
    pub fn forget(&self, id: &str) {
        let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        ledger.groups.remove(id);
        ledger.charged.remove(id);
        ledger.allowances.remove(id);
    }

    /// Gives sandbox `id` an allowance of `bytes` instead of `--disk-limit`
    /// (before its directory is made).
    pub fn allow(&self, id: &str, bytes: u64) {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner()).allowances.insert(id.to_owned(), bytes);
    }

    /// What sandbox `id` may still write of its allowance; None where no
    /// headroom is kept (the volume cannot limit a sandbox).
    pub fn remaining(&self, engine: &Engine, id: &str) -> Option<u64> {
        if !Self::applies(engine) {
            return None;
        }
        let usage = Qgroup::of(&engine.layout.sandbox(id)).ok()?.usage().ok()?;
        let own = self.ledger.lock().unwrap_or_else(|p| p.into_inner()).allowances.get(id).copied();
        Some(allowance(engine, own, &usage).saturating_sub(usage.exclusive))
    }

    /// One reading of the volume and every sandbox's quota groups, and new
    /// limits (see the module's documentation).
    pub fn balance(&self, engine: &Engine) {
        if !Self::applies(engine) {
            return;
        }
        let filter = SandboxFilter { pooled: true, ..Default::default() };
        let Ok(sandboxes) = engine.store().sandboxes(&filter) else { return };
        let known = self.ledger.lock().unwrap_or_else(|p| p.into_inner()).groups.clone();
        let mut readings = Vec::new();
        // Sandboxes being made whose subvolumes are not there yet hold their
        // first promise all the same.
        let mut unread: u64 = 0;
        for sb in &sandboxes {
            if sb.state == SandboxState::Deleting {
                continue;
            }
            let live_state = matches!(
                sb.state,
                SandboxState::Running
                    | SandboxState::Pooled
                    | SandboxState::Creating
                    | SandboxState::Resetting
            );
            let groups = match known.get(&sb.id).cloned().or_else(|| find_groups(engine, &sb.id)) {
                Some(g) => g,
                None => {
                    if live_state {
                        unread += first_promise(engine);
                    }
                    continue;
                }
            };
            let (Ok(data), wal) = (groups.data.usage(), groups.wal.as_ref().map(Qgroup::usage)) else {
                continue;
            };
            let adjust = matches!(sb.state, SandboxState::Running | SandboxState::Pooled);
            let live = adjust || matches!(sb.state, SandboxState::Creating | SandboxState::Resetting);
            readings.push(Reading {
                id: sb.id.clone(),
                dir: engine.layout.sandbox(&sb.id),
                build: false,
                live,
                adjust,
                data,
                wal: wal.and_then(|w| w.ok()),
                groups,
            });
        }
        let builds = self.ledger.lock().unwrap_or_else(|p| p.into_inner()).builds.clone();
        for (dir, group) in builds {
            let Ok(data) = group.usage() else { continue };
            readings.push(Reading {
                id: build_key(&dir),
                dir,
                build: true,
                live: true,
                adjust: true,
                data,
                wal: None,
                groups: Groups { data: group, wal: None },
            });
        }
        let Some(Space { free, reserve, .. }) = Space::read(engine) else { return };
        // Buffered writes not yet on disk will take the volume's space too.
        let pending: u64 =
            readings.iter().map(|r| r.data.reserved_data + r.wal.map_or(0, |w| w.reserved_data)).sum();
        let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        let room = free.saturating_sub(reserve).saturating_sub(pending);
        // What is promised now: each live server's WAL, and what each
        // sandbox may still write.
        // (A WAL not there to read yet, or a Redis-only sandbox's, which has
        // none, is counted whole.)
        let mut promised: u64 = unread
            + readings
                .iter()
                .filter(|r| r.live && !r.build)
                .map(|r| r.wal.map_or(WAL_LIMIT, |w| may_write(w, WAL_LIMIT)))
                .sum::<u64>();
        let floor = floor(engine);
        let mut plans: Vec<Plan> = Vec::new();
        for (i, r) in readings.iter().enumerate() {
            if !r.live {
                continue;
            }
            let charged = r.data.charged();
            let has = may_write(r.data, first_promise(engine));
            if r.data.limit == u64::MAX {
                // Being made: its maker sets its limit.
                promised = promised.saturating_add(has);
                continue;
            }
            // Wrote since the last reading, or used up half of its floor. A
            // build is a writer until it ends: it writes in bursts, and a
            // limit lowered between two would fail it.
            let wrote = ledger.charged.get(&r.id).is_some_and(|before| charged >= before + (1 << 20))
                || has < floor / 2
                || r.build;
            if r.build && near_limit(r.data) {
                ledger.spent_builds.insert(r.dir.clone());
            }
            ledger.charged.insert(r.id.clone(), charged);
            promised = promised.saturating_add(has);
            if r.adjust {
                let most = if r.build {
                    u64::MAX
                } else {
                    allowance(engine, ledger.allowances.get(&r.id).copied(), &r.data)
                };
                plans.push(Plan { reading: i, charged, most, wrote, give: has });
            }
        }
        let mut spare = room as i128 - promised as i128;
        // Over-promised (the volume's count lags, or a golden build took
        // space): take back what writers got beyond the floor, then their
        // floor, so the fillers meet their limit first. A sandbox that did
        // not write keeps its floor: the reserve is there for the rest.
        for keep in [floor, 0] {
            for plan in plans.iter_mut().filter(|p| p.wrote) {
                if spare >= 0 {
                    break;
                }
                let back = plan.give.saturating_sub(keep).min((-spare) as u64);
                plan.give -= back;
                spare += back as i128;
            }
        }
        // Idle sandboxes hold the floor, no more.
        for plan in plans.iter_mut().filter(|p| !p.wrote && p.give > floor) {
            spare += (plan.give - floor) as i128;
            plan.give = floor;
        }
        // What is spare tops up floors first, the least left first (the
        // neighbours that write least), then half of the rest is shared by
        // those that wrote.
        plans.sort_by_key(|p| p.give);
        for plan in plans.iter_mut() {
            let want = floor.min(plan.most.saturating_sub(plan.charged)).saturating_sub(plan.give);
            let more = want.min(spare.max(0) as u64);
            plan.give += more;
            spare -= more as i128;
        }
        let writers = plans.iter().filter(|p| p.wrote).count() as u64;
        if writers > 0 && spare > 0 {
            let share = spare as u64 / 2 / writers;
            for plan in plans.iter_mut().filter(|p| p.wrote) {
                let more = share.min(plan.most.saturating_sub(plan.charged + plan.give));
                plan.give += more;
                spare -= more as i128;
            }
        }
        // Said once a minute at most: a count that lags its writes is
        // over by a little for a moment all the time.
        let said = ledger.warned.is_some_and(|at| at.elapsed() < std::time::Duration::from_secs(60));
        if spare < -(64 << 20) && !said {
            ledger.warned = Some(std::time::Instant::now());
            tracing::warn!(
                free,
                reserve,
                over = -spare,
                "the volume holds less than its sandboxes were promised (a golden build or files outside Airlock took it?)"
            );
        }
        let unpromised = spare.max(0) as u64;
        ledger.unpromised = Some(unpromised);
        // Found once, when complete (a WAL's subvolume is made while the
        // data directory is cloned).
        for r in readings.iter().filter(|r| r.groups.wal.is_some() && !r.build) {
            ledger.groups.entry(r.id.clone()).or_insert_with(|| r.groups.clone());
        }
        drop(ledger);
        if unpromised >= first_promise(engine) {
            engine.room.freed.notify_waiters();
        }
        for plan in plans {
            let r = &readings[plan.reading];
            let limit = plan.charged + plan.give;
            // A limit changed only when it moves by a megabyte or more (each
            // change is a Btrfs transaction), or when it is taken back.
            if r.data.limit.abs_diff(limit) >= 1 << 20 || limit < r.data.limit {
                tracing::debug!(sandbox = %r.id, limit, was = r.data.limit, "balancing a sandbox's headroom");
                if let Err(e) = airlock_host::storage::btrfs::limit(&r.dir, limit) {
                    tracing::debug!(sandbox = %r.id, error = %e, "could not set a sandbox's disk headroom");
                }
            }
        }
    }

    /// Whether a sandbox wrote up to one of its own limits (its data's or its
    /// WAL's): a server that stopped then stopped for its own writes, and its
    /// files are as consistent as after any crash.
    pub fn at_its_limit(&self, engine: &Engine, id: &str) -> bool {
        if !Self::applies(engine) {
            return false;
        }
        let known = self.ledger.lock().unwrap_or_else(|p| p.into_inner()).groups.get(id).cloned();
        let Some(groups) = known.or_else(|| find_groups(engine, id)) else { return false };
        groups.data.usage().is_ok_and(near_limit)
            || groups.wal.is_some_and(|w| w.usage().is_ok_and(near_limit))
    }

    /// What nobody was promised at the last reading, for `doctor` and errors.
    pub fn unpromised(&self) -> Option<u64> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner()).unpromised
    }
}

/// Within a few megabytes of a limit: the write that failed was larger than
/// what was left.
fn near_limit(usage: Usage) -> bool {
    usage.limit > 0 && usage.headroom() < 8 << 20
}

/// How a build is known in the ledger (never a sandbox id, which has no `/`).
fn build_key(dir: &Path) -> String {
    format!("build:{}", dir.display())
}

/// The floor every running sandbox is promised (`--disk-headroom`).
fn floor(engine: &Engine) -> u64 {
    engine.config.disk_headroom_bytes
}

/// What a new server is promised: the floor and its WAL.
pub fn first_promise(engine: &Engine) -> u64 {
    floor(engine) + WAL_LIMIT
}

/// The most a sandbox's limit may be: what it owns of the golden's plus its
/// allowance (`--disk-limit`, or its own: `own`). (Its usage counts only what
/// it wrote: cloned extents stay the golden's.)
fn allowance(engine: &Engine, own: Option<u64>, usage: &Usage) -> u64 {
    own.unwrap_or(engine.config.disk_limit_bytes).max(usage.exclusive)
}

fn find_groups(engine: &Engine, id: &str) -> Option<Groups> {
    let dir = engine.layout.sandbox(id);
    let data = Qgroup::of(&dir).ok()?;
    let wal = Qgroup::of(&dir.join("pgdata/pg_wal")).ok().filter(|w| *w != data);
    Some(Groups { data, wal })
}

/// The error a fork or wake gets when the volume cannot promise it room.
pub fn no_room(engine: &Engine) -> Error {
    let need = first_promise(engine);
    Error::new(
        ErrorCode::DiskFull,
        format!(
            "the volume cannot promise another running sandbox its {} MiB of disk headroom and WAL",
            need >> 20
        ),
        "delete or suspend sandboxes you no longer need, wait (--wait 60s) for room (a deleted sandbox's \
         space comes back as the filesystem frees it, which takes seconds for a sandbox of many files), \
         lower --disk-headroom, or give the volume more space",
    )
}

/// Refuses settings under which no sandbox could be promised room, and says
/// plainly when one sandbox's allowance is more than the volume can hold.
pub fn check_volume(engine: &Engine) -> Result<Vec<String>> {
    let mut warnings = Vec::new();
    let Some(Space { size, reserve, .. }) = Space::read(engine) else { return Ok(warnings) };
    let room = size.saturating_sub(reserve);
    let limit = engine.config.disk_limit_bytes;
    if !Headroom::applies(engine) {
        warnings.push(format!(
            "this volume ({}) cannot limit what each sandbox writes: one sandbox can fill it and stop its \
             neighbours' servers; the reserve watch only samples. Use `airlock storage init --fs btrfs` for a \
             kernel-enforced quota per sandbox",
            engine.cloner.filesystem()
        ));
        return Ok(warnings);
    }
    let need = first_promise(engine);
    if need > room {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            format!(
                "the volume gives sandboxes {} MiB in all (its size less its reserve), less than one running \
                 sandbox needs ({} MiB of headroom and WAL)",
                room >> 20,
                need >> 20
            ),
            "give the volume more space (`storage init --size`), or lower --disk-reserve or --disk-headroom",
        ));
    }
    if limit > room {
        warnings.push(format!(
            "a sandbox may grow by up to {} MiB (--disk-limit), more than the {} MiB the volume gives sandboxes \
             in all: one sandbox may take all of it, and forks then wait or fail with disk_full (its neighbours \
             keep their headroom)",
            limit >> 20,
            room >> 20
        ));
    }
    Ok(warnings)
}

/// What a subvolume may still write: its headroom, or, when it has no limit
/// yet (it is being made, and its maker sets one a moment later), what it is
/// about to be promised. Counted as unlimited, one such reading would make
/// the volume look promised many times over and take every writer's room back.
fn may_write(usage: Usage, about_to_get: u64) -> u64 {
    match usage.limit {
        u64::MAX => about_to_get.saturating_sub(usage.charged()),
        _ => usage.headroom(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subvolume_being_made_promises_what_it_is_about_to_get_not_the_whole_volume() {
        let made = Usage { exclusive: 10 << 20, reserved: 0, reserved_data: 0, limit: 74 << 20 };
        assert_eq!(may_write(made, 1 << 30), 64 << 20, "a limited one may write its headroom");
        let being_made = Usage { limit: u64::MAX, ..made };
        assert_eq!(may_write(being_made, WAL_LIMIT), WAL_LIMIT - (10 << 20));
        // Summed with its neighbours', it leaves room to spare.
        let promised: u64 = [made, being_made].iter().map(|u| may_write(*u, WAL_LIMIT)).sum();
        assert!(promised < 1 << 30, "{promised}");
    }
}
