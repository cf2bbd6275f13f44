//! Restoring a pg_dump archive into a golden under construction as production
//! has it: its roles, extensions, owners, grants and policies.
//!
//! The archive is hostile text (a source may be a compromised replica, or hold
//! what an agent planted), so no statement of it ever runs as a superuser:
//!
//! 1. the roles its statements name are created by the admin as `NOLOGIN`
//!    roles of the same names, never superusers, never with a password, never
//!    members of a predefined role; the owner role is made a member of each, so
//!    the agent can act, and `SET ROLE`, as the application does;
//! 2. its schemas are created by the admin from their names (for the owner
//!    role), then the extensions it uses are installed by the admin from the
//!    host's packages (PostGIS and other untrusted extensions need a
//!    superuser), into schemas still empty;
//! 3. everything else is restored by the owner role with `--no-owner`, in
//!    parallel: whatever only a superuser may create fails here;
//! 4. the admin sets each object's owner from the dump's `OWNER TO`
//!    statements, finding it by its name parts compared as values and naming it
//!    as the server prints it.
//!
//! Event triggers, subscriptions and grants on PostgreSQL's own objects are left
//! out. Afterwards a backstop checks the golden: no event trigger, nothing
//! outside an extension owned by a superuser or in an untrusted language, no
//! imported role with an attribute or membership beyond what was made.

use airlock_postgres::cell::Cell;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Stdio;

use tokio::io::AsyncBufReadExt;

use crate::golden::archive::{self, TocEntry};
use crate::golden::progress::Builds;
use crate::golden::shape::Shaped;
use crate::golden::source::SourceFacts;
use airlock_core::dsn::{AGENT_ROLE, DATABASE, OWNER_ROLE};
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::layout::InstanceDir;
use airlock_postgres::admin::Admin;
use airlock_postgres::catalog::{quote_ident, SYSTEM_SCHEMAS};
use airlock_postgres::imported::{Extension, Imported};
use airlock_postgres::loader::Loader;

/// A build's view of one archive restore.
pub struct Restore<'a> {
    /// The client tools (pg_restore) it runs, and where they find the archive.
    pub loader: &'a Loader<'a>,
    /// The archive as its errors name it: the dump the request named, or the source's.
    pub named: &'a str,
    /// The golden's PostgreSQL major.
    pub major: u32,
    /// When that major is one `airlock postgres install` added (contrib only):
    /// the host's own major, whose system packages carry other extensions.
    pub installed_build: Option<u32>,
    /// The extensions it may install.
    pub allowed: airlock_postgres::extensions::Allowed,
    /// The golden under construction.
    pub dir: &'a InstanceDir,
    /// Its postmaster.
    pub postmaster: i32,
    /// Parallel jobs for data and indexes.
    pub jobs: usize,
    /// Where progress is shown, and under which golden.
    pub progress: (&'a Builds, &'a str),
    /// Masking and subset, run between the data and the indexes, when asked.
    pub shaping: Option<&'a crate::golden::shape::Shaping<'a>>,
    /// Who logs in as the owner role (for reshaping's owner sessions).
    pub owner_os_user: Option<&'a airlock_host::users::Identity>,
}

