//! The words the `opaque_code` check knows: built-ins that read the
//! environment, the clock's words and types, the catalogs that say where a
//! statement runs.

use super::lexer::{tokens, Token};

/// Built-in functions whose answer depends on where or when they run: who
/// runs them, in which database or server, with which settings, at what time,
/// by chance, or that run SQL given as text.
pub(super) const ENVIRONMENT_FUNCTIONS: &[&str] = &[
    // Privileges and types written out by the catalog's names: the
    // bootstrap superuser's, the types' (different on every server).
    "acldefault",
    "makeaclitem",
    "aclexplode",
    "aclitemin",
    "aclitemout",
    "format_type",
    "regclassin",
    "regclassout",
    "regprocin",
    "regprocout",
    "regprocedurein",
    "regprocedureout",
    "regoperin",
    "regoperout",
    "regoperatorin",
    "regoperatorout",
    "regtypein",
    "regtypeout",
    "regrolein",
    "regroleout",
    "regnamespacein",
    "regnamespaceout",
    "regconfigin",
    "regconfigout",
    "regdictionaryin",
    "regdictionaryout",
    "regcollationin",
    "regcollationout",
    "current_database",
    "current_schema",
    "current_schemas",
    "current_setting",
    "current_query",
    "current_user",
    "session_user",
    "current_role",
    "version",
    "inet_server_addr",
    "inet_server_port",
    "inet_client_addr",
    "inet_client_port",
    "now",
    "clock_timestamp",
    "statement_timestamp",
    "transaction_timestamp",
    "timeofday",
    "random",
    "random_normal",
    "setseed",
    "txid_current",
    "txid_current_if_assigned",
    "age",
    "query_to_xml",
    "query_to_xml_and_xmlschema",
    "table_to_xml",
    "cursor_to_xml",
    "schema_to_xml",
    "database_to_xml",
    "dblink",
    "dblink_exec",
    "gen_random_uuid",
    "uuid_generate_v1",
    "uuid_generate_v1mc",
    "uuid_generate_v4",
    "nextval",
    "currval",
    "lastval",
    "getpgusername",
    "row_security_active",
    "shobj_description",
    "gen_random_bytes",
    "gen_salt",
    "uuidv4",
    "uuidv7",
    "pg_sleep",
    "pg_sleep_for",
    "pg_sleep_until",
    "ts_stat",
    "ts_rewrite",
];

/// Prefixes of built-ins that read the server or its catalogs.
pub(super) const ENVIRONMENT_PREFIXES: &[&str] =
    &["pg_", "to_reg", "has_", "txid_", "obj_description", "col_description", "lo_"];

/// Built-ins under those prefixes that read nothing of where they run, or
/// only the schema a test fork shares with its target (the sequence behind
/// a column). (A sleep is not one: how long a migration holds its locks is
/// an effect.)
pub(super) const HARMLESS: &[&str] = &[
    "pg_advisory_xact_lock",
    "pg_advisory_lock",
    "pg_advisory_unlock",
    "pg_typeof",
    "pg_get_serial_sequence",
];

/// Ends of built-ins' names that read the database whole: its schemas, its
/// name, every table (`database_to_xmlschema`, `table_to_xml_and_xmlschema`).
pub(super) const ENVIRONMENT_SUFFIXES: &[&str] = &["_to_xml", "_xmlschema"];

/// SQL value keywords (no parentheses) that say who or when.
pub(super) const ENVIRONMENT_KEYWORDS: &[&str] = &[
    "user",
    "current_user",
    "session_user",
    "current_role",
    "current_catalog",
    "current_schema",
    "system_user",
    "current_timestamp",
    "current_date",
    "current_time",
    "localtime",
    "localtimestamp",
];

/// Keywords that name the time: harmless as a column's default (they then
/// only fill a value), a sign of the test anywhere else.
pub(super) const TIME_WORDS: &[&str] = &[
    "now",
    "clock_timestamp",
    "statement_timestamp",
    "transaction_timestamp",
    "current_timestamp",
    "current_date",
    "current_time",
    "localtime",
    "localtimestamp",
    "random",
    "gen_random_uuid",
    "uuid_generate_v1",
    "uuid_generate_v1mc",
    "uuid_generate_v4",
    "nextval",
];

/// A SQL condition on the text `expr` (a column's default, as
/// `pg_get_expr` writes it): whether it names one of [`TIME_WORDS`], so the
/// values it fills differ between any two copies.
pub fn fills_by_chance_sql(expr: &str) -> String {
    // An E'' string: the same whether the session reads backslashes in
    // plain strings or not.
    format!("{expr} OPERATOR(pg_catalog.~*) E'\\\\m({})\\\\M'", TIME_WORDS.join("|"))
}

/// Whether a column's default names one of [`TIME_WORDS`] (as
/// [`fills_by_chance_sql`] asks of the server).
pub fn fills_by_chance(default: &str) -> bool {
    tokens(default).iter().any(|t| matches!(t, Token::Word(w) if TIME_WORDS.contains(&w.as_str())))
}

/// Date and time constants PostgreSQL reads as the moment they are read
/// (`'now'::timestamptz`, `WHERE day = 'today'`).
pub(super) const TIME_CONSTANTS: &[&str] = &["now", "today", "tomorrow", "yesterday"];

