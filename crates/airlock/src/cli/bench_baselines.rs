//! The baselines `airlock bench fork` times in turn with its own forks, one
//! round of each after each fork, so a load that comes and goes weighs on
//! both alike. Each is another way to get a fresh copy of the same data: a
//! scratch server with the sandboxes' settings, loaded from a dump of the
//! golden taken with the agent's own credential.
//!
//! - `template`: `CREATE DATABASE ... TEMPLATE` of a database holding the golden;
//! - `pg_restore`: a new database, then `pg_restore` of the dump;
//! - `initdb_seed`: initdb, start, then `pg_restore` of the dump;
//! - `pg18_clone`: PostgreSQL 18's `CREATE DATABASE ... STRATEGY FILE_COPY`
//!   with `file_copy_method = clone`, on the same volume, when a server of 18
//!   or newer is installed (`airlock postgres install 18`). A copy inside one
//!   server, isolated from nothing: the floor a fork is held to.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use hyper::Method;

use airlock_listen::client::NO_BODY;

use super::bench_series::{elapsed_ms, first_query, series, Series};
use super::Cli;
use airlock_core::error::{Error, Result};
use airlock_core::layout::InstanceDir;
use airlock_host::users::Identity;
use airlock_lifecycle::sandbox::{ForkRequest, Forked, Sandbox};
use airlock_postgres::admin::Admin;
use airlock_postgres::{instance, PgBin};

/// The scratch servers, loaded, and the times measured so far.
pub(super) struct Baselines {
    root: PathBuf,
    host: Loaded,
    anchor: Option<Loaded>,
    template: Vec<f64>,
    restore: Vec<f64>,
    fresh: Vec<f64>,
    clone: Vec<f64>,
}

/// A scratch server holding the golden in its database `tmpl`.
struct Loaded {
    scratch: Scratch,
    dir: InstanceDir,
    server: instance::Started,
    admin: Admin,
}

