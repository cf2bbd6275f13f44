//! What a golden is built from and what each generation records about itself.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use airlock_postgres::imported::Exclusions;

use airlock_core::clock::Timestamp;
use airlock_core::dsn;
use airlock_core::records::masking::{MaskingRecord, Shape};

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
        /// Tables and schemas left out (`--exclude-table`, `--exclude-schema`).
        #[serde(default, skip_serializing_if = "Exclusions::is_empty")]
        exclude: Exclusions,
        /// Parallel jobs for dump and restore (default: the cores, 2 to 4).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        jobs: Option<usize>,
        /// Extensions installed although they can reach outside a fork
        /// (`--allow-extension`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        allow_extensions: Vec<String>,
        /// Masking and subset, applied before anything of the source is sealed.
        #[serde(default, skip_serializing_if = "Shape::is_empty")]
        shape: Shape,
    },
    /// A pg_dump file, custom, tar or plain format.
    Dump {
        /// The dump file.
        #[schema(value_type = String)]
        path: PathBuf,
        /// Parallel jobs for the restore (default: the cores, 2 to 4).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        jobs: Option<usize>,
        /// Extensions installed although they can reach outside a fork
        /// (`--allow-extension`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        allow_extensions: Vec<String>,
        /// Masking and subset, applied before anything of the dump is sealed.
        #[serde(default, skip_serializing_if = "Shape::is_empty")]
        shape: Shape,
    },
    /// No PostgreSQL part: the golden is its Redis part alone, and its forks
    /// run no PostgreSQL.
    RedisOnly,
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
            Source::Url { dsn, exclude, jobs, allow_extensions, shape } => Source::Url {
                dsn: dsn::redact(dsn),
                exclude: exclude.clone(),
                jobs: *jobs,
                allow_extensions: allow_extensions.clone(),
                shape: shape.clone(),
            },
            other => other.clone(),
        }
    }

    /// How a build from this source is masked and cut (nothing for most).
    pub fn shape(&self) -> Option<&Shape> {
        match self {
            Source::Url { shape, .. } | Source::Dump { shape, .. } if !shape.is_empty() => Some(shape),
            _ => None,
        }
    }

    /// The extensions a build from this source may install.
    pub fn allowed_extensions(&self) -> airlock_postgres::extensions::Allowed {
        match self {
            Source::Url { allow_extensions, .. } | Source::Dump { allow_extensions, .. } => {
                airlock_postgres::extensions::Allowed::with(allow_extensions)
            }
            _ => Default::default(),
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
    /// Its PostgreSQL major version: every fork of it runs on that major.
    #[serde(default)]
    pub postgres_major: u32,
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
    pub planted: Vec<airlock_postgres::catalog::planted::Planted>,
    /// For a build from a live database or a dump: how long it took and how
    /// faithfully the golden holds the source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub import: Option<airlock_postgres::imported::Report>,
    /// The Redis part, when the golden has one: forks get a Redis of their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<airlock_core::records::redis::RedisPart>,
    /// For a masked or subsetted golden (or one promoted from a fork of one):
    /// what was masked and cut, and whether the leak check passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub masking: Option<MaskingRecord>,
}

impl Manifest {
    /// The major its forks run on (read from the version for manifests older than the field).
    pub fn major(&self) -> u32 {
        recorded_major(self.postgres_major, &self.postgres_version)
    }

    /// Whether the generation has a PostgreSQL part (a Redis-only one has none,
    /// and records no major).
    pub fn has_postgres(&self) -> bool {
        self.major() != 0
    }
}

/// A manifest's major: its field, or for manifests older than the field the
/// major of the version it names.
pub fn recorded_major(field: u32, version: &str) -> u32 {
    match field {
        0 => airlock_postgres::bin::major_of(version).unwrap_or(0),
        major => major,
    }
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

#[cfg(test)]
mod tests {
    use airlock_postgres::imported::Exclusions;

    #[test]
    fn exclusions_match_as_pg_dump_patterns_do() {
        let e =
            Exclusions { tables: vec!["audit_*".into(), "app.big".into()], schemas: vec!["scratch".into()] };
        assert!(e.leaves_out("public.audit_2024"));
        assert!(e.leaves_out("app.big"));
        assert!(!e.leaves_out("other.big"));
        assert!(e.leaves_out("scratch.anything"));
        assert!(!e.leaves_out("app.orders"));
    }
}
