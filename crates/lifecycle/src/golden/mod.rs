//! Goldens: named, immutable, versioned snapshots that sandboxes fork from.

pub mod archive;
mod build;
pub mod dump;

pub mod fidelity;
pub mod import;

pub mod inventory;
pub mod progress;
mod remove;
pub mod replica;
pub mod scan;
pub mod shape;
pub mod source;

pub use airlock_postgres::imported::Exclusions;
pub use airlock_state::golden::{recorded_major, Golden, Manifest, Source};
pub use build::build as build_generation;
pub use remove::remove;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::engine::{Engine, GoldenWork};
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::events::NewEvent;
use airlock_core::validate;

/// A request to make a golden: exactly one kind of source.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CreateGolden {
    /// The new golden's name.
    #[schema(pattern = "^[a-z][a-z0-9_-]{0,47}$")]
    pub name: String,
    /// Schema files (absolute paths), run first, in order.
    #[serde(default)]
    #[schema(value_type = Vec<String>)]
    pub schema: Vec<PathBuf>,
    /// Seed files (absolute paths), run after the schema, in order.
    #[serde(default)]
    #[schema(value_type = Vec<String>)]
    pub seed: Vec<PathBuf>,
    /// A live database to copy.
    #[serde(default)]
    pub from_url: Option<String>,
    /// Parallel jobs for an import's dump and restore (default: the cores, 2 to 4).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 16)]
    pub jobs: Option<usize>,
    /// Tables and schemas a `from_url` import leaves out.
    #[serde(default)]
    pub exclude: Exclusions,
    /// A dump file to restore (absolute path).
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub from_dump: Option<PathBuf>,
    /// Warm-pool size (the daemon's `--pool-size` if absent).
    #[serde(default)]
    #[schema(minimum = 0)]
    pub pool_size: Option<i64>,
    /// The PostgreSQL major to build on (default: the source's, else the host's own).
    #[serde(default)]
    #[schema(minimum = 13, maximum = 18)]
    pub postgres: Option<u32>,
    /// A Redis part: a file of Redis commands or an RDB file.
    #[serde(default)]
    pub redis: Option<airlock_core::records::redis::RedisSource>,
    /// Extensions of a `from_url` or `from_dump` import to install although
    /// they can reach outside a fork (`dblink`, `postgres_fdw`...); others are
    /// left out with a note in the fidelity report.
    #[serde(default)]
    pub allow_extensions: Vec<String>,
    /// Masking rules (a rules file, as `--mask` reads it) for a `from_url` or
    /// `from_dump` import: sensitive values are replaced before anything is sealed.
    #[serde(default)]
    pub mask: Option<airlock_core::records::masking::MaskRules>,
    /// Columns (`schema.table.column`) the scan calls sensitive to keep as they are.
    #[serde(default)]
    pub allow_unmasked: Vec<String>,
    /// Where a subset starts: `schema.table: SQL condition` (or `schema.table`).
    #[serde(default)]
    pub subset: Vec<String>,
    /// The share of the starting rows a subset keeps, above 0 and at most 100.
    #[serde(default)]
    pub subset_percent: Option<f64>,
}