impl Baselines {
    /// Dumps the golden and loads it into the scratch servers, off the clock;
    /// `None` for a golden with no PostgreSQL part.
    pub(super) async fn prepare(
        cli: &Cli,
        client: &airlock_listen::client::Client,
        req: &ForkRequest,
        doctor: &airlock_lifecycle::doctor::Doctor,
    ) -> Result<Option<Baselines>> {
        let me = Identity::current()?;
        let user = Identity::for_instances(None)?;
        let bin = PgBin::locate(std::env::var_os("AIRLOCK_PG_BIN").map(PathBuf::from).as_deref())?;
        let root = cli.layout().volume().join(format!("bench-{}", airlock_core::secret::sandbox_id()));
        airlock_host::storage::tree::private_dir(&root)?;
        std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o711))?;
        let prepared = async {
            let Some(dump) = dump(client, req, &root, &bin).await? else { return Ok(None) };
            let host =
                Scratch { bin, restorer: None, me: me.clone(), user: user.clone(), root: root.clone() };
            let host = host.load("server", &dump).await?;
            let anchor = match anchor_server(doctor) {
                Some((bin, restorer)) => {
                    let scratch = Scratch { bin, restorer, me, user, root: root.clone() };
                    Some(scratch.load("anchor", &dump).await?)
                }
                None => None,
            };
            Ok::<_, Error>(Some((host, anchor)))
        };
        match prepared.await {
            Ok(None) => {
                let _ = std::fs::remove_dir_all(&root);
                Ok(None)
            }
            Ok(Some((host, anchor))) => Ok(Some(Baselines {
                root,
                host,
                anchor,
                template: vec![],
                restore: vec![],
                fresh: vec![],
                clone: vec![],
            })),
            Err(e) => {
                // A scratch server that started is stopped with its directory's removal below.
                stop_scratch_servers(&root).await;
                let _ = std::fs::remove_dir_all(&root);
                Err(e)
            }
        }
    }

    /// Times one run of each baseline.
    pub(super) async fn round(&mut self, i: usize) -> Result<()> {
        let host = &self.host;
        let config = |db: &str| {
            let mut config = instance::admin_config(&host.dir, "postgres");
            config.dbname(db);
            config
        };
        let t = Instant::now();
        host.admin.execute(&format!("CREATE DATABASE t{i} TEMPLATE tmpl")).await?;
        first_query(&config(&format!("t{i}"))).await?;
        self.template.push(elapsed_ms(t));
        host.admin.execute(&format!("DROP DATABASE t{i}")).await?;

        let t = Instant::now();
        host.admin.execute(&format!("CREATE DATABASE r{i}")).await?;
        host.scratch.restore(&host.dir, &format!("r{i}"), &self.root.join(DUMP)).await?;
        first_query(&config(&format!("r{i}"))).await?;
        self.restore.push(elapsed_ms(t));
        host.admin.execute(&format!("DROP DATABASE r{i}")).await?;

        if let Some(anchor) = &self.anchor {
            let t = Instant::now();
            anchor.admin.execute(&format!("CREATE DATABASE c{i} TEMPLATE tmpl STRATEGY FILE_COPY")).await?;
            let mut config = instance::admin_config(&anchor.dir, "postgres");
            first_query(config.dbname(format!("c{i}"))).await?;
            self.clone.push(elapsed_ms(t));
            anchor.admin.execute(&format!("DROP DATABASE c{i}")).await?;
        }

        let t = Instant::now();
        let (dir, started) = host.scratch.up(&format!("fresh{i}")).await?;
        let seeded = async {
            Admin::connect(&dir, "postgres", started.pid).await?.execute("CREATE DATABASE app").await?;
            host.scratch.restore(&dir, "app", &self.root.join(DUMP)).await?;
            first_query(&instance::admin_config(&dir, "app")).await
        }
        .await;
        if seeded.is_ok() {
            self.fresh.push(elapsed_ms(t));
        }
        let stopped = started.stop_clean(&dir).await;
        let _ = std::fs::remove_dir_all(&dir.root);
        seeded.and(stopped)
    }

    /// Stops the scratch servers, removes their files, and gives the series.
    pub(super) async fn finish(self) -> Result<Vec<Series>> {
        let Baselines { root, host, anchor, template, restore, fresh, clone } = self;
        for loaded in std::iter::once(host).chain(anchor) {
            drop(loaded.admin);
            if let Err(e) = loaded.server.stop_clean(&loaded.dir).await {
                tracing::warn!(error = %e, "a scratch server did not stop cleanly");
            }
        }
        // Whatever else still runs there (a round's server cut short) first.
        stop_scratch_servers(&root).await;
        let _ = std::fs::remove_dir_all(&root);
        let mut all = Vec::new();
        for (name, ms) in
            [("template", template), ("pg_restore", restore), ("initdb_seed", fresh), ("pg18_clone", clone)]
        {
            if !ms.is_empty() {
                all.push(series(name, ms));
            }
        }
        Ok(all)
    }
}

/// The dump's file name under the scratch root.
const DUMP: &str = "golden.dump";

