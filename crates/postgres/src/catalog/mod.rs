//! What a database holds, read from its catalogs: tables with their columns,
//! constraints, indexes and triggers; views, functions, sequences, types and
//! extensions; and how many rows each table has.
//!
//! A golden's catalog is recorded when it is built (`catalog.json` beside its
//! manifest), so a sandbox's can be compared with it later without starting the
//! golden. Everything is read as the admin role with `search_path` pinned to
//! `pg_catalog`, so nothing an agent created can stand in for a catalog function.

pub mod describe;
pub mod diff;
pub mod objects;
pub mod planted;

use crate::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use airlock_core::error::{Error, Result};

/// The objects of one database, keyed by schema-qualified name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Catalog {
    /// Tables (ordinary, partitioned, foreign) by `schema.name`.
    pub tables: BTreeMap<String, Table>,
    /// Views and materialized views by `schema.name`: their definitions.
    pub views: BTreeMap<String, String>,
    /// Functions and procedures by `schema.name(argument types)`: a digest of
    /// their definition and their result type.
    pub functions: BTreeMap<String, String>,
    /// Sequences by `schema.name`: their data type.
    pub sequences: BTreeMap<String, String>,
    /// Enum, domain, composite and range types by `schema.name`: their labels,
    /// base type, fields or subtype.
    pub types: BTreeMap<String, String>,
    /// Installed extensions: their versions.
    pub extensions: BTreeMap<String, String>,
    /// The bodies of functions written in SQL (`LANGUAGE sql`, not `BEGIN
    /// ATOMIC`, at most [`SQL_BODY_MOST`] bytes), by the same names as
    /// [`Catalog::functions`], whose digests vouch for them: what a
    /// migration's check reads to tell a function that only computes from
    /// its arguments and the data from code that looks around. Absent in the
    /// records of goldens built before Airlock read them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sql_bodies: Option<BTreeMap<String, String>>,
    /// Every other entry the agent can make or change (rules, policies,
    /// grants, options, comments, casts, operators...: [`objects`]) by name.
    /// Absent in the records of goldens built before Airlock read them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objects: Option<BTreeMap<String, objects::Entry>>,
}

/// The longest body of a function written in SQL that [`Catalog::sql_bodies`] keeps.
pub const SQL_BODY_MOST: usize = 8192;

/// One table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Table {
    /// `table`, `partitioned table` or `foreign table`.
    pub kind: String,
    /// Columns in their order.
    pub columns: Vec<Column>,
    /// Constraints by name: `PRIMARY KEY (id)`, `FOREIGN KEY ...`, `CHECK ...`.
    pub constraints: BTreeMap<String, String>,
    /// Indexes by name: their `CREATE INDEX` statements.
    pub indexes: BTreeMap<String, String>,
    /// Triggers by name: their `CREATE TRIGGER` statements.
    pub triggers: BTreeMap<String, String>,
    /// The planner's row estimate (not compared: it moves with ANALYZE).
    #[serde(default)]
    pub row_estimate: i64,
}

/// One column.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Column {
    /// Its name.
    pub name: String,
    /// Its type as `format_type` spells it.
    #[serde(rename = "type")]
    pub type_name: String,
    /// Whether it may hold NULL.
    pub nullable: bool,
    /// Its default or generation expression, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
}

/// How many rows a table has.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RowCount {
    /// The count.
    pub rows: i64,
    /// Whether it was counted (true) or is the planner's estimate.
    pub exact: bool,
}

/// What a golden records at build time.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Snapshot {
    /// Its objects.
    pub catalog: Catalog,
    /// Each table's rows, by `schema.name`.
    pub rows: BTreeMap<String, RowCount>,
    /// The same of each other database the golden holds (one a promoted
    /// sandbox's agent created), by name. Empty in the records of goldens
    /// built before Airlock read them, and of goldens with one database.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub databases: BTreeMap<String, Snapshot>,
}

/// The databases of a server a client may connect to (templates and
/// databases closed to connections left out), by name.
pub async fn databases(client: &tokio_postgres::Client) -> Result<Vec<String>> {
    let rows = client
        .query(
            "SELECT datname::text FROM pg_catalog.pg_database
              WHERE datallowconn AND NOT datistemplate ORDER BY datname",
            &[],
        )
        .await
        .map_err(query_error)?;
    rows.iter().map(|r| r.cell(0)).collect()
}

