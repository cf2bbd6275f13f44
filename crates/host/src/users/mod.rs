//! The OS identities involved: the daemon's own, the unprivileged user goldens are
//! built as, and one identity per sandbox, leased host-wide.
//!
//! A sandbox's identity is a pair of bare uids (and gids of the same numbers)
//! from a range of their own, by default 1,000,000,000–1,000,065,535: the even
//! one runs its server and owns its data, the odd one runs `airlock exec` code,
//! which so can neither read nor change the server's files nor trace its
//! processes, and reaches the server only through its socket (whose directory
//! and socket belong to the odd one's group). No passwd entry, no `useradd`, so
//! nothing on the host grows with the number of sandboxes and the system range
//! (which ends near a thousand) is never used. Leases are files in a
//! host-wide directory ([`DEFAULT_LEASE_DIR`]), created with `O_EXCL`, so two
//! daemons with different data roots can never hand out the same uid: a uid
//! serves one sandbox of one data root at a time. A lease names its data root and
//! sandbox; it is released when the sandbox's processes and files are gone, and a
//! lease whose data root no longer exists is reclaimed by whoever needs room.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::unistd::{Gid, Group, Uid, User};

use airlock_core::error::{Error, ErrorCode, Result};

pub mod place;
pub mod survey;

/// An OS user that processes run as and files belong to.
#[derive(Debug, Clone)]
pub struct Identity {
    /// Login name, or the uid as text for a sandbox's bare identity.
    pub name: String,
    /// User id.
    pub uid: Uid,
    /// Primary group id.
    pub gid: Gid,
}

impl Identity {
    /// The user this process runs as.
    pub fn current() -> Result<Identity> {
        let uid = nix::unistd::geteuid();
        let user = User::from_uid(uid)
            .ok()
            .flatten()
            .ok_or_else(|| Error::internal(format!("uid {uid} has no passwd entry")))?;
        Ok(Identity { name: user.name, uid, gid: user.gid })
    }

    /// A leased identity: the uid, and the gid of the same number.
    pub fn leased(uid: u32) -> Identity {
        Identity { name: uid.to_string(), uid: Uid::from_raw(uid), gid: Gid::from_raw(uid) }
    }

    /// Whether this is root.
    pub fn is_root(&self) -> bool {
        self.uid.is_root()
    }

    /// The identity a sandbox's server runs as: its leased uid when the daemon
    /// is root (a sandbox made before uids were leased keeps its named user,
    /// `slot`), else `instance_user`.
    pub fn of_sandbox(
        root: bool,
        instance_user: &Identity,
        uid: Option<u32>,
        slot: Option<i64>,
    ) -> Result<Identity> {
        match (root, uid, slot) {
            (true, Some(uid), _) => Ok(Identity::leased(uid)),
            (true, None, Some(slot)) => Identity::ensure(&format!("{}-{slot}", instance_user.name)),
            _ => Ok(instance_user.clone()),
        }
    }

    /// The user goldens are built as: the current user, or when running as root
    /// the configured user (default `airlock`), created as a system user if missing.
    pub fn for_instances(configured: Option<&str>) -> Result<Identity> {
        let me = Identity::current()?;
        if !me.is_root() {
            return Ok(me);
        }
        Identity::ensure(configured.unwrap_or("airlock"))
    }

