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
//! A value made without the old one (`slug = lower(name)`, from the row's
//! other columns alone) or cut from it (`date_trunc('day', at)`) keeps
//! nothing a rule could read back, so a row whose new value no other row
//! holds lost its value too ([`Discard`]); a relabel many rows share
//! (`'done'` to `'archived'`) still reads backwards.
//!
//! Rows no key pairs (a table without one, an `UPDATE` that sets the key
//! too, a table too big to read row by row) are compared by the count of
//! each value instead ([`counts`]).
//!
//! Which columns to read comes from the candidate's text (its statements and
//! the bodies of the functions and `DO` blocks it holds); the values are read
//! through the reader's function, as text of the types' output functions, so
//! reading runs no code of the candidate's.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use airlock_core::error::Result;
use airlock_postgres::catalog::{quote_ident, split_qualified, Catalog, Table};
use airlock_postgres::cell::Cell as _;

use super::report::{Hazard, Severity, StatementReport};
use super::verify::Shape;

/// Rows that must lose their value, at least, for a hazard: this many, or
/// [`SHARE_OF_TABLE`] of the table and [`SHARE_FLOOR`] rows.
pub const ROWS_LOST: usize = 1_000;
/// The share of a table's rows whose values lost make a hazard.
pub const SHARE_OF_TABLE: f64 = 0.1;
/// The fewest rows [`SHARE_OF_TABLE`] counts on a small table.
pub const SHARE_FLOOR: usize = 20;
/// The longest value a message quotes.
const QUOTED_MOST: usize = 40;

pub mod counts;
pub mod json_parts;
pub mod names;
pub mod narrowed;
mod targets;
pub mod unnamed;
pub use targets::{targets, Discard, Target};

/// One value read: a digest of the text its type's output function writes,
/// which is what values are compared by, and the start of that text, which
/// is all a message shows (`None` for NULL). A value the candidate wrote
/// can be as long as it likes; the daemon holds no more of it than this.
#[derive(Debug, Clone, Eq)]
pub struct Cell {
    /// MD5 of the value's text, as a number (16 bytes, where its hex
    /// took a string's 56).
    pub digest: u128,
    /// The first [`SHOWN_MOST`] characters of its text; `None` for NULL.
    pub shown: Option<String>,
}

/// The digest of NULL's text as a one-field record (`()`), which is how
/// every read writes a value.
pub const NULL_DIGEST: u128 = 0xbcd8b0c2eb1fce714eab6cef0d771acc;

impl Cell {
    /// Whether the value is NULL (told by its digest, so a read of digests
    /// alone tells it too).
    pub fn is_null(&self) -> bool {
        self.digest == NULL_DIGEST
    }
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

/// The most characters of a value's text read for a message, which quotes
/// [`QUOTED_MOST`] of them: enough more to tell that a value is longer, and
/// no more, since each row's value is held before and after.
pub const SHOWN_MOST: usize = 64;

/// A value read as [`Reading::Hash`]: its 64-bit hash (never
/// [`NULL_DIGEST`], which is wider), or NULL for an empty field.
fn hashed(field: &str) -> Cell {
    let digest = match field.parse::<i64>() {
        Ok(h) => h as u64 as u128,
        Err(_) => NULL_DIGEST,
    };
    Cell { digest, shown: None }
}

/// A value's MD5 (as the server writes it, in hex) as a number; any other
/// text by a digest of its own.
pub fn digest_of(hex: &str) -> u128 {
    u128::from_str_radix(hex, 16).unwrap_or_else(|_| {
        use sha2::Digest;
        let d = sha2::Sha256::digest(hex.as_bytes());
        u128::from_le_bytes(d[..16].try_into().expect("sixteen bytes"))
    })
}

/// One table's targeted columns, by row key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Values {
    /// The columns read, in order.
    pub columns: Vec<String>,
    /// Each row's values, by its key.
    pub rows: HashMap<String, Vec<Cell>>,
}

