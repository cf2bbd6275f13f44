//! Tokens of SQL read the way PostgreSQL's lexer reads them: quotes, dollar
//! quotes, nested comments, `E''` and `U&''` escapes.

/// A token of SQL, as the lexer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Token {
    /// An unquoted word, lowercased.
    Word(String),
    /// A quoted identifier, as written inside its quotes.
    Quoted(String),
    /// A string or dollar-quoted constant, as written inside its quotes.
    Constant(String),
    /// A Unicode-escaped identifier (`U&"\\0070g_class"`), whose name the
    /// lexer does not decode.
    Escaped,
    /// A number, as written (`0`, `1.5`, `5s` when a unit follows at once).
    Number(String),
    /// Anything else: one character of punctuation.
    Other(char),
}

/// Whether `t` is the unquoted word `w` (given lowercased).
pub(crate) fn word(t: Option<&Token>, w: &str) -> bool {
    matches!(t, Some(Token::Word(x)) if x == w)
}

/// Where the group that `said[open]` (a `(` or `[`) opens is closed, if it is.
pub(crate) fn closing(said: &[Token], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (j, t) in said.iter().enumerate().skip(open) {
        match t {
            Token::Other('(' | '[') => depth += 1,
            Token::Other(')' | ']') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return Some(j);
                }
            }
            _ => {}
        }
    }
    None
}

/// Where the group that `said[close]` (a `)` or `]`) closes opens, if it does.
pub(crate) fn opening(said: &[Token], close: usize) -> Option<usize> {
    let mut depth = 0usize;
    for j in (0..=close).rev() {
        match said[j] {
            Token::Other(')' | ']') => depth += 1,
            Token::Other('(' | '[') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return Some(j);
                }
            }
            _ => {}
        }
    }
    None
}

/// The `(` of the innermost group that holds the token at `at`, if any.
pub(crate) fn enclosing(said: &[Token], at: usize) -> Option<usize> {
    let mut depth = 0usize;
    for j in (0..at).rev() {
        match said[j] {
            Token::Other(')') => depth += 1,
            Token::Other('(') if depth == 0 => return Some(j),
            Token::Other('(') => depth -= 1,
            _ => {}
        }
    }
    None
}

/// Whether `said` has `AT TIME ZONE` from `at`.
pub(crate) fn at_time_zone(said: &[Token], at: usize) -> bool {
    word(said.get(at), "at") && word(said.get(at + 1), "time") && word(said.get(at + 2), "zone")
}

/// An `E'...'` constant's text with its backslash escapes read: `\n` and
/// the like, octal `\164`, hex `\x74`, `\u0074` and `\U00000074`.
pub(super) fn unescape_e(raw: &str) -> String {
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
pub(super) fn unescape_u(raw: &str) -> String {
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
pub(crate) fn tokens(sql: &str) -> Vec<Token> {
    lex(sql, false)
}

/// [`tokens`], with dollar-quoted constants in the case they are written
/// in: a body read again as code (a `DO` block's) must keep its own dollar
/// quotes' tags apart, as PostgreSQL does (`$X$` is not `$x$`).
pub(crate) fn tokens_keeping_case(sql: &str) -> Vec<Token> {
    lex(sql, true)
}

fn lex(sql: &str, keep_case: bool) -> Vec<Token> {
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
            // A `$` right after an identifier's character is part of it (the
            // identifier arm takes those); anywhere else it may open a
            // dollar quote, after a keyword too (`DO $$`, `SELECT $q$`).
            b'$' if i == 0
                || !(bytes[i - 1].is_ascii_alphanumeric()
                    || bytes[i - 1] == b'_'
                    || bytes[i - 1] >= 0x80) =>
            {
                match airlock_postgres::split::dollar_tag(&sql[i..]) {
                    Some(tag) => {
                        let body = i + tag.len();
                        let end = sql[body..].find(tag).map_or(bytes.len(), |e| body + e);
                        let text = &sql[body..end];
                        out.push(Token::Constant(if keep_case {
                            text.to_owned()
                        } else {
                            text.to_ascii_lowercase()
                        }));
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
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'.') {
                    i += 1;
                }
                out.push(Token::Number(sql[start..i].to_ascii_lowercase()));
            }
            _ => {
                out.push(Token::Other(c as char));
                i += 1;
            }
        }
    }
    out
}
