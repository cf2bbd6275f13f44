//! Which line of a candidate names a thing: what a hazard points at. A
//! statement is read as its words, without its comments, so a comment naming
//! a table is never taken for the statement that changes it.

use super::evidence::Evidence;

/// The line of the first of `statements` (in the order given), not rolled
/// back, that names `qualified` by its last part as a word, outside its
/// comments.
pub(crate) fn naming<'a>(
    mut statements: impl Iterator<Item = &'a super::report::StatementReport>,
    qualified: &str,
) -> Option<usize> {
    let name = airlock_postgres::catalog::split_qualified(qualified).1.to_ascii_lowercase();
    statements
        .find(|s| !s.rolled_back && names_word(&without_comments(&s.sql), &name))
        .map(|s| s.line)
        .filter(|l| *l > 0)
}

/// The line of the first statement (not rolled back) that dropped an
/// object named `name`, naming it or through a `CASCADE`.
pub(crate) fn line_dropping(e: &Evidence, name: &str) -> Option<usize> {
    e.statements
        .iter()
        .find(|s| !s.rolled_back && s.dropped.iter().any(|d| d.identity.split(' ').next() == Some(name)))
        .map(|s| s.line)
        .filter(|l| *l > 0)
}

/// The line of the first statement that names table `qualified` (`schema.name`),
/// by its name alone as a search path finds it, or qualified.
pub(crate) fn line_naming_table(e: &Evidence, qualified: &str) -> Option<usize> {
    let (_, name) = airlock_postgres::catalog::split_qualified(qualified);
    line_naming(e, &name).or_else(|| line_naming(e, qualified))
}

/// The line of the first statement that names `name`, if one does.
pub(crate) fn line_naming(e: &Evidence, name: &str) -> Option<usize> {
    line_naming_all(e, &[name])
}

/// The line of the first statement (not rolled back) that names every one
/// of `names` as a word, outside its comments (a comment naming a table is
/// not the statement that changes it).
pub(crate) fn line_naming_all(e: &Evidence, names: &[impl AsRef<str>]) -> Option<usize> {
    let names: Vec<String> = names.iter().map(|n| n.as_ref().to_ascii_lowercase()).collect();
    e.statements
        .iter()
        .find(|s| {
            !s.rolled_back && {
                let sql = without_comments(&s.sql);
                names.iter().all(|n| names_word(&sql, n))
            }
        })
        .map(|s| s.line)
        .filter(|l| *l > 0)
}

/// A statement's text as its tokens, lowercased, without its comments: words,
/// names, constants and punctuation (a qualified name kept whole, `a.b`).
pub(crate) fn without_comments(sql: &str) -> String {
    use super::code::lexer::{tokens, Token};
    let mut out = String::new();
    let mut glued = false;
    for t in tokens(sql) {
        let (text, glue) = match &t {
            Token::Word(w) | Token::Quoted(w) | Token::Constant(w) | Token::Number(w) => {
                (w.to_ascii_lowercase(), false)
            }
            Token::Other(c) => (c.to_string(), *c == '.'),
            Token::Escaped => (String::new(), false),
        };
        if !out.is_empty() && !glued && !glue {
            out.push(' ');
        }
        out.push_str(&text);
        glued = glue;
    }
    out
}

/// Whether `text` names `word` as a whole identifier.
pub(crate) fn names_word(text: &str, word: &str) -> bool {
    let is_part = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(at, _)| {
        !text[..at].chars().next_back().is_some_and(is_part)
            && !text[at + word.len()..].chars().next().is_some_and(is_part)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_is_named_whole() {
        assert!(names_word("CHECK ((total >= (0)::numeric))", "total"));
        assert!(!names_word("CHECK ((subtotal >= (0)::numeric))", "total"));
        assert!(!names_word("alter table orders drop constraint fix_total", "ix"));
    }
}
