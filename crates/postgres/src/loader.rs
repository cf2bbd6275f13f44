//! How a golden's build runs the client tools that read its input (psql,
//! pg_restore): jailed as the loader user ([`crate::jail`]) when the daemon
//! is root, otherwise as the daemon's own user. Either way the tool logs in as
//! the owner role, never the admin.
//!
//! What the tools read is staged first ([`stage`]): a dump named in a request
//! is copied, regular files only and never through a link, into the build's
//! private work directory, where the loader user may read it.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;

use crate::bin::PgBin;
use crate::jail::{self, Jail};
use airlock_core::dsn::{DATABASE, OWNER_ROLE, SOCKET_PORT};
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::layout::InstanceDir;
use airlock_host::users::Identity;

/// Where an archive is, inside the jail.
const ARCHIVE: &str = "archive";
/// Where list files are, inside the jail's input directory.
const LISTS: &str = "lists";

/// The client tools of one build, and where they find its input.
pub struct Loader<'a> {
    bin: &'a PgBin,
    dir: &'a InstanceDir,
    jail: Option<Jail>,
    /// The host directory whose contents the tools see as their input.
    input: PathBuf,
}

impl<'a> Loader<'a> {
    /// Prepares the tools of `bin` (whose libraries are all in `tree`, with
    /// them) for the building instance `dir`; `work` is the build's private
    /// scratch directory, `user` the loader user (root daemons only), `archive`
    /// what pg_restore will read, if anything.
    pub fn new(
        (bin, tree): (&'a PgBin, &Path),
        dir: &'a InstanceDir,
        work: &Path,
        user: Option<&Identity>,
        archive: Option<&Path>,
    ) -> Result<Loader<'a>> {
        let input = work.join("input");
        let _ = std::fs::remove_dir_all(&input);
        std::fs::create_dir_all(input.join(LISTS))?;
        let jail = match user {
            Some(user) => {
                if let Some(archive) = archive {
                    jail::share_with(user, archive)?;
                    let place = input.join(ARCHIVE);
                    if archive.is_dir() {
                        std::fs::create_dir(&place)?;
                    } else {
                        std::fs::File::create(&place)?;
                    }
                }
                jail::share_with(user, &input)?;
                jail::share_with(user, &input.join(LISTS))?;
                let mut jail = Jail::new(user.clone(), tree, &dir.socket_dir(), &input)?;
                if let Some(archive) = archive {
                    jail.mount_input(archive, ARCHIVE)?;
                }
                Some(jail)
            }
            None => None,
        };
        Ok(Loader { bin, dir, jail, input })
    }

    /// The path of the archive, as the tools see it.
    pub fn archive(&self, host: &Path) -> PathBuf {
        match self.jail {
            Some(_) => Path::new(jail::INPUT_DIR).join(ARCHIVE),
            None => host.to_path_buf(),
        }
    }

    /// Writes a list file (pg_restore's `-L`) and returns its path as the tools see it.
    pub fn list_file(&self, name: &str, text: &str) -> Result<PathBuf> {
        let host = self.input.join(LISTS).join(format!("{name}.list"));
        std::fs::write(&host, text)?;
        if let Some(jail) = &self.jail {
            jail::share_with(jail.user(), &host)?;
            return Ok(Path::new(jail::INPUT_DIR).join(LISTS).join(format!("{name}.list")));
        }
        Ok(host)
    }

