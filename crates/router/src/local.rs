//! The router's unix socket, for clients on the daemon's host: the same
//! sessions as on its TCP port (the same credential, SCRAM and audit), named
//! `.s.PGSQL.<port>` in the directory given, as PostgreSQL names its own, so
//! that `psql "host=DIR port=PORT ..."` finds it. A plaintext client handed to
//! its server session over this socket speaks to PostgreSQL over a unix socket
//! end to end, with no TCP on the way.
//!
//! Its clients are any local user's processes, as with PostgreSQL's own
//! socket: the socket is open to all (mode 0777), and the credential is what
//! admits a client. Each is recorded by the user and process the kernel
//! names for it.

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

use airlock_core::error::{Error, ErrorCode, Result};

/// The longest socket path the kernel takes (`sun_path`, less its NUL).
const PATH_MAX: usize = 107;

/// The socket's path in `dir` for the router's port `port`.
pub fn socket_path(dir: &Path, port: u16) -> PathBuf {
    dir.join(format!(".s.PGSQL.{port}"))
}

/// The error saying why the router cannot have its socket in `dir`.
fn refused(dir: &Path, why: String) -> Error {
    Error::new(
        ErrorCode::InvalidRequest,
        format!("the router cannot listen on a unix socket in {}: {why}", dir.display()),
        "give --router-socket a directory of the daemon's user's own that no one else may write, \
         outside what sandboxes see (for example /run/airlock, mode 0755), or leave it out",
    )
}

/// Refuses a path that is not absolute, or names a parent (`..`), which
/// would make what it names depend on what exists when it is read.
fn plain_absolute(dir: &Path) -> Result<()> {
    if !dir.is_absolute() || dir.components().any(|c| c == std::path::Component::ParentDir) {
        return Err(refused(dir, "the directory must be an absolute path without `..`".into()));
    }
    Ok(())
}

/// `path` with every link resolved, as far as it exists (the rest as given).
fn resolved(path: &Path) -> PathBuf {
    let mut existing = path;
    let mut rest = Vec::new();
    while !existing.exists() {
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_owned());
                existing = parent;
            }
            _ => break,
        }
    }
    let mut out = std::fs::canonicalize(existing).unwrap_or_else(|_| existing.to_owned());
    out.extend(rest.iter().rev());
    out
}

/// Refuses `dir` when it lies in a tree that sandboxes' processes see
/// (`seen`: the system trees, the PostgreSQL trees, the data root): a socket
/// is reached through its path, so one there would be a way out of a
/// sandbox's own view of the host.
pub fn check_unseen(dir: &Path, seen: &[PathBuf]) -> Result<()> {
    plain_absolute(dir)?;
    let dir = resolved(dir);
    match seen.iter().find(|tree| dir.starts_with(resolved(tree))) {
        Some(tree) => Err(refused(
            &dir,
            format!("sandboxes see {}, so their processes could reach a socket there", tree.display()),
        )),
        None => Ok(()),
    }
}

/// Whether a directory on the way to the socket is safe from every user but
/// root and the daemon's: owned by one of them, and writable by no one else
/// unless sticky (where no one may move another's entry).
fn safe_on_the_way(meta: &std::fs::Metadata) -> bool {
    let me = nix::unistd::geteuid().as_raw();
    let sticky = meta.mode() & 0o1000 != 0;
    (meta.uid() == 0 || meta.uid() == me)
        && (meta.file_type().is_symlink() || meta.mode() & 0o022 == 0 || sticky)
}

