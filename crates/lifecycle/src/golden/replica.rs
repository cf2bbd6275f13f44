//! A golden generation copied from one node of a cluster to another.
//!
//! A generation never changes once built, so its files are listed once, with
//! their sizes and SHA-256 hashes, when it is built: its [`Inventory`], kept
//! beside its manifest (`files.json`; a generation built before inventories
//! existed gets one the first time it is sent). A node that sends a
//! generation sends its manifest and inventory first ([`Offer`]), then every
//! file's bytes in the inventory's order ([`send_files`]). The node that
//! receives it ([`Receiver`]) writes them into staging, hashes each file as
//! it lands, and refuses the transfer at the first file whose bytes do not
//! match, or at a stream cut short. It places the generation (in `goldens/`,
//! and on record, so forks see it) only once every file is whole. A refused
//! transfer leaves nothing behind.

use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::engine::Engine;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::events::{EventKind, NewEvent};
use airlock_core::secret::hex;
use airlock_state::golden::{Manifest, Source};

pub use super::inventory::{take_inventory, write_inventory, Entry, Inventory, Kind, CHUNK, INVENTORY};

/// The inventory of golden `name`'s generation `generation`: the one kept
/// beside its manifest, or one taken (and kept) now.
pub fn inventory(engine: &Engine, name: &str, generation: i64) -> Result<Inventory> {
    let root = engine.layout.golden_generation(name, generation);
    if !root.is_dir() {
        return Err(Error::new(
            ErrorCode::GoldenNotFound,
            format!("golden {name:?} has no generation {generation} on this node"),
            "`airlock golden ls` lists the goldens and generations this node holds",
        ));
    }
    let kept = std::fs::read(root.join(INVENTORY)).ok().and_then(|b| serde_json::from_slice(&b).ok());
    match kept {
        Some(inventory) => Ok(inventory),
        None => write_inventory(&root).map_err(|e| Error::io(format!("listing {}", root.display()), &e)),
    }
}

/// What a node sends before a generation's files.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Offer {
    /// The generation's manifest.
    #[schema(value_type = Object)]
    pub manifest: Manifest,
    /// Its golden's source, with no secret in it.
    #[schema(value_type = Object)]
    pub source: Source,
    /// Its golden's warm pool size.
    pub pool_size: i64,
    /// Its files and their hashes.
    pub inventory: Inventory,
}

/// The offer of golden `name`'s generation `generation` (its current one if None).
pub fn offer(engine: &Engine, name: &str, generation: Option<i64>) -> Result<Offer> {
    let golden = engine.store().golden(name)?;
    let generation = generation.unwrap_or(golden.current_generation);
    let manifest = engine.store().manifest(name, generation)?;
    let inventory = inventory(engine, name, generation)?;
    Ok(Offer { manifest, source: golden.source.redacted(), pool_size: golden.pool_size, inventory })
}

/// Reads the files of golden `name`'s generation `generation` in `inventory`'s
/// order and hands their bytes to `send` (false from it stops). A file that
/// is shorter than listed ends the stream early, which its receiver refuses.
pub fn send_files(
    engine: &Engine,
    name: &str,
    generation: i64,
    inventory: &Inventory,
    mut send: impl FnMut(Vec<u8>) -> bool,
) -> std::io::Result<()> {
    let root = engine.layout.golden_generation(name, generation);
    for entry in inventory.files() {
        let file = airlock_host::storage::tree::open_read(&root.join(&entry.path))?;
        let mut file = file.take(entry.size);
        let mut left = entry.size;
        while left > 0 {
            let mut buf = vec![0u8; CHUNK.min(left as usize)];
            let n = file.read(&mut buf)?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("{} is shorter than its inventory says", entry.path),
                ));
            }
            buf.truncate(n);
            left -= n as u64;
            if !send(buf) {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// A transfer refused: the file whose bytes did not match, or why the
/// stream did not fit the inventory.
pub fn corrupt(name: &str, why: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorCode::ReplicationFailed,
        format!("golden {name:?} did not arrive whole: {why}"),
        "nothing was kept; try again, and if it persists, check the sending node's volume",
    )
}

/// Whether a received inventory's path stays inside the generation: plain
/// relative components only, and not the inventory's own file.
fn receivable(path: &str) -> bool {
    let p = Path::new(path);
    !path.is_empty() && p != Path::new(INVENTORY) && p.components().all(|c| matches!(c, Component::Normal(_)))
}

/// A received mode without setuid, setgid or sticky bits: a generation's files
/// and directories need none, and another node's say-so must not make one.
fn plain_mode(mode: u32) -> u32 {
    mode & 0o777
}