    /// A tool logged in as the owner role to the building golden's app database.
    pub fn tool(&self, name: &str) -> Command {
        let program = self.bin.tool(name);
        let (mut cmd, host) = match &self.jail {
            Some(jail) => (jail.command(&program), PathBuf::from(jail::SOCKET_DIR)),
            None => {
                let mut cmd = Command::new(&program);
                cmd.env_clear();
                (cmd, self.dir.socket_dir())
            }
        };
        cmd.env("PATH", "/usr/bin:/bin")
            .env("LC_ALL", "C")
            .env("PGHOST", host)
            .env("PGPORT", SOCKET_PORT.to_string())
            .env("PGUSER", OWNER_ROLE)
            .env("PGDATABASE", DATABASE)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    /// The OS user whose peer login is the owner role during the build.
    pub fn os_user(&self) -> Option<&Identity> {
        self.jail.as_ref().map(Jail::user)
    }
}

/// Copies a directory-format dump named in a request into `into`: each entry
/// must be a regular file with a plain name (what pg_dump writes), opened
/// without following a link; anything else fails the build before any tool
/// reads it. Returns `into`.
pub fn stage_dir(dump: &Path, into: &Path) -> Result<PathBuf> {
    let refuse = |why: String| {
        Error::new(
            ErrorCode::FileUnreadable,
            format!("the directory dump {} {why}", dump.display()),
            "a directory-format dump holds only the regular files pg_dump wrote: take the dump again with \
             `pg_dump --format=directory`, or use --format=custom",
        )
    };
    // Opened once: every entry is then found in this directory, whatever
    // its path names by the time it is read.
    let dir = open_dir(dump).map_err(|e| refuse(format!("cannot be read: {e}")))?;
    let mut names = Vec::new();
    let mut listing = nix::dir::Dir::from_fd(dir.try_clone().map_err(|e| refuse(e.to_string()))?)
        .map_err(|e| refuse(format!("cannot be read: {e}")))?;
    for entry in listing.iter() {
        let entry = entry.map_err(|e| refuse(format!("cannot be read: {e}")))?;
        let name = std::ffi::OsStr::from_bytes(entry.file_name().to_bytes()).to_os_string();
        if name != "." && name != ".." {
            names.push(name);
        }
    }
    let _ = std::fs::remove_dir_all(into);
    airlock_host::storage::tree::private_dir(into)?;
    for name in names {
        let plain = name.to_str().is_some_and(|n| {
            !n.starts_with('.')
                && n.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        });
        if !plain {
            return Err(refuse(format!("holds {name:?}, a name pg_dump does not write")));
        }
        let mut from =
            open_entry(&dir, &name).map_err(|why| refuse(format!("holds {name:?}, which {why}")))?;
        copy_file(&mut from, &into.join(&name))?;
    }
    Ok(into.to_path_buf())
}

/// A directory, opened for reading its entries.
fn open_dir(path: &Path) -> std::io::Result<std::os::fd::OwnedFd> {
    use nix::fcntl::OFlag;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    nix::fcntl::open(path, flags, nix::sys::stat::Mode::empty()).map_err(std::io::Error::from)
}

/// Opens `name` in the open directory `dir` as a regular file, never through
/// a link (nor waiting on a FIFO); the error says why not.
fn open_entry(
    dir: &std::os::fd::OwnedFd,
    name: &std::ffi::OsStr,
) -> std::result::Result<std::fs::File, String> {
    use nix::fcntl::OFlag;
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let file: std::fs::File = nix::fcntl::openat(dir, name, flags, nix::sys::stat::Mode::empty())
        .map_err(|e| format!("cannot be opened as a file ({e})"))?
        .into();
    match file.metadata() {
        Ok(meta) if meta.is_file() => Ok(file),
        Ok(_) => Err("is not a regular file".into()),
        Err(e) => Err(format!("cannot be read ({e})")),
    }
}

/// Copies the table of contents of the directory dump `dump` alone into
/// `into`, a fresh private directory (what `pg_restore --list` reads).
pub fn stage_toc(dump: &Path, into: &Path) -> Result<()> {
    let dir = open_dir(dump).map_err(|e| e.to_string());
    let mut from = dir.and_then(|dir| open_entry(&dir, "toc.dat".as_ref())).map_err(|why| {
        Error::new(
            ErrorCode::FileUnreadable,
            format!("the toc.dat of the directory dump {} {why}", dump.display()),
            "give a directory pg_dump --format=directory wrote",
        )
    })?;
    let _ = std::fs::remove_dir_all(into);
    airlock_host::storage::tree::private_dir(into)?;
    copy_file(&mut from, &into.join("toc.dat"))
}

/// Copies an archive file named in a request to `into` (a regular file only).
pub fn stage_file(file: &Path, into: &Path) -> Result<PathBuf> {
    let mut from = airlock_host::storage::tree::open_request_file(file)?;
    let _ = std::fs::remove_file(into);
    copy_file(&mut from, into)?;
    Ok(into.to_path_buf())
}

/// A copy (a reflink where the filesystem has them, through copy_file_range).
fn copy_file(from: &mut std::fs::File, to: &Path) -> Result<()> {
    let mut out = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(to)?;
    std::io::copy(from, &mut out).map_err(|e| Error::io(format!("copying to {}", to.display()), &e))?;
    Ok(())
}