impl CreateGolden {
    /// The masking and subset asked for, checked.
    fn shape(&self) -> Result<airlock_core::records::masking::Shape> {
        let shape = airlock_core::records::masking::Shape {
            mask: self.mask.clone(),
            allow_unmasked: self.allow_unmasked.clone(),
            subset: self.subset.clone(),
            subset_percent: self.subset_percent,
        };
        let invalid = |msg: String, hint: &str| Error::new(ErrorCode::MaskInvalid, msg, hint);
        if !shape.is_empty() && self.from_url.is_none() && self.from_dump.is_none() {
            return Err(invalid(
                "masking and subsets apply to a --from-url or --from-dump import".into(),
                "build from the live database (--from-url -) or from its dump (--from-dump FILE)",
            ));
        }
        if !shape.allow_unmasked.is_empty() && shape.mask.is_none() {
            return Err(invalid(
                "--allow-unmasked was given without --mask".into(),
                "give the rules file with --mask; an unmasked build keeps every column as it is anyway",
            ));
        }
        if let Some(p) = shape.subset_percent {
            if !(p > 0.0 && p <= 100.0) {
                return Err(invalid(
                    format!("--subset-percent {p} is not above 0 and at most 100"),
                    "say, --subset-percent 2",
                ));
            }
            if shape.subset.is_empty() {
                return Err(invalid(
                    "--subset-percent was given without --subset".into(),
                    "name the table to start from: --subset 'schema.table' (and a condition after a colon, if any)",
                ));
            }
        }
        for root in &shape.subset {
            shape::subset::parse_root(root)?;
        }
        if let Some(rules) = &shape.mask {
            if rules.columns.is_empty() && rules.references.is_empty() && rules.redis.is_empty() {
                return Err(invalid(
                    "the rules file masks no column and adds no reference".into(),
                    "add [[columns]] rules (`airlock golden scan --from-url -` proposes them)",
                ));
            }
            if rules.columns.is_empty() && !shape.allow_unmasked.is_empty() {
                return Err(invalid(
                    "--allow-unmasked was given with a rules file that masks nothing".into(),
                    "leave --allow-unmasked out, or add [[columns]] rules",
                ));
            }
            for (i, rule) in rules.columns.iter().enumerate() {
                airlock_mask::Transformer::compile(&rule.spec).map_err(|e| {
                    invalid(
                        format!("rule {} ({}): {e}", i + 1, rule.column),
                        "fix the rule in the rules file",
                    )
                })?;
            }
            if !rules.redis.is_empty() && self.redis.is_none() {
                return Err(invalid(
                    "the rules file masks Redis keys, and the golden has no Redis part".into(),
                    "give a Redis part (--redis-from-url, --redis-rdb, --redis-seed) or leave the [[redis]] rules out",
                ));
            }
        }
        Ok(shape)
    }

    /// The one source this request names, checked.
    pub fn source(&self) -> Result<Source> {
        let files = !self.schema.is_empty() || !self.seed.is_empty();
        let kinds = [files, self.from_url.is_some(), self.from_dump.is_some()];
        let invalid = |msg: &str| {
            Error::new(
                ErrorCode::InvalidRequest,
                msg,
                "give --schema/--seed files, or --from-url DSN, or --from-dump FILE, \
                 and/or a Redis part (--redis-seed, --redis-rdb or --redis-from-url)",
            )
        };
        let redis_only = match kinds.iter().filter(|k| **k).count() {
            0 if self.redis.is_none() => return Err(invalid("no source given for the golden")),
            0 => true,
            1 => false,
            _ => return Err(invalid("more than one kind of source given for the golden")),
        };
        if redis_only && self.postgres.is_some() {
            return Err(Error::new(
                ErrorCode::InvalidRequest,
                "a PostgreSQL major was given for a golden with no PostgreSQL part",
                "give a PostgreSQL source (--schema/--seed, --from-url or --from-dump), or leave out --postgres",
            ));
        }
        if self.jobs.is_some_and(|j| !(1..=16).contains(&j)) {
            return Err(invalid("jobs must be between 1 and 16"));
        }
        if self.postgres.is_some_and(|m| !airlock_postgres::install::SUPPORTED.contains(&m)) {
            return Err(Error::new(
                ErrorCode::InvalidRequest,
                format!("PostgreSQL {} is not a major Airlock runs on", self.postgres.unwrap_or(0)),
                "pick one of 13 to 18 (`airlock postgres ls` shows what this host has)",
            ));
        }
        if !self.exclude.is_empty() && self.from_url.is_none() {
            return Err(invalid("tables and schemas are left out only of a --from-url import"));
        }
        if !self.allow_extensions.is_empty() && self.from_url.is_none() && self.from_dump.is_none() {
            return Err(invalid(
                "extensions are allowed only for a --from-url or --from-dump import (schema and seed files \
                 create only trusted extensions, as the owner role)",
            ));
        }
        for name in &self.allow_extensions {
            if name.is_empty()
                || name.len() > 63
                || !name.chars().all(|c| c.is_ascii_alphanumeric() || "_-".contains(c))
            {
                return Err(Error::new(
                    ErrorCode::InvalidRequest,
                    format!("{name:?} is not an extension's name"),
                    "give --allow-extension the name `CREATE EXTENSION` takes, such as dblink",
                ));
            }
        }
        let redis = self.redis.as_ref().and_then(|r| r.path()).map(Path::to_path_buf);
        for path in self.schema.iter().chain(&self.seed).chain(&self.from_dump).chain(&redis) {
            if !path.is_absolute() {
                return Err(invalid(&format!("{} is not an absolute path", path.display())));
            }
        }
        if redis_only || files {
            // Refused there: masking and subsets are for imports.
            self.shape()?;
        }
        Ok(if redis_only {
            Source::RedisOnly
        } else if let Some(dsn) = &self.from_url {
            Source::Url {
                dsn: dsn.clone(),
                exclude: self.exclude.clone(),
                jobs: self.jobs,
                allow_extensions: self.allow_extensions.clone(),
                shape: self.shape()?,
            }
        } else if let Some(path) = &self.from_dump {
            Source::Dump {
                path: path.clone(),
                jobs: self.jobs,
                allow_extensions: self.allow_extensions.clone(),
                shape: self.shape()?,
            }
        } else {
            Source::Files { schema: self.schema.clone(), seed: self.seed.clone() }
        })
    }
}

