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
            Source::Url { dsn, exclude, jobs, allow_extensions } => Source::Url {
                dsn: dsn::redact(dsn),
                exclude: exclude.clone(),
                jobs: *jobs,
                allow_extensions: allow_extensions.clone(),
            },
            other => other.clone(),
        }
    }

    /// The extensions a build from this source may install.
    pub fn allowed_extensions(&self) -> crate::golden::extensions::Allowed {
        match self {
            Source::Url { allow_extensions, .. } | Source::Dump { allow_extensions, .. } => {
                crate::golden::extensions::Allowed::with(allow_extensions)
            }
            _ => Default::default(),
        }
    }
}

/// What an import from a live database leaves out, as pg_dump's patterns
/// (`orders`, `app.audit_*`, `archive`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Exclusions {
    /// `--exclude-table` patterns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tables: Vec<String>,
    /// `--exclude-schema` patterns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schemas: Vec<String>,
}

impl Exclusions {
    /// Whether nothing is left out.
    pub fn is_empty(&self) -> bool {
        self.tables.is_empty() && self.schemas.is_empty()
    }

    /// Whether every object of schema `schema` is left out.
    pub fn leaves_out_schema(&self, schema: &str) -> bool {
        self.schemas.iter().any(|p| glob(p, schema))
    }

    /// Whether the table (or other object) `schema.name` is left out.
    pub fn leaves_out(&self, qualified: &str) -> bool {
        let (schema, name) = crate::catalog::split_qualified(qualified);
        self.schemas.iter().any(|p| glob(p, &schema))
            || self.tables.iter().any(|p| match p.split_once('.') {
                Some((ps, pn)) => glob(ps, &schema) && glob(pn, &name),
                None => glob(p, &name),
            })
    }
}

/// pg_dump's pattern matching, for the patterns people write: `*` and `?`.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
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
    pub planted: Vec<crate::catalog::planted::Planted>,
    /// For a build from a live database or a dump: how long it took and how
    /// faithfully the golden holds the source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub import: Option<crate::golden::fidelity::Report>,
    /// The Redis part, when the golden has one: forks get a Redis of their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<crate::redis::RedisPart>,
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
        0 => crate::pg::bin::major_of(version).unwrap_or(0),
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
    use super::Exclusions;

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