impl Values {
    /// Adds `other`'s columns (of the same table, read by the same key) to
    /// these; a row `other` lacks holds nothing in them.
    pub fn merge(&mut self, mut other: Values) {
        let empty = vec![Cell { digest: 0, shown: None }; other.columns.len()];
        for (key, cells) in self.rows.iter_mut() {
            cells.extend(other.rows.remove(key).unwrap_or_else(|| empty.clone()));
        }
        self.columns.append(&mut other.columns);
    }
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
    /// Read no more rows than this; a table that holds more is left out.
    pub most: i64,
    /// How each value is read.
    pub reading: Reading,
}

/// How a value is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// Its MD5 and the start of its text, for a message.
    Shown,
    /// Its MD5 alone, to compare with a value read [`Reading::Shown`].
    Digest,
    /// A 64-bit hash alone (several times cheaper for the server than an
    /// MD5), to compare only with values read so by the same server build,
    /// and NULL told apart: which columns of a wide table lost values.
    Hash,
    /// Its MD5 and, as JSON, the value's parts ([`json_parts::read_parts`]):
    /// what a document lost though it stayed unlike every other.
    Parts,
}

/// How long one read of values (before the candidate, after it, or of where
/// it kept them) may take, all its tables and columns together. A candidate
/// can make values that are cheap to write and dear to read (a default of a
/// long string, stored once; an index predicate that sleeps for the
/// reader): past this the read fails rather than hold the test up.
pub const READ_TIMEOUT_MS: u64 = 60_000;

/// What is left of a read's [`READ_TIMEOUT_MS`].
pub(crate) struct Budget(std::time::Instant);

impl Budget {
    /// A read's budget, from now.
    pub(crate) fn start() -> Budget {
        Budget(std::time::Instant::now())
    }

    /// The milliseconds left, or an error once none are.
    pub(crate) fn left(&self) -> Result<u64> {
        match READ_TIMEOUT_MS.saturating_sub(self.0.elapsed().as_millis() as u64) {
            0 => Err(airlock_core::error::Error::postgres(format!(
                "reading the values the migration overwrote took more than {} s",
                READ_TIMEOUT_MS / 1000
            ))),
            left => Ok(left),
        }
    }
}

/// Splits `targets` into those read row by row and paired by the golden's
/// key (tables of `pairable` with a key the candidate does not set), and
/// those compared by counts ([`counts`]).
pub fn by_pairing(
    targets: Vec<Target>,
    shape: &Shape,
    pairable: &BTreeSet<String>,
) -> (Vec<Target>, Vec<Target>) {
    targets.into_iter().partition(|t| {
        let key = shape.key(&t.table).map(key_columns);
        pairable.contains(&t.table) && key.is_some_and(|k| !k.iter().any(|c| t.columns.contains(c)))
    })
}

/// Reads `targets`' columns that `catalog` (the schema at the time) still
/// has, keyed by the golden's key (`key_of` a table; tables without one, or
/// without its columns now, are left out), from an admin session through the reader.
pub async fn read(
    client: &tokio_postgres::Client,
    targets: &[Target],
    key_of: &(dyn Fn(&str) -> Option<String> + Sync),
    catalog: &Catalog,
) -> Result<BTreeMap<String, Values>> {
    let wanted: Vec<Wanted> = targets
        .iter()
        .filter_map(|t| {
            let key = key_of(&t.table)?;
            Some(Wanted {
                table: t.table.clone(),
                key,
                columns: t.columns.clone(),
                most: super::verify::ROWS_READ_MOST,
                reading: Reading::Shown,
            })
        })
        .collect();
    read_wanted(client, &wanted, catalog, false).await
}

/// Reads `targets`' columns as [`read`] does, each value as `reading` says,
/// at most `most(table)` rows of each: a table holding more now is left
/// out, as is one whose read fails.
pub async fn read_bounded(
    client: &tokio_postgres::Client,
    targets: &[Target],
    key_of: &(dyn Fn(&str) -> Option<String> + Sync),
    catalog: &Catalog,
    (most, reading): (&(dyn Fn(&str) -> i64 + Sync), Reading),
) -> Result<BTreeMap<String, Values>> {
    let wanted: Vec<Wanted> = targets
        .iter()
        .filter_map(|t| {
            Some(Wanted {
                table: t.table.clone(),
                key: key_of(&t.table)?,
                columns: t.columns.clone(),
                most: most(&t.table),
                reading,
            })
        })
        .collect();
    read_wanted(client, &wanted, catalog, true).await
}

