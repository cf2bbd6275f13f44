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

/// The socket's path in `dir` for the router's port `port`.
pub fn socket_path(dir: &Path, port: u16) -> PathBuf {
    dir.join(format!(".s.PGSQL.{port}"))
}

/// The error saying why the router cannot have its socket in `dir`.
fn refused(dir: &Path, why: String) -> Error {
    Error::new(
        ErrorCode::InvalidRequest,
        format!("the router cannot listen on a unix socket in {}: {why}", dir.display()),
        "give --router-socket a directory of the daemon's user's own that no one else may write \
         (for example /run/airlock, mode 0755), or leave it out",
    )
}

/// Makes `dir` if it is missing, and checks that it is the daemon's user's
/// own and writable by no one else: nobody else may put a link or a file
/// where the socket goes.
pub fn prepare(dir: &Path) -> Result<()> {
    let refused = |why: String| refused(dir, why);
    if !dir.is_absolute() {
        return Err(refused("the directory must be an absolute path".into()));
    }
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(|e| refused(format!("it could not be made: {e}")))?;
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
    Ok(())
}

/// Binds the router's socket in `dir` (see [`prepare`]) for its port
/// `port`. A socket left there by a router that has gone is replaced; one
/// that answers is not.
pub fn bind(dir: &Path, port: u16) -> Result<UnixListener> {
    prepare(dir)?;
    let refused = |why: String| refused(dir, why);
    let path = socket_path(dir, port);
    if let Ok(there) = std::fs::symlink_metadata(&path) {
        if !there.file_type().is_socket() {
            return Err(refused(format!("{} is there and is not a socket", path.display())));
        }
        if std::os::unix::net::UnixStream::connect(&path).is_ok() {
            return Err(refused(format!("{} answers: another router listens on it", path.display())));
        }
        // A socket nothing listens on: left by a router that is gone.
        std::fs::remove_file(&path).map_err(|e| refused(e.to_string()))?;
    }
    let listener = UnixListener::bind(&path).map_err(|e| refused(format!("{}: {e}", path.display())))?;
    // The directory is the router's alone, so the path is the socket just made.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777))
        .map_err(|e| refused(format!("{}: {e}", path.display())))?;
    Ok(listener)
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
    async fn a_socket_is_made_open_to_all_and_only_a_stale_one_is_replaced() {
        let dir = scratch("bind");
        let first = bind(&dir, 7432).unwrap();
        let path = socket_path(&dir, 7432);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o777);
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o022,
            0,
            "made writable by its owner alone"
        );
        // One that answers is another router's: left alone.
        let e = bind(&dir, 7432).unwrap_err();
        assert!(e.message.contains("answers"), "{}", e.message);
        assert!(path.exists());
        // One nothing listens on any more is replaced.
        drop(first);
        assert!(path.exists(), "a dropped listener leaves its file");
        let _second = bind(&dir, 7432).unwrap();
        assert!(std::os::unix::net::UnixStream::connect(&path).is_ok());
        // A file that is not a socket is never removed.
        std::fs::write(socket_path(&dir, 7433), b"mine").unwrap();
        let e = bind(&dir, 7433).unwrap_err();
        assert!(e.message.contains("is not a socket"), "{}", e.message);
        assert_eq!(std::fs::read(socket_path(&dir, 7433)).unwrap(), b"mine");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_others_may_write_or_a_link_or_a_relative_path_is_refused() {
        let open = scratch("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let e = prepare(&open).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidRequest);
        assert!(e.message.contains("writable by no one else") && e.hint.contains("--router-socket"), "{e:?}");
        let link = scratch("link");
        let target = scratch("target");
        std::fs::create_dir(&target).unwrap();
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(prepare(&link).unwrap_err().message.contains("not a directory"));
        assert!(prepare(Path::new("run/airlock")).unwrap_err().message.contains("absolute path"));
        for p in [&open, &target] {
            std::fs::remove_dir_all(p).unwrap();
        }
        std::fs::remove_file(&link).unwrap();
    }
}
