//! Restoring a pg_dump archive into a golden under construction as production
//! has it: its roles, extensions, owners, grants and policies.
//!
//! The restore runs in phases, each as the least role that can do it:
//!
//! 1. the roles the dump names are created (admin) as `NOLOGIN` roles of the
//!    same names, never superusers, never with a password, never members of a
//!    predefined role; the owner role is made a member of each, so the agent
//!    can act, and `SET ROLE`, as the application does;
//! 2. schemas (admin), then the extensions the source uses (admin: PostGIS and
//!    other untrusted extensions need a superuser);
//! 3. the other definitions (admin: giving an object to a role that lacks
//!    `CREATE` on its schema needs a superuser);
//! 4. the data, in parallel (the owner role: nothing a table's checks or
//!    defaults run executes as a superuser);
//! 5. indexes, constraints, triggers, policies and grants, in parallel (admin;
//!    PostgreSQL runs index expressions and constraint checks as the table's
//!    owner).
//!
//! Event triggers and subscriptions are left out: an event trigger would run
//! its function (which the agent could replace) inside the daemon's own admin
//! sessions, and a subscription would reach for production. Afterwards the
//! golden is checked: no event trigger, nothing outside an extension owned by
//! a superuser.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Stdio;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncBufReadExt;

use crate::catalog::{quote_ident, SYSTEM_SCHEMAS};
use crate::error::{Error, ErrorCode, Result};
use crate::golden::archive::{self, TocEntry};
use crate::golden::progress::Builds;
use crate::golden::source::{Extension, SourceFacts};
use crate::layout::InstanceDir;
use crate::pg::admin::Admin;
use crate::pg::bin::PgBin;
use crate::pg::dsn::{AGENT_ROLE, DATABASE, OWNER_ROLE};

/// What an import made of the source's global objects, for the fidelity report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Imported {
    /// Roles created (`NOLOGIN`), by name.
    pub roles: Vec<String>,
    /// `group <- member` memberships recreated among them.
    pub memberships: Vec<String>,
    /// What was not carried, and why (superuser attributes, predefined-role
    /// memberships, event triggers, subscriptions).
    pub not_carried: Vec<String>,
    /// Extensions installed, with the versions installed.
    pub extensions: Vec<Extension>,
    /// The tables (`schema.name`) the archive's table of contents lists.
    #[serde(skip)]
    pub listed_tables: Vec<String>,
}

/// A build's view of one archive restore.
pub struct Restore<'a> {
    /// The PostgreSQL binaries.
    pub bin: &'a PgBin,
    /// The golden under construction.
    pub dir: &'a InstanceDir,
    /// Its postmaster.
    pub postmaster: i32,
    /// Parallel jobs for data and indexes.
    pub jobs: usize,
    /// Where progress is shown, and under which golden.
    pub progress: (&'a Builds, &'a str),
    /// Scratch space for list files.
    pub work: &'a Path,
}

