//! The host under Airlock: what the daemon asks of the operating system.
//!
//! Copy-on-write storage and its quotas ([`storage`]), OS identities and their
//! host-wide leases ([`users`]), processes held by a pidfd ([`pidfd`]), cgroup limits ([`cgroup`]) and moves into them that do not wait ([`cgroup_moves`]), the seccomp filter
//! ([`seccomp`]), the private root every contained process sees
//! ([`rootfs`]) and files' writes told as they happen ([`watch`]). Nothing here knows what runs in a sandbox.

pub mod cgroup;
pub mod cgroup_moves;
pub mod contain;
pub mod gate;
pub mod pidfd;
pub mod rootfs;
pub mod seccomp;
pub mod spawn;
pub mod storage;
pub mod users;
pub mod watch;

/// A new, empty directory of a test's own under the temporary directory.
#[cfg(test)]
fn test_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("airlock-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    dir
}
