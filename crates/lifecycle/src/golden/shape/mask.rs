//! Masking in the staging database: which columns each rule reaches (and the
//! columns that reference them), one map of source to masked values per
//! transformer, shared by every column it masks so the same value masks
//! alike everywhere, then one update per table, run as the owner role.
//!
//! The maps are filled by the daemon ([`airlock_mask`]): the key never
//! enters a session of the staging server. A value that would collide, in a
//! column whose values must stay distinct (a unique key, either end of a
//! reference), or that would come out as itself, is drawn again.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use futures_util::{SinkExt, TryStreamExt};

use super::keys::Keys;
use super::tables::{failed, without_values_strict, Leaf};
use airlock_core::dsn::OWNER_ROLE;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::records::masking::{MaskRules, MaskedColumn};
use airlock_mask::{ColumnType, Key, Output, Transformer};
use airlock_postgres::admin::Admin;
use airlock_postgres::catalog::quote_ident;

/// A masked column of one table that holds rows.
#[derive(Debug, Clone)]
pub struct Planned {
    /// Index of its table in the leaves.
    pub leaf: usize,
    /// Its name, unquoted.
    pub column: String,
    /// `schema.table.column` as rules name it.
    pub named: String,
    /// `rule` or `follows schema.table.column`.
    pub because: String,
    /// Index of its domain.
    pub domain: usize,
}

/// Every column one transformer masks, on one kind of type: one map.
#[derive(Debug, Clone)]
pub struct Domain {
    /// The transformer.
    pub transformer: Transformer,
    /// The columns' type, merged: the shortest limit, and case folded if any is `citext`.
    pub ty: ColumnType,
    /// Whether its values must stay distinct.
    pub keyed: bool,
    /// For a built-in type that prints values its own way (`jsonb`, `inet`,
    /// dates, numbers), that type: masked values are written as it prints them.
    pub normal_form: Option<String>,
}

impl Domain {
    /// Its map's name.
    pub fn map(index: usize) -> String {
        format!("airlock_mask.m{index}")
    }
}

/// What masking will do.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// The masked columns.
    pub columns: Vec<Planned>,
    /// Their domains.
    pub domains: Vec<Domain>,
}

fn invalid(message: String, hint: &str) -> Error {
    Error::new(ErrorCode::MaskInvalid, message, hint)
}

/// `*` in a pattern is any run of characters.
pub(crate) fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let mut rest = text;
    for (i, part) in parts.iter().enumerate() {
        if i == 0 {
            let Some(r) = rest.strip_prefix(part) else { return false };
            rest = r;
        } else if i == parts.len() - 1 {
            return rest.ends_with(part);
        } else {
            let Some(at) = rest.find(part) else { return false };
            rest = &rest[at + part.len()..];
        }
    }
    true
}

/// `schema.table.column` split in three.
pub(crate) fn three_parts(text: &str) -> Option<[String; 3]> {
    let parts: Vec<&str> = text.split('.').collect();
    match parts[..] {
        [s, t, c] if !s.is_empty() && !t.is_empty() && !c.is_empty() => Some([s.into(), t.into(), c.into()]),
        _ => None,
    }
}

