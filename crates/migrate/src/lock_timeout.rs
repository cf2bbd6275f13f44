//! Whether a file's write-blocking locks are taken under a `lock_timeout`:
//! the `no_lock_timeout` note.
//!
//! A file guards its locks by setting one before it takes them: `SET
//! lock_timeout`, `SET LOCAL` (to the end of its transaction) or
//! `set_config('lock_timeout', ...)`. A timeout of 0, `DEFAULT` or a `RESET`
//! is no guard: the statement then waits behind a long query for as long as
//! it runs, and every query queued behind it waits too. `LOCK ... NOWAIT`
//! guards its tables to the end of its transaction: it never queues, and
//! once it holds them nothing after it in the transaction waits for them.
//! Read from the
//! statements' tokens (so a comment naming the setting guards nothing), in
//! the order they ran.

use std::collections::BTreeSet;

use super::code::lexer::{tokens, Token};
use super::report::{Hazard, Severity, StatementReport};

/// What a statement does to the session's `lock_timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setting {
    /// Sets it for the session: `true` when to a limit, `false` when to none.
    Session(bool),
    /// Sets it to the end of the open transaction (`SET LOCAL`,
    /// `set_config(..., true)`).
    Local(bool),
}

/// The setting a statement's text makes, if it makes one.
fn setting(sql: &str) -> Option<Setting> {
    let t = tokens(sql);
    let word = |i: usize| match t.get(i) {
        Some(Token::Word(w)) => Some(w.as_str()),
        _ => None,
    };
    if word(0) == Some("reset") && word(1) == Some("lock_timeout") {
        return Some(Setting::Session(false));
    }
    if word(0) == Some("set") {
        let (local, at) = match word(1) {
            Some("local") => (true, 2),
            Some("session") => (false, 2),
            _ => (false, 1),
        };
        if word(at) != Some("lock_timeout") {
            return None;
        }
        let value = match t.get(at + 1) {
            Some(Token::Other('=')) => t.get(at + 2),
            Some(Token::Word(to)) if to == "to" => t.get(at + 2),
            _ => None,
        };
        let limited = value.is_some_and(limits);
        return Some(if local { Setting::Local(limited) } else { Setting::Session(limited) });
    }
    // set_config('lock_timeout', value, is_local), anywhere in the statement.
    (0..t.len()).find_map(|j| match t.get(j..j + 7)? {
        [Token::Word(f), Token::Other('('), Token::Constant(name), Token::Other(','), value, Token::Other(','), local]
            if f == "set_config" && name.eq_ignore_ascii_case("lock_timeout") =>
        {
            let local = match local {
                Token::Word(w) => w == "true",
                Token::Constant(c) => ["t", "true", "on", "1"].contains(&c.to_ascii_lowercase().as_str()),
                _ => false,
            };
            Some(if local { Setting::Local(limits(value)) } else { Setting::Session(limits(value)) })
        }
        _ => None,
    })
}

/// The tables (unqualified, lowercased) a `LOCK ... NOWAIT` statement locks.
fn locked_nowait(sql: &str) -> Vec<String> {
    let t = tokens(sql);
    let is = |i: usize, w: &str| matches!(t.get(i), Some(Token::Word(x)) if x == w);
    if !is(0, "lock") || !t.iter().any(|x| matches!(x, Token::Word(w) if w == "nowait")) {
        return vec![];
    }
    let mut names = Vec::new();
    let mut last: Option<String> = None;
    for token in t.iter().skip(1) {
        match token {
            Token::Word(w)
                if ["table", "only"].contains(&w.as_str()) && last.is_none() && names.is_empty() => {}
            Token::Word(w) if w == "in" || w == "nowait" => break,
            Token::Word(w) => last = Some(w.clone()),
            Token::Quoted(q) => last = Some(q.to_lowercase()),
            Token::Other(',') => names.extend(last.take()),
            _ => {}
        }
    }
    names.extend(last);
    names
}

/// A relation's name without its schema, lowercased.
fn unqualified(name: &str) -> String {
    airlock_postgres::catalog::split_qualified(name).1.to_lowercase()
}

