//! A directory of files as a [`StoreKind`]: a golden generation's `files/`
//! cloned into every fork, where the sandbox's `exec` code reads and writes
//! it. It runs no server: it is whatever its files hold, copied while the
//! sandbox is frozen.

use std::path::{Path, PathBuf};

use super::{At, Credential, Held, Launch, Stop, StoreKind};
use crate::sandbox::Steps;
use airlock_core::error::Result;
use airlock_core::layout::InstanceDir;
use airlock_host::storage::clone::Deferred;

/// Files in the sandbox's own directory, owned by its `exec` user.
pub struct Files;

/// The directory the kind keeps under an instance or generation directory.
pub const DIR: &str = "files";

/// Its directory under `root`.
pub fn files_dir(root: &Path) -> PathBuf {
    root.join(DIR)
}

/// Whether `path` is a directory, never following a link (the entry sits in
/// a directory only the daemon may change).
fn is_dir(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
}

#[async_trait::async_trait]
impl StoreKind for Files {
    fn name(&self) -> &'static str {
        "files"
    }

    fn in_generation(&self, root: &Path) -> bool {
        is_dir(&files_dir(root))
    }

    fn in_sandbox(&self, dir: &InstanceDir) -> bool {
        is_dir(&files_dir(&dir.root))
    }

    fn has_server(&self) -> bool {
        false
    }

    fn restarts_alone(&self) -> bool {
        true
    }

    fn clone_from_golden(&self, at: At<'_>, golden_root: &Path) -> Result<Option<Deferred>> {
        let user = at.engine.exec_user(at.sb)?;
        let (from, to) = (files_dir(golden_root), files_dir(&at.dir.root));
        super::clone_owned(at.engine, (&from, &to), &user, at.engine.daemon_user.uid, "a golden's files")?;
        Ok(None)
    }

    fn configure(&self, _at: At<'_>, _password: &str) -> Result<()> {
        Ok(())
    }

    async fn start(&self, _: At<'_>, _: &Launch, _: Credential<'_>, _: &mut Steps) -> Result<Option<i32>> {
        Ok(None)
    }

    fn pid(&self, _at: At<'_>) -> Option<i32> {
        None
    }

    async fn answers(&self, at: At<'_>) -> bool {
        self.in_sandbox(at.dir)
    }

    async fn save(&self, _at: At<'_>) -> Result<()> {
        Ok(())
    }

    async fn prepare_copy(&self, _at: At<'_>) -> Result<Option<Held>> {
        // Its writers are the sandbox's processes, frozen during the copy.
        Ok(None)
    }

    fn copy_frozen(&self, from: At<'_>, to: At<'_>) -> Result<()> {
        // Its files are the source's exec user's, who may be swapping them
        // for links: only that user's directories and regular files are taken.
        let user = to.engine.exec_user(to.sb)?;
        let source_user = from.engine.exec_user(from.sb)?;
        let (source, target) = (files_dir(&from.dir.root), files_dir(&to.dir.root));
        super::clone_owned(from.engine, (&source, &target), &user, source_user.uid, "a sandbox's files")
    }

    async fn stop(&self, _at: At<'_>, _how: Stop) -> Result<bool> {
        Ok(true)
    }

    async fn claim(&self, _at: At<'_>, _password: &str, _fresh: bool, _changed: bool) -> Result<()> {
        Ok(())
    }

    fn remove_data(&self, at: At<'_>) -> Result<()> {
        super::remove_tree(at.engine, &files_dir(&at.dir.root))
    }

    async fn clients(&self, _at: At<'_>) -> Option<u64> {
        Some(0)
    }

    fn exec_env(&self, at: At<'_>, _password: &str) -> Option<(&'static str, String, Option<&'static str>)> {
        Some(("AIRLOCK_FILES", files_dir(&at.dir.root).to_string_lossy().into_owned(), None))
    }
}
