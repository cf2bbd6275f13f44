//! Which golden columns a candidate's text may overwrite: those an `UPDATE`
//! sets (also the `UPDATE SET` of a `MERGE` or of `INSERT ... ON CONFLICT`)
//! and those an `ALTER COLUMN ... TYPE` converts, in its statements and in the
//! bodies of the functions and `DO` blocks it holds.
//!
//! A name that does not resolve to one golden table (a view, a table renamed
//! on the way, a name a search path decides) is not trusted: the columns it
//! sets are read in every golden table that has them.

use std::collections::{BTreeMap, BTreeSet};

use airlock_postgres::catalog::{split_qualified, Catalog};
use airlock_postgres::split::Statement;

use super::Making;
use crate::code::lexer::{tokens, word, Token};

/// How deep constants inside constants are read (a `DO` block inside a
/// function body is two); deeper ones are not, so no file can make the
/// reading recurse without end.
const NESTING_MOST: usize = 8;

/// A golden table's columns a candidate may overwrite.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `schema.name`, as the catalog names it.
    pub table: String,
    /// Its columns, unquoted, in the golden's order.
    pub columns: Vec<String>,
    /// Those of `columns` whose every new value is computed from its own old
    /// value (`qty = qty + 1`, a retype without `USING` a constant): such a
    /// change loses a value only where it maps two old values to one.
    pub from_itself: BTreeSet<String>,
    /// Those of `columns` whose every new value keeps nothing of the old one
    /// that a rule could give back: computed from the row's other columns
    /// alone, or the old value cut to a part ([`Discard`]).
    pub discards: BTreeMap<String, Discard>,
    /// The line of the first statement that names them (or, where none
    /// does, that updated the table's rows).
    pub line: usize,
    /// Whether a statement names them; else they are all the table's
    /// columns, compared because its rows were updated out of the text's
    /// sight ([`super::unnamed`]).
    pub named: bool,
}

impl Target {
    /// How the file made `column`'s new values, for the loss rule.
    pub fn making(&self, column: &str) -> Making {
        match self.discards.get(column) {
            _ if self.from_itself.contains(column) => Making::Itself,
            Some(discard) => Making::Discarding(discard.clone()),
            None => Making::Mixed,
        }
    }
}

/// How a column's new value keeps nothing of its old one, so that a row
/// whose new value no other row holds lost its value all the same (the
/// merge rule sees no loss there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discard {
    /// Computed from the row's other columns and constants alone, never its
    /// own value (`slug = lower(name)`, `price = id / 100.0`).
    Others,
    /// Its own value cut to a part, or hashed, by the named function
    /// (`date_trunc('day', at)`, `round(price)`, `left(name, 50)`,
    /// `md5(phone)`).
    Cut(String),
    /// Values from other rows or tables, never its own (`UPDATE ... FROM`,
    /// a subquery, the rows an upsert or a `MERGE` offers).
    Elsewhere,
}

/// A name as written (`[schema, name]` or `[name]`; empty when the statement
/// does not say) and the columns set, each with how its new value is made.
type Named = (Vec<String>, BTreeMap<String, Making>);

