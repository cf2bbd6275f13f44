//! Values a migration overwrote: the columns an `UPDATE` sets or an `ALTER
//! COLUMN ... TYPE` converts, read by key before the candidate runs and after,
//! so the report can say which values are gone, not only that rows were
//! written.
//!
//! A row lost its value when it changed and its new value is one that rows
//! with another old value also hold now: `tier` from `'enterprise'` to
//! `'standard'` beside rows that were already `'standard'`, a name set to
//! `NULL`, a number rounded into its neighbour. A change that can be read
//! backwards (`price * 1.1`, `upper(email)`, a `NULL` filled in) loses
//! nothing, whatever it rewrote.
//!
//! Which columns to read comes from the candidate's text (its statements and
//! the bodies of the functions and `DO` blocks it holds); the values are read
//! through the reader's function, as text of the types' output functions, so
//! reading runs no code of the candidate's.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use airlock_core::error::Result;
use airlock_postgres::catalog::{quote_ident, split_qualified, Catalog};
use airlock_postgres::cell::Cell as _;
use airlock_postgres::split::Statement;

use super::code::lexer::{tokens, Token};
use super::report::{Hazard, Severity};
use super::verify::Shape;

/// Rows that must lose their value, at least, for a hazard: this many, or
/// [`SHARE_OF_TABLE`] of the table and [`SHARE_FLOOR`] rows.
pub const ROWS_LOST: usize = 1_000;
/// The share of a table's rows whose values lost make a hazard.
pub const SHARE_OF_TABLE: f64 = 0.1;
/// The fewest rows [`SHARE_OF_TABLE`] counts on a small table.
pub const SHARE_FLOOR: usize = 50;
/// The longest value a message quotes.
const QUOTED_MOST: usize = 40;

/// A golden table's columns a candidate may overwrite.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `schema.name`, as the catalog names it.
    pub table: String,
    /// Its columns, unquoted, in the golden's order.
    pub columns: Vec<String>,
    /// The line of the first statement that names them.
    pub line: usize,
}

/// The columns `statements` set by `UPDATE` or convert by `ALTER COLUMN ...
/// TYPE`, of tables in `tables` (the golden's, keyed and small enough to
/// read).
pub fn targets(statements: &[Statement], catalog: &Catalog, tables: &BTreeSet<String>) -> Vec<Target> {
    let mut found: BTreeMap<String, Target> = BTreeMap::new();
    for st in statements {
        for (name, columns) in named(&tokens(&st.sql)) {
            let Some(table) = resolve(&name, catalog).filter(|t| tables.contains(t)) else { continue };
            let golden = &catalog.tables[&table];
            let t = found.entry(table.clone()).or_insert(Target { table, columns: vec![], line: st.line });
            for c in golden.columns.iter().filter(|c| columns.contains(&c.name)) {
                if !t.columns.contains(&c.name) {
                    t.columns.push(c.name.clone());
                }
            }
        }
    }
    found.into_values().filter(|t| !t.columns.is_empty()).collect()
}

/// A name as written (`[schema, name]` or `[name]`) and the columns set.
type Named = (Vec<String>, BTreeSet<String>);

/// The tables and columns one statement's tokens update or retype, and those
/// of every constant in it (a function's or a `DO` block's body).
fn named(said: &[Token]) -> Vec<Named> {
    let mut out = Vec::new();
    for (i, t) in said.iter().enumerate() {
        match t {
            Token::Word(w) if w == "update" => out.extend(update(&said[i + 1..])),
            Token::Word(w) if w == "alter" && word(said.get(i + 1), "table") => {
                out.extend(alter_types(&said[i + 2..]))
            }
            Token::Constant(body) => {
                let lower = body.to_ascii_lowercase();
                if lower.contains("update") || lower.contains("type") {
                    out.extend(named(&tokens(body)));
                }
            }
            _ => {}
        }
    }
    out
}

