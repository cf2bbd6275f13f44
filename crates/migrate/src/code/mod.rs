//! Which statements of a migration run code whose effect may depend on where
//! they run: the `opaque_code` hazard.
//!
//! A test fork can always be told apart from production (its probe, its
//! database's name, its data, its clock), so what a test saw of code that
//! looks around tells nothing of what that code does on the target. Such code
//! is found here from the file's tokens, read the way PostgreSQL's lexer
//! reads them (quotes, dollar quotes, nested comments, `E''` and `U&''`
//! escapes): a `DO` block past plain PL/pgSQL or that commits as it goes
//! (a plain one is judged by what it runs: [`blocks`]), `CALL`, a prepared
//! statement; a function the
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

mod blocks;
pub(crate) mod lexer;
#[cfg(test)]
mod tests;
mod words;

use lexer::{tokens, Token};
use words::*;
pub use words::{fills_by_chance, fills_by_chance_sql};

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
    let mut plain = plain_functions(catalog);
    // A function the file makes, replaces or alters (its settings, its
    // owner) is its code, whatever the golden's was: an index that runs
    // the golden's `norm()` runs the new body once it is replaced.
    for st in statements {
        let tokens = tokens(&st.sql);
        let words: Vec<&str> = tokens
            .iter()
            .filter_map(|t| match t {
                Token::Word(w) => Some(w.as_str()),
                _ => None,
            })
            .take(4)
            .collect();
        let about_routine = match words.as_slice() {
            ["create", "or", "replace", kind, ..] | ["create" | "alter", kind, ..] => {
                matches!(*kind, "function" | "procedure" | "routine" | "aggregate")
            }
            _ => false,
        };
        if about_routine {
            for t in &tokens {
                if let Token::Word(w) | Token::Quoted(w) = t {
                    plain.remove(&w.to_ascii_lowercase());
                }
            }
        }
    }
    opaque_with(&blocks_read(statements), catalog, &plain, true)
}

/// Whether the runner runs `sql` outside a transaction block.
fn outside_transactions(sql: &str) -> bool {
    airlock_postgres::split::kind(sql) == airlock_postgres::split::Kind::NoTransaction
}

/// `statements`, with each `DO` block whose body is plain PL/pgSQL and
/// never commits ([`blocks`]) replaced by what it runs, at its line: such a
/// block does what those statements would, inside the file's transaction,
/// which promote checks before it commits. A block that commits as it
/// goes stays, beside what it runs: what it commits is checked only after.
fn blocks_read(statements: &[Statement]) -> Vec<Statement> {
    let mut out = Vec::with_capacity(statements.len());
    for st in statements {
        let Some(block) = blocks::read(&lexer::tokens_keeping_case(&st.sql)) else {
            out.push(st.clone());
            continue;
        };
        // Run outside a transaction block (as the runner decides it, by any
        // `COMMIT` or `ROLLBACK` in its text), it is checked only after.
        if block.commits || outside_transactions(&st.sql) {
            out.push(st.clone());
        }
        out.extend(block.parts.into_iter().map(|sql| Statement { sql, line: st.line }));
    }
    out
}