/// Checks the rules against the tables and keys and says which columns each masks.
pub fn plan(rules: &MaskRules, leaves: &[Leaf], keys: &Keys) -> Result<Plan> {
    let hint = "fix the rule in the rules file and build again (`docs/MASKING.md` lists the transformers)";
    let mut compiled = Vec::new();
    for (i, rule) in rules.columns.iter().enumerate() {
        let parts = three_parts(&rule.column).ok_or_else(|| {
            invalid(format!("rule {} names {:?}, not `schema.table.column`", i + 1, rule.column), hint)
        })?;
        let t = Transformer::compile(&rule.spec)
            .map_err(|e| invalid(format!("rule {} ({}): {e}", i + 1, rule.column), hint))?;
        compiled.push((parts, t, 0usize));
    }
    // Which rule masks each column, by the name rules use.
    let mut masked: BTreeMap<(String, String), (Transformer, String)> = BTreeMap::new();
    let mut columns_of: BTreeMap<String, Vec<&super::tables::Column>> = BTreeMap::new();
    for leaf in leaves {
        let entry = columns_of.entry(leaf.named.clone()).or_default();
        if entry.is_empty() {
            entry.extend(leaf.columns.iter());
        }
    }
    for (table, columns) in &columns_of {
        let (schema, name) = table.split_once('.').unwrap_or(("", table));
        for column in columns {
            let found = compiled
                .iter_mut()
                .find(|(p, _, _)| glob(&p[0], schema) && glob(&p[1], name) && glob(&p[2], &column.name));
            if let Some((parts, t, hits)) = found {
                if column.generated && parts.iter().any(|p| p.contains('*')) {
                    continue; // a pattern passes by what is computed from others
                }
                *hits += 1;
                if column.generated {
                    return Err(invalid(
                        format!(
                            "{table}.{} is generated from other columns, so it cannot be masked itself",
                            column.name
                        ),
                        "mask the columns it is computed from: it is computed again from their masked values",
                    ));
                }
                masked.insert((table.clone(), column.name.clone()), (t.clone(), "rule".into()));
            }
        }
    }
    for ((parts, _, hits), rule) in compiled.iter().zip(&rules.columns) {
        if *hits == 0 && !parts.iter().any(|p| p.contains('*')) {
            return Err(invalid(
                format!("rule for {} matches no column of the source", rule.column),
                "check the schema, table and column names (unquoted, as the catalog has them), or use a pattern",
            ));
        }
    }
    // A column that references a masked column (or is referenced by one) is
    // masked alike, so joins still find their rows.
    loop {
        let mut added = false;
        for link in &keys.links {
            for (a, b) in link.from.columns.iter().zip(&link.to.columns) {
                let ends = [(link.from.table.clone(), a.clone()), (link.to.table.clone(), b.clone())];
                let present = |end: &(String, String)| {
                    columns_of.get(&end.0).is_some_and(|cols| cols.iter().any(|c| c.name == end.1))
                };
                if !present(&ends[0]) || !present(&ends[1]) {
                    continue;
                }
                match (masked.get(&ends[0]).cloned(), masked.get(&ends[1]).cloned()) {
                    (Some((t, _)), None) => {
                        masked.insert(ends[1].clone(), (t, format!("follows {}.{}", ends[0].0, ends[0].1)));
                        added = true;
                    }
                    (None, Some((t, _))) => {
                        masked.insert(ends[0].clone(), (t, format!("follows {}.{}", ends[1].0, ends[1].1)));
                        added = true;
                    }
                    (Some((x, _)), Some((y, _))) if x != y => {
                        return Err(invalid(
                            format!(
                                "{}.{} references {}.{}, and they are masked differently ({} and {}): their joins would break",
                                ends[0].0, ends[0].1, ends[1].0, ends[1].1, x.describe(), y.describe()
                            ),
                            "give both columns the same rule (or a rule for one only: the other follows it)",
                        ))
                    }
                    _ => {}
                }
            }
        }
        if !added {
            break;
        }
    }
    let mut plan = Plan::default();
    let mut domain_of: BTreeMap<String, usize> = BTreeMap::new();
    for (leaf_index, leaf) in leaves.iter().enumerate() {
        for column in &leaf.columns {
            let Some((t, because)) = masked.get(&(leaf.named.clone(), column.name.clone())) else { continue };
            let named = format!("{}.{}", leaf.named, column.name);
            t.fits(&column.ty, column.nullable).map_err(|e| invalid(format!("{named}: {e}"), hint))?;
            let keyed = keys.keyed(&leaf.named, &column.name);
            if keyed && !t.keeps_distinct() {
                return Err(invalid(
                    format!(
                        "{named} is in a unique key or a reference, and {} cannot keep its values distinct",
                        t.describe()
                    ),
                    "use a fake (email, name, phone, address, ip, uuid) or hash for it",
                ));
            }
            let normal_form = match &column.ty {
                ColumnType::Text { .. } | ColumnType::Other(_) => None,
                _ => Some(column.type_sql.clone()),
            };
            // citext compares without case, text with it: never one map for both.
            let kind = match (&normal_form, &column.ty) {
                (Some(ty), _) => ty.clone(),
                (None, ColumnType::Text { fold_case, .. }) => format!("text fold_case={fold_case}"),
                (None, other) => format!("{other:?}"),
            };
            let id = format!("{}|{kind}", t.describe());
            let index = *domain_of.entry(id).or_insert_with(|| {
                plan.domains.push(Domain {
                    transformer: t.clone(),
                    ty: column.ty.clone(),
                    keyed: false,
                    normal_form: normal_form.clone(),
                });
                plan.domains.len() - 1
            });
            let d = &mut plan.domains[index];
            d.keyed |= keyed;
            if let (ColumnType::Text { max_chars, .. }, ColumnType::Text { max_chars: theirs, .. }) =
                (&mut d.ty, &column.ty)
            {
                *max_chars = match (*max_chars, theirs) {
                    (Some(a), Some(b)) => Some(a.min(*b)),
                    (a, b) => a.or(*b),
                };
            }
            plan.columns.push(Planned {
                leaf: leaf_index,
                column: column.name.clone(),
                named,
                because: because.clone(),
                domain: index,
            });
        }
    }
    Ok(plan)
}

