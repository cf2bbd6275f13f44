//! Moves into a cgroup that do not wait on the kernel: the host's cgroup2
//! mount with `favordynmods`.
//!
//! Every server a fork starts joins its sandbox's cgroups by a write to
//! `cgroup.procs` ([`crate::cgroup::join`]). By default a move takes one
//! host-wide lock that every fork and exit takes on its fast path, and the
//! kernel makes each move wait for an RCU grace period before it has that
//! lock: 5 to 13 ms a move on a small virtual machine, on the clock of every
//! cold fork. `favordynmods` (Linux 6.0) turns that around: moves are cheap
//! (0.2 ms measured), and forks and exits take a lock more. It is an option of
//! the kernel's one cgroup2 hierarchy, which serves moves in v1 hierarchies
//! too, so the mount it is set on is the cgroup2 one whichever layout
//! Airlock's limits use. On recent kernels (6.18 here) the per-process lock it
//! brings stays until the next boot, even if the option is taken off again.
//!
//! The option is set by remounting the cgroup2 mount under `/sys/fs/cgroup`
//! (a path only root controls) with the options it already has and this
//! one; nothing else of the mount changes. A mount that is read-only where
//! its hierarchy is not (or the reverse) is left alone: a remount's
//! read-only flag is the hierarchy's, for every mount of it on the host.

use std::path::PathBuf;

/// Where the host stands on cheap cgroup moves.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum CgroupMoves {
    /// The cgroup2 mount has `favordynmods`: a move does not wait.
    Favored {
        /// The cgroup2 mount.
        #[schema(value_type = String)]
        mount: PathBuf,
    },
    /// The cgroup2 mount lacks `favordynmods`: each move waits for the kernel.
    Waiting {
        /// The cgroup2 mount.
        #[schema(value_type = String)]
        mount: PathBuf,
    },
    /// No cgroup2 hierarchy is mounted under `/sys/fs/cgroup`, so the option is not set.
    NoHierarchy,
}

/// How the host's cgroup moves are now.
pub fn state() -> CgroupMoves {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    match Cgroup2Mount::find(&mountinfo) {
        Some(m) if m.has_option("favordynmods") => CgroupMoves::Favored { mount: m.point },
        Some(m) => CgroupMoves::Waiting { mount: m.point },
        None => CgroupMoves::NoHierarchy,
    }
}

/// Sets `favordynmods` on the cgroup2 mount where it is not yet (root only):
/// how the host stands after the remount, or `None` where there was nothing
/// to do (set already, or no cgroup2 mount). An error says why it was not
/// tried or why the kernel refused (one older than 6.0 knows no such option).
pub fn favor() -> std::io::Result<Option<CgroupMoves>> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let Some(mount) = Cgroup2Mount::find(&mountinfo).filter(|m| !m.has_option("favordynmods")) else {
        return Ok(None);
    };
    mount.read_only_alike()?;
    let (flags, data) = mount.remount_with("favordynmods");
    nix::mount::mount(None::<&str>, &mount.point, None::<&str>, flags, Some(data.as_str())).map_err(|e| {
        std::io::Error::other(format!("remounting {} with favordynmods: {e}", mount.point.display()))
    })?;
    Ok(Some(state()))
}

/// The cgroup2 mount as `/proc/self/mountinfo` tells it.
#[derive(Debug, PartialEq, Eq)]
struct Cgroup2Mount {
    point: PathBuf,
    /// The mount's own options (`rw,nosuid,nodev,noexec,relatime`).
    mount_options: Vec<String>,
    /// The hierarchy's options (`rw,nsdelegate,memory_recursiveprot`).
    super_options: Vec<String>,
}

impl Cgroup2Mount {
    /// The first cgroup2 mount under `/sys/fs/cgroup` in a mountinfo text
    /// (one elsewhere may be under a directory a user can change, and the
    /// remount looks its path up again). Each line is `id parent dev root
    /// point options [optional fields...] - type source super-options`.
    fn find(mountinfo: &str) -> Option<Cgroup2Mount> {
        Self::all(mountinfo).find(|m| m.point.starts_with("/sys/fs/cgroup"))
    }

    /// Every cgroup2 mount in a mountinfo text, in order.
    fn all(mountinfo: &str) -> impl Iterator<Item = Cgroup2Mount> + '_ {
        mountinfo.lines().filter_map(|line| {
            let (mine, theirs) = line.split_once(" - ")?;
            let mut theirs = theirs.split(' ');
            if theirs.next()? != "cgroup2" {
                return None;
            }
            let super_options = theirs.nth(1)?;
            let mut mine = mine.split(' ');
            let point = mine.nth(4)?;
            let mount_options = mine.next()?;
            let list = |s: &str| s.split(',').filter(|o| !o.is_empty()).map(str::to_owned).collect();
            Some(Cgroup2Mount {
                point: PathBuf::from(unescape(point)),
                mount_options: list(mount_options),
                super_options: list(super_options),
            })
        })
    }

    /// An error where the mount is read-only and its hierarchy is not, or
    /// the reverse: a remount's read-only flag would be the hierarchy's, for
    /// every mount of it on the host.
    fn read_only_alike(&self) -> std::io::Result<()> {
        let read_only = |options: &[String]| options.iter().any(|o| o == "ro");
        if read_only(&self.mount_options) == read_only(&self.super_options) {
            return Ok(());
        }
        Err(std::io::Error::other(format!(
            "{} is read-only where its hierarchy is not (or the reverse): a remount would change that for every mount \
             of the hierarchy, so it is left alone",
            self.point.display()
        )))
    }

    fn has_option(&self, option: &str) -> bool {
        self.super_options.iter().any(|o| o == option)
    }

    /// The flags and data of a remount that keeps every option the mount and
    /// its hierarchy have and adds `option`: a remount resets whatever it does
    /// not name (`nosuid`, `nsdelegate`...).
    fn remount_with(&self, option: &str) -> (nix::mount::MsFlags, String) {
        use nix::mount::MsFlags;
        let mut flags = MsFlags::MS_REMOUNT;
        for o in &self.mount_options {
            flags |= match o.as_str() {
                "ro" => MsFlags::MS_RDONLY,
                "nosuid" => MsFlags::MS_NOSUID,
                "nodev" => MsFlags::MS_NODEV,
                "noexec" => MsFlags::MS_NOEXEC,
                "noatime" => MsFlags::MS_NOATIME,
                "nodiratime" => MsFlags::MS_NODIRATIME,
                "relatime" => MsFlags::MS_RELATIME,
                "strictatime" => MsFlags::MS_STRICTATIME,
                // (nix names no flag for it.)
                "nosymfollow" => MsFlags::from_bits_retain(nix::libc::MS_NOSYMFOLLOW),
                _ => MsFlags::empty(),
            };
        }
        // `rw`/`ro` of the hierarchy are the flags' to say, not the data's.
        let mut data: Vec<&str> =
            self.super_options.iter().map(String::as_str).filter(|o| !matches!(*o, "rw" | "ro")).collect();
        data.push(option);
        (flags, data.join(","))
    }
}