/// Builds generation 1 of a new golden.
pub async fn create(engine: &Engine, req: &CreateGolden) -> Result<Golden> {
    validate::name("golden", &req.name)?;
    let source = req.source()?;
    let _guard = engine.reserve_golden(&req.name, GoldenWork::Build)?;
    if engine.store().golden(&req.name).is_ok() {
        return Err(Error::new(
            ErrorCode::GoldenExists,
            format!("a golden named {:?} exists already", req.name),
            "use `airlock golden refresh` to build a new generation, or pick another name",
        ));
    }
    let pool_size = req.pool_size.unwrap_or(engine.config.default_pool_size);
    check_pool_size(pool_size, engine)?;
    let started = std::time::Instant::now();
    // A masked golden's key: made now, kept by the daemon, used again by every refresh.
    let key = source.shape().filter(|s| s.masks()).map(|_| airlock_mask::Key::random());
    let manifest =
        build::build(engine, &req.name, 1, &source, false, req.postgres, req.redis.as_ref(), key.as_ref())
            .await?;
    let mut store = engine.store();
    if let Err(e) = store
        .insert_golden(&manifest, &source)
        .and_then(|_| store.set_pool_size(&req.name, pool_size))
        .and_then(|_| store.set_redis_source(&req.name, req.redis.as_ref()))
        .and_then(|_| match &key {
            Some(k) => store.set_mask_key(&req.name, &k.to_hex()),
            None => Ok(()),
        })
    {
        let _ = store.delete_golden(&req.name);
        let _ = std::fs::remove_dir_all(engine.layout.goldens().join(&req.name));
        return Err(e);
    }
    let recorded = store.record(NewEvent {
        kind: airlock_core::events::EventKind::GoldenCreated,
        golden: Some(req.name.clone()),
        detail: json!({"generation": 1, "size_bytes": manifest.size_bytes, "build_ms": started.elapsed().as_millis() as u64}),
        ..Default::default()
    });
    if let Err(e) = recorded {
        // A golden forks are made from exists only on record.
        let _ = store.delete_golden(&req.name);
        let _ = std::fs::remove_dir_all(engine.layout.goldens().join(&req.name));
        return Err(e);
    }
    engine.pool.wanted.notify_one();
    store.golden(&req.name)
}