/// One map row: a source value, its masked value (`None`: NULL), and whether
/// it was kept as it was (nothing in it to hide).
struct Mapped {
    src: String,
    dst: Option<String>,
    kept: bool,
}

/// Fills each domain's map and masks every planned column. Returns each
/// column's part of the report (its leak count is the leak check's).
pub async fn apply(
    plan: &Plan,
    leaves: &[Leaf],
    admin: &Admin,
    owner: &Admin,
    key: &Key,
) -> Result<Vec<MaskedColumn>> {
    let mut report: Vec<MaskedColumn> = plan
        .columns
        .iter()
        .map(|p| MaskedColumn {
            column: p.named.clone(),
            transform: plan.domains[p.domain].transformer.describe(),
            because: p.because.clone(),
            ..Default::default()
        })
        .collect();
    // The values a `json` rule replaces inside documents, for the leak check.
    admin
        .execute(&format!(
            "CREATE UNLOGGED TABLE airlock_mask.inner (v text NOT NULL); GRANT SELECT ON airlock_mask.inner TO {OWNER_ROLE};"
        ))
        .await?;
    for (index, domain) in plan.domains.iter().enumerate() {
        let map = Domain::map(index);
        admin
            .execute(&format!(
                // Hash indexes: a value of any length (a long note, a JSON
                // document) is looked up by its hash, past btree's size limit.
                "CREATE UNLOGGED TABLE {map} (src text NOT NULL, dst text, kept boolean NOT NULL DEFAULT false);
                 CREATE INDEX ON {map} USING hash (src);
                 GRANT SELECT, INSERT ON {map} TO {OWNER_ROLE};"
            ))
            .await?;
        let members: Vec<(usize, &Planned)> =
            plan.columns.iter().enumerate().filter(|(_, p)| p.domain == index).collect();
        let mut values = BTreeSet::new();
        for (i, p) in &members {
            let leaf = &leaves[p.leaf];
            let col = quote_ident(&p.column);
            let sql = format!("SELECT DISTINCT {col}::text FROM ONLY {} WHERE {col} IS NOT NULL", leaf.sql);
            // Read by the owner role: the cast to text may be one the dump defined.
            let rows = owner.client().query_raw(&sql, std::iter::empty::<&str>()).await.map_err(failed)?;
            futures_util::pin_mut!(rows);
            let mut n = 0u64;
            while let Some(row) = rows.try_next().await.map_err(failed)? {
                let v: String = row.try_get(0).map_err(|e| Error::postgres(e.to_string()))?;
                values.insert(v);
                n += 1;
            }
            report[*i].distinct_values = n;
        }
        if let Transformer::Sql(expression) = &domain.transformer {
            // The rules file's own SQL runs as the owner role, never a superuser, and sees no key.
            for (_, p) in &members {
                let col = quote_ident(&p.column);
                let sql = format!(
                    "INSERT INTO {map} (src, dst)
                     SELECT value::text, ({expression})::text
                       FROM (SELECT DISTINCT ON ({col}::text) {col} AS value FROM ONLY {} WHERE {col} IS NOT NULL) AS s
                      WHERE NOT EXISTS (SELECT 1 FROM {map} m WHERE m.src = s.value::text)",
                    leaves[p.leaf].sql
                );
                owner.client().batch_execute(&sql).await.map_err(|e| {
                    invalid(
                        format!("the sql rule for {} failed: {}", p.named, without_values_strict(&e)),
                        "fix the expression (it is an expression of `value`, the column's value) and build again",
                    )
                })?;
            }
        } else {
            let inner: BTreeSet<String> =
                values.iter().flat_map(|v| domain.transformer.inner_values(v)).collect();
            if !inner.is_empty() {
                copy_rows(admin, "airlock_mask.inner (v)", inner.iter().map(|v| escape(v) + "\n")).await?;
            }
            let (rows, collisions) = masked_values(domain, key, values, &members[0].1.named)?;
            for (i, _) in &members {
                report[*i].collisions_resolved = collisions;
            }
            write_map(admin, &map, rows).await?;
        }
        if let Some(ty) = &domain.normal_form {
            // The value as the column will print it (jsonb's spacing, inet's
            // prefix): what the leak check compares with. Built-in types only.
            admin
                .execute(&format!(
                    "UPDATE {map} SET dst = (dst::{ty})::text WHERE dst IS NOT NULL AND NOT kept"
                ))
                .await?;
        }
        admin.execute(&format!("CREATE INDEX ON {map} USING hash (dst); ANALYZE {map};")).await?;
    }
    tracing::info!(domains = plan.domains.len(), "masking maps written; updating the tables");
    // One update per table, as the owner role: the table's checks run as
    // they would for the application, and no code of the dump runs as a superuser.
    let mut by_leaf: BTreeMap<usize, Vec<&Planned>> = BTreeMap::new();
    for p in &plan.columns {
        by_leaf.entry(p.leaf).or_default().push(p);
    }
    for (leaf, planned) in by_leaf {
        let leaf = &leaves[leaf];
        let mut sets = Vec::new();
        let mut any = Vec::new();
        for p in &planned {
            let col = quote_ident(&p.column);
            let ty =
                &leaf.columns.iter().find(|c| c.name == p.column).expect("planned from the leaf").type_sql;
            sets.push(format!(
                "{col} = (SELECT m.dst FROM {} m WHERE m.src = t.{col}::text)::{ty}",
                Domain::map(p.domain)
            ));
            any.push(format!("t.{col} IS NOT NULL"));
        }
        let sql = format!("UPDATE ONLY {} AS t SET {} WHERE {}", leaf.sql, sets.join(", "), any.join(" OR "));
        owner.client().batch_execute(&sql).await.map_err(|e| {
            Error::new(
                ErrorCode::MaskInvalid,
                format!("masking {} failed: {}", leaf.named, without_values_strict(&e)),
                "a masked value broke one of the table's checks: give the column a transformer whose values the \
                 check takes (a constant, or an sql expression), and build again",
            )
        })?;
    }
    Ok(report)
}