/// A mountinfo path with its octal escapes (`\040` for a space) undone.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::mount::MsFlags;

    /// A hybrid host (v1 controllers, cgroup2 beside them) and a v2-only one,
    /// as their kernels print them.
    const HYBRID: &str = "\
25 30 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 25 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
33 31 0:28 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,memory
32 31 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
";
    const V2: &str = "\
35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot,favordynmods
";

    #[test]
    fn the_cgroup2_mount_is_found_with_both_lists_of_options() {
        let m = Cgroup2Mount::find(HYBRID).unwrap();
        assert_eq!(m.point, PathBuf::from("/sys/fs/cgroup/unified"));
        assert_eq!(m.mount_options, ["rw", "nosuid", "nodev", "noexec", "relatime"]);
        assert_eq!(m.super_options, ["rw", "nsdelegate"]);
        assert!(!m.has_option("favordynmods"));
        assert!(Cgroup2Mount::find(V2).unwrap().has_option("favordynmods"));
        assert_eq!(Cgroup2Mount::find(&HYBRID.replace("cgroup2", "cgroup")), None);
    }

    #[test]
    fn a_mount_read_only_unlike_its_hierarchy_is_left_alone() {
        let read_only_view =
            HYBRID.replace("/sys/fs/cgroup/unified rw,nosuid", "/sys/fs/cgroup/unified ro,nosuid");
        let err = Cgroup2Mount::find(&read_only_view).unwrap().read_only_alike().unwrap_err();
        assert!(err.to_string().contains("left alone"), "{err}");
        let read_only_hierarchy = HYBRID.replace("cgroup2 rw,nsdelegate", "cgroup2 ro,nsdelegate");
        assert!(Cgroup2Mount::find(&read_only_hierarchy).unwrap().read_only_alike().is_err());
        assert!(Cgroup2Mount::find(HYBRID).unwrap().read_only_alike().is_ok());
    }

    #[test]
    fn a_remount_keeps_every_option_it_had() {
        let (flags, data) = Cgroup2Mount::find(HYBRID).unwrap().remount_with("favordynmods");
        assert_eq!(
            flags,
            MsFlags::MS_REMOUNT
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV
                | MsFlags::MS_NOEXEC
                | MsFlags::MS_RELATIME
        );
        assert_eq!(data, "nsdelegate,favordynmods");
    }

    #[test]
    fn escaped_mount_points_are_read_back_and_only_one_under_sys_fs_cgroup_is_taken() {
        let line = "32 31 0:27 / /mnt/c\\040g\\134x rw,relatime - cgroup2 none rw\n";
        assert_eq!(Cgroup2Mount::all(line).next().unwrap().point, PathBuf::from("/mnt/c g\\x"));
        assert_eq!(Cgroup2Mount::find(line), None);
        let both = format!("{line}{V2}");
        assert_eq!(Cgroup2Mount::find(&both).unwrap().point, PathBuf::from("/sys/fs/cgroup"));
        assert_eq!(unescape("a\\04"), "a\\04");
    }

    /// On this host (as root): set, it reads back set, and every option the
    /// mount had before is still there.
    #[test]
    fn favoring_moves_on_this_host_keeps_the_mount_as_it_was() {
        assert!(nix::unistd::geteuid().is_root(), "this test remounts the host's cgroup2: run it as root");
        let before = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let Some(was) = Cgroup2Mount::find(&before) else {
            assert_eq!(favor().unwrap(), None);
            assert_eq!(state(), CgroupMoves::NoHierarchy);
            return;
        };
        favor().unwrap();
        assert_eq!(state(), CgroupMoves::Favored { mount: was.point.clone() });
        let now = Cgroup2Mount::find(&std::fs::read_to_string("/proc/self/mountinfo").unwrap()).unwrap();
        assert_eq!(now.mount_options, was.mount_options);
        // (The kernel prints the hierarchy's options in an order of its own.)
        let set = |o: &[String]| o.iter().cloned().collect::<std::collections::BTreeSet<_>>();
        let mut expected = set(&was.super_options);
        expected.insert("favordynmods".into());
        assert_eq!(set(&now.super_options), expected);
        // Once set, nothing more is done.
        assert_eq!(favor().unwrap(), None);
    }
}