/// The file a golden generation's snapshot is kept in.
pub fn snapshot_path(generation_dir: &Path) -> std::path::PathBuf {
    generation_dir.join("catalog.json")
}

impl Snapshot {
    /// Reads a golden generation's snapshot.
    pub fn load(generation_dir: &Path) -> Result<Snapshot> {
        let path = snapshot_path(generation_dir);
        let text = std::fs::read(&path).map_err(|_| {
            // Named as name@generation: a path would show agents where the data lives.
            let part =
                |p: Option<&Path>| p.and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned());
            let golden = part(generation_dir.parent()).unwrap_or_default();
            let generation = part(Some(generation_dir)).unwrap_or_default();
            Error::new(
                airlock_core::error::ErrorCode::GoldenNotFound,
                format!("golden {golden}@{generation} has no recorded catalog"),
                "it was built before Airlock recorded catalogs: build a new generation \
                 (`airlock golden refresh NAME`) and use forks of it",
            )
        })?;
        serde_json::from_slice(&text).map_err(|e| Error::internal(format!("{}: {e}", path.display())))
    }

    /// Writes it beside a generation's manifest.
    pub fn save(&self, generation_dir: &Path) -> Result<()> {
        let json = serde_json::to_vec(self).expect("snapshot serializes");
        std::fs::write(snapshot_path(generation_dir), json)?;
        Ok(())
    }
}

/// Picks one kind of named part (constraints, indexes, triggers) out of a table.
type TablePart = fn(&mut Table) -> &mut BTreeMap<String, String>;

/// Schemas that are not the application's: PostgreSQL's own and Airlock's
/// probe. Only a superuser can make a schema whose name starts with `pg_`, so no
/// agent can hide an object here by naming its schema like one of these.
/// The SQL condition that leaves out PostgreSQL's own schemas (alias `n` for pg_namespace).
pub const SYSTEM_SCHEMAS: &str = "n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\\_%'";

/// Objects an extension created are the extension's, not the application's.
fn not_from_extension(class: &str, oid: &str) -> String {
    format!(
        "NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = '{class}'::regclass \
         AND d.objid = {oid} AND d.deptype = 'e')"
    )
}

pub(crate) fn query_error(e: tokio_postgres::Error) -> Error {
    Error::postgres(format!("reading the catalog failed: {}", crate::admin::describe(&e)))
}

/// Settings that change how names, definitions and values read as text,
/// and the values they are read with.
const READING: &[(&str, &str)] = &[
    ("search_path", "pg_catalog, pg_temp"),
    ("quote_all_identifiers", "off"),
    ("TimeZone", "UTC"),
    ("DateStyle", "ISO, MDY"),
    ("IntervalStyle", "postgres"),
    ("extra_float_digits", "1"),
    ("bytea_output", "hex"),
];

/// A session's settings that change how names, definitions and values read
/// ([`READING`]), pinned while the catalog or rows are read and put back
/// after: the session may be a migration's, which set them as it pleased
/// (or had them from its role or database) and goes on with its own.
pub struct Pinned {
    was: Vec<String>,
}

impl Pinned {
    /// Pins the settings on `client`'s session.
    pub async fn pin(client: &tokio_postgres::Client) -> Result<Pinned> {
        let names: Vec<&str> = READING.iter().map(|(n, _)| *n).collect();
        let values: Vec<&str> = READING.iter().map(|(_, v)| *v).collect();
        let row = client
            .query_one(
                "SELECT pg_catalog.array_agg(pg_catalog.current_setting(n) ORDER BY o)
                   FROM pg_catalog.unnest($1::pg_catalog.text[]) WITH ORDINALITY AS u(n, o)",
                &[&names],
            )
            .await
            .map_err(query_error)?;
        client
            .execute(
                "SELECT pg_catalog.set_config(n, ($2::pg_catalog.text[])[o], false)
                   FROM pg_catalog.unnest($1::pg_catalog.text[]) WITH ORDINALITY AS u(n, o)",
                &[&names, &values],
            )
            .await
            .map_err(query_error)?;
        Ok(Pinned { was: row.cell(0)? })
    }