impl Restore<'_> {
    /// Restores the archive at `path` (custom, tar or directory format).
    /// `facts` (a live source's) give role attributes, memberships and
    /// extension versions; without them roles get PostgreSQL's defaults.
    pub async fn run(&self, path: &Path, facts: Option<&SourceFacts>) -> Result<(Imported, Shaped)> {
        self.phase("reading the dump", |_| {});
        let toc = archive::parse_toc(&self.tool_output(&["-l"], path).await?);
        if let Some(id) = archive::repeated_id(&toc) {
            return Err(Error::new(
                ErrorCode::SourceFailed,
                format!("the dump's table of contents lists entry {id} twice"),
                "the archive is damaged or forged; take the dump again with pg_dump",
            ));
        }
        let statements =
            read_statements(&self.tool_output(&["--schema-only", "-f", "-"], path).await?, "definitions")?;
        let mut imported = Imported { listed_tables: archive::tables(&statements), ..Default::default() };
        let tables = toc.iter().filter(|e| e.kind == "TABLE DATA").count() as u64;
        self.phase("creating roles", |p| p.tables_total = tables);
        let admin = Admin::connect(self.dir, DATABASE, self.postmaster).await?;
        let named = archive::roles(&statements);
        self.create_roles(&admin, &named, facts, &mut imported).await?;

        // The schemas are made by the admin from their names, not by the dump's
        // text: extensions are installed into them next, as a superuser, and
        // must find them empty (an extension script calls functions by name).
        self.phase("creating schemas and extensions", |_| {});
        let mut sql = String::new();
        for schema in archive::schemas(&statements) {
            sql.push_str(&format!(
                "CREATE SCHEMA IF NOT EXISTS {} AUTHORIZATION {OWNER_ROLE};\n",
                quote_ident(&schema)
            ));
        }
        if !sql.is_empty() {
            admin.execute(&sql).await?;
        }
        let rest = toc.iter().filter(|e| e.kind != "SCHEMA");
        let mut wanted = archive::extensions(&statements);
        if let Some(facts) = facts {
            // Only what the source really has: a dump's text is not the judge.
            wanted.retain(|e| facts.extensions.iter().any(|x| x.name == e.name));
        }
        self.check_available(&admin, &wanted).await?;
        let wanted = self.contained_extensions(&admin, wanted, &mut imported).await?;
        imported.extensions = self.create_extensions(&admin, &wanted, facts).await?;
        let config = extension_config(&admin).await?;
        if !config.is_empty() {
            // Extensions' configuration tables (PostGIS's spatial_ref_sys) are
            // the admin's, who installed them; the owner role may fill them for
            // the length of the restore. Their checks are the extension's own.
            admin.execute(&grants("GRANT", &config, "TO")).await?;
        }

        let mut kept = Vec::new();
        for entry in rest {
            let extension_entry = entry.kind == "EXTENSION" || entry.tag.starts_with("- EXTENSION ");
            let event_trigger = entry.kind == "EVENT TRIGGER" || entry.tag.contains(" EVENT TRIGGER ");
            let subscription = entry.kind.starts_with("SUBSCRIPTION") || entry.tag.contains(" SUBSCRIPTION ");
            // Grants on PostgreSQL's own functions and tables are the admin's to give.
            let system_grant = entry.kind == "ACL" && entry.tag.starts_with("pg_catalog ");
            if entry.kind == "EVENT TRIGGER" {
                imported.not_carried.push(format!(
                    "event trigger {}: it would run inside Airlock's admin sessions",
                    entry.tag.split(' ').nth(1).unwrap_or("?")
                ));
            }
            if entry.kind == "SUBSCRIPTION" {
                imported
                    .not_carried
                    .push(format!("subscription {}: a golden subscribes to nothing", entry.tag));
            }
            if system_grant {
                imported
                    .not_carried
                    .push(format!("grant on {}: PostgreSQL's own objects keep their grants", entry.tag));
            }
            if !(extension_entry || event_trigger || subscription || system_grant) {
                kept.push(entry);
            }
        }
        // Everything else is restored by the owner role, as the owner of every
        // object: no statement of the archive runs as a superuser, so whatever
        // PostgreSQL allows only a superuser to create (C and internal functions,
        // untrusted languages, programs run by file_fdw) fails here.
        let list = self.list_file("rest", &kept)?;
        self.phase("restoring", |p| p.tables_done = 0);
        let mut shaped = Shaped::default();
        let restored = match self.shaping {
            None => self.restore(path, &list, self.jobs, &[]).await,
            // Reshaping runs on the data alone: no index to keep up, no
            // trigger or reference to fire; those come after, on what is left.
            Some(shaping) => match self.restore(path, &list, self.jobs, &["pre-data", "data"]).await {
                Ok(()) => {
                    self.phase("masking and cutting", |_| {});
                    let staging = crate::golden::shape::Staging {
                        dir: self.dir,
                        postmaster: self.postmaster,
                        owner_os_user: self.owner_os_user,
                    };
                    shaped = shaping.run(&staging, &statements).await?;
                    self.phase("indexing and checking references", |_| {});
                    self.restore(path, &list, self.jobs, &["post-data"]).await
                }
                Err(e) => Err(e),
            },
        };
        restored.map_err(|mut e| {
            if !imported.left_out_extensions.is_empty() {
                e.hint = format!(
                    "the source uses extension{} {}, left out because {} can reach outside a fork: if the failure \
                     names {}, give --allow-extension for it; else {}",
                    if imported.left_out_extensions.len() > 1 { "s" } else { "" },
                    imported.left_out_extensions.join(", "),
                    if imported.left_out_extensions.len() > 1 { "they" } else { "it" },
                    if imported.left_out_extensions.len() > 1 { "one" } else { "it" },
                    e.hint
                );
            }
            e
        })?;
        if !config.is_empty() {
            admin.execute(&grants("REVOKE", &config, "FROM")).await?;
        }
        self.phase("setting owners", |_| {});
        // Large objects are data to pg_restore: their owners are not in the
        // schema-only text, but in their own entries'.
        let mut statements = statements;
        let blobs: Vec<&TocEntry> =
            toc.iter().filter(|e| e.kind == "BLOB" || e.kind == "LARGE OBJECT").collect();
        if !blobs.is_empty() {
            let list = self.list_file("large-objects", &blobs)?;
            let sql = self.tool_output(&["-f", "-", "--use-list", &list.display().to_string()], path).await?;
            statements.extend(read_statements(&sql, "large objects")?);
        }
        let (owned, others) = archive::ownerships(&statements);
        self.set_owners(&admin, &owned, &named, &mut imported).await?;
        if others > 0 {
            imported.not_carried.push(format!(
                "owners of {others} operators, collations, text search and other objects: they belong to {OWNER_ROLE}"
            ));
        }
        self.phase("checking", |_| {});
        if named.contains(AGENT_ROLE) {
            admin
                .execute(&format!(
                    "REASSIGN OWNED BY {AGENT_ROLE} TO {OWNER_ROLE}; DROP OWNED BY {AGENT_ROLE}; DROP ROLE {AGENT_ROLE};"
                ))
                .await?;
        }
        check_nothing_runs_as_a_superuser(&admin, &imported.roles).await?;
        Ok((imported, shaped))
    }

    /// Gives each object the owner its dump names, as the admin. Only what the
    /// restore made changes hands: objects the owner role owns, outside
    /// PostgreSQL's schemas, not an extension's. The object is found by its name
    /// parts, passed as parameters and compared as values, and named back by
    /// the server, so no text of the dump is ever run; owners must be roles this
    /// import made or the owner role.
    async fn set_owners(
        &self,
        admin: &Admin,
        owned: &[archive::Ownership],
        named: &BTreeSet<String>,
        imported: &mut Imported,
    ) -> Result<()> {
        let client = admin.client();
        let mut sql = String::new();
        let mut unresolved = 0;
        // Only what the restore made can change hands: objects the owner role
        // owns, outside PostgreSQL's schemas, not an extension's. A dump naming
        // `pg_catalog.lo_export` (or Airlock's own objects) finds nothing.
        let made = |class: &str, alias: &str, owner: &str| {
            format!(
                "{alias}.{owner} = '{OWNER_ROLE}'::pg_catalog.regrole AND {SYSTEM_SCHEMAS}
                 AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend d WHERE d.objid = {alias}.oid
                                 AND d.classid = 'pg_catalog.{class}'::pg_catalog.regclass AND d.deptype = 'e')"
            )
        };
        for o in owned {
            let allowed =
                o.owner == OWNER_ROLE || (named.contains(&o.owner) && !o.owner.starts_with("airlock_"));
            if !allowed {
                continue;
            }
            // The object is found by its parts, compared as values: nothing of
            // the dump is parsed by the server, so no name can make it fail.
            let (parts, args) = archive::name_parts(&o.identity);
            let (schema, name) = match parts.as_slice() {
                [schema, name] => (schema.clone(), name.clone()),
                [name] => (String::new(), name.clone()),
                _ => continue,
            };
            let args = args.unwrap_or_default();
            let lookup = match o.kind.as_str() {
                "TABLE" | "VIEW" | "MATERIALIZED VIEW" | "SEQUENCE" | "FOREIGN TABLE" => format!(
                    "SELECT CASE c.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW' WHEN 'S' THEN 'SEQUENCE'
                                           WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END, c.oid::pg_catalog.regclass::text
                       FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                      WHERE n.nspname = $1 AND c.relname = $2 AND $3 = '' AND {}",
                    made("pg_class", "c", "relowner")
                ),
                "FUNCTION" | "PROCEDURE" | "AGGREGATE" => format!(
                    "SELECT CASE p.prokind WHEN 'p' THEN 'PROCEDURE' WHEN 'a' THEN 'AGGREGATE' ELSE 'FUNCTION' END,
                            p.oid::pg_catalog.regprocedure::text
                       FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
                      WHERE n.nspname = $1 AND p.proname = $2
                        AND pg_catalog.pg_get_function_identity_arguments(p.oid) = $3 AND {}",
                    made("pg_proc", "p", "proowner")
                ),
                "TYPE" | "DOMAIN" => format!(
                    "SELECT CASE t.typtype WHEN 'd' THEN 'DOMAIN' ELSE 'TYPE' END, t.oid::pg_catalog.regtype::text
                       FROM pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
                      WHERE n.nspname = $1 AND t.typname = $2 AND $3 = '' AND {}",
                    made("pg_type", "t", "typowner")
                ),
                // `public` belongs to the database's owner until it is given away.
                "SCHEMA" => format!(
                    "SELECT 'SCHEMA', pg_catalog.quote_ident(n.nspname) FROM pg_catalog.pg_namespace n
                      WHERE $1 = '' AND n.nspname = $2 AND $3 = ''
                        AND ({} OR n.nspname = 'public' AND n.nspowner = pg_catalog.to_regrole('pg_database_owner'))",
                    made("pg_namespace", "n", "nspowner")
                ),
                "LARGE OBJECT" => format!(
                    "SELECT 'LARGE OBJECT', l.oid::text FROM pg_catalog.pg_largeobject_metadata l
                      WHERE $1 = '' AND l.oid::text = $2 AND $3 = '' AND l.lomowner = '{OWNER_ROLE}'::pg_catalog.regrole"
                ),
                _ => continue,
            };
            let row = client
                .query_opt(&lookup, &[&schema, &name, &args])
                .await
                .map_err(|e| Error::postgres(airlock_postgres::admin::describe(&e)))?;
            match row {
                Some(r) => {
                    let (kind, name): (String, String) = (r.cell(0)?, r.cell(1)?);
                    sql.push_str(&format!("ALTER {kind} {name} OWNER TO {};\n", quote_ident(&o.owner)));
                }
                None => unresolved += 1,
            }
        }
        if unresolved > 0 {
            imported.not_carried.push(format!(
                "owners of {unresolved} objects the dump names but the restore did not make \
                 (PostgreSQL's, an extension's, or absent): left as they are"
            ));
        }
        if !sql.is_empty() {
            admin.execute(&sql).await?;
        }
        Ok(())
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
                imported
                    .not_carried
                    .push(format!("role {role} is a superuser in the source: created without it"));
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
            if group.starts_with("pg_") || facts.and_then(|f| f.roles.get(group)).is_some_and(|a| a.superuser)
            {
                imported
                    .not_carried
                    .push(format!("{member}'s membership of {group}: it reaches beyond the database"));
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

    /// The extensions of `wanted` the build may install, itself and every
    /// extension it needs (`CASCADE` would install them): the others are left
    /// out, each with a note.
    async fn contained_extensions(
        &self,
        admin: &Admin,
        wanted: Vec<archive::DumpedExtension>,
        imported: &mut Imported,
    ) -> Result<Vec<archive::DumpedExtension>> {
        let mut kept = Vec::new();
        for ext in wanted {
            let blocked = match self.allowed.allows(&ext.name) {
                false => Some(None),
                true => required_extensions(admin, &ext.name)
                    .await?
                    .into_iter()
                    .find(|needed| !self.allowed.allows(needed))
                    .map(Some),
            };
            match blocked {
                None => kept.push(ext),
                Some(because) => {
                    imported
                        .not_carried
                        .push(airlock_postgres::extensions::Allowed::left_out(&ext.name, because.as_deref()));
                    imported.left_out_extensions.push(ext.name);
                }
            }
        }
        Ok(kept)
    }

    /// Fails, naming the packages, when the host lacks an extension the source uses.
    async fn check_available(&self, admin: &Admin, dumped: &[archive::DumpedExtension]) -> Result<()> {
        let available: BTreeSet<String> = admin
            .client()
            .query("SELECT name::text FROM pg_catalog.pg_available_extensions", &[])
            .await
            .map_err(|e| Error::postgres(airlock_postgres::admin::describe(&e)))?
            .iter()
            .map(|r| r.cell(0))
            .collect::<Result<_>>()?;
        let major = self.major;
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
                match self.installed_build {
                    None => format!(
                        "install {} (`apt-get install {}`), then build again; `airlock doctor` lists the extensions available",
                        packages.iter().cloned().collect::<Vec<_>>().join(", "),
                        packages.iter().cloned().collect::<Vec<_>>().join(" ")
                    ),
                    Some(system) => {
                        let packages: BTreeSet<String> =
                            missing.iter().map(|e| package_for(&e.name, system)).collect();
                        format!(
                            "PostgreSQL {major} here is `airlock postgres install`'s build, which carries PostgreSQL's own \
                             extensions only: build the golden on the host's PostgreSQL {system} instead (`--postgres \
                             {system}`, after `apt-get install {}`), or point `airlock serve --pg-bin` at a PostgreSQL {major} \
                             from your distribution that has them",
                            packages.iter().cloned().collect::<Vec<_>>().join(" ")
                        )
                    }
                },
            ));
        }
        Ok(())
    }

    async fn create_extensions(
        &self,
        admin: &Admin,
        dumped: &[archive::DumpedExtension],
        facts: Option<&SourceFacts>,
    ) -> Result<Vec<Extension>> {
        let major = self.major;
        let mut installed = Vec::new();
        for ext in dumped {
            let wanted = facts
                .and_then(|f| f.extensions.iter().find(|e| e.name == ext.name))
                .map(|e| e.version.clone());
            let base = format!(
                "CREATE EXTENSION IF NOT EXISTS {} WITH SCHEMA {}",
                quote_ident(&ext.name),
                quote_ident(&ext.schema)
            );
            let exact = match &wanted {
                Some(v) => admin
                    .execute(&format!("{base} VERSION '{}' CASCADE", v.replace('\'', "''")))
                    .await
                    .is_ok(),
                None => false,
            };
            if !exact {
                // The host has another version: install its default and let the
                // fidelity report name the difference.
                admin.execute(&format!("{base} CASCADE")).await.map_err(|e| {
                    Error::new(
                        ErrorCode::ExtensionMissing,
                        format!("installing extension {} failed: {}", ext.name, e.message),
                        format!(
                            "install {} for PostgreSQL {major}, then build again",
                            package_for(&ext.name, major)
                        ),
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
        let text: String = entries.iter().map(|e| format!("{}\n", e.line)).collect();
        self.loader.list_file(name, &text)
    }

    /// pg_restore with no database: reads the archive.
    async fn tool_output(&self, args: &[&str], path: &Path) -> Result<String> {
        let out = self.loader.tool("pg_restore").args(args).arg(self.loader.archive(path)).output().await?;
        if !out.status.success() {
            return Err(Error::new(
                ErrorCode::SourceFailed,
                format!(
                    "pg_restore could not read {}: {}",
                    self.named,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
                "check that the dump is complete and made by a pg_dump no newer than this host's newest client tools \
                 (`airlock postgres install 18` brings PostgreSQL 18's)",
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Restores the entries of `list` logged in as the owner role, every object
    /// its own (`--no-owner`: owners are set afterwards by
    /// [`Restore::set_owners`]); no statement of the archive can make its
    /// session a superuser's.
    async fn restore(&self, path: &Path, list: &Path, jobs: usize, sections: &[&str]) -> Result<()> {
        let mut cmd = self.loader.tool("pg_restore");
        cmd.args(["--exit-on-error", "--verbose", "--no-owner", "--dbname", DATABASE, "--use-list"])
            .arg(list);
        for section in sections {
            cmd.arg(format!("--section={section}"));
        }
        if jobs > 1 {
            cmd.arg(format!("--jobs={jobs}"));
        }
        cmd.arg(self.loader.archive(path)).stderr(Stdio::piped());
        let mut child = cmd.spawn()?;
        let stderr = child.stderr.take().expect("stderr is piped");
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        let mut errors = Vec::new();
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("processing data for table") {
                self.phase("restoring data", |p| p.tables_done += 1);
            } else if line.contains("creating INDEX") || line.contains("creating CONSTRAINT") {
                self.phase("indexing and granting", |_| {});
            } else if !line.starts_with("pg_restore: ") || line.to_ascii_lowercase().contains("error") {
                // Verbose progress aside, what pg_restore says is the error and its context.
                errors.push(line);
            }
        }
        let status = child.wait().await?;
        if status.success() {
            return Ok(());
        }
        if self.shaping.is_some_and(|s| s.shape.masks()) {
            // A masked build's errors name what failed, never a row: pg_restore's
            // DETAIL and CONTEXT lines quote the source's values, and so may its message.
            // What the server said after `ERROR:` is left out too (a check's
            // function may have raised it with the value in it); before it,
            // pg_restore names only what it was doing (`COPY failed for table "people"`).
            errors = errors
                .iter()
                .filter(|l| l.starts_with("pg_restore: error:"))
                .map(|l| l.split("ERROR:").next().unwrap_or_default().trim_end().to_owned())
                .collect();
            errors.push(
                "(the server's message and details are left out of a masked build's errors: they can quote the \
                 source's rows; build without --mask from a copy you may read, or run pg_restore yourself, to see them)"
                    .into(),
            );
        }
        let errors = errors.join("\n");
        let superuser = errors.contains("must be superuser")
            || errors.contains("permission denied for language")
            || errors.contains("permission denied for foreign-data wrapper")
            || errors.contains("pg_execute_server_program")
            || errors.contains("pg_read_server_files");
        Err(Error::new(
            ErrorCode::SourceFailed,
            format!("pg_restore of {} failed: {}", self.named, errors.trim()),
            if superuser {
                "the dump holds something only a superuser may create (a C or internal function, an untrusted \
                 language, a foreign server or a foreign table running a program); Airlock restores as the application's owner, never \
                 as a superuser: leave it out of the source (--exclude-table, --exclude-schema) and build again"
            } else {
                "check that the dump is complete and made by a pg_dump no newer than this host's PostgreSQL"
            },
        ))
    }
}

/// The statements of SQL pg_restore printed; `what` names it in the error.
fn read_statements(sql: &str, what: &str) -> Result<Vec<String>> {
    archive::statements(sql).map_err(|e| {
        Error::new(
            ErrorCode::SourceFailed,
            format!("the dump's {what} cannot be read: {}", e.message),
            "take the dump again with pg_dump",
        )
    })
}

/// Every extension `name` needs, however indirectly, as its default version's
/// control file says (what `CREATE EXTENSION ... CASCADE` would install).
async fn required_extensions(admin: &Admin, name: &str) -> Result<Vec<String>> {
    let rows = admin
        .client()
        .query(
            "WITH RECURSIVE needs(name) AS (
                 SELECT $1::text COLLATE \"C\"
               UNION
                 SELECT r.req::text FROM needs n
                   JOIN pg_catalog.pg_available_extensions a ON a.name = n.name
                   JOIN pg_catalog.pg_available_extension_versions v
                     ON v.name = a.name AND v.version = a.default_version
                   CROSS JOIN LATERAL pg_catalog.unnest(v.requires) AS r(req))
             SELECT name FROM needs WHERE name <> $1::text",
            &[&name],
        )
        .await
        .map_err(|e| Error::postgres(airlock_postgres::admin::describe(&e)))?;
    rows.iter().map(|r| r.try_get::<_, String>(0).map_err(|e| Error::postgres(e.to_string()))).collect()
}

/// Every extension's configuration tables and sequences (`pg_extension.extconfig`), named by the server.
async fn extension_config(admin: &Admin) -> Result<Vec<(String, bool)>> {
    Ok(admin
        .client()
        .query(
            "SELECT c.oid::pg_catalog.regclass::text, c.relkind = 'S' FROM pg_catalog.pg_extension e
               CROSS JOIN LATERAL pg_catalog.unnest(e.extconfig) AS x(oid)
               JOIN pg_catalog.pg_class c ON c.oid = x.oid",
            &[],
        )
        .await
        .map_err(|e| Error::postgres(airlock_postgres::admin::describe(&e)))?
        .iter()
        .map(|r| Ok((r.cell(0)?, r.cell(1)?)))
        .collect::<Result<_>>()?)
}

/// `GRANT`/`REVOKE` of what filling `config` needs, to or from the owner role.
fn grants(verb: &str, config: &[(String, bool)], to: &str) -> String {
    config
        .iter()
        .map(|(name, sequence)| {
            let what =
                if *sequence { "SELECT, UPDATE, USAGE ON SEQUENCE" } else { "SELECT, INSERT ON TABLE" };
            format!("{verb} {what} {name} {to} {OWNER_ROLE};\n")
        })
        .collect()
}

/// Refuses a golden that could run code with more than the owner role's
/// rights: an event trigger (it would run its function, which the agent may
/// replace, in the daemon's admin sessions); anything in PostgreSQL's own
/// schemas that does not belong to a superuser (a function there would stand in
/// for PostgreSQL's in the admin's sessions); a function, table or view outside
/// an extension that belongs to a superuser; a function in C or PostgreSQL's
/// internal language outside an extension; or an imported role with any
/// attribute beyond `INHERIT`/`BYPASSRLS`, or a member of any role but the
/// imported ones. The restore logs in as the owner role, so none of this can be
/// made by the dump; this is the backstop, run after every build from a source
/// (files and plain dumps too, with no imported roles).
pub(crate) async fn check_nothing_runs_as_a_superuser(admin: &Admin, imported: &[String]) -> Result<()> {
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
           JOIN pg_catalog.pg_language l ON l.oid = p.prolang
           WHERE (r.rolsuper OR l.lanname IN ('c', 'internal') OR NOT l.lanpltrusted AND l.lanname NOT IN ('sql'))
             AND {SYSTEM_SCHEMAS} AND {}
         UNION ALL
         SELECT 'schema ' || n.nspname || ' of PostgreSQL''s own' FROM pg_catalog.pg_namespace n
           JOIN pg_catalog.pg_roles r ON r.oid = n.nspowner
           WHERE NOT r.rolsuper AND (n.nspname IN ('pg_catalog', 'information_schema', 'pg_toast'))
         UNION ALL
         SELECT 'function ' || p.oid::pg_catalog.regprocedure::text || ' of PostgreSQL''s own' FROM pg_catalog.pg_proc p
           JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace JOIN pg_catalog.pg_roles r ON r.oid = p.proowner
           WHERE NOT r.rolsuper AND n.nspname IN ('pg_catalog', 'information_schema')
         UNION ALL
         SELECT 'relation ' || c.oid::pg_catalog.regclass::text || ' of PostgreSQL''s own' FROM pg_catalog.pg_class c
           JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace JOIN pg_catalog.pg_roles r ON r.oid = c.relowner
           WHERE NOT r.rolsuper AND n.nspname IN ('pg_catalog', 'information_schema')
         UNION ALL
         SELECT 'role ' || r.rolname || ' with more than INHERIT and BYPASSRLS' FROM pg_catalog.pg_roles r
           WHERE r.rolname = ANY($1) AND (r.rolsuper OR r.rolcreaterole OR r.rolcreatedb OR r.rolreplication OR r.rolcanlogin)
         UNION ALL
         SELECT 'role ' || m.rolname || ' a member of ' || g.rolname FROM pg_catalog.pg_auth_members a
           JOIN pg_catalog.pg_roles g ON g.oid = a.roleid JOIN pg_catalog.pg_roles m ON m.oid = a.member
           WHERE (m.rolname = ANY($1) OR m.rolname = '{OWNER_ROLE}') AND NOT g.rolname = ANY($1)
         LIMIT 20",
        not_extension("pg_class", "c.oid"),
        not_extension("pg_proc", "p.oid"),
    );
    let found: Vec<String> = admin
        .client()
        .query(&sql, &[&imported])
        .await
        .map_err(|e| Error::postgres(airlock_postgres::admin::describe(&e)))?
        .iter()
        .map(|r| r.cell(0))
        .collect::<Result<_>>()?;
    if found.is_empty() {
        return Ok(());
    }
    Err(Error::new(
        ErrorCode::SourceFailed,
        format!("the restored golden would give the agent more than the owner role's rights: {}", found.join(", ")),
        "give those objects to a role of the application's own in the source, or leave them out, then build again",
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
