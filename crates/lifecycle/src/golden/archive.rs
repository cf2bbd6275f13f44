//! Reading a pg_dump archive without restoring it: its table of contents
//! (`pg_restore -l`), and the roles and extensions its DDL names.
//!
//! Roles are global objects a database dump does not carry, but its DDL names
//! every role it needs: owners (`OWNER TO`), grantees (`GRANT ... TO`,
//! `REVOKE ... FROM`), default privileges (`FOR ROLE`) and policy roles
//! (`CREATE POLICY ... TO`). The DDL is split into statements the way
//! PostgreSQL's lexer would ([`airlock_postgres::split`]), and only statements of
//! those kinds are read: text inside a function body or a string is never
//! taken for a statement.

use std::collections::BTreeSet;

/// One entry of an archive's table of contents.
#[derive(Debug, Clone, PartialEq)]
pub struct TocEntry {
    /// Its dump id, by which a `-L` list file selects it.
    pub id: u64,
    /// The line as `pg_restore -l` printed it (what a `-L` list file holds).
    pub line: String,
    /// Its kind: `TABLE`, `TABLE DATA`, `EXTENSION`, `COMMENT`, `ACL`...
    pub kind: String,
    /// The rest of the line after the kind: schema (or `-`), name, owner.
    pub tag: String,
}

/// Kinds pg_restore prints, longest first so `TABLE DATA` is not read as `TABLE`.
const KINDS: &[&str] = &[
    "MATERIALIZED VIEW DATA",
    "MATERIALIZED VIEW",
    "DATABASE PROPERTIES",
    "TABLE ATTACH",
    "INDEX ATTACH",
    "ROW SECURITY",
    "SHELL TYPE",
    "PROCEDURAL LANGUAGE",
    "LARGE OBJECTS",
    "DEFAULT ACL",
    "TABLE DATA",
    "LARGE OBJECT",
    "BLOB DATA",
    "BLOBS",
    "EVENT TRIGGER",
    "SUBSCRIPTION TABLE",
    "SUBSCRIPTION",
    "PUBLICATION TABLE",
    "PUBLICATION TABLES IN SCHEMA",
    "PUBLICATION",
    "SEQUENCE SET",
    "SEQUENCE OWNED BY",
    "FK CONSTRAINT",
    "CHECK CONSTRAINT",
    "SECURITY LABEL",
    "USER MAPPING",
    "FOREIGN TABLE",
    "FOREIGN SERVER",
    "FOREIGN DATA WRAPPER",
    "TEXT SEARCH CONFIGURATION",
    "TEXT SEARCH DICTIONARY",
    "TEXT SEARCH PARSER",
    "TEXT SEARCH TEMPLATE",
    "OPERATOR CLASS",
    "OPERATOR FAMILY",
    "ACCESS METHOD",
    "DEFAULT",
];

/// Parses `pg_restore -l` output; comment lines are skipped.
pub fn parse_toc(listing: &str) -> Vec<TocEntry> {
    listing
        .lines()
        .filter(|l| !l.starts_with(';') && !l.trim().is_empty())
        .filter_map(|line| {
            // `5432; 1259 16390 TABLE app orders app_owner`
            let (id, after_id) = line.split_once("; ")?;
            let id = id.trim().parse().ok()?;
            let rest = after_id.splitn(3, ' ').nth(2)?;
            let kind = KINDS
                .iter()
                .find(|k| rest.starts_with(*k) && rest[k.len()..].starts_with(' '))
                .map(|k| k.to_string())
                .unwrap_or_else(|| rest.split(' ').next().unwrap_or_default().to_owned());
            let tag = rest[kind.len()..].trim().to_owned();
            Some(TocEntry { id, line: line.to_owned(), kind, tag })
        })
        .collect()
}

/// The first dump id listed twice: pg_restore prints names on one line
/// (PostgreSQL 14 and later replace their newlines), so a second line with an
/// entry's id could only be a name made to look like one, and a `-L` list
/// selects entries by id.
pub fn repeated_id(toc: &[TocEntry]) -> Option<u64> {
    let mut seen = std::collections::HashSet::new();
    toc.iter().map(|e| e.id).find(|id| !seen.insert(*id))
}