/// The columns `statements` set or retype, of tables in `tables` (the
/// golden's, keyed and small enough to read).
pub fn targets(statements: &[Statement], catalog: &Catalog, tables: &BTreeSet<String>) -> Vec<Target> {
    let mut found: BTreeMap<String, Target> = BTreeMap::new();
    let mut renames = Renames::default();
    for st in statements {
        for (name, columns) in named(&st.sql).into_iter().filter(|(_, columns)| !columns.is_empty()) {
            let resolved = renames.table(&name).or_else(|| resolve(&name, catalog));
            let candidates: Vec<&String> = match &resolved {
                Some(tables) => tables.iter().collect(),
                // Not one golden table: every one with such a column.
                None => catalog
                    .tables
                    .iter()
                    .filter(|(_, t)| t.columns.iter().any(|c| columns.contains_key(&c.name)))
                    .map(|(k, _)| k)
                    .collect(),
            };
            for table in candidates.into_iter().filter(|t| tables.contains(*t)) {
                let golden = &catalog.tables[table];
                let t = found.entry(table.clone()).or_insert_with(|| Target {
                    table: table.clone(),
                    columns: vec![],
                    from_itself: BTreeSet::new(),
                    discards: BTreeMap::new(),
                    line: st.line,
                    named: true,
                });
                // Set under the name an earlier statement gave the column.
                let columns: BTreeMap<&str, &Making> =
                    columns.iter().map(|(c, made)| (renames.column(table, c), made)).collect();
                for c in golden.columns.iter() {
                    let Some(made) = columns.get(c.name.as_str()) else { continue };
                    if !t.columns.contains(&c.name) {
                        t.columns.push(c.name.clone());
                        match made {
                            Making::Itself => drop(t.from_itself.insert(c.name.clone())),
                            Making::Discarding(d) => drop(t.discards.insert(c.name.clone(), d.clone())),
                            Making::Mixed => {}
                        }
                        continue;
                    }
                    // Set again, another way: from itself only if every
                    // statement computes it so; discarding if any statement
                    // discards, since its rows lost their values whatever
                    // another statement did (one that sets nothing, too).
                    if **made != Making::Itself {
                        t.from_itself.remove(&c.name);
                    }
                    if let Making::Discarding(d) = made {
                        t.discards.entry(c.name.clone()).or_insert_with(|| d.clone());
                    }
                }
            }
        }
        renames.read(&st.sql, catalog);
    }
    set_null_by_keys(statements, catalog, tables, &mut found);
    found.into_values().filter(|t| !t.columns.is_empty()).collect()
}

/// Foreign-key columns a change of their referenced table's rows sets to
/// NULL or their default (`ON UPDATE SET NULL`, `ON DELETE SET DEFAULT`...):
/// their values go though no statement names them. Read for every table
/// whose referenced table the file updates or deletes from.
fn set_null_by_keys(
    statements: &[Statement],
    catalog: &Catalog,
    tables: &BTreeSet<String>,
    found: &mut BTreeMap<String, Target>,
) {
    for st in statements {
        let touched: Vec<String> =
            touched(&st.sql).iter().filter_map(|name| resolve(name, catalog)).flatten().collect();
        if touched.is_empty() {
            continue;
        }
        for (table, t) in catalog.tables.iter().filter(|(name, _)| tables.contains(*name)) {
            for definition in t.constraints.values().filter(|d| d.starts_with("FOREIGN KEY (")) {
                let nulls = definition.contains(" SET NULL") || definition.contains(" SET DEFAULT");
                let parent = crate::definitions::fk_target(definition);
                let parent: Vec<String> = parent.split('.').map(|p| p.trim_matches('"').to_owned()).collect();
                let refers = resolve(&parent, catalog).is_some_and(|p| p.iter().any(|p| touched.contains(p)));
                if !nulls || !refers {
                    continue;
                }
                let target = found.entry(table.clone()).or_insert_with(|| Target {
                    table: table.clone(),
                    columns: vec![],
                    from_itself: BTreeSet::new(),
                    discards: BTreeMap::new(),
                    line: st.line,
                    named: true,
                });
                for column in crate::definitions::key_columns(definition) {
                    if !target.columns.contains(&column) {
                        target.columns.push(column.clone());
                    }
                    target.from_itself.remove(&column);
                    target.discards.remove(&column);
                }
            }
        }
    }
}

/// The tables a statement's text updates or deletes from.
fn touched(sql: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for said in token_lists(sql, &["update", "delete"]) {
        for (i, t) in said.iter().enumerate() {
            let after = match t {
                Token::Word(w) if w == "update" => i + 1,
                Token::Word(w) if w == "delete" && word(said.get(i + 1), "from") => i + 2,
                _ => continue,
            };
            let only = usize::from(word(said.get(after), "only"));
            out.extend(name(&said[after + only..]).map(|(n, _)| n));
        }
    }
    out
}

