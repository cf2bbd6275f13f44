//! Copy-on-write cloning of data directories, and per-sandbox disk quotas.
//!
//! The [`Cloner`] probes the volume once at start: if the filesystem takes
//! `FICLONE` (XFS with reflink=1, Btrfs), each file is cloned as a reflink, which
//! costs the same whatever the file's size; otherwise every byte is copied, and
//! every fork says so in a warning. On Btrfs with quotas on, each sandbox's
//! directory is also a subvolume of its own with a hard limit ([`btrfs`]).

pub mod beneath;
pub mod btrfs;
pub mod clone;
pub mod stock;
pub mod tree;
pub mod volume;

use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::users::Identity;

/// How files are cloned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// One `FICLONE` per file: shared extents, constant time per file.
    Reflink,
    /// Reflinks into a Btrfs subvolume per sandbox, with a hard quota on what
    /// it may write.
    Subvolume,
    /// A full copy of every byte (slow; time grows with data size).
    Copy,
}

/// What a server's WAL may take where sandboxes have quotas: its own
/// subvolume's limit. The server keeps it near `max_wal_size` (48 MB,
/// pinned on its command line) by checkpointing, so only a writer far faster
/// than its checkpoints meets this; whatever its neighbours do, every server's
/// WAL is always writable (see `sandbox::headroom`).
pub const WAL_LIMIT: u64 = 128 << 20;

/// The warning attached to every fork made on the copy fallback.
pub const COPY_WARNING: &str = "the data root is not on a copy-on-write filesystem, so this fork copied every byte of the golden; run `airlock storage init` as root (or put AIRLOCK_HOME on XFS or Btrfs) for millisecond forks";

/// Clones directory trees with the best method the volume supports.
#[derive(Debug, Clone)]
pub struct Cloner {
    backend: Backend,
    filesystem: String,
    /// Empty subvolumes to use again, where sandboxes get subvolumes.
    stock: Option<std::sync::Arc<stock::Stock>>,
}

/// Files that belong to a running server and must not be cloned.
const SKIP: &[&str] = &["postmaster.pid", "postmaster.opts"];

/// How a clone departs from a whole copy ([`Cloner::clone_shaped`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Shape<'a> {
    /// Directories (paths from the top) made empty.
    pub hollow: &'a [&'a str],
    /// Directories (paths from the top) whose files are left for later.
    pub deferred: &'a [&'a str],
    /// Files made under another name wherever they appear: `(name, new name)`.
    pub renamed: &'a [(&'a str, &'a str)],
    /// Names skipped wherever they appear (besides a running server's lock files).
    pub skip: &'a [&'a str],
}

/// What a data directory holds besides its configuration: what is taken from a
/// live sandbox (for a branch or a promotion), whose configuration files,
/// signal files and anything else its server's user put there are left behind.
const DATA_ENTRIES: &[&str] = &[
    "PG_VERSION",
    "base",
    "global",
    "pg_commit_ts",
    "pg_dynshmem",
    "pg_logical",
    "pg_multixact",
    "pg_notify",
    "pg_replslot",
    "pg_serial",
    "pg_snapshots",
    "pg_stat",
    "pg_stat_tmp",
    "pg_subtrans",
    "pg_tblspc",
    "pg_twophase",
    "pg_wal",
    "pg_xact",
];

/// The configuration files a data directory needs, taken from a trusted one.
const CONFIG_FILES: &[&str] = &["postgresql.conf", "postgresql.auto.conf"];

impl Cloner {
    /// Probes `volume` by cloning a small file inside it.
    pub fn probe(volume: &Path) -> std::io::Result<Cloner> {
        let src = volume.join(".probe-src");
        let dst = volume.join(".probe-dst");
        let _ = fs::remove_file(&src);
        let _ = fs::remove_file(&dst);
        fs::write(&src, b"airlock reflink probe")?;
        let cloned = clone::reflink_file(&src, &dst).is_ok();
        let _ = fs::remove_file(&src);
        let _ = fs::remove_file(&dst);
        let filesystem = filesystem_name(volume);
        let backend = match cloned {
            true if filesystem == "btrfs" && btrfs::quotas_work(volume) => Backend::Subvolume,
            true => Backend::Reflink,
            false => Backend::Copy,
        };
        let stock = match backend {
            Backend::Subvolume => stock::Stock::open(volume)
                .inspect_err(
                    |e| tracing::warn!(error = %e, "no stock of subvolumes: each is deleted and made anew"),
                )
                .ok()
                .map(std::sync::Arc::new),
            _ => None,
        };
        Ok(Cloner { backend, filesystem, stock })
    }

    /// A cloner that always copies (for tests of the fallback).
    pub fn copying(volume: &Path) -> Cloner {
        Cloner { backend: Backend::Copy, filesystem: filesystem_name(volume), stock: None }
    }

    /// The method in use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The volume's filesystem type, such as `xfs` or `ext4`.
    pub fn filesystem(&self) -> &str {
        &self.filesystem
    }

