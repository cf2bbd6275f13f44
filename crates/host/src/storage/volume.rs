//! Preparing a copy-on-write volume on a host that has none: a sparse image,
//! loop-mounted on `$AIRLOCK_HOME/volume` — Btrfs with quotas on (reflinks and a
//! hard disk quota per sandbox), or XFS made with `reflink=1` (reflinks only:
//! this host's kernel, like many, has no XFS quota support).

use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::process::Command;

use serde::Serialize;

use crate::storage::{filesystem_name, Cloner};
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::layout::Layout;

/// The filesystem `storage init` makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Filesystem {
    /// Reflinks and a hard quota per sandbox (subvolumes with simple quotas).
    Btrfs,
    /// Reflinks; disk use watched, not capped.
    Xfs,
}

impl Filesystem {
    fn mkfs(self) -> (&'static str, &'static [&'static str], &'static str) {
        match self {
            // Mixed block groups: data and metadata share one pool, so a
            // tenant that writes many small files (each one metadata only)
            // cannot use up a metadata pool its neighbours' commits need
            // while the volume still shows free space. One copy of each:
            // the image is a file on a host disk that keeps its own.
            Filesystem::Btrfs => {
                ("mkfs.btrfs", &["-q", "--mixed", "-d", "single", "-m", "single"], "btrfs-progs")
            }
            Filesystem::Xfs => ("mkfs.xfs", &["-q", "-m", "reflink=1"], "xfsprogs"),
        }
    }
}

/// What `storage init` did.
#[derive(Debug, Serialize)]
pub struct InitReport {
    /// The image file.
    pub image: String,
    /// Where it is mounted.
    pub mount_point: String,
    /// Its size in bytes.
    pub size_bytes: u64,
    /// The filesystem now under the volume.
    pub filesystem: String,
    /// Whether reflinks work there.
    pub reflink: bool,
    /// Whether each sandbox gets a hard disk quota there.
    pub quota: bool,
    /// False when the volume was already prepared and nothing was done.
    pub created: bool,
    /// What the user should know before serving on it.
    pub warnings: Vec<String>,
}

fn storage_error(message: impl Into<String>, hint: impl Into<String>) -> Error {
    Error::new(ErrorCode::StorageFailed, message, hint)
}

/// Parses a volume size such as `20G` (at least 512M).
pub fn parse_size(text: &str) -> Result<u64> {
    let bytes = airlock_core::validate::bytes(text)?;
    if bytes < 512 << 20 {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            format!("a volume of {text} is too small"),
            "give at least 512M; the image is sparse, so a large size costs nothing until used",
        ));
    }
    Ok(bytes)
}

/// Whether `path` is the root of a mount (a different device from its parent).
pub fn is_mount_point(path: &Path) -> bool {
    let (Ok(me), Some(Ok(parent))) = (std::fs::metadata(path), path.parent().map(std::fs::metadata)) else {
        return false;
    };
    me.dev() != parent.dev()
}