/// The names of the golden's functions that run nothing a test could tell
/// from production: every function of the name is written in SQL (its body
/// in the catalog, vouched for by its digest, which promote finds the same
/// on the target or refuses), and its body is plain SQL by this module's
/// own rule, calling no function the database holds. Such a function does
/// what the file's own statements would: computes from its arguments and
/// the data, which promote's row check compares.
///
/// Every body is judged in one pass, so the catalog is read for it once,
/// not once a function (a golden of thousands of functions would otherwise
/// cost thousands of readings). Each body's statements carry its number as
/// their line, which tells the bodies apart in what is found. What one body
/// sets going for the next (a rule it makes, a function it defines) can only
/// make the next opaque, never plain.
fn plain_functions(catalog: &Catalog) -> BTreeSet<String> {
    let Some(bodies) = &catalog.sql_bodies else { return BTreeSet::new() };
    let keys: Vec<&String> = bodies.keys().collect();
    let mut statements = Vec::new();
    let mut opaque_bodies = BTreeSet::new();
    for (i, key) in keys.iter().enumerate() {
        match airlock_postgres::split::split(&bodies[*key]) {
            Ok(body) => statements.extend(body.into_iter().map(|s| Statement { line: i + 1, ..s })),
            Err(_) => {
                opaque_bodies.insert(i + 1);
            }
        }
    }
    // In a body a name may be a parameter, whose text the caller computes.
    opaque_bodies
        .extend(opaque_with(&statements, catalog, &BTreeSet::new(), false).into_iter().map(|o| o.line));
    let plain_keys: BTreeSet<&String> =
        keys.iter().enumerate().filter(|(i, _)| !opaque_bodies.contains(&(i + 1))).map(|(_, k)| *k).collect();
    let mut plain: BTreeMap<String, bool> = BTreeMap::new();
    for key in catalog.functions.keys() {
        *plain.entry(function_name(key)).or_insert(true) &= plain_keys.contains(key);
    }
    plain.into_iter().filter(|(_, p)| *p).map(|(name, _)| name).collect()
}

