//! How far each golden build has got, for `golden create` and `refresh` to
//! show while they wait (`GET /v1/goldens/{name}/progress`).

use std::collections::HashMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// One build's progress.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BuildProgress {
    /// `dumping`, `restoring schema`, `restoring data`, `indexing`, `checking`...
    pub phase: String,
    /// Tables whose data is done in this phase.
    pub tables_done: u64,
    /// Tables with data in the source.
    pub tables_total: u64,
    /// Bytes dumped (while dumping) or restored (while restoring data).
    pub bytes: u64,
    /// The dump's size, once known.
    pub bytes_total: u64,
}

/// Builds under way, by golden name.
#[derive(Debug, Default)]
pub struct Builds(Mutex<HashMap<String, BuildProgress>>);

impl Builds {
    /// Changes golden `name`'s progress.
    pub fn update(&self, name: &str, f: impl FnOnce(&mut BuildProgress)) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f(map.entry(name.to_owned()).or_default());
    }

    /// Golden `name`'s progress, if a build of it is under way.
    pub fn get(&self, name: &str) -> Option<BuildProgress> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get(name).cloned()
    }

    /// Forgets golden `name`'s progress when its build ends.
    pub fn end(&self, name: &str) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
    }
}