    /// An unprivileged system user of this name, created if missing (as root only).
    pub fn ensure(name: &str) -> Result<Identity> {
        // useradd takes a lock on /etc/passwd; concurrent callers would fight over it.
        static CREATING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one_at_a_time = CREATING.lock().unwrap_or_else(|p| p.into_inner());
        // Another process (a second daemon) may be running useradd at the same
        // moment and hold its lock: try again for a while before giving up.
        for _ in 0..50 {
            if User::from_name(name).ok().flatten().is_some() {
                break;
            }
            let created = std::process::Command::new("useradd")
                .args(["--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent"])
                .args(["--shell", "/usr/sbin/nologin", name])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !created {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
        if User::from_name(name).ok().flatten().is_none() {
            return Err(Error::new(
                ErrorCode::PostgresFailed,
                format!("could not create the unprivileged user {name:?} that goldens are built as"),
                "create it yourself (`useradd --system NAME`), or name an existing one with --instance-user",
            ));
        }
        let user = User::from_name(name)
            .ok()
            .flatten()
            .ok_or_else(|| Error::internal(format!("user {name} vanished")))?;
        if user.uid.is_root() {
            return Err(Error::new(
                ErrorCode::InvalidRequest,
                format!("instance user {name:?} is root"),
                "PostgreSQL refuses to run as root: name an unprivileged user with --instance-user",
            ));
        }
        Ok(Identity { name: user.name, uid: user.uid, gid: user.gid })
    }

    /// Gives a file or directory (not following symlinks) to this user.
    pub fn own(&self, path: &Path) -> std::io::Result<()> {
        nix::unistd::fchownat(
            nix::fcntl::AT_FDCWD,
            path,
            Some(self.uid),
            Some(self.gid),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(std::io::Error::from)
    }
}

/// Where leases live unless configured otherwise.
pub const DEFAULT_LEASE_DIR: &str = "/var/lib/airlock-identities";
/// The first uid of the default range.
pub const DEFAULT_FIRST_UID: u32 = 1_000_000_000;
/// How many uids the default range holds.
pub const DEFAULT_UID_COUNT: u32 = 65_536;

/// A range of uids set aside for sandboxes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct UidRange {
    /// The first uid.
    pub first: u32,
    /// How many there are.
    pub count: u32,
}

impl Default for UidRange {
    fn default() -> Self {
        UidRange { first: DEFAULT_FIRST_UID, count: DEFAULT_UID_COUNT }
    }
}

impl UidRange {
    /// Parses `FIRST-LAST` (inclusive), such as `1000000000-1000065535`.
    pub fn parse(text: &str) -> Result<UidRange> {
        let bad = || {
            Error::new(
                ErrorCode::InvalidRequest,
                format!("{text:?} is not a uid range"),
                "give FIRST-LAST, such as 1000000000-1000065535, above 65535 and below 4294967295",
            )
        };
        let (a, b) = text.split_once('-').ok_or_else(bad)?;
        let (first, last): (u32, u32) =
            (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?);
        if first <= 65_535 || last < first || last == u32::MAX {
            return Err(bad());
        }
        Ok(UidRange { first, count: last - first + 1 })
    }

    /// The last uid.
    pub fn last(&self) -> u32 {
        self.first + (self.count - 1)
    }
}

/// The host-wide leases of sandbox identities, seen from one data root.
#[derive(Debug, Clone)]
pub struct Leases {
    dir: PathBuf,
    range: UidRange,
    home: PathBuf,
    /// Where a uid's files could outlive its sandbox ([`survey`]).
    shared: Vec<PathBuf>,
}

/// One lease as read back from its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The uid leased.
    pub uid: u32,
    /// The data root holding it.
    pub home: PathBuf,
    /// The sandbox it serves.
    pub sandbox: String,
}

impl Leases {
    /// Opens (creating, root-only) the lease directory for sandboxes of the data root `home`.
    pub fn open(dir: &Path, range: UidRange, home: &Path) -> Result<Leases> {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        let home = home.canonicalize().unwrap_or_else(|_| home.to_path_buf());
        let shared = crate::rootfs::PRIVATE_TMP.iter().map(PathBuf::from).collect();
        Ok(Leases { dir: dir.to_path_buf(), range, home, shared })
    }

    /// The range leases come from.
    pub fn range(&self) -> UidRange {
        self.range
    }

    fn path(&self, uid: u32) -> PathBuf {
        self.dir.join(uid.to_string())
    }