/// A generation being received: written into staging, each file checked as
/// it lands, placed only by [`Receiver::finish`]. Dropped unfinished, it
/// removes what it wrote.
pub struct Receiver {
    engine: Arc<Engine>,
    offer: Offer,
    root: PathBuf,
    /// Index into the inventory's entries of the file being written.
    next: usize,
    writing: Option<Writing>,
    placed: bool,
}

/// The file being written.
struct Writing {
    entry: usize,
    file: std::fs::File,
    hasher: Sha256,
    left: u64,
}

impl Receiver {
    /// Checks `offer` and makes its staging directory, with every directory of
    /// the generation in it.
    pub fn start(engine: Arc<Engine>, offer: Offer) -> Result<Receiver> {
        let name = offer.manifest.name.clone();
        airlock_core::validate::name("golden", &name)?;
        if let Some(bad) = offer.inventory.entries.iter().find(|e| !receivable(&e.path)) {
            return Err(corrupt(&name, format!("its inventory names the path {:?}", bad.path)));
        }
        // A generation at rest holds no link (a fork refuses to clone one),
        // so none is made here, wherever it would point.
        if let Some(link) = offer.inventory.entries.iter().find(|e| e.kind == Kind::Symlink) {
            return Err(corrupt(&name, format!("its inventory holds a symbolic link, {:?}", link.path)));
        }
        let needed = offer.inventory.bytes();
        let free = nix::sys::statvfs::statvfs(&engine.layout.volume())
            .map(|s| s.blocks_available() as u64 * s.fragment_size() as u64)
            .unwrap_or(u64::MAX);
        if free < needed + (256 << 20) {
            return Err(Error::new(
                ErrorCode::DiskFull,
                format!(
                    "golden {name:?} needs {} MiB here and the volume has {} MiB free",
                    needed >> 20,
                    free >> 20
                ),
                "delete sandboxes or goldens this node no longer needs, or give its volume more space",
            ));
        }
        let tag = airlock_core::secret::sandbox_id();
        let root =
            engine.layout.staging().join(format!("{name}-{}-{tag}.replica", offer.manifest.generation));
        let shown = root.display().to_string();
        let io = |e: std::io::Error| Error::io(format!("making {shown}"), &e);
        std::fs::create_dir_all(engine.layout.staging()).map_err(io)?;
        std::fs::create_dir(&root).map_err(io)?;
        // From here on, dropping the receiver removes what it made.
        let mut receiver = Receiver { engine, offer, root, next: 0, writing: None, placed: false };
        std::fs::set_permissions(&receiver.root, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
        for entry in receiver.offer.inventory.entries.iter().filter(|e| e.kind == Kind::Dir) {
            std::fs::create_dir(receiver.root.join(&entry.path)).map_err(io)?;
        }
        receiver.open_next()?;
        Ok(receiver)
    }

    /// The golden's name.
    fn name(&self) -> &str {
        &self.offer.manifest.name
    }

    /// Opens the next file of the inventory; files of no bytes are made whole at once.
    fn open_next(&mut self) -> Result<()> {
        while let Some(at) =
            self.offer.inventory.entries[self.next..].iter().position(|e| e.kind == Kind::File)
        {
            let entry = self.next + at;
            self.next = entry + 1;
            let e = &self.offer.inventory.entries[entry];
            let path = self.root.join(&e.path);
            let made =
                std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).and_then(
                    |file| {
                        file.set_permissions(std::fs::Permissions::from_mode(plain_mode(e.mode)))
                            .map(|()| file)
                    },
                );
            let file = made.map_err(|err| Error::io(format!("writing {}", path.display()), &err))?;
            self.writing = Some(Writing { entry, file, hasher: Sha256::new(), left: e.size });
            if e.size > 0 {
                return Ok(());
            }
            self.close_file()?;
        }
        Ok(())
    }

    /// Checks the file just written against its hash.
    fn close_file(&mut self) -> Result<()> {
        let Some(w) = self.writing.take() else { return Ok(()) };
        let entry = &self.offer.inventory.entries[w.entry];
        if hex(&w.hasher.finalize()) != entry.sha256 {
            return Err(corrupt(self.name(), format!("{} does not match its SHA-256", entry.path)));
        }
        drop(w.file);
        Ok(())
    }