/// The tokens of a statement, and of every constant in it (a function's or
/// a `DO` block's body) whose text holds one of `words`, to [`NESTING_MOST`]
/// levels: each text is read once, and no file can make reading recurse
/// without end.
fn token_lists(sql: &str, words: &[&str]) -> Vec<Vec<Token>> {
    let mut out = Vec::new();
    let mut pending = vec![(tokens(sql), 0usize)];
    while let Some((said, depth)) = pending.pop() {
        for t in &said {
            if let Token::Constant(body) = t {
                let lower = body.to_ascii_lowercase();
                if depth < NESTING_MOST && words.iter().any(|w| lower.contains(w)) {
                    pending.push((tokens(body), depth + 1));
                }
            }
        }
        out.push(said);
    }
    out
}

/// What one statement's text sets or retypes, and every constant in it.
fn named(sql: &str) -> Vec<Named> {
    let mut out = Vec::new();
    for said in token_lists(sql, &["update", "type", "new"]) {
        // A trigger's function setting a column of the row it writes.
        let assigned = assignments(&said);
        if !assigned.is_empty() {
            out.push((vec![], assigned));
        }
        // The table a bare `UPDATE SET` (of MERGE or ON CONFLICT) writes,
        // and the names its row goes by there (its own, its alias).
        let (mut into, mut own): (Vec<String>, Vec<String>) = (vec![], vec![]);
        for (i, t) in said.iter().enumerate() {
            match t {
                Token::Word(w) if w == "into" => {
                    if let Some((name, took)) = name(&said[i + 1..]) {
                        own = row_names(&name, &said[i + 1 + took..]);
                        into = name;
                    }
                }
                // Its values come from the rows offered (a MERGE's source,
                // `excluded`), not from the row's own columns alone.
                Token::Word(w) if w == "update" && word(said.get(i + 1), "set") => out.extend(
                    set_list(&said[i + 2..], &own).map(|columns| (into.clone(), from_elsewhere(columns))),
                ),
                Token::Word(w) if w == "update" => out.extend(update(&said[i + 1..])),
                Token::Word(w) if w == "alter" && word(said.get(i + 1), "table") => {
                    out.extend(alter_types(&said[i + 2..]))
                }
                _ => {}
            }
        }
    }
    out
}

/// Functions whose value is the time of the change: a trigger stamping the
/// row with one keeps a record, and overwrites nothing anyone would keep.
const CLOCK: &[&str] = &[
    "now",
    "current_timestamp",
    "clock_timestamp",
    "statement_timestamp",
    "transaction_timestamp",
    "localtimestamp",
    "current_date",
    "current_time",
    "localtime",
];

/// Whether an expression is the clock's time alone (`now()`,
/// `current_timestamp`, `now() AT TIME ZONE 'utc'`, `now()::date`): a
/// column set to it stamps the row with the change, whatever it held.
fn stamps_the_clock(expression: &[Token]) -> bool {
    let clock = |t: &Token| matches!(t, Token::Word(w) if CLOCK.contains(&w.as_str()));
    expression.iter().any(clock)
        && made_of(expression, |t, cast| match t {
            Token::Word(w) => {
                clock(t) || cast || ["at", "time", "zone", "with", "without"].contains(&w.as_str())
            }
            Token::Constant(_) | Token::Number(_) => true,
            Token::Other(c) => "():.".contains(*c),
            _ => false,
        })
}

/// Whether every token of `expression` is `allowed` (told whether it
/// follows `:`, as a cast's type does).
fn made_of(expression: &[Token], allowed: impl Fn(&Token, bool) -> bool) -> bool {
    expression.iter().enumerate().all(|(i, t)| allowed(t, i >= 1 && expression[i - 1] == Token::Other(':')))
}

