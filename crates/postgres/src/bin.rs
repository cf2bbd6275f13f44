//! One directory of PostgreSQL binaries: a server's, a set of client tools, or both.

use std::path::{Path, PathBuf};

use airlock_core::error::{Error, ErrorCode, Result};

/// The tools a server directory must have.
pub const SERVER_TOOLS: &[&str] = &["postgres", "initdb"];

/// The client tools Airlock runs: loading SQL files, dumping and restoring.
pub const CLIENT_TOOLS: &[&str] = &["psql", "pg_dump", "pg_restore"];

/// A directory holding a server (`postgres`, `initdb`), client tools (`psql`,
/// `pg_dump`, `pg_restore`), or both.
#[derive(Debug, Clone)]
pub struct PgBin {
    dir: PathBuf,
    /// The server's major, read once (forks must not run `postgres --version`).
    major: std::sync::OnceLock<Option<u32>>,
    /// Whether its client tools speak TLS, probed once.
    tls: std::sync::OnceLock<bool>,
}

impl PgBin {
    /// Uses `configured` if given, else the newest `/usr/lib/postgresql/*/bin` with a server in it.
    pub fn locate(configured: Option<&Path>) -> Result<PgBin> {
        if let Some(dir) = configured {
            return PgBin::check(dir.to_path_buf());
        }
        let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let major: u32 = e.file_name().to_str()?.parse().ok()?;
                let bin = e.path().join("bin");
                bin.join("postgres").exists().then_some((major, bin))
            })
            .collect();
        found.sort();
        match found.pop() {
            Some((_, dir)) => PgBin::check(dir),
            None => Err(Error::new(
                ErrorCode::PostgresFailed,
                "no PostgreSQL server found under /usr/lib/postgresql",
                "install one (`apt-get install postgresql`), or pass --pg-bin DIR (or set AIRLOCK_PG_BIN)",
            )),
        }
    }

    fn check(dir: PathBuf) -> Result<PgBin> {
        PgBin::with(dir, &[SERVER_TOOLS, CLIENT_TOOLS].concat())
    }

    /// A directory with a server (`postgres`, `initdb`); client tools may be elsewhere.
    pub fn server(dir: PathBuf) -> Result<PgBin> {
        PgBin::with(dir, SERVER_TOOLS)
    }

    /// A directory with the client tools dumps and loads use.
    pub fn clients(dir: PathBuf) -> Result<PgBin> {
        PgBin::with(dir, CLIENT_TOOLS)
    }

    /// Whether the client tools' libpq can speak TLS (the PyPI builds cannot):
    /// libpq refuses `sslmode=require` before connecting when it has no TLS.
    pub fn clients_have_tls(&self) -> bool {
        *self.tls.get_or_init(|| {
            std::process::Command::new(self.tool("psql"))
                .args(["-X", "-w", "-c", "", "sslmode=require host=/nonexistent-airlock-probe"])
                .env_clear()
                .output()
                .is_ok_and(|o| !String::from_utf8_lossy(&o.stderr).contains("SSL support is not compiled in"))
        })
    }

    /// Whether this directory has the client tools too.
    pub fn has_clients(&self) -> bool {
        CLIENT_TOOLS.iter().all(|t| self.dir.join(t).exists())
    }

    fn with(dir: PathBuf, tools: &[&str]) -> Result<PgBin> {
        for tool in tools {
            if !dir.join(tool).exists() {
                return Err(Error::new(
                    ErrorCode::PostgresFailed,
                    format!("{} has no `{tool}`", dir.display()),
                    "point --pg-bin (AIRLOCK_PG_BIN) at a PostgreSQL bin directory with the server and client tools",
                ));
            }
        }
        Ok(PgBin { dir, major: Default::default(), tls: Default::default() })
    }

    /// The full path of one tool.
    pub fn tool(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The directory itself.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The server's major version (15 for 15.18).
    pub fn major(&self) -> Option<u32> {
        *self.major.get_or_init(|| major_of(&self.version()))
    }

    /// The extensions this installation can create (`*.control` files in
    /// its share directory), sorted.
    pub fn available_extensions(&self) -> Vec<String> {
        let share = std::process::Command::new(self.tool("pg_config"))
            .arg("--sharedir")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
            // Without pg_config: the layout of a relocatable tree, `bin/../share/postgresql`.
            .unwrap_or_else(|| self.dir.join("../share/postgresql"));
        let mut names: Vec<String> = std::fs::read_dir(share.join("extension"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".control").map(str::to_owned))
            .collect();
        names.sort();
        names
    }

    /// The server's version string, as `postgres --version` prints it.
    pub fn version(&self) -> String {
        version_of(&self.tool("postgres"))
    }
}

/// What `tool --version` prints, trimmed; empty if it does not run.
fn version_of(tool: &Path) -> String {
    std::process::Command::new(tool)
        .arg("--version")
        .env_clear()
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// 15 from "postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)".
pub fn major_of(version: &str) -> Option<u32> {
    let number = version.split_whitespace().find(|w| w.starts_with(|c: char| c.is_ascii_digit()))?;
    number.chars().take_while(char::is_ascii_digit).collect::<String>().parse().ok()
}
