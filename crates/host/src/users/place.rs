//! Where a data root's sandboxes lease their uids: the lease directory and the
//! range, recorded at the data root's first serve and kept.
//!
//! Every daemon on a host must lease from one directory, or two could hand
//! out one uid, and two sandboxes of one uid reach each other's processes and
//! files. A daemon a CLI command starts by itself runs plain `serve`, with
//! none of the flags the operator's daemon was given: it takes the place its
//! data root recorded, so it leases where its predecessor did. A daemon given
//! another place while the data root still has sandboxes is refused: their
//! uids are leased in the recorded one.

use std::path::{Path, PathBuf};

use airlock_core::error::{Error, ErrorCode, Result};

use super::{UidRange, DEFAULT_LEASE_DIR};

/// The lease directory and uid range a data root's sandboxes lease from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeasePlace {
    /// Where the leases are (shared by every daemon of the host).
    pub lease_dir: PathBuf,
    /// The uids leased.
    pub uid_range: UidRange,
}

impl LeasePlace {
    /// The place of the data root whose record is at `record`: as recorded
    /// unless given, else as given or by default, recorded now. `occupied`
    /// says whether the data root has sandboxes; while it has, a place given
    /// that differs from the recorded one is refused. Run under the data
    /// root's lock, so only one daemon writes the record.
    pub fn settle(
        record: &Path,
        dir: Option<PathBuf>,
        range: Option<UidRange>,
        occupied: bool,
    ) -> Result<LeasePlace> {
        let recorded: Option<LeasePlace> =
            std::fs::read(record).ok().and_then(|bytes| serde_json::from_slice(&bytes).ok());
        let given = match (&recorded, dir, range) {
            (Some(r), None, None) => return Ok(r.clone()),
            (Some(r), dir, range) => LeasePlace {
                lease_dir: dir.unwrap_or_else(|| r.lease_dir.clone()),
                uid_range: range.unwrap_or(r.uid_range),
            },
            (None, dir, range) => LeasePlace {
                lease_dir: dir.unwrap_or_else(|| PathBuf::from(DEFAULT_LEASE_DIR)),
                uid_range: range.unwrap_or_default(),
            },
        };
        if let Some(r) = recorded.as_ref().filter(|r| **r != given && occupied) {
            return Err(Error::new(
                ErrorCode::InvalidRequest,
                format!(
                    "this data root's sandboxes lease their uids in {} from {}-{}, not {} from {}-{}",
                    r.lease_dir.display(),
                    r.uid_range.first,
                    r.uid_range.last(),
                    given.lease_dir.display(),
                    given.uid_range.first,
                    given.uid_range.last()
                ),
                "serve it with the recorded --lease-dir and --uid-range (or neither), or delete its sandboxes first",
            ));
        }
        if recorded.as_ref() != Some(&given) {
            let text = serde_json::to_vec_pretty(&given).map_err(|e| Error::internal(e.to_string()))?;
            crate::storage::tree::write_private(record, &text, 0o600)?;
        }
        Ok(given)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_root_keeps_the_place_it_first_leased_from() {
        let dir = std::env::temp_dir().join(format!("airlock-place-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let record = dir.join("lease-place.json");
        let range = UidRange { first: 2_000_000_000, count: 8 };
        let first = LeasePlace::settle(&record, Some(dir.join("leases")), Some(range), false).unwrap();
        assert_eq!(first, LeasePlace { lease_dir: dir.join("leases"), uid_range: range });
        // A plain serve (a daemon a CLI command started) takes the recorded place.
        assert_eq!(LeasePlace::settle(&record, None, None, true).unwrap(), first);
        // Another place is refused while sandboxes hold uids of this one...
        let other = LeasePlace::settle(&record, None, Some(UidRange::default()), true).unwrap_err();
        assert_eq!(other.code, ErrorCode::InvalidRequest);
        assert!(other.message.contains(&dir.join("leases").display().to_string()), "{}", other.message);
        assert_eq!(
            LeasePlace::settle(&record, None, None, true).unwrap(),
            first,
            "a refusal changed the record"
        );
        // ...and taken, and recorded, once there are none.
        let moved = LeasePlace::settle(&record, Some(dir.join("elsewhere")), None, false).unwrap();
        assert_eq!(moved, LeasePlace { lease_dir: dir.join("elsewhere"), uid_range: range });
        assert_eq!(LeasePlace::settle(&record, None, None, true).unwrap(), moved);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