/// A dump's DDL as statements (psql's `\restrict` lines, which newer pg_dump
/// versions write, left out).
pub fn statements(ddl: &str) -> airlock_core::error::Result<Vec<String>> {
    let text: String = ddl.lines().filter(|l| !l.starts_with('\\')).map(|l| format!("{l}\n")).collect();
    Ok(airlock_postgres::split::split(&text)?.into_iter().map(|s| s.sql).collect())
}

/// Kinds of object whose owner an import sets from `ALTER ... OWNER TO`.
const OWNED_KINDS: &[&str] = &[
    "MATERIALIZED VIEW",
    "FOREIGN TABLE",
    "LARGE OBJECT",
    "TABLE",
    "VIEW",
    "SEQUENCE",
    "FUNCTION",
    "PROCEDURE",
    "AGGREGATE",
    "TYPE",
    "DOMAIN",
    "SCHEMA",
];

/// One `ALTER <kind> <identity> OWNER TO <owner>` of a dump.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ownership {
    /// `TABLE`, `FUNCTION`, `SCHEMA`, `LARGE OBJECT`... (as pg_dump wrote it).
    pub kind: String,
    /// The object as pg_dump named it: `app.orders`, `app.touch()`, `16400`.
    pub identity: String,
    /// The role it belongs to.
    pub owner: String,
}

/// Every ownership the dump sets, of the kinds an import carries; the others
/// (operators, collations, text search...) are counted in `others`.
pub fn ownerships(statements: &[String]) -> (Vec<Ownership>, usize) {
    let mut out = Vec::new();
    let mut others = 0;
    for sql in statements {
        let words = statement_words(sql);
        let upper: Vec<String> = words.iter().map(|w| w.to_ascii_uppercase()).collect();
        let n = upper.len();
        if n < 5 || upper[0] != "ALTER" || upper[n - 3] != "OWNER" || upper[n - 2] != "TO" {
            continue;
        }
        let rest = upper[1..n - 3].join(" ");
        let Some(kind) = OWNED_KINDS.iter().find(|k| rest.starts_with(&format!("{k} "))) else {
            others += 1;
            continue;
        };
        let skip = 1 + kind.split(' ').count();
        out.push(Ownership {
            kind: kind.to_string(),
            identity: words[skip..n - 3].concat(),
            owner: unquote(&words[n - 1]),
        });
    }
    (out, others)
}

/// The tables (`schema.name`, unquoted) a dump's statements create.
pub fn tables(statements: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for sql in statements {
        let words = statement_words(sql);
        let upper: Vec<String> = words.iter().take(4).map(|w| w.to_ascii_uppercase()).collect();
        let at = match upper.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["CREATE", "TABLE", ..] => 2,
            ["CREATE", "UNLOGGED" | "FOREIGN", "TABLE", ..] => 3,
            _ => continue,
        };
        if let Some(identity) = words.get(at) {
            out.push(qualified(identity));
        }
    }
    out
}

/// The schemas (unquoted names) a dump's statements create.
pub fn schemas(statements: &[String]) -> Vec<String> {
    statements
        .iter()
        .filter_map(|sql| {
            let words = statement_words(sql);
            let create = words.len() >= 3
                && words[0].eq_ignore_ascii_case("CREATE")
                && words[1].eq_ignore_ascii_case("SCHEMA");
            create.then(|| unquote(&words[2]))
        })
        .collect()
}

/// `schema.name` of an identifier such as `app."Odd Name"`, quotes removed.
fn qualified(identity: &str) -> String {
    let (parts, _) = name_parts(identity);
    parts.join(".")
}