    /// Puts the session's own settings back.
    pub async fn restore(self, client: &tokio_postgres::Client) -> Result<()> {
        let names: Vec<&str> = READING.iter().map(|(n, _)| *n).collect();
        client
            .execute(
                "SELECT pg_catalog.set_config(n, ($2::pg_catalog.text[])[o], false)
                   FROM pg_catalog.unnest($1::pg_catalog.text[]) WITH ORDINALITY AS u(n, o)",
                &[&names, &self.was],
            )
            .await
            .map_err(query_error)?;
        Ok(())
    }
}

/// Reads every application object of the database `client` is connected to.
pub async fn read(client: &tokio_postgres::Client) -> Result<Catalog> {
    let pinned = Pinned::pin(client).await?;
    let mut catalog = Catalog::default();
    let mut by_oid: BTreeMap<i64, String> = BTreeMap::new();
    let rows = client
        .query(
            &format!(
                "SELECT c.oid::int8, pg_catalog.quote_ident(n.nspname), pg_catalog.quote_ident(c.relname), c.relkind::text, c.reltuples::int8,
                        CASE WHEN c.relkind IN ('v', 'm') THEN pg_get_viewdef(c.oid) END
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE c.relkind IN ('r', 'p', 'f', 'v', 'm', 'S') AND {SYSTEM_SCHEMAS}
                   AND {}",
                not_from_extension("pg_class", "c.oid")
            ),
            &[],
        )
        .await
        .map_err(query_error)?;
    for r in rows {
        let name = qualified(r.cell(1)?, r.cell(2)?);
        match r.cell::<String>(3)?.as_str() {
            "v" | "m" => {
                catalog.views.insert(name, r.cell::<Option<String>>(5)?.unwrap_or_default());
            }
            "S" => {
                catalog.sequences.insert(name, String::new());
            }
            kind => {
                let kind = match kind {
                    "p" => "partitioned table",
                    "f" => "foreign table",
                    _ => "table",
                };
                by_oid.insert(r.cell(0)?, name.clone());
                let table =
                    Table { kind: kind.into(), row_estimate: r.cell::<i64>(4)?, ..Default::default() };
                catalog.tables.insert(name, table);
            }
        }
    }
    let oids: Vec<i64> = by_oid.keys().copied().collect();

    let columns = client
        .query(
            "SELECT a.attrelid::int8, a.attname::text, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull,
                    CASE WHEN a.attidentity <> '' THEN 'generated ' || CASE a.attidentity WHEN 'a' THEN 'always' ELSE 'by default' END || ' as identity'
                         WHEN a.attgenerated <> '' THEN 'generated always as (' || pg_get_expr(d.adbin, d.adrelid) || ') stored'
                         ELSE pg_get_expr(d.adbin, d.adrelid) END
             FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
             WHERE a.attrelid::int8 = ANY($1) AND a.attnum > 0 AND NOT a.attisdropped
             ORDER BY a.attrelid, a.attnum",
            &[&oids],
        )
        .await
        .map_err(query_error)?;
    for r in columns {
        if let Some(t) = by_oid.get(&r.cell::<i64>(0)?).and_then(|n| catalog.tables.get_mut(n)) {
            t.columns.push(Column {
                name: r.cell(1)?,
                type_name: r.cell(2)?,
                nullable: r.cell(3)?,
                default: r.cell(4)?,
            });
        }
    }
    let parts: [(&str, TablePart); 3] = [
        (
            "SELECT conrelid::int8, conname::text, pg_get_constraintdef(oid) FROM pg_constraint
             WHERE conrelid::int8 = ANY($1)",
            |t| &mut t.constraints,
        ),
        (
            "SELECT i.indrelid::int8, c.relname::text, pg_get_indexdef(i.indexrelid)
             FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid::int8 = ANY($1)",
            |t| &mut t.indexes,
        ),
        (
            "SELECT tgrelid::int8, tgname::text, pg_get_triggerdef(oid) FROM pg_trigger
             WHERE tgrelid::int8 = ANY($1) AND NOT tgisinternal",
            |t| &mut t.triggers,
        ),
    ];
    // Each query gives (table, name, definition) rows for one kind of table part.
    for (sql, field) in parts {
        for r in client.query(sql, &[&oids]).await.map_err(query_error)? {
            if let Some(t) = by_oid.get(&r.cell::<i64>(0)?).and_then(|n| catalog.tables.get_mut(n)) {
                // A part dropped while it is read prints as NULL: it is gone.
                if let Some(definition) = r.cell::<Option<String>>(2)? {
                    field(t).insert(r.cell(1)?, definition);
                }
            }
        }
    }
    let functions = client
        .query(
            &format!(
                "SELECT pg_catalog.quote_ident(n.nspname), pg_catalog.quote_ident(p.proname), pg_get_function_identity_arguments(p.oid),
                        coalesce(pg_get_function_result(p.oid), 'procedure'),
                        CASE WHEN p.prokind IN ('f', 'p') THEN md5(pg_get_functiondef(p.oid)) ELSE '' END,
                        CASE WHEN l.lanname = 'sql' AND p.prokind = 'f' AND octet_length(p.prosrc) BETWEEN 1 AND {SQL_BODY_MOST}
                             THEN p.prosrc END
                 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                 JOIN pg_language l ON l.oid = p.prolang
                 WHERE {SYSTEM_SCHEMAS} AND {}",
                not_from_extension("pg_proc", "p.oid")
            ),
            &[],
        )
        .await
        .map_err(query_error)?;
    for r in functions {
        // A function dropped while it is read prints as NULL: it is gone.
        let (Some(arguments), Some(result), Some(body)) =
            (r.cell::<Option<String>>(2)?, r.cell::<Option<String>>(3)?, r.cell::<Option<String>>(4)?)
        else {
            continue;
        };
        let name = format!("{}({arguments})", qualified(r.cell(0)?, r.cell(1)?));
        if let Some(sql) = r.cell::<Option<String>>(5)? {
            catalog.sql_bodies.get_or_insert_with(BTreeMap::new).insert(name.clone(), sql);
        }
        catalog.functions.insert(name, format!("returns {result} [{body}]"));
    }
    // (Read, even when none is written in SQL: an empty map says so.)
    catalog.sql_bodies.get_or_insert_with(BTreeMap::new);
    let sequences = client
        .query("SELECT pg_catalog.quote_ident(schemaname), pg_catalog.quote_ident(sequencename), data_type::regtype::text FROM pg_sequences", &[])
        .await
        .map_err(query_error)?;
    for r in sequences {
        let name = qualified(r.cell(0)?, r.cell(1)?);
        if let Some(s) = catalog.sequences.get_mut(&name) {
            *s = r.cell(2)?;
        }
    }
    let types = client
        .query(
            &format!(
                "SELECT pg_catalog.quote_ident(n.nspname), pg_catalog.quote_ident(t.typname),
                        CASE t.typtype WHEN 'e' THEN 'enum (' || (SELECT string_agg(quote_literal(e.enumlabel), ', ' ORDER BY e.enumsortorder) FROM pg_enum e WHERE e.enumtypid = t.oid) || ')'
                                       WHEN 'c' THEN 'composite (' || (SELECT string_agg(quote_ident(a.attname) || ' ' || format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum) FROM pg_attribute a WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped) || ')'
                                       WHEN 'r' THEN 'range over ' || (SELECT format_type(r.rngsubtype, NULL) FROM pg_range r WHERE r.rngtypid = t.oid)
                                       ELSE 'domain over ' || format_type(t.typbasetype, t.typtypmod) END
                 FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
                 WHERE (t.typtype IN ('e', 'd', 'r') OR (t.typtype = 'c' AND (SELECT c.relkind FROM pg_class c WHERE c.oid = t.typrelid) = 'c'))
                   AND {SYSTEM_SCHEMAS} AND {}",
                not_from_extension("pg_type", "t.oid")
            ),
            &[],
        )
        .await
        .map_err(query_error)?;
    for r in types {
        catalog
            .types
            .insert(qualified(r.cell(0)?, r.cell(1)?), r.cell::<Option<String>>(2)?.unwrap_or_default());
    }
    let extensions = client
        .query("SELECT extname::text, extversion FROM pg_extension WHERE extname <> 'plpgsql'", &[])
        .await
        .map_err(query_error)?;
    for r in extensions {
        catalog.extensions.insert(r.cell(0)?, r.cell(1)?);
    }
    catalog.objects = Some(objects::read(client).await?);
    // The session may go on to run other work (a promoted migration, say).
    pinned.restore(client).await?;
    Ok(catalog)
}