/// `NEW.column := expr;` (or `=`) in a trigger function's body: each column
/// set, and how its value is made ([`made`]: `NEW.version := OLD.version + 1`
/// is from itself). A row stamped with the clock is left out.
fn assignments(said: &[Token]) -> BTreeMap<String, Making> {
    let mut out = BTreeMap::new();
    for (i, t) in said.iter().enumerate() {
        let starts = i == 0
            || matches!(&said[i - 1], Token::Other(';'))
            || matches!(&said[i - 1], Token::Word(w) if ["begin", "then", "else", "loop"].contains(&w.as_str()));
        if !starts || !word(Some(t), "new") || said.get(i + 1) != Some(&Token::Other('.')) {
            continue;
        }
        let Some(column) = ident(said.get(i + 2)) else { continue };
        let mut at = i + 3;
        if said.get(at) == Some(&Token::Other(':')) {
            at += 1;
        }
        if said.get(at) != Some(&Token::Other('=')) {
            continue;
        }
        // To the statement's end, or a word that begins another (so each
        // token is read by one expression, and a file in proportion to its length).
        let ends = |t: &Token| {
            *t == Token::Other(';')
                || matches!(t, Token::Word(w) if ["begin", "then", "else", "loop", "end"].contains(&w.as_str()))
        };
        let end = said[at..].iter().position(ends).map_or(said.len(), |p| at + p);
        // `OLD.x` and `NEW.x` read as `x`.
        let mut expression: Vec<Token> = Vec::new();
        let mut k = at + 1;
        while k < end {
            let row = word(said.get(k), "old") || word(said.get(k), "new");
            if row && said.get(k + 1) == Some(&Token::Other('.')) {
                k += 2;
                continue;
            }
            expression.push(said[k].clone());
            k += 1;
        }
        if stamps_the_clock(&expression) {
            continue;
        }
        let made = made(&expression, &column, &[]);
        match out.get(&column) {
            Some(before) if *before != made => drop(out.insert(column, Making::Mixed)),
            _ => drop(out.insert(column, made)),
        }
    }
    out
}

/// The names an earlier statement of the file gave the golden's tables and
/// columns (`ALTER TABLE ... RENAME [COLUMN] a TO b`), so a later `UPDATE`
/// under the new names sets the golden's columns all the same.
#[derive(Default)]
struct Renames {
    /// A table's name now (as written, unqualified) to the golden tables it may be.
    tables: BTreeMap<String, Vec<String>>,
    /// A golden table's column's name now to the golden's name.
    columns: BTreeMap<(String, String), String>,
}

impl Renames {
    /// The golden tables `name` now means, if a rename made it.
    fn table(&self, name: &[String]) -> Option<Vec<String>> {
        self.tables.get(name.last()?).cloned()
    }

    /// The golden's name of the column of `table` now called `column`.
    fn column<'a>(&'a self, table: &str, column: &'a str) -> &'a str {
        self.columns.get(&(table.to_owned(), column.to_owned())).map_or(column, String::as_str)
    }

    /// Takes the renames of one statement.
    fn read(&mut self, sql: &str, catalog: &Catalog) {
        let said = tokens(sql);
        if !word(said.first(), "alter") || !word(said.get(1), "table") {
            return;
        }
        let mut at = 2;
        if word(said.get(at), "if") && word(said.get(at + 1), "exists") {
            at += 2;
        }
        if word(said.get(at), "only") {
            at += 1;
        }
        let Some((name, took)) = name(&said[at..]) else { return };
        let Some(tables) = self.table(&name).or_else(|| resolve(&name, catalog)) else { return };
        at += took;
        if !word(said.get(at), "rename") {
            return;
        }
        at += 1;
        if word(said.get(at), "to") {
            if let Some(new) = ident(said.get(at + 1)) {
                self.tables.remove(name.last().expect("a name has a part"));
                self.tables.insert(new, tables);
            }
            return;
        }
        if word(said.get(at), "column") {
            at += 1;
        }
        let (Some(old), true, Some(new)) =
            (ident(said.get(at)), word(said.get(at + 1), "to"), ident(said.get(at + 2)))
        else {
            return;
        };
        for table in tables {
            let golden = self.columns.remove(&(table.clone(), old.clone())).unwrap_or(old.clone());
            self.columns.insert((table, new.clone()), golden);
        }
    }
}

fn ident(t: Option<&Token>) -> Option<String> {
    match t {
        Some(Token::Word(w)) | Some(Token::Quoted(w)) => Some(w.clone()),
        _ => None,
    }
}

