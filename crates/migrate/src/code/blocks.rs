//! A `DO` block read as what it runs: the SQL statements in its body and
//! the expressions its declarations, conditions, loops and assignments
//! compute, each of which the classifier then judges as it judges the
//! file's own statements.
//!
//! Only the plain shape of PL/pgSQL is read: declarations of variables,
//! `IF`/`ELSIF`/`ELSEIF`/`ELSE`, `LOOP`, `WHILE`, `FOR` over a range of
//! integers or a query, `FOREACH ... IN ARRAY`, labels, `EXIT`/`CONTINUE
//! [label] [WHEN]`, assignments, `PERFORM`, `RAISE` with a format,
//! arguments and `USING` options, `GET DIAGNOSTICS ... = ROW_COUNT`, `NULL`,
//! `RETURN`, nested `BEGIN ... END`, `COMMIT`/`ROLLBACK`, and queries and
//! writes (`SELECT ... INTO`, `INSERT`, `UPDATE`, `DELETE`, `MERGE`,
//! `WITH`), with variables of plain types ([`PLAIN_TYPES`]). Anything else
//! (`EXECUTE`, a cursor, an exception handler, a `CASE` statement, `ASSERT`,
//! which runs only where `plpgsql.check_asserts` is on, a variable of
//! another type, a cast of a variable into a type that may read the clock,
//! another language) leaves the block unread, and so opaque: the reading errs toward
//! opaque, as the classifier does.

use std::collections::BTreeSet;

use super::lexer::{closing, opening, tokens, word, Token};
use super::words::is_time_type;

/// A `DO` block's body, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Block {
    /// What it runs, as SQL statements to judge: its statements, and
    /// `SELECT expr` for each expression it computes.
    pub parts: Vec<String>,
    /// Whether it commits or rolls back as it goes: what it commits then
    /// escapes any check made before its end.
    pub commits: bool,
}

/// The words of the types a variable may have in a plain block: numbers,
/// text, truth values, identifiers, bytes, JSON and records, and arrays of
/// them. Text assigned to one is never read by the clock's rules (as it is
/// for a date, a range of times, a domain over one or a row holding one).
const PLAIN_TYPES: &[&str] = &[
    "int",
    "integer",
    "int2",
    "int4",
    "int8",
    "smallint",
    "bigint",
    "numeric",
    "decimal",
    "real",
    "float4",
    "float8",
    "double",
    "precision",
    "text",
    "varchar",
    "character",
    "varying",
    "char",
    "bool",
    "boolean",
    "uuid",
    "bytea",
    "json",
    "jsonb",
    "record",
    "interval",
];

/// Levels a `RAISE` may name.
const RAISE_LEVELS: &[&str] = &["debug", "log", "info", "notice", "warning", "exception"];

/// Options a `RAISE ... USING` may set, each to an expression.
const RAISE_OPTIONS: &[&str] =
    &["message", "detail", "hint", "errcode", "column", "constraint", "datatype", "table", "schema"];

/// `DO [LANGUAGE plpgsql] 'body' [LANGUAGE plpgsql]`, read; `None` where the
/// statement is not such a block or its body is not plain ([`Block`]).
pub(super) fn read(statement: &[Token]) -> Option<Block> {
    let [Token::Word(first), rest @ ..] = statement else { return None };
    if first != "do" {
        return None;
    }
    let plpgsql =
        |t: &[Token]| matches!(t, [Token::Word(l), Token::Word(n)] if l == "language" && n == "plpgsql");
    let body = match rest {
        [Token::Constant(body)] => body,
        [Token::Constant(body), language @ ..] | [language @ .., Token::Constant(body)]
            if plpgsql(language) =>
        {
            body
        }
        _ => return None,
    };
    let said = tokens(body);
    let said = unlabelled(&said);
    let mut block = Block { parts: Vec::new(), commits: false };
    let mut at = 0;
    if word(said.first(), "declare") {
        let begin = said.iter().position(|t| word(Some(t), "begin"))?;
        for declaration in split(&said[1..begin]) {
            declared(declaration, &mut block)?;
        }
        at = begin;
    }
    if !word(said.get(at), "begin")
        || said.iter().any(|t| matches!(t, Token::Escaped))
        || casts_variables(said, &variables(said, at))
    {
        return None;
    }
    let statements = split(&said[at + 1..]);
    // The last is the block's own END (a `;` after it is allowed).
    let (last, inner) = match statements.split_last() {
        Some((last, inner)) if last.is_empty() => inner.split_last()?,
        other => other?,
    };
    // (`END label` closes a labelled block.)
    if !matches!(last, [Token::Word(end)] | [Token::Word(end), Token::Word(_)] if end == "end") {
        return None;
    }
    for statement in inner {
        plain_statement(statement, &mut block)?;
    }
    Some(block)
}

