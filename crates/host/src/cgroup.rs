//! Resource limits per sandbox through cgroups: memory, pids and CPU weight, on
//! cgroup v2 or v1, whichever the host has.
//!
//! Each sandbox gets `airlock/<data-root tag>/<id>` in every hierarchy that
//! matters; the tag keeps two daemons with different data roots out of each
//! other's cgroups. A process
//! joins by writing `0` (itself) to `cgroup.procs` between fork and exec, so
//! everything the instance forks later is counted too. Exceeding the memory limit
//! kills a process of that sandbox only; the pids limit makes its forks fail.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The limits one sandbox gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CgroupLimits {
    /// Memory in bytes, page cache included.
    pub memory_bytes: u64,
    /// Processes and threads.
    pub pids: u64,
    /// CPU weight, 1–10000 (100 is the default share).
    pub cpu_weight: u64,
}

impl Default for CgroupLimits {
    fn default() -> Self {
        CgroupLimits { memory_bytes: 1 << 30, pids: 256, cpu_weight: 100 }
    }
}

/// Which cgroup layout the host has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Cgroups {
    /// The unified hierarchy, with the memory, pids and cpu controllers.
    V2 {
        /// Airlock's parent cgroup.
        #[schema(value_type = String)]
        root: PathBuf,
    },
    /// Separate memory, pids and cpu hierarchies.
    V1 {
        /// `<memory>/airlock/<tag>`.
        #[schema(value_type = String)]
        memory: PathBuf,
        /// `<pids>/airlock/<tag>`.
        #[schema(value_type = String)]
        pids: PathBuf,
        /// `<cpu>/airlock/<tag>`.
        #[schema(value_type = String)]
        cpu: PathBuf,
        /// `<freezer>/airlock/<tag>`, where the host has that hierarchy.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(value_type = Option<String>)]
        freezer: Option<PathBuf>,
    },
    /// No usable cgroups (not root, or not mounted).
    Unavailable,
}

const FS: &str = "/sys/fs/cgroup";

impl Cgroups {
    /// Finds the host's layout and makes the parent cgroups for one data root,
    /// named by `tag` (root only).
    pub fn detect(tag: &str) -> Cgroups {
        if !nix::unistd::geteuid().is_root() {
            return Cgroups::Unavailable;
        }
        let fs = Path::new(FS);
        if fs.join("cgroup.controllers").exists() {
            let controllers = std::fs::read_to_string(fs.join("cgroup.controllers")).unwrap_or_default();
            if ["memory", "pids", "cpu"].iter().all(|c| controllers.split_whitespace().any(|x| x == *c)) {
                let parent = fs.join("airlock");
                let root = parent.join(tag);
                let ok = std::fs::create_dir_all(&root).is_ok()
                    && std::fs::write(fs.join("cgroup.subtree_control"), "+memory +pids +cpu").is_ok()
                    && std::fs::write(parent.join("cgroup.subtree_control"), "+memory +pids +cpu").is_ok()
                    && std::fs::write(root.join("cgroup.subtree_control"), "+memory +pids +cpu").is_ok();
                if ok {
                    return Cgroups::V2 { root };
                }
            }
            return Cgroups::Unavailable;
        }
        let under = |controller: &str| fs.join(controller).join("airlock").join(tag);
        let (memory, pids, cpu) = (under("memory"), under("pids"), under("cpu"));
        if ["memory", "pids", "cpu"].iter().all(|c| fs.join(c).exists())
            && [&memory, &pids, &cpu].iter().all(|p| std::fs::create_dir_all(p).is_ok())
        {
            let freezer = Some(under("freezer"))
                .filter(|_| fs.join("freezer").exists())
                .filter(|f| std::fs::create_dir_all(f).is_ok());
            return Cgroups::V1 { memory, pids, cpu, freezer };
        }
        Cgroups::Unavailable
    }

    /// Whether limits can be applied.
    pub fn available(&self) -> bool {
        !matches!(self, Cgroups::Unavailable)
    }

    /// The directories of one sandbox's cgroups.
    fn dirs(&self, id: &str) -> Vec<PathBuf> {
        match self {
            Cgroups::V2 { root } => vec![root.join(id)],
            Cgroups::V1 { memory, pids, cpu, freezer } => {
                let mut dirs = vec![memory.join(id), pids.join(id), cpu.join(id)];
                dirs.extend(freezer.as_ref().map(|f| f.join(id)));
                dirs
            }
            Cgroups::Unavailable => vec![],
        }
    }

