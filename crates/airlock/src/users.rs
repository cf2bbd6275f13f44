//! The OS identities involved: the daemon's own, and the unprivileged user instances run as.

use std::path::Path;

use nix::unistd::{Gid, Uid, User};

use crate::error::{Error, ErrorCode, Result};

/// An OS user that processes run as and files belong to.
#[derive(Debug, Clone)]
pub struct Identity {
    /// Login name.
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

    /// Whether this is root.
    pub fn is_root(&self) -> bool {
        self.uid.is_root()
    }

    /// The user PostgreSQL instances run as: the current user, or when running as
    /// root the configured user (default `airlock`), created as a system user if missing.
    pub fn for_instances(configured: Option<&str>) -> Result<Identity> {
        let me = Identity::current()?;
        if !me.is_root() {
            return Ok(me);
        }
        Identity::ensure(configured.unwrap_or("airlock"))
    }

    /// An unprivileged system user of this name, created if missing (as root only).
    pub fn ensure(name: &str) -> Result<Identity> {
        // useradd takes a lock on /etc/passwd; concurrent forks would fight over it.
        static CREATING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one_at_a_time = CREATING.lock().unwrap_or_else(|p| p.into_inner());
        if User::from_name(name).ok().flatten().is_none() {
            let status = std::process::Command::new("useradd")
                .args(["--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent"])
                .args(["--shell", "/usr/sbin/nologin", name])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
            if !status.map(|s| s.success()).unwrap_or(false) && User::from_name(name).ok().flatten().is_none()
            {
                return Err(Error::new(
                    ErrorCode::PostgresFailed,
                    format!("could not create the unprivileged user {name:?} that instances run as"),
                    "create it yourself (`useradd --system NAME`), or name an existing one with --instance-user",
                ));
            }
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

    /// Gives a whole tree to this user.
    pub fn own_tree(&self, root: &Path) -> std::io::Result<()> {
        self.own(root)?;
        if std::fs::symlink_metadata(root)?.is_dir() {
            for entry in std::fs::read_dir(root)? {
                self.own_tree(&entry?.path())?;
            }
        }
        Ok(())
    }
}
