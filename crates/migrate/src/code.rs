//! Which statements of a migration run code whose effect may depend on where
//! they run: the `opaque_code` hazard.
//!
//! A test fork can always be told apart from production (its probe, its
//! database's name, its data, its clock), so what a test saw of code that
//! looks around tells nothing of what that code does on the target. Such code
//! is found here from the file's tokens, read the way PostgreSQL's lexer
//! reads them (quotes, dollar quotes, nested comments, `E''` and `U&''`
//! escapes): a `DO` block, `CALL`, a prepared statement; a function the
//! database or the file defines, called (`f(row)`) or merely named (`row.f`
//! is the same call; so is an operator's, a cast's or an aggregate's use), or
//! run by a trigger, rule, default, check or index of a table the file
//! writes; a view or a table's row policies that read who or where; every
//! built-in that reads the environment (who, which database or server, its
//! settings, sequences and catalogs, the time, chance, a sleep); a
//! constant the clock reads (`'today'`, however spelled or joined); and a
//! setting put back to what the target's role or database keeps (`RESET`,
//! `DISCARD`, `SET ... TO DEFAULT`). A function's body is not code the
//! migration runs until it is called, so a `CREATE FUNCTION` alone is
//! transparent, and dropping or granting one names it without running it.
//!
//! The classification errs toward opaque: promote then asks a person to
//! acknowledge the file by its hash (`--allow-code`), which costs a read.
//! Plain SQL can still tell the test apart by what the data holds; what it
//! then does differently to the same rows is promote's row check's to find
//! (see `airlock_migrate::rows`).

use std::collections::{BTreeMap, BTreeSet};

use super::report::{Hazard, Severity};
use airlock_postgres::catalog::Catalog;
use airlock_postgres::split::Statement;

/// One reason a statement is opaque.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opaque {
    /// The statement's line.
    pub line: usize,
    /// Why, in a phrase ("a DO block", "calls current_database()").
    pub why: String,
}

