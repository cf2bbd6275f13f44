//! The PostgreSQL major versions this host can run goldens and sandboxes on:
//! the system's own (`/usr/lib/postgresql/N`, or `--pg-bin`) and those
//! `airlock postgres install` put under the install root, each with its
//! in-server guard, and the client tools that dump, restore and load for it.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::bin::{major_of, PgBin};
use airlock_core::error::{Error, ErrorCode, Result};

/// The install root when none is configured: `/opt/airlock/postgresql` for
/// root, `~/.local/share/airlock/postgresql` otherwise.
pub fn default_root() -> PathBuf {
    if let Some(root) = std::env::var_os("AIRLOCK_PG_ROOT") {
        return PathBuf::from(root);
    }
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/opt/airlock/postgresql");
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".local/share/airlock/postgresql")
}

/// What `airlock postgres install` records in each tree it adds (`install.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Installed {
    /// The major version.
    pub major: u32,
    /// The full version (`17.10`).
    pub version: String,
    /// `server` (a server with headers for the guard) or `clients` (client tools).
    pub kind: String,
    /// The bin directory, relative to the tree.
    pub bin: String,
    /// The server headers, relative to the tree (servers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include: Option<String>,
    /// Every file it was made from: its URL and SHA-256.
    pub sources: Vec<Download>,
}

/// One file an installed tree was made from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Download {
    /// Where it came from.
    pub url: String,
    /// Its SHA-256, as checked after the download.
    pub sha256: String,
}

/// A server that goldens and sandboxes of its major run on.
#[derive(Debug, Clone)]
pub struct Server {
    /// The major version.
    pub major: u32,
    /// `postgres --version`'s number (`17.10`).
    pub version: String,
    /// Its binaries.
    pub bin: PgBin,
    /// The in-server guard its sandboxes preload.
    pub guard: PathBuf,
    /// `system` or `installed`.
    pub origin: &'static str,
}

/// One major as `airlock postgres ls` and `doctor` show it.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MajorInfo {
    /// The major version.
    pub major: u32,
    /// The full version.
    pub version: String,
    /// `system` or `installed`.
    pub origin: String,
    /// The bin directory.
    pub bin: String,
    /// Whether goldens of this major are built when none is asked for.
    pub default: bool,
    /// The client tools its dumps, restores and loads use (their bin directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clients: Option<String>,
    /// Why it cannot be used, when it cannot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// Every usable server by major, the default one, and the client tool sets.
pub struct Majors {
    servers: BTreeMap<u32, Server>,
    default: u32,
    /// Client tool sets by their major.
    clients: BTreeMap<u32, PgBin>,
    /// Majors found but not usable, and why.
    unusable: BTreeMap<u32, (String, String)>,
    root: PathBuf,
}

/// A server found on the host, before its guard is made.
struct Candidate {
    major: u32,
    version: String,
    bin: PgBin,
    include: Option<PathBuf>,
    /// An installed major's tree, where its compiled guard is kept.
    tree: Option<PathBuf>,
    origin: &'static str,
}

impl Majors {
    /// Finds the servers and client tools: `configured` (`--pg-bin`) or the
    /// newest system server is the default; every system major and every tree
    /// under `root` is usable once its guard is in `lib`.
    pub fn discover(configured: Option<&Path>, root: &Path, lib: &Path) -> Result<Majors> {
        let default_bin = PgBin::locate(configured)?;
        let default = default_bin.major().ok_or_else(|| {
            Error::new(
                ErrorCode::PostgresFailed,
                format!("cannot tell the version of {}", default_bin.dir().display()),
                "check `postgres --version` runs",
            )
        })?;
        let mut candidates = vec![Candidate {
            major: default,
            version: number(&default_bin.version()),
            include: include_of(&default_bin),
            bin: default_bin.clone(),
            tree: None,
            origin: "system",
        }];
        candidates.extend(system_servers().into_iter().filter(|c| c.major != default));
        let mut clients: BTreeMap<u32, PgBin> = BTreeMap::new();
        for c in &candidates {
            if c.bin.has_clients() {
                clients.entry(c.major).or_insert_with(|| c.bin.clone());
            }
        }
        let mut unusable = BTreeMap::new();
        for (dir, installed) in installed_trees(root, &mut unusable) {
            let bin = dir.join(&installed.bin);
            match installed.kind.as_str() {
                "clients" => {
                    if let Ok(b) = PgBin::clients(bin) {
                        clients.entry(installed.major).or_insert(b);
                    }
                }
                _ if candidates.iter().any(|c| c.major == installed.major) => {}
                _ => match PgBin::server(bin) {
                    Ok(b) => candidates.push(Candidate {
                        major: installed.major,
                        version: installed.version.clone(),
                        bin: b,
                        include: installed.include.as_ref().map(|i| dir.join(i)),
                        tree: Some(dir.clone()),
                        origin: "installed",
                    }),
                    Err(e) => {
                        unusable.insert(installed.major, (dir.display().to_string(), e.message));
                    }
                },
            }
        }
        let mut servers = BTreeMap::new();
        for c in candidates {
            match crate::guard::for_major(lib, c.major, c.include.as_deref(), c.tree.as_deref()) {
                Ok(guard) => {
                    let server =
                        Server { major: c.major, version: c.version, bin: c.bin, guard, origin: c.origin };
                    servers.insert(c.major, server);
                }
                // The default server must be usable; others are reported.
                Err(e) if c.major == default => return Err(e),
                Err(e) => {
                    unusable.insert(c.major, (c.bin.dir().display().to_string(), e.message));
                }
            }
        }
        Ok(Majors { servers, default, clients, unusable, root: root.to_path_buf() })
    }