/// The masked value of each source value of a domain, drawn in an order
/// set by the key (so which of two colliding values is drawn again does not
/// depend on where they were read); and how many were drawn again.
fn masked_values(
    domain: &Domain,
    key: &Key,
    values: BTreeSet<String>,
    first: &str,
) -> Result<(Vec<Mapped>, u64)> {
    let t = &domain.transformer;
    let fold = matches!(domain.ty, ColumnType::Text { fold_case: true, .. });
    let norm = |s: &str| if fold { s.to_lowercase() } else { s.to_owned() };
    let mut order: Vec<([u8; 32], String)> =
        values.into_iter().map(|v| (key.digest("order", &v, 0), v)).collect();
    order.sort();
    // Masked value (normalised) -> the source value (normalised) it stands for.
    let mut used: HashMap<String, String> = HashMap::new();
    let mut out = Vec::with_capacity(order.len());
    let mut collisions = 0;
    for (_, v) in order {
        let mut same_before = false;
        let mut done = None;
        for salt in 0..64u32 {
            let Some(o) = t.apply(key, &v, salt, &domain.ty) else { break };
            match o {
                Output::Unchanged => {
                    done = Some(Mapped { src: v.clone(), dst: Some(v.clone()), kept: true });
                    break;
                }
                Output::Null => {
                    done = Some(Mapped { src: v.clone(), dst: None, kept: false });
                    break;
                }
                Output::Value(m) => {
                    let same = norm(&m) == norm(&v);
                    if same && t.from_value() {
                        if same_before {
                            // Drawing again changes nothing: nothing in it to mask ("n/a", "---").
                            done = Some(Mapped { src: v.clone(), dst: Some(v.clone()), kept: true });
                            break;
                        }
                        same_before = true;
                        collisions += 1;
                        continue;
                    }
                    if domain.keyed {
                        match used.get(&norm(&m)) {
                            Some(owner) if *owner != norm(&v) => {
                                collisions += 1;
                                continue;
                            }
                            _ => {
                                used.insert(norm(&m), norm(&v));
                            }
                        }
                    }
                    done = Some(Mapped { src: v.clone(), dst: Some(m), kept: false });
                    break;
                }
            }
        }
        match done {
            Some(m) => out.push(m),
            None => {
                return Err(invalid(
                    format!(
                        "{first}: {} cannot keep the column's values distinct (64 draws collided): its values are too \
                         many for the format, or the column's length limit too short",
                        t.describe()
                    ),
                    "use hash, or uuid, which have room for more distinct values",
                ))
            }
        }
    }
    Ok((out, collisions))
}