/// [`opaque`], with the golden's functions named in `plain` taken as plain
/// SQL; `names_are_columns` where no name can be a function's parameter.
fn opaque_with(
    statements: &[Statement],
    catalog: &Catalog,
    plain: &BTreeSet<String>,
    names_are_columns: bool,
) -> Vec<Opaque> {
    let mut functions: BTreeSet<String> =
        catalog.functions.keys().map(|k| function_name(k)).filter(|f| !plain.contains(f)).collect();
    // Sequences, read as relations (`SELECT last_value FROM s`): their
    // position differs where the file runs. The file's own join them.
    let mut sequences: BTreeSet<String> = catalog
        .sequences
        .keys()
        .map(|k| airlock_postgres::catalog::split_qualified(k).1.to_ascii_lowercase())
        .collect();
    // Tables with triggers, and the events they fire on.
    let triggered: BTreeMap<String, BTreeSet<String>> = catalog
        .tables
        .iter()
        .filter(|(_, t)| !t.triggers.is_empty())
        .map(|(name, t)| {
            let events = t.triggers.values().flat_map(|def| trigger_events(&tokens(def))).collect();
            (airlock_postgres::catalog::split_qualified(name).1.to_ascii_lowercase(), events)
        })
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
            triggered.insert(unqualified(table), ANY_EVENT.iter().map(|e| e.to_string()).collect());
        }
    }
    // Tables, and composite, domain and range types, that hold a time: text
    // cast into one (`concat('(1,x,to', 'day)')::users`) reads its time by
    // the clock's rules.
    let time_rows: BTreeSet<String> = catalog
        .tables
        .iter()
        .filter(|(_, t)| t.columns.iter().any(|c| names_a_time(&c.type_name)))
        .map(|(name, _)| unqualified(name))
        .chain(catalog.types.iter().filter(|(_, d)| names_a_time(d)).map(|(name, _)| unqualified(name)))
        .collect();
    // Columns that hold a time of day: given a zone (`AT TIME ZONE`, a cast
    // into `timetz`), one takes its offset from the date it runs on.
    let days_clock: BTreeSet<String> = catalog
        .tables
        .values()
        .flat_map(|t| &t.columns)
        .filter(|c| {
            let ty = c.type_name.to_ascii_lowercase();
            ty.starts_with("time") && !ty.starts_with("timestamp")
        })
        .map(|c| c.name.clone())
        .collect();
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
    // Which tables a write reaches through foreign keys that act on it, and
    // as what, by parent: (the write to the parent, the child, the write the
    // action makes there). A cascaded delete deletes; SET NULL, SET DEFAULT
    // and a cascaded update update. An update of a parent carries nothing
    // through a key that acts only on delete.
    type Carried = (&'static str, String, &'static str);
    let mut cascades: BTreeMap<String, Vec<Carried>> = BTreeMap::new();
    for (name, t) in &catalog.tables {
        for definition in t.constraints.values() {
            let toks = tokens(definition);
            let Some(parent) = word_after(&toks, "references") else { continue };
            for w in toks.windows(3) {
                let [Token::Word(on), Token::Word(event), Token::Word(action)] = w else { continue };
                if on != "on" || !(action == "cascade" || action == "set") {
                    continue;
                }
                let (on_event, makes) = match (event.as_str(), action.as_str()) {
                    ("delete", "cascade") => ("delete", "delete"),
                    ("delete", _) => ("delete", "update"),
                    ("update", _) => ("update", "update"),
                    _ => continue,
                };
                cascades.entry(parent.clone()).or_default().push((on_event, unqualified(name), makes));
            }
        }
    }
    let reached = |table: &str, events: &'static [&'static str]| {
        let mut seen: BTreeSet<(String, &'static str)> =
            events.iter().map(|e| (table.to_owned(), *e)).collect();
        let mut next: Vec<(String, &'static str)> = seen.iter().cloned().collect();
        while let Some((t, event)) = next.pop() {
            for (on, child, makes) in cascades.get(&t).into_iter().flatten() {
                if *on == event && seen.insert((child.clone(), makes)) {
                    next.push((child.clone(), makes));
                }
            }
        }
        seen
    };
    let mut triggered_here: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
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
        // Whether the statement reads rows through views and row policies:
        // a query, a write, code, or a table made from a query. DDL about a
        // table (a column added, a comment, a grant, a policy) reads none.
        let runs_queries = match words.first() {
            Some(&"create") => {
                words.iter().any(|w| matches!(*w, "table" | "materialized"))
                    && tokens.iter().any(|t| matches!(t, Token::Word(w) if w == "select"))
            }
            Some(w) => matches!(
                *w,
                "select"
                    | "insert"
                    | "update"
                    | "delete"
                    | "merge"
                    | "with"
                    | "copy"
                    | "table"
                    | "values"
                    | "do"
                    | "call"
                    | "execute"
                    | "explain"
                    | "refresh"
                    | "declare"
                    | "fetch"
                    | "prepare"
            ),
            None => false,
        };
        if definition_statement {
            for (i, t) in tokens.iter().enumerate() {
                if matches!(t, Token::Word(w) if TIME_WORDS.contains(&w.as_str())) && defaulted(&tokens, i) {
                    filled_here.extend(filled_column_at(&tokens, i));
                }
            }
        }
        if words.first() == Some(&"create") && words.contains(&"sequence") {
            let named = tokens.iter().skip_while(|t| !matches!(t, Token::Word(w) if w == "sequence")).skip(1);
            let named: Vec<&Token> = named
                .filter(|t| !matches!(t, Token::Word(w) if w == "if" || w == "not" || w == "exists"))
                .collect();
            let last = named
                .iter()
                .take_while(|t| matches!(t, Token::Word(_) | Token::Quoted(_) | Token::Other('.')))
                .last();
            if let Some(Token::Word(n) | Token::Quoted(n)) = last {
                sequences.insert(n.to_ascii_lowercase());
            }
        }
        match words.as_slice() {
            ["do", ..] => why(match blocks::read(&lexer::tokens_keeping_case(&st.sql)) {
                Some(block) if block.commits || outside_transactions(&st.sql) => {
                    "a DO block that commits as it goes (what it commits is checked only after it is kept)".into()
                }
                _ => "a DO block (code that can look where it runs)".into(),
            }),
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
                    triggered_here.entry(table).or_default().extend(trigger_events(&tokens));
                }
                continue;
            }
            // A policy's conditions run when rows are read (its table's
            // readers are judged for that), and an enum's labels are names:
            // making either runs nothing.
            ["create" | "alter", "policy", ..] | ["create", "type", _, "as", "enum", ..] => continue,
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
            // A limit on waiting changes how long the file may wait, not what
            // it does: put back to the target's own, it says nothing of the data.
            ["reset", setting] if WAIT_LIMITS.contains(setting) => continue,
            ["set", setting, ..] | ["set", "local" | "session", setting, ..] if WAIT_LIMITS.contains(setting) => continue,
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
        // A table's triggers that fire on `events` (any, for a table a
        // foreign key carries the write to).
        let fires = |table: &str, events: &[&str]| {
            [triggered.get(table), triggered_here.get(table)]
                .into_iter()
                .flatten()
                .any(|on| events.iter().any(|e| on.contains(*e)))
        };
        for (table, carried, events) in written_tables(&tokens) {
            let reaches = match carried {
                true => reached(&table, events),
                false => events.iter().map(|e| (table.clone(), *e)).collect(),
            };
            let coded = reaches
                .into_iter()
                .find(|(t, event)| (t != &table && fires(t, &[event])) || coded_tables.contains_key(t))
                .map(|(t, _)| t);
            if let Some(t) = coded.filter(|t| *t != table) {
                why(format!("writes {table}, whose foreign keys carry the write to {t}, whose triggers, rules or defaults run code"));
            } else if fires(&table, events) {
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
                Token::Other(_) | Token::Number(_) => continue,
            };
            let before = |back: usize| i.checked_sub(back).and_then(|j| tokens.get(j));
            let after_from =
                |back: usize| matches!(before(back), Some(Token::Word(w)) if w == "from" || w == "join");
            let as_relation =
                after_from(1) || (matches!(before(1), Some(Token::Other('.'))) && after_from(3));
            if as_relation && sequences.contains(&name.to_ascii_lowercase()) {
                why(format!("reads sequence {name} as a table, whose position differs where it runs"));
                continue;
            }
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
                } else if let Some((_, read_by)) = LEXER_SETTINGS.iter().find(|(s, _)| *s == word) {
                    if !sets_to(&words, &tokens, i, read_by) {
                        why(format!("names {word}, which changes how what follows is read"));
                    }
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
            if name == "uescape" {
                why("a Unicode escape with an escape character of its own (UESCAPE), which this check does not read".into());
                continue;
            }
            // set_config(name, value, local): a setting named as text, set to
            // a constant. One that changes how the rest is read, a value of
            // NULL (the target's own setting put back) or one computed as it
            // runs is code.
            if name == "set_config" && called {
                let constant = |t: Option<&Token>| matches!(t, Some(Token::Constant(_) | Token::Number(_)));
                match (tokens.get(i + 2), tokens.get(i + 3), tokens.get(i + 4), tokens.get(i + 5)) {
                    (Some(Token::Constant(setting)), Some(Token::Other(',')), value, Some(Token::Other(',')))
                        if constant(value) =>
                    {
                        let setting = setting.trim();
                        let to = match value {
                            Some(Token::Constant(v) | Token::Number(v)) => v.trim(),
                            _ => "",
                        };
                        if LEXER_SETTINGS.iter().any(|(s, read_by)| *s == setting && !read_by.contains(&to)) {
                            why(format!("sets {setting}, which changes how what follows is read"));
                        }
                    }
                    _ => why("set_config with a name or value it computes or leaves NULL, which may put back the target's own setting".into()),
                }
                continue;
            }
            if let Some(column) = zones_a_time_of_day(&tokens, i, &days_clock) {
                why(format!(
                    "gives {column}, a time of day, a time zone, whose offset PostgreSQL takes from the date it runs on"
                ));
                continue;
            }
            if matches!(token, Token::Word(_) | Token::Quoted(_))
                && casts_computed_text_to_time(
                    &tokens,
                    i,
                    definition_statement,
                    names_are_columns,
                    &time_rows,
                )
            {
                why(format!("casts text it computes to {name}: text can be the clock ('now')"));
                continue;
            }
            if RECORD_MAKERS.contains(&name.as_str()) && makes_times_of_computed_text(&tokens, i, &time_rows)
            {
                why(format!(
                    "turns text it computes into a time through {name}, by the time's own rules: text can be the clock ('now')"
                ));
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
            } else if let Some((what, f)) = coded_views.get(&name).filter(|_| !called && runs_queries) {
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
                    Some([Token::Number(_) | Token::Constant(_), Token::Other(')')])
                )
            {
                // A fixed wait decides nothing (what it waits for is read).
            } else if called && environment_function(&name) {
                why(format!("calls {name}(), which reads where or when it runs"));
            } else if matches!(token, Token::Word(_)) && ENVIRONMENT_KEYWORDS.contains(&name.as_str()) {
                // Called or not: CURRENT_TIMESTAMP(6) is the clock too.
                why(format!("reads {}", name.to_ascii_uppercase()));
            } else if !called
                && !about_extensions
                && runs_queries
                && reads_the_server(&name, tokens.get(i + 1))
            {
                why(format!("reads {name}, which shows the server, not the data"));
            }
        }
    }
    out.dedup();
    out
}

