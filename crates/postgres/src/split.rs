//! Splitting a migration file into statements, each with the line it starts on,
//! the way PostgreSQL's lexer would: semicolons inside quotes, dollar quotes,
//! comments and `BEGIN ATOMIC ... END` bodies do not end a statement.

use airlock_core::error::{Error, ErrorCode, Result};

/// One statement of a migration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    /// Its text, without the terminating semicolon.
    pub sql: String,
    /// The 1-based line it starts on.
    pub line: usize,
}

/// What a statement is, for applying it the way it would be applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `BEGIN` or `START TRANSACTION`.
    Begin,
    /// `COMMIT` or `END` (and `COMMIT AND CHAIN`).
    Commit,
    /// `ROLLBACK` or `ABORT` (not `ROLLBACK TO SAVEPOINT`).
    Rollback,
    /// Cannot run inside a transaction block (`CREATE INDEX CONCURRENTLY`, `VACUUM`...).
    NoTransaction,
    /// Anything else, savepoints included.
    Plain,
}

/// Splits `text` into statements. Fails on psql meta-commands, which only psql understands.
pub fn split(text: &str) -> Result<Vec<Statement>> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let (mut i, mut start, mut line, mut start_line) = (0, 0, 1, 1);
    let mut atomic_depth = 0usize;
    let mut at_line_start = true;
    // Whether the last token the lexer saw (comments and whitespace are not
    // tokens, as for PostgreSQL) was the word BEGIN: only then does ATOMIC open a
    // body. Looking back through the text instead would read a word inside a
    // comment as a token, and disagree with the server about where a statement ends.
    let mut after_begin = false;
    while i < bytes.len() {
        let c = bytes[i];
        if at_line_start && c == b'\\' {
            let copying = out.last().is_some_and(|st: &Statement| {
                let words: Vec<String> = st.sql.split_whitespace().map(str::to_ascii_lowercase).collect();
                words.first().is_some_and(|w| w == "copy")
                    && words.windows(2).any(|w| w[0] == "from" && w[1] == "stdin")
            });
            if copying {
                return Err(Error::new(
                    ErrorCode::InvalidRequest,
                    format!("line {line}: rows inline after COPY ... FROM stdin end with \\., which only psql reads"),
                    "load the rows with INSERT statements, or run the file with psql as a command: --exec 'psql \"$DATABASE_URL\" -f FILE'",
                ));
            }
            return Err(Error::new(
                ErrorCode::InvalidRequest,
                format!("line {line}: psql meta-command {:?}", first_word(&text[i..])),
                "migrations are applied over the protocol, not by psql: remove meta-commands (\\set, \\i, \\connect...)",
            ));
        }
        if !c.is_ascii_whitespace() {
            at_line_start = false;
        }
        let comment =
            (c == b'-' && bytes.get(i + 1) == Some(&b'-')) || (c == b'/' && bytes.get(i + 1) == Some(&b'*'));
        let word = c.is_ascii_alphabetic() && (i == 0 || !ident_char(bytes, i - 1));
        if !c.is_ascii_whitespace() && !comment && !word {
            after_begin = false;
        }
        match c {
            b'\n' => {
                line += 1;
                at_line_start = true;
                i += 1;
            }
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
                        line += usize::from(bytes[i] == b'\n');
                        i += 1;
                    }
                }
            }
            b'\'' | b'"' => {
                let escapes = c == b'\''
                    && i > 0
                    && matches!(bytes[i - 1], b'E' | b'e')
                    && (i < 2 || !ident_char(bytes, i - 2));
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
                    line += usize::from(bytes[i] == b'\n');
                    i += 1;
                }
                i += 1;
            }
            b'$' if i == 0 || !ident_char(bytes, i - 1) => match dollar_tag(&text[i..]) {
                Some(tag) => {
                    let body = i + tag.len();
                    let end = text[body..].find(tag).map_or(bytes.len(), |e| body + e + tag.len());
                    line += text[i..end].matches('\n').count();
                    i = end;
                }
                None => i += 1,
            },
            b';' if atomic_depth == 0 => {
                push(&mut out, &text[start..i], start_line);
                i += 1;
                start = i;
                start_line = line;
            }
            c if c.is_ascii_alphabetic() && (i == 0 || !ident_char(bytes, i - 1)) => {
                let word_end = (i..bytes.len()).find(|&j| !ident_char(bytes, j)).unwrap_or(bytes.len());
                let word = &text[i..word_end];
                // A body opens at BEGIN ATOMIC; inside it, CASE ... END nests too.
                let opens = (word.eq_ignore_ascii_case("atomic") && after_begin)
                    || (atomic_depth > 0 && word.eq_ignore_ascii_case("case"));
                after_begin = word.eq_ignore_ascii_case("begin");
                if opens {
                    atomic_depth += 1;
                } else if atomic_depth > 0 && word.eq_ignore_ascii_case("end") {
                    atomic_depth -= 1;
                }
                i = word_end;
            }
            _ => i += 1,
        }
    }
    push(&mut out, &text[start..], start_line);
    Ok(out)
}

