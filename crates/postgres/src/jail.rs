//! A jail for the client tools that read a golden's build input (psql on schema
//! files and plain dumps, pg_restore on archives).
//!
//! That input is hostile text, and the tools open files by names it gives: a
//! directory-format dump names its data files in `toc.dat` and its large
//! objects' files in `blobs.toc`, as paths joined to the dump's directory
//! (`../../etc/shadow` works), and a file of the dump may be a symbolic link to
//! anything. Run by the daemon, a tool would load the host's secrets into a
//! golden every fork can read. So the tools never run as the daemon: each runs
//!
//! - in mount, network and IPC namespaces of its own, with a root of its own
//!   ([`airlock_host::rootfs`]) holding only the host's `/usr` (and its `/lib`,
//!   `/bin` links), the tools' own tree, a private `/dev`, `ld.so.cache`, a
//!   `/proc` showing only the user's own processes, the instance's socket
//!   directory and the build's input, all read-only but the socket's;
//! - as the unprivileged loader user, which PostgreSQL's peer authentication
//!   maps to the owner role during a build and to nothing else;
//! - under the sandboxes' system-call filter, with `no_new_privs`.
//!
//! Whatever name the input gives, a tool finds only package files, its own
//! input, or nothing. Nothing is filtered by name: the jail is the guarantee.

use std::path::Path;

use airlock_core::error::{Error, Result};
use airlock_host::rootfs::View;
use airlock_host::users::Identity;

/// Where the instance's socket directory is, inside the jail.
pub const SOCKET_DIR: &str = "/run/postgresql";
/// Where the build's input is, inside the jail.
pub const INPUT_DIR: &str = "/input";

/// A prepared jail: the root its tools see, and who they run as.
pub struct Jail {
    view: View,
    user: Identity,
}

impl Jail {
    /// A jail whose root holds the host's system trees, `tools` (the tree a
    /// tool's `bin/` is in, at its own path), the instance's `socket_dir`
    /// and `input`, a directory.
    pub fn new(user: Identity, tools: &Path, socket_dir: &Path, input: &Path) -> Result<Jail> {
        if [socket_dir, input].iter().any(|p| p.starts_with(tools)) {
            return Err(Error::internal(format!(
                "the client tools' tree {} holds the build's own files; install them elsewhere",
                tools.display()
            )));
        }
        let mut view = View::system(false)?;
        // pg_dump's tools draw random keys from /dev/urandom.
        view.proc(Path::new("/proc"))?;
        view.dev()?;
        if !tools.starts_with("/usr") {
            view.bind(tools, tools, false)?;
        }
        view.bind(socket_dir, Path::new(SOCKET_DIR), true)?;
        view.bind(input, Path::new(INPUT_DIR), false)?;
        Ok(Jail { view, user })
    }

    /// Mounts `host` at `name` in the input directory, over a mount point
    /// already made there.
    pub fn mount_input(&mut self, host: &Path, name: &str) -> Result<()> {
        self.view.bind(host, &Path::new(INPUT_DIR).join(name), false)?;
        Ok(())
    }

    /// The user the jailed tools run as.
    pub fn user(&self) -> &Identity {
        &self.user
    }

    /// A command running `program` (a path valid inside the jail too) in the
    /// jail, with nothing of the daemon's environment.
    pub fn command(&self, program: &Path) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(program);
        cmd.env_clear();
        let view = self.view.clone();
        let (uid, gid) = (self.user.uid, self.user.gid);
        // SAFETY: only async-signal-safe system calls run between fork and exec;
        // everything they need was allocated before.
        unsafe {
            cmd.pre_exec(move || enter(&view, uid, gid));
        }
        cmd
    }
}