/// Whether the statement is `SET name = value` (or `TO`) for the setting
/// named at `i`, with a value among `values`: a setting made to what it
/// already is.
fn sets_to(words: &[&str], tokens: &[Token], i: usize, values: &[&str]) -> bool {
    let value = match (words.first(), tokens.get(i + 1)) {
        (Some(&"set"), Some(Token::Other('='))) => tokens.get(i + 2),
        (Some(&"set"), Some(Token::Word(to))) if to == "to" => tokens.get(i + 2),
        _ => None,
    };
    let value = match value {
        Some(Token::Word(v) | Token::Constant(v) | Token::Number(v)) => v.to_ascii_lowercase(),
        _ => return false,
    };
    i <= 2 && tokens.iter().skip(i + 3).all(|t| *t == Token::Other(';')) && values.contains(&value.as_str())
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
fn casts_computed_text_to_time(
    tokens: &[Token],
    i: usize,
    definition: bool,
    names_are_columns: bool,
    time_rows: &BTreeSet<String>,
) -> bool {
    // In a function's body, a name may be a parameter: only the bare forms
    // (`p::date`, `CAST(p AS date)`) pass there, as they always have.
    let column = |operand: &[Token], target: &str| names_are_columns && reads_a_column(operand, target);
    let Some(Token::Word(t) | Token::Quoted(t)) = tokens.get(i) else { return false };
    let named_at = i;
    // A qualified name (`pg_catalog.date`, `public.users`) is cast to as
    // its last part.
    let i = match (tokens.get(i.wrapping_sub(1)), tokens.get(i.wrapping_sub(2))) {
        (Some(Token::Other('.')), Some(Token::Word(_) | Token::Quoted(_))) => i - 2,
        _ => i,
    };
    // A row type that holds a time, by the `::` form only (its name stands
    // after `AS` and before `(` in much else).
    let after_colons = i >= 2 && tokens[i - 2] == Token::Other(':') && tokens[i - 1] == Token::Other(':');
    if !is_time_type(t) && !(time_rows.contains(t) && after_colons) {
        return false;
    }
    /// Whether the operand ending at `end` (exclusive) is computed: a
    /// parenthesised group or a call, found back from its `)`.
    fn operand_computed(
        tokens: &[Token],
        end: usize,
        target: &str,
        column: &dyn Fn(&[Token], &str) -> bool,
    ) -> bool {
        match tokens.get(end.wrapping_sub(1)) {
            // An element of an array or a slice of one: what it holds may be computed.
            Some(Token::Other(']')) => true,
            // A cast of a cast (`concat('no', 'w')::text::timestamptz`): the first one's operand.
            Some(Token::Word(_))
                if end >= 3
                    && tokens[end - 3] == Token::Other(':')
                    && tokens[end - 2] == Token::Other(':') =>
            {
                operand_computed(tokens, end - 3, target, column)
            }
            Some(Token::Other(')')) => {
                let Some(j) = lexer::opening(tokens, end - 1) else { return true };
                // A group after a keyword (`SELECT (...)`, `WHERE (...)`), not a call.
                let called = match tokens.get(j.wrapping_sub(1)) {
                    Some(Token::Word(w)) => !BEFORE_A_GROUP.contains(&w.as_str()),
                    Some(Token::Quoted(_)) => true,
                    _ => false,
                };
                // A column read in parentheses (`(created_at AT TIME ZONE
                // 'UTC')`, `(payload->>'at')`) is the data's, which promote
                // compares: no code computes it.
                if !called && column(&tokens[j + 1..end - 1], target) {
                    return false;
                }
                // A time made from numbers, or the clock read outright (which
                // is judged as such), is no text.
                !matches!(tokens.get(j.wrapping_sub(1)), Some(Token::Word(f))
                    if TIME_MAKERS.contains(&f.as_str()) || TIME_WORDS.contains(&f.as_str()))
            }
            _ => false,
        }
    }
    match (tokens.get(i.wrapping_sub(2)), tokens.get(i.wrapping_sub(1))) {
        (Some(Token::Other(':')), Some(Token::Other(':'))) => operand_computed(tokens, i - 2, t, &column),
        (_, Some(Token::Word(w))) if w == "as" => {
            // CAST ( operand AS type ): the operand is all between, from the
            // group that holds this `AS` (not a `cast` named as an alias in it).
            match lexer::enclosing(tokens, i - 1).and_then(|o| o.checked_sub(1)) {
                Some(c) if lexer::word(tokens.get(c), "cast") => {
                    let inner = &tokens[c + 2..i - 1];
                    // In a function's body only a bare name passes, as it always has.
                    let bare = matches!(
                        inner,
                        [Token::Word(_)] | [Token::Word(_), Token::Other('.'), Token::Word(_)]
                    );
                    let data = column(inner, t) || (bare && !names_are_columns);
                    !matches!(inner, [Token::Constant(_)])
                        && !data
                        && !matches!(inner.first(), Some(Token::Word(f)) if TIME_MAKERS.contains(&f.as_str()))
                }
                _ => false,
            }
        }
        // `timestamptz(...)` called as a function (in a definition, a
        // type's precision: `timestamp(0)`), on anything but a column
        // (`date(created_at)` is `created_at::date`).
        _ => {
            let Some(close) = lexer::closing(tokens, named_at + 1)
                .filter(|_| tokens.get(named_at + 1) == Some(&Token::Other('(')))
            else {
                return false;
            };
            let arguments = &tokens[named_at + 2..close];
            // A type's precision (`timestamp(0)`, in a definition or a cast), not a call.
            let precision = matches!(arguments, [Token::Number(_)]);
            // A time made from numbers, or the clock read outright (judged as such).
            let made = matches!(arguments.first(), Some(Token::Word(f))
                if TIME_MAKERS.contains(&f.as_str()) || TIME_WORDS.contains(&f.as_str()));
            !precision && !made && !(definition && arguments.is_empty()) && !column(arguments, t)
        }
    }
}

/// The golden column holding a time of day that the word at `i` gives a
/// zone: `column AT TIME ZONE ...`, `column::timetz`, `CAST(column AS
/// timetz)`, `timetz(column)` (a table's or alias's name before it or not).
fn zones_a_time_of_day(tokens: &[Token], i: usize, days_clock: &BTreeSet<String>) -> Option<String> {
    let column = |t: Option<&Token>| match t {
        Some(Token::Word(w) | Token::Quoted(w)) if days_clock.contains(w) => Some(w.clone()),
        _ => None,
    };
    if lexer::at_time_zone(tokens, i) {
        return column(tokens.get(i.wrapping_sub(1)));
    }
    let timetz = lexer::word(tokens.get(i), "timetz")
        || (lexer::word(tokens.get(i), "time")
            && lexer::word(tokens.get(i + 1), "with")
            && lexer::word(tokens.get(i + 2), "time"));
    if !timetz {
        return None;
    }
    match (tokens.get(i.wrapping_sub(2)), tokens.get(i.wrapping_sub(1)), tokens.get(i + 1)) {
        (Some(Token::Other(':')), Some(Token::Other(':')), _) => column(tokens.get(i.wrapping_sub(3))),
        (_, Some(Token::Word(w)), _) if w == "as" => column(tokens.get(i.wrapping_sub(2))),
        (_, _, Some(Token::Other('('))) => {
            column(tokens.get(i + 2)).filter(|_| tokens.get(i + 3) == Some(&Token::Other(')')))
        }
        _ => None,
    }
}

/// Whether `tokens`, cast into `target`, are a column read as the data
/// holds it, which no code computes: its name (`created_at`,
/// `t.created_at`, quoted or not), in parentheses or not, then steps into
/// its JSON by constant keys (`->`, `->>`, `#>`, `#>>`), casts into a date
/// or timestamp, and a time zone named outright (`AT TIME ZONE 'UTC'`,
/// `'Europe/Paris'`). Not a word that is a value of the server's
/// (`current_user`, `current_date`, `null`); not a zone that is a setting
/// (`'localtime'`, the host's; an abbreviation, read by
/// `timezone_abbreviations`); and no zone at all into a time of day
/// (`time`, `timetz`), whose zone's offset PostgreSQL takes from the date
/// it runs on.
fn reads_a_column(tokens: &[Token], target: &str) -> bool {
    let mut tokens = tokens;
    while let [Token::Other('('), inner @ .., Token::Other(')')] = tokens {
        if lexer::closing(tokens, 0) != Some(tokens.len() - 1) {
            break;
        }
        tokens = inner;
    }
    let name = |t: Option<&Token>| match t {
        Some(Token::Quoted(_)) => true,
        Some(Token::Word(w)) => {
            !ENVIRONMENT_KEYWORDS.contains(&w.as_str())
                && !LITERAL_WORDS.contains(&w.as_str())
                && !TIME_WORDS.contains(&w.as_str())
                && !environment_function(w)
        }
        _ => false,
    };
    if !name(tokens.first()) {
        return false;
    }
    let mut i = 1;
    while tokens.get(i) == Some(&Token::Other('.')) && name(tokens.get(i + 1)) {
        i += 2;
    }
    let of_day = matches!(target, "time" | "timetz");
    let op = |at: usize, symbol: &str| {
        symbol.chars().enumerate().all(|(k, c)| tokens.get(at + k) == Some(&Token::Other(c)))
    };
    loop {
        if i == tokens.len() {
            return true;
        }
        if let Some(n) = ["->>", "#>>", "->", "#>"].iter().find(|s| op(i, s)).map(|s| s.len()) {
            i += n;
            if tokens.get(i) == Some(&Token::Other('-')) {
                i += 1;
            }
            if !matches!(tokens.get(i), Some(Token::Constant(_) | Token::Number(_))) {
                return false;
            }
            i += 1;
        } else if op(i, "::")
            && matches!(tokens.get(i + 2), Some(Token::Word(w)) if matches!(w.as_str(), "date" | "timestamp" | "timestamptz"))
        {
            i += 3;
        } else if lexer::at_time_zone(tokens, i)
            && !of_day
            && matches!(tokens.get(i + 3), Some(Token::Constant(zone)) if named_outright(zone))
        {
            i += 4;
        } else {
            return false;
        }
    }
}

/// Whether a time zone's name says its rules itself: UTC, or a region's
/// (`Europe/Paris`). Not `localtime` (the host's own zone) nor an
/// abbreviation (`EST`, read by the `timezone_abbreviations` setting).
fn named_outright(zone: &str) -> bool {
    let zone = zone.trim();
    matches!(zone.to_ascii_uppercase().as_str(), "UTC" | "GMT" | "Z" | "ETC/UTC")
        || (zone.contains('/')
            && !zone.contains("..")
            && !zone.to_ascii_lowercase().contains("localtime")
            && zone.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '_' | '-' | '+')))
}