/// `name [CONSTANT] type [NOT NULL] [:= | = | DEFAULT expr]`: its expression.
fn declared(declaration: &[Token], block: &mut Block) -> Option<()> {
    if declaration.is_empty() {
        return Some(());
    }
    if !matches!(declaration.first(), Some(Token::Word(_))) {
        return None;
    }
    if declaration
        .iter()
        .any(|t| matches!(t, Token::Word(w) if w == "cursor" || w == "alias" || w == "refcursor"))
    {
        return None;
    }
    // Its default: after the first `:=`, `=` or DEFAULT outside parentheses
    // (a `:=` inside is a named argument of the default's own call).
    let mut depth = 0usize;
    let from = declaration.iter().enumerate().find_map(|(i, t)| {
        match t {
            Token::Other('(') => depth += 1,
            Token::Other(')') => depth = depth.saturating_sub(1),
            _ if depth > 0 => {}
            Token::Other(':') if declaration.get(i + 1) == Some(&Token::Other('=')) => return Some(i + 2),
            Token::Other('=') => return Some(i + 1),
            Token::Word(w) if w == "default" => return Some(i + 1),
            _ => {}
        }
        None
    });
    if let Some(from) = from {
        block.parts.push(select(&declaration[from..])?);
    }
    // Its type, which a value is cast to when assigned (`regclass` reads
    // the catalog): judged as a cast.
    let start = 1 + usize::from(word(declaration.get(1), "constant"));
    let end = declaration[start..]
        .iter()
        .position(|t| {
            matches!(t, Token::Word(w) if w == "default" || w == "not")
                || *t == Token::Other(':')
                || *t == Token::Other('=')
        })
        .map_or(declaration.len(), |p| start + p);
    let declared_type = declaration.get(start..end).filter(|t| !t.is_empty())?;
    // Any other type (a time, whose every assignment converts text by the
    // clock's rules, `d := 'to' || 'day'`, with no cast to see; a domain or
    // a row type that may hold one; one copied with `%TYPE`): not plain.
    if !declared_type.iter().all(plain_type) {
        return None;
    }
    let mut cast = vec![Token::Word("null".into()), Token::Other(':'), Token::Other(':')];
    cast.extend_from_slice(declared_type);
    block.parts.push(select(&cast)?);
    Some(())
}

/// One statement of the body, its control words peeled off the front.
fn plain_statement(mut statement: &[Token], block: &mut Block) -> Option<()> {
    loop {
        statement = unlabelled(statement);
        let Some(Token::Word(first)) = statement.first() else { break };
        match first.as_str() {
            "if" | "elsif" | "elseif" => {
                let then = position(statement, "then")?;
                block.parts.push(select(&statement[1..then])?);
                statement = &statement[then + 1..];
            }
            "while" => {
                let body = position(statement, "loop")?;
                block.parts.push(select(&statement[1..body])?);
                statement = &statement[body + 1..];
            }
            "for" => {
                let body = position(statement, "loop")?;
                let (Some(Token::Word(_)), true) = (statement.get(1), word(statement.get(2), "in")) else {
                    return None;
                };
                block.parts.push(looped_over(&statement[3..body])?);
                statement = &statement[body + 1..];
            }
            // `FOREACH v [SLICE n] IN ARRAY expr LOOP`: the array's expression.
            "foreach" => {
                let body = position(statement, "loop")?;
                let array = position(statement, "array")?;
                let header: Vec<&str> = statement[..array].iter().map(word_of).collect();
                if !matches!(header.as_slice(), ["foreach", _, "in"] | ["foreach", _, "slice", _, "in"]) {
                    return None;
                }
                block.parts.push(select(statement.get(array + 1..body)?)?);
                statement = &statement[body + 1..];
            }
            "loop" | "else" | "begin" => statement = &statement[1..],
            _ => break,
        }
    }
    let words: Vec<&str> = statement.iter().map(word_of).collect();
    match words.as_slice() {
        [] | ["null"] | ["return"] | ["end"] | ["end", "if"] => {}
        // The end of a loop or of a nested block, perhaps with its label.
        ["end", "loop"] | ["end", "loop", _] | ["end", _]
            if statement.iter().all(|t| matches!(t, Token::Word(_))) => {}
        ["commit" | "rollback", rest @ ..]
            if matches!(rest, [] | ["and", "chain"] | ["and", "no", "chain"]) =>
        {
            block.commits = true
        }
        ["exit" | "continue", ..] => {
            // Its label, if it names one.
            let from = if matches!(words.get(1), Some(&w) if !w.is_empty() && w != "when") { 2 } else { 1 };
            match statement.get(from..) {
                Some([]) => {}
                Some([Token::Word(when), condition @ ..]) if when == "when" => {
                    block.parts.push(select(condition)?)
                }
                _ => return None,
            }
        }
        ["raise", ..] => raised(&statement[1..], block)?,
        ["perform", ..] => block.parts.push(select(&statement[1..])?),
        ["get", "diagnostics" | "current", ..] => diagnostics(statement)?,
        ["select" | "insert" | "update" | "delete" | "merge" | "with", ..] => {
            block.parts.push(text(&without_into(statement))?)
        }
        [_, ..] => {
            // `name := expr` (or `=`).
            let from = match statement {
                [Token::Word(_), Token::Other(':'), Token::Other('='), ..] => 3,
                [Token::Word(_), Token::Other('='), ..] => 2,
                _ => return None,
            };
            block.parts.push(select(&statement[from..])?);
        }
    }
    Some(())
}