/// In the child, before exec: new namespaces, the jail's root, the
/// unprivileged user, the system-call filter.
fn enter(view: &View, uid: nix::unistd::Uid, gid: nix::unistd::Gid) -> std::io::Result<()> {
    use nix::sched::CloneFlags;
    airlock_core::descriptors::close_on_exec_from_3()?;
    nix::sched::unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWNET | CloneFlags::CLONE_NEWIPC)?;
    view.enter()?;
    nix::unistd::setgroups(&[])?;
    nix::unistd::setgid(gid)?;
    nix::unistd::setuid(uid)?;
    airlock_host::seccomp::confine(airlock_host::seccomp::program())
}

/// Lets the jail's user read a tree the daemon made (`path` and, for a
/// directory, its entries, never following links): root's, in the user's
/// group, readable by the group only.
pub fn share_with(user: &Identity, path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let give = |p: &Path, mode: u32| -> Result<()> {
        nix::unistd::fchownat(
            nix::fcntl::AT_FDCWD,
            p,
            None,
            Some(user.gid),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(|e| Error::io(format!("sharing {}", p.display()), &std::io::Error::from(e)))?;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))?;
        Ok(())
    };
    let meta = path.symlink_metadata()?;
    if meta.is_dir() {
        give(path, 0o750)?;
        for entry in std::fs::read_dir(path)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                give(&entry.path(), 0o640)?;
            }
        }
    } else if meta.is_file() {
        give(path, 0o640)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A jailed process sees its input and the system's files, never another
    /// host file, however it names it; it runs as its user, without a network.
    #[tokio::test]
    async fn a_jailed_tool_sees_only_its_input() {
        let base = std::env::temp_dir().join(format!("airlock-jail-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (input, socket) = (base.join("input"), base.join("run"));
        std::fs::create_dir_all(&input).unwrap();
        std::fs::create_dir_all(&socket).unwrap();
        std::fs::write(input.join("data"), "input\n").unwrap();
        let secret = base.join("secret");
        std::fs::write(&secret, "secret\n").unwrap();
        let nobody = nix::unistd::User::from_name("nobody").unwrap().expect("a nobody user");
        let user = Identity { name: nobody.name, uid: nobody.uid, gid: nobody.gid };
        share_with(&user, &input).unwrap();
        let jail = Jail::new(user, Path::new("/usr/lib"), &socket, &input).unwrap();
        let run = |program: &str, args: &[&str]| {
            let mut cmd = jail.command(Path::new(program));
            cmd.args(args).stdin(std::process::Stdio::null());
            async move {
                let out = cmd.output().await.unwrap();
                (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
            }
        };
        assert_eq!(run("/usr/bin/cat", &["/input/data"]).await, (true, "input\n".into()));
        let climbing = format!("/input/{}{}", "../".repeat(8), secret.display());
        for path in [secret.display().to_string(), climbing, "/etc/shadow".into(), "/etc/passwd".into()] {
            assert!(!run("/usr/bin/cat", &[&path]).await.0, "{path} was read in the jail");
        }
        assert_eq!(run("/usr/bin/id", &["-u"]).await.1.trim(), nobody.uid.to_string());
        let (_, top) = run("/usr/bin/ls", &["-A", "/"]).await;
        let mut top: Vec<&str> = top.lines().collect();
        top.sort();
        for name in &top {
            assert!(
                [
                    "bin", "dev", "etc", "input", "lib", "lib32", "lib64", "libx32", "proc", "run", "sbin",
                    "usr"
                ]
                .contains(name),
                "{name} in the jail: {top:?}"
            );
        }
        let (_, links) = run("/usr/bin/cat", &["/proc/net/dev"]).await;
        assert!(!links.contains("eth") && !links.contains("ens"), "a network of its own: {links}");
        let (_, seen) = run("/usr/bin/ls", &["/proc"]).await;
        assert!(!seen.lines().any(|l| l == "1"), "only its own processes: {seen}");
        assert!(!run("/usr/bin/touch", &["/input/new"]).await.0, "the input is read-only");
        std::fs::remove_dir_all(&base).unwrap();
    }
}
