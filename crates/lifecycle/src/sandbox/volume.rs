//! How full the copy-on-write volume is, and the free space it keeps in
//! reserve: what capacity and headroom both measure against.

use crate::engine::Engine;

/// One reading of the volume, in bytes.
#[derive(Debug, Clone, Copy)]
pub struct Space {
    /// Its size.
    pub size: u64,
    /// In use (shared reflinked blocks count once).
    pub used: u64,
    /// Free for unprivileged writers.
    pub free: u64,
    /// The free space kept in reserve (`--disk-reserve` of its size).
    pub reserve: u64,
}

impl Space {
    /// Reads the volume once; `None` where it cannot be read.
    pub fn read(engine: &Engine) -> Option<Space> {
        let s = nix::sys::statvfs::statvfs(&engine.layout.volume()).ok()?;
        let size = s.blocks() * s.fragment_size();
        Some(Space {
            size,
            used: s.blocks().saturating_sub(s.blocks_free()) * s.fragment_size(),
            free: s.blocks_available() * s.fragment_size(),
            reserve: engine.config.disk_reserve.of(size),
        })
    }

    /// [`Space::read`], a volume that cannot be read counting as empty, with
    /// no reserve and no limit to what is free.
    pub fn of(engine: &Engine) -> Space {
        Space::read(engine).unwrap_or(Space {
            size: 0,
            used: 0,
            free: u64::MAX,
            reserve: engine.config.disk_reserve.of(0),
        })
    }
}