fn word(t: Option<&Token>, w: &str) -> bool {
    matches!(t, Some(Token::Word(x)) if x == w)
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

/// `[ONLY] name [*] [[AS] alias] SET column = ..., (a, b) = ...`.
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
    if !word(rest.get(i), "set") {
        i += 1;
    }
    if !word(rest.get(i), "set") {
        return None;
    }
    i += 1;
    let mut columns = BTreeSet::new();
    let mut depth = 0usize;
    let mut item_start = true;
    while let Some(t) = rest.get(i) {
        match t {
            Token::Other('(') if item_start && depth == 0 => {
                // `(a, b) = ...`: every name up to the closing parenthesis.
                i += 1;
                while let Some(t) = rest.get(i) {
                    match t {
                        Token::Other(')') => break,
                        t => columns.extend(ident(Some(t))),
                    }
                    i += 1;
                }
                item_start = false;
            }
            Token::Other('(') | Token::Other('[') => depth += 1,
            Token::Other(')') | Token::Other(']') => {
                if depth == 0 {
                    break;
                }
                depth -= 1;
            }
            Token::Other(',') if depth == 0 => {
                item_start = true;
                i += 1;
                continue;
            }
            Token::Word(w) if depth == 0 && ["from", "where", "returning"].contains(&w.as_str()) => break,
            Token::Other(';') => break,
            t if item_start => {
                columns.extend(ident(Some(t)));
                item_start = false;
            }
            _ => {}
        }
        i += 1;
    }
    Some((table, columns))
}

/// `[IF EXISTS] [ONLY] name ... ALTER [COLUMN] c [SET DATA] TYPE ...`.
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
    let mut columns = BTreeSet::new();
    while i < rest.len() {
        if word(rest.get(i), "alter") {
            let mut j = i + 1;
            if word(rest.get(j), "column") {
                j += 1;
            }
            if let Some(column) = ident(rest.get(j)) {
                let at = j + 1;
                let retyped = word(rest.get(at), "type")
                    || (word(rest.get(at), "set")
                        && word(rest.get(at + 1), "data")
                        && word(rest.get(at + 2), "type"));
                if retyped {
                    columns.insert(column);
                }
            }
        }
        i += 1;
    }
    Some((table, columns))
}

/// The golden table a name written in the candidate means: a qualified
/// name's own, an unqualified one's in `public` first, else the only table
/// of that name.
fn resolve(name: &[String], catalog: &Catalog) -> Option<String> {
    let unquoted: Vec<(String, String)> = catalog.tables.keys().map(|k| split_qualified(k)).collect();
    let keys: Vec<&String> = catalog.tables.keys().collect();
    let matching = |schema: Option<&str>, table: &str| -> Vec<usize> {
        unquoted
            .iter()
            .enumerate()
            .filter(|(_, (s, t))| t == table && schema.is_none_or(|want| s == want))
            .map(|(i, _)| i)
            .collect()
    };
    let found = match name {
        [schema, table] => matching(Some(schema), table),
        [table] => match matching(Some("public"), table).as_slice() {
            [one] => vec![*one],
            _ => matching(None, table),
        },
        _ => vec![],
    };
    match found.as_slice() {
        [one] => Some(keys[*one].clone()),
        _ => None,
    }
}

/// One value read: a digest of the text its type's output function writes,
/// which is what values are compared by, and the start of that text, which
/// is all a message shows (`None` for NULL). A value the candidate wrote
/// can be as long as it likes; the daemon holds no more of it than this.
#[derive(Debug, Clone, Eq)]
pub struct Cell {
    /// MD5 of the value's text.
    pub digest: String,
    /// The first [`SHOWN_MOST`] characters of its text; `None` for NULL.
    pub shown: Option<String>,
}

impl PartialEq for Cell {
    fn eq(&self, other: &Cell) -> bool {
        self.digest == other.digest
    }
}

impl std::hash::Hash for Cell {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.digest.hash(state)
    }
}

impl Ord for Cell {
    fn cmp(&self, other: &Cell) -> std::cmp::Ordering {
        (&self.shown, &self.digest).cmp(&(&other.shown, &other.digest))
    }
}

impl PartialOrd for Cell {
    fn partial_cmp(&self, other: &Cell) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// The most characters of a value's text read for a message.
pub const SHOWN_MOST: usize = 200;

/// One table's targeted columns, by row key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Values {
    /// The columns read, in order.
    pub columns: Vec<String>,
    /// Each row's values, by its key.
    pub rows: HashMap<String, Vec<Cell>>,
}

/// Columns of one table to read by a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// `schema.name`.
    pub table: String,
    /// The key's columns, quoted, as the golden's key names them.
    pub key: String,
    /// The columns, unquoted.
    pub columns: Vec<String>,
}

