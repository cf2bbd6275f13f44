//! Routes: databases outside any sandbox that the router leads a client to.
//!
//! A service that puts a database behind the router (a live target, through a
//! grant) writes a route; the router, a process of its own, reads it when a
//! client names its id, authenticates the client against the route's
//! verifier, and logs in upstream with the route's own credential, which the
//! client never sees. A route holds that upstream secret, so its file is the
//! daemon's user's alone (0600 in a 0700 directory) and is written whole (a
//! temporary file renamed), so the router never reads half of one.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::layout::Layout;

/// One route, as its file holds it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Route {
    /// The id clients name as their user and database (`gr-` and ten characters).
    pub id: String,
    /// The upstream DSN, with the credential the router logs in with (never
    /// the one the client holds), with libpq's `sslmode` meanings.
    pub upstream: String,
    /// The SCRAM verifier of the client's password.
    pub verifier: String,
    /// After this, the router refuses clients and cuts their sessions.
    pub expires_at: Timestamp,
}

/// Whether `name` is a route id (`gr-` and ten lower-case letters or digits).
pub fn is_route_id(name: &str) -> bool {
    name.len() == 13
        && name.starts_with("gr-")
        && name.bytes().skip(3).all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

fn path(layout: &Layout, id: &str) -> std::path::PathBuf {
    layout.routes().join(format!("{id}.json"))
}

/// Writes `route`, replacing any of its id.
pub fn write(layout: &Layout, route: &Route) -> Result<()> {
    if !is_route_id(&route.id) {
        return Err(Error::internal(format!("{:?} is not a route id", route.id)));
    }
    let dir = layout.routes();
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    let tmp = dir.join(format!(".{}.tmp", route.id));
    let mut file =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
    file.write_all(&serde_json::to_vec(route).expect("a route serializes"))?;
    file.sync_all()?;
    std::fs::rename(&tmp, path(layout, &route.id))?;
    Ok(())
}

/// The route of `id`, if there is one.
pub fn read(layout: &Layout, id: &str) -> Result<Option<Route>> {
    if !is_route_id(id) {
        return Ok(None);
    }
    match std::fs::read(path(layout, id)) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::internal(format!("route {id} does not parse: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Removes the route of `id` (nothing if there is none).
pub fn remove(layout: &Layout, id: &str) -> Result<()> {
    let _ = std::fs::remove_file(pids_path(layout, id));
    match std::fs::remove_file(path(layout, id)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

fn pids_path(layout: &Layout, id: &str) -> std::path::PathBuf {
    layout.routes().join(format!("{id}.pids"))
}

/// Writes down the upstream backend pids of the router's sessions on route
/// `id` (the router's; the daemon reads them to tell its sessions from others).
pub fn write_pids(layout: &Layout, id: &str, pids: &[i32]) -> Result<()> {
    if !is_route_id(id) || !path(layout, id).exists() {
        return Ok(());
    }
    let tmp = layout.routes().join(format!(".{id}.pids.tmp"));
    let text: String = pids.iter().map(|p| format!("{p}\n")).collect();
    let mut file =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
    file.write_all(text.as_bytes())?;
    std::fs::rename(&tmp, pids_path(layout, id))?;
    Ok(())
}

/// The upstream backend pids of the router's sessions on route `id`.
pub fn read_pids(layout: &Layout, id: &str) -> Vec<i32> {
    std::fs::read_to_string(pids_path(layout, id))
        .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// The ids of every route.
pub fn ids(layout: &Layout) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(layout.routes()) else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_suffix(".json").map(str::to_owned))
        .filter(|id| is_route_id(id))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_is_written_whole_for_its_owner_alone_and_read_back() {
        let home = std::env::temp_dir().join(format!("airlock-route-{}", std::process::id()));
        let layout = Layout::new(&home);
        let id = crate::secret::grant_id();
        assert!(is_route_id(&id) && !is_route_id("gr-short") && !is_route_id("sb-k3v9q2mx7a"));
        let route = Route {
            id: id.clone(),
            upstream: "postgresql://r:secret@db/prod".into(),
            verifier: "SCRAM-SHA-256$4096:x$y:z".into(),
            expires_at: Timestamp(1),
        };
        write(&layout, &route).unwrap();
        let mode = |p: std::path::PathBuf| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(layout.routes()), mode(path(&layout, &id))), (0o700, 0o600));
        assert_eq!(read(&layout, &id).unwrap().unwrap().upstream, route.upstream);
        assert_eq!(ids(&layout), vec![id.clone()]);
        assert!(read(&layout, "../../etc/passwd").unwrap().is_none());
        write_pids(&layout, &id, &[12, 34]).unwrap();
        assert_eq!(read_pids(&layout, &id), vec![12, 34]);
        assert_eq!(ids(&layout), vec![id.clone()]);
        remove(&layout, &id).unwrap();
        remove(&layout, &id).unwrap();
        assert!(read_pids(&layout, &id).is_empty());
        assert!(read(&layout, &id).unwrap().is_none());
        std::fs::remove_dir_all(home).unwrap();
    }
}