/// `RAISE [level] 'format' [, expr ...] [USING option = expr, ...]`, or a
/// condition's name or `SQLSTATE 'code'` in place of the format, or a bare
/// `RAISE`: its arguments and options' expressions.
fn raised(mut rest: &[Token], block: &mut Block) -> Option<()> {
    if matches!(rest.first(), Some(Token::Word(l)) if RAISE_LEVELS.contains(&l.as_str())) {
        rest = &rest[1..];
    }
    let (head, options) = match position(rest, "using") {
        Some(at) => (&rest[..at], Some(&rest[at + 1..])),
        None => (rest, None),
    };
    match head {
        [] | [Token::Constant(_)] => {}
        [Token::Word(w), Token::Constant(_)] if w == "sqlstate" => {}
        [Token::Word(condition)] if condition != "sqlstate" => {}
        [Token::Constant(_), Token::Other(','), arguments @ ..] => block.parts.push(select(arguments)?),
        _ => return None,
    }
    for option in options.map(|o| split_on(o, ',')).unwrap_or_default() {
        match option {
            [Token::Word(name), Token::Other('='), value @ ..] if RAISE_OPTIONS.contains(&name.as_str()) => {
                block.parts.push(select(value)?)
            }
            [Token::Word(name), Token::Other(':'), Token::Other('='), value @ ..]
                if RAISE_OPTIONS.contains(&name.as_str()) =>
            {
                block.parts.push(select(value)?)
            }
            _ => return None,
        }
    }
    Some(())
}

/// `GET [CURRENT] DIAGNOSTICS v = ROW_COUNT [, ...]` (`:=` too): only the
/// row count, which the block's own statements made, is read.
fn diagnostics(statement: &[Token]) -> Option<()> {
    let from = if word(statement.get(1), "current") { 3 } else { 2 };
    if !word(statement.get(from - 1), "diagnostics") {
        return None;
    }
    let items = split_on(statement.get(from..)?, ',');
    let row_count = |item: &[Token]| match item {
        [Token::Word(_), Token::Other('='), Token::Word(r)] => r == "row_count",
        [Token::Word(_), Token::Other(':'), Token::Other('='), Token::Word(r)] => r == "row_count",
        _ => false,
    };
    items.iter().all(|item| row_count(item)).then_some(())
}

/// The block's variables: those it declares (before `begin`, at `at`) and
/// its loops' (`FOR v IN`, `FOREACH v`).
fn variables(said: &[Token], at: usize) -> BTreeSet<String> {
    // Quoted or not: PL/pgSQL reads `"v"` as `v`'s name.
    let declared = split(said.get(1..at).unwrap_or_default()).into_iter().filter_map(|d| match d.first() {
        Some(Token::Word(name) | Token::Quoted(name)) => Some(name.clone()),
        _ => None,
    });
    let looped = said.windows(3).filter_map(|w| match w {
        [Token::Word(f), Token::Word(v) | Token::Quoted(v), Token::Word(i)] if f == "for" && i == "in" => {
            Some(v.clone())
        }
        [Token::Word(f), Token::Word(v) | Token::Quoted(v), _] if f == "foreach" => Some(v.clone()),
        _ => None,
    });
    declared.chain(looped).collect()
}