/// Reads `targets`' columns that `catalog` (the schema at the time) still
/// has, keyed by the golden's key (tables without one, or without its
/// columns now, are left out), from an admin session through the reader.
pub async fn read(
    client: &tokio_postgres::Client,
    targets: &[Target],
    shape: &Shape,
    catalog: &Catalog,
) -> Result<BTreeMap<String, Values>> {
    let wanted: Vec<Wanted> = targets
        .iter()
        .filter_map(|t| {
            let key = shape.key(&t.table)?;
            Some(Wanted { table: t.table.clone(), key: key.to_owned(), columns: t.columns.clone() })
        })
        .collect();
    read_wanted(client, &wanted, catalog).await
}

/// Where the candidate may have kept the values it overwrote, in `now` (the
/// schema after it): columns it added to a target's table, and tables it
/// made that have the target's key columns.
pub fn keepers(targets: &[Target], shape: &Shape, golden: &Catalog, now: &Catalog) -> Vec<Wanted> {
    let mut out: Vec<Wanted> = Vec::new();
    for t in targets {
        let Some(key) = shape.key(&t.table) else { continue };
        let keyed = key_columns(key);
        let (Some(was), Some(is)) = (golden.tables.get(&t.table), now.tables.get(&t.table)) else { continue };
        let added: Vec<String> = is
            .columns
            .iter()
            .filter(|c| !was.columns.iter().any(|w| w.name == c.name))
            .map(|c| c.name.clone())
            .collect();
        if !added.is_empty() {
            out.push(Wanted { table: t.table.clone(), key: key.to_owned(), columns: added });
        }
        for (table, made) in now.tables.iter().filter(|(name, _)| !golden.tables.contains_key(*name)) {
            let has_key = keyed.iter().all(|k| made.columns.iter().any(|c| &c.name == k));
            if has_key && !out.iter().any(|w| &w.table == table) {
                let columns = made
                    .columns
                    .iter()
                    .filter(|c| !keyed.contains(&c.name))
                    .map(|c| c.name.clone())
                    .collect();
                out.push(Wanted { table: table.clone(), key: key.to_owned(), columns });
            }
        }
    }
    out
}

/// Reads each of `wanted` whose key's columns and columns `catalog` has
/// (those it has not are left out), by the reader's function.
pub async fn read_wanted(
    client: &tokio_postgres::Client,
    wanted: &[Wanted],
    catalog: &Catalog,
) -> Result<BTreeMap<String, Values>> {
    let mut out = BTreeMap::new();
    if wanted.is_empty() {
        return Ok(out);
    }
    let grant_each = airlock_postgres::catalog::ensure_reader(client).await?;
    let pinned = airlock_postgres::catalog::Pinned::pin(client).await?;
    let read = async {
        for w in wanted {
            let Some(now) = catalog.tables.get(&w.table) else { continue };
            let has = |name: &String| now.columns.iter().any(|c| &c.name == name);
            if !key_columns(&w.key).iter().all(has) {
                continue;
            }
            let columns: Vec<String> = w.columns.iter().filter(|c| has(c)).cloned().collect();
            if columns.is_empty() {
                continue;
            }
            // Each column as its digest and the start of its text.
            let fields: Vec<String> = columns
                .iter()
                .map(|c| {
                    let text = format!("ROW(t.{})::text", quote_ident(c));
                    format!("pg_catalog.md5({text}), pg_catalog.left({text}, {SHOWN_MOST})")
                })
                .collect();
            let value = format!("ROW({})", fields.join(", "));
            let most = super::verify::ROWS_READ_MOST + 1;
            let key = format!("ROW({})", w.key);
            let rows =
                super::verify::read_as_reader(client, grant_each, &w.table, &key, &value, most).await?;
            let mut values = Values { columns, rows: HashMap::with_capacity(rows.len()) };
            for r in rows {
                let (k, v): (String, String) = (r.cell(0)?, r.cell(1)?);
                let fields = record_fields(&v);
                let cells = fields
                    .chunks(2)
                    .map(|pair| Cell {
                        digest: pair[0].clone().unwrap_or_default(),
                        shown: pair.get(1).cloned().flatten().and_then(|t| record_fields(&t).swap_remove(0)),
                    })
                    .collect();
                values.rows.insert(k, cells);
            }
            out.insert(w.table.clone(), values);
        }
        Ok(out)
    }
    .await;
    if read.is_err() {
        let _ = client.batch_execute("ROLLBACK").await;
    }
    pinned.restore(client).await?;
    read
}

