//! The measuring machinery a candidate's fork gets before the candidate runs, and
//! the readings taken after each statement.
//!
//! Installed by the admin role in schema `pg_airlock_probe`: a name the agent
//! can neither create beforehand nor imitate (PostgreSQL reserves the `pg_`
//! prefix to superusers, and the catalog reader skips every such schema), so a
//! candidate cannot take the probe's place or hide objects beside it. Two event
//! triggers log table rewrites (with PostgreSQL's reason) and dropped objects
//! (with whether a CASCADE reached them) into tables the agent role cannot write.
//!
//! The agent role may `SET ROLE` to the owner role it is a member of, so
//! both may take a reading.
//!
//! A reading is taken in the candidate's own session (its transaction's locks and
//! row counters are visible only there), but entirely inside `SECURITY DEFINER`
//! functions whose `search_path` is pinned to `pg_catalog, pg_temp`: the
//! statement the session sends names nothing but the probe's own function, so
//! no search path, function, operator or temporary table the candidate made can
//! change what a reading says.

use serde::Deserialize;

use airlock_core::dsn::{AGENT_ROLE, OWNER_ROLE};

/// The schema everything lives in.
pub const SCHEMA: &str = "pg_airlock_probe";

/// The rows a table's scans read, from a row of `pg_stat_xact_user_tables`:
/// its sequential scans' rows and the heap rows its index scans fetched, or,
/// where more, the index entries they returned (an index-only scan fetches
/// no heap row, so only its index counts it), those no more than the table
/// holds: the planner's own probes of an index's ends return entries too.
const SCANNED_XACT: &str = "greatest(coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0),
      least(coalesce(seq_tup_read, 0)
              + (SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(x.indexrelid)), 0)::int8
                   FROM pg_index x WHERE x.indrelid = relid),
            (SELECT greatest(c.reltuples, 0)::int8 FROM pg_class c WHERE c.oid = relid)))";

/// [`SCANNED_XACT`] for a row of `pg_stat_user_tables`, since the fork.
const SCANNED_CUMULATIVE: &str = "greatest(coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0),
      least(coalesce(seq_tup_read, 0)
              + (SELECT coalesce(sum(pg_stat_get_tuples_returned(x.indexrelid)), 0)::int8
                   FROM pg_index x WHERE x.indrelid = relid),
            (SELECT greatest(c.reltuples, 0)::int8 FROM pg_class c WHERE c.oid = relid)))";

