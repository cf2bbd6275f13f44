//! Facts about host processes, read from `/proc`.

/// The parent of process `pid`, if it still runs.
pub fn parent(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, in parentheses, may hold spaces and parentheses itself.
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

/// Whether process `pid` exists and has not exited (a zombie has), or an
/// error when `/proc` could not be read: "could not look" is never "gone".
pub fn running(pid: i32) -> std::io::Result<bool> {
    let stat = match std::fs::read(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(nix::libc::ESRCH) => {
            return Ok(false)
        }
        Err(e) => return Err(e),
    };
    let stat = String::from_utf8_lossy(&stat);
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    Ok(!matches!(state, Some('Z') | Some('X') | None))
}

/// The effective uid of process `pid`, from the owner of its `/proc` entry.
pub fn owner(pid: i32) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}")).ok().map(|m| m.uid())
}

/// Takes an exclusive lock on the file at `path` (made if missing) without
/// waiting: Some while this process holds it, None if another process does.
///
/// The file is this process's user's alone (0600, made so or made so again):
/// `flock` needs only a descriptor, read-only will do, so a lock file others
/// can open is one any of them can take and hold until the next process
/// that needs it gives up. A link is never followed.
pub fn try_lock_file(
    path: &std::path::Path,
) -> crate::error::Result<Option<nix::fcntl::Flock<std::fs::File>>> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)?;
    if std::os::unix::fs::MetadataExt::mode(&file.metadata()?) & 0o077 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(Some(lock)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(crate::error::Error::internal(format!("locking {}: {e}", path.display()))),
    }
}