/// Whether the body casts a value made of its variables into a type whose
/// input may read the clock (any but the plain ones: `v::date`, `CAST (v AS
/// users)`, `date(v)`): a variable's text may be `now` however it was
/// computed, which a cast of a name does not show. Casts of columns and
/// constants are judged as the file's own are.
fn casts_variables(said: &[Token], variables: &BTreeSet<String>) -> bool {
    // A variable quoted (`"v"`, `"label"."v"`) is the same variable.
    let variable = |t: &Token| matches!(t, Token::Word(w) | Token::Quoted(w) if variables.contains(w));
    // The tokens inside a call or `CAST (...)` from `open`, its `(`.
    let inside = |open: usize| &said[open + 1..closing(said, open).unwrap_or(said.len()).max(open + 1)];
    // The type a cast names from `k`: words (a schema's too, quoted or
    // not), precision and array brackets.
    let cast_type = |k: usize| -> &[Token] {
        let typed = |t: &Token| {
            matches!(
                t,
                Token::Word(_)
                    | Token::Quoted(_)
                    | Token::Number(_)
                    | Token::Other('.' | '[' | ']' | '(' | ')' | ',')
            )
        };
        let n = said
            .get(k..)
            .unwrap_or_default()
            .iter()
            .position(|t| !typed(t))
            .unwrap_or(said.len().saturating_sub(k));
        said.get(k..k + n).unwrap_or_default()
    };
    let into_other = |ty: &[Token]| !ty.is_empty() && !ty.iter().all(plain_type);
    for k in 0..said.len() {
        // `operand::type`: the operand's variables, back through a chain of casts.
        if k > 0 && said[k] == Token::Other(':') && said.get(k + 1) == Some(&Token::Other(':')) {
            let mut end = k - 1;
            while end >= 3
                && matches!(said[end], Token::Word(_) | Token::Quoted(_))
                && said[end - 1] == Token::Other(':')
                && said[end - 2] == Token::Other(':')
            {
                end -= 3;
            }
            let operand = match said[end] {
                Token::Other(')' | ']') => &said[opening(said, end).unwrap_or(0)..=end],
                // A record's field (`r.t`) is its record's.
                _ if end >= 2 && said[end - 1] == Token::Other('.') => &said[end - 2..=end],
                _ => &said[end..=end],
            };
            if operand.iter().any(variable) && into_other(cast_type(k + 2)) {
                return true;
            }
        }
        // `CAST (operand AS type)`.
        if word(said.get(k), "cast") && said.get(k + 1) == Some(&Token::Other('(')) {
            let inner = inside(k + 1);
            if let Some(a) = inner.iter().rposition(|t| word(Some(t), "as")) {
                if inner[..a].iter().any(variable) && into_other(&inner[a + 1..]) {
                    return true;
                }
            }
        }
        // `date(operand)`: a time type called as a function.
        if let (Token::Word(w) | Token::Quoted(w), Some(Token::Other('('))) = (&said[k], said.get(k + 1)) {
            if is_time_type(&w.to_ascii_lowercase()) && inside(k + 1).iter().any(variable) {
                return true;
            }
        }
    }
    false
}

/// Whether `t` may stand in a plain type's name ([`PLAIN_TYPES`]), its
/// precision or its array brackets.
fn plain_type(t: &Token) -> bool {
    match t {
        Token::Word(w) => PLAIN_TYPES.contains(&w.as_str()),
        Token::Number(_) => true,
        Token::Other(c) => matches!(c, '(' | ')' | ',' | '[' | ']' | '.'),
        _ => false,
    }
}

/// `said` without a `<<label>>` in front.
fn unlabelled(said: &[Token]) -> &[Token] {
    match said {
        [Token::Other('<'), Token::Other('<'), Token::Word(_), Token::Other('>'), Token::Other('>'), rest @ ..] => {
            rest
        }
        _ => said,
    }
}

/// A token's word, or nothing.
fn word_of(t: &Token) -> &str {
    match t {
        Token::Word(w) => w.as_str(),
        _ => "",
    }
}