    /// Clones the tree at `src` to the new path `dst`, giving every entry to
    /// `owner`; returns the number of files. `source_owner`, when given, is who
    /// every entry of the source must belong to. The tree is walked by descriptor
    /// ([`tree`]): a link or anything but a directory or regular file in the
    /// source fails the clone, and whatever was made of `dst` is removed.
    pub fn clone_tree(
        &self,
        src: &Path,
        dst: &Path,
        owner: Option<&Identity>,
        source_owner: Option<nix::unistd::Uid>,
    ) -> std::io::Result<u64> {
        clone::clone_tree(src, dst, &self.spec(owner, source_owner, &[]))
    }

    /// [`Cloner::clone_tree`] shaped by `shape`: some directories left empty,
    /// the files of others left for the caller to finish, some files made
    /// under other names.
    pub fn clone_shaped(
        &self,
        src: &Path,
        dst: &Path,
        owner: Option<&Identity>,
        source_owner: Option<nix::unistd::Uid>,
        shape: &Shape<'_>,
    ) -> std::io::Result<(u64, clone::Deferred)> {
        let skip: Vec<&str> = SKIP.iter().chain(shape.skip).copied().collect();
        let spec = clone::CloneSpec {
            hollow: shape.hollow,
            deferred: shape.deferred,
            renamed: shape.renamed,
            skip: &skip,
            ..self.spec(owner, source_owner, &[])
        };
        clone::clone_tree_deferring(src, dst, &spec)
    }

    /// How this volume clones: reflinks where it can, WAL in a subvolume of its
    /// own where sandboxes have quotas.
    fn spec<'a>(
        &'a self,
        owner: Option<&'a Identity>,
        source_owner: Option<nix::unistd::Uid>,
        only: &'a [&'a str],
    ) -> clone::CloneSpec<'a> {
        let (contents, subvolumes): (_, &[&str]) = match self.backend {
            Backend::Reflink => (clone::Contents::Reflink, &[]),
            Backend::Subvolume => (clone::Contents::Reflink, &["pg_wal"]),
            Backend::Copy => (clone::Contents::Copy, &[]),
        };
        clone::CloneSpec {
            contents,
            owner,
            source_owner,
            skip: SKIP,
            only,
            subvolumes,
            subvolume_limit: WAL_LIMIT,
            stock: self.stock.as_deref(),
            hollow: &[],
            deferred: &[],
            renamed: &[],
        }
    }

    /// Clones a live sandbox's data directory for a branch or a promotion: its
    /// data only ([`DATA_ENTRIES`]); the configuration files come from `config`, a
    /// trusted data directory (the sandbox's golden), so nothing a sandbox's user
    /// wrote into its own (settings, libraries to load, recovery commands, signal
    /// files) is ever read by another server.
    pub fn clone_data(
        &self,
        src: &Path,
        config: &Path,
        dst: &Path,
        owner: Option<&Identity>,
        source_owner: Option<nix::unistd::Uid>,
    ) -> std::io::Result<u64> {
        let files = clone::clone_tree(src, dst, &self.spec(owner, source_owner, DATA_ENTRIES))?;
        let configured = CONFIG_FILES.iter().try_for_each(|name| {
            let text = std::fs::read(config.join(name)).unwrap_or_default();
            tree::write_new(&dst.join(name), &text, 0o600, owner)
        });
        if let Err(e) = configured {
            let _ = std::fs::remove_dir_all(dst);
            return Err(e);
        }
        Ok(files)
    }
}

impl Cloner {
    /// Makes a sandbox's directory: a subvolume of its own where quotas are
    /// possible, so that everything the sandbox writes (data, temporary files,
    /// its log, what `exec` leaves) counts against its limit; a directory
    /// elsewhere. Fails if `path` exists. (Its WAL, `pgdata/pg_wal`, is a
    /// subvolume apart: PostgreSQL stops the server at a failed WAL write, but
    /// fails only the statement at a failed data write, which is what a full
    /// allowance should do. WAL is recycled at each checkpoint, and the
    /// volume's reserve bounds it.)
    pub fn make_sandbox_dir(&self, path: &Path) -> std::io::Result<()> {
        match self.backend {
            Backend::Subvolume => match &self.stock {
                Some(stock) if stock.take_sandbox(path)? => Ok(()),
                _ => btrfs::create_subvolume(path),
            },
            _ => fs::create_dir(path),
        }
    }

    /// Limits what the sandbox directory at `path` may hold beyond its golden to
    /// `bytes`, where the volume can enforce it; false where it cannot.
    pub fn limit(&self, path: &Path, bytes: u64) -> std::io::Result<bool> {
        match self.backend {
            Backend::Subvolume => btrfs::limit(path, bytes).map(|()| true),
            _ => Ok(false),
        }
    }