/// Adds a statement unless it is only whitespace and comments; its line is that of
/// its first character outside leading comments.
fn push(out: &mut Vec<Statement>, piece: &str, line: usize) {
    let sql = piece.trim();
    if strip_comments(sql).trim().is_empty() {
        return;
    }
    out.push(Statement { sql: sql.to_owned(), line: line + leading_lines(piece) });
}

/// How many line breaks `text` has before its first character outside leading
/// comments: a statement's `line` is that character's, its text starts earlier.
pub fn leading_lines(text: &str) -> usize {
    let mut rest = text;
    loop {
        let trimmed = rest.trim_start();
        if let Some(after) = trimmed.strip_prefix("--") {
            rest = after.find(['\n', '\r']).map_or("", |n| &after[n..]);
        } else if trimmed.starts_with("/*") {
            rest = trimmed.find("*/").map_or("", |e| &trimmed[e + 2..]);
        } else {
            rest = trimmed;
            break;
        }
    }
    text[..text.len() - rest.len()].matches('\n').count()
}

fn ident_char(bytes: &[u8], i: usize) -> bool {
    bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] >= 0x80 || bytes[i] == b'$'
}

/// `$tag$` at the start of `s`, if it opens a dollar quote.
pub fn dollar_tag(s: &str) -> Option<&str> {
    let rest = &s[1..];
    let end = rest.find('$')?;
    let tag = &rest[..end];
    let valid = tag.chars().enumerate().all(|(k, ch)| {
        ch == '_' || ch.is_ascii_alphabetic() || !ch.is_ascii() || (k > 0 && ch.is_ascii_digit())
    });
    valid.then(|| &s[..end + 2])
}

fn first_word(s: &str) -> &str {
    s.split_whitespace().next().unwrap_or("")
}

/// The text without `--` and `/* */` comments (outside quotes is assumed: used on
/// the head of a statement to find its first keywords).
fn strip_comments(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut rest = sql;
    loop {
        let line = rest.find("--");
        let block = rest.find("/*");
        match (line, block) {
            (Some(l), b) if b.is_none_or(|b| l < b) => {
                out.push_str(&rest[..l]);
                rest = rest[l..].find(['\n', '\r']).map_or("", |n| &rest[l + n..]);
            }
            (_, Some(b)) => {
                out.push_str(&rest[..b]);
                rest = rest[b..].find("*/").map_or("", |e| &rest[b + e + 2..]);
            }
            _ => {
                out.push_str(rest);
                return out;
            }
        }
    }
}