/// A dump of the golden, taken from a sandbox with the agent's own
/// credential; `None` when its sandboxes have no PostgreSQL.
async fn dump(
    client: &airlock_listen::client::Client,
    req: &ForkRequest,
    root: &Path,
    bin: &PgBin,
) -> Result<Option<PathBuf>> {
    let dump = root.join(DUMP);
    let forked: Forked = client.call(Method::POST, "/v1/sandboxes", Some(req)).await?;
    let Some(dsn) = forked.sandbox.socket_dsn.clone().or(forked.sandbox.dsn.clone()) else {
        let path = format!("/v1/sandboxes/{}", forked.sandbox.id);
        let _: Sandbox = client.call(Method::DELETE, &path, NO_BODY).await?;
        return Ok(None);
    };
    let passfile = root.join("pgpass");
    let written =
        airlock_core::dsn::write_passfile(&passfile, &airlock_core::dsn::password(&dsn).unwrap_or_default());
    let out = match written {
        Ok(()) => tokio::process::Command::new(bin.tool("pg_dump"))
            .env("PGPASSFILE", &passfile)
            .args(["--format=custom", "--no-owner", "--no-acl", "--compress=0", "--file"])
            .arg(&dump)
            .arg(airlock_core::dsn::redact(&dsn))
            .output()
            .await
            .map_err(Error::from),
        Err(e) => Err(Error::from(e)),
    };
    // The sandbox goes whatever came of the dump.
    let _: Sandbox =
        client.call(Method::DELETE, &format!("/v1/sandboxes/{}", forked.sandbox.id), NO_BODY).await?;
    let out = out?;
    if !out.status.success() {
        return Err(Error::postgres(format!(
            "pg_dump of the golden failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(Some(dump))
}

/// The newest installed server of 18 or newer that can be used, with the
/// client tools its restores need (when its own directory has none).
fn anchor_server(doctor: &airlock_lifecycle::doctor::Doctor) -> Option<(PgBin, Option<PgBin>)> {
    let major = doctor
        .postgres_majors
        .iter()
        .filter(|m| m.major >= 18 && m.problem.is_none())
        .max_by_key(|m| m.major)?;
    let bin = PgBin::server(PathBuf::from(&major.bin)).ok()?;
    let restorer = major.clients.as_ref().and_then(|c| PgBin::clients(PathBuf::from(c)).ok());
    Some((bin, restorer))
}

/// Stops whatever scratch server still runs under `root` (after a failure).
async fn stop_scratch_servers(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else { return };
    for entry in entries.flatten() {
        let dir = InstanceDir { root: entry.path() };
        let pidfile = dir.pgdata().join("postmaster.pid");
        let pid = std::fs::read_to_string(&pidfile).ok().and_then(|t| t.lines().next()?.trim().parse().ok());
        if let Some(pid) = pid {
            let _ = instance::kill(pid, &dir.pgdata()).await;
        }
    }
}

/// Scratch instances of one server's binaries, under the baselines' root.
struct Scratch {
    bin: PgBin,
    /// Client tools to restore with, when `bin` has none.
    restorer: Option<PgBin>,
    me: Identity,
    user: Identity,
    root: PathBuf,
}

impl Scratch {
    /// initdb + start; returns the running instance.
    async fn up(&self, name: &str) -> Result<(InstanceDir, instance::Started)> {
        let dir = InstanceDir { root: self.root.join(name) };
        instance::prepare_dir(&dir, &self.user, None)?;
        airlock_host::storage::tree::private_dir(&dir.pgdata())?;
        self.user.own(&dir.pgdata())?;
        instance::initdb(&self.bin, &dir.pgdata(), &self.me, &self.user).await?;
        let users = [self.me.name.as_str()];
        instance::write_access_files(&dir, &instance::Peers { admin: &users, ..Default::default() })?;
        let mut started = instance::start(&self.bin, &dir, &self.user, None, &[], None, None, None, None)?;
        if let Err(e) = started.wait_ready(&dir).await {
            let _ = instance::kill(started.pid, &dir.pgdata()).await;
            return Err(e);
        }
        Ok((dir, started))
    }

    /// A server named `name` holding the golden in `tmpl`, frozen, with an
    /// admin session open (set to clone files where the server can).
    async fn load(self, name: &str, dump: &Path) -> Result<Loaded> {
        let (dir, server) = self.up(name).await?;
        let admin = Admin::connect(&dir, "postgres", server.pid).await?;
        admin.execute("CREATE DATABASE tmpl").await?;
        self.restore(&dir, "tmpl", dump).await?;
        admin.execute("VACUUM FREEZE").await.ok();
        if self.bin.major().is_some_and(|m| m >= 18) {
            admin.execute("SET file_copy_method = clone").await?;
        }
        Ok(Loaded { scratch: self, dir, server, admin })
    }

    async fn restore(&self, dir: &InstanceDir, database: &str, dump: &Path) -> Result<()> {
        let tools = self.restorer.as_ref().unwrap_or(&self.bin);
        let out = tokio::process::Command::new(tools.tool("pg_restore"))
            .env_clear()
            .env("PGHOST", dir.socket_dir())
            .env("PGUSER", airlock_core::dsn::ADMIN_ROLE)
            .args(["--no-owner", "--no-acl", "--exit-on-error", "--dbname", database])
            .arg(dump)
            .stdin(Stdio::null())
            .output()
            .await?;
        if !out.status.success() {
            return Err(Error::postgres(format!(
                "pg_restore failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(())
    }
}