/// Installs (if missing) the functions rows are counted and imaged with: they
/// belong to `airlock_reader`, a role that can read the one table each read
/// is granted in its own rolled-back transaction, every row of it (row
/// security policies, which the agent writes, would otherwise decide what is
/// counted), and do nothing else, and run as that role (`SECURITY DEFINER`,
/// search path pinned). Counting reads
/// relations the agent made, and a relation can run the agent's code (a table
/// turned into a view between the catalog read and the count, functions the
/// planner folds): inside this function that code runs as a role weaker than the
/// agent's, and PostgreSQL refuses `SET ROLE` and `SET SESSION AUTHORIZATION`
/// within a security-definer function, so it cannot climb back to the admin.
const READER_SQL: &str = "
    SET allow_system_table_mods = on;
    CREATE SCHEMA IF NOT EXISTS pg_airlock;
    RESET allow_system_table_mods;
    DO $$ BEGIN
      IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'airlock_reader') THEN
        CREATE ROLE airlock_reader NOLOGIN;
      END IF;
    END $$;
    ALTER ROLE airlock_reader BYPASSRLS;
    -- The reader may read the one table it counts or images, granted in that
    -- read's own rolled-back transaction, and nothing else: whatever of the
    -- agent's runs as the reader (a function the planner folds) reads no more
    -- than the agent could. (An older install made it a member of
    -- pg_read_all_data, which reads pg_authid too.)
    DO $$ BEGIN
      IF pg_catalog.to_regrole('pg_read_all_data') IS NOT NULL THEN
        REVOKE pg_read_all_data FROM airlock_reader;
      END IF;
    END $$;
    CREATE OR REPLACE FUNCTION pg_airlock.count_rows(relation pg_catalog.regclass) RETURNS bigint
      LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
      DECLARE n bigint;
      BEGIN
        -- The name is looked up again when the count runs, and the agent may
        -- have put a view under it by then: TABLESAMPLE is refused for anything
        -- but a table or materialized view before a plan exists, so nothing of
        -- the agent's runs here. SYSTEM (100) reads every block.
        EXECUTE pg_catalog.format('SELECT count(*) FROM ONLY %s TABLESAMPLE SYSTEM (100)', relation) INTO n;
        -- Counted under its name, it must still be the relation asked about.
        IF pg_catalog.to_regclass(relation::text) IS DISTINCT FROM relation THEN
          RAISE EXCEPTION 'relation % changed while it was counted', relation;
        END IF;
        RETURN n;
      END $$;
    ALTER FUNCTION pg_airlock.count_rows(pg_catalog.regclass) OWNER TO airlock_reader;
    REVOKE ALL ON FUNCTION pg_airlock.count_rows(pg_catalog.regclass) FROM PUBLIC;
    -- Each row's key and digest, as the daemon writes their expressions
    -- (from quoted column names): a migration test's image of a table.
    CREATE OR REPLACE FUNCTION pg_airlock.row_image(relation pg_catalog.regclass, key text, digest text, most bigint)
      RETURNS TABLE (k text, d text)
      LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
      BEGIN
        RETURN QUERY EXECUTE pg_catalog.format('SELECT (%s)::text, (%s)::text FROM %s t LIMIT %s', key, digest, relation, most);
        IF pg_catalog.to_regclass(relation::text) IS DISTINCT FROM relation THEN
          RAISE EXCEPTION 'relation % changed while it was read', relation;
        END IF;
      END $$;
    ALTER FUNCTION pg_airlock.row_image(pg_catalog.regclass, text, text, bigint) OWNER TO airlock_reader;
    REVOKE ALL ON FUNCTION pg_airlock.row_image(pg_catalog.regclass, text, text, bigint) FROM PUBLIC;
    -- Each distinct value of one expression (from a quoted column name), as
    -- its digest, the start of its text and how many rows hold it: how a
    -- migration test compares a column whose rows no key pairs.
    CREATE OR REPLACE FUNCTION pg_airlock.value_counts(relation pg_catalog.regclass, value text, shown integer, most bigint)
      RETURNS TABLE (d text, s text, n bigint)
      LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
      BEGIN
        RETURN QUERY EXECUTE pg_catalog.format(
          'SELECT pg_catalog.md5(v), pg_catalog.left(pg_catalog.min(v), %s), pg_catalog.count(*) FROM (SELECT (%s)::text AS v FROM %s t) s GROUP BY 1 LIMIT %s',
          shown, value, relation, most);
        IF pg_catalog.to_regclass(relation::text) IS DISTINCT FROM relation THEN
          RAISE EXCEPTION 'relation % changed while it was read', relation;
        END IF;
      END $$;
    ALTER FUNCTION pg_airlock.value_counts(pg_catalog.regclass, text, integer, bigint) OWNER TO airlock_reader;
    REVOKE ALL ON FUNCTION pg_airlock.value_counts(pg_catalog.regclass, text, integer, bigint) FROM PUBLIC;
    -- The rows of `relation` whose columns `keys` are all set and match no
    -- row of `parent` on its columns `parent_keys`: what a foreign key left
    -- NOT VALID does not hold. Keys of PostgreSQL's own types, compared with
    -- its own operator (the caller checks the types).
    CREATE OR REPLACE FUNCTION pg_airlock.orphan_count(relation pg_catalog.regclass, keys text[],
                                                       parent pg_catalog.regclass, parent_keys text[])
      RETURNS bigint
      LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
      DECLARE
        n bigint;
        set_ text;
        matched text;
      BEGIN
        SELECT pg_catalog.string_agg(pg_catalog.format('c.%I IS NOT NULL', k), ' AND '),
               pg_catalog.string_agg(pg_catalog.format('p.%I OPERATOR(pg_catalog.=) c.%I', parent_keys[o], k), ' AND ')
          INTO set_, matched
          FROM pg_catalog.unnest(keys) WITH ORDINALITY AS u(k, o);
        EXECUTE pg_catalog.format('SELECT pg_catalog.count(*) FROM %s c WHERE %s AND NOT EXISTS (SELECT FROM %s p WHERE %s)',
                                  relation, set_, parent, matched) INTO n;
        IF pg_catalog.to_regclass(relation::text) IS DISTINCT FROM relation
           OR pg_catalog.to_regclass(parent::text) IS DISTINCT FROM parent THEN
          RAISE EXCEPTION 'relation % or % changed while it was read', relation, parent;
        END IF;
        RETURN n;
      END $$;
    ALTER FUNCTION pg_airlock.orphan_count(pg_catalog.regclass, text[], pg_catalog.regclass, text[]) OWNER TO airlock_reader;
    REVOKE ALL ON FUNCTION pg_airlock.orphan_count(pg_catalog.regclass, text[], pg_catalog.regclass, text[]) FROM PUBLIC;";