    /// Lifts a sandbox directory's limit before its files are removed: at its
    /// limit, Btrfs refuses even the metadata writes a removal needs.
    pub fn unlimit(&self, path: &Path) {
        if self.backend == Backend::Subvolume && path.exists() {
            // Its WAL's subvolume too: at its limit, even its deletion is refused.
            for wal in [path.join("pg_wal"), path.join("pgdata/pg_wal")] {
                let _ = btrfs::limit(&wal, u64::MAX);
            }
            let _ = btrfs::limit(path, u64::MAX);
        }
    }

    /// Writes the volume's dirty data out, so no reservation made under a
    /// limit now lifted still counts against it. Only after a removal met
    /// the quota: it commits a Btrfs transaction for the whole volume, which
    /// was a quarter of the daemon's CPU in a cycle of cold forks when every
    /// removal did it, and it makes every neighbour's dirty data wait too.
    fn write_out(&self, path: &Path) {
        if self.backend == Backend::Subvolume {
            if let Ok(dir) = fs::File::open(path) {
                let _ = nix::unistd::syncfs(&dir);
            }
        }
    }

    /// Removes a tree (a sandbox's directory or its data directory), lifting its
    /// limit first. On Btrfs its subvolumes are deleted whole
    /// ([`btrfs::delete_subvolumes`]) and only what is left is removed file by
    /// file. Quota errors are tried again, each time after the volume's dirty
    /// data is written out, for up to about 30 s: Btrfs may still
    /// count reservations against a limit it no longer has (a busy host commits
    /// its transactions late; 10 s was once not enough for a sandbox deleted at
    /// its full quota while a test suite loaded both cores).
    pub fn remove_tree(&self, path: &Path) -> std::io::Result<()> {
        let quota_errors = [nix::libc::EDQUOT, nix::libc::ENOSPC];
        for attempt in 0.. {
            self.unlimit(path);
            if attempt > 0 {
                self.write_out(path);
            }
            match self.remove_once(path) {
                Err(e) if attempt < 60 && e.raw_os_error().is_some_and(|c| quota_errors.contains(&c)) => {
                    if attempt % 10 == 0 {
                        let usage = btrfs::Qgroup::of(path).and_then(|q| q.usage());
                        tracing::warn!(path = %path.display(), error = %e, ?usage, attempt, "a removal met the quota; trying again");
                    }
                    std::thread::sleep(std::time::Duration::from_millis(500));
                }
                done => return done,
            }
        }
        unreachable!("the loop returns")
    }

    /// Removes a deleted sandbox's directory, whose processes have all
    /// ended: where sandboxes get subvolumes, they are emptied and kept for
    /// the next forks ([`stock`]), else (or when that fails) removed as
    /// [`Cloner::remove_tree`] does.
    pub fn discard_sandbox_dir(&self, path: &Path) -> std::io::Result<()> {
        if let Some(stock) = &self.stock {
            self.unlimit(path);
            match stock.put_sandbox(path) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::debug!(path = %path.display(), error = %e, "a sandbox's subvolume was not kept")
                }
            }
        }
        self.remove_tree(path)
    }

    /// Removes a data directory for a reset (its server has stopped): its
    /// WAL's subvolume, where it has one, goes to the [`stock`] for later
    /// forks; the rest as [`Cloner::remove_tree`] does.
    pub fn remove_data_dir(&self, path: &Path) -> std::io::Result<()> {
        if let Some(stock) = &self.stock {
            self.unlimit(path);
            if let Err(e) = stock.put_wal(path) {
                tracing::debug!(path = %path.display(), error = %e, "a WAL subvolume was not kept");
            }
        }
        self.remove_tree(path)
    }

    fn remove_once(&self, path: &Path) -> std::io::Result<()> {
        if self.backend == Backend::Subvolume && btrfs::delete_subvolumes(path)? {
            return Ok(());
        }
        // (Not std's remove_dir_all, a recursion a sandbox's user could make
        // as deep as to overflow the daemon's stack.)
        tree::remove_tree(path)
    }

    /// Whether sandboxes get a hard disk quota here.
    pub fn hard_quota(&self) -> bool {
        self.backend == Backend::Subvolume
    }
}

/// The filesystem type of `path`, by its superblock magic.
pub fn filesystem_name(path: &Path) -> String {
    use nix::sys::statfs::*;
    let Ok(st) = statfs(path) else { return "unknown".into() };
    let t = st.filesystem_type();
    let name = if t == XFS_SUPER_MAGIC {
        "xfs"
    } else if t == BTRFS_SUPER_MAGIC {
        "btrfs"
    } else if t == EXT4_SUPER_MAGIC {
        "ext4"
    } else if t == TMPFS_MAGIC {
        "tmpfs"
    } else if t == OVERLAYFS_SUPER_MAGIC {
        "overlayfs"
    } else {
        return format!("0x{:x}", t.0);
    };
    name.into()
}

/// Bytes on disk of a tree (apparent sizes of its files), however deep or
/// long its paths; see [`tree::size`].
pub fn tree_size(root: &Path) -> u64 {
    tree::size(root)
}
