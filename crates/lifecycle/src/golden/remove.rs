//! Removing a golden: its sandboxes and warm pool first (when forced), then
//! its row, then its files.

use super::Golden;
use crate::engine::{Engine, GoldenWork};
use crate::sandbox;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::events::{DeleteReason, NewEvent};
use airlock_state::store::SandboxFilter;

/// Deletes a golden; refuses while sandboxes use it unless `force`, which deletes them first.
/// No build, promotion or new sandbox of it runs meanwhile.
pub async fn remove(engine: &Engine, name: &str, force: bool) -> Result<Golden> {
    let golden = engine.store().golden(name)?;
    let _reserved = engine.reserve_golden(name, GoldenWork::Remove)?;
    let users =
        engine.store().sandboxes(&SandboxFilter { golden: Some(name.to_owned()), ..Default::default() })?;
    if !users.is_empty() && !force {
        return Err(Error::new(
            ErrorCode::GoldenInUse,
            format!("golden {name:?} has {} live sandboxes", users.len()),
            "delete them first, or pass --force to delete them along with the golden",
        ));
    }
    for sb in users {
        match sandbox::delete(engine, &sb.id, DeleteReason::User).await {
            Ok(_) => {}
            Err(e) if e.code == ErrorCode::SandboxNotFound => {}
            Err(e) => return Err(e),
        }
    }
    // Empty its warm pool: no new members (none can be made while it is
    // reserved), then none of the old.
    engine.store().set_pool_size(name, 0)?;
    let pool = SandboxFilter { golden: Some(name.to_owned()), pooled: true, ..Default::default() };
    let members = engine.store().sandboxes(&pool)?;
    for m in members {
        if engine.store().begin_delete(&m.id)? {
            sandbox::teardown(engine, &m, DeleteReason::Drained).await?;
        }
    }
    // The row goes before the files: a crash in between leaves only files no
    // row lists, which the next start removes.
    {
        let mut store = engine.store();
        store.delete_golden(name)?;
        store.record_or_log(NewEvent {
            kind: airlock_core::events::EventKind::GoldenDeleted,
            golden: Some(name.to_owned()),
            ..Default::default()
        });
    }
    // A dump a failed refresh kept is of no use without the golden.
    let _ = std::fs::remove_dir_all(engine.layout.imports().join(name));
    let dir = engine.layout.goldens().join(name);
    if let Err(e) = std::fs::remove_dir_all(&dir) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::error!(golden = name, error = %e, "removing a deleted golden's files failed; the next start removes them");
        }
    }
    Ok(golden)
}