/// A value in `COPY`'s text format.
fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '\t' => o.push_str("\\t"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            c => o.push(c),
        }
    }
    o
}

/// Writes a map with `COPY`: no value is ever part of a statement's text.
async fn write_map(admin: &Admin, map: &str, rows: Vec<Mapped>) -> Result<()> {
    let lines = rows.into_iter().map(|r| {
        let dst = r.dst.as_deref().map_or_else(|| "\\N".to_owned(), escape);
        format!("{}\t{dst}\t{}\n", escape(&r.src), if r.kept { "t" } else { "f" })
    });
    copy_rows(admin, &format!("{map} (src, dst, kept)"), lines).await
}

/// `COPY target FROM STDIN` of `lines` (each a whole row in text format), a megabyte at a time.
async fn copy_rows(admin: &Admin, target: &str, lines: impl Iterator<Item = String>) -> Result<()> {
    let sink = admin
        .client()
        .copy_in::<_, bytes::Bytes>(&format!("COPY {target} FROM STDIN"))
        .await
        .map_err(failed)?;
    futures_util::pin_mut!(sink);
    let mut chunk = String::new();
    for line in lines {
        chunk.push_str(&line);
        if chunk.len() > 1 << 20 {
            sink.send(bytes::Bytes::from(std::mem::take(&mut chunk))).await.map_err(failed)?;
        }
    }
    if !chunk.is_empty() {
        sink.send(bytes::Bytes::from(chunk)).await.map_err(failed)?;
    }
    sink.finish().await.map_err(failed)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_parts() {
        assert!(glob("*", "anything"));
        assert!(glob("phone*", "phone_number") && !glob("phone*", "mobile"));
        assert!(glob("*email", "contact_email") && glob("a*c", "abc") && !glob("a*c", "abd"));
        assert!(three_parts("public.people.email").is_some() && three_parts("people.email").is_none());
    }

    #[test]
    fn keyed_values_stay_distinct_and_never_themselves() {
        let key = Key::random();
        let domain = Domain {
            transformer: Transformer::Name,
            ty: ColumnType::Text { max_chars: None, fold_case: false },
            keyed: true,
            normal_form: None,
        };
        let values: BTreeSet<String> = (0..3000).map(|i| format!("Person {i}")).collect();
        let (rows, collisions) = masked_values(&domain, &key, values, "t.c").unwrap();
        let distinct: BTreeSet<&Option<String>> = rows.iter().map(|r| &r.dst).collect();
        assert_eq!(distinct.len(), 3000, "a small list of names still gives distinct values");
        assert!(collisions > 0);
        assert!(rows.iter().all(|r| r.dst.as_deref() != Some(r.src.as_str())));
        let ci = Domain {
            transformer: Transformer::Email,
            ty: ColumnType::Text { max_chars: None, fold_case: true },
            keyed: true,
            normal_form: None,
        };
        let values: BTreeSet<String> = ["A@x.io", "a@x.io"].iter().map(|s| s.to_string()).collect();
        let (rows, _) = masked_values(&ci, &key, values, "t.c").unwrap();
        assert_eq!(rows[0].dst, rows[1].dst, "values citext holds equal mask alike");
    }
}