/// Whether a value given to `lock_timeout` is a limit: a number above 0, with
/// or without a unit, bare or quoted (`0`, `'0s'` and `DEFAULT` are none).
fn limits(value: &Token) -> bool {
    let text = match value {
        Token::Number(n) => n.as_str(),
        Token::Constant(c) => c.trim(),
        _ => return false,
    };
    let digits: String = text.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    digits.parse::<f64>().is_ok_and(|n| n > 0.0)
}

/// The tables of `blocking` (statement index, table) whose lock was taken
/// with no `lock_timeout` in force, the first statement that took one so,
/// and whether the file set one to none (0 or its default) before any of
/// them.
fn unguarded<'a>(
    statements: &[StatementReport],
    blocking: &[(usize, &'a str)],
) -> (BTreeSet<&'a str>, Option<usize>, bool) {
    let mut session = false;
    let mut local: Option<(usize, bool)> = None;
    let mut set_to_none = false;
    let mut nowait: BTreeSet<(usize, String)> = BTreeSet::new();
    let mut out = BTreeSet::new();
    let mut first = None;
    for (i, s) in statements.iter().enumerate() {
        let in_force = match local {
            Some((txn, limited)) if txn == s.txn => limited,
            _ => session,
        };
        nowait.extend(locked_nowait(&s.sql).into_iter().map(|t| (s.txn, t)));
        if !in_force {
            let taken: Vec<&str> = blocking
                .iter()
                .filter(|(at, t)| *at == i && !nowait.contains(&(s.txn, unqualified(t))))
                .map(|(_, t)| *t)
                .collect();
            if !taken.is_empty() {
                first = first.or(Some(i));
            }
            out.extend(taken);
        }
        match setting(&s.sql) {
            Some(Setting::Session(limited)) => {
                session = limited;
                // A session setting made inside a transaction also holds to its end.
                local = None;
                set_to_none |= !limited;
            }
            Some(Setting::Local(limited)) => {
                local = Some((s.txn, limited));
                set_to_none |= !limited;
            }
            None => {}
        }
    }
    (out, first, set_to_none)
}

/// The note for a file that takes write-blocking locks with no
/// `lock_timeout` in force; `blocking` holds each such lock's statement
/// index and table. A partition is named by the partitioned table at the
/// top of its tree (`roots`), once.
pub(crate) fn note(
    statements: &[StatementReport],
    blocking: &[(usize, &str)],
    roots: &std::collections::BTreeMap<String, String>,
) -> Option<Hazard> {
    let (tables, first, set_to_none) = unguarded(statements, blocking);
    if tables.is_empty() {
        return None;
    }
    // Each table, and whether it stands for partitions of its own.
    let mut by_root: Vec<(&str, bool)> = Vec::new();
    for table in tables {
        let (name, partition) = roots.get(table).map_or((table, false), |root| (root.as_str(), true));
        match by_root.iter_mut().find(|(n, _)| *n == name) {
            Some((_, any)) => *any |= partition,
            None => by_root.push((name, partition)),
        }
    }
    let named: Vec<String> = by_root
        .iter()
        .take(5)
        .map(|(name, partitions)| match partitions {
            true => format!("{name} (its partitions)"),
            false => (*name).to_owned(),
        })
        .collect();
    let how = if set_to_none {
        "with lock_timeout at 0 (no limit)"
    } else {
        "with no lock_timeout set before them"
    };
    let mut h = Hazard::new(
        "no_lock_timeout",
        Severity::Low,
        format!(
            "the file takes write-blocking locks on {} {how}: waiting behind a long query, it would block every query queued behind it",
            named.join(", ")
        ),
        first.map(|i| statements[i].line).filter(|l| *l > 0),
    );
    h.suggestion = Some("SET lock_timeout = '5s' at the top (migrate promote sets one itself)".into());
    Some(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statement(sql: &str, txn: usize) -> StatementReport {
        StatementReport { sql: sql.into(), txn, ..Default::default() }
    }

    #[test]
    fn reads_each_way_of_setting_it() {
        assert_eq!(setting("SET lock_timeout = '3s'"), Some(Setting::Session(true)));
        assert_eq!(setting("set lock_timeout to 3000"), Some(Setting::Session(true)));
        assert_eq!(setting("SET SESSION lock_timeout = 5s"), Some(Setting::Session(true)));
        assert_eq!(setting("SET LOCAL lock_timeout = '2s'"), Some(Setting::Local(true)));
        assert_eq!(setting("SET lock_timeout = 0"), Some(Setting::Session(false)));
        assert_eq!(setting("SET lock_timeout = '0'"), Some(Setting::Session(false)));
        assert_eq!(setting("SET lock_timeout TO DEFAULT"), Some(Setting::Session(false)));
        assert_eq!(setting("RESET lock_timeout"), Some(Setting::Session(false)));
        assert_eq!(setting("SELECT set_config('lock_timeout', '3s', false)"), Some(Setting::Session(true)));
        assert_eq!(
            setting("SELECT pg_catalog.set_config('lock_timeout', '3s', true)"),
            Some(Setting::Local(true))
        );
        assert_eq!(setting("SELECT set_config('lock_timeout', '0', false)"), Some(Setting::Session(false)));
        assert_eq!(setting("-- SET lock_timeout = '3s'\nALTER TABLE t ADD c int"), None);
        assert_eq!(setting("SET statement_timeout = '3s'"), None);
    }

    #[test]
    fn a_lock_is_guarded_only_by_a_limit_in_force_when_it_is_taken() {
        let file = [
            statement("ALTER TABLE a ADD c int", 1),
            statement("SET lock_timeout = '3s'", 2),
            statement("ALTER TABLE b ADD c int", 3),
            statement("SET lock_timeout = 0", 4),
            statement("ALTER TABLE c ADD c int", 5),
        ];
        let (tables, first, none) = unguarded(&file, &[(0, "a"), (2, "b"), (4, "c")]);
        assert_eq!(tables, BTreeSet::from(["a", "c"]));
        assert_eq!(first, Some(0));
        assert!(none);
    }

    #[test]
    fn partitions_are_named_by_their_partitioned_table_once() {
        let file =
            [statement("ALTER TABLE events ADD c int", 1), statement("ALTER TABLE orders ADD c int", 1)];
        let roots = std::collections::BTreeMap::from([
            ("public.events_1".to_owned(), "public.events".to_owned()),
            ("public.events_2".to_owned(), "public.events".to_owned()),
        ]);
        let blocking =
            [(0, "public.events"), (0, "public.events_1"), (0, "public.events_2"), (1, "public.orders")];
        let said = note(&file, &blocking, &roots).unwrap().message;
        assert!(
            said.starts_with(
                "the file takes write-blocking locks on public.events (its partitions), public.orders with"
            ),
            "{said}"
        );
    }

    #[test]
    fn lock_nowait_guards_its_tables_to_the_end_of_its_transaction() {
        assert_eq!(locked_nowait("LOCK TABLE products IN ACCESS EXCLUSIVE MODE NOWAIT"), ["products"]);
        assert_eq!(locked_nowait("lock only public.a, \"B\" nowait"), ["a", "b"]);
        assert!(locked_nowait("LOCK TABLE products IN ACCESS EXCLUSIVE MODE").is_empty());
        let file = [
            statement("BEGIN", 1),
            statement("LOCK TABLE products IN ACCESS EXCLUSIVE MODE NOWAIT", 1),
            statement("ALTER TABLE products ADD c int", 1),
            statement("ALTER TABLE orders ADD c int", 1),
            statement("COMMIT", 1),
            statement("ALTER TABLE products ADD d int", 2),
        ];
        let blocking =
            [(1, "public.products"), (2, "public.products"), (3, "public.orders"), (5, "public.products")];
        let (tables, first, _) = unguarded(&file, &blocking);
        assert_eq!(tables, BTreeSet::from(["public.orders", "public.products"]));
        assert_eq!(first, Some(3));
        let (tables, _, _) = unguarded(&file[..5], &blocking[..3]);
        assert_eq!(tables, BTreeSet::from(["public.orders"]));
    }

    #[test]
    fn set_local_ends_with_its_transaction() {
        let file = [
            statement("SET LOCAL lock_timeout = '3s'", 1),
            statement("ALTER TABLE a ADD c int", 1),
            statement("ALTER TABLE b ADD c int", 2),
        ];
        let (tables, first, none) = unguarded(&file, &[(1, "a"), (2, "b")]);
        assert_eq!(tables, BTreeSet::from(["b"]));
        assert_eq!(first, Some(2));
        assert!(!none);
    }
}
