//! A golden generation's inventory: every path in it, parents first, with
//! each file's size, mode and SHA-256, taken once when the generation is
//! built and kept beside its manifest. Replication sends and checks files
//! by it ([`super::replica`]); taking one needs nothing but the directory.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use airlock_core::secret::hex;

/// The inventory's file, in the generation's directory.
pub const INVENTORY: &str = "files.json";
/// How much of a file is read or written at a time.
pub const CHUNK: usize = 256 * 1024;

/// What one path in a generation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file.
    File,
    /// A symbolic link.
    Symlink,
}

/// One path in a generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Entry {
    /// Its path inside the generation's directory.
    pub path: String,
    /// What it is.
    pub kind: Kind,
    /// Its permission bits.
    pub mode: u32,
    /// A file's size in bytes.
    #[serde(default)]
    pub size: u64,
    /// A file's SHA-256, in hex.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sha256: String,
    /// A link's target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// Every path of a generation, parents before what they hold.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Inventory {
    /// The paths, in the order files are sent.
    pub entries: Vec<Entry>,
}

impl Inventory {
    /// The bytes of every file.
    pub fn bytes(&self) -> u64 {
        // Sizes come from another node: a sum past 2^64 must not wrap into a small one.
        self.entries.iter().fold(0u64, |sum, e| sum.saturating_add(e.size))
    }

    /// The files, in order.
    pub(super) fn files(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter().filter(|e| e.kind == Kind::File)
    }
}

/// Lists and hashes the generation directory `root` (its own inventory file
/// aside), parents before what they hold, each directory's entries by name.
///
/// A promoted generation's tree is shaped by a sandbox's agent (a chain of
/// thousands of directories costs it nothing), so the walk keeps its own
/// stack on the heap and never recurses: no shape exhausts the daemon's
/// stack. Links are listed as themselves, never followed, and a file is
/// opened only as a regular file.
pub fn take_inventory(root: &Path) -> std::io::Result<Inventory> {
    let mut entries = Vec::new();
    // Each directory being listed, with the names of it still to visit.
    let mut open: Vec<(PathBuf, std::vec::IntoIter<std::ffi::OsString>)> =
        vec![(PathBuf::new(), listed(root)?.into_iter())];
    while let Some((dir, names)) = open.last_mut() {
        let Some(name) = names.next() else {
            open.pop();
            continue;
        };
        let path = dir.join(name);
        if path == Path::new(INVENTORY) {
            continue;
        }
        let shown = path.to_str().map(str::to_owned).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{} is not UTF-8", path.display()))
        })?;
        let full = root.join(&path);
        let meta = std::fs::symlink_metadata(&full)?;
        let entry = |kind, size, sha256, target| Entry {
            path: shown,
            kind,
            mode: meta.mode() & 0o7777,
            size,
            sha256,
            target,
        };
        let kind = meta.file_type();
        if kind.is_dir() {
            entries.push(entry(Kind::Dir, 0, String::new(), None));
            let children = listed(&full)?;
            open.push((path, children.into_iter()));
        } else if kind.is_symlink() {
            let target = std::fs::read_link(&full)?.to_string_lossy().into_owned();
            entries.push(entry(Kind::Symlink, 0, String::new(), Some(target)));
        } else if kind.is_file() {
            let (size, sha256) = hashed(&full)?;
            entries.push(entry(Kind::File, size, sha256, None));
        }
        // Sockets and fifos are not part of a generation at rest.
    }
    Ok(Inventory { entries })
}

/// The names in directory `dir`, sorted.
fn listed(dir: &Path) -> std::io::Result<Vec<std::ffi::OsString>> {
    let mut names: Vec<_> =
        std::fs::read_dir(dir)?.map(|e| e.map(|e| e.file_name())).collect::<std::io::Result<_>>()?;
    names.sort();
    Ok(names)
}

/// A regular file's size and SHA-256 (hex), read never through a link.
fn hashed(path: &Path) -> std::io::Result<(u64, String)> {
    let mut file = airlock_host::storage::tree::open_read(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok((size, hex(&hasher.finalize())));
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
}

/// Writes the inventory of the generation directory `root` beside its manifest.
pub fn write_inventory(root: &Path) -> std::io::Result<Inventory> {
    let inventory = take_inventory(root)?;
    let json = serde_json::to_vec(&inventory).expect("an inventory serializes");
    airlock_host::storage::tree::write_private(&root.join(INVENTORY), &json, 0o600)?;
    Ok(inventory)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inventory_lists_parents_first_and_hashes_each_file() {
        let dir = std::env::temp_dir().join(format!("airlock-inventory-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("pgdata/base")).unwrap();
        std::fs::write(dir.join("manifest.json"), b"{}").unwrap();
        std::fs::write(dir.join("pgdata/base/1"), b"abc").unwrap();
        std::fs::write(dir.join("pgdata/empty"), b"").unwrap();
        std::os::unix::fs::symlink("base", dir.join("pgdata/link")).unwrap();
        let inventory = write_inventory(&dir).unwrap();
        let paths: Vec<(&str, Kind)> = inventory.entries.iter().map(|e| (e.path.as_str(), e.kind)).collect();
        assert_eq!(
            paths,
            [
                ("manifest.json", Kind::File),
                ("pgdata", Kind::Dir),
                ("pgdata/base", Kind::Dir),
                ("pgdata/base/1", Kind::File),
                ("pgdata/empty", Kind::File),
                ("pgdata/link", Kind::Symlink),
            ]
        );
        let abc = &inventory.entries[3];
        assert_eq!(abc.sha256, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!((abc.size, inventory.bytes()), (3, 5));
        // Taken again, its own file is not in it.
        assert_eq!(take_inventory(&dir).unwrap(), inventory);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A chain of directories a sandbox's agent could make before a promotion:
    /// listed on a thread with a small stack, which a recursive walk would
    /// overflow (aborting the daemon).
    #[test]
    fn a_deep_chain_of_directories_is_listed_without_exhausting_a_stack() {
        let dir = std::env::temp_dir().join(format!("airlock-deep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let depth = 1500;
        let deepest: PathBuf =
            std::iter::once(dir.clone()).chain((0..depth).map(|_| PathBuf::from("d"))).collect();
        std::fs::create_dir_all(&deepest).unwrap();
        std::fs::write(deepest.join("leaf"), b"x").unwrap();
        let root = dir.clone();
        let listed = std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(move || take_inventory(&root))
            .unwrap()
            .join()
            .expect("the walk did not overflow its stack")
            .unwrap();
        assert_eq!(listed.entries.len(), depth + 1);
        assert_eq!(listed.entries.last().map(|e| (e.kind, e.size)), Some((Kind::File, 1)));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