/// A key's columns (`id`, `"Tenant", id`), unquoted.
fn key_columns(key: &str) -> Vec<String> {
    key.split(", ")
        .map(|c| match c.strip_prefix('"').and_then(|c| c.strip_suffix('"')) {
            Some(inner) => inner.replace("\"\"", "\""),
            None => c.to_owned(),
        })
        .collect()
}

/// A name as a suggestion writes it: quoted only when it is not a plain
/// lowercase word.
fn written(name: &str) -> String {
    let plain = name.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain {
        name.to_owned()
    } else {
        quote_ident(name)
    }
}

/// The fields of a record as `record_out` writes it: `(a,"b c",)`, an empty
/// field being NULL.
pub fn record_fields(text: &str) -> Vec<Option<String>> {
    // (A record cut short has lost its closing parenthesis.)
    let inner = text.strip_prefix('(').unwrap_or(text);
    let inner = inner.strip_suffix(')').unwrap_or(inner);
    let mut out = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut any = false;
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            '"' => {
                quoted = !quoted;
                any = true;
            }
            '\\' if quoted => field.extend(chars.next()),
            ',' if !quoted => {
                out.push(if any || !field.is_empty() { Some(std::mem::take(&mut field)) } else { None });
                any = false;
            }
            c => field.push(c),
        }
    }
    out.push(if any || !field.is_empty() { Some(field) } else { None });
    out
}

/// What a column lost, measured over the rows read both times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    /// Rows whose value changed.
    pub changed: usize,
    /// Rows that held a value and now hold one that rows with another value
    /// hold too.
    pub lost: usize,
    /// Distinct values the lost rows held, and hold now.
    pub distinct: (usize, usize),
    /// By new value, most rows first: the rows that lost their value to it
    /// and the old values they held (a few, most common first).
    pub into: Vec<(Option<String>, usize, Vec<(Option<String>, usize)>)>,
    /// The keys of the rows that lost their value.
    pub keys: Vec<String>,
}

/// What `column` lost between `before` and `after`.
pub fn lost(before: &Values, after: &Values, column: &str) -> Option<Lost> {
    let was_at = before.columns.iter().position(|c| c == column)?;
    let now_at = after.columns.iter().position(|c| c == column)?;
    let pairs: Vec<(&String, &Cell, &Cell)> =
        before.rows.iter().filter_map(|(k, b)| Some((k, &b[was_at], &after.rows.get(k)?[now_at]))).collect();
    // Every old value behind each new value.
    let mut sources: HashMap<&Cell, BTreeSet<&Cell>> = HashMap::new();
    for (_, was, now) in &pairs {
        sources.entry(now).or_default().insert(was);
    }
    let mut changed = 0;
    let mut keys = Vec::new();
    let mut into: HashMap<&Cell, HashMap<&Cell, usize>> = HashMap::new();
    for (key, was, now) in &pairs {
        if was == now {
            continue;
        }
        changed += 1;
        if was.shown.is_some() && sources[now].len() > 1 {
            *into.entry(now).or_default().entry(was).or_default() += 1;
            keys.push((*key).clone());
        }
    }
    let lost: usize = into.values().flat_map(|w| w.values()).sum();
    let olds: BTreeSet<&Cell> = into.values().flat_map(|w| w.keys().copied()).collect();
    let mut into: Vec<(Option<String>, usize, Vec<(Option<String>, usize)>)> = into
        .into_iter()
        .map(|(now, was)| {
            let n = was.values().sum();
            let mut was: Vec<(Option<String>, usize)> =
                was.into_iter().map(|(v, n)| (v.shown.clone(), n)).collect();
            was.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            was.truncate(3);
            (now.shown.clone(), n, was)
        })
        .collect();
    into.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let distinct = (olds.len(), into.len());
    into.truncate(3);
    Some(Lost { changed, lost, distinct, into, keys })
}