impl Restore<'_> {
    /// Restores the archive at `path` (custom, tar or directory format).
    /// `facts` (a live source's) give role attributes, memberships and
    /// extension versions; without them roles get PostgreSQL's defaults.
    pub async fn run(&self, path: &Path, facts: Option<&SourceFacts>) -> Result<Imported> {
        self.phase("reading the dump", |_| {});
        let toc = archive::parse_toc(&self.tool_output(&["-l"], path).await?);
        if let Some(id) = archive::repeated_id(&toc) {
            return Err(Error::new(
                ErrorCode::SourceFailed,
                format!("the dump's table of contents lists entry {id} twice"),
                "the archive is damaged or forged; take the dump again with pg_dump",
            ));
        }
        let ddl = self.tool_output(&["--schema-only", "-f", "-"], path).await?;
        let mut imported = Imported::default();
        imported.listed_tables =
            toc.iter().filter(|e| e.kind == "TABLE" || e.kind == "FOREIGN TABLE").map(data_table).collect();
        let tables = toc.iter().filter(|e| e.kind == "TABLE DATA").count() as u64;
        self.phase("creating roles", |p| p.tables_total = tables);
        let admin = Admin::connect(self.dir, DATABASE, self.postmaster).await?;
        let named = archive::roles(&ddl);
        let ddl_names_agent = named.contains(AGENT_ROLE);
        self.create_roles(&admin, &named, facts, &mut imported).await?;

        let (schemas, rest): (Vec<&TocEntry>, Vec<&TocEntry>) = toc.iter().partition(|e| e.kind == "SCHEMA");
        self.phase("creating schemas and extensions", |_| {});
        if !schemas.is_empty() {
            let list = self.list_file("schemas", &schemas)?;
            self.restore(path, &list, None, false, 1).await?;
        }
        imported.extensions = self.create_extensions(&admin, &archive::extensions(&ddl), facts).await?;

        let mut kept = Vec::new();
        for entry in rest {
            let extension_entry = entry.kind == "EXTENSION" || entry.tag.starts_with("- EXTENSION ");
            let event_trigger = entry.kind == "EVENT TRIGGER" || entry.tag.contains(" EVENT TRIGGER ");
            let subscription = entry.kind.starts_with("SUBSCRIPTION") || entry.tag.contains(" SUBSCRIPTION ");
            if event_trigger && entry.kind == "EVENT TRIGGER" {
                imported.not_carried.push(format!(
                    "event trigger {}: it would run inside Airlock's admin sessions",
                    entry.tag.split(' ').nth(1).unwrap_or("?")
                ));
            }
            if subscription && entry.kind == "SUBSCRIPTION" {
                imported.not_carried.push(format!("subscription {}: a golden subscribes to nothing", entry.tag));
            }
            if !(extension_entry || event_trigger || subscription) {
                kept.push(entry);
            }
        }
        let list = self.list_file("rest", &kept)?;
        self.phase("restoring definitions", |_| {});
        self.restore(path, &list, Some("pre-data"), false, 1).await?;
        // Extensions' configuration tables (PostGIS's spatial_ref_sys) belong
        // to the admin, who installed the extension: their rows are the admin's
        // to restore. Every other table's are the owner role's.
        let admins_tables = superuser_tables(&admin).await?;
        let (admins, owners): (Vec<&TocEntry>, Vec<&TocEntry>) = kept
            .iter()
            .filter(|e| e.kind == "TABLE DATA")
            .partition(|e| admins_tables.contains(&data_table(e)));
        self.phase("restoring data", |p| p.tables_done = 0);
        if !admins.is_empty() {
            let admin_list = self.list_file("extension-data", &admins)?;
            self.restore(path, &admin_list, Some("data"), false, 1).await?;
        }
        let mut owner_entries: Vec<&TocEntry> = kept.iter().filter(|e| e.kind != "TABLE DATA").copied().collect();
        owner_entries.extend(owners);
        let owner_list = self.list_file("data", &owner_entries)?;
        self.restore(path, &owner_list, Some("data"), true, self.jobs).await?;
        self.phase("indexing and granting", |_| {});
        self.restore(path, &list, Some("post-data"), false, self.jobs).await?;
        self.phase("checking", |_| {});
        if ddl_names_agent {
            admin
                .execute(&format!(
                    "REASSIGN OWNED BY {AGENT_ROLE} TO {OWNER_ROLE}; DROP OWNED BY {AGENT_ROLE}; DROP ROLE {AGENT_ROLE};"
                ))
                .await?;
        }
        check_nothing_runs_as_a_superuser(&admin).await?;
        Ok(imported)
    }

    fn phase(&self, phase: &str, f: impl FnOnce(&mut crate::golden::progress::BuildProgress)) {
        let (builds, name) = self.progress;
        builds.update(name, |p| {
            p.phase = phase.to_owned();
            f(p);
        });
    }

    async fn create_roles(
        &self,
        admin: &Admin,
        named: &BTreeSet<String>,
        facts: Option<&SourceFacts>,
        imported: &mut Imported,
    ) -> Result<()> {
        let reserved: Vec<&String> = named
            .iter()
            .filter(|r| r.starts_with("airlock_") && r.as_str() != OWNER_ROLE && r.as_str() != AGENT_ROLE)
            .collect();
        if !reserved.is_empty() {
            return Err(Error::new(
                ErrorCode::SourceFailed,
                format!(
                    "the source's objects name roles reserved for Airlock: {}",
                    reserved.iter().map(|r| r.as_str()).collect::<Vec<_>>().join(", ")
                ),
                "a sandbox's state becomes a golden with `airlock promote`; otherwise give those objects \
                 to roles of the application's own before importing",
            ));
        }
        let mut sql = String::new();
        if named.contains(AGENT_ROLE) {
            // A sandbox's agent role, in a source that was a sandbox: its objects
            // go to the owner role once restored, as a promotion does.
            sql.push_str(&format!("CREATE ROLE {AGENT_ROLE} NOLOGIN; GRANT {AGENT_ROLE} TO {OWNER_ROLE};\n"));
            imported.not_carried.push(format!("{AGENT_ROLE}'s objects and grants: folded into {OWNER_ROLE}"));
        }
        for role in named.iter().filter(|r| r.as_str() != OWNER_ROLE && r.as_str() != AGENT_ROLE) {
            let attributes = facts.and_then(|f| f.roles.get(role));
            let inherit = attributes.is_none_or(|a| a.inherit);
            let bypassrls = attributes.is_some_and(|a| a.bypassrls);
            if attributes.is_some_and(|a| a.superuser) {
                imported.not_carried.push(format!("role {role} is a superuser in the source: created without it"));
            }
            let q = quote_ident(role);
            sql.push_str(&format!(
                "CREATE ROLE {q} NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION {} {};\n\
                 GRANT {q} TO {OWNER_ROLE};\n",
                if inherit { "INHERIT" } else { "NOINHERIT" },
                if bypassrls { "BYPASSRLS" } else { "NOBYPASSRLS" },
            ));
            imported.roles.push(role.clone());
        }
        for (group, member) in facts.map(|f| f.memberships.as_slice()).unwrap_or_default() {
            if !named.contains(member) || member.starts_with("airlock_") {
                continue;
            }
            if group.starts_with("pg_") || facts.and_then(|f| f.roles.get(group)).is_some_and(|a| a.superuser) {
                imported.not_carried.push(format!("{member}'s membership of {group}: it reaches beyond the database"));
            } else if named.contains(group) && !group.starts_with("airlock_") {
                sql.push_str(&format!("GRANT {} TO {};\n", quote_ident(group), quote_ident(member)));
                imported.memberships.push(format!("{group} <- {member}"));
            }
        }
        if !sql.is_empty() {
            admin.execute(&sql).await?;
        }
        Ok(())
    }

    async fn create_extensions(
        &self,
        admin: &Admin,
        dumped: &[archive::DumpedExtension],
        facts: Option<&SourceFacts>,
    ) -> Result<Vec<Extension>> {
        let available: BTreeSet<String> = admin
            .client()
            .query("SELECT name::text FROM pg_catalog.pg_available_extensions", &[])
            .await
            .map_err(|e| Error::postgres(crate::pg::admin::describe(&e)))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let major = self.bin.major().unwrap_or(15);
        let missing: Vec<&archive::DumpedExtension> =
            dumped.iter().filter(|e| !available.contains(&e.name)).collect();
        if !missing.is_empty() {
            let names: Vec<&str> = missing.iter().map(|e| e.name.as_str()).collect();
            let packages: BTreeSet<String> = missing.iter().map(|e| package_for(&e.name, major)).collect();
            return Err(Error::new(
                ErrorCode::ExtensionMissing,
                format!(
                    "the source uses extension{} {} that this host's PostgreSQL {major} does not have",
                    if names.len() > 1 { "s" } else { "" },
                    names.join(", ")
                ),
                format!(
                    "install {} (`apt-get install {}`), then build again; `airlock doctor` lists the extensions available",
                    packages.iter().cloned().collect::<Vec<_>>().join(", "),
                    packages.iter().cloned().collect::<Vec<_>>().join(" ")
                ),
            ));
        }
        let mut installed = Vec::new();
        for ext in dumped {
            let wanted = facts.and_then(|f| f.extensions.iter().find(|e| e.name == ext.name)).map(|e| e.version.clone());
            let base = format!(
                "CREATE EXTENSION IF NOT EXISTS {} WITH SCHEMA {}",
                quote_ident(&ext.name),
                quote_ident(&ext.schema)
            );
            let exact = match &wanted {
                Some(v) => admin.execute(&format!("{base} VERSION '{}' CASCADE", v.replace('\'', "''"))).await,
                None => Err(Error::internal("no version asked")),
            };
            if exact.is_err() {
                // The host has another version: install its default and let the
                // fidelity report name the difference.
                admin.execute(&format!("{base} CASCADE")).await.map_err(|e| {
                    Error::new(
                        ErrorCode::ExtensionMissing,
                        format!("installing extension {} failed: {}", ext.name, e.message),
                        format!("install {} for PostgreSQL {major}, then build again", package_for(&ext.name, major)),
                    )
                })?;
            }
            let version = admin
                .value(&format!(
                    "SELECT extversion FROM pg_catalog.pg_extension WHERE extname = '{}'",
                    ext.name.replace('\'', "''")
                ))
                .await?;
            installed.push(Extension { name: ext.name.clone(), version, schema: ext.schema.clone() });
        }
        Ok(installed)
    }

    /// Writes a `-L` list file of `entries`.
    fn list_file(&self, name: &str, entries: &[&TocEntry]) -> Result<std::path::PathBuf> {
        let path = self.work.join(format!("{name}.list"));
        let text: String = entries.iter().map(|e| format!("{}\n", e.line)).collect();
        std::fs::write(&path, text)?;
        Ok(path)
    }

    /// pg_restore with no database: reads the archive.
    async fn tool_output(&self, args: &[&str], path: &Path) -> Result<String> {
        let out = crate::pg::load::admin_tool(self.bin, "pg_restore", self.dir).args(args).arg(path).output().await?;
        if !out.status.success() {
            return Err(Error::new(
                ErrorCode::SourceFailed,
                format!("pg_restore could not read {}: {}", path.display(), String::from_utf8_lossy(&out.stderr).trim()),
                "check that the dump is complete and made by a pg_dump no newer than this host's PostgreSQL",
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Restores the entries of `list` in `section`, as the owner role or the admin.
    async fn restore(&self, path: &Path, list: &Path, section: Option<&str>, as_owner: bool, jobs: usize) -> Result<()> {
        let mut cmd = crate::pg::load::admin_tool(self.bin, "pg_restore", self.dir);
        if as_owner {
            cmd.env("PGOPTIONS", format!("-c role={OWNER_ROLE}"));
        }
        cmd.args(["--exit-on-error", "--verbose", "--dbname", DATABASE, "--use-list"]).arg(list);
        if let Some(section) = section {
            cmd.arg(format!("--section={section}"));
        }
        if jobs > 1 {
            cmd.arg(format!("--jobs={jobs}"));
        }
        cmd.arg(path).stderr(Stdio::piped());
        let mut child = cmd.spawn()?;
        let stderr = child.stderr.take().expect("stderr is piped");
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        let mut errors = Vec::new();
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("processing data for table") {
                self.phase("restoring data", |p| p.tables_done += 1);
            } else if !line.starts_with("pg_restore: ") || line.to_ascii_lowercase().contains("error") {
                // Verbose progress aside, what pg_restore says is the error and its context.
                errors.push(line);
            }
        }
        let status = child.wait().await?;
        if status.success() {
            return Ok(());
        }
        let what = section.unwrap_or("schemas");
        Err(Error::new(
            ErrorCode::SourceFailed,
            format!("pg_restore ({what}) of {} failed: {}", path.display(), errors.join("\n").trim()),
            "check that the dump is complete and made by a pg_dump no newer than this host's PostgreSQL",
        ))
    }
}

/// `schema.name` of the table a `TABLE` or `TABLE DATA` entry names (its tag is `schema name owner`).
fn data_table(entry: &TocEntry) -> String {
    let mut words = entry.tag.split(' ');
    format!("{}.{}", words.next().unwrap_or_default(), words.next().unwrap_or_default())
}

/// Tables (`schema.name`) that belong to a superuser: extensions' own.
async fn superuser_tables(admin: &Admin) -> Result<BTreeSet<String>> {
    Ok(admin
        .client()
        .query(
            "SELECT n.nspname || '.' || c.relname FROM pg_catalog.pg_class c
               JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
               JOIN pg_catalog.pg_roles r ON r.oid = c.relowner
              WHERE r.rolsuper AND c.relkind IN ('r', 'p')",
            &[],
        )
        .await
        .map_err(|e| Error::postgres(crate::pg::admin::describe(&e)))?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// Refuses a golden with an event trigger, or with a function, table or view
/// outside an extension that belongs to a superuser: an event trigger would run
/// its function (which the agent may replace) in the daemon's admin sessions; a
/// superuser's function or view would run, or read, with a superuser's rights
/// for the agent. (Everything a dump names an owner for belongs to a role the
/// import made, none of them superusers; this is the backstop.)
async fn check_nothing_runs_as_a_superuser(admin: &Admin) -> Result<()> {
    let not_extension = |class: &str, oid: &str| {
        format!(
            "NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend d WHERE d.classid = '{class}'::pg_catalog.regclass \
             AND d.objid = {oid} AND d.deptype = 'e')"
        )
    };
    let sql = format!(
        "SELECT 'event trigger ' || evtname FROM pg_catalog.pg_event_trigger
         UNION ALL
         SELECT 'relation ' || c.oid::pg_catalog.regclass::text FROM pg_catalog.pg_class c
           JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace JOIN pg_catalog.pg_roles r ON r.oid = c.relowner
           WHERE r.rolsuper AND c.relkind IN ('r', 'p', 'v', 'm', 'f') AND {SYSTEM_SCHEMAS} AND {}
         UNION ALL
         SELECT 'function ' || p.oid::pg_catalog.regprocedure::text FROM pg_catalog.pg_proc p
           JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace JOIN pg_catalog.pg_roles r ON r.oid = p.proowner
           WHERE r.rolsuper AND {SYSTEM_SCHEMAS} AND {}
         LIMIT 20",
        not_extension("pg_class", "c.oid"),
        not_extension("pg_proc", "p.oid"),
    );
    let found: Vec<String> = admin
        .client()
        .query(&sql, &[])
        .await
        .map_err(|e| Error::postgres(crate::pg::admin::describe(&e)))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if found.is_empty() {
        return Ok(());
    }
    Err(Error::new(
        ErrorCode::SourceFailed,
        format!("the restored golden would run code as a superuser: {}", found.join(", ")),
        "give those objects to a role of the application's own in the source, then build again",
    ))
}

/// The Debian package that provides extension `name` for PostgreSQL `major`.
pub fn package_for(name: &str, major: u32) -> String {
    match name {
        n if n.starts_with("postgis") || n.starts_with("address_standardizer") => {
            format!("postgresql-{major}-postgis-3")
        }
        "vector" => format!("postgresql-{major}-pgvector"),
        "pg_partman" => format!("postgresql-{major}-partman"),
        "pg_cron" => format!("postgresql-{major}-cron"),
        "pg_repack" => format!("postgresql-{major}-repack"),
        "plpython3u" => format!("postgresql-plpython3-{major}"),
        "plperl" | "plperlu" => format!("postgresql-plperl-{major}"),
        "pltcl" | "pltclu" => format!("postgresql-pltcl-{major}"),
        "timescaledb" => "timescaledb (from Timescale's own package repository)".into(),
        other => format!("postgresql-{major}-{}", other.replace('_', "-")),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn packages_are_named_as_debian_names_them() {
        assert_eq!(super::package_for("postgis", 15), "postgresql-15-postgis-3");
        assert_eq!(super::package_for("postgis_topology", 17), "postgresql-17-postgis-3");
        assert_eq!(super::package_for("vector", 16), "postgresql-16-pgvector");
        assert_eq!(super::package_for("pg_hint_plan", 15), "postgresql-15-pg-hint-plan");
    }
}