/// What lets the reader read one table (its schema, then the table), granted
/// in the read's own transaction and rolled back with it.
pub fn reader_grant(qualified: &str) -> String {
    let schema = quote_ident(&split_qualified(qualified).0);
    format!("GRANT USAGE ON SCHEMA {schema} TO airlock_reader; GRANT SELECT ON {qualified} TO airlock_reader")
}

/// Installs the reader's functions ([`READER_SQL`]) where they are missing
/// (or the reader is a member of any role); whether SELECT must be granted
/// to the reader on each table read (always, now).
pub async fn ensure_reader(client: &tokio_postgres::Client) -> Result<bool> {
    let installed = client
        .query_one(
            "SELECT coalesce((SELECT p.prosrc LIKE '%TABLESAMPLE%' FROM pg_catalog.pg_proc p
                               WHERE p.oid = pg_catalog.to_regprocedure('pg_airlock.count_rows(pg_catalog.regclass)')), false)
                    AND pg_catalog.to_regprocedure('pg_airlock.row_image(pg_catalog.regclass, text, text, bigint)') IS NOT NULL
                    AND pg_catalog.to_regprocedure('pg_airlock.value_counts(pg_catalog.regclass, text, integer, bigint)') IS NOT NULL
                    AND pg_catalog.to_regprocedure('pg_airlock.orphan_count(pg_catalog.regclass, text[], pg_catalog.regclass, text[])') IS NOT NULL
                    AND (SELECT rolbypassrls FROM pg_catalog.pg_roles WHERE rolname = 'airlock_reader')
                    AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_auth_members m
                                      JOIN pg_catalog.pg_roles r ON r.oid = m.member
                                     WHERE r.rolname = 'airlock_reader')",
            &[],
        )
        .await
        .map_err(query_error)?
        .cell::<bool>(0)?;
    if !installed {
        client.batch_execute(READER_SQL).await.map_err(query_error)?;
    }
    Ok(true)
}