/// A possibly qualified name at the start of `tokens`, and how many tokens it took.
fn name(tokens: &[Token]) -> Option<(Vec<String>, usize)> {
    let first = ident(tokens.first())?;
    if tokens.get(1) == Some(&Token::Other('.')) {
        let second = ident(tokens.get(2))?;
        return Some((vec![first, second], 3));
    }
    Some((vec![first], 1))
}

/// `[ONLY] name [*] [[AS] alias] SET ...`.
fn update(rest: &[Token]) -> Option<Named> {
    let mut i = usize::from(word(rest.first(), "only"));
    let (table, took) = name(&rest[i..])?;
    i += took;
    if rest.get(i) == Some(&Token::Other('*')) {
        i += 1;
    }
    if word(rest.get(i), "as") {
        i += 1;
    }
    let own = row_names(&table, &rest[i..]);
    if !word(rest.get(i), "set") {
        i += 1;
    }
    if !word(rest.get(i), "set") {
        return None;
    }
    Some((table, set_list(&rest[i + 1..], &own)?))
}

/// The names a statement's target row goes by, for telling its own columns
/// from another row's (`o.total` against `s.total`): its table's name, and
/// the alias after it (`[AS] alias`), if any.
fn row_names(table: &[String], after: &[Token]) -> Vec<String> {
    let mut own: Vec<String> = table.last().cloned().into_iter().collect();
    let after = if word(after.first(), "as") { &after[1..] } else { after };
    if let Some(Token::Word(alias) | Token::Quoted(alias)) = after.first() {
        const NOT_ALIASES: &[&str] =
            &["set", "using", "values", "select", "default", "overriding", "on", "where"];
        if !NOT_ALIASES.contains(&alias.as_str()) {
            own.push(alias.clone());
        }
    }
    own
}

/// Words that begin another statement: a SET list or an ALTER TABLE ends
/// before one, whatever its depth, so each token is read by one list and
/// reading a file takes time in proportion to its length.
const STATEMENT_WORDS: &[&str] = &["update", "alter", "merge", "insert", "delete", "create", "drop"];

/// Functions that compute a value from one value alone and keep it
/// distinct enough to be undone, or merge values where they do (which the
/// loss rule then sees among the changed rows themselves).
const OWN_VALUE_FUNCTIONS: &[&str] = &[
    "round", "trunc", "floor", "ceil", "ceiling", "abs", "lower", "upper", "btrim", "trim", "ltrim", "rtrim",
];

/// Whether an expression computes a column from its own value alone: the
/// column, numbers and string constants, arithmetic and concatenation,
/// casts, and [`OWN_VALUE_FUNCTIONS`]. A `CASE`, a comparison, another
/// column or any other function can pick which rows get which value, and
/// is not.
fn own_value(expression: &[Token], column: &str) -> bool {
    let itself = |t: &Token| matches!(t, Token::Word(w) | Token::Quoted(w) if w == column);
    expression.iter().any(itself)
        && made_of(expression, |t, cast| match t {
            _ if itself(t) => true,
            Token::Word(w) => cast || OWN_VALUE_FUNCTIONS.contains(&w.as_str()),
            Token::Constant(_) | Token::Number(_) => true,
            // (A comma here separates a function's arguments.)
            Token::Other(c) => "+-*/%|().:,".contains(*c),
            _ => false,
        })
}