/// Whether a type's name as `format_type` spells it (or a composite's
/// fields, a domain's base, a range's subtype) holds a date or time.
fn names_a_time(type_name: &str) -> bool {
    type_name.to_ascii_lowercase().split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).any(is_time_type)
}

/// Whether the call of a JSON or hstore record maker at `i` takes text it
/// computes (a call or a join in its arguments) and makes a time of it: a
/// time type in the column definitions after it (`AS x(d date)`), or a row
/// type that holds one as its first argument (`NULL::users`).
fn makes_times_of_computed_text(tokens: &[Token], i: usize, time_rows: &BTreeSet<String>) -> bool {
    if tokens.get(i + 1) != Some(&Token::Other('(')) {
        return false;
    }
    let group_end = |open: usize| lexer::closing(tokens, open).unwrap_or(tokens.len());
    let close = group_end(i + 1);
    let arguments = tokens.get(i + 2..close).unwrap_or_default();
    let computed = arguments.iter().any(|t| *t == Token::Other('('))
        || arguments.windows(2).any(|w| w == [Token::Other('|'), Token::Other('|')]);
    let time = |t: &Token| match t {
        Token::Word(w) | Token::Quoted(w) => {
            let w = w.to_ascii_lowercase();
            is_time_type(&w) || time_rows.contains(&w)
        }
        _ => false,
    };
    // The row type it fills: its first argument.
    let first = arguments.iter().position(|t| *t == Token::Other(',')).map_or(arguments, |c| &arguments[..c]);
    // The column definitions: `[AS] [alias] (name type, ...)`, each type
    // after its name.
    let defined = (close + 1..(close + 4).min(tokens.len()))
        .find(|&j| tokens[j] == Token::Other('('))
        .is_some_and(|open| {
            let defs = tokens.get(open + 1..group_end(open)).unwrap_or_default();
            defs.split(|t| *t == Token::Other(',')).any(|def| def.iter().skip(1).any(time))
        });
    computed && (first.iter().any(time) || defined)
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
                    // A zone after it: `'today EST'`, `'tomorrow Europe/Berlin'`.
                    || ZONE_ABBREVIATIONS.contains(w)
                    || (w.contains('/') && w.chars().all(|c| c.is_ascii_alphanumeric() || "/_+-".contains(c)))
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
            Token::Other(':' | '+' | '-' | '*' | '/' | '.')
            | Token::Number(_)
            | Token::Constant(_)
            | Token::Quoted(_) => {}
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

/// Settings that only bound how long a statement or a wait may take.
const WAIT_LIMITS: &[&str] =
    &["lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout", "idle_session_timeout"];

/// Every trigger event, and a rule's (which acts on any write).
const ANY_EVENT: &[&str] = &["insert", "update", "delete", "truncate"];

/// The events a `CREATE TRIGGER` fires on: the words between its timing
/// (`BEFORE`, `AFTER`, `INSTEAD OF`) and its `ON` (`UPDATE OF a, b` is an
/// update); every event where the text does not say.
fn trigger_events(tokens: &[Token]) -> BTreeSet<String> {
    let words: Vec<&str> = tokens
        .iter()
        .filter_map(|t| match t {
            Token::Word(w) => Some(w.as_str()),
            _ => None,
        })
        .collect();
    let from = words.iter().position(|w| matches!(*w, "before" | "after" | "instead"));
    let to = from.and_then(|f| words[f..].iter().position(|w| *w == "on").map(|p| f + p));
    let found: BTreeSet<String> = match (from, to) {
        (Some(f), Some(t)) => {
            words[f..t].iter().filter(|w| ANY_EVENT.contains(w)).map(|w| w.to_string()).collect()
        }
        _ => BTreeSet::new(),
    };
    if found.is_empty() {
        return ANY_EVENT.iter().map(|e| e.to_string()).collect();
    }
    found
}

/// Every table a statement may write (unqualified, lowercased): after each
/// `INSERT INTO`, `UPDATE`, `DELETE FROM` and `MERGE INTO` (data-modifying
/// `WITH` parts included), and a `COPY` or `TRUNCATE`'s table; with whether
/// the write changes or removes rows (which foreign keys may carry on), and
/// the trigger events it fires (an `INSERT ... ON CONFLICT DO UPDATE` an
/// update's too, a `MERGE` any).
fn written_tables(tokens: &[Token]) -> Vec<(String, bool, &'static [&'static str])> {
    let mut out = Vec::new();
    let first = tokens.iter().position(|t| matches!(t, Token::Word(_)));
    let upserts = tokens
        .windows(2)
        .any(|w| matches!(w, [Token::Word(a), Token::Word(b)] if a == "do" && b == "update"));
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
            let events: &'static [&'static str] = match w.as_str() {
                "insert" if upserts => &["insert", "update"],
                "insert" | "copy" => &["insert"],
                "update" => &["update"],
                "delete" => &["delete"],
                "truncate" => &["truncate"],
                _ => ANY_EVENT,
            };
            // An INSERT or COPY adds rows, which no foreign key carries further.
            out.push((name, !matches!(w.as_str(), "insert" | "copy"), events));
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
