//! Building one golden generation: initdb, load the source as the owner role,
//! freeze, shut down cleanly, write the manifest, then move it into place.
//!
//! The build happens in `volume/staging/`; only a finished, cleanly shut down
//! generation is renamed into `goldens/`. A failure removes the staging
//! directory, so nothing half-made is ever visible.

use std::path::Path;

use crate::engine::Engine;
use crate::golden::import::Restore;
use crate::golden::{dump, fidelity, Manifest, Source};
use airlock_core::clock::Timestamp;
use airlock_core::dsn::{ADMIN_ROLE, AGENT_ROLE, DATABASE, OWNER_ROLE};
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::layout::InstanceDir;
use airlock_core::secret;
use airlock_host::storage;
use airlock_host::users::Identity;
use airlock_postgres::admin::Admin;
use airlock_postgres::cell::Cell;
use airlock_postgres::loader::Loader;
use airlock_postgres::majors::Server;
use airlock_postgres::{instance, load, PgBin};

/// Builds generation `generation` of golden `name` from `source` and moves it into
/// place. A promoted sandbox carrying planted settings or objects
/// ([`airlock_postgres::catalog::planted`]) is refused unless `allow_planted`.
pub async fn build(
    engine: &Engine,
    name: &str,
    generation: i64,
    source: &Source,
    allow_planted: bool,
    asked: Option<u32>,
    redis: Option<&airlock_core::records::redis::RedisSource>,
    key: Option<&airlock_mask::Key>,
) -> Result<Manifest> {
    let postgres = match has_postgres(engine, source)? {
        true => Some(Postgres::choose(engine, source, asked).await?),
        false if redis.is_none() => {
            return Err(Error::internal("a golden without a PostgreSQL part is built with a Redis part"))
        }
        false => None,
    };
    let tag = secret::sandbox_id();
    let root = engine.layout.staging().join(format!("{name}-{generation}-{tag}"));
    let work = engine.layout.staging().join(format!("{name}-{generation}-{tag}.work"));
    let dir = InstanceDir { root: root.clone() };
    // The build writes on the sandboxes' volume: it is held to a promise
    // like theirs, so it cannot take a neighbour's headroom.
    let promise = engine.headroom.build(engine, &root)?;
    let builder = match Builder::new(engine, source, &tag) {
        Ok(b) => b,
        Err(e) => {
            let _ = engine.cloner.remove_tree(&root);
            return Err(e);
        }
    };
    let mut result = match &postgres {
        Some(postgres) => {
            build_in(engine, postgres, &builder, &dir, &work, (name, generation), source, allow_planted, key)
                .await
        }
        None => without_postgres(&dir, (name, generation), source, &builder.user),
    };
    if let (Ok(manifest), Some(redis)) = (&mut result, redis) {
        engine.builds.update(name, |p| p.phase = "building the Redis part".into());
        let max_memory = airlock_redis::server::max_memory(engine.config.cgroup_limits.memory_bytes);
        // A promotion's Redis part is the sandbox's own saved data, opened
        // never through a link (the directory is the sandbox's).
        let promoted = match redis {
            airlock_core::records::redis::RedisSource::Promoted { sandbox } => {
                let rdb = airlock_redis::server::rdb(&engine.layout.sandbox(sandbox));
                storage::tree::open_read(&rdb).map(Some).map_err(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => Error::new(
                        ErrorCode::SandboxNotFound,
                        format!("sandbox {sandbox}'s Redis data is gone: the sandbox was deleted or reset meanwhile"),
                        "promote it again once it is running",
                    ),
                    _ => Error::io("reading the sandbox's Redis data", &e),
                })
            }
            _ => Ok(None),
        };
        let who = (&builder.user, &builder.cgroups[..]);
        // Whatever fails here, the build is finished below: its identity is
        // given back and its files removed.
        // A masked golden's Redis part is masked with the same key.
        let masking = match (source.shape().and_then(|s| s.mask.as_ref()), key) {
            (Some(rules), Some(key)) if !rules.redis.is_empty() => {
                crate::golden::shape::redis::RedisMasking::compile(&rules.redis, key.clone()).map(Some)
            }
            _ => Ok(None),
        };
        let built = match (promoted, masking) {
            (Ok(promoted), Ok(masking)) => {
                let masking = masking.as_ref().map(|m| m as &dyn airlock_redis::masking::ValueMask);
                airlock_redis::golden::build(&dir, redis, promoted, who, max_memory, masking).await
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
        match built {
            Ok(part) => {
                if postgres.is_none() {
                    manifest.size_bytes = part.rdb_bytes;
                }
                if !part.masked.is_empty() {
                    let record = manifest.masking.get_or_insert_with(Default::default);
                    record.redis = part.masked.clone();
                    record.leak_check_passed = true;
                }
                manifest.redis = Some(part);
                let json = serde_json::to_vec_pretty(&*manifest).expect("manifest serializes");
                if let Err(e) = std::fs::write(dir.root.join("manifest.json"), json) {
                    result = Err(e.into());
                }
            }
            Err(e) => result = Err(e),
        }
    }
    builder.finish(engine).await;
    engine.builds.end(name);
    let _ = std::fs::remove_dir_all(&work);
    if result.is_ok() {
        // The kept dump is for resuming a failed build; this one succeeded.
        let _ = std::fs::remove_dir_all(engine.layout.imports().join(name));
    }
    let manifest = match result {
        Ok(m) => m,
        Err(e) => {
            let log = storage::tree::read_tail(&dir.log(), 16 << 10).unwrap_or_default();
            let spent = promise.spent();
            let _ = engine.cloner.remove_tree(&root);
            return Err(super::disk_full_if_so(e, &log, spent));
        }
    };
    // A golden is never limited: its forks' writes are theirs.
    drop(promise);
    let target = engine.layout.golden_generation(name, generation);
    let placed = (|| -> std::io::Result<()> {
        if engine.daemon_user.is_root() {
            // Goldens belong to the daemon, so no instance user can change them.
            storage::tree::chown_tree(&root, &engine.daemon_user)?;
            // Its template1 is read by its forks' servers (bound read-only
            // into their view), which copy it at their first CREATE DATABASE.
            let template = root.join("pgdata").join(crate::sandbox::stores::TEMPLATE1);
            if template.is_dir() {
                storage::tree::readable_by_all(&template)?;
            }
        }
        // Its files' hashes, which a copy on another node is checked against.
        super::inventory::write_inventory(&root)?;
        std::fs::create_dir_all(target.parent().expect("generation has a parent"))?;
        std::fs::rename(&root, &target)
    })();
    if let Err(e) = placed {
        let _ = engine.cloner.remove_tree(&root);
        return Err(e.into());
    }
    Ok(manifest)
}

/// Whether a build from `source` has a PostgreSQL part: all but a Redis-only
/// golden, and a promotion of a sandbox forked from one.
fn has_postgres(engine: &Engine, source: &Source) -> Result<bool> {
    match source {
        Source::RedisOnly => Ok(false),
        Source::Promoted { golden, generation, .. } => {
            Ok(engine.store().manifest(golden, *generation)?.has_postgres())
        }
        _ => Ok(true),
    }
}

/// Starts a generation with no PostgreSQL part: its directory, and a manifest
/// that records no server (the Redis part is added to it next).
fn without_postgres(
    dir: &InstanceDir,
    (name, generation): (&str, i64),
    source: &Source,
    user: &Identity,
) -> Result<Manifest> {
    instance::prepare_dir(dir, user, None)?;
    Ok(Manifest {
        name: name.to_owned(),
        generation,
        postgres_version: String::new(),
        postgres_major: 0,
        size_bytes: 0,
        schema_hash: String::new(),
        created_at: Timestamp::now(),
        source: source.redacted(),
        planted: Vec::new(),
        import: None,
        redis: None,
        masking: None,
    })
}

/// The PostgreSQL a build runs on, and the client tools it loads, dumps and restores with.
struct Postgres<'a> {
    server: &'a Server,
    clients: &'a PgBin,
    /// A live source's major, when the build copies one.
    source_major: Option<u32>,
}