/// `column = expr, (a, b) = (...), c[1] = ...`: each column set, and how its
/// expression makes its value ([`made`]).
fn set_list(rest: &[Token], own: &[String]) -> Option<BTreeMap<String, Making>> {
    let mut columns = BTreeMap::new();
    let mut i = 0;
    loop {
        // The column(s) this item sets.
        let mut set = Vec::new();
        let tuple = rest.get(i) == Some(&Token::Other('('));
        if tuple {
            i += 1;
            while let Some(t) = rest.get(i) {
                i += 1;
                match t {
                    Token::Other(')') => break,
                    t => set.extend(ident(Some(t))),
                }
            }
        } else {
            set.extend(ident(rest.get(i)));
        }
        // `c[1] = ...`, `c.field = ...`: a part of the value set, the rest kept.
        let part = !tuple && rest.get(i + 1) != Some(&Token::Other('='));
        // Its expression: to a comma, a clause or the end, at depth zero.
        let (mut depth, mut expression) = (0usize, Vec::new());
        let mut more = false;
        // (After the column's own name and its `=`.)
        let start = i + usize::from(!tuple) + 1;
        while let Some(t) = rest.get(i) {
            match t {
                // (A CASE's WHEN is not a MERGE's.)
                Token::Word(w) if w == "case" => depth += 1,
                Token::Word(w) if w == "end" && depth > 0 => depth -= 1,
                Token::Other('(') | Token::Other('[') => depth += 1,
                Token::Other(')') | Token::Other(']') if depth == 0 => break,
                Token::Other(')') | Token::Other(']') => depth -= 1,
                Token::Other(',') if depth == 0 => {
                    more = true;
                    i += 1;
                    break;
                }
                Token::Other(';') => break,
                Token::Word(w) if STATEMENT_WORDS.contains(&w.as_str()) => break,
                Token::Word(w)
                    if depth == 0 && ["from", "where", "returning", "when", "on"].contains(&w.as_str()) =>
                {
                    break
                }
                _ => {}
            }
            if i >= start {
                expression.push(t.clone());
            }
            i += 1;
        }
        if !tuple && stamps_the_clock(&expression) {
            // A stamp of the change's time (`updated_at = now()`): a record
            // kept, as a trigger keeps it, not a value overwritten.
            set.clear();
        }
        for column in &set {
            // A tuple's expression sets several columns: none from itself alone.
            columns.insert(
                column.clone(),
                if tuple || part { Making::Mixed } else { made(&expression, column, own) },
            );
        }
        if !more {
            // `UPDATE ... SET ... FROM other`: the values may be another
            // table's rows, not the row's own columns.
            if word(rest.get(i), "from") {
                return Some(from_elsewhere(columns)).filter(|c| !c.is_empty());
            }
            break;
        }
    }
    Some(columns).filter(|c| !c.is_empty())
}

/// Columns whose values may come from rows other than their own (a
/// `FROM`, a `MERGE`'s source, `excluded`): those that do not read their
/// own value take values from elsewhere.
fn from_elsewhere(mut columns: BTreeMap<String, Making>) -> BTreeMap<String, Making> {
    for made in columns.values_mut() {
        if *made == Making::Discarding(Discard::Others) {
            *made = Making::Discarding(Discard::Elsewhere);
        }
    }
    columns
}

/// Functions that keep a part of a value and drop the rest: applied to a
/// column alone (`date_trunc('day', created_at)`, `left(name, 50)`), each
/// changed value lost what they dropped, whether or not it met another.
const CUTTING_FUNCTIONS: &[&str] = &[
    "date_trunc",
    "round",
    "trunc",
    "floor",
    "ceil",
    "ceiling",
    "left",
    "substr",
    "substring",
    "split_part",
    "md5",
    "sha224",
    "sha256",
    "sha384",
    "sha512",
    "digest",
    "hashtext",
    "crypt",
];

/// Those of [`CUTTING_FUNCTIONS`] that keep a hash of the value, not a part.
pub const HASHING_FUNCTIONS: &[&str] =
    &["md5", "sha224", "sha256", "sha384", "sha512", "digest", "hashtext", "crypt"];

/// How `expression` computes `column`'s new value: a cut of the column
/// alone ([`cut_by`]), from its own value alone ([`own_value`]), from the
/// row's other columns and constants alone, from other rows (a subquery,
/// `excluded`) without its own value, or otherwise. `own` names the row
/// (its table, its alias): `x.column` for another `x` is another row's
/// (none given: any is taken for its own).
fn made(expression: &[Token], column: &str, own: &[String]) -> Making {
    if let Some(function) = cut_by(expression, column) {
        return Making::Discarding(Discard::Cut(function));
    }
    if own_value(expression, column) {
        return Making::Itself;
    }
    let reads_itself = reads(expression, column, own);
    let elsewhere =
        expression.iter().any(|t| matches!(t, Token::Word(w) if w == "select" || w == "excluded"));
    match (reads_itself || expression.is_empty(), elsewhere) {
        (true, _) => Making::Mixed,
        (false, true) => Making::Discarding(Discard::Elsewhere),
        (false, false) => Making::Discarding(Discard::Others),
    }
}