/// Makes and mounts the image. Refuses without root, when the volume already
/// holds goldens or sandboxes, or when the tools are missing.
pub fn init(layout: &Layout, size: u64, fs: Filesystem) -> Result<InitReport> {
    let volume = layout.volume();
    let image = layout.storage_image();
    let report = |created: bool| {
        let cloner = Cloner::probe(&volume)?;
        Ok(InitReport {
            image: image.display().to_string(),
            mount_point: volume.display().to_string(),
            size_bytes: std::fs::metadata(&image).map(|m| m.len()).unwrap_or(size),
            filesystem: cloner.filesystem().to_owned(),
            reflink: cloner.backend() != super::Backend::Copy,
            quota: cloner.hard_quota(),
            created,
            warnings: warnings(&cloner, size),
        })
    };
    if is_mount_point(&volume) && image.exists() {
        return report(false);
    }
    if !nix::unistd::geteuid().is_root() {
        return Err(storage_error(
            "storage init needs root to make and mount a loop device",
            "run it with sudo, or put AIRLOCK_HOME on an XFS (reflink=1) or Btrfs filesystem yourself",
        ));
    }
    std::fs::create_dir_all(&volume)?;
    let occupied = std::fs::read_dir(&volume)?
        .flatten()
        .any(|e| std::fs::read_dir(e.path()).map(|mut d| d.next().is_some()).unwrap_or(true));
    if occupied {
        return Err(storage_error(
            format!("{} already holds goldens or sandboxes", volume.display()),
            "delete them first (`airlock golden rm NAME --force`), or use a fresh AIRLOCK_HOME",
        ));
    }
    let (mkfs, args, package) = fs.mkfs();
    if which(mkfs).is_none() {
        return Err(storage_error(
            format!("{mkfs} is not installed"),
            format!("install it with `apt-get install {package}` and run again"),
        ));
    }
    if !image.exists() {
        // The image holds every sandbox's and golden's data: root's alone.
        let f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&image)?;
        f.set_len(size)?;
        drop(f);
        run(Command::new(mkfs).args(args).arg(&image), mkfs).inspect_err(|_| {
            let _ = std::fs::remove_file(&image);
        })?;
    }
    for entry in std::fs::read_dir(&volume)?.flatten() {
        let _ = std::fs::remove_dir(entry.path());
    }
    mount(layout)?;
    if fs == Filesystem::Btrfs {
        super::btrfs::enable_quotas(&volume).map_err(|e| {
            storage_error(
                format!("quotas could not be turned on for {}: {e}", volume.display()),
                "check the kernel's Btrfs support (`airlock doctor`), or use --fs xfs",
            )
        })?;
    }
    report(true)
}

/// What a volume cannot do under the default settings: hold each sandbox to
/// a quota (XFS here), or hold one sandbox's default allowance.
fn warnings(cloner: &Cloner, size: u64) -> Vec<String> {
    let mut warnings = Vec::new();
    if !cloner.hard_quota() {
        warnings.push(format!(
            "{} here cannot limit what each sandbox writes: one sandbox can fill the volume and stop its \
             neighbours' servers. Use --fs btrfs for a kernel-enforced quota per sandbox",
            cloner.filesystem()
        ));
    }
    let default_limit: u64 = 10 << 30;
    if size < default_limit {
        warnings.push(format!(
            "the volume ({} MiB) is smaller than one sandbox's default allowance (10 GiB): serve with a \
             smaller --disk-limit, or one sandbox may take all of it",
            size >> 20
        ));
    }
    warnings
}

/// Mounts the image on the volume if an image exists and nothing is mounted there
/// (after a reboot, say). Returns whether it mounted.
pub fn ensure_mounted(layout: &Layout) -> Result<bool> {
    let volume = layout.volume();
    if !layout.storage_image().exists() || is_mount_point(&volume) {
        return Ok(false);
    }
    if !nix::unistd::geteuid().is_root() {
        return Ok(false);
    }
    std::fs::create_dir_all(&volume)?;
    mount(layout)?;
    Ok(true)
}

fn mount(layout: &Layout) -> Result<()> {
    let volume = layout.volume();
    run(
        Command::new("mount").args(["-o", "loop,noatime"]).arg(layout.storage_image()).arg(&volume),
        "mount",
    )?;
    // The volume root must be traversable by instance users.
    std::fs::set_permissions(&volume, std::os::unix::fs::PermissionsExt::from_mode(0o711))?;
    let fs = filesystem_name(&volume);
    if fs != "xfs" && fs != "btrfs" {
        return Err(storage_error(format!("mounted {} but found {fs}", volume.display()), "check `mount`"));
    }
    Ok(())
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let out =
        cmd.output().map_err(|e| storage_error(format!("{what} could not run: {e}"), "is it installed?"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(storage_error(
            format!("{what} failed: {}", String::from_utf8_lossy(&out.stderr).trim()),
            "loop devices need root and a kernel with XFS; see `airlock doctor`",
        ))
    }
}

fn which(tool: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    std::env::split_paths(&format!("{path}:/usr/sbin:/sbin")).map(|d| d.join(tool)).find(|p| p.exists())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("20G").unwrap(), 20 << 30);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert!(parse_size("10M").is_err());
    }
}