/// What kind of statement `sql` is, from its first keywords.
pub fn kind(sql: &str) -> Kind {
    let head = strip_comments(sql).to_ascii_lowercase();
    let words: Vec<&str> = head.split_whitespace().take(6).collect();
    let has = |w: &str| words.contains(&w);
    match words.as_slice() {
        ["begin", ..] | ["start", "transaction", ..] => Kind::Begin,
        ["commit", ..] | ["end", ..] => Kind::Commit,
        ["rollback", "to", ..] => Kind::Plain,
        ["rollback", ..] | ["abort", ..] => Kind::Rollback,
        ["create", ..] | ["drop", ..] if has("index") && has("concurrently") => Kind::NoTransaction,
        ["reindex", ..] if head.contains("concurrently") => Kind::NoTransaction,
        ["reindex", "schema" | "database" | "system", ..] => Kind::NoTransaction,
        ["reindex", "(", ..] if has("schema") || has("database") || has("system") => Kind::NoTransaction,
        // CLUSTER with no table clusters every table, one transaction each.
        ["cluster"] => Kind::NoTransaction,
        ["cluster", "verbose"] | ["cluster", "(verbose)"] => Kind::NoTransaction,
        ["alter", "table", ..]
            if head.split_whitespace().any(|w| w == "detach")
                && matches!(
                    head.trim_end().trim_end_matches(';').split_whitespace().last(),
                    Some("concurrently" | "finalize")
                ) =>
        {
            Kind::NoTransaction
        }
        ["vacuum", ..] | ["alter", "system", ..] | ["discard", "all", ..] => Kind::NoTransaction,
        ["create", "database", ..] | ["drop", "database", ..] => Kind::NoTransaction,
        ["create", "tablespace", ..] | ["drop", "tablespace", ..] => Kind::NoTransaction,
        // A procedure, or a DO block that ends its own transactions (a
        // batched backfill's COMMIT per batch), can do so only outside a
        // transaction block, as psql runs it.
        ["call", ..] => Kind::NoTransaction,
        ["do", ..] if names_transaction_control(&head) => Kind::NoTransaction,
        _ => Kind::Plain,
    }
}

/// Whether `text` (lowercased) holds the word `commit` or `rollback`: in a
/// `DO` block's body, a transaction it ends itself.
fn names_transaction_control(text: &str) -> bool {
    text.split(|c: char| !c.is_ascii_alphanumeric() && c != '_').any(|w| w == "commit" || w == "rollback")
}