    /// The server goldens are built on when no major is asked for.
    pub fn default_server(&self) -> &Server {
        &self.servers[&self.default]
    }

    /// The server of one major, or an error saying how to install it.
    pub fn server(&self, major: u32) -> Result<&Server> {
        if let Some(server) = self.servers.get(&major) {
            return Ok(server);
        }
        let (message, hint) = match self.unusable.get(&major) {
            Some((dir, why)) => (
                format!("PostgreSQL {major} in {dir} cannot be used: {why}"),
                format!("reinstall it with `airlock postgres install {major}`"),
            ),
            None => (
                format!("PostgreSQL {major} is not installed on this host (it has {})", self.have()),
                format!(
                    "install it with `airlock postgres install {major}` (into {}), then restart the daemon",
                    self.root.display()
                ),
            ),
        };
        Err(Error::new(ErrorCode::PostgresMissing, message, hint))
    }

    /// The client tools for a server or source of `major`: the oldest set at
    /// least that new (pg_dump refuses newer servers, and its archives are
    /// read only by a pg_restore as new).
    pub fn clients_for(&self, major: u32) -> Result<&PgBin> {
        self.clients.range(major..).next().map(|(_, b)| b).ok_or_else(|| {
            let newest = self.clients.keys().next_back().map_or("none".to_owned(), |m| m.to_string());
            Error::new(
                ErrorCode::PostgresMissing,
                format!("no PostgreSQL client tools of major {major} or newer on this host (newest: {newest})"),
                "install them with `airlock postgres install 18` (client tools come with it), then restart the daemon",
            )
        })
    }

    /// Every major found, usable or not, for `postgres ls` and `doctor`.
    pub fn list(&self) -> Vec<MajorInfo> {
        let mut out: Vec<MajorInfo> = self
            .servers
            .values()
            .map(|s| MajorInfo {
                major: s.major,
                version: s.version.clone(),
                origin: s.origin.into(),
                bin: s.bin.dir().display().to_string(),
                default: s.major == self.default,
                clients: self.clients_for(s.major).ok().map(|b| b.dir().display().to_string()),
                problem: None,
            })
            .collect();
        out.extend(self.unusable.iter().map(|(major, (dir, why))| MajorInfo {
            major: *major,
            version: String::new(),
            origin: "installed".into(),
            bin: dir.clone(),
            default: false,
            clients: None,
            problem: Some(why.clone()),
        }));
        out.sort_by_key(|m| m.major);
        out
    }

    fn have(&self) -> String {
        self.servers.keys().map(|m| m.to_string()).collect::<Vec<_>>().join(", ")
    }
}

/// `/usr/lib/postgresql/N/bin` with a server in it, each major once.
fn system_servers() -> Vec<Candidate> {
    let mut found: Vec<Candidate> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let major: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = PgBin::server(e.path().join("bin")).ok()?;
            let version = number(&bin.version());
            (major_of(&version) == Some(major)).then(|| Candidate {
                major,
                version,
                include: include_of(&bin),
                bin,
                tree: None,
                origin: "system",
            })
        })
        .collect();
    found.sort_by_key(|c| c.major);
    found
}

/// The server headers of a system installation (`pg_config --includedir-server`).
fn include_of(bin: &PgBin) -> Option<PathBuf> {
    let out = std::process::Command::new(bin.tool("pg_config")).arg("--includedir-server").output().ok()?;
    out.status.success().then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// `17.10` from `postgres (PostgreSQL) 17.10`.
pub fn number(version: &str) -> String {
    version.split_whitespace().find(|w| w.starts_with(|c: char| c.is_ascii_digit())).unwrap_or("").to_owned()
}

/// The trees under `root` with an `install.json`. The root and each tree must
/// belong to this user and be writable by no one else: the daemon runs what is
/// in them, and starts sandboxes with them.
fn installed_trees(root: &Path, unusable: &mut BTreeMap<u32, (String, String)>) -> Vec<(PathBuf, Installed)> {
    if !root.exists() || trusted(root).is_err() {
        return Vec::new();
    }
    let mut found = Vec::new();
    for entry in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let dir = entry.path();
        let Ok(text) = std::fs::read_to_string(dir.join("install.json")) else { continue };
        let Ok(installed) = serde_json::from_str::<Installed>(&text) else { continue };
        match trusted(&dir) {
            Ok(()) => found.push((dir, installed)),
            Err(why) => {
                unusable.insert(installed.major, (dir.display().to_string(), why));
            }
        }
    }
    found.sort_by_key(|(_, i)| i.major);
    found
}

/// Whether a directory belongs to this user and no one else may write it.
pub fn trusted(dir: &Path) -> std::result::Result<(), String> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() || meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{} must belong to this user and be writable by no one else (it is uid {}, mode {:o})",
            dir.display(),
            meta.uid(),
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}
