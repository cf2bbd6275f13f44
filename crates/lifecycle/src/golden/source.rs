//! A live source database, read in the one snapshot its dump is taken from:
//! its version, extensions, the attributes and memberships of the roles its
//! objects name, its catalog and its rows per table. pg_dump takes the same
//! snapshot (`--snapshot`), so the fidelity report compares like with like on
//! a source that keeps changing.

use airlock_postgres::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use airlock_core::error::{Error, Result};
use airlock_postgres::catalog::{self, Catalog};
use airlock_postgres::imported::Extension;

/// What the source says of a role its objects name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleAttributes {
    /// Whether it inherits its groups' privileges.
    pub inherit: bool,
    /// Whether row security policies pass it by.
    pub bypassrls: bool,
    /// Whether it is a superuser there (never carried).
    pub superuser: bool,
}

/// What the source holds, as of the dump's snapshot.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SourceFacts {
    /// `server_version`, e.g. `15.8`.
    pub server_version: String,
    /// `server_version_num`, e.g. 150008.
    pub server_version_num: i32,
    /// Installed extensions but plpgsql, in the order they were created.
    pub extensions: Vec<Extension>,
    /// Attributes of every role the source has (read for the roles a dump names).
    pub roles: BTreeMap<String, RoleAttributes>,
    /// `(group, member)` pairs among the source's roles.
    pub memberships: Vec<(String, String)>,
    /// The application objects.
    pub catalog: Catalog,
    /// Rows per table (`schema.name`), counted in the snapshot.
    pub rows: BTreeMap<String, i64>,
}

/// The source's PostgreSQL major version (17 for 17.2).
pub async fn major(dsn: &str) -> Result<u32> {
    let client = airlock_postgres::target::connect_to(dsn, "source").await?;
    let row = client
        .query_one("SELECT pg_catalog.current_setting('server_version_num')", &[])
        .await
        .map_err(failed)?;
    let number: String = row.cell(0)?;
    Ok(number.parse::<u32>().unwrap_or(0) / 10000)
}

/// A session on the source holding the snapshot a dump is taken from.
pub struct SourceSession {
    client: tokio_postgres::Client,
    /// The exported snapshot's id, for `pg_dump --snapshot`.
    pub snapshot: String,
}

impl SourceSession {
    /// Connects, opens a repeatable-read, read-only transaction and exports its snapshot.
    pub async fn open(dsn: &str) -> Result<SourceSession> {
        let client = airlock_postgres::target::connect_to(dsn, "source").await?;
        client
            .batch_execute(
                "SET search_path = pg_catalog, pg_temp; \
                 BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY",
            )
            .await
            .map_err(failed)?;
        let snapshot =
            client.query_one("SELECT pg_catalog.pg_export_snapshot()", &[]).await.map_err(failed)?.cell(0)?;
        Ok(SourceSession { client, snapshot })
    }

    /// How many tables and materialized views hold data (what pg_dump dumps one by one).
    pub async fn tables_with_data(&self) -> Result<u64> {
        let sql = format!(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.relkind IN ('r', 'm') AND {}",
            catalog::SYSTEM_SCHEMAS
        );
        let n: i64 = self.client.query_one(&sql, &[]).await.map_err(failed)?.cell(0)?;
        Ok(n as u64)
    }

    /// Reads everything the fidelity report compares, in the snapshot; tables
    /// that `skip` says were left out are not counted.
    pub async fn facts(&self, skip: impl Fn(&str) -> bool) -> Result<SourceFacts> {
        let c = &self.client;
        let row = c
            .query_one(
                "SELECT current_setting('server_version'), current_setting('server_version_num')::int",
                &[],
            )
            .await
            .map_err(failed)?;
        let mut facts = SourceFacts {
            server_version: row.cell(0)?,
            server_version_num: row.cell(1)?,
            ..Default::default()
        };
        for r in c
            .query(
                "SELECT e.extname::text, e.extversion, n.nspname::text FROM pg_extension e \
                 JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname <> 'plpgsql' ORDER BY e.oid",
                &[],
            )
            .await
            .map_err(failed)?
        {
            facts.extensions.push(Extension { name: r.cell(0)?, version: r.cell(1)?, schema: r.cell(2)? });
        }
        for r in c
            .query("SELECT rolname::text, rolinherit, rolbypassrls, rolsuper FROM pg_roles", &[])
            .await
            .map_err(failed)?
        {
            facts.roles.insert(
                r.cell(0)?,
                RoleAttributes { inherit: r.cell(1)?, bypassrls: r.cell(2)?, superuser: r.cell(3)? },
            );
        }
        for r in c
            .query(
                "SELECT g.rolname::text, m.rolname::text FROM pg_auth_members a \
                 JOIN pg_roles g ON g.oid = a.roleid JOIN pg_roles m ON m.oid = a.member",
                &[],
            )
            .await
            .map_err(failed)?
        {
            facts.memberships.push((r.cell(0)?, r.cell(1)?));
        }
        facts.catalog = catalog::read(c).await?;
        for (name, table) in &facts.catalog.tables {
            if table.kind == "foreign table" || skip(name) {
                continue;
            }
            // Catalog names are as PostgreSQL quotes them: SQL already.
            let sql = format!("SELECT count(*) FROM ONLY {name}");
            let n: i64 = c.query_one(&sql, &[]).await.map_err(failed)?.cell(0)?;
            facts.rows.insert(name.clone(), n);
        }
        Ok(facts)
    }

    /// Ends the snapshot's transaction.
    pub async fn close(self) {
        let _ = self.client.batch_execute("ROLLBACK").await;
    }
}

/// The roles among `named` that are members of a predefined role in the
/// source (`pg_read_server_files`...): such memberships are never carried.
pub fn predefined_memberships(facts: &SourceFacts, named: &BTreeSet<String>) -> Vec<(String, String)> {
    facts
        .memberships
        .iter()
        .filter(|(group, member)| group.starts_with("pg_") && named.contains(member))
        .cloned()
        .collect()
}

fn failed(e: tokio_postgres::Error) -> Error {
    Error::new(
        airlock_core::error::ErrorCode::SourceFailed,
        format!("reading the source failed: {}", airlock_postgres::admin::describe(&e)),
        "check that the source is reachable and that its user may read its catalogs and tables",
    )
}