/// Counts each table's rows, giving up on a table after `per_table` and on
/// counting at all after `budget` (the planner's estimate stands in).
///
/// The admin never reads an application table itself: counting happens on an
/// admin session of its own, closed afterwards, each count inside the reader
/// function ([`READER_SQL`]) in a transaction that is rolled back, so nothing the
/// agent's code might set in it outlives the count.
pub async fn count_rows(
    dir: &airlock_core::layout::InstanceDir,
    postmaster: i32,
    database: &str,
    catalog: &Catalog,
    per_table: Duration,
    budget: Duration,
) -> BTreeMap<String, RowCount> {
    let began = Instant::now();
    let estimates =
        || catalog.tables.iter().map(|(n, t)| (n.clone(), RowCount { rows: t.row_estimate, exact: false }));
    let Ok(admin) = crate::admin::Admin::connect(dir, database, postmaster).await else {
        return estimates().collect();
    };
    let client = admin.client();
    let Ok(grant_each) = ensure_reader(client).await else {
        return estimates().collect();
    };
    let mut counts = BTreeMap::new();
    for (name, table) in &catalog.tables {
        let estimate = RowCount { rows: table.row_estimate, exact: false };
        if table.kind == "foreign table" || began.elapsed() > budget {
            counts.insert(name.clone(), estimate);
            continue;
        }
        // Names are kept as PostgreSQL quotes them: as SQL already.
        let qualified = name.clone();
        let counted = async {
            client
                .batch_execute(&format!("BEGIN; SET LOCAL statement_timeout = {}", per_table.as_millis()))
                .await?;
            if grant_each {
                client.batch_execute(&reader_grant(&qualified)).await?;
            }
            let row = client
                .query_one("SELECT pg_airlock.count_rows($1::text::pg_catalog.regclass)", &[&qualified])
                .await;
            client.batch_execute("ROLLBACK").await?;
            row
        };
        let count = match counted.await {
            Ok(row) => match row.cell(0) {
                Ok(rows) => RowCount { rows, exact: true },
                Err(_) => estimate,
            },
            Err(_) => {
                let _ = client.batch_execute("ROLLBACK").await;
                estimate
            }
        };
        counts.insert(name.clone(), count);
    }
    counts
}