/// Makes `dir` if it is missing, and checks that it is the daemon's user's
/// own and writable by no one else, as is every directory on the way to it
/// (sticky ones aside): nobody else may put a link or a file where the
/// socket goes, or move the directory away.
pub fn prepare(dir: &Path) -> Result<()> {
    let refused = |why: String| refused(dir, why);
    plain_absolute(dir)?;
    if socket_path(dir, u16::MAX).as_os_str().len() > PATH_MAX {
        return Err(refused(format!(
            "the socket's path would be longer than the {PATH_MAX} bytes a socket may have"
        )));
    }
    // The way there as written (its links' own owners), before anything is made.
    let on_the_way = |path: &Path| -> Result<()> {
        let Ok(meta) = std::fs::symlink_metadata(path) else { return Ok(()) };
        if safe_on_the_way(&meta) {
            return Ok(());
        }
        Err(refused(format!(
            "{} on the way to it is owned by uid {} with mode {:o}: others could move the directory away",
            path.display(),
            meta.uid(),
            meta.mode() & 0o7777
        )))
    };
    dir.ancestors().skip(1).try_for_each(on_the_way)?;
    // What is missing is made one directory at a time, each by a `mkdir`
    // that follows no link at its own name: one that someone else put there
    // meanwhile (in a sticky directory such as /tmp, a link to /etc) is
    // refused, never made through.
    let missing: Vec<&Path> = dir
        .ancestors()
        .take_while(|p| std::fs::symlink_metadata(p).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound))
        .collect();
    for path in missing.into_iter().rev() {
        match std::fs::DirBuilder::new().mode(0o755).create(path) {
            // 0755 whatever the umask: every local user reaches the socket.
            Ok(()) => std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| refused(format!("{} could not be made open to all: {e}", path.display())))?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(refused(format!("{} appeared while it was being made", path.display())));
            }
            Err(e) => return Err(refused(format!("{} could not be made: {e}", path.display()))),
        }
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|e| refused(e.to_string()))?;
    if !meta.is_dir() {
        return Err(refused("it is not a directory (a link is not followed)".into()));
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() || meta.mode() & 0o022 != 0 {
        return Err(refused(format!(
            "it is owned by uid {} with mode {:o}; it must be the daemon's user's and writable by no one else",
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    // And as resolved, through every link on the way.
    let canonical = std::fs::canonicalize(dir).map_err(|e| refused(e.to_string()))?;
    canonical.ancestors().skip(1).try_for_each(on_the_way)
}

/// The router's hold on its socket while it listens: the lock that says a
/// router serves this path, and the socket's file, removed when the hold
/// ends if it is still the one this router made.
#[derive(Debug)]
pub struct Bound {
    _lock: nix::fcntl::Flock<std::fs::File>,
    path: PathBuf,
    made: (u64, u64),
}

impl Drop for Bound {
    fn drop(&mut self) {
        if let Ok(meta) = std::fs::symlink_metadata(&self.path) {
            if (meta.dev(), meta.ino()) == self.made {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

/// Binds the router's socket in `dir` (see [`prepare`]) for its port
/// `port`, under the lock `.s.PGSQL.<port>.lock` beside it: a router that
/// holds it serves the socket, so one that cannot take it leaves the socket
/// alone, and a socket found there while it is held is a gone router's,
/// replaced.
pub fn bind(dir: &Path, port: u16) -> Result<(UnixListener, Bound)> {
    prepare(dir)?;
    let refused = |why: String| refused(dir, why);
    let path = socket_path(dir, port);
    let lock_path = dir.join(format!(".s.PGSQL.{port}.lock"));
    let lock = airlock_core::process::try_lock_file(&lock_path)?
        .ok_or_else(|| refused(format!("another router holds {}", lock_path.display())))?;
    if let Ok(there) = std::fs::symlink_metadata(&path) {
        if !there.file_type().is_socket() {
            return Err(refused(format!("{} is there and is not a socket", path.display())));
        }
        std::fs::remove_file(&path).map_err(|e| refused(e.to_string()))?;
    }
    let listener = UnixListener::bind(&path).map_err(|e| refused(format!("{}: {e}", path.display())))?;
    // The directory is the router's alone, so the path is the socket just made.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777))
        .map_err(|e| refused(format!("{}: {e}", path.display())))?;
    let meta = std::fs::symlink_metadata(&path).map_err(|e| refused(e.to_string()))?;
    Ok((listener, Bound { _lock: lock, path, made: (meta.dev(), meta.ino()) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory path under the system's temporary one (not made).
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("airlock-local-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[tokio::test]
    async fn a_socket_is_made_open_to_all_held_by_one_router_and_removed_only_if_its_own() {
        let dir = scratch("bind");
        let (first, held) = bind(&dir, 7432).unwrap();
        let path = socket_path(&dir, 7432);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o777);
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o022,
            0,
            "writable by its owner alone"
        );
        // Another router cannot take it while this one holds it.
        let e = bind(&dir, 7432).unwrap_err();
        assert!(e.message.contains("another router holds"), "{}", e.message);
        assert!(std::os::unix::net::UnixStream::connect(&path).is_ok(), "the first still answers");
        // The hold's end removes its own socket.
        drop((first, held));
        assert!(!path.exists());
        // A socket left by a router that died (its lock gone with it) is replaced.
        let stale = std::os::unix::net::UnixListener::bind(&path).unwrap();
        drop(stale);
        let (_second, held) = bind(&dir, 7432).unwrap();
        assert!(std::os::unix::net::UnixStream::connect(&path).is_ok());
        // A socket someone else put in its place is not removed with the hold.
        std::fs::remove_file(&path).unwrap();
        let theirs = std::os::unix::net::UnixListener::bind(&path).unwrap();
        drop(held);
        assert!(path.exists(), "another's socket was removed");
        drop(theirs);
        std::fs::remove_file(&path).unwrap();
        // A file that is not a socket is never removed.
        std::fs::write(socket_path(&dir, 7433), b"mine").unwrap();
        let e = bind(&dir, 7433).unwrap_err();
        assert!(e.message.contains("is not a socket"), "{}", e.message);
        assert_eq!(std::fs::read(socket_path(&dir, 7433)).unwrap(), b"mine");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_others_may_write_or_move_or_a_link_or_a_long_or_relative_path_is_refused() {
        let open = scratch("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let e = prepare(&open).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidRequest);
        assert!(e.message.contains("writable by no one else") && e.hint.contains("--router-socket"), "{e:?}");
        // Below a directory others may write (and not sticky): it could be moved away.
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = prepare(&open.join("mine")).unwrap_err();
        assert!(e.message.contains("others could move the directory away"), "{}", e.message);
        assert!(!open.join("mine").exists(), "nothing made for a refused path");
        // Below a sticky one, as /tmp is: fine.
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        prepare(&open.join("mine")).unwrap();
        // Two levels missing: each made, the daemon's own, 0755.
        prepare(&open.join("two/levels")).unwrap();
        for made in [open.join("two"), open.join("two/levels")] {
            let meta = std::fs::symlink_metadata(&made).unwrap();
            assert!(meta.is_dir() && meta.mode() & 0o7777 == 0o755, "{}", made.display());
        }
        let link = scratch("link");
        let target = scratch("target");
        std::fs::create_dir(&target).unwrap();
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(prepare(&link).unwrap_err().message.contains("not a directory"));
        assert!(prepare(Path::new("run/airlock")).unwrap_err().message.contains("absolute path"));
        let long = std::env::temp_dir().join("d".repeat(100));
        assert!(prepare(&long).unwrap_err().message.contains("longer than"));
        assert!(!long.exists(), "nothing made for a refused path");
        for p in [&open, &target] {
            std::fs::remove_dir_all(p).unwrap();
        }
        std::fs::remove_file(&link).unwrap();
    }

    #[test]
    fn a_directory_sandboxes_see_is_refused_however_it_is_named() {
        let seen = [PathBuf::from("/etc"), PathBuf::from("/lib"), PathBuf::from("/var/lib/airlock")];
        for dir in ["/etc/airlock", "/etc/airlock/sock", "/lib/airlock", "/var/lib/airlock/run"] {
            let e = check_unseen(Path::new(dir), &seen).unwrap_err();
            assert!(e.message.contains("sandboxes see"), "{dir}: {}", e.message);
        }
        let e = check_unseen(Path::new("/nowhere/../etc/airlock"), &seen).unwrap_err();
        assert!(e.message.contains("without `..`"), "{}", e.message);
        // /lib is a link to /usr/lib on a merged /usr: the same tree either way.
        if std::fs::symlink_metadata("/lib").is_ok_and(|m| m.file_type().is_symlink()) {
            assert!(check_unseen(Path::new("/usr/lib/airlock"), &seen).is_err());
        }
        for dir in ["/run/airlock", "/tmp/airlock", "/var/lib/airlock-other"] {
            check_unseen(Path::new(dir), &seen).unwrap();
        }
    }
}