    /// Leases a free pair of uids to `sandbox`; returns the first (even offset),
    /// the second is the next number. Starts at a random point of the range so a
    /// free pair is usually found at the first try however many are held. A
    /// pair is free when no lease, passwd or group entry holds it, nothing in
    /// the host's shared directories belongs to it, and it is not quarantined
    /// since its last release ([`survey`]). When none is, the shared
    /// directories are surveyed afresh (which lifts quarantines) and leases of
    /// data roots that are gone are reclaimed, and the range is tried again.
    pub fn take(&self, sandbox: &str) -> Result<u32> {
        let pairs = self.range.count / 2;
        for attempt in 0..2 {
            if attempt == 1 {
                self.reclaim_abandoned();
            }
            let owners = survey::owners(&self.shared, &self.dir, attempt == 1);
            let start = u32::from_le_bytes(airlock_core::secret::random_bytes::<4>()) % pairs.max(1);
            for i in 0..pairs {
                let uid = self.range.first + 2 * ((start + i) % pairs);
                if [uid, uid + 1].iter().any(|id| taken_on_host(*id) || owners.contains(id))
                    || self.quarantined(uid)
                {
                    continue;
                }
                match self.create(uid, sandbox) {
                    Ok(()) => return Ok(uid),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Err(Error::new(
            ErrorCode::CapacityExhausted,
            format!("every sandbox identity of uids {}-{} is leased", self.range.first, self.range.last()),
            "delete sandboxes you no longer need, or give the daemons a larger --uid-range",
        ))
    }

    /// Whether `uid` was released and no survey has vouched for it since.
    fn quarantined(&self, uid: u32) -> bool {
        std::fs::symlink_metadata(survey::tombstone(&self.dir, uid)).is_ok()
    }

    fn create(&self, uid: u32, sandbox: &str) -> std::io::Result<()> {
        let mut f =
            std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(self.path(uid))?;
        writeln!(f, "{}\n{sandbox}", self.home.display())
    }

    /// Records that `sandbox` holds `uid` (after a restart, for a lease that went
    /// missing); fails if another data root or sandbox holds it.
    pub fn confirm(&self, uid: u32, sandbox: &str) -> Result<()> {
        match self.create(uid, sandbox) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => match self.read(uid) {
                Some(l) if l.home == self.home && l.sandbox == sandbox => Ok(()),
                Some(l) => Err(Error::internal(format!(
                    "uid {uid} of sandbox {sandbox} is leased to sandbox {} of {}",
                    l.sandbox,
                    l.home.display()
                ))),
                None => Err(Error::internal(format!("the lease of uid {uid} cannot be read"))),
            },
            Err(e) => Err(e.into()),
        }
    }

    /// Gives `uid` back, if `sandbox` of this data root holds it, into
    /// quarantine: it is leased again only once a survey begun after this has
    /// found nothing of it. Where the tombstone cannot be made, the lease is
    /// kept (the uid is lost to the range rather than given back unchecked).
    pub fn release(&self, uid: u32, sandbox: &str) {
        if self.read(uid).is_some_and(|l| l.home == self.home && l.sandbox == sandbox)
            && std::fs::write(survey::tombstone(&self.dir, uid), b"").is_ok()
        {
            let _ = std::fs::remove_file(self.path(uid));
        }
    }

    fn read(&self, uid: u32) -> Option<Lease> {
        let text = std::fs::read_to_string(self.path(uid)).ok()?;
        let mut lines = text.lines();
        let home = PathBuf::from(lines.next()?);
        let sandbox = lines.next()?.to_owned();
        Some(Lease { uid, home, sandbox })
    }

    /// Every lease on the host.
    pub fn all(&self) -> Vec<Lease> {
        std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(|uid| self.read(uid))
            .collect()
    }

    /// Leases held by this data root.
    pub fn mine(&self) -> Vec<Lease> {
        self.all().into_iter().filter(|l| l.home == self.home).collect()
    }

    /// Gives back, into quarantine as [`Leases::release`] does, leases whose
    /// data root is gone (no state store left); returns how many.
    pub fn reclaim_abandoned(&self) -> usize {
        let mut freed = 0;
        for lease in self.all() {
            if !lease.home.join("state.db").exists()
                && std::fs::write(survey::tombstone(&self.dir, lease.uid), b"").is_ok()
            {
                let _ = std::fs::remove_file(self.path(lease.uid));
                freed += 1;
            }
        }
        freed
    }
}

/// Whether a passwd or group entry already uses this number.
fn taken_on_host(id: u32) -> bool {
    User::from_uid(Uid::from_raw(id)).ok().flatten().is_some()
        || Group::from_gid(Gid::from_raw(id)).ok().flatten().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> (PathBuf, PathBuf) {
        let base = std::env::temp_dir().join(format!("airlock-leases-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let home = base.join("home");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::write(home.join("state.db"), b"").unwrap();
        (base.join("leases"), home)
    }

    #[test]
    fn ranges_parse_and_refuse_the_system_range() {
        assert_eq!(UidRange::parse("1000000000-1000065535").unwrap(), UidRange::default());
        assert!(UidRange::parse("100-999").is_err());
        assert!(UidRange::parse("2000000-1000000").is_err());
        assert!(UidRange::parse("x").is_err());
    }

    #[test]
    fn two_data_roots_never_share_a_uid_and_a_full_range_is_a_clear_error() {
        let (dir, home_a) = scratch("two");
        let home_b = home_a.with_file_name("other");
        std::fs::create_dir_all(&home_b).unwrap();
        std::fs::write(home_b.join("state.db"), b"").unwrap();
        let range = UidRange { first: 3_000_000_000, count: 80 };
        let a = Leases::open(&dir, range, &home_a).unwrap();
        let b = Leases::open(&dir, range, &home_b).unwrap();
        let mut seen = std::collections::HashSet::new();
        for i in 0..20 {
            assert!(seen.insert(a.take(&format!("sb-a{i}")).unwrap()));
            assert!(seen.insert(b.take(&format!("sb-b{i}")).unwrap()));
        }
        let full = a.take("sb-more").unwrap_err();
        assert_eq!(full.code, ErrorCode::CapacityExhausted);
        // Only the holder releases; B's lease survives A's attempt.
        let held_by_b = b.mine()[0].clone();
        a.release(held_by_b.uid, &held_by_b.sandbox);
        assert!(b.mine().contains(&held_by_b));
        b.release(held_by_b.uid, &held_by_b.sandbox);
        assert_eq!(a.take("sb-again").unwrap(), held_by_b.uid);
        // A data root that is gone gives its leases back to whoever needs room.
        std::fs::remove_file(home_b.join("state.db")).unwrap();
        let reclaimed = a.take("sb-reclaimed").unwrap();
        assert!(
            (range.first..range.first + 80).contains(&reclaimed)
                && (reclaimed - range.first).is_multiple_of(2)
        );
        assert_eq!(a.mine().len(), 22);
        std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }

    #[test]
    fn a_released_uid_is_leased_again_only_once_a_survey_begun_after_its_release_finds_nothing_of_it() {
        assert!(nix::unistd::geteuid().is_root(), "this test gives files to other uids: run it as root");
        let (dir, home) = scratch("quarantine");
        let shared = dir.with_file_name("shared");
        std::fs::create_dir_all(shared.join("deep")).unwrap();
        let mut leases = Leases::open(&dir, UidRange { first: 3_200_000_000, count: 4 }, &home).unwrap();
        leases.shared = vec![shared.clone()];
        // Quarantined while another pair is free: the other pair is leased.
        let a = leases.take("sb-a").unwrap();
        leases.release(a, "sb-a");
        assert!(survey::tombstone(&dir, a).exists());
        let b = leases.take("sb-b").unwrap();
        assert_ne!(a, b, "a released uid was leased again before any survey vouched for it");
        // With the range otherwise full, a fresh survey is made; a file the
        // released pair's exec uid left in a shared directory keeps it out.
        let left = shared.join("deep/left-behind");
        std::fs::write(&left, b"x").unwrap();
        std::os::unix::fs::chown(&left, Some(a + 1), Some(a + 1)).unwrap();
        assert_eq!(leases.take("sb-c").unwrap_err().code, ErrorCode::CapacityExhausted);
        assert!(
            survey::tombstone(&dir, a).exists(),
            "a survey that found the uid's file lifted its quarantine"
        );
        // Once nothing of it is left, the next survey lifts the quarantine.
        std::fs::remove_file(&left).unwrap();
        assert_eq!(leases.take("sb-c").unwrap(), a);
        assert!(!survey::tombstone(&dir, a).exists());
        // A data root that is gone gives its leases back into quarantine too.
        std::fs::remove_file(home.join("state.db")).unwrap();
        assert_eq!(leases.reclaim_abandoned(), 2);
        assert!(survey::tombstone(&dir, a).exists() && survey::tombstone(&dir, b).exists());
        std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }

    #[test]
    fn five_thousand_leases_are_held_at_once_without_reuse() {
        let (dir, home) = scratch("5k");
        let leases = Leases::open(&dir, UidRange { first: 3_100_000_000, count: 65_536 }, &home).unwrap();
        let mut seen = std::collections::HashSet::new();
        for i in 0..5000 {
            let uid = leases.take(&format!("sb-{i}")).unwrap();
            assert!(seen.insert(uid) && seen.insert(uid + 1), "a uid of the pair at {uid} was leased twice");
        }
        assert_eq!(leases.mine().len(), 5000);
        std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }
}
