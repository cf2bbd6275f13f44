//! Reading a pg_dump archive without restoring it: its table of contents
//! (`pg_restore -l`), and the roles and extensions its DDL names.
//!
//! Roles are global objects a database dump does not carry, but its DDL names
//! every role it needs: owners (`OWNER TO`), grantees (`GRANT ... TO`,
//! `REVOKE ... FROM`), default privileges (`FOR ROLE`) and policy roles
//! (`CREATE POLICY ... TO`). pg_dump writes each of these on one line.

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

/// An extension a dump creates: its name and schema.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DumpedExtension {
    /// Its name.
    pub name: String,
    /// The schema it is created in.
    pub schema: String,
}

/// The extensions in a dump's DDL (`CREATE EXTENSION IF NOT EXISTS x WITH SCHEMA s;`), in order.
pub fn extensions(ddl: &str) -> Vec<DumpedExtension> {
    let mut out = Vec::new();
    for line in ddl.lines() {
        let Some(rest) = line.strip_prefix("CREATE EXTENSION IF NOT EXISTS ") else { continue };
        let tokens = tokens(rest);
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

/// Every role a dump's DDL names, except `PUBLIC` and the predefined `pg_*` roles.
pub fn roles(ddl: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in ddl.lines() {
        for role in roles_in_line(line) {
            if !role.eq_ignore_ascii_case("public") && !role.starts_with("pg_") && !role.is_empty() {
                out.insert(role);
            }
        }
    }
    out
}

fn roles_in_line(line: &str) -> Vec<String> {
    let mut words = tokens(line);
    while words.last().is_some_and(|w| w == ";") {
        words.pop();
    }
    let upper: Vec<String> = words.iter().map(|w| w.to_ascii_uppercase()).collect();
    let at = |kw: &str| upper.iter().position(|w| w == kw);
    let mut found = Vec::new();
    let starts = |prefix: &[&str]| upper.len() >= prefix.len() && upper.iter().zip(prefix).all(|(a, b)| a == b);
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
            while i < chars.len() && !chars[i].is_whitespace() && !matches!(chars[i], ',' | ';' | '(' | '"' | '\'') {
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
"#;
        let found: Vec<String> = roles(ddl).into_iter().collect();
        assert_eq!(
            found,
            ["Audit \"Team\"", "Blob Keeper", "app_owner", "app_ro", "app_rw", "old_role", "reporting"]
        );
    }

    #[test]
    fn extensions_and_their_schemas() {
        let ddl = "CREATE EXTENSION IF NOT EXISTS postgis WITH SCHEMA public;\n\
                   CREATE EXTENSION IF NOT EXISTS \"uuid-ossp\" WITH SCHEMA extensions;\n\
                   COMMENT ON EXTENSION postgis IS 'x';\n";
        assert_eq!(
            extensions(ddl),
            [
                DumpedExtension { name: "postgis".into(), schema: "public".into() },
                DumpedExtension { name: "uuid-ossp".into(), schema: "extensions".into() },
            ]
        );
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
        let forged = parse_toc("9; 3466 16500 EVENT TRIGGER - audit_ddl app_owner\n9; 1259 16390 TABLE app t app_owner\n");
        assert_eq!(repeated_id(&forged), Some(9));
    }
}