/// Whether `expression` reads `column`'s own value in a way that can shape
/// its new value: not another row's `x.column` (see [`made`]), not
/// `column * 0`, and not as the last fallback of a `coalesce` whose
/// earlier arguments do not read it (`coalesce(deleted_at, created_at)`
/// replaces it wherever `deleted_at` holds a value).
fn reads(expression: &[Token], column: &str, own: &[String]) -> bool {
    let zero = |t: Option<&Token>| matches!(t, Some(Token::Number(n)) if n.trim_start_matches('0').trim_start_matches('.').trim_start_matches('0').is_empty());
    let star = |t: Option<&Token>| t == Some(&Token::Other('*'));
    let at = |i: usize| -> bool {
        let named = matches!(&expression[i], Token::Word(w) | Token::Quoted(w) if w == column);
        let qualifier =
            match (i.checked_sub(2).map(|q| &expression[q]), i.checked_sub(1).map(|d| &expression[d])) {
                (Some(Token::Word(q) | Token::Quoted(q)), Some(Token::Other('.'))) => Some(q),
                _ => None,
            };
        let start = if qualifier.is_some() { i - 2 } else { i };
        let times_zero = (star(expression.get(i + 1)) && zero(expression.get(i + 2)))
            || (start >= 2 && star(expression.get(start - 1)) && zero(expression.get(start - 2)));
        named && !times_zero && qualifier.is_none_or(|q| own.is_empty() || own.contains(q))
    };
    let read: Vec<usize> = (0..expression.len()).filter(|i| at(*i)).collect();
    // `coalesce(a, ..., column)`: the column read only as its last argument.
    if let ([Token::Word(f), Token::Other('('), inner @ .., Token::Other(')')], Some(&last)) =
        (expression, read.last())
    {
        let mut depth = 0usize;
        let last_comma = inner
            .iter()
            .enumerate()
            .filter_map(|(k, t)| {
                match t {
                    Token::Other('(') => depth += 1,
                    Token::Other(')') => depth = depth.saturating_sub(1),
                    Token::Other(',') if depth == 0 => return Some(k + 2),
                    _ => {}
                }
                None
            })
            .last();
        let only_last = last_comma
            .is_some_and(|c| read.iter().all(|r| *r > c) && expression.len() - 1 - c <= 4 && last > c);
        if f == "coalesce" && only_last {
            return false;
        }
    }
    !read.is_empty()
}

/// The function of [`CUTTING_FUNCTIONS`] that `expression` applies to
/// `column` alone, with constants for its other arguments and perhaps a
/// cast after: `round(price)`, `date_trunc('day', at)::date`,
/// `substring(name from 1 for 50)`. Arithmetic inside (`round(price * 1.1,
/// 2)`) makes a value of the column's own, not a cut of it.
fn cut_by(expression: &[Token], column: &str) -> Option<String> {
    let Some(Token::Word(function)) = expression.first() else { return None };
    if !CUTTING_FUNCTIONS.contains(&function.as_str()) || expression.get(1) != Some(&Token::Other('(')) {
        return None;
    }
    let close = expression.iter().position(|t| *t == Token::Other(')'))?;
    let (arguments, after) = (&expression[2..close], &expression[close + 1..]);
    let itself = |t: &Token| matches!(t, Token::Word(w) | Token::Quoted(w) if w == column);
    let arguments_fit = arguments.iter().filter(|t| itself(t)).count() == 1
        && made_of(arguments, |t, cast| match t {
            _ if itself(t) => true,
            Token::Word(w) => cast || w == "from" || w == "for",
            Token::Constant(_) | Token::Number(_) => true,
            Token::Other(c) => ",:-".contains(*c),
            _ => false,
        });
    // Only a cast may follow (`::date`, `::numeric(12, 2)`), or constants
    // joined on (`md5(email) || '@anon.invalid'`), which add nothing of it.
    let joined = after.len() >= 3
        && after.chunks(3).all(|c| matches!(c, [Token::Other('|'), Token::Other('|'), Token::Constant(_)]));
    let cast_after = after.is_empty()
        || joined
        || (after.starts_with(&[Token::Other(':'), Token::Other(':')])
            && made_of(&after[2..], |t, _| {
                matches!(t, Token::Word(_) | Token::Number(_) | Token::Other('(' | ')' | ','))
            }));
    (arguments_fit && cast_after).then(|| function.clone())
}