    /// Makes a sandbox's cgroups with its limits; returns the `cgroup.procs` files
    /// a process writes to join them.
    pub fn create(&self, id: &str, limits: &CgroupLimits) -> std::io::Result<Vec<CString>> {
        let files: Vec<(PathBuf, String)> = match self {
            Cgroups::V2 { root } => {
                let d = root.join(id);
                vec![
                    (d.join("memory.max"), limits.memory_bytes.to_string()),
                    (d.join("memory.swap.max"), "0".into()),
                    (d.join("pids.max"), limits.pids.to_string()),
                    (d.join("cpu.weight"), limits.cpu_weight.to_string()),
                ]
            }
            Cgroups::V1 { memory, pids, cpu, .. } => vec![
                (memory.join(id).join("memory.limit_in_bytes"), limits.memory_bytes.to_string()),
                (pids.join(id).join("pids.max"), limits.pids.to_string()),
                // v1 shares are 1024 for the default weight of 100.
                (cpu.join(id).join("cpu.shares"), (limits.cpu_weight * 1024 / 100).max(2).to_string()),
            ],
            Cgroups::Unavailable => vec![],
        };
        for dir in self.dirs(id) {
            std::fs::create_dir_all(&dir)?;
        }
        for (file, value) in files {
            // memory.swap.max is absent without swap accounting; the rest must take.
            if let Err(e) = std::fs::write(&file, value) {
                if !file.ends_with("memory.swap.max") {
                    self.remove(id);
                    return Err(e);
                }
            }
        }
        self.dirs(id)
            .into_iter()
            .map(|d| {
                CString::new(d.join("cgroup.procs").into_os_string().into_encoded_bytes())
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
            })
            .collect()
    }

    /// The `cgroup.procs` files of an existing sandbox cgroup (for `exec` and restarts).
    pub fn procs_files(&self, id: &str) -> Vec<CString> {
        self.dirs(id)
            .into_iter()
            .filter(|d| d.exists())
            .filter_map(|d| CString::new(d.join("cgroup.procs").into_os_string().into_encoded_bytes()).ok())
            .collect()
    }

    /// Pids still in a sandbox's cgroups.
    pub fn members(&self, id: &str) -> Vec<i32> {
        let mut pids: Vec<i32> = self
            .dirs(id)
            .into_iter()
            .flat_map(|d| {
                std::fs::read_to_string(d.join("cgroup.procs"))
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect();
        pids.sort();
        pids.dedup();
        pids
    }

    /// Freezes every process of a sandbox (and any it forks meanwhile) at
    /// once, as one instant: returns once the kernel says all are frozen,
    /// within `limit`; false where the host has no freezer for its cgroups.
    pub fn freeze(&self, id: &str, limit: std::time::Duration) -> std::io::Result<bool> {
        let (file, value, done): (PathBuf, &str, fn(&str) -> bool) = match self {
            Cgroups::V2 { root } => {
                (root.join(id).join("cgroup.freeze"), "1", |events| events.lines().any(|l| l == "frozen 1"))
            }
            Cgroups::V1 { freezer: Some(f), .. } => {
                (f.join(id).join("freezer.state"), "FROZEN", |state| state.trim() == "FROZEN")
            }
            _ => return Ok(false),
        };
        if !file.parent().is_some_and(Path::exists) {
            return Ok(false);
        }
        std::fs::write(&file, value)?;
        let shown = match self {
            Cgroups::V2 { root } => root.join(id).join("cgroup.events"),
            _ => file.clone(),
        };
        let deadline = std::time::Instant::now() + limit;
        loop {
            if done(&std::fs::read_to_string(&shown)?) {
                return Ok(true);
            }
            if std::time::Instant::now() > deadline {
                self.thaw(id);
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("the processes of {id} were not all frozen within {limit:?}"),
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Lets a frozen sandbox's processes run again (nothing where none is frozen).
    pub fn thaw(&self, id: &str) {
        let (file, value) = match self {
            Cgroups::V2 { root } => (root.join(id).join("cgroup.freeze"), "0"),
            Cgroups::V1 { freezer: Some(f), .. } => (f.join(id).join("freezer.state"), "THAWED"),
            _ => return,
        };
        if file.exists() {
            let _ = std::fs::write(file, value);
        }
    }

    /// Removes a sandbox's cgroups (they must be empty of processes).
    pub fn remove(&self, id: &str) {
        for dir in self.dirs(id) {
            let _ = std::fs::remove_dir(dir);
        }
    }

    /// Names of sandbox cgroups that exist (to clean up orphans).
    pub fn existing(&self) -> Vec<String> {
        let parent = match self {
            Cgroups::V2 { root } => root.clone(),
            Cgroups::V1 { memory, .. } => memory.clone(),
            Cgroups::Unavailable => return vec![],
        };
        std::fs::read_dir(parent)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    }
}

/// In a child between fork and exec: join the cgroups whose `cgroup.procs`
/// files are given. Only async-signal-safe calls.
pub fn join(procs: &[CString]) -> std::io::Result<()> {
    for file in procs {
        let fd =
            nix::fcntl::open(file.as_c_str(), nix::fcntl::OFlag::O_WRONLY, nix::sys::stat::Mode::empty())?;
        let written = nix::unistd::write(&fd, b"0");
        drop(fd);
        written?;
    }
    Ok(())
}