impl<'a> Postgres<'a> {
    /// The major asked for; else a promoted sandbox's, a live source's or a
    /// dump's own; else the default. Client tools as new as both the server
    /// and the source (pg_dump refuses newer servers).
    async fn choose(engine: &'a Engine, source: &Source, asked: Option<u32>) -> Result<Postgres<'a>> {
        let majors = &engine.postgres;
        let newest = majors.clients_for(0)?;
        let (found, source_major) = match source {
            Source::Promoted { golden, generation, .. } => {
                (Some(engine.store().manifest(golden, *generation)?.major()), None)
            }
            Source::Url { dsn, .. } => {
                let major = crate::golden::source::major(dsn).await?;
                (Some(major), Some(major))
            }
            Source::Dump { path, .. } => {
                let scratch = engine.layout.staging().join(format!(
                    ".toc-{}",
                    airlock_core::secret::hex(&airlock_core::secret::random_bytes::<8>())
                ));
                (load::dump_major(newest, path, &scratch).await, None)
            }
            Source::Files { .. } | Source::RedisOnly => (None, None),
        };
        if let (Source::Promoted { .. }, Some(want), Some(have)) = (source, asked, found) {
            if want != have {
                return Err(Error::new(
                    ErrorCode::InvalidRequest,
                    format!("the sandbox runs PostgreSQL {have}; a promotion keeps its major, not {want}"),
                    "promote without --postgres",
                ));
            }
        }
        let server = match asked.or(found) {
            Some(major) => majors.server(major)?,
            None => majors.default_server(),
        };
        let clients = match source {
            // An archive is read only by a pg_restore as new as the pg_dump that wrote it.
            Source::Dump { .. } => newest,
            _ => majors.clients_for(server.major.max(source_major.unwrap_or(0)))?,
        };
        Ok(Postgres { server, clients, source_major })
    }
}

/// Who a build runs as. A promotion builds from a sandbox's data, so it runs
/// as an identity of its own, leased like a sandbox's, in cgroups of its own
/// whose every process is killed when the build ends: nothing it might start
/// can outlive it, or reach another build. Other sources are the operator's
/// own and run as the instance user (initdb needs a user with a name).
struct Builder {
    user: Identity,
    /// The build's cgroup name and the lease's holder name, for a promotion.
    contained: Option<String>,
    cgroups: Vec<std::ffi::CString>,
}

impl Builder {
    fn new(engine: &Engine, source: &Source, tag: &str) -> Result<Builder> {
        let (Source::Promoted { .. }, Some(leases)) = (source, &engine.leases) else {
            return Ok(Builder { user: engine.instance_user.clone(), contained: None, cgroups: vec![] });
        };
        let holder = format!("build-{tag}");
        let user = Identity::leased(leases.take(&holder)?);
        let cgroups = engine.cgroups.create(&holder, &engine.config.cgroup_limits).map_err(|e| {
            leases.release(user.uid.as_raw(), &holder);
            Error::io("making the build's cgroups", &e)
        })?;
        Ok(Builder { user, contained: Some(holder), cgroups })
    }