/// Builds a new generation from the golden's stored source, makes it current,
/// and prunes generations no sandbox uses.
pub async fn refresh(engine: &Engine, name: &str) -> Result<Golden> {
    let _guard = engine.reserve_golden(name, GoldenWork::Build)?;
    let (source, next) = {
        let store = engine.store();
        let golden = store.golden(name)?;
        let last = golden.generations.iter().map(|m| m.generation).max().unwrap_or(0);
        (store.golden_source(name)?, last + 1)
    };
    if let Source::Promoted { sandbox, .. } = &source {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            format!(
                "golden {name:?} was promoted from sandbox {sandbox}, so there is no source to build again"
            ),
            "promote a sandbox again (`airlock promote ID --golden NAME`) to make a new generation",
        ));
    }
    let started = std::time::Instant::now();
    // A golden stays on its major: forks of every generation run alike.
    let current = engine.store().golden(name)?.current().cloned();
    let major = current.as_ref().map(|m| m.major()).filter(|m| *m != 0);
    // The Redis part is built again from its own source (the store's, which
    // keeps a URL's password; the manifest's for goldens made before it did).
    let recorded = engine.store().golden_redis_source(name)?;
    let redis = recorded.or_else(|| current.and_then(|m| m.redis).map(|r| r.source));
    // The same rules with the same key: the same source values mask alike.
    let key = match source.shape().is_some_and(|s| s.masks()) {
        true => {
            let hex = engine.store().mask_key(name)?;
            Some(hex.as_deref().and_then(airlock_mask::Key::from_hex).ok_or_else(|| {
                Error::internal(format!(
                    "golden {name:?} is masked, and its masking key is missing from the store"
                ))
            })?)
        }
        false => None,
    };
    let manifest =
        build::build(engine, name, next, &source, false, major, redis.as_ref(), key.as_ref()).await?;
    {
        let mut store = engine.store();
        if let Err(e) = store.add_generation(&manifest) {
            let _ = std::fs::remove_dir_all(engine.layout.golden_generation(name, next));
            return Err(e);
        }
        let recorded = store.record(NewEvent {
            kind: airlock_core::events::EventKind::GoldenRefreshed,
            golden: Some(name.to_owned()),
            detail: json!({"generation": next, "size_bytes": manifest.size_bytes, "build_ms": started.elapsed().as_millis() as u64}),
            ..Default::default()
        });
        if let Err(e) = recorded {
            let _ = store.undo_generation(name, next);
            let _ = std::fs::remove_dir_all(engine.layout.golden_generation(name, next));
            return Err(e);
        }
    }
    prune(engine, name)?;
    // The pool drains the old generation and fills with the new one.
    engine.pool.wanted.notify_one();
    engine.store().golden(name)
}

fn check_pool_size(size: i64, engine: &Engine) -> Result<()> {
    if size < 0 || size as usize > engine.config.max_sandboxes {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            format!("a pool of {size} is out of range"),
            format!("give between 0 and the daemon's --max-sandboxes ({})", engine.config.max_sandboxes),
        ));
    }
    Ok(())
}

/// Sets how many started sandboxes (credentials bound at claim) a golden's warm pool keeps.
pub fn set_pool_size(engine: &Engine, name: &str, size: i64) -> Result<Golden> {
    check_pool_size(size, engine)?;
    if engine.golden_being_removed(name) {
        return Err(Error::new(
            ErrorCode::GoldenNotFound,
            format!("golden {name:?} is being removed"),
            "set the pool of another golden (`airlock golden ls`)",
        ));
    }
    let mut store = engine.store();
    store.set_pool_size(name, size)?;
    engine.pool.wanted.notify_one();
    store.golden(name)
}