/// Installs the machinery (run as the admin role).
pub fn install_sql() -> String {
    format!(
        "SET allow_system_table_mods = on;
         CREATE SCHEMA {SCHEMA};
         RESET allow_system_table_mods;
         CREATE TABLE {SCHEMA}.rewrites (id bigserial PRIMARY KEY, relid oid, relname text, reason int);
         CREATE TABLE {SCHEMA}.dropped (id bigserial PRIMARY KEY, object_type text, identity text,
                                        original bool, normal bool, is_temporary bool, relid oid);
         CREATE FUNCTION {SCHEMA}.log_rewrite() RETURNS event_trigger LANGUAGE plpgsql
           SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
           BEGIN
             INSERT INTO {SCHEMA}.rewrites (relid, relname, reason)
             SELECT pg_event_trigger_table_rewrite_oid(),
                    quote_ident(n.nspname) || '.' || quote_ident(c.relname), pg_event_trigger_table_rewrite_reason()
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE c.oid = pg_event_trigger_table_rewrite_oid();
           END $$;
         CREATE FUNCTION {SCHEMA}.log_drop() RETURNS event_trigger LANGUAGE plpgsql
           SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
           BEGIN
             INSERT INTO {SCHEMA}.dropped (object_type, identity, original, normal, is_temporary, relid)
             SELECT object_type, object_identity, original, normal, is_temporary,
                    CASE WHEN classid = 'pg_catalog.pg_class'::pg_catalog.regclass THEN objid END
             FROM pg_event_trigger_dropped_objects();
           END $$;
         CREATE EVENT TRIGGER airlock_probe_rewrite ON table_rewrite EXECUTE FUNCTION {SCHEMA}.log_rewrite();
         CREATE EVENT TRIGGER airlock_probe_drop ON sql_drop EXECUTE FUNCTION {SCHEMA}.log_drop();
         CREATE FUNCTION {SCHEMA}.reading(after_rewrite bigint, after_drop bigint, cumulative boolean) RETURNS text
           LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
           SELECT json_build_object(
             'probe', json_build_object(
               'rewrites', (SELECT coalesce(json_agg(json_build_object('id', id, 'relid', relid::int8,
                              'relname', relname, 'reason', reason) ORDER BY id), '[]')
                            FROM {SCHEMA}.rewrites WHERE id > after_rewrite),
               'dropped', (SELECT coalesce(json_agg(json_build_object('id', id, 'object_type', object_type,
                              'identity', identity, 'original', original, 'normal', normal,
                              'relid', relid::int8) ORDER BY id), '[]')
                           FROM {SCHEMA}.dropped WHERE id > after_drop AND NOT is_temporary)),
             'locks', (SELECT coalesce(json_agg(json_build_object('relid', l.relation::int8, 'mode', l.mode)), '[]')
                       FROM pg_locks l
                       WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation' AND l.granted),
             'relations', (SELECT coalesce(json_agg(json_build_object('relid', c.oid::int8,
                             'name', quote_ident(n.nspname) || '.' || quote_ident(c.relname), 'kind', c.relkind, 'filenode', c.relfilenode::int8,
                             'table', i.indrelid::int8, 'valid', i.indisvalid,
                             'not_null', (SELECT coalesce(array_agg(a.attnum::int8), '{{}}') FROM pg_attribute a
                                          WHERE a.attrelid = c.oid AND a.attnum > 0 AND a.attnotnull
                                            AND NOT a.attisdropped),
                             'columns', (SELECT coalesce(array_agg(a.attnum::int8), '{{}}') FROM pg_attribute a
                                         WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped))), '[]')
                           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                           LEFT JOIN pg_index i ON i.indexrelid = c.oid
                           WHERE c.relkind IN ('r', 'p', 'i', 'm', 'S')
                             AND n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\\_%'),
             'constraints', (SELECT coalesce(json_agg(json_build_object('oid', k.oid::int8, 'name', k.conname,
                               'relid', k.conrelid::int8, 'references', nullif(k.confrelid, 0)::int8,
                               'kind', k.contype, 'validated', k.convalidated)), '[]')
                             FROM pg_constraint k JOIN pg_namespace n ON n.oid = k.connamespace
                             WHERE k.contype IN ('f', 'c') AND k.conrelid <> 0
                               AND n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\\_%'),
             'rows', CASE WHEN cumulative
                       THEN (SELECT coalesce(json_agg(json_build_object('relid', relid::int8,
                               'ins', n_tup_ins, 'upd', n_tup_upd, 'del', n_tup_del,
                               'scanned', {SCANNED_CUMULATIVE})), '[]') FROM pg_stat_user_tables)
                       ELSE (SELECT coalesce(json_agg(json_build_object('relid', relid::int8,
                               'ins', n_tup_ins, 'upd', n_tup_upd, 'del', n_tup_del,
                               'scanned', {SCANNED_XACT})), '[]') FROM pg_stat_xact_user_tables)
                     END
           )::text $$;
         CREATE FUNCTION {SCHEMA}.transaction_rows() RETURNS text
           LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
           SELECT coalesce(json_agg(json_build_array(relid::int8, n_tup_ins, n_tup_upd, n_tup_del,
                                    {SCANNED_XACT})), '[]')::text
           FROM pg_stat_xact_user_tables $$;
         CREATE FUNCTION {SCHEMA}.flush_rows() RETURNS boolean
           LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
           BEGIN
             IF pg_catalog.current_setting('server_version_num')::pg_catalog.int4 OPERATOR(pg_catalog.<) 150000 THEN
               RETURN false;
             END IF;
             EXECUTE 'SELECT pg_catalog.pg_stat_force_next_flush()';
             RETURN true;
           END $$;
         REVOKE ALL ON SCHEMA {SCHEMA} FROM PUBLIC;
         REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {SCHEMA} FROM PUBLIC;
         GRANT USAGE ON SCHEMA {SCHEMA} TO {AGENT_ROLE}, {OWNER_ROLE};
         GRANT EXECUTE ON FUNCTION {SCHEMA}.reading(bigint, bigint, boolean), {SCHEMA}.transaction_rows(),
           {SCHEMA}.flush_rows()
           TO {AGENT_ROLE}, {OWNER_ROLE};"
    )
}

/// The one statement, run in the candidate's own session (inside its
/// transaction), that returns everything measured so far as one JSON text
/// value. Row counters are the transaction's own, or with `cumulative`
/// everything since the fork (the golden's statistics were reset when it was
/// built).
pub fn reading_sql(after_rewrite: i64, after_drop: i64, cumulative: bool) -> String {
    format!("SELECT {SCHEMA}.reading({after_rewrite}::pg_catalog.int8, {after_drop}::pg_catalog.int8, {cumulative})")
}

/// Asks the session to flush its row counters into the cumulative ones as
/// it goes idle after this statement (PostgreSQL 15 and later; `false`
/// before, whose counters reach the cumulative ones only in their own time).
pub fn flush_rows_sql() -> String {
    format!("SELECT {SCHEMA}.flush_rows()")
}

/// The open transaction's row counters per table, as JSON `[[relid, ins, upd, del], ...]`.
pub fn transaction_rows_sql() -> String {
    format!("SELECT {SCHEMA}.transaction_rows()")
}

/// What one reading returned.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Reading {
    /// The probe's logs since the last reading.
    pub probe: ProbeLog,
    /// Relation locks the session holds.
    pub locks: Vec<Lock>,
    /// Every application relation with its file node.
    pub relations: Vec<Relation>,
    /// Rows inserted, updated and deleted in the current transaction, per table.
    pub rows: Vec<RowStats>,
    /// Foreign-key and check constraints on application tables.
    #[serde(default)]
    pub constraints: Vec<Constraint>,
}

/// A foreign-key or check constraint.
#[derive(Debug, Clone, Deserialize)]
pub struct Constraint {
    /// Its OID.
    pub oid: i64,
    /// Its name.
    pub name: String,
    /// The table it is on.
    pub relid: i64,
    /// The table a foreign key references.
    pub references: Option<i64>,
    /// `f` or `c`.
    pub kind: String,
    /// Whether existing rows were checked (false: added `NOT VALID`).
    pub validated: bool,
}

/// Rewrites and drops logged by the event triggers.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ProbeLog {
    /// Tables rewritten.
    pub rewrites: Vec<RewriteLog>,
    /// Objects dropped.
    pub dropped: Vec<DropLog>,
}

/// One `table_rewrite` event.
#[derive(Debug, Clone, Deserialize)]
pub struct RewriteLog {
    /// Log sequence number.
    pub id: i64,
    /// The table's OID.
    pub relid: i64,
    /// `schema.name`.
    pub relname: Option<String>,
    /// PostgreSQL's reason bits.
    pub reason: i32,
}

/// One object from `pg_event_trigger_dropped_objects()`.
#[derive(Debug, Clone, Deserialize)]
pub struct DropLog {
    /// Log sequence number.
    pub id: i64,
    /// `table`, `view`, `index`, `table column`...
    pub object_type: String,
    /// Its identity, as PostgreSQL spells it.
    pub identity: Option<String>,
    /// Whether it was named by the statement (rather than reached from one that was).
    pub original: bool,
    /// Whether a normal dependency led to it (what CASCADE follows).
    pub normal: bool,
    /// For a relation or a column of one, the relation's OID.
    #[serde(default)]
    pub relid: Option<i64>,
}

/// A lock held.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
pub struct Lock {
    /// The relation's OID.
    pub relid: i64,
    /// `AccessExclusiveLock` and so on.
    pub mode: String,
}

/// An application relation.
#[derive(Debug, Clone, Deserialize)]
pub struct Relation {
    /// Its OID.
    pub relid: i64,
    /// `schema.name`.
    pub name: String,
    /// `r`, `p`, `i`, `m` or `S`.
    pub kind: String,
    /// Its file node (changes when it is rewritten or truncated).
    pub filenode: i64,
    /// For an index: the table it indexes.
    #[serde(default)]
    pub table: Option<i64>,
    /// For an index: whether it is valid (a failed concurrent build leaves it not).
    #[serde(default)]
    pub valid: Option<bool>,
    /// The numbers of its columns declared NOT NULL.
    #[serde(default)]
    pub not_null: Vec<i64>,
    /// The numbers of the columns it has (dropped ones left out).
    #[serde(default)]
    pub columns: Vec<i64>,
}

/// Row counts of one table in the current transaction.
#[derive(Debug, Clone, Deserialize)]
pub struct RowStats {
    /// The table's OID.
    pub relid: i64,
    /// Rows inserted.
    pub ins: i64,
    /// Rows updated.
    pub upd: i64,
    /// Rows deleted.
    pub del: i64,
    /// Rows read by scans and index fetches.
    #[serde(default)]
    pub scanned: i64,
}

/// PostgreSQL's table-rewrite reason bits, in words, as statement `sql`
/// tells them: PostgreSQL gives a stored generated column and an identity
/// added to a table with rows the volatile default's bit, though neither is
/// one.
pub fn rewrite_reason(bits: i32, sql: &str) -> String {
    let mut why = Vec::new();
    if bits & 1 != 0 {
        why.push("its persistence changed (SET LOGGED/UNLOGGED)");
    }
    if bits & 2 != 0 {
        let sql = sql.to_ascii_lowercase();
        why.push(if sql.contains("generated") && sql.contains("stored") {
            "a stored generated column was added, computed for every row"
        } else if sql.contains("identity") {
            "an identity column was added, numbered for every row"
        } else {
            "a column was added with a volatile default"
        });
    }
    if bits & 4 != 0 {
        why.push("a column's type changed");
    }
    if bits & 8 != 0 {
        why.push("its access method changed");
    }
    if why.is_empty() {
        return format!("reason {bits}");
    }
    why.join(" and ")
}

/// A `pg_class.relkind` in words.
pub fn relation_kind(relkind: &str) -> &'static str {
    match relkind {
        "r" | "p" => "table",
        "i" => "index",
        "m" => "materialized view",
        "S" => "sequence",
        _ => "relation",
    }
}

/// Lock modes that block ordinary reads or writes of the table while held.
pub fn blocks_writes(mode: &str) -> bool {
    matches!(mode, "ShareLock" | "ShareRowExclusiveLock" | "ExclusiveLock" | "AccessExclusiveLock")
}

/// The SQL spelling of a lock mode (`AccessExclusiveLock` → `ACCESS EXCLUSIVE`).
pub fn mode_name(mode: &str) -> String {
    let base = mode.strip_suffix("Lock").unwrap_or(mode);
    let mut out = String::new();
    for (i, ch) in base.char_indices() {
        if ch.is_uppercase() && i > 0 {
            out.push(' ');
        }
        out.push(ch.to_ascii_uppercase());
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn modes_and_reasons_read_well() {
        assert_eq!(super::mode_name("AccessExclusiveLock"), "ACCESS EXCLUSIVE");
        assert_eq!(super::mode_name("RowExclusiveLock"), "ROW EXCLUSIVE");
        assert!(super::rewrite_reason(4, "").contains("type changed"));
        assert!(super::blocks_writes("ShareLock") && !super::blocks_writes("RowExclusiveLock"));
    }
}