/// What `FOR v IN ... LOOP` runs over: a range of integers (`1 .. n [BY
/// step]`, `REVERSE` too), judged as its bounds, or a query.
fn looped_over(over: &[Token]) -> Option<String> {
    let over = if word(over.first(), "reverse") { &over[1..] } else { over };
    // The lexer reads `1..n` as one number: its dots apart.
    let over: Vec<Token> = over
        .iter()
        .flat_map(|t| match t {
            Token::Number(n) if n.contains("..") => {
                let (low, high) = n.split_once("..").expect("it holds two dots");
                let mut apart: Vec<Token> = Vec::new();
                apart.extend((!low.is_empty()).then(|| Token::Number(low.to_owned())));
                apart.extend([Token::Other('.'), Token::Other('.')]);
                apart.extend((!high.is_empty()).then(|| Token::Number(high.to_owned())));
                apart
            }
            t => vec![t.clone()],
        })
        .collect();
    let over = over.as_slice();
    if let Some(dots) = over.windows(2).position(|w| w == [Token::Other('.'), Token::Other('.')]) {
        let mut bounds: Vec<Token> = over[..dots].to_vec();
        bounds.push(Token::Other(','));
        for t in &over[dots + 2..] {
            bounds.push(if word(Some(t), "by") { Token::Other(',') } else { t.clone() });
        }
        return select(&bounds);
    }
    // A query, perhaps in parentheses.
    let query = match over {
        // (Only where its first parenthesis closes at its end.)
        [Token::Other('('), inner @ .., Token::Other(')')] if closing(over, 0) == Some(over.len() - 1) => {
            inner
        }
        _ => over,
    };
    match query.first() {
        Some(Token::Word(w)) if w == "select" || w == "with" => text(query),
        _ => None,
    }
}

/// `SELECT ... INTO [STRICT] a, b ...` and `... RETURNING ... INTO a`
/// without their `INTO` targets, which are the block's variables (the
/// `INTO` of `INSERT INTO` and `MERGE INTO` is kept).
fn without_into(statement: &[Token]) -> Vec<Token> {
    let mut out = Vec::with_capacity(statement.len());
    let mut i = 0;
    while i < statement.len() {
        let into = word(statement.get(i), "into")
            && !matches!(out.last(), Some(Token::Word(w)) if w == "insert" || w == "merge");
        if !into {
            out.push(statement[i].clone());
            i += 1;
            continue;
        }
        i += 1;
        if word(statement.get(i), "strict") {
            i += 1;
        }
        // Targets: names, dotted or not, separated by commas.
        while matches!(statement.get(i), Some(Token::Word(_) | Token::Quoted(_))) {
            i += 1;
            while statement.get(i) == Some(&Token::Other('.')) && statement.get(i + 1).is_some() {
                i += 2;
            }
            if statement.get(i) != Some(&Token::Other(',')) {
                break;
            }
            i += 1;
        }
    }
    out
}

/// `SELECT` of an expression, as text.
fn select(expression: &[Token]) -> Option<String> {
    if expression.is_empty() {
        return None;
    }
    let mut said = vec![Token::Word("select".into())];
    said.extend_from_slice(expression);
    text(&said)
}

/// Tokens written back as SQL that reads as the same tokens: constants
/// dollar-quoted under a tag their text does not hold, identifiers quoted.
fn text(said: &[Token]) -> Option<String> {
    let mut out = String::new();
    for t in said {
        match t {
            Token::Word(w) | Token::Number(w) => out.push_str(w),
            Token::Quoted(q) => {
                out.push('"');
                out.push_str(&q.replace('"', "\"\""));
                out.push('"');
            }
            Token::Constant(c) => {
                let tag = (0..).map(|n| format!("$c{n}$")).find(|tag| !c.contains(tag.as_str()))?;
                out.push_str(&tag);
                out.push_str(c);
                out.push_str(&tag);
            }
            Token::Escaped => return None,
            Token::Other(c) => out.push(*c),
        }
        out.push(' ');
    }
    Some(out)
}

/// `tokens` split at each `;` outside parentheses.
fn split(said: &[Token]) -> Vec<&[Token]> {
    split_on(said, ';')
}

/// `tokens` split at each `separator` outside parentheses.
fn split_on(said: &[Token], separator: char) -> Vec<&[Token]> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, t) in said.iter().enumerate() {
        match t {
            Token::Other('(') => depth += 1,
            Token::Other(')') => depth = depth.saturating_sub(1),
            Token::Other(c) if *c == separator && depth == 0 => {
                out.push(&said[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&said[start..]);
    out
}

/// Where the word `w` first stands in `said` outside parentheses.
fn position(said: &[Token], w: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, t) in said.iter().enumerate() {
        match t {
            Token::Other('(') => depth += 1,
            Token::Other(')') => depth = depth.saturating_sub(1),
            Token::Word(x) if depth == 0 && x == w => return Some(i),
            _ => {}
        }
    }
    None
}