/// Where the candidate may have kept the values `losses` lost, in `now`
/// (the schema after it): columns it added to the loss's table, and tables
/// it made that have the table's key columns; of each, only columns of the
/// lost column's type or name, and no more rows than the table held.
pub fn keepers(losses: &[Loss], shape: &Shape, golden: &Catalog, now: &Catalog) -> Vec<Wanted> {
    let mut out: Vec<Wanted> = Vec::new();
    for loss in losses {
        let Some(lost) =
            golden.tables.get(&loss.table).and_then(|t| t.columns.iter().find(|c| c.name == loss.column))
        else {
            continue;
        };
        let alike =
            |c: &airlock_postgres::catalog::Column| c.type_name == lost.type_name || c.name == lost.name;
        let places = keeping_places(&loss.table, shape, golden, now, &alike);
        gather(&mut out, places, loss.rows.max(0) + 1, Reading::Digest);
    }
    out
}

/// Where a candidate may have kept what it took from `table`: the columns
/// it added to it, and the columns beside the key of tables it made that
/// hold the table's key (see [`key_in`]), of those only the `alike` ones;
/// each place as its table, its key's columns and its columns.
fn keeping_places(
    table: &str,
    shape: &Shape,
    golden: &Catalog,
    now: &Catalog,
    alike: &dyn Fn(&airlock_postgres::catalog::Column) -> bool,
) -> Vec<(String, String, Vec<String>)> {
    let Some(key) = shape.key(table) else { return vec![] };
    let keyed = key_columns(key);
    let (Some(was), Some(is)) = (golden.tables.get(table), now.tables.get(table)) else {
        return vec![];
    };
    let added = is.columns.iter().filter(|c| !was.columns.iter().any(|w| w.name == c.name) && alike(c));
    let mut places =
        vec![(table.to_owned(), key.to_owned(), added.map(|c| c.name.clone()).collect::<Vec<_>>())];
    for (name, made) in now.tables.iter().filter(|(name, _)| !golden.tables.contains_key(*name)) {
        let Some(key_there) = key_in(&keyed, was, made) else { continue };
        let columns = made.columns.iter().filter(|c| !key_there.contains(&c.name) && alike(c));
        places.push((name.clone(), key_of_columns(&key_there), columns.map(|c| c.name.clone()).collect()));
    }
    places.retain(|(_, _, columns)| !columns.is_empty());
    places
}

/// Adds `places` to `out`, as reads of at most `most` rows each: a table
/// already there gains the columns it lacks.
fn gather(out: &mut Vec<Wanted>, places: Vec<(String, String, Vec<String>)>, most: i64, reading: Reading) {
    for (table, key, columns) in places {
        match out.iter_mut().find(|w| w.table == table) {
            Some(w) => {
                let more: Vec<String> = columns.into_iter().filter(|c| !w.columns.contains(c)).collect();
                w.columns.extend(more);
            }
            None => out.push(Wanted { table, key, columns, most, reading }),
        }
    }
}

/// The columns of a table the candidate made (`made`) that hold the golden
/// table's (`was`) key `keyed`: the same names, or, for a key of one column,
/// the one column of its type (`CREATE TABLE tiers_before AS SELECT id AS
/// customer_id, tier ...`); of several such, the one whose name holds the
/// key's name.
fn key_in(keyed: &[String], was: &Table, made: &Table) -> Option<Vec<String>> {
    if keyed.iter().all(|k| made.columns.iter().any(|c| &c.name == k)) {
        return Some(keyed.to_vec());
    }
    let [one] = keyed else { return None };
    let kind = &was.columns.iter().find(|c| &c.name == one)?.type_name;
    let alike: Vec<&String> = made.columns.iter().filter(|c| &c.type_name == kind).map(|c| &c.name).collect();
    let chosen = match alike.as_slice() {
        [only] => *only,
        _ => {
            let named: Vec<&&String> = alike.iter().filter(|n| n.contains(one.as_str())).collect();
            match named.as_slice() {
                [only] => **only,
                _ => return None,
            }
        }
    };
    Some(vec![chosen.clone()])
}