/// Whether the server's statistics were thrown away after it started: PostgreSQL
/// discards them when it recovers from a crash (a backend killed for memory, say,
/// which the agent can bring about), and then stamps its shared counters' reset
/// time. A fork starts from its golden's saved statistics, so on a server that
/// has not crashed that time is older than the server.
pub async fn counters_lost(client: &tokio_postgres::Client) -> Result<bool> {
    let row = client
        .query_one(
            "SELECT coalesce((SELECT stats_reset FROM pg_catalog.pg_stat_bgwriter) > pg_catalog.pg_postmaster_start_time(), true)",
            &[],
        )
        .await
        .map_err(query_error)?;
    Ok(row.cell(0)?)
}

/// Rows inserted, updated and deleted per table since the fork, every attempt
/// counted (the server counts rolled-back work too), with the changes that
/// committed in all: the server's count of changes since the last ANALYZE
/// counts committed work only, and holds from the fork (whose statistics
/// start at zero) until an ANALYZE, after which it is absent.
pub async fn attempted_and_committed(
    client: &tokio_postgres::Client,
) -> Result<BTreeMap<String, ([i64; 3], Option<i64>)>> {
    let rows = client
        .query(
            "SELECT pg_catalog.quote_ident(schemaname), pg_catalog.quote_ident(relname), n_tup_ins, n_tup_upd, n_tup_del,
                    CASE WHEN last_analyze IS NULL AND last_autoanalyze IS NULL THEN n_mod_since_analyze END
               FROM pg_catalog.pg_stat_user_tables",
            &[],
        )
        .await
        .map_err(query_error)?;
    Ok(rows
        .into_iter()
        .map(|r| Ok((qualified(r.cell(0)?, r.cell(1)?), ([r.cell(2)?, r.cell(3)?, r.cell(4)?], r.cell(5)?))))
        .collect::<Result<_>>()?)
}

/// The committed inserts, updates and deletes, from the attempts `[i, u, d]`,
/// the committed total `m` and the committed net of inserts less deletes
/// `live` (rows now less rows at the fork): the split with the fewest
/// committed deletes that fits them all (the attempts when none does).
pub fn committed(attempted: [i64; 3], m: i64, live: i64) -> [i64; 3] {
    let [i, u, d] = attempted;
    if m >= i + u + d {
        return attempted;
    }
    let least = 0.max(-live).max((m - live - u + 1).div_euclid(2));
    let most = d.min(i - live).min((m - live).div_euclid(2));
    if least > most {
        return attempted;
    }
    let (ci, cd) = (live + least, least);
    [ci, m - ci - cd, cd]
}

