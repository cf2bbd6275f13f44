//! How full the copy-on-write volume is, and the free space it keeps in
//! reserve: what capacity and headroom both measure against.

use crate::engine::Engine;

/// Bytes in use on the copy-on-write volume (shared reflinked blocks count once).
pub fn volume_used(engine: &Engine) -> u64 {
    match nix::sys::statvfs::statvfs(&engine.layout.volume()) {
        Ok(s) => s.blocks().saturating_sub(s.blocks_free()) * s.fragment_size(),
        Err(_) => 0,
    }
}

/// Bytes free on the copy-on-write volume (for unprivileged writers).
pub fn volume_free(engine: &Engine) -> u64 {
    match nix::sys::statvfs::statvfs(&engine.layout.volume()) {
        Ok(s) => s.blocks_available() * s.fragment_size(),
        Err(_) => u64::MAX,
    }
}

/// The free space the volume keeps in reserve, in bytes.
pub fn reserve_bytes(engine: &Engine) -> u64 {
    let size = match nix::sys::statvfs::statvfs(&engine.layout.volume()) {
        Ok(s) => s.blocks() * s.fragment_size(),
        Err(_) => 0,
    };
    engine.config.disk_reserve.of(size)
}