/// A key's columns as [`Shape`] writes them: quoted, joined by `, `.
fn key_of_columns(columns: &[String]) -> String {
    columns.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", ")
}

/// Reads each of `wanted` whose key's columns and columns `catalog` has
/// (those it has not are left out), by the reader's function. With
/// `best_effort`, a table whose read fails, or that holds more rows than it
/// is wanted for, is left out; otherwise a failure is the whole read's.
pub async fn read_wanted(
    client: &tokio_postgres::Client,
    wanted: &[Wanted],
    catalog: &Catalog,
    best_effort: bool,
) -> Result<BTreeMap<String, Values>> {
    let mut out = BTreeMap::new();
    if wanted.is_empty() {
        return Ok(out);
    }
    let grant_each = airlock_postgres::catalog::ensure_reader(client).await?;
    let budget = Budget::start();
    pinned(client, async {
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
            // Each column as its digest and the start of its text; or as
            // its hash, empty for NULL, all joined by commas.
            let fields: Vec<String> = columns
                .iter()
                .map(|c| {
                    let text = format!("ROW(t.{})::text", quote_ident(c));
                    match w.reading {
                        Reading::Digest => format!("pg_catalog.md5({text}), NULL"),
                        Reading::Shown => format!("pg_catalog.md5({text}), pg_catalog.left({text}, {SHOWN_MOST})"),
                        Reading::Hash => format!(
                            "CASE WHEN t.{} IS NULL THEN '' ELSE pg_catalog.hashtextextended({text}, 0)::text END",
                            quote_ident(c)
                        ),
                        Reading::Parts => {
                            let type_name = now.columns.iter().find(|col| &col.name == c).map(|col| col.type_name.as_str());
                            let parts = json_parts::read_parts(&format!("t.{}", quote_ident(c)), type_name.unwrap_or_default());
                            format!("pg_catalog.md5({text}), {parts}")
                        }
                    }
                })
                .collect();
            let value = match w.reading {
                // (An array, not concat_ws: a table may have more columns
                // than a function takes arguments.)
                Reading::Hash => format!("pg_catalog.array_to_string(ARRAY[{}]::text[], ',')", fields.join(", ")),
                _ => format!("ROW({})", fields.join(", ")),
            };
            let key = super::verify::bounded_key(&format!("ROW({})::text", w.key));
            let timeout = match budget.left() {
                Ok(left) => Some(left),
                Err(_) if best_effort => break,
                Err(e) => return Err(e),
            };
            let rows = match super::verify::read_as_reader(
                client,
                grant_each,
                &w.table,
                &key,
                &value,
                w.most + 1,
                timeout,
            )
            .await
            {
                Ok(rows) if best_effort && rows.len() as i64 > w.most => continue,
                Ok(rows) => rows,
                Err(_) if best_effort => {
                    let _ = client.batch_execute("ROLLBACK").await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let mut values = Values { columns, rows: HashMap::with_capacity(rows.len()) };
            for r in rows {
                let (k, v): (String, String) = (r.cell(0)?, r.cell(1)?);
                let cells = match w.reading {
                    Reading::Hash => v.split(',').map(hashed).collect(),
                    // A digest and what is shown: a value's start is itself
                    // a one-field record; a document's parts are their JSON.
                    _ => record_fields(&v)
                        .chunks(2)
                        .map(|pair| Cell {
                            digest: pair[0].as_deref().map(digest_of).unwrap_or_default(),
                            shown: pair.get(1).cloned().flatten().and_then(|t| match w.reading {
                                Reading::Parts => Some(t),
                                _ => record_fields(&t).swap_remove(0),
                            }),
                        })
                        .collect(),
                };
                values.rows.insert(k, cells);
            }
            out.insert(w.table.clone(), values);
        }
        Ok(out)
    })
    .await
}

/// Runs `read` with the session's reading settings pinned, and restores
/// them after; a read that failed part way is rolled back first.
async fn pinned<T>(
    client: &tokio_postgres::Client,
    read: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    let pinned = airlock_postgres::catalog::Pinned::pin(client).await?;
    let read = read.await;
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
    /// Of `lost`, the rows whose new value no other row holds: lost only
    /// because it was made discarding the old one ([`Discard`]).
    pub alone: usize,
    /// By new value, most rows first: the rows that lost their value to it
    /// and the old values they held (a few, most common first).
    pub into: Vec<(Option<String>, usize, Vec<(Option<String>, usize)>)>,
    /// The keys of the rows that lost their value.
    pub keys: Vec<String>,
}

/// How a file made a column's new values (one statement's, or all of
/// them together), which decides what a change loses ([`lost`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Making {
    /// From its old value alone: loses only where two old values of changed
    /// rows became one (`qty + 1` on half the rows meets the other half's
    /// values, but can be undone).
    Itself,
    /// Discarding the old value ([`Discard`]): loses also where a row's new
    /// value is its own, held by no other row (`slug = lower(name)`). A
    /// relabel that many rows share (`status = 'archived'` on the rows that
    /// were `'done'`) can still be read backwards, and loses nothing.
    Discarding(Discard),
    /// Any other way: loses where rows with other old values now hold the
    /// same value.
    Mixed,
}