/// Turns a running sandbox's state (at one instant) into a golden: a new golden,
/// or a new generation of an existing one. The agent role and its credential are
/// removed; what the agent owned is given to the owner role. Settings and
/// objects that could steer later sessions are refused unless `allow_planted`.
pub async fn promote(engine: &Engine, sandbox: &str, name: &str, allow_planted: bool) -> Result<Golden> {
    validate::name("golden", name)?;
    let sb = engine.store().sandbox(sandbox)?;
    let _guard = engine.reserve_golden(name, GoldenWork::Build)?;
    // The sandbox's operation lock, to the end: no delete, reset, suspend or
    // branch of it runs while its state is saved and copied. Read again under it.
    let _op = engine.sandbox_lock(&sb.id).await;
    let sb = engine.store().sandbox(&sb.id)?;
    if sb.state != crate::sandbox::SandboxState::Running {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            format!("sandbox {} is {}, not running", sb.id, sb.state.as_str()),
            "promote a running sandbox (wake it first if it was suspended meanwhile)",
        ));
    }
    let existing = engine.store().golden(name).ok();
    let generation = existing
        .as_ref()
        .map(|g| g.generations.iter().map(|m| m.generation).max().unwrap_or(0) + 1)
        .unwrap_or(1);
    let source =
        Source::Promoted { sandbox: sb.id.clone(), golden: sb.golden.clone(), generation: sb.generation };
    // A golden's generations are alike: all with a PostgreSQL part or none.
    let forked_from = engine.store().manifest(&sb.golden, sb.generation)?;
    if let Some(current) = existing.as_ref().and_then(|g| g.current()) {
        if current.has_postgres() != forked_from.has_postgres() {
            let (golden_has, sandbox_has) = match current.has_postgres() {
                true => ("a PostgreSQL part", "none"),
                false => ("no PostgreSQL part", "one"),
            };
            return Err(Error::new(
                ErrorCode::InvalidRequest,
                format!("golden {name:?} has {golden_has}, and sandbox {} has {sandbox_has}", sb.id),
                "promote the sandbox into a new golden (`airlock promote ID --golden NEW_NAME`)",
            ));
        }
    }
    let started = std::time::Instant::now();
    // Its Redis, if it has one, saves its data; the next generation's Redis
    // part is that data. Beside a PostgreSQL, the copy of that saves it, at
    // the instant the PostgreSQL is copied; alone, it saves now.
    let dir = engine.layout.sandbox_instance(&sb.id);
    let redis = match airlock_redis::server::configured(&dir) {
        true => {
            if !dir.has_postgres() {
                airlock_redis::server::Admin::connect(&dir).await?.save().await?;
            }
            Some(airlock_core::records::redis::RedisSource::Promoted { sandbox: sb.id.clone() })
        }
        false => None,
    };
    let mut manifest =
        build::build(engine, name, generation, &source, allow_planted, None, redis.as_ref(), None).await?;
    // A fork of a masked golden holds masked data, and so does its promotion:
    // it keeps the record of how (whatever the agent added since is the agent's).
    if let Some(mut record) = forked_from.masking.clone() {
        record.inherited_from.get_or_insert_with(|| format!("{} generation {}", sb.golden, sb.generation));
        manifest.masking = Some(record);
        let json = serde_json::to_vec_pretty(&manifest).expect("manifest serializes");
        let path = engine.layout.golden_generation(name, generation).join("manifest.json");
        if let Err(e) = std::fs::write(&path, json) {
            let _ = std::fs::remove_dir_all(engine.layout.golden_generation(name, generation));
            return Err(e.into());
        }
    }
    {
        let mut store = engine.store();
        let stored = match existing {
            Some(_) => store.add_generation(&manifest),
            None => store.insert_golden(&manifest, &source),
        };
        if let Err(e) = stored {
            let _ = std::fs::remove_dir_all(engine.layout.golden_generation(name, generation));
            return Err(e);
        }
        let recorded = store.record(NewEvent {
            kind: airlock_core::events::EventKind::GoldenPromoted,
            golden: Some(name.to_owned()),
            sandbox: Some(sb.id.clone()),
            detail: json!({"generation": generation, "size_bytes": manifest.size_bytes, "build_ms": started.elapsed().as_millis() as u64, "planted_kept": manifest.planted}),
            ..Default::default()
        });
        if let Err(e) = recorded {
            // No promotion without its record: the golden is as it was.
            let _ = match existing {
                Some(_) => store.undo_generation(name, generation),
                None => store.delete_golden(name),
            };
            let _ = std::fs::remove_dir_all(engine.layout.golden_generation(name, generation));
            return Err(e);
        }
    }
    prune(engine, name)?;
    engine.pool.wanted.notify_one();
    engine.store().golden(name)
}

/// Deletes the generations of `name` that are neither current nor used by a sandbox.
pub fn prune(engine: &Engine, name: &str) -> Result<()> {
    let mut store = engine.store();
    let Ok(golden) = store.golden(name) else { return Ok(()) };
    let in_use = store.generations_in_use(name)?;
    for m in &golden.generations {
        if m.generation == golden.current_generation || in_use.contains(&m.generation) {
            continue;
        }
        let dir = engine.layout.golden_generation(name, m.generation);
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                return Err(e.into());
            }
        }
        store.delete_generation(name, m.generation)?;
        store.record_or_log(NewEvent {
            kind: airlock_core::events::EventKind::GenerationPruned,
            golden: Some(name.to_owned()),
            detail: json!({"generation": m.generation}),
            ..Default::default()
        });
    }
    Ok(())
}

/// A build that failed because its writes met the volume's spare room (its
/// promise) or a full disk is `disk_full`, whatever step said so (its error,
/// its server's log, or its promise spent: a server that could not write its
/// WAL is gone before it can tell its client): the operator frees room and builds again.
fn disk_full_if_so(e: Error, server_log: &str, spent: bool) -> Error {
    let said = |text: &str| airlock_core::error::DISK_FULL_WORDS.iter().any(|w| text.contains(w));
    let said = spent || said(&e.message) || said(server_log) || e.message.contains("53100");
    if e.code == ErrorCode::DiskFull || !said {
        return e;
    }
    Error::new(
        ErrorCode::DiskFull,
        format!("the build ran out of room on the volume: {}", e.message),
        "delete or suspend sandboxes you no longer need, or give the volume more space, and build again",
    )
}
