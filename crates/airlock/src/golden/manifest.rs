//! What a golden is built from and what each generation records about itself.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::pg::dsn;

/// Where a golden's data comes from; kept so `golden refresh` can build again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Source {
    /// Schema files, then seed files, run in order with psql.
    Files {
        /// DDL files, run first.
        #[schema(value_type = Vec<String>)]
        schema: Vec<PathBuf>,
        /// Data files, run after the schema.
        #[schema(value_type = Vec<String>)]
        seed: Vec<PathBuf>,
    },
    /// A live database copied with pg_dump and pg_restore.
    Url {
        /// The connection string; it may hold a password, so it is shown only redacted.
        dsn: String,
    },
    /// A pg_dump file, custom, tar or plain format.
    Dump {
        /// The dump file.
        #[schema(value_type = String)]
        path: PathBuf,
    },
    /// A live sandbox's state at one instant (`airlock promote`); cannot be refreshed.
    Promoted {
        /// The sandbox it was taken from.
        sandbox: String,
        /// That sandbox's golden.
        golden: String,
        /// That sandbox's golden generation.
        generation: i64,
    },
}

impl Source {
    /// The same source with any password removed, fit for manifests, events and output.
    pub fn redacted(&self) -> Source {
        match self {
            Source::Url { dsn } => Source::Url { dsn: dsn::redact(dsn) },
            other => other.clone(),
        }
    }
}

/// Facts about one immutable golden generation, written to `manifest.json` beside its pgdata.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Manifest {
    /// The golden's name.
    pub name: String,
    /// The generation number, from 1.
    pub generation: i64,
    /// `server_version` of the instance that built it.
    pub postgres_version: String,
    /// Bytes on disk of the data directory.
    pub size_bytes: u64,
    /// SHA-256 of the schema-only dump of the application database.
    pub schema_hash: String,
    /// When the build finished.
    pub created_at: Timestamp,
    /// Where the data came from (redacted).
    pub source: Source,
    /// Settings and catalog-shadowing objects a promoted sandbox carried and
    /// the promotion was told to keep (`promote --allow-planted`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub planted: Vec<crate::catalog::planted::Planted>,
}

/// A golden and its generations, as listed and shown.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Golden {
    /// The golden's name.
    pub name: String,
    /// The generation new forks use.
    pub current_generation: i64,
    /// Live sandboxes forked from any of its generations.
    pub sandboxes: i64,
    /// How many started sandboxes (credentials bound at claim) its warm pool keeps.
    #[serde(default)]
    pub pool_size: i64,
    /// How many are in the pool now.
    #[serde(default)]
    pub pooled: i64,
    /// Every generation kept on disk, oldest first.
    pub generations: Vec<Manifest>,
    /// Where its data comes from (redacted).
    pub source: Source,
}

impl Golden {
    /// The manifest of the current generation.
    pub fn current(&self) -> Option<&Manifest> {
        self.generations.iter().find(|m| m.generation == self.current_generation)
    }
}