/// Built-in functions whose answer depends on where or when they run: who
/// runs them, in which database or server, with which settings, at what time,
/// by chance, or that run SQL given as text.
const ENVIRONMENT_FUNCTIONS: &[&str] = &[
    "current_database",
    "current_schema",
    "current_schemas",
    "current_setting",
    "set_config",
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
    "setval",
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
const ENVIRONMENT_PREFIXES: &[&str] =
    &["pg_", "to_reg", "has_", "txid_", "obj_description", "col_description", "lo_"];

/// Built-ins under those prefixes that read nothing of where they run. (A
/// sleep is not one: how long a migration holds its locks is an effect.)
const HARMLESS: &[&str] = &["pg_advisory_xact_lock", "pg_advisory_lock", "pg_advisory_unlock", "pg_typeof"];

/// Ends of built-ins' names that read the database whole: its schemas, its
/// name, every table (`database_to_xmlschema`, `table_to_xml_and_xmlschema`).
const ENVIRONMENT_SUFFIXES: &[&str] = &["_to_xml", "_xmlschema"];

/// SQL value keywords (no parentheses) that say who or when.
const ENVIRONMENT_KEYWORDS: &[&str] = &[
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
const TIME_WORDS: &[&str] = &[
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
const TIME_CONSTANTS: &[&str] = &["now", "today", "tomorrow", "yesterday"];

/// System columns: where a row lies and which transaction wrote it, which no
/// two copies of a database share.
const SYSTEM_COLUMNS: &[&str] = &["ctid", "xmin", "xmax", "cmin", "cmax", "tableoid"];

/// Types text becomes the clock in (`'now'::timestamptz`, `'today'::date`).
const TIME_TYPES: &[&str] = &["date", "timestamp", "timestamptz", "time", "timetz"];

/// Functions that make a time from numbers or a time, never from words such
/// as `now`: a cast of what they return reads no clock.
const TIME_MAKERS: &[&str] = &[
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
const INTERNAL_TYPES: &[&str] = &[
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
/// backslashes), so no lexer can follow it past them.
const LEXER_SETTINGS: &[&str] = &["standard_conforming_strings", "backslash_quote", "escape_string_warning"];

/// Statements that make an object run a function named inside them, without
/// the `name(` of a call: an operator, a cast, an aggregate, a type's I/O.
const FUNCTION_HOSTS: &[&str] = &["operator", "aggregate", "cast", "type", "transform", "conversion"];

/// Catalogs and views that show the server, its sessions, roles and data
/// (`pg_class.reltuples`, `pg_stat_activity`, `pg_settings`...).
const ENVIRONMENT_RELATION_PREFIXES: &[&str] = &[
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

/// A token of SQL, as the lexer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// An unquoted word, lowercased.
    Word(String),
    /// A quoted identifier, as written inside its quotes.
    Quoted(String),
    /// A string or dollar-quoted constant, as written inside its quotes.
    Constant(String),
    /// A Unicode-escaped identifier (`U&"\\0070g_class"`), whose name the
    /// lexer does not decode.
    Escaped,
    /// Anything else: one character of punctuation, or a number.
    Other(char),
}

/// The `opaque_code` hazard of a candidate, if any of it is opaque: a SQL
/// file's opaque statements (the first few said), or a command, which is
/// code throughout.
pub fn hazard(candidate: &super::Candidate, catalog: &Catalog) -> Option<Hazard> {
    let sha = candidate.sha256();
    let (message, line) = match &candidate.sql {
        Some(sql) => {
            let statements = airlock_postgres::split::split(sql).ok()?;
            let found = opaque(&statements, catalog);
            let first = found.first()?;
            let said: Vec<String> =
                found.iter().take(3).map(|o| format!("line {}: {}", o.line, o.why)).collect();
            let more = if found.len() > 3 { format!(" and {} more", found.len() - 3) } else { String::new() };
            (
                format!("runs code whose effect may depend on where it runs ({}{more})", said.join("; ")),
                Some(first.line),
            )
        }
        None => ("is a command: code the test cannot follow to the target".to_owned(), None),
    };
    let mut h = Hazard::new(
        OPAQUE_CODE,
        Severity::High,
        format!("{message}: a test fork can be told apart from production, so its test says nothing of what this code does there"),
        line,
    );
    h.suggestion = Some(format!(
        "write it as plain DDL and DML, or read it yourself and promote with --allow-code {sha}"
    ));
    Some(h)
}

/// The hazard's kind; only `--allow-code` with the file's hash accepts it.
pub const OPAQUE_CODE: &str = "opaque_code";

/// Every opaque statement of `statements`, against the golden's `catalog`.
pub fn opaque(statements: &[Statement], catalog: &Catalog) -> Vec<Opaque> {
    let mut functions: BTreeSet<String> = catalog.functions.keys().map(|k| function_name(k)).collect();
    let triggered: BTreeSet<String> = catalog
        .tables
        .iter()
        .filter(|(_, t)| !t.triggers.is_empty())
        .map(|(name, _)| airlock_postgres::catalog::split_qualified(name).1.to_ascii_lowercase())
        .collect();
    // Tables whose defaults, checks or index expressions call a function the
    // database holds run it on every write; views that call one, on every read.
    let held = |text: &str| {
        tokens(text).windows(2).find_map(|w| match (&w[0], &w[1]) {
            (Token::Word(n) | Token::Quoted(n), Token::Other('('))
                if functions.contains(&n.to_ascii_lowercase()) =>
            {
                Some(n.to_ascii_lowercase())
            }
            _ => None,
        })
    };
    let unqualified = |name: &str| {
        airlock_postgres::catalog::split_qualified(name).1.trim_matches('"').to_ascii_lowercase()
    };
    let coded_tables: BTreeMap<String, String> = catalog
        .tables
        .iter()
        .filter_map(|(name, t)| {
            let texts = t
                .columns
                .iter()
                .filter_map(|c| c.default.as_deref())
                .chain(t.constraints.values().map(String::as_str))
                .chain(t.indexes.values().map(String::as_str));
            texts.into_iter().find_map(held).map(|f| (unqualified(name), f))
        })
        .collect();
    // Views, and the policies that filter a table's rows, that call such a
    // function or read who or when: what a read through them returns depends
    // on where it runs.
    let looks_around = |text: &str| {
        held(text).or_else(|| {
            tokens(text).windows(2).find_map(|w| match (&w[0], &w[1]) {
                (Token::Word(n), Token::Other('(')) if environment_function(n) => Some(n.clone()),
                (Token::Word(n), _) if ENVIRONMENT_KEYWORDS.contains(&n.as_str()) => Some(n.clone()),
                _ => None,
            })
        })
    };
    let mut coded_views: BTreeMap<String, (&str, String)> = catalog
        .views
        .iter()
        .filter_map(|(name, def)| looks_around(def).map(|f| (unqualified(name), ("view", f))))
        .collect();
    // Rules the golden holds run their actions in place of (or beside) a write.
    let objects: Vec<(&String, &String)> =
        catalog.objects.iter().flatten().map(|(name, e)| (name, &e.definition)).collect();
    for (name, def) in &objects {
        let table = name.strip_prefix("policy ").and_then(|p| p.split_once(" on table ")).map(|(_, t)| t);
        if let (Some(table), Some(f)) = (table, looks_around(def)) {
            coded_views.insert(unqualified(table), ("policy", f));
        }
    }
    let mut triggered = triggered;
    for (name, _) in &objects {
        if let Some(table) =
            name.strip_prefix("rule ").and_then(|r| r.split_once(" on table ")).map(|(_, t)| t)
        {
            triggered.insert(unqualified(table));
        }
    }
    // Casts and operators the golden holds run their functions wherever they
    // are used, with no `name(` to see.
    let cast_types: BTreeSet<String> = objects
        .iter()
        .filter(|(_, def)| def.starts_with("via ") && !def.starts_with("via  "))
        .filter_map(|(name, _)| {
            name.strip_prefix("cast from ")?.split_once(" to ").map(|(_, to)| unqualified(to))
        })
        .collect();
    let operators: BTreeSet<String> = objects
        .iter()
        .filter_map(|(name, _)| name.strip_prefix("operator ")?.split_once('(').map(|(op, _)| op.to_owned()))
        .filter(|op| !op.is_empty() && op.chars().all(|c| c.is_ascii_punctuation()))
        .collect();
    // Which tables a write reaches through foreign keys that act on it.
    let mut cascades: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, t) in &catalog.tables {
        for definition in t.constraints.values() {
            let toks = tokens(definition);
            let acts = toks.windows(3).any(|w| {
                matches!(w, [Token::Word(on), Token::Word(event), Token::Word(action)]
                    if on == "on" && (event == "update" || event == "delete") && (action == "cascade" || action == "set"))
            });
            if let Some(parent) = word_after(&toks, "references").filter(|_| acts) {
                cascades.entry(parent).or_default().insert(unqualified(name));
            }
        }
    }
    let reached = |table: &str| {
        let mut seen: BTreeSet<String> = BTreeSet::from([table.to_owned()]);
        let mut next = vec![table.to_owned()];
        while let Some(t) = next.pop() {
            for child in cascades.get(&t).into_iter().flatten() {
                if seen.insert(child.clone()) {
                    next.push(child.clone());
                }
            }
        }
        seen
    };
    let mut triggered_here: BTreeSet<String> = BTreeSet::new();
    // Columns the file adds with a default that fills them by clock or chance.
    let mut filled_here: BTreeSet<String> = BTreeSet::new();
    let mut rules = false;
    let mut out = Vec::new();
    for st in statements {
        let tokens = tokens(&st.sql);
        let mut why = |text: String| out.push(Opaque { line: st.line, why: text });
        let words: Vec<&str> = tokens
            .iter()
            .take(6)
            .filter_map(|t| match t {
                Token::Word(w) => Some(w.as_str()),
                _ => None,
            })
            .collect();
        let definition_statement = matches!(words.first(), Some(&("create" | "alter")));
        if definition_statement {
            for (i, t) in tokens.iter().enumerate() {
                if matches!(t, Token::Word(w) if TIME_WORDS.contains(&w.as_str())) && defaulted(&tokens, i) {
                    filled_here.extend(filled_column_at(&tokens, i));
                }
            }
        }
        match words.as_slice() {
            ["do", ..] => why("a DO block (code that can look where it runs)".into()),
            ["call", ..] => why("CALL runs a procedure".into()),
            ["execute", ..] | ["prepare", ..] => why("a prepared statement (SQL kept as text)".into()),
            ["create", "or", "replace", "function" | "procedure", ..]
            | ["create", "function" | "procedure", ..] => {
                if let Some(name) = defined_name(&tokens) {
                    functions.insert(name);
                }
                continue;
            }
            ["create", "or", "replace", "trigger", ..] | ["create", "trigger" | "constraint", ..] => {
                if let Some(table) = word_after(&tokens, "on") {
                    triggered_here.insert(table);
                }
                continue;
            }
            ["create", "or", "replace", "rule", ..] | ["create", "rule", ..] => {
                rules = true;
                continue;
            }
            ["create", "event", "trigger", ..] => why("an event trigger (code run by later DDL)".into()),
            // The server's own objects: a test fork holds none of the target's
            // other databases, roles or tablespaces, so `DROP DATABASE IF
            // EXISTS` does nothing under test and anything on the target (and
            // outside a transaction, nothing rolls it back).
            ["create" | "alter" | "drop", "database" | "tablespace" | "role" | "user" | "group", ..]
            | ["alter", "system", ..]
            | ["reassign" | "drop", "owned", ..]
            | ["comment" | "security", "on" | "label", "database" | "role" | "tablespace", ..]
            | ["security", "label", "on", "database" | "role" | "tablespace", ..] => why(format!(
                "{} acts on the server beyond this database (its databases, roles, tablespaces or settings), which a test fork does not hold as the target does",
                words.iter().take(2).map(|w| w.to_ascii_uppercase()).collect::<Vec<_>>().join(" ")
            )),
            ["notify" | "listen", ..] => why("NOTIFY speaks to whatever listens on the target".into()),
            ["reset", ..] | ["discard", ..] => why(
                "puts settings back to what the target's role and database keep, not what the test ran with"
                    .into(),
            ),
            ["set", ..]
                if tokens.windows(2).any(|w| {
                    matches!(w, [Token::Word(to), Token::Word(d)] if to == "to" && d == "default")
                        || matches!(w, [Token::Other('='), Token::Word(d)] if d == "default")
                }) =>
            {
                why("sets a setting to what the target's role and database keep, not what the test ran with"
                    .into())
            }
            ["create", "or", "replace", host, ..] | ["create", host, ..] if FUNCTION_HOSTS.contains(host) => {
                // An operator, cast or aggregate runs its function wherever
                // it is used, with no `name(` to see there.
                let named = tokens.iter().find_map(|t| match t {
                    Token::Word(w) | Token::Quoted(w) if functions.contains(&w.to_ascii_lowercase()) => {
                        Some(w.to_ascii_lowercase())
                    }
                    _ => None,
                });
                if let Some(f) = named {
                    why(format!("makes a {host} that runs {f}(), code the database holds"));
                }
            }
            _ => {}
        }
        // Statements about functions as objects name them without running them.
        const ROUTINE: &[&str] = &["function", "procedure", "routine", "aggregate"];
        const ROUTINES: &[&str] = &["functions", "procedures", "routines"];
        let about_functions = match words.as_slice() {
            ["drop" | "alter", kind, ..] | ["comment", "on", kind, ..] => ROUTINE.contains(kind),
            ["grant" | "revoke", ..] => tokens.windows(3).any(|w| match w {
                [Token::Word(on), Token::Word(kind), _] if on == "on" => ROUTINE.contains(&kind.as_str()),
                [Token::Word(on), Token::Word(all), Token::Word(kind)] if on == "on" && all == "all" => {
                    ROUTINES.contains(&kind.as_str())
                }
                _ => false,
            }),
            _ => false,
        };
        // An extension's name is not a catalog read.
        let about_extensions = matches!(words.as_slice(), [_, "extension", ..] | [_, _, "extension", ..]);
        for (table, carried) in written_tables(&tokens) {
            let reaches = if carried { reached(&table) } else { BTreeSet::from([table.clone()]) };
            let coded = reaches.into_iter().find(|t| {
                triggered.contains(t) || triggered_here.contains(t) || coded_tables.contains_key(t)
            });
            if let Some(t) = coded.filter(|t| *t != table) {
                why(format!("writes {table}, whose foreign keys carry the write to {t}, whose triggers, rules or defaults run code"));
            } else if triggered.contains(&table) || triggered_here.contains(&table) {
                why(format!("writes {table}, whose triggers or rules run code"));
            } else if rules {
                why(format!("writes {table} after the file made a rule (code in place of the write)"));
            } else if let Some((_, f)) = coded_views.get(&table).filter(|(what, _)| *what == "policy") {
                why(format!("writes {table}, whose row policies read {f}, which differs where it runs"));
            } else if let Some(f) = coded_tables.get(&table) {
                why(format!(
                    "writes {table}, whose defaults, checks or indexes run {f}(), code the database holds"
                ));
            }
        }
        if let Some(op) = operators.iter().find(|op| uses_operator(&tokens, op)) {
            why(format!("uses operator {op}, whose function the database holds"));
        }
        for (i, token) in tokens.iter().enumerate() {
            let after_default = defaulted(&tokens, i);
            let name = match token {
                Token::Escaped => {
                    why("a Unicode-escaped name (U&\"...\"), which hides what it names".into());
                    continue;
                }
                Token::Constant(text) => {
                    // With the constants it is joined to (`'to' || 'day'`).
                    let joined = joined_constants(&tokens, i);
                    let read = [text.as_str(), joined.as_str()].into_iter().find(|t| reads_the_clock(t));
                    if let Some(t) = read.filter(|_| !after_default) {
                        why(format!("reads the time ('{}')", t.trim()));
                    }
                    continue;
                }
                Token::Word(name) | Token::Quoted(name) => name,
                Token::Other(_) => continue,
            };
            let before = |back: usize| i.checked_sub(back).and_then(|j| tokens.get(j));
            // A quoted name is the system column or type only as written in lower case.
            let exact = match token {
                Token::Word(_) => true,
                _ => name.chars().all(|c| !c.is_ascii_uppercase()),
            };
            if exact {
                let word = name.as_str();
                if SYSTEM_COLUMNS.contains(&word) {
                    why(format!("reads {word}, where and by which transaction a row was written"));
                } else if INTERNAL_TYPES.contains(&word)
                    && (word.starts_with("reg")
                        || matches!(
                            (before(2), before(1)),
                            (Some(Token::Other(':')), Some(Token::Other(':')))
                        )
                        || matches!(before(1), Some(Token::Word(w)) if w == "as")
                        || matches!(tokens.get(i + 1), Some(Token::Constant(_))))
                {
                    why(format!("casts to {word}, a number no two servers share"));
                } else if LEXER_SETTINGS.contains(&word) {
                    why(format!("names {word}, which changes how what follows is read"));
                } else if word == "tablesample" {
                    why("samples rows by chance (TABLESAMPLE)".into());
                } else if word == "user"
                    && (matches!(before(1), Some(Token::Word(w)) if ["create", "alter", "drop"].contains(&w.as_str()))
                        || (matches!(before(1), Some(Token::Word(w)) if w == "for")
                            && !matches!(tokens.get(i + 1), Some(Token::Word(w)) if w == "server")))
                {
                    // CREATE/ALTER/DROP USER and FOR USER role (default
                    // privileges): a role statement, not the keyword.
                    continue;
                }
            }
            let name = name.to_ascii_lowercase();
            let called = matches!(tokens.get(i + 1), Some(Token::Other('(')));
            if matches!(token, Token::Word(_))
                && casts_computed_text_to_time(&tokens, i, definition_statement)
            {
                why(format!("casts text it computes to {name}: text can be the clock ('now')"));
                continue;
            }
            if matches!(token, Token::Word(_)) && writes_filled_column(&tokens, i, &filled_here) {
                why(format!(
                    "writes {name}, which the file filled by clock or chance, so no test can compare what it holds"
                ));
                continue;
            }
            if TIME_WORDS.contains(&name.as_str()) && after_default {
                continue;
            }
            if cast_types.contains(&name) {
                why(format!("names type {name}, which a cast the database holds turns into code"));
            } else if let Some((what, f)) = coded_views.get(&name).filter(|_| !called) {
                let how = if *what == "view" { "view {name}, which" } else { "{name}, whose row policies" };
                why(format!("reads {}", how.replace("{name}", &name))
                    + &format!(" read {f}, which differs where it runs"));
            } else if about_functions && functions.contains(&name) {
                // Dropped, altered, commented on or granted: not run.
            } else if called && functions.contains(&name) {
                why(format!("calls {name}(), code the database holds"));
            } else if functions.contains(&name) {
                // `row.f` and `f(row)` are one call; so are an operator's
                // and a cast's use of it.
                why(format!("names {name}, code the database holds, which runs wherever it is named"));
            } else if called
                && name.starts_with("pg_sleep")
                && matches!(
                    tokens.get(i + 2..i + 4),
                    Some([Token::Other('0') | Token::Constant(_), Token::Other(')')])
                )
            {
                // A fixed wait decides nothing (what it waits for is read).
            } else if called && environment_function(&name) {
                why(format!("calls {name}(), which reads where or when it runs"));
            } else if matches!(token, Token::Word(_)) && ENVIRONMENT_KEYWORDS.contains(&name.as_str()) {
                // Called or not: CURRENT_TIMESTAMP(6) is the clock too.
                why(format!("reads {}", name.to_ascii_uppercase()));
            } else if !called && !about_extensions && reads_the_server(&name, tokens.get(i + 1)) {
                why(format!("reads {name}, which shows the server, not the data"));
            }
        }
    }
    out.dedup();
    out
}

/// Whether a name (not called) is one of the catalogs or views that show
/// the server, its sessions, roles and settings: every `pg_` relation (a
/// schema qualifying a name, `pg_catalog.`, aside), `information_schema`,
/// and those listed.
fn reads_the_server(name: &str, next: Option<&Token>) -> bool {
    (name.starts_with("pg_") && next != Some(&Token::Other('.')))
        || ENVIRONMENT_RELATION_PREFIXES.iter().any(|p| name.starts_with(p) && !p.starts_with("pg_"))
}

/// The text of the constants joined to the one at `i` by `||` (`'to' ||
/// 'day'`), whole; empty when none is.
fn joined_constants(tokens: &[Token], i: usize) -> String {
    let concat = |j: usize| {
        matches!((tokens.get(j), tokens.get(j + 1)), (Some(Token::Other('|')), Some(Token::Other('|'))))
    };
    // Only from the chain's first constant.
    if i >= 2 && concat(i - 2) && matches!(tokens.get(i.wrapping_sub(3)), Some(Token::Constant(_))) {
        return String::new();
    }
    let mut text = String::new();
    let mut j = i;
    while let Some(Token::Constant(t)) = tokens.get(j) {
        text.push_str(t);
        if !concat(j + 1) {
            break;
        }
        j += 3;
    }
    if j == i {
        String::new()
    } else {
        text
    }
}

/// Whether a cast into a time type, at `i` (the type's word after `::` or
/// `AS` in `CAST (... AS type)`, or a call of the type's name), takes
/// something computed: text built at run time can be `now` or `today`
/// however it is spelled (`concat('no', 'w')::timestamptz`), which no
/// reading of constants sees. A constant (read on its own), a column, or a
/// function that makes a time from numbers is not computed.
fn casts_computed_text_to_time(tokens: &[Token], i: usize, definition: bool) -> bool {
    let Some(Token::Word(t)) = tokens.get(i) else { return false };
    if !TIME_TYPES.contains(&t.as_str()) {
        return false;
    }
    let operand_computed = |end: usize| -> bool {
        // The operand ends at `end` (exclusive): a parenthesised group or a
        // call, found back from its `)`.
        match tokens.get(end.wrapping_sub(1)) {
            Some(Token::Other(')')) => {
                let mut depth = 0;
                let mut j = end - 1;
                loop {
                    match tokens[j] {
                        Token::Other(')') => depth += 1,
                        Token::Other('(') => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    if j == 0 {
                        return true;
                    }
                    j -= 1;
                }
                // A time made from numbers, or the clock read outright (which
                // is judged as such), is no text.
                !matches!(tokens.get(j.wrapping_sub(1)), Some(Token::Word(f))
                    if TIME_MAKERS.contains(&f.as_str()) || TIME_WORDS.contains(&f.as_str()))
            }
            _ => false,
        }
    };
    match (tokens.get(i.wrapping_sub(2)), tokens.get(i.wrapping_sub(1))) {
        (Some(Token::Other(':')), Some(Token::Other(':'))) => operand_computed(i - 2),
        (_, Some(Token::Word(w))) if w == "as" => {
            // CAST ( operand AS type ): the operand is all between.
            let open = tokens[..i].iter().rposition(|t| matches!(t, Token::Word(w) if w == "cast"));
            match open {
                Some(c) if matches!(tokens.get(c + 1), Some(Token::Other('('))) => {
                    let inner = &tokens[c + 2..i - 1];
                    !matches!(
                        inner,
                        [Token::Constant(_)]
                            | [Token::Word(_)]
                            | [Token::Word(_), Token::Other('.'), Token::Word(_)]
                    ) && !matches!(inner.first(), Some(Token::Word(f)) if TIME_MAKERS.contains(&f.as_str()))
                }
                _ => false,
            }
        }
        // `timestamptz(...)` called as a function (in a definition, a
        // type's precision: `timestamp(0)`).
        _ => !definition && matches!(tokens.get(i + 1), Some(Token::Other('('))),
    }
}

/// The column a default at `i` belongs to in a definition: the first name
/// of its clause (after `ADD [COLUMN] [IF NOT EXISTS]`, a `,` or a `(`).
fn filled_column_at(tokens: &[Token], i: usize) -> Option<String> {
    let start = tokens[..i]
        .iter()
        .rposition(|t| matches!(t, Token::Other(',' | '(')) || matches!(t, Token::Word(w) if w == "add"))?;
    tokens[start + 1..i].iter().find_map(|t| match t {
        Token::Word(w) if !["column", "if", "not", "exists"].contains(&w.as_str()) => Some(w.clone()),
        Token::Quoted(q) => Some(q.to_ascii_lowercase()),
        _ => None,
    })
}

/// Whether the name at `i` is a column an UPDATE sets (`SET c =`, `, c =`)
/// among `filled`.
fn writes_filled_column(tokens: &[Token], i: usize, filled: &BTreeSet<String>) -> bool {
    let update = matches!(tokens.iter().find(|t| matches!(t, Token::Word(_))), Some(Token::Word(w)) if w == "update")
        || tokens.iter().any(|t| matches!(t, Token::Word(w) if w == "update"));
    let Some(Token::Word(name)) = tokens.get(i) else { return false };
    update
        && filled.contains(name)
        && matches!(tokens.get(i + 1), Some(Token::Other('=')))
        && matches!(tokens.get(i.wrapping_sub(1)), Some(Token::Other(',')) | Some(Token::Word(_)))
}

/// Whether `tokens` spell the operator `symbol` (its characters one after another).
fn uses_operator(tokens: &[Token], symbol: &str) -> bool {
    let chars: Vec<char> = symbol.chars().collect();
    tokens.windows(chars.len()).any(|w| w.iter().zip(&chars).all(|(t, c)| *t == Token::Other(*c)))
}

fn environment_function(name: &str) -> bool {
    !HARMLESS.contains(&name)
        && (ENVIRONMENT_FUNCTIONS.contains(&name)
            || ENVIRONMENT_PREFIXES.iter().any(|p| name.starts_with(p))
            || ENVIRONMENT_SUFFIXES.iter().any(|s| name.ends_with(s)))
}

/// Whether a constant is a date or time PostgreSQL reads as the moment it
/// is read: `'now'`, `'today 00:00'`, `'yesterday 12:00+02'` (a special word,
/// the rest digits and the signs of a time), or holds one as an element of an
/// array, range, row or JSON value (`'{now}'`, `'[now,infinity)'`,
/// `'{"at": "now"}'`), which becomes a time wherever it is read as one.
fn reads_the_clock(text: &str) -> bool {
    let alone = |text: &str| {
        let words: Vec<&str> = text.split_whitespace().collect();
        words.iter().any(|w| TIME_CONSTANTS.contains(w))
            && words.iter().all(|w| {
                TIME_CONSTANTS.contains(w)
                    || ["am", "pm", "utc", "gmt", "z", "at", "allballs"].contains(w)
                    || w.chars().all(|c| c.is_ascii_digit() || ":.+-/".contains(c))
            })
    };
    alone(text)
        || (text.trim_start().starts_with(['{', '[', '('])
            && text.split(['{', '}', '[', ']', '(', ')', ',', ':', '"', '\\']).any(|piece| alone(piece)))
}

/// Whether the token at `i` is part of a column's default in a definition
/// that only computes a value from the clock or chance (`ADD COLUMN at
/// timestamptz DEFAULT now()`, `DEFAULT (now() + interval '1 day')`,
/// `DEFAULT 'today'`), which fills a value and decides nothing: never in DML
/// (`SET a = DEFAULT, b = random()` is not one), and never a default that
/// compares or chooses (`DEFAULT (now() > '2026-08-01')`, a `CASE`).
fn defaulted(tokens: &[Token], i: usize) -> bool {
    let definition = matches!(tokens.iter().find(|t| matches!(t, Token::Word(_))), Some(Token::Word(w)) if w == "create" || w == "alter");
    if !definition {
        return false;
    }
    // The DEFAULT this token follows, within its clause.
    let Some(at) = tokens[..i]
        .iter()
        .rposition(|t| matches!(t, Token::Word(w) if w == "default") || matches!(t, Token::Other(',' | ';')))
        .filter(|&at| matches!(&tokens[at], Token::Word(_)))
    else {
        return false;
    };
    // The default's expression: up to a comma, semicolon or unmatched `)`,
    // or the clause's next keyword.
    let mut depth = 0i32;
    for (j, t) in tokens.iter().enumerate().skip(at + 1) {
        match t {
            Token::Other('(') => depth += 1,
            Token::Other(')') if depth == 0 => break,
            Token::Other(')') => depth -= 1,
            Token::Other(',' | ';') if depth == 0 => break,
            Token::Word(w)
                if depth == 0
                    && [
                        "not",
                        "null",
                        "constraint",
                        "check",
                        "references",
                        "primary",
                        "unique",
                        "collate",
                        "generated",
                    ]
                    .contains(&w.as_str()) =>
            {
                break
            }
            Token::Word(w) if TIME_WORDS.contains(&w.as_str()) || w == "interval" => {}
            // A type after `::`, a number, a constant, arithmetic.
            Token::Word(_) => {
                if !matches!(tokens.get(j.wrapping_sub(1)), Some(Token::Other(':'))) {
                    return false;
                }
            }
            Token::Other(':' | '+' | '-' | '*' | '/' | '0' | '.') | Token::Constant(_) | Token::Quoted(_) => {
            }
            _ => return false,
        }
    }
    true
}

/// The name (unqualified, lowercased) a `CREATE FUNCTION` defines: the word
/// before its first `(`.
fn defined_name(tokens: &[Token]) -> Option<String> {
    let open = tokens.iter().position(|t| *t == Token::Other('('))?;
    match tokens.get(open.checked_sub(1)?)? {
        Token::Word(w) => Some(w.clone()),
        Token::Quoted(q) => Some(q.to_ascii_lowercase()),
        _ => None,
    }
}

/// Every table a statement may write (unqualified, lowercased): after each
/// `INSERT INTO`, `UPDATE`, `DELETE FROM` and `MERGE INTO` (data-modifying
/// `WITH` parts included), and a `COPY` or `TRUNCATE`'s table; with whether
/// the write changes or removes rows (which foreign keys may carry on).
fn written_tables(tokens: &[Token]) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let first = tokens.iter().position(|t| matches!(t, Token::Word(_)));
    for (i, t) in tokens.iter().enumerate() {
        let Token::Word(w) = t else { continue };
        let next_is = |word: &str| matches!(tokens.get(i + 1), Some(Token::Word(n)) if n == word);
        let from = match w.as_str() {
            "insert" | "merge" if next_is("into") => i + 2,
            "delete" if next_is("from") => i + 2,
            "update" => i + 1,
            "copy" | "truncate" if Some(i) == first => i + 1,
            _ => continue,
        };
        let mut rest = &tokens[from.min(tokens.len())..];
        if matches!(rest.first(), Some(Token::Word(n)) if n == "table") {
            rest = &rest[1..];
        }
        if let Some(name) = name_at(rest) {
            // An INSERT or COPY adds rows, which no foreign key carries further.
            out.push((name, !matches!(w.as_str(), "insert" | "copy")));
        }
    }
    out
}

/// The last part of the name after the first `keyword` (skipping `ONLY`).
fn word_after(tokens: &[Token], keyword: &str) -> Option<String> {
    let at = tokens.iter().position(|t| matches!(t, Token::Word(w) if w == keyword))?;
    name_at(&tokens[at + 1..])
}

/// The last part of the name `tokens` begin with (after an `ONLY`).
fn name_at(tokens: &[Token]) -> Option<String> {
    let mut rest = tokens.iter().peekable();
    if matches!(rest.peek(), Some(Token::Word(w)) if w == "only") {
        rest.next();
    }
    // One name, maybe qualified: a part, then a dot and a part, and so on.
    let (mut name, mut expect_part) = (None, true);
    for t in rest {
        match (t, expect_part) {
            (Token::Word(w), true) => name = Some(w.clone()),
            (Token::Quoted(q), true) => name = Some(q.to_ascii_lowercase()),
            (Token::Other('.'), false) => {}
            _ => break,
        }
        expect_part = !expect_part;
    }
    name
}

/// The last part of a catalog function key, `schema.name(args)`, lowercased
/// and unquoted.
fn function_name(key: &str) -> String {
    let head = key.split('(').next().unwrap_or(key);
    let last = airlock_postgres::catalog::split_qualified(head).1;
    last.trim_matches('"').to_ascii_lowercase()
}

/// An `E'...'` constant's text with its backslash escapes read: `\n` and
/// the like, octal `\164`, hex `\x74`, `\u0074` and `\U00000074`.
fn unescape_e(raw: &str) -> String {
    let mut out = String::new();
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let Some(e) = chars.next() else { break };
        let mut number = |radix: u32, max: usize, first: Option<char>| {
            let mut digits: String = first.into_iter().collect();
            while digits.len() < max && chars.peek().is_some_and(|d| d.is_digit(radix)) {
                digits.extend(chars.next());
            }
            u32::from_str_radix(&digits, radix).ok().and_then(char::from_u32)
        };
        let read = match e {
            'b' => Some('\u{8}'),
            'f' => Some('\u{c}'),
            'n' => Some('\n'),
            'r' => Some('\r'),
            't' => Some('\t'),
            '0'..='7' => number(8, 3, Some(e)),
            'x' => number(16, 2, None),
            'u' => number(16, 4, None),
            'U' => number(16, 8, None),
            other => Some(other),
        };
        out.extend(read);
    }
    out
}

/// A `U&'...'` constant's text with its escapes read: `\0074`, `\+000074`.
fn unescape_u(raw: &str) -> String {
    let mut out = String::new();
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let (len, plus) = if chars.peek() == Some(&'+') { (6, chars.next().is_some()) } else { (4, false) };
        let digits: String = (0..len).map_while(|_| chars.next_if(|d| d.is_ascii_hexdigit())).collect();
        match u32::from_str_radix(&digits, 16).ok().and_then(char::from_u32) {
            Some(ch) if digits.len() == len => out.push(ch),
            _ if digits.is_empty() && !plus => out.extend(chars.next_if_eq(&'\\')),
            _ => {}
        }
    }
    out
}

/// The tokens of one statement.
fn tokens(sql: &str) -> Vec<Token> {
    let bytes = sql.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                // (A carriage return ends it too, as PostgreSQL's lexer reads it.)
                while i < bytes.len() && bytes[i] != b'\n' && bytes[i] != b'\r' {
                    i += 1;
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                let mut depth = 0;
                while i < bytes.len() {
                    if bytes[i] == b'/' && bytes.get(i + 1) == Some(&b'*') {
                        depth += 1;
                        i += 2;
                    } else if bytes[i] == b'*' && bytes.get(i + 1) == Some(&b'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
            }
            b'\'' | b'"' => {
                // E'...' only where the E is a word of its own (`date'...'` is a
                // typed constant, as PostgreSQL's lexer reads it).
                let escapes = c == b'\''
                    && i > 0
                    && matches!(bytes[i - 1], b'E' | b'e')
                    && (i == 1
                        || !(bytes[i - 2].is_ascii_alphanumeric()
                            || bytes[i - 2] == b'_'
                            || bytes[i - 2] >= 0x80));
                let start = i + 1;
                i += 1;
                while i < bytes.len() {
                    if escapes && bytes[i] == b'\\' {
                        i += 2;
                        continue;
                    }
                    if bytes[i] == c {
                        if bytes.get(i + 1) == Some(&c) {
                            i += 2;
                            continue;
                        }
                        break;
                    }
                    i += 1;
                }
                let end = i.min(bytes.len());
                i += 1;
                // `U&"..."`: the word `u` and an `&` just before the quote.
                let unicode = start >= 3
                    && bytes[start - 2] == b'&'
                    && matches!(bytes[start - 3], b'u' | b'U')
                    && (start == 3
                        || !(bytes[start - 4].is_ascii_alphanumeric() || bytes[start - 4] == b'_'));
                if c == b'"' && unicode {
                    out.truncate(out.len().saturating_sub(2));
                    out.push(Token::Escaped);
                } else if c == b'"' {
                    out.push(Token::Quoted(sql[start..end].replace("\"\"", "\"")));
                } else {
                    // An E'' prefix was read as a word: it is part of the
                    // constant, as is a U& one (a word and an `&`).
                    if escapes {
                        out.pop();
                    }
                    let unicode = start >= 3
                        && bytes[start - 2] == b'&'
                        && matches!(bytes[start - 3], b'u' | b'U')
                        && (start == 3
                            || !(bytes[start - 4].is_ascii_alphanumeric() || bytes[start - 4] == b'_'));
                    if unicode {
                        out.truncate(out.len().saturating_sub(2));
                    }
                    // What the constant says, its escapes read as PostgreSQL reads them.
                    let raw = sql[start..end].replace("''", "'");
                    let text = match (escapes, unicode) {
                        (true, _) => unescape_e(&raw),
                        (_, true) => unescape_u(&raw),
                        _ => raw,
                    }
                    .to_ascii_lowercase();
                    // Constants with only a line break between are one
                    // (`'no'` newline `'w'` is `'now'`).
                    match out.last_mut() {
                        Some(Token::Constant(before)) => before.push_str(&text),
                        _ => out.push(Token::Constant(text)),
                    }
                }
            }
            b'$' if !out.last().is_some_and(|t| matches!(t, Token::Word(_))) => {
                match airlock_postgres::split::dollar_tag(&sql[i..]) {
                    Some(tag) => {
                        let body = i + tag.len();
                        let end = sql[body..].find(tag).map_or(bytes.len(), |e| body + e);
                        out.push(Token::Constant(sql[body..end].to_ascii_lowercase()));
                        i = (end + tag.len()).min(bytes.len());
                    }
                    None => {
                        out.push(Token::Other('$'));
                        i += 1;
                    }
                }
            }
            c if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 => {
                let end = (i..bytes.len())
                    .find(|&j| {
                        !(bytes[j].is_ascii_alphanumeric()
                            || bytes[j] == b'_'
                            || bytes[j] == b'$'
                            || bytes[j] >= 0x80)
                    })
                    .unwrap_or(bytes.len());
                out.push(Token::Word(sql[i..end].to_ascii_lowercase()));
                i = end;
            }
            c if c.is_ascii_whitespace() => i += 1,
            c if c.is_ascii_digit() => {
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'.') {
                    i += 1;
                }
                out.push(Token::Other('0'));
            }
            _ => {
                out.push(Token::Other(c as char));
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_check_is_one_regular_expression_of_whole_words() {
        let sql = fills_by_chance_sql("d");
        assert!(sql.starts_with("d OPERATOR(pg_catalog.~*) E'\\\\m(now|"), "{sql}");
        assert!(sql.ends_with(")\\\\M'"), "{sql}");
    }

    fn why(sql: &str) -> Vec<String> {
        let catalog: Catalog = serde_json::from_value(serde_json::json!({
            "tables": {
                "public.audited": {"kind": "table", "columns": [], "constraints": {}, "indexes": {},
                                    "triggers": {"log": "CREATE TRIGGER log ..."}},
                "public.users": {"kind": "table", "columns": [], "constraints": {}, "indexes": {}, "triggers": {}},
                "public.scored": {"kind": "table", "columns": [{"name": "s", "type": "int", "nullable": true,
                                   "default": "rotate_keys(1)"}], "constraints": {}, "indexes": {}, "triggers": {}},
                "public.checked": {"kind": "table", "columns": [], "indexes": {}, "triggers": {},
                                   "constraints": {"c": "CHECK (public.rotate_keys(a) > 0)"}},
                "public.kv": {"kind": "table", "columns": [], "indexes": {}, "triggers": {}, "constraints": {}},
                "public.owned": {"kind": "table", "columns": [], "indexes": {}, "triggers": {},
                                 "constraints": {"o": "FOREIGN KEY (k) REFERENCES kv(k) ON UPDATE CASCADE"}},
                "public.child": {"kind": "table", "columns": [], "indexes": {}, "triggers": {"t": "CREATE TRIGGER t ..."},
                                 "constraints": {"o": "FOREIGN KEY (k) REFERENCES owned(k) ON DELETE SET NULL"}}
            },
            "views": {"public.keyed": "SELECT rotate_keys(1) AS k", "public.plain_view": "SELECT 1 AS one",
                      "public.who": "SELECT a FROM t WHERE b = current_setting('app.tenant')"},
            "objects": {
                "rule r on table public.flags": {"definition": "CREATE RULE r AS ON UPDATE TO flags DO ALSO NOTHING"},
                "policy mine on table public.notes": {"definition": "permissive for all to public using ((owner = CURRENT_USER))"},
                "policy open on table public.kv": {"definition": "permissive for all to public using (true)"},
                "cast from text to tag_t": {"definition": "via to_tag(text) context e method f"},
                "operator ##(text,text)": {"definition": "digest x"},
                "operator class public.c for access method btree": {"definition": "digest y"}
            }, "functions": {"public.rotate_keys(integer)": "x", "app.\"Mixed\"()": "y"},
            "sequences": {}, "types": {}, "extensions": {}
        }))
        .unwrap();
        let statements = airlock_postgres::split::split(sql).unwrap();
        opaque(&statements, &catalog).into_iter().map(|o| o.why).collect()
    }

    #[test]
    fn plain_ddl_and_dml_are_transparent() {
        for sql in [
            "ALTER TABLE users ADD COLUMN created_at timestamptz NOT NULL DEFAULT now()",
            "ALTER TABLE users ADD COLUMN id2 uuid DEFAULT gen_random_uuid()",
            "CREATE TABLE t (a int, at timestamptz DEFAULT (current_timestamp + interval '1 day'))",
            "UPDATE users SET email = lower(email) WHERE email <> lower(email)",
            "INSERT INTO users (email) SELECT 'now() ' || 'current_user' FROM generate_series(1, 3)",
            "CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$ BEGIN RETURN current_database(); END $$",
            "CREATE INDEX ON users (lower(email)); COMMENT ON TABLE users IS 'pg_stat_activity'",
            "-- DO this later\nALTER TABLE users RENAME COLUMN \"now\" TO then",
            "CREATE EXTENSION IF NOT EXISTS pg_trgm",
            "INSERT INTO users (note) VALUES ('done now'), ('today''s')",
            "ALTER TABLE users ADD COLUMN day date NOT NULL DEFAULT 'today'",
            "ALTER TABLE users ADD COLUMN n bigint DEFAULT nextval('users_n_seq')",
            "UPDATE users SET since = date'2020-01-01' WHERE note = E'it''s \\' done'",
            "CREATE TYPE mood AS ENUM ('sad', 'ok')",
            "ALTER TABLE users ADD COLUMN \"user\" text",
            "ALTER DEFAULT PRIVILEGES FOR USER app_owner GRANT SELECT ON TABLES TO reader",
            "INSERT INTO users SELECT * FROM plain_view",
            "UPDATE users SET note = 'back today at 10'",
            "ALTER TABLE users ADD COLUMN a int DEFAULT 1, ADD COLUMN r float8 DEFAULT random()",
            "WITH l AS (INSERT INTO users VALUES (1) RETURNING 1) UPDATE users SET a = 1",
            "INSERT INTO kv VALUES ('a'); UPDATE users SET v = v # 'x'",
            "DROP FUNCTION rotate_keys(integer)",
            "ALTER FUNCTION rotate_keys(integer) OWNER TO app",
            "COMMENT ON FUNCTION rotate_keys(integer) IS 'x'",
            "GRANT EXECUTE ON FUNCTION rotate_keys(integer) TO app",
            "DROP EXTENSION IF EXISTS pg_trgm",
            "UPDATE users SET email = pg_catalog.lower(email)",
            "ALTER TABLE users ADD COLUMN at timestamptz DEFAULT now()::timestamp(0)",
            "ALTER TABLE users ADD COLUMN k uuid NOT NULL DEFAULT gen_random_uuid(), ADD COLUMN j int",
            "UPDATE users SET note = E'line\\nbreak', n = U&'d\\0061t\\+000061'",
            "SET lock_timeout = '5s'; SET search_path TO app, public",
            "SELECT pg_sleep(2); SELECT pg_sleep('0.5')",
            "UPDATE users SET day = created_at::date, t = '2025-01-01'::timestamptz, u = date_trunc('day', created_at)::date",
            "UPDATE users SET d = CAST(created_at AS date), e = CAST('2025-01-01' AS date), f = to_date(s, 'YYYY')::date",
            "ALTER TABLE users ALTER COLUMN at TYPE timestamp(0), ADD COLUMN d date",
            "BEGIN; SET LOCAL lock_timeout = '1s'; ALTER TABLE users ADD COLUMN e int; COMMIT;",
            "UPDATE posts SET body = 'right now', tags = '{news,today-ish}', meta = '{\"when\": \"soon\"}'",
            // A file that runs whole is one transaction under test as on promote.
            "SET LOCAL search_path = scratch; UPDATE orders SET amount = 0",
        ] {
            assert_eq!(why(sql), Vec::<String>::new(), "{sql}");
        }
    }

    #[test]
    fn code_that_can_look_around_is_opaque() {
        let cases = [
            ("DO $$ BEGIN UPDATE users SET email = 'x'; END $$", "DO block"),
            ("do language plpgsql 'begin null; end'", "DO block"),
            ("CALL reset_all()", "CALL"),
            ("PREPARE p AS DELETE FROM users; EXECUTE p", "prepared"),
            ("UPDATE users SET email = 'x' WHERE current_database() = 'prod'", "current_database()"),
            ("DELETE FROM users WHERE current_user = 'app'", "CURRENT_USER"),
            ("DELETE FROM users WHERE to_regnamespace('airlock_probe') IS NULL", "to_regnamespace()"),
            ("UPDATE users SET email = 'x' WHERE (SELECT count(*) FROM pg_stat_activity) > 3", "pg_stat_activity"),
            ("UPDATE users SET email = 'x' WHERE EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = 'p')", "pg_namespace"),
            ("UPDATE users SET email = 'x' WHERE now() > '2027-01-01'", "now()"),
            ("UPDATE users SET a = 1 WHERE random() < 0.5", "random()"),
            ("SELECT setval('users_id_seq', 1) WHERE version() LIKE '%x%'", "version()"),
            ("SELECT rotate_keys(1)", "rotate_keys()"),
            ("SELECT app.\"Mixed\"()", "mixed()"),
            ("INSERT INTO audited VALUES (1)", "triggers"),
            ("CREATE FUNCTION g() RETURNS void LANGUAGE sql AS 'DELETE FROM users'; SELECT g()", "g()"),
            ("CREATE TRIGGER t BEFORE INSERT ON users FOR EACH ROW EXECUTE FUNCTION f(); INSERT INTO users VALUES (1)", "triggers"),
            ("CREATE RULE r AS ON INSERT TO users DO INSTEAD NOTHING; INSERT INTO public.users VALUES (1)", "rule"),
            ("SELECT query_to_xml('DELETE FROM users RETURNING 1', true, true, '')", "query_to_xml()"),
            ("UPDATE users SET a = pg_database_size(current_database())", "pg_database_size()"),
            ("UPDATE users SET n = (SELECT reltuples FROM pg_class WHERE relname = 'users')", "pg_class"),
            ("DELETE FROM users WHERE user = 'app'", "USER"),
            ("CREATE USER MAPPING FOR USER SERVER s", "USER"),
            ("INSERT INTO scored DEFAULT VALUES", "defaults, checks or indexes run rotate_keys()"),
            ("UPDATE public.checked SET a = 2", "run rotate_keys()"),
            ("INSERT INTO users SELECT k FROM keyed", "view keyed"),
            ("UPDATE users SET n = 'users'::regclass::int", "casts to regclass"),
            ("UPDATE users SET at = CURRENT_TIMESTAMP(6)", "CURRENT_TIMESTAMP"),
            ("UPDATE users SET at = 'today 00:00'::timestamptz", "'today 00:00'"),
            ("UPDATE users SET at = 'yesterday 12:00+02'", "'yesterday 12:00+02'"),
            ("UPDATE users SET note = DEFAULT, n = random() * 10", "random()"),
            ("WITH l AS (INSERT INTO users VALUES (1) RETURNING 1) UPDATE audited SET a = 1", "audited"),
            ("TRUNCATE TABLE audited", "audited"),
            ("UPDATE users SET v = 'no'\n'w'::timestamptz::text", "'now'"),
            ("UPDATE users SET v = \"xmin\"::text || \"ctid\"::text", "xmin"),
            ("UPDATE users SET v = 'users'::\"regclass\"::int", "regclass"),
            ("UPDATE kv SET k = 'beta' WHERE k = 'b'", "carry the write to child"),
            ("UPDATE flags SET on_ = false", "triggers or rules"),
            ("UPDATE users SET v = (CAST(v AS tag_t)).label", "type tag_t"),
            ("UPDATE users SET v = v ## 'x'", "operator ##"),
            ("INSERT INTO users SELECT 1 ON CONFLICT (id) DO UPDATE SET a = 2; DELETE FROM ONLY public.audited", "audited"),
            ("UPDATE users SET n = 1 WHERE EXISTS (SELECT FROM U&\"\\0070g_namespace\")", "Unicode-escaped"),
            ("SET standard_conforming_strings = off", "standard_conforming_strings"),
            ("DELETE FROM users WHERE created < 'now'", "'now'"),
            ("DELETE FROM users WHERE day = 'Tomorrow'::date", "'tomorrow'"),
            ("DELETE FROM users TABLESAMPLE BERNOULLI (50)", "TABLESAMPLE"),
            ("UPDATE users SET id2 = gen_random_uuid()", "gen_random_uuid()"),
            ("DELETE FROM users WHERE xmin::text::int % 2 = 0", "xmin"),
            ("DELETE FROM users WHERE 'users'::regclass::oid > 20000", "casts to oid"),
            ("DELETE FROM users WHERE nextval('s') > 1000", "nextval()"),
            ("NOTIFY cache_flush, 'all'", "NOTIFY"),
            ("SELECT lo_unlink(16400)", "lo_unlink()"),
            ("CREATE OPERATOR === (LEFTARG = int, RIGHTARG = int, FUNCTION = rotate_keys)", "operator that runs rotate_keys"),
            ("CREATE FUNCTION h(int, int) RETURNS int LANGUAGE sql AS 'SELECT 1'; CREATE AGGREGATE a(int) (SFUNC = h, STYPE = int)", "aggregate that runs h"),
            ("SELECT setval('users_id_seq', 9223372036854775807)", "setval()"),
            ("CREATE FUNCTION is_prod(users) RETURNS bool LANGUAGE sql AS $$SELECT true$$; UPDATE users u SET a = 1 WHERE u.is_prod", "names is_prod"),
            ("UPDATE users u SET a = 1 WHERE u.rotate_keys > 0", "names rotate_keys"),
            ("DELETE FROM users WHERE getpgusername() = 'app'", "getpgusername()"),
            ("DELETE FROM users WHERE row_security_active('users')", "row_security_active()"),
            ("UPDATE users SET v = database_to_xmlschema(true, true, '')::text", "database_to_xmlschema()"),
            ("UPDATE users SET v = table_to_xml_and_xmlschema('users', true, true, '')::text", "xmlschema()"),
            ("UPDATE users SET v = shobj_description(1, 'pg_database')", "shobj_description()"),
            ("DELETE FROM users WHERE EXISTS (SELECT FROM pg_group)", "pg_group"),
            ("DELETE FROM users WHERE EXISTS (SELECT FROM pg_catalog.pg_db_role_setting)", "pg_db_role_setting"),
            ("DELETE FROM users WHERE EXISTS (SELECT FROM pg_policies)", "pg_policies"),
            ("UPDATE users SET n = (regclass 'users')::int", "regclass"),
            ("UPDATE users SET n = regclass('users')::int", "regclass"),
            ("UPDATE users SET n = oid '123'", "oid"),
            ("RESET ALL", "puts settings back"),
            ("RESET TimeZone", "puts settings back"),
            ("DISCARD ALL", "puts settings back"),
            ("UPDATE accounts SET at = ('{now}'::timestamptz[])[1]", "reads the time"),
            ("UPDATE accounts SET t = lower('[now,infinity)'::tstzrange)", "reads the time"),
            ("UPDATE accounts SET t = (jsonb_populate_record(NULL::accounts, '{\"paid_until\": \"now\"}')).paid_until", "reads the time"),
            ("ALTER TABLE users ADD COLUMN a boolean DEFAULT ((jsonb_populate_record(NULL::accounts, '{\"paid_until\": \"NoW\"}')).paid_until > '2026-12-03')", "reads the time"),
            ("UPDATE users SET r = '(1,x,today)'::users", "reads the time"),
            ("-- note\rDO $$ BEGIN NULL; END $$", "DO block"),
            ("UPDATE kv SET v = 'a' -- tidy\rWHERE now() > '2026-01-01'", "now()"),
            ("DROP DATABASE IF EXISTS shop_staging", "acts on the server beyond this database"),
            ("ALTER DATABASE shop CONNECTION LIMIT 0", "acts on the server beyond this database"),
            ("CREATE ROLE reporting", "acts on the server beyond this database"),
            ("ALTER USER app_owner PASSWORD 'x'", "acts on the server beyond this database"),
            ("REASSIGN OWNED BY app_owner TO app_admin", "acts on the server beyond this database"),
            ("COMMENT ON DATABASE shop IS 'x'", "acts on the server beyond this database"),
            ("ALTER SYSTEM SET work_mem = '1GB'", "acts on the server beyond this database"),
            ("SET DateStyle TO DEFAULT", "sets a setting to"),
            ("SET search_path = DEFAULT", "sets a setting to"),
            ("UPDATE users SET at = E'\\164oday'::date", "'today'"),
            ("UPDATE users SET at = E'\\x74oday'::date", "'today'"),
            ("UPDATE users SET at = ('to' || 'day')::date", "'today'"),
            ("UPDATE users SET at = U&'\\0074oday'::date", "'today'"),
            ("ALTER TABLE users ADD COLUMN suspended bool NOT NULL DEFAULT (now() > '2026-08-01')", "now()"),
            ("ALTER TABLE users ADD COLUMN k int DEFAULT CASE WHEN random() > 0.5 THEN 1 ELSE 0 END", "random()"),
            ("UPDATE users SET n = 1 WHERE (SELECT true FROM pg_sleep((SELECT count(*) FROM users) / 1000))", "pg_sleep()"),
            ("ALTER TABLE users ADD COLUMN function int DEFAULT rotate_keys(1)", "rotate_keys()"),
            ("UPDATE users SET at = concat('no', 'w')::timestamptz", "casts text it computes to timestamptz"),
            ("UPDATE users SET at = reverse('won')::timestamptz", "casts text it computes"),
            ("UPDATE users SET d = CAST(translate('xoday', 'x', 't') AS date)", "casts text it computes to date"),
            ("UPDATE users SET d = date(format('%sday', 'to'))", "casts text it computes to date"),
            ("UPDATE users SET d = ('{\"a\": \"now\"}'::jsonb ->> 'a')::date", "casts text it computes to date"),
            ("SELECT * FROM ts_stat('SELECT to_tsvector(current_user)')", "ts_stat()"),
            ("ALTER TABLE users ADD COLUMN flag text DEFAULT now()::text; UPDATE users SET flag = 'x' WHERE id = 1", "writes flag, which the file filled"),
            ("INSERT INTO users SELECT a FROM who", "view who, which read current_setting"),
            ("DELETE FROM users WHERE id IN (SELECT id FROM notes)", "notes, whose row policies read current_user"),
            ("UPDATE notes SET body = 'x'", "writes notes, whose row policies read current_user"),
        ];
        for (sql, said) in cases {
            let got = why(sql);
            assert!(got.iter().any(|w| w.contains(said)), "{sql}: {got:?}");
        }
    }
}