/// What `column` lost between `before` and `after`, by how its new values
/// were made.
pub fn lost(before: &Values, after: &Values, column: &str, making: &Making) -> Option<Lost> {
    let from_itself = *making == Making::Itself;
    let was_at = before.columns.iter().position(|c| c == column)?;
    let now_at = after.columns.iter().position(|c| c == column)?;
    let pairs: Vec<(&String, &Cell, &Cell)> =
        before.rows.iter().filter_map(|(k, b)| Some((k, &b[was_at], &after.rows.get(k)?[now_at]))).collect();
    // (Most columns of a wide table read whole are left as they were.)
    if pairs.iter().all(|(_, was, now)| was == now) {
        return None;
    }
    let new_values: BTreeSet<&Cell> =
        pairs.iter().filter(|(_, was, now)| was != now).map(|(_, _, now)| *now).collect();
    let among_changed = from_itself && new_values.len() > 1;
    // Every old value behind each new value (of changed rows only, when the
    // change can be undone from the values themselves).
    let mut sources: HashMap<&Cell, BTreeSet<&Cell>> = HashMap::new();
    for (_, was, now) in pairs.iter().filter(|(_, was, now)| !among_changed || was != now) {
        sources.entry(now).or_default().insert(was);
    }
    let mut holders: HashMap<&Cell, usize> = HashMap::new();
    for (_, _, now) in &pairs {
        *holders.entry(now).or_default() += 1;
    }
    let (mut changed, mut alone) = (0, 0);
    let mut keys = Vec::new();
    let mut into: HashMap<&Cell, HashMap<&Cell, usize>> = HashMap::new();
    for (key, was, now) in &pairs {
        if was == now {
            continue;
        }
        changed += 1;
        let merged = sources[now].len() > 1;
        let own = matches!(making, Making::Discarding(_)) && holders[now] == 1;
        if !was.is_null() && (merged || own) {
            *into.entry(now).or_default().entry(was).or_default() += 1;
            keys.push((*key).clone());
            alone += usize::from(!merged);
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
    Some(Lost { changed, lost, distinct, alone, into, keys })
}

/// Whether `lost` rows are enough to be told at all: fewer than enough
/// for a hazard ([`enough`]) make a note.
pub fn noted(lost: usize) -> bool {
    lost >= SHARE_FLOOR
}

/// Whether `lost` rows of a table of `rows` are enough for a hazard.
pub fn enough(lost: usize, rows: i64) -> bool {
    lost >= ROWS_LOST || (lost >= SHARE_FLOOR && lost as f64 >= SHARE_OF_TABLE * rows as f64)
}

/// A column that lost enough values for a hazard.
#[derive(Debug, Clone)]
pub struct Loss {
    /// Its table, `schema.name`.
    pub table: String,
    /// The column.
    pub column: String,
    /// The line of the first statement that names it.
    pub line: usize,
    /// The rows its table held.
    pub rows: i64,
    /// What it lost.
    pub lost: Lost,
    /// Whether its rows were paired by key (else told by counts).
    pub paired: bool,
    /// Whether a statement names the column ([`Target::named`]).
    pub named: bool,
    /// Its old and new type, where it lost its values to a new type that
    /// cannot hold them ([`narrowed`]) rather than by rows becoming alike.
    pub narrowed: Option<(String, String)>,
    /// How the file made its new values.
    pub making: Making,
}

impl Loss {
    /// `column` of target `t`, a table of `rows`, that lost `lost`.
    fn of(t: &Target, column: &str, rows: i64, lost: Lost, paired: bool) -> Loss {
        Loss {
            table: t.table.clone(),
            column: column.to_owned(),
            line: t.line,
            rows,
            lost,
            paired,
            named: t.named,
            narrowed: None,
            making: t.making(column),
        }
    }
}

/// Drops the losses a partition's column shows (found without a statement
/// naming it) where the same column of the partitioned table at the top of
/// its tree (`roots`, by partition) lost its values by name: one loss, told
/// through the table the statement named.
pub fn told_through_roots(losses: &mut Vec<Loss>, roots: &BTreeMap<String, String>) {
    let named: BTreeSet<(String, String)> =
        losses.iter().filter(|l| l.named).map(|l| (l.table.clone(), l.column.clone())).collect();
    losses.retain(|l| {
        l.named || !roots.get(&l.table).is_some_and(|root| named.contains(&(root.clone(), l.column.clone())))
    });
}

/// Puts each loss at the first statement that updated its table, where the
/// statement that names the column wrote none of its rows (a function's
/// body, a trigger made earlier): the line says where the values went.
pub fn place_at_writes(losses: &mut [Loss], statements: &[StatementReport]) {
    let updated = |st: &StatementReport, table: &str| {
        !st.rolled_back && st.rows.iter().any(|r| r.table == table && r.updated > 0)
    };
    let wrote = |st: &StatementReport, table: &str| {
        st.rows.iter().any(|r| r.table == table) || st.rewrites.iter().any(|w| w.table == table)
    };
    for loss in losses.iter_mut() {
        if statements.iter().any(|st| st.line == loss.line && wrote(st, &loss.table)) {
            continue;
        }
        if let Some(st) = statements.iter().find(|st| updated(st, &loss.table)) {
            loss.line = st.line;
        }
    }
}

/// The columns of `targets` that lost enough of their values to be told
/// ([`noted`]), from their values before the candidate and after it.
pub fn losses(
    targets: &[Target],
    before: &BTreeMap<String, Values>,
    after: &BTreeMap<String, Values>,
    rows_before: &BTreeMap<String, i64>,
) -> Vec<Loss> {
    let mut out = Vec::new();
    for t in targets {
        let (Some(b), Some(a)) = (before.get(&t.table), after.get(&t.table)) else { continue };
        let rows = rows_before.get(&t.table).copied().unwrap_or(b.rows.len() as i64);
        for column in &t.columns {
            let Some(lost) = lost(b, a, column, &t.making(column)).filter(|l| noted(l.lost)) else {
                continue;
            };
            out.push(Loss::of(t, column, rows, lost, true));
        }
    }
    out
}

/// The columns of `targets` (compared by counts) that lost enough of their
/// values for a hazard.
pub fn counted_losses(
    targets: &[Target],
    before: &BTreeMap<String, counts::Counts>,
    after: &BTreeMap<String, counts::Counts>,
    rows_before: &BTreeMap<String, i64>,
) -> Vec<Loss> {
    let mut out = Vec::new();
    for t in targets {
        let (Some(b), Some(a)) = (before.get(&t.table), after.get(&t.table)) else { continue };
        for column in &t.columns {
            let (Some(was), Some(now)) = (b.get(column), a.get(column)) else { continue };
            let rows = rows_before.get(&t.table).copied().unwrap_or_else(|| was.values().sum());
            let lost = counts::lost(was, now, &t.making(column));
            // Computed from itself, only a collapse tells a loss from a shift.
            // A column no statement names is judged by whether it holds fewer
            // values than it did (a merge), whatever rows the file added.
            let collapsed = lost.distinct.1 * 2 <= lost.distinct.0;
            let fewer = counts::distinct(now) < counts::distinct(was);
            let judged = match t.named {
                true => collapsed || !t.from_itself.contains(column),
                false => fewer,
            };
            if noted(lost.lost) && judged {
                out.push(Loss::of(t, column, rows, lost, false));
            }
        }
    }
    out
}

/// Where `kept` holds, for every key in `keys`, the value `before` had in
/// `column`: `table.column`.
fn kept_in(
    keys: &[String],
    before: &Values,
    column: &str,
    kept: &[&BTreeMap<String, Values>],
) -> Option<String> {
    if keys.is_empty() {
        return None;
    }
    let at = before.columns.iter().position(|c| c == column)?;
    kept.iter().flat_map(|places| places.iter()).find_map(|(table, k)| {
        let holds =
            |i: usize| keys.iter().all(|key| Some(&before.rows[key][at]) == k.rows.get(key).map(|r| &r[i]));
        let i = (0..k.columns.len()).find(|i| holds(*i))?;
        Some(format!("{}.{}", airlock_postgres::catalog::short_name(table), written(&k.columns[i])))
    })
}

/// `values_overwritten` hazards for `losses`, and notes for those whose
/// every old value the candidate kept in one of the places of `kept` (the
/// places it made, see [`keepers`]; the golden tables' columns after it,
/// where two columns swapped keep each other's).
pub fn report(
    losses: &[Loss],
    before: &BTreeMap<String, Values>,
    kept: &[&BTreeMap<String, Values>],
    shape: &Shape,
) -> (Vec<Hazard>, Vec<Hazard>) {
    let (mut out, mut notes) = (Vec::new(), Vec::new());
    for loss in losses {
        let (l, column, rows) = (&loss.lost, &loss.column, loss.rows);
        let groups: Vec<String> = l.into.iter().map(|(now, n, was)| group(column, *n, now, was)).collect();
        let table = airlock_postgres::catalog::short_name(&loss.table);
        let line = Some(loss.line).filter(|l| *l > 0);
        if let Some(place) = before.get(&loss.table).and_then(|b| kept_in(&l.keys, b, column, kept)) {
            notes.push(Hazard::new(
                "values_overwritten",
                Severity::Low,
                format!(
                    "{} of the {} rows of {table} lost their {column} ({}), and the migration kept every old value in {place}",
                    count(l.lost),
                    count(rows as usize),
                    groups.join("; ")
                ),
                line,
            ));
            continue;
        }
        if let Some((old, new)) = &loss.narrowed {
            let mut h = Hazard::new(
                "values_overwritten",
                if enough(l.lost, rows) { Severity::High } else { Severity::Medium },
                format!(
                    "{} of the {} rows of {table} lost their {column} to its new type, which cannot hold them ({old} -> {new}): {}{}; what they were is not kept anywhere",
                    count(l.lost),
                    count(rows as usize),
                    groups.join("; "),
                    if l.into.len() < l.distinct.1 { "; ..." } else { "" },
                ),
                line,
            );
            h.suggestion = Some(format!(
                "choose a type that holds every value the column holds (a wider precision or scale, the time kept), or keep the old values first, in the same migration (CREATE TABLE {} AS SELECT {}, {} FROM {table})",
                written(&format!("{}_{column}_before", split_qualified(&loss.table).1)),
                shape.key(&loss.table).unwrap_or("id"),
                written(column),
            ));
            out.push(h);
            continue;
        }
        // Too few rows for a hazard: told, as a note.
        let small = !enough(l.lost, rows);
        let mut h = Hazard::new(
            "values_overwritten",
            if small { Severity::Low } else { Severity::High },
            format!(
                "{} of the {} rows of {table} lost their {column}{}: {}{}; {}, and what they were is not kept anywhere",
                count(l.lost),
                count(rows as usize),
                match (loss.named, loss.paired, shape.key(&loss.table).is_some()) {
                    (true, true, _) => "",
                    (true, false, false) => " (told by how many rows hold each value: no key pairs its rows here)",
                    (true, false, true) => " (told by how many rows hold each value: its rows were not paired one by one, as the table is too large for that, grew past twice its rows, or had its key set too)",
                    (false, true, _) => " (no statement names the column: it was set through a view, a rule, a trigger or a name made as the file ran)",
                    (false, false, _) => " (no statement names the column: it was set through a view, a rule, a trigger or a name made as the file ran; told by how many rows hold each value)",
                },
                groups.join("; "),
                if l.into.len() < l.distinct.1 { "; ..." } else { "" },
                how_lost(l, &loss.making),
            ),
            line,
        );
        // Made from what the rule cannot read back or rule out (another
        // table's rows, a CASE), more rows may have changed than merged:
        // not counted as lost, but not to be taken for unchanged either.
        if loss.making == Making::Mixed && l.changed > l.lost && loss.paired {
            h.message.push_str(&format!("; {} rows changed their {column} in all", count(l.changed)));
        }
        // Without a key, only whole rows say which row held what.
        let kept = match (shape.key(&loss.table), loss.paired) {
            (None, false) => "*".to_owned(),
            (key, _) => format!("{}, {}", key.unwrap_or("id"), written(column)),
        };
        h.suggestion = Some(format!(
            "if the old values matter, keep them first, in the same migration (CREATE TABLE {} AS SELECT {kept} FROM {table}), or write the new values to a new column; batching does not bring them back",
            written(&format!("{}_{column}_before", split_qualified(&loss.table).1)),
        ));
        if small {
            h.message.push_str(&format!(
                " (fewer than {} rows and a tenth of the table: a note, not a hazard)",
                count(ROWS_LOST)
            ));
            notes.push(h);
        } else {
            out.push(h);
        }
    }
    (out, notes)
}

/// How the rows lost their values: merged into values other rows hold
/// ([`merged`]), or each replaced by one of its own that keeps nothing of
/// the old ([`Discard`]), or both.
fn how_lost(l: &Lost, making: &Making) -> String {
    let alone = match making {
        _ if l.alone == 0 => return merged(l.distinct),
        Making::Discarding(Discard::Cut(function))
            if targets::HASHING_FUNCTIONS.contains(&function.as_str()) =>
        {
            format!("{function} kept only a hash of")
        }
        Making::Discarding(Discard::Cut(function)) => format!("{function} kept only part of"),
        Making::Discarding(Discard::Elsewhere) => {
            "a value from other rows or tables, one no other row holds, replaced".to_owned()
        }
        _ => "a value computed from the row's other columns, one no other row holds, replaced".to_owned(),
    };
    match l.alone == l.lost {
        true => format!("{alone} each of them"),
        false => format!(
            "{} took values that rows with other values hold too, and {alone} each of the other {}",
            count(l.lost - l.alone),
            count(l.alone)
        ),
    }
}

/// How the distinct values merged: fewer after, or as many, each now one
/// that other rows already held (`'10003'` padded to `'000010003'`, which
/// another row held: the two rows can no longer be told apart).
fn merged((was, now): (usize, usize)) -> String {
    let values = |n: usize| if n == 1 { "value" } else { "values" };
    if was > now {
        format!("{} distinct {} became {}", count(was), values(was), count(now))
    } else {
        let into = if was == 1 { "one" } else { "values" };
        format!("{} distinct {} became {into} that other rows already held", count(was), values(was))
    }
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