/// `[IF EXISTS] [ONLY] name ... ALTER [COLUMN] c [SET DATA] TYPE t [USING e]`.
/// A retype converts each value from itself, unless `USING` says otherwise;
/// `json` to `jsonb` without `USING` changes how values are written, not
/// what they say, and is left out.
fn alter_types(rest: &[Token]) -> Option<Named> {
    let mut i = 0;
    if word(rest.first(), "if") && word(rest.get(1), "exists") {
        i = 2;
    }
    if word(rest.get(i), "only") {
        i += 1;
    }
    let (table, took) = name(&rest[i..])?;
    i += took;
    let mut columns = BTreeMap::new();
    while i < rest.len() {
        // Another statement's ALTER TABLE (in a function body, say) is its own.
        if rest[i] == Token::Other(';') || (word(rest.get(i), "alter") && word(rest.get(i + 1), "table")) {
            break;
        }
        if word(rest.get(i), "alter") {
            let mut j = i + 1;
            if word(rest.get(j), "column") {
                j += 1;
            }
            if let Some(column) = ident(rest.get(j)) {
                let mut at = j + 1;
                if word(rest.get(at), "set") && word(rest.get(at + 1), "data") {
                    at += 2;
                }
                if word(rest.get(at), "type") {
                    // The subcommand runs to a comma at depth zero.
                    let (mut depth, mut k, mut using) = (0usize, at + 1, None);
                    while let Some(t) = rest.get(k) {
                        match t {
                            Token::Other('(') => depth += 1,
                            Token::Other(')') => depth = depth.saturating_sub(1),
                            Token::Other(',') if depth == 0 => break,
                            Token::Other(';') => break,
                            Token::Word(w) if w == "alter" => break,
                            Token::Word(w) if w == "using" && depth == 0 => using = Some(k),
                            _ => {}
                        }
                        k += 1;
                    }
                    match using {
                        Some(u) => {
                            // What a type cannot hold is judged by `narrowed`;
                            // here, whether `USING` reads the value at all.
                            let expression = &rest[u + 1..k];
                            let itself = expression.iter().any(|t| ident(Some(t)).as_ref() == Some(&column));
                            let made = match (itself, made(expression, &column, &[])) {
                                (true, cut @ Making::Discarding(Discard::Cut(_))) => cut,
                                (true, _) => Making::Itself,
                                (false, made) => made,
                            };
                            columns.insert(column, made);
                        }
                        None if word(rest.get(at + 1), "jsonb") => {}
                        None => {
                            columns.insert(column, Making::Itself);
                        }
                    }
                }
            }
        }
        i += 1;
    }
    Some((table, columns))
}

/// The golden tables a name written in the candidate may mean: a qualified
/// name's own; for an unqualified one, every table of that name in any
/// schema (a search path decides which). `None` when there is none, or the
/// statement named no table.
fn resolve(name: &[String], catalog: &Catalog) -> Option<Vec<String>> {
    let (schema, table) = match name {
        [schema, table] => (Some(schema.as_str()), table.as_str()),
        [table] => (None, table.as_str()),
        _ => return None,
    };
    let found: Vec<String> = catalog
        .tables
        .keys()
        .filter(|k| {
            let (s, t) = split_qualified(k);
            t == table && schema.is_none_or(|want| s == want)
        })
        .cloned()
        .collect();
    Some(found).filter(|f| !f.is_empty())
}