    /// Kills whatever the build left running and gives its identity back.
    async fn finish(self, engine: &Engine) {
        if let (Some(holder), Some(leases)) = (self.contained, &engine.leases) {
            crate::sandbox::kill_cgroup_members(engine, &holder).await;
            leases.release(self.user.uid.as_raw(), &holder);
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn build_in(
    engine: &Engine,
    postgres: &Postgres<'_>,
    builder: &Builder,
    dir: &InstanceDir,
    work: &Path,
    (name, generation): (&str, i64),
    source: &Source,
    allow_planted: bool,
    key: Option<&airlock_mask::Key>,
) -> Result<Manifest> {
    let user = &builder.user;
    // The loader user reaches the server's socket to load the build's input.
    let loader_group = engine.loader_user.as_ref().map(|u| u.gid);
    instance::prepare_dir(dir, user, loader_group)?;
    airlock_host::storage::tree::private_dir(work)?;
    match source {
        Source::Promoted { sandbox, .. } => clone_live(engine, sandbox, dir, user).await?,
        _ => {
            // initdb (as the instance user) fills an empty directory it owns.
            airlock_host::storage::tree::private_dir(&dir.pgdata())?;
            user.own(&dir.pgdata())?;
            let bin = &postgres.server.bin;
            instance::initdb(bin, &dir.pgdata(), &engine.daemon_user, &engine.instance_user).await?
        }
    }
    let loaders = match &engine.loader_user {
        Some(loader) => vec![loader.name.as_str()],
        None => vec![engine.daemon_user.name.as_str()],
    };
    instance::write_access_files(
        dir,
        &instance::Peers { admin: &engine.admin_os_users(), owner: &loaders, ..Default::default() },
    )?;

    // The build is the operator's own act on trusted input: no guard, so a
    // schema may set database defaults while its owner role still owns it.
    let mut started = instance::start(
        &postgres.server.bin,
        dir,
        user,
        loader_group,
        &builder.cgroups,
        None,
        None,
        None,
        None,
    )?;
    if let Err(e) = started.wait_ready(dir).await {
        let _ = instance::kill(started.pid, &dir.pgdata()).await;
        return Err(e);
    }
    let loaded =
        load_and_describe(engine, postgres, dir, started.pid, work, name, source, allow_planted, key).await;
    let (postgres_version, schema_hash, planted, import) = match loaded {
        Ok(v) => v,
        Err(e) => {
            let _ = instance::kill(started.pid, &dir.pgdata()).await;
            return Err(e);
        }
    };
    // After the golden is described, so nothing read of it sees the role.
    if let Err(e) = premake_agent(dir, started.pid).await {
        let _ = instance::kill(started.pid, &dir.pgdata()).await;
        return Err(e);
    }
    started.stop_clean(dir).await?;
    let masked = source.shape().is_some_and(|s| s.masks());
    if masked {
        // The write-ahead log holds every row version the build wrote, the
        // source's values among them: only an empty one is sealed.
        instance::reset_wal(&postgres.server.bin, &dir.pgdata(), &engine.daemon_user, user).await?;
    }
    for leftover in [dir.log(), dir.hba_file(), dir.ident_file()] {
        let _ = std::fs::remove_file(leftover);
    }
    let _ = std::fs::remove_dir_all(dir.socket_dir());
    // A golden must survive a host crash: flush it before anyone forks it.
    if let Ok(f) = std::fs::File::open(dir.pgdata()) {
        let _ = nix::unistd::syncfs(&f);
    }
    let manifest = Manifest {
        name: name.to_owned(),
        generation,
        postgres_version,
        postgres_major: postgres.server.major,
        size_bytes: storage::tree_size(&dir.pgdata()),
        schema_hash,
        created_at: Timestamp::now(),
        source: source.redacted(),
        masking: import.as_ref().and_then(masking_record),
        planted,
        import,
        redis: None,
    };
    let json = serde_json::to_vec_pretty(&manifest).expect("manifest serializes");
    std::fs::write(dir.root.join("manifest.json"), json)?;
    Ok(manifest)
}

/// Makes the agent role for the default access in the golden, and notes the
/// statements beside it, so that a fork that asks for that access starts with
/// its role made. It holds no credential: the agent logs in by peer, from the
/// fork's own OS users, which only the fork's access files name.
async fn premake_agent(dir: &InstanceDir, postmaster: i32) -> Result<()> {
    let access = airlock_core::records::access::Access::default();
    Admin::connect(dir, DATABASE, postmaster).await?.make_agent(&access).await?;
    airlock_host::storage::tree::write_private(
        &dir.agent_role_file(),
        access.create_role_sql().as_bytes(),
        0o644,
    )?;
    Ok(())
}

/// What a masked or subsetted build's manifest says of it.
fn masking_record(
    report: &airlock_postgres::imported::Report,
) -> Option<airlock_core::records::masking::MaskingRecord> {
    if report.masking.is_none() && report.subset.is_none() {
        return None;
    }
    Some(airlock_core::records::masking::MaskingRecord {
        columns: report
            .masking
            .iter()
            .flat_map(|m| &m.columns)
            .map(|c| format!("{}: {}", c.column, c.transform))
            .collect(),
        leak_check_passed: report.masking.as_ref().is_some_and(|m| m.passed),
        subset: report.subset.as_ref().map(|s| {
            format!("{}{}", s.roots.join("; "), s.percent.map_or(String::new(), |p| format!(", {p}%")))
        }),
        redis: Vec::new(),
        inherited_from: None,
    })
}

/// Clones a running sandbox's data directory at one instant (its server paused
/// meanwhile); the build instance then starts from it with crash recovery.
async fn clone_live(engine: &Engine, sandbox: &str, dir: &InstanceDir, builder: &Identity) -> Result<()> {
    let sb = engine.store().sandbox(sandbox)?;
    let pid = sb.pid.filter(|_| sb.state == crate::sandbox::SandboxState::Running).ok_or_else(|| {
        Error::new(
            ErrorCode::InvalidRequest,
            format!("sandbox {} is not running", sb.id),
            "promote a running sandbox",
        )
    })?;
    let source = engine.layout.sandbox(&sb.id).join("pgdata");
    let source_user = engine.sandbox_user(&sb)?;
    let config = engine.layout.golden_generation(&sb.golden, sb.generation).join("pgdata");
    // Each store readies itself for a frozen copy (PostgreSQL checkpoints; a
    // Redis saves its state, which the build takes as its own, and takes no
    // write until the copy is made), so all are of one instant.
    let source_dir = engine.layout.sandbox_instance(&sb.id);
    let at = crate::sandbox::stores::At { engine, sb: &sb, dir: &source_dir };
    let held = crate::sandbox::stores::prepare_copy_all(&crate::sandbox::stores::of_sandbox(&source_dir), at)
        .await?;
    // Off the async workers, as a branch's copy (the agent decides its size).
    let cloned = tokio::task::block_in_place(|| {
        crate::sandbox::branch::Frozen::new(engine, &sb.id, pid).and_then(|_frozen| {
            engine
                .cloner
                .clone_data(&source, &config, &dir.pgdata(), Some(builder), Some(source_user.uid))
                .map_err(|e| Error::io(format!("cloning {}", source.display()), &e))
        })
    });
    crate::sandbox::stores::resume_all(held).await;
    cloned?;
    // A sandbox that never created a database never copied its golden's
    // template1: the new golden takes it from there.
    let template1 = crate::sandbox::stores::TEMPLATE1;
    let (golden, staged) = (config.join(template1), dir.pgdata().join(template1));
    if golden.join("PG_VERSION").is_file() && !staged.join("PG_VERSION").exists() {
        let _ = std::fs::remove_dir(&staged);
        engine
            .cloner
            .clone_tree(&golden, &staged, Some(builder), Some(engine.daemon_user.uid))
            .map_err(|e| Error::io(format!("cloning {}", golden.display()), &e))?;
    }
    Ok(())
}

/// What a build learned: the server version, the schema hash, the planted
/// things a promotion kept, and an import's fidelity report.
type Described = (
    String,
    String,
    Vec<airlock_postgres::catalog::planted::Planted>,
    Option<airlock_postgres::imported::Report>,
);

/// Creates the owner role and app database, loads the source (or, for a
/// promoted sandbox, removes its agent role and checks for planted settings and
/// objects), freezes and checkpoints.
#[allow(clippy::too_many_arguments)]
async fn load_and_describe(
    engine: &Engine,
    postgres: &Postgres<'_>,
    dir: &InstanceDir,
    postmaster: i32,
    work: &Path,
    name: &str,
    source: &Source,
    allow_planted: bool,
    key: Option<&airlock_mask::Key>,
) -> Result<Described> {
    if let Source::Promoted { sandbox, .. } = source {
        // No credential may live in a golden: what the agent owned goes to the
        // owner role, in every database it created too (which the golden
        // keeps), and the agent role goes.
        let admin = Admin::connect(dir, DATABASE, postmaster).await?;
        let kept = admin
            .client()
            .query(
                "SELECT datname FROM pg_catalog.pg_database
                  WHERE datallowconn AND NOT datistemplate AND datname <> $1",
                &[&DATABASE],
            )
            .await
            .map_err(|e| Error::postgres(airlock_postgres::admin::describe(&e)))?;
        let give_away =
            format!("REASSIGN OWNED BY {AGENT_ROLE} TO {OWNER_ROLE}; DROP OWNED BY {AGENT_ROLE};");
        let mut created = Vec::new();
        for row in &kept {
            let database: String = row.cell(0)?;
            Admin::connect(dir, &database, postmaster).await?.execute(&give_away).await?;
            created.push(database);
        }
        admin.execute(&format!("{give_away} DROP ROLE {AGENT_ROLE};")).await?;
        drop(admin);
        // The build's own work (VACUUM, ANALYZE) runs the agent's index
        // expressions, as the owner role: look for planted objects after it.
        let (version, hash) = describe(postgres, dir, postmaster, engine.loader_user.as_ref(), true).await?;
        // Whatever the agent left that could steer later sessions (the daemon's
        // admin sessions pin their own settings, but every fork's agent would
        // inherit it) is refused unless the caller says to keep it.
        let admin = Admin::connect(dir, DATABASE, postmaster).await?;
        let mut planted = airlock_postgres::catalog::planted::read(admin.client()).await?;
        // In every database the golden keeps (the stored settings are the
        // cluster's, read once).
        for database in &created {
            let there = Admin::connect(dir, database, postmaster).await?;
            let found = airlock_postgres::catalog::planted::read(there.client()).await?;
            planted.extend(found.into_iter().filter(|p| p.kind != "setting").map(|p| {
                airlock_postgres::catalog::planted::Planted {
                    what: format!("(database {database}) {}", p.what),
                    ..p
                }
            }));
        }
        if !planted.is_empty() && !allow_planted {
            return Err(Error::new(
                ErrorCode::PromotionRefused,
                format!(
                    "sandbox {sandbox} carries settings or objects named like PostgreSQL's own, which every fork of the golden would inherit: {}",
                    airlock_postgres::catalog::planted::list(&planted, 20)
                ),
                "remove them from the sandbox (RESET the settings, DROP or rename the objects) and promote again, \
                 or pass --allow-planted to keep them",
            ));
        }
        return Ok((version, hash, planted, None));
    }
    let admin = Admin::connect(dir, "postgres", postmaster).await?;
    // Each its own statement: CREATE DATABASE and VACUUM refuse multi-statement strings.
    admin
        .execute(&format!(
            "CREATE ROLE {OWNER_ROLE} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"
        ))
        .await?;
    admin.execute(&format!("CREATE DATABASE {DATABASE} OWNER {OWNER_ROLE}")).await?;
    drop(admin);
    let asked = match source {
        Source::Url { jobs, .. } | Source::Dump { jobs, .. } => *jobs,
        _ => None,
    };
    let jobs =
        asked.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 4));
    let installed_build =
        (postgres.server.origin == "installed").then(|| engine.postgres.default_server().major);
    let shaping = source.shape().map(|shape| crate::golden::shape::Shaping { shape, key });
    let masked = source.shape().is_some_and(|s| s.masks());
    let restore = |loader, named| Restore {
        loader,
        named,
        major: postgres.server.major,
        installed_build,
        allowed: source.allowed_extensions(),
        dir,
        postmaster,
        jobs,
        progress: (&engine.builds, name),
        shaping: shaping.as_ref(),
        owner_os_user: engine.loader_user.as_ref(),
    };
    let loader_user = engine.loader_user.as_ref();
    // Tools `airlock postgres install` added keep their libraries beside them
    // in its tree; the system's are in /usr, or in the tree above their bin/.
    let clients = postgres.clients.dir();
    let tree = match clients.starts_with(&engine.config.pg_root) {
        true => engine.config.pg_root.clone(),
        false => clients.parent().unwrap_or(clients).to_path_buf(),
    };
    let loader =
        |archive: Option<&Path>| Loader::new((postgres.clients, &tree), dir, work, loader_user, archive);
    // What the fidelity report is made of, once the golden's catalog is read.
    let mut pending = None;
    match source {
        Source::Files { schema, seed } => {
            let loader = loader(None)?;
            for file in schema.iter().chain(seed) {
                load::run_sql_file(&loader, file, ErrorCode::SeedFailed).await?;
            }
        }
        Source::Url { dsn, exclude, .. } => {
            // A dump kept for resuming holds the source's values: a masked
            // build keeps it in its work area, removed whatever happens.
            let keep = match masked {
                true => work.join("source"),
                false => engine.layout.imports().join(name),
            };
            let dumped =
                dump::dump(postgres.clients, dsn, exclude, &keep, jobs, (&engine.builds, name)).await?;
            let began = std::time::Instant::now();
            let loader = loader(Some(&dumped.archive))?;
            let named = dumped.archive.display().to_string();
            let (imported, shaped) =
                restore(&loader, &named).run(&dumped.archive, Some(&dumped.facts)).await?;
            pending = Some((Some((dumped, exclude)), imported, shaped, began.elapsed().as_secs_f64()));
        }
        Source::Dump { path, .. } => {
            load::check_readable(path)?;
            if load::is_archive(path)? {
                let began = std::time::Instant::now();
                let staged = if path.is_dir() {
                    if loader_user.is_none() {
                        return Err(Error::new(
                            ErrorCode::InvalidRequest,
                            format!("{} is a directory-format dump, which is read only in a jail", path.display()),
                            "its table of contents names the files pg_restore opens, so only a daemon running \
                             as root (which jails pg_restore) reads one: run the daemon as root, or take the dump \
                             with --format=custom",
                        ));
                    }
                    airlock_postgres::loader::stage_dir(path, &work.join("dump"))?
                } else {
                    airlock_postgres::loader::stage_file(path, &work.join("dump"))?
                };
                let loader = loader(Some(&staged))?;
                let named = path.display().to_string();
                let (imported, shaped) = restore(&loader, &named).run(&staged, None).await?;
                pending = Some((None, imported, shaped, began.elapsed().as_secs_f64()));
            } else if source.shape().is_some() {
                return Err(Error::new(
                    ErrorCode::InvalidRequest,
                    format!("{} is a plain SQL dump, which a build cannot mask or cut", path.display()),
                    "take the dump with pg_dump --format=custom (or directory), or build with --from-url",
                ));
            } else {
                load::run_sql_file(&loader(None)?, path, ErrorCode::SourceFailed).await?;
            }
        }
        Source::Promoted { .. } | Source::RedisOnly => unreachable!("has no PostgreSQL input"),
    }
    let admin = Admin::connect(dir, DATABASE, postmaster).await?;
    if pending.is_none() {
        // Files and plain dumps: the archive restore runs this check itself.
        crate::golden::import::check_nothing_runs_as_a_superuser(&admin, &[]).await?;
    }
    check_no_stored_settings(&admin, source).await?;
    drop(admin);
    engine.builds.update(name, |p| p.phase = "freezing and describing".into());
    let (version, hash) = describe(postgres, dir, postmaster, engine.loader_user.as_ref(), false).await?;
    if masked {
        // Statistics taken before masking (an autovacuum's ANALYZE of the
        // restored data) may linger as dead rows of the statistics tables.
        let admin = Admin::connect(dir, DATABASE, postmaster).await?;
        crate::golden::shape::scrub_statistics(&admin).await?;
        admin.execute("CHECKPOINT").await?;
    }
    let Some((dumped, imported, shaped, restore_seconds)) = pending else {
        return Ok((version, hash, Vec::new(), None));
    };
    let golden = airlock_postgres::catalog::Snapshot::load(&dir.root)?;
    let mut report = match &dumped {
        Some((d, exclude)) => fidelity::compare(&d.facts, &golden, &imported, exclude),
        None => fidelity::of_dump(&golden, &imported),
    };
    report.restore_seconds = restore_seconds;
    report.jobs = jobs;
    if shaped.subset.is_some() {
        // A subset keeps fewer rows on purpose: its report says how many, and why.
        report.row_differences.clear();
    }
    report.masking = shaped.masking;
    report.subset = shaped.subset;
    if let Some((d, _)) = &dumped {
        let (source_major, golden_major) = (postgres.source_major.unwrap_or(0), postgres.server.major);
        if source_major != golden_major {
            report.major_note = Some(format!(
                "the source runs PostgreSQL {}, this golden {version}: forks, and migrations tested on them, run on {golden_major}",
                d.facts.server_version
            ));
        }
        report.resumed = d.resumed;
        report.dump_seconds = d.seconds;
        report.bytes = d.bytes;
    }
    if report.differs() {
        return Err(Error::new(
            ErrorCode::FidelityFailed,
            format!("the golden would differ from its source: {}", report.differences(12)),
            "if the source changed its schema while it was dumped, build again; to leave tables or schemas out \
             on purpose, pass --exclude-table or --exclude-schema",
        ));
    }
    Ok((version, hash, Vec::new(), Some(report)))
}

/// Fails when what was loaded stored settings for the database or a role
/// (`ALTER DATABASE ... SET`, `ALTER ROLE ... SET`): they would apply to every
/// session of every fork, Airlock's own admin sessions included (`role` would
/// run them as another role, `standard_conforming_strings` change how their
/// SQL reads). pg_dump never writes them without `--create`, so only a file's
/// text can; sandboxes cannot make them at all (the in-server guard).
async fn check_no_stored_settings(admin: &Admin, source: &Source) -> Result<()> {
    let stored: Vec<_> = airlock_postgres::catalog::planted::read(admin.client())
        .await?
        .into_iter()
        .filter(|p| p.kind == "setting")
        .collect();
    if stored.is_empty() {
        return Ok(());
    }
    let code = match source {
        Source::Files { .. } => ErrorCode::SeedFailed,
        _ => ErrorCode::SourceFailed,
    };
    Err(Error::new(
        code,
        format!(
            "the build stored settings that every session of every fork would start with: {}",
            airlock_postgres::catalog::planted::list(&stored, 20)
        ),
        "remove the ALTER DATABASE ... SET and ALTER ROLE ... SET statements; set what the application needs \
         per session or in its connection string",
    ))
}

/// Freezes, analyses and checkpoints the application database, drops the
/// default database (unless `promoted`: there a database of that name is one
/// the agent made, kept like any other); returns the server version and
/// schema hash.
async fn describe(
    postgres: &Postgres<'_>,
    dir: &InstanceDir,
    postmaster: i32,
    owner_os_user: Option<&Identity>,
    promoted: bool,
) -> Result<(String, String)> {
    let admin = Admin::connect(dir, DATABASE, postmaster).await?;
    // Nothing connects to the default database, and its three hundred files
    // would be cloned, and later unlinked, at every fork.
    if !promoted {
        admin.execute("DROP DATABASE IF EXISTS postgres").await?;
    }
    // Frozen, analysed tuples mean forks never rewrite pages just to set hint
    // bits, so their blocks stay shared with the golden. VACUUM and ANALYZE
    // run the application's index expressions and statistics, which are the
    // agent's in a promoted sandbox: the owner role runs them, logged in as
    // itself, never a superuser's session; so does the schema hash's pg_dump.
    // (A promoted sandbox's owner role is NOLOGIN: it may log in meanwhile.)
    admin.execute(&format!("ALTER ROLE {OWNER_ROLE} LOGIN")).await?;
    let owned = async {
        let owner = Admin::connect_owner(dir, DATABASE, postmaster, owner_os_user).await?;
        // What it does not own is skipped, with a warning.
        owner.execute("VACUUM (FREEZE, ANALYZE)").await?;
        drop(owner);
        load::schema_hash(postgres.clients, dir, owner_os_user).await
    }
    .await;
    // Whatever happened, the owner role logs in no more (below, again).
    if let Err(e) = owned {
        let _ = admin.execute(&format!("ALTER ROLE {OWNER_ROLE} NOLOGIN")).await;
        return Err(e);
    }
    let hash = owned?;
    // The owner role (and so the agent) owns the application's objects but not
    // the database: a database's owner could change its settings and options,
    // which would outlive any session. The owner role keeps what it needs to
    // build the application: CREATE and TEMPORARY on the database, and the
    // public schema, which belonged to the database's owner.
    admin
        .execute(&format!(
            "ALTER ROLE {OWNER_ROLE} NOLOGIN;
             ALTER DATABASE {DATABASE} OWNER TO {ADMIN_ROLE};
             GRANT CONNECT, CREATE, TEMPORARY ON DATABASE {DATABASE} TO {OWNER_ROLE};
             DO $$ BEGIN
               IF EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = 'public'
                          AND (nspowner = pg_catalog.to_regrole('pg_database_owner')
                               OR nspowner = '{ADMIN_ROLE}'::pg_catalog.regrole)) THEN
                 ALTER SCHEMA public OWNER TO {OWNER_ROLE};
               END IF;
             END $$;"
        ))
        .await?;
    // The rest is a superuser's (PostgreSQL's catalogs, extensions' tables),
    // which no agent code can be part of: frozen by the admin, one by one.
    let superusers = admin
        .client()
        .query(
            "SELECT c.oid::pg_catalog.regclass::text FROM pg_catalog.pg_class c
               JOIN pg_catalog.pg_roles r ON r.oid = c.relowner
              WHERE r.rolsuper AND c.relkind IN ('r', 'm')",
            &[],
        )
        .await
        .map_err(|e| Error::postgres(airlock_postgres::admin::describe(&e)))?;
    for relation in superusers {
        let relation: String = relation.cell(0)?;
        admin.execute(&format!("VACUUM (FREEZE, ANALYZE) {relation}")).await?;
    }
    // What the golden holds, kept so forks can be compared with it later.
    let catalog = airlock_postgres::catalog::read(admin.client()).await?;
    let unbounded = std::time::Duration::from_secs(24 * 3600);
    let rows =
        airlock_postgres::catalog::count_rows(dir, postmaster, DATABASE, &catalog, unbounded, unbounded)
            .await;
    let mut snapshot = airlock_postgres::catalog::Snapshot { catalog, rows, ..Default::default() };
    // Forks then count rows inserted, updated and deleted from zero, in
    // each database (a promoted sandbox's agent may have made more).
    admin.execute("SELECT pg_catalog.pg_stat_reset()").await?;
    for name in airlock_postgres::catalog::databases(admin.client()).await? {
        if name == DATABASE {
            continue;
        }
        let other = Admin::connect(dir, &name, postmaster).await?;
        let catalog = airlock_postgres::catalog::read(other.client()).await?;
        let rows =
            airlock_postgres::catalog::count_rows(dir, postmaster, &name, &catalog, unbounded, unbounded)
                .await;
        other.execute("SELECT pg_catalog.pg_stat_reset()").await?;
        snapshot
            .databases
            .insert(name, airlock_postgres::catalog::Snapshot { catalog, rows, ..Default::default() });
    }
    snapshot.save(&dir.root)?;
    admin.execute("CHECKPOINT").await?;
    let version = admin.value("SHOW server_version").await?;
    // Nor to template0, which goes the same way. template1 stays, closed to
    // connections (so no one changes it, and autovacuum leaves it be): it is
    // what an owner's CREATE DATABASE copies.
    let present = |name: &'static str| {
        let admin = &admin;
        async move {
            let sql = format!("SELECT count(*)::text FROM pg_catalog.pg_database WHERE datname = '{name}'");
            admin.value(&sql).await.map(|n| n != "0")
        }
    };
    if present("template0").await? {
        admin.execute("ALTER DATABASE template0 IS_TEMPLATE false").await?;
        admin.execute("DROP DATABASE template0").await?;
    }
    // (A golden promoted from a fork of one built before it kept template1 has none.)
    if present("template1").await? {
        admin.execute("ALTER DATABASE template1 ALLOW_CONNECTIONS false").await?;
    }
    drop(admin);
    Ok((version, hash))
}