/// An identity's name parts, unquoted, and the text between its outermost
/// parentheses (a function's arguments) if it has them:
/// `app."Odd"(v text)` is (`["app", "Odd"]`, `Some("v text")`).
pub fn name_parts(identity: &str) -> (Vec<String>, Option<String>) {
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    for (i, c) in identity.char_indices() {
        match c {
            '"' => {
                quoted = !quoted;
                current.push(c);
            }
            '.' if !quoted => parts.push(unquote(&std::mem::take(&mut current))),
            '(' if !quoted => {
                parts.push(unquote(&std::mem::take(&mut current)));
                let args = identity[i + 1..].strip_suffix(')').unwrap_or(&identity[i + 1..]);
                return (parts, Some(args.to_owned()));
            }
            _ => current.push(c),
        }
    }
    parts.push(unquote(&current));
    (parts, None)
}

/// A statement's words, its trailing semicolon left out.
fn statement_words(sql: &str) -> Vec<String> {
    let mut words = tokens(sql);
    while words.last().is_some_and(|w| w == ";") {
        words.pop();
    }
    words
}

/// An extension a dump creates: its name and schema.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DumpedExtension {
    /// Its name.
    pub name: String,
    /// The schema it is created in.
    pub schema: String,
}

/// The extensions a dump's statements create (`CREATE EXTENSION IF NOT EXISTS x WITH SCHEMA s`), in order.
pub fn extensions(statements: &[String]) -> Vec<DumpedExtension> {
    let mut out = Vec::new();
    for sql in statements {
        let words = statement_words(sql);
        let upper: Vec<String> = words.iter().take(5).map(|w| w.to_ascii_uppercase()).collect();
        if upper.len() < 3 || upper[0] != "CREATE" || upper[1] != "EXTENSION" {
            continue;
        }
        let tokens = if upper.get(2..5) == Some(&["IF".to_owned(), "NOT".to_owned(), "EXISTS".to_owned()][..])
        {
            &words[5..]
        } else {
            &words[2..]
        };
        let Some(name) = tokens.first() else { continue };
        let schema = tokens
            .windows(3)
            .find(|w| w[0].eq_ignore_ascii_case("WITH") && w[1].eq_ignore_ascii_case("SCHEMA"))
            .map(|w| unquote(&w[2]))
            .unwrap_or_else(|| "public".into());
        out.push(DumpedExtension { name: unquote(name), schema });
    }
    out
}

/// Every role a dump's statements name, except `PUBLIC` and the predefined `pg_*` roles.
pub fn roles(statements: &[String]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for sql in statements {
        for role in roles_in(sql) {
            if !role.eq_ignore_ascii_case("public") && !role.starts_with("pg_") && !role.is_empty() {
                out.insert(role);
            }
        }
    }
    out
}

fn roles_in(sql: &str) -> Vec<String> {
    let words = statement_words(sql);
    let upper: Vec<String> = words.iter().map(|w| w.to_ascii_uppercase()).collect();
    let at = |kw: &str| upper.iter().position(|w| w == kw);
    let mut found = Vec::new();
    let starts =
        |prefix: &[&str]| upper.len() >= prefix.len() && upper.iter().zip(prefix).all(|(a, b)| a == b);
    if starts(&["ALTER"]) && upper.len() > 3 && upper[upper.len() - 3] == "OWNER" {
        // `ALTER ... OWNER TO role;`
        found.push(words[words.len() - 1].clone());
    }
    let mut grant_words = &words[..];
    let mut grant_upper = &upper[..];
    if starts(&["ALTER", "DEFAULT", "PRIVILEGES"]) {
        if let Some(i) = upper.windows(2).position(|w| w[0] == "FOR" && (w[1] == "ROLE" || w[1] == "USER")) {
            found.extend(list(&words[i + 2..]));
        }
        if let Some(i) = upper.iter().position(|w| w == "GRANT" || w == "REVOKE") {
            grant_words = &words[i..];
            grant_upper = &upper[i..];
        }
    }
    match grant_upper.first().map(String::as_str) {
        Some("GRANT") => {
            if let Some(i) = grant_upper.iter().rposition(|w| w == "TO") {
                found.extend(list(&grant_words[i + 1..]));
            }
        }
        Some("REVOKE") => {
            if let Some(i) = grant_upper.iter().rposition(|w| w == "FROM") {
                found.extend(list(&grant_words[i + 1..]));
            }
        }
        _ => {}
    }
    if let Some(i) = upper.iter().position(|w| w == "GRANTED") {
        if upper.get(i + 1).is_some_and(|w| w == "BY") {
            found.extend(list(&words[i + 2..]));
        }
    }
    if starts(&["CREATE", "POLICY"]) {
        if let Some(i) = at("TO") {
            found.extend(list(&words[i + 1..]));
        }
    }
    found.into_iter().map(|r| unquote(&r)).collect()
}