    /// Takes the next bytes of the stream.
    pub fn take(&mut self, mut bytes: &[u8]) -> Result<()> {
        while !bytes.is_empty() {
            let Some(w) = self.writing.as_mut() else {
                return Err(corrupt(self.name(), "more bytes came than its inventory lists"));
            };
            let n = (w.left.min(bytes.len() as u64)) as usize;
            w.file
                .write_all(&bytes[..n])
                .map_err(|e| Error::io(format!("writing into {}", self.root.display()), &e))?;
            w.hasher.update(&bytes[..n]);
            w.left -= n as u64;
            bytes = &bytes[n..];
            if w.left == 0 {
                self.close_file()?;
                self.open_next()?;
            }
        }
        Ok(())
    }

    /// Places the generation once every file has come whole, and records it
    /// (a `golden_replicated` event with `detail` added); returns its manifest.
    pub fn finish(mut self, detail: serde_json::Value) -> Result<Manifest> {
        if let Some(w) = &self.writing {
            let path = &self.offer.inventory.entries[w.entry].path;
            return Err(corrupt(self.name(), format!("the stream ended inside {path}")));
        }
        let io = |what: &str, e: std::io::Error| Error::io(what.to_owned(), &e);
        // Directories' modes last: a read-only one would have refused its files.
        for entry in self.offer.inventory.entries.iter().rev().filter(|e| e.kind == Kind::Dir) {
            std::fs::set_permissions(
                self.root.join(&entry.path),
                std::fs::Permissions::from_mode(plain_mode(entry.mode)),
            )
            .map_err(|e| io("setting a directory's mode", e))?;
        }
        let inventory = serde_json::to_vec(&self.offer.inventory).expect("an inventory serializes");
        airlock_host::storage::tree::write_private(&self.root.join(INVENTORY), &inventory, 0o600)
            .map_err(|e| io("writing the inventory", e))?;
        // As a generation built here: its forks' servers pass through, nobody lists it.
        std::fs::set_permissions(&self.root, std::fs::Permissions::from_mode(0o711))
            .map_err(|e| io("opening the generation", e))?;
        let engine = self.engine.clone();
        let manifest = self.offer.manifest.clone();
        let (name, generation) = (manifest.name.clone(), manifest.generation);
        let target = engine.layout.golden_generation(&name, generation);
        std::fs::create_dir_all(target.parent().expect("a generation has a parent"))
            .map_err(|e| io("making the golden's directory", e))?;
        std::fs::rename(&self.root, &target).map_err(|e| io("placing the generation", e))?;
        self.placed = true;
        let recorded = {
            let mut store = engine.store();
            let known = store.golden(&name).ok();
            let written = match &known {
                None => store
                    .insert_golden(&manifest, &self.offer.source)
                    .and_then(|_| store.set_pool_size(&name, self.offer.pool_size)),
                Some(g) if g.current_generation < generation => store.add_generation(&manifest),
                Some(g) => Err(Error::new(
                    ErrorCode::GoldenExists,
                    format!(
                        "golden {name:?} is at generation {} here, past {generation}",
                        g.current_generation
                    ),
                    "replicate its current generation instead",
                )),
            };
            let mut detail = detail;
            detail["generation"] = generation.into();
            detail["size_bytes"] = self.offer.inventory.bytes().into();
            written.and_then(|_| {
                store.record(NewEvent {
                    kind: EventKind::GoldenReplicated,
                    golden: Some(name.clone()),
                    detail,
                    ..Default::default()
                })
            })
        };
        if let Err(e) = recorded {
            let mut store = engine.store();
            if store
                .golden(&name)
                .is_ok_and(|g| g.generations.len() == 1 && g.current_generation == generation)
            {
                let _ = store.delete_golden(&name);
            }
            drop(store);
            let _ = std::fs::remove_dir_all(&target);
            return Err(e);
        }
        engine.pool.wanted.notify_one();
        Ok(manifest)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if !self.placed {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_received_inventory_names_only_paths_inside_the_generation() {
        for good in ["manifest.json", "pgdata/base/1", "redis/dump.rdb"] {
            assert!(receivable(good), "{good}");
        }
        for bad in ["", "files.json", "../etc/passwd", "/etc/passwd", "pgdata/../../x", "./pgdata"] {
            assert!(!receivable(bad), "{bad}");
        }
        assert_eq!(plain_mode(0o104755), 0o755, "no setuid");
        assert_eq!(plain_mode(0o2770), 0o770, "no setgid");
        assert_eq!(plain_mode(0o1777), 0o777, "no sticky bit");
        let huge = Entry {
            path: "x".into(),
            kind: Kind::File,
            mode: 0o600,
            size: u64::MAX,
            sha256: String::new(),
            target: None,
        };
        assert_eq!(Inventory { entries: vec![huge.clone(), huge] }.bytes(), u64::MAX, "sizes never wrap");
    }
}