/// Whether `lost` rows of a table of `rows` are enough for a hazard.
pub fn enough(lost: usize, rows: i64) -> bool {
    lost >= ROWS_LOST || (lost >= SHARE_FLOOR && lost as f64 >= SHARE_OF_TABLE * rows as f64)
}

/// Where `kept` holds, for every key in `keys`, the value `before` had in
/// `column`: `table.column`.
fn kept_in(
    keys: &[String],
    before: &Values,
    column: &str,
    kept: &BTreeMap<String, Values>,
) -> Option<String> {
    let at = before.columns.iter().position(|c| c == column)?;
    kept.iter().find_map(|(table, k)| {
        let holds =
            |i: usize| keys.iter().all(|key| Some(&before.rows[key][at]) == k.rows.get(key).map(|r| &r[i]));
        let i = (0..k.columns.len()).find(|i| holds(*i))?;
        Some(format!("{}.{}", airlock_postgres::catalog::short_name(table), written(&k.columns[i])))
    })
}

/// `values_overwritten` hazards for `targets`, from their values before the
/// candidate and after it; and notes for those whose every old value the
/// candidate kept (in `kept`: see [`keepers`]).
pub fn hazards(
    targets: &[Target],
    before: &BTreeMap<String, Values>,
    after: &BTreeMap<String, Values>,
    kept: &BTreeMap<String, Values>,
    rows_before: &BTreeMap<String, i64>,
    shape: &Shape,
) -> (Vec<Hazard>, Vec<Hazard>) {
    let (mut out, mut notes) = (Vec::new(), Vec::new());
    for t in targets {
        let (Some(b), Some(a)) = (before.get(&t.table), after.get(&t.table)) else { continue };
        let rows = rows_before.get(&t.table).copied().unwrap_or(b.rows.len() as i64);
        for column in &t.columns {
            let Some(l) = lost(b, a, column).filter(|l| enough(l.lost, rows)) else { continue };
            let groups: Vec<String> =
                l.into.iter().map(|(now, n, was)| group(column, *n, now, was)).collect();
            let table = airlock_postgres::catalog::short_name(&t.table);
            if let Some(place) = kept_in(&l.keys, b, column, kept) {
                notes.push(Hazard::new(
                    "values_overwritten",
                    Severity::Low,
                    format!(
                        "{} of the {} rows of {table} lost their {column} ({}), and the migration kept every old value in {place}",
                        count(l.lost),
                        count(rows as usize),
                        groups.join("; ")
                    ),
                    Some(t.line).filter(|l| *l > 0),
                ));
                continue;
            }
            let mut h = Hazard::new(
                "values_overwritten",
                Severity::High,
                format!(
                    "{} of the {} rows of {table} lost their {column}: {}{}; {} distinct values became {}, and what they were is not kept anywhere",
                    count(l.lost),
                    count(rows as usize),
                    groups.join("; "),
                    if l.into.len() < l.distinct.1 { "; ..." } else { "" },
                    count(l.distinct.0),
                    count(l.distinct.1),
                ),
                Some(t.line).filter(|l| *l > 0),
            );
            let key = shape.key(&t.table).unwrap_or("id");
            h.suggestion = Some(format!(
                "if the old values matter, keep them first, in the same migration (CREATE TABLE {} AS SELECT {key}, {} FROM {table}), or write the new values to a new column; batching does not bring them back",
                written(&format!("{}_{column}_before", split_qualified(&t.table).1)),
                written(column),
            ));
            out.push(h);
        }
    }
    (out, notes)
}

fn group(column: &str, n: usize, now: &Option<String>, was: &[(Option<String>, usize)]) -> String {
    match was {
        [(one, m)] if *m == n => format!("{} had {column} {}, now {}", count(n), shown(one), shown(now)),
        _ => {
            let some: Vec<String> = was.iter().map(|(v, _)| shown(v)).collect();
            format!("{} had other values (such as {}), now {}", count(n), some.join(", "), shown(now))
        }
    }
}

/// A value as a message quotes it: `NULL`, or in quotes, cut short.
fn shown(v: &Option<String>) -> String {
    match v {
        None => "NULL".into(),
        Some(s) if s.chars().count() > QUOTED_MOST => {
            format!("'{}...'", s.chars().take(QUOTED_MOST).collect::<String>())
        }
        Some(s) => format!("'{s}'"),
    }
}

/// A count with thousands separated: `20,000`.
fn count(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests;