/// System columns: where a row lies and which transaction wrote it, which no
/// two copies of a database share.
pub(super) const SYSTEM_COLUMNS: &[&str] = &["ctid", "xmin", "xmax", "cmin", "cmax", "tableoid"];

/// Types text becomes the clock in (`'now'::timestamptz`, `'today'::date`).
pub(super) const TIME_TYPES: &[&str] = &["date", "timestamp", "timestamptz", "time", "timetz"];

/// Ranges of times, whose bounds text becomes the clock in (`'[now,)'`).
pub(super) const TIME_RANGES: &[&str] =
    &["daterange", "tsrange", "tstzrange", "datemultirange", "tsmultirange", "tstzmultirange"];

/// Whether `name` (lowercased; an array's `_` prefix allowed) is a time
/// type or a range of times: a type whose input reads `now` as the clock.
pub(super) fn is_time_type(name: &str) -> bool {
    let name = name.trim_start_matches('_');
    TIME_TYPES.contains(&name) || TIME_RANGES.contains(&name)
}

/// Functions that make rows of JSON or hstore text, each field by its
/// type's input rules (a time's read `now` as the clock).
pub(super) const RECORD_MAKERS: &[&str] = &[
    "json_to_record",
    "jsonb_to_record",
    "json_to_recordset",
    "jsonb_to_recordset",
    "json_populate_record",
    "jsonb_populate_record",
    "json_populate_recordset",
    "jsonb_populate_recordset",
    "populate_record",
];

/// Functions that make a time from numbers or a time, never from words such
/// as `now`: a cast of what they return reads no clock.
pub(super) const TIME_MAKERS: &[&str] = &[
    "date_trunc",
    "date_bin",
    "make_date",
    "make_time",
    "make_timestamp",
    "make_timestamptz",
    "to_timestamp",
    "to_date",
];

/// Types whose values are a server's internal numbers (an object's OID, a
/// transaction's ID), different on every copy.
pub(super) const INTERNAL_TYPES: &[&str] = &[
    "oid",
    "xid",
    "xid8",
    "cid",
    "tid",
    "regclass",
    "regproc",
    "regprocedure",
    "regoper",
    "regoperator",
    "regtype",
    "regrole",
    "regnamespace",
    "regconfig",
    "regdictionary",
    "regcollation",
];

/// Settings that change how the rest of the file is read (a string's
/// backslashes), so no lexer can follow it past them, with the value the
/// lexer reads by (which setting them to changes nothing).
pub(super) const LEXER_SETTINGS: &[(&str, &[&str])] =
    &[("standard_conforming_strings", &["on", "true", "1", "yes"]), ("backslash_quote", &["safe_encoding"])];

/// Statements that make an object run a function named inside them, without
/// the `name(` of a call: an operator, a cast, an aggregate, a type's I/O.
pub(super) const FUNCTION_HOSTS: &[&str] =
    &["operator", "aggregate", "cast", "type", "transform", "conversion"];

/// Catalogs and views that show the server, its sessions, roles and data
/// (`pg_class.reltuples`, `pg_stat_activity`, `pg_settings`...).
pub(super) const ENVIRONMENT_RELATION_PREFIXES: &[&str] = &[
    "pg_stat",
    "pg_settings",
    "pg_file_settings",
    "pg_database",
    "pg_roles",
    "pg_user",
    "pg_authid",
    "pg_shadow",
    "pg_auth_members",
    "pg_namespace",
    "pg_class",
    "pg_tables",
    "pg_views",
    "pg_matviews",
    "pg_indexes",
    "pg_proc",
    "pg_locks",
    "pg_sequences",
    "pg_extension",
    "pg_available",
    "pg_attribute",
    "pg_index",
    "pg_trigger",
    "pg_constraint",
    "pg_type",
    "pg_hba",
    "pg_ident",
    "pg_replication",
    "pg_prepared",
    "pg_config",
    "pg_control",
    "pg_backend",
    "pg_shmem",
    "pg_tablespace",
    "pg_depend",
    "pg_description",
    "pg_event_trigger",
    "pg_policy",
    "pg_rewrite",
    "information_schema",
];

/// Words after which a `(` opens a group of an expression, not a call.
pub(super) const BEFORE_A_GROUP: &[&str] = &[
    "select",
    "where",
    "and",
    "or",
    "not",
    "then",
    "else",
    "when",
    "by",
    "returning",
    "having",
    "on",
    "case",
    "return",
    "distinct",
    "in",
    "using",
    "set",
    "values",
    "is",
    "between",
    "like",
    "ilike",
    "with",
    "as",
];

/// Words that are values of their own where a column could stand (beside
/// [`ENVIRONMENT_KEYWORDS`]).
pub(super) const LITERAL_WORDS: &[&str] = &["null", "true", "false", "default"];

/// Time zones' abbreviations PostgreSQL reads by default, as a special
/// date's zone (`'today EST'`).
pub(super) const ZONE_ABBREVIATIONS: &[&str] = &[
    "est", "edt", "cst", "cdt", "mst", "mdt", "pst", "pdt", "akst", "akdt", "hst", "ast", "adt", "nst",
    "ndt", "cet", "cest", "eet", "eest", "wet", "west", "bst", "ist", "msk", "jst", "kst", "hkt", "sgt",
    "aest", "aedt", "acst", "acdt", "awst", "nzst", "nzdt", "sast", "ut",
];