/// Tables whose storage was rewritten since the fork (ALTER COLUMN TYPE,
/// VACUUM FULL, CLUSTER, TRUNCATE, REFRESH): any row's contents may differ
/// though no counter moved. A rewrite writes a new file, and a new file's
/// number is never one the fork started with (the server picks numbers no file
/// in the directory has), so a table whose file is absent from the golden's
/// directory was rewritten — or made since the fork.
pub async fn rewritten(client: &tokio_postgres::Client, golden_pgdata: &Path) -> Result<BTreeSet<String>> {
    let rows = client
        .query(
            &format!(
                "SELECT pg_catalog.quote_ident(n.nspname), pg_catalog.quote_ident(c.relname), pg_catalog.pg_relation_filepath(c.oid)
                   FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                  WHERE c.relkind IN ('r', 'm') AND {SYSTEM_SCHEMAS}"
            ),
            &[],
        )
        .await
        .map_err(query_error)?;
    let mut out = BTreeSet::new();
    for r in rows {
        let Some(file) = r.cell::<Option<String>>(2)? else { continue };
        // The golden's directory is root's and never changes; the path is the
        // server's own (`base/DB/FILE`), taken only if it stays inside.
        let inside = Path::new(&file).components().all(|c| matches!(c, std::path::Component::Normal(_)));
        if inside && std::fs::symlink_metadata(golden_pgdata.join(&file)).is_err() {
            out.insert(qualified(r.cell(0)?, r.cell(1)?));
        }
    }
    Ok(out)
}

/// `schema.name`.
/// `schema.name` from parts PostgreSQL quoted (`quote_ident`): keys that never
/// merge two objects (a table `c` in schema `a.b` is `"a.b".c`, a table `b.c`
/// in `a` is `a."b.c"`), and SQL as they stand.
fn qualified(schema: String, name: String) -> String {
    format!("{schema}.{name}")
}

/// The schema and name of a qualified name as [`qualified`] makes them (either
/// part may be quoted, `""` inside a quoted part being one `"`), unquoted; a
/// name with no schema is `public`'s.
pub fn split_qualified(name: &str) -> (String, String) {
    let mut parts = Vec::new();
    let mut part = String::new();
    let mut chars = name.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                part.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            '.' if !quoted && parts.is_empty() => parts.push(std::mem::take(&mut part)),
            c => part.push(c),
        }
    }
    match parts.pop() {
        Some(schema) => (schema, part),
        None => ("public".into(), part),
    }
}

/// An identifier quoted for SQL.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A name without its `public.` schema, as people write it.
pub fn short_name(name: &str) -> &str {
    name.strip_prefix("public.").unwrap_or(name)
}

#[cfg(test)]
mod name_tests {
    use super::split_qualified;

    #[test]
    fn qualified_names_split_back_into_their_parts() {
        assert_eq!(split_qualified("public.orders"), ("public".into(), "orders".into()));
        assert_eq!(split_qualified("\"a.b\".c"), ("a.b".into(), "c".into()));
        assert_eq!(split_qualified("a.\"b.c\""), ("a".into(), "b.c".into()));
        assert_eq!(split_qualified("\"x\"\"y\".\"Z\""), ("x\"y".into(), "Z".into()));
        assert_eq!(split_qualified("orders"), ("public".into(), "orders".into()));
    }
}

#[cfg(test)]
mod committed_tests {
    #[test]
    fn rolled_back_changes_are_left_out() {
        // One INSERT rolled back: nothing committed.
        assert_eq!(super::committed([1, 0, 0], 0, 0), [0, 0, 0]);
        // 5 inserted and kept, 3 inserted and rolled back.
        assert_eq!(super::committed([8, 0, 0], 5, 5), [5, 0, 0]);
        // 2 updated and kept, a DELETE of 4 rolled back.
        assert_eq!(super::committed([0, 2, 4], 2, 0), [0, 2, 0]);
        // Everything committed.
        assert_eq!(super::committed([3, 2, 1], 6, 2), [3, 2, 1]);
    }
}