/// Whether `sql` is a `COPY ... TO STDOUT`: rows sent to the client, which
/// promote reads and drops, as psql would print them.
pub fn copies_out(sql: &str) -> bool {
    let head = strip_comments(sql).to_ascii_lowercase();
    let words: Vec<&str> =
        head.split(|c: char| c.is_whitespace() || c == ')').filter(|w| !w.is_empty()).collect();
    words.first() == Some(&"copy") && words.windows(2).any(|w| w == ["to", "stdout"])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(sql: &str) -> Vec<(String, usize)> {
        split(sql).unwrap().into_iter().map(|s| (s.sql, s.line)).collect()
    }

    #[test]
    fn dollar_tags_are_read_as_postgresql_reads_them() {
        assert_eq!(dollar_tag("$q$ x $q$"), Some("$q$"));
        assert_eq!(dollar_tag("$$ x $$"), Some("$$"));
        // Any character past ASCII is a letter to PostgreSQL's lexer.
        assert_eq!(dollar_tag("$€$'$€$"), Some("$€$"));
        assert_eq!(dollar_tag("$1$"), None);
        assert_eq!(dollar_tag("$a-b$"), None);
        let texts: Vec<String> =
            split("SELECT $€$;'$€$; SELECT 2").unwrap().into_iter().map(|s| s.sql).collect();
        assert_eq!(texts, ["SELECT $€$;'$€$", "SELECT 2"]);
    }

    #[test]
    fn splits_on_semicolons_outside_quotes_comments_and_bodies() {
        let sql = "-- header; not a statement\nCREATE TABLE a (x text DEFAULT ';');\n\n\
                   INSERT INTO a VALUES ('it''s; fine'), (E'back\\'slash;');\n\
                   CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $body$ BEGIN RETURN 1; END $body$;\n\
                   /* block; /* nested; */ still */ SELECT \"semi;colon\" FROM a;\n\
                   CREATE FUNCTION g() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; SELECT CASE WHEN true THEN 2 END; END;\n\
                   SELECT $$a;b$$, $1";
        let got = texts(sql);
        assert_eq!(got.len(), 6, "{got:#?}");
        assert_eq!(got[0], ("-- header; not a statement\nCREATE TABLE a (x text DEFAULT ';')".into(), 2));
        assert_eq!(got[1].1, 4);
        assert!(got[2].0.ends_with("$body$"));
        assert_eq!(got[3].1, 6);
        assert!(got[4].0.ends_with("END; END"), "{:?}", got[4]);
        assert_eq!(got[5], ("SELECT $$a;b$$, $1".into(), 8));
        assert!(texts("  -- only a comment\n ;; \n").is_empty());
    }

    #[test]
    fn a_carriage_return_ends_a_line_comment_as_for_postgresql() {
        let hidden = "ALTER TABLE users ADD COLUMN a int;\n-- note\rDO $$ BEGIN NULL; END $$;\nSELECT 1;";
        let got = texts(hidden);
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(got[1].0.ends_with("DO $$ BEGIN NULL; END $$"), "{got:?}");
        assert_eq!(kind("-- x\rCREATE INDEX CONCURRENTLY i ON t (a)"), Kind::NoTransaction);
    }

    #[test]
    fn a_word_in_a_comment_is_not_a_token() {
        // For PostgreSQL this is `SELECT 1 atomic`, then four statements.
        let forged =
            "SELECT 1 -- begin\natomic;\nCOMMIT; BEGIN; LOCK TABLE orders; COMMIT;\nSELECT 1 AS \"end\";";
        assert_eq!(texts(forged).len(), 6, "{:?}", texts(forged));
        // A comment between BEGIN and ATOMIC is whitespace: still a body.
        let body =
            "CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN /* x */ ATOMIC SELECT 1; END; SELECT 2;";
        assert_eq!(texts(body).len(), 2, "{:?}", texts(body));
    }

    #[test]
    fn meta_commands_are_refused_and_kinds_are_told_apart() {
        assert!(split("SELECT 1;\n\\set x 1\n").is_err());
        assert_eq!(kind("BEGIN"), Kind::Begin);
        assert_eq!(kind("CLUSTER"), Kind::NoTransaction);
        assert_eq!(kind("CLUSTER users USING users_pkey"), Kind::Plain);
        assert_eq!(kind("REINDEX SCHEMA public"), Kind::NoTransaction);
        assert_eq!(kind("REINDEX TABLE users"), Kind::Plain);
        assert_eq!(kind("ALTER TABLE m DETACH PARTITION m_2023 CONCURRENTLY"), Kind::NoTransaction);
        assert_eq!(
            kind("ALTER TABLE IF EXISTS public.m DETACH PARTITION public.m_2023 FINALIZE"),
            Kind::NoTransaction
        );
        assert_eq!(kind("ALTER TABLE m DETACH PARTITION m_2023"), Kind::Plain);
        assert!(copies_out("COPY (SELECT id FROM t) TO STDOUT"));
        assert!(copies_out("copy t to stdout with (format csv)"));
        assert!(!copies_out("COPY t FROM STDIN"));
        assert!(!copies_out("SELECT 'copy to stdout'"));
        assert_eq!(kind("start transaction isolation level serializable"), Kind::Begin);
        assert_eq!(kind("-- done\nCOMMIT"), Kind::Commit);
        assert_eq!(kind("rollback to savepoint a"), Kind::Plain);
        assert_eq!(kind("ROLLBACK"), Kind::Rollback);
        assert_eq!(kind("CREATE UNIQUE INDEX CONCURRENTLY i ON t (x)"), Kind::NoTransaction);
        assert_eq!(kind("CREATE INDEX i ON t (x)"), Kind::Plain);
        assert_eq!(kind("VACUUM ANALYZE t"), Kind::NoTransaction);
        assert_eq!(kind("DISCARD ALL"), Kind::NoTransaction);
        // Code that ends its own transactions runs outside a block, as psql runs it.
        assert_eq!(kind("CALL backfill(1000)"), Kind::NoTransaction);
        assert_eq!(
            kind("DO $$ BEGIN FOR i IN 1..3 LOOP UPDATE t SET a = 1 WHERE id = i; COMMIT; END LOOP; END $$"),
            Kind::NoTransaction
        );
        assert_eq!(kind("do $$ begin rollback; end $$"), Kind::NoTransaction);
        assert_eq!(kind("DO $$ BEGIN UPDATE t SET committed = true; END $$"), Kind::Plain);
    }
}