/// A comma-separated list of names at the start of `words`.
fn list(words: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut expect_name = true;
    for w in words {
        match (expect_name, w.as_str()) {
            (true, ",") | (false, ";") => break,
            (true, _) => {
                if w.eq_ignore_ascii_case("GROUP") {
                    continue;
                }
                out.push(w.clone());
                expect_name = false;
            }
            (false, ",") => expect_name = true,
            (false, _) => break,
        }
    }
    out
}

/// Splits SQL into words: quoted identifiers and string literals whole,
/// parenthesised groups whole, `,` and `;` on their own.
pub fn tokens(sql: &str) -> Vec<String> {
    let chars: Vec<char> = sql.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '-' && chars.get(i + 1) == Some(&'-') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && chars.get(i + 1) == Some(&'*') {
            // PostgreSQL's block comments nest.
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == ',' || c == ';' {
            out.push(c.to_string());
            i += 1;
        } else if c == '"' || c == '\'' {
            let start = i;
            i += 1;
            while i < chars.len() {
                if chars[i] == c {
                    if chars.get(i + 1) == Some(&c) {
                        i += 2;
                        continue;
                    }
                    break;
                }
                i += 1;
            }
            i = (i + 1).min(chars.len());
            out.push(chars[start..i].iter().collect());
        } else if c == '(' {
            let start = i;
            let mut depth = 0;
            let mut quote: Option<char> = None;
            while i < chars.len() {
                match (quote, chars[i]) {
                    (Some(q), ch) if ch == q => quote = None,
                    (Some(_), _) => {}
                    (None, '"') | (None, '\'') => quote = Some(chars[i]),
                    (None, '(') => depth += 1,
                    (None, ')') => {
                        depth -= 1;
                        if depth == 0 {
                            i += 1;
                            break;
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
        } else {
            let start = i;
            while i < chars.len()
                && !chars[i].is_whitespace()
                && !matches!(chars[i], ',' | ';' | '(' | '"' | '\'')
            {
                i += 1;
            }
            // `schema."name"` stays one word.
            while i < chars.len() && chars[i] == '"' && chars[i - 1] == '.' {
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    i += 1;
                }
                i = (i + 1).min(chars.len());
            }
            out.push(chars[start..i].iter().collect());
        }
    }
    out
}

/// An identifier as PostgreSQL reads it: quotes removed, or folded to lower case.
pub fn unquote(word: &str) -> String {
    match word.strip_prefix('"').and_then(|w| w.strip_suffix('"')) {
        Some(inner) => inner.replace("\"\"", "\""),
        None => word.to_ascii_lowercase(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_come_from_owners_grants_policies_and_default_privileges() {
        let ddl = r#"
ALTER TABLE app.orders OWNER TO app_owner;
ALTER LARGE OBJECT 16400 OWNER TO "Blob Keeper";
GRANT SELECT,INSERT ON TABLE app.orders TO app_rw WITH GRANT OPTION;
GRANT SELECT ON TABLE app.orders TO PUBLIC;
GRANT SELECT ON TABLE app.orders TO reporting, "Audit ""Team""";
REVOKE ALL ON SCHEMA app FROM old_role;
GRANT USAGE ON SCHEMA app TO pg_read_all_data;
ALTER DEFAULT PRIVILEGES FOR ROLE app_owner IN SCHEMA app GRANT SELECT ON TABLES TO app_ro;
CREATE POLICY tenant_rows ON app.orders FOR SELECT TO app_rw, app_ro USING ((tenant = current_setting('app.tenant'::text)::integer));
CREATE POLICY "p TO x" ON app.items USING (true);
COMMENT ON TABLE app.orders IS 'GRANT ALL TO nobody';
CREATE FUNCTION app.f() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
GRANT ALL ON TABLE app.orders TO from_a_body;
-- CREATE EXTENSION IF NOT EXISTS dblink WITH SCHEMA app;
END $$;
\restrict abc
"#;
        let found: Vec<String> = roles(&statements(ddl).unwrap()).into_iter().collect();
        assert_eq!(
            schemas(&statements("CREATE SCHEMA app;\nCREATE SCHEMA \"Odd One\";\n").unwrap()),
            ["app", "Odd One"]
        );
        assert_eq!(
            found,
            ["Audit \"Team\"", "Blob Keeper", "app_owner", "app_ro", "app_rw", "old_role", "reporting"]
        );
    }

    #[test]
    fn extensions_and_their_schemas() {
        let ddl = "CREATE EXTENSION IF NOT EXISTS postgis WITH SCHEMA public;\n\
                   CREATE EXTENSION IF NOT EXISTS \"uuid-ossp\" WITH SCHEMA extensions;\n\
                   COMMENT ON EXTENSION postgis IS 'x';\n\
                   CREATE FUNCTION f() RETURNS void LANGUAGE sql AS $$\n\
                   CREATE EXTENSION IF NOT EXISTS dblink WITH SCHEMA public;\n$$;\n";
        assert_eq!(
            extensions(&statements(ddl).unwrap()),
            [
                DumpedExtension { name: "postgis".into(), schema: "public".into() },
                DumpedExtension { name: "uuid-ossp".into(), schema: "extensions".into() },
            ]
        );
    }

    #[test]
    fn ownerships_of_the_kinds_carried() {
        let ddl = "ALTER TABLE app.orders OWNER TO app_owner;\n\
                   ALTER FUNCTION app.touch(integer, text) OWNER TO \"App Owner\";\n\
                   ALTER TABLE \"my schema\".\"odd name\" OWNER TO app_owner;\n\
                   ALTER LARGE OBJECT 16400 OWNER TO app_owner;\n\
                   ALTER OPERATOR app.=== (integer, integer) OWNER TO app_owner;\n\
                   CREATE FUNCTION g() RETURNS void LANGUAGE sql AS $$ ALTER TABLE x OWNER TO y $$;\n";
        let (found, others) = ownerships(&statements(ddl).unwrap());
        let got: Vec<(&str, &str, &str)> =
            found.iter().map(|o| (o.kind.as_str(), o.identity.as_str(), o.owner.as_str())).collect();
        assert_eq!(
            got,
            [
                ("TABLE", "app.orders", "app_owner"),
                ("FUNCTION", "app.touch(integer, text)", "App Owner"),
                ("TABLE", "\"my schema\".\"odd name\"", "app_owner"),
                ("LARGE OBJECT", "16400", "app_owner"),
            ]
        );
        assert_eq!(others, 1);
    }

    #[test]
    fn toc_lines_are_split_into_kind_and_tag() {
        let toc = parse_toc(
            ";\n; Archive created at 2026-12-01\n5; 2615 16385 SCHEMA - app app_owner\n\
             3456; 0 16390 TABLE DATA app orders app_owner\n2; 3079 16400 EXTENSION - postgis \n\
             7; 0 0 COMMENT - EXTENSION postgis \n9; 3466 16500 EVENT TRIGGER - audit_ddl app_owner\n\
             11; 0 0 TABLE ATTACH app orders_2025 app_owner\n",
        );
        let kinds: Vec<&str> = toc.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, ["SCHEMA", "TABLE DATA", "EXTENSION", "COMMENT", "EVENT TRIGGER", "TABLE ATTACH"]);
        assert_eq!(toc[1].tag, "app orders app_owner");
        assert_eq!(toc[3].tag, "- EXTENSION postgis");
        assert_eq!(toc[4].id, 9);
        assert_eq!(repeated_id(&toc), None);
        let forged = parse_toc(
            "9; 3466 16500 EVENT TRIGGER - audit_ddl app_owner\n9; 1259 16390 TABLE app t app_owner\n",
        );
        assert_eq!(repeated_id(&forged), Some(9));
    }
}
