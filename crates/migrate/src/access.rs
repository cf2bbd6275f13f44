//! What a candidate opens up or switches off on the golden's tables: row
//! security turned off, a restrictive policy dropped, privileges granted
//! (`access_widened`), privileges revoked or row security turned on
//! (`access_narrowed`), a trigger dropped or disabled (`trigger_removed`),
//! and one added (`trigger_added`).
//!
//! Read from the catalog's entries before and after (`Catalog::objects`:
//! each table's properties with its grants and row-security switches, each
//! policy, each trigger's state), so whatever statement did it, in whatever
//! spelling or function body, the result is what is judged.

use std::collections::BTreeMap;

use super::evidence::{Evidence, Verdict};
use super::lines::line_naming;
use super::report::{Hazard, Severity};
use airlock_postgres::catalog::objects::Entry;
use airlock_postgres::catalog::short_name;

/// The hazards of what the candidate opened up or switched off.
pub(crate) fn access_hazards(e: &Evidence, v: &mut Verdict) {
    let (Some(before), Some(after)) = (e.before.objects.as_ref(), e.after.objects.as_ref()) else { return };
    row_security(e, before, after, v);
    grants(e, before, after, v);
    grants_lost(e, before, after, v);
    default_privileges(e, before, after, v);
    views_over_row_security(e, before, after, v);
    views_over_unreadable(e, before, after, v);
    definer_functions(e, after, v);
    triggers(e, before, after, v);
}

/// Grantees of an entry other than its owner (`owner X` in its definition).
fn others_granted(entry: &Entry) -> Vec<String> {
    let owner = owner(entry);
    granted(entry).into_keys().filter(|g| g != owner).collect()
}

/// `ALTER DEFAULT PRIVILEGES` that grants more on objects made later.
fn default_privileges(
    e: &Evidence,
    before: &BTreeMap<String, Entry>,
    after: &BTreeMap<String, Entry>,
    v: &mut Verdict,
) {
    for (key, now) in after.iter().filter(|(k, _)| k.starts_with("default privileges")) {
        let acl = |entry: Option<&Entry>| -> BTreeMap<String, String> {
            let Some(entry) = entry else { return BTreeMap::new() };
            let list = entry.definition.trim_matches(|c| c == '{' || c == '}');
            granted(&Entry { definition: format!("grants {list}"), property: true })
        };
        let (was, is) = (acl(before.get(key)), acl(Some(now)));
        // The role's own privileges on what it makes are written out too.
        let owner =
            key.rsplit("belonging to role ").next().unwrap_or_default().split(' ').next().unwrap_or_default();
        for (grantee, gained) in gains(&was, &is).into_iter().filter(|(g, _)| g.as_str() != owner) {
            let public = grantee == "PUBLIC";
            v.hazards.push(Hazard::new(
                "access_widened",
                if public { Severity::High } else { Severity::Medium },
                format!(
                    "{key} now grant {} to {grantee}: every such object made from now on is open to it",
                    gained.join(", ")
                ),
                line_naming(e, "default"),
            ));
        }
    }
}

/// A view or materialized view the candidate made (or redefined) over a
/// golden table whose rows row security limits, readable by roles other
/// than its owner: a view reads its tables as its owner, so they see every
/// row, unless it is `security_invoker`.
fn views_over_row_security(
    e: &Evidence,
    before: &BTreeMap<String, Entry>,
    after: &BTreeMap<String, Entry>,
    v: &mut Verdict,
) {
    let guarded: Vec<&String> = e
        .before
        .tables
        .keys()
        .filter(|t| table_properties(before, t).is_some_and(|p| has(p, "row security on")))
        .collect();
    if guarded.is_empty() {
        return;
    }
    for (view, definition) in e.after.views.iter().filter(|(name, d)| e.before.views.get(*name) != Some(*d)) {
        let over: Vec<&&String> = guarded.iter().filter(|t| reads_table(definition, t)).collect();
        if over.is_empty() {
            continue;
        }
        let Some(properties) = view_properties(after, view) else { continue };
        let readers = others_granted(properties);
        if invoker(properties) || readers.is_empty() {
            continue;
        }
        let tables: Vec<&str> = over.iter().map(|t| t.as_str()).collect();
        let mut h = Hazard::new(
            "access_widened",
            Severity::High,
            format!(
                "view {view} reads {} with its owner's rights, not its readers' (row security applies as to its owner, not at all if it owns the table), and {} may read it",
                tables.join(", "),
                readers.join(", ")
            ),
            line_naming(e, short_name(view)),
        );
        h.suggestion = Some(format!(
            "CREATE VIEW {view} WITH (security_invoker = true) AS ..., so its readers' policies apply"
        ));
        v.hazards.push(h);
    }
}

/// The properties entry of table `table` in `entries` (under its
/// qualified name or, as the catalog may write it, its short one).
fn table_properties<'a>(entries: &'a BTreeMap<String, Entry>, table: &str) -> Option<&'a Entry> {
    [table, short_name(table)].into_iter().find_map(|n| entries.get(&format!("properties of table {n}")))
}

/// The properties entry of view `view` (or materialized view) in `entries`.
fn view_properties<'a>(entries: &'a BTreeMap<String, Entry>, view: &str) -> Option<&'a Entry> {
    ["view", "materialized view"]
        .into_iter()
        .flat_map(|kind| [view, short_name(view)].map(|n| format!("properties of {kind} {n}")))
        .find_map(|key| entries.get(&key))
}

/// Whether a view's properties say it runs as its reader (`security_invoker`).
fn invoker(properties: &Entry) -> bool {
    properties.definition.contains("security_invoker=true")
        || properties.definition.contains("security_invoker=on")
}

/// Whether a view's definition reads table `table` (by its name as a word,
/// or qualified).
fn reads_table(definition: &str, table: &str) -> bool {
    let (schema, name) = airlock_postgres::catalog::split_qualified(table);
    super::lines::names_word(&definition.to_ascii_lowercase(), &name.to_ascii_lowercase())
        || definition.contains(&format!("{schema}.{name}"))
}

/// Views new or redefined (not `security_invoker`) that roles may read
/// although they could not read a golden table the view reads: the view
/// reads it with its owner's rights, so they now see what it shows of it.
/// Tables under row security are [`views_over_row_security`]'s.
fn views_over_unreadable(
    e: &Evidence,
    before: &BTreeMap<String, Entry>,
    after: &BTreeMap<String, Entry>,
    v: &mut Verdict,
) {
    let changed: Vec<(&String, &String)> =
        e.after.views.iter().filter(|(name, d)| e.before.views.get(*name) != Some(*d)).collect();
    if changed.is_empty() {
        return;
    }
    // Golden tables and who could read them (PUBLIC for everyone).
    let readable: Vec<(&String, Vec<String>)> = e
        .before
        .tables
        .keys()
        .filter_map(|t| {
            let p = table_properties(before, t)?;
            if has(p, "row security on") {
                return None;
            }
            let readers =
                granted(p).into_iter().filter(|(_, privileges)| privileges.contains('r')).map(|(g, _)| g);
            Some((t, readers.chain([owner(p).to_owned()]).collect()))
        })
        .collect();
    for (view, definition) in changed {
        let Some(properties) = view_properties(after, view).filter(|p| !invoker(p)) else { continue };
        // Readers who could read the view before (a view redefined) gain nothing new by its grant.
        let had = view_properties(before, view).map(others_granted).unwrap_or_default();
        let read: Vec<&(&String, Vec<String>)> =
            readable.iter().filter(|(t, _)| reads_table(definition, t)).collect();
        for reader in others_granted(properties).into_iter().filter(|r| !had.contains(r)) {
            let unreadable: Vec<&str> = read
                .iter()
                .filter(|(_, readers)| !readers.iter().any(|r| *r == reader || r == "PUBLIC"))
                .map(|(t, _)| t.as_str())
                .collect();
            if unreadable.is_empty() {
                continue;
            }
            let who = if reader == "PUBLIC" { "every role (PUBLIC)".to_owned() } else { reader.clone() };
            let mut h = Hazard::new(
                "access_widened",
                Severity::Medium,
                format!(
                    "view {view} reads {} with its owner's rights, and {who} may read the view though not {}: what the view shows of {} is open to {who}",
                    unreadable.join(", "),
                    if unreadable.len() == 1 { "that table" } else { "those tables" },
                    if unreadable.len() == 1 { "it" } else { "them" },
                ),
                line_naming(e, short_name(view)),
            );
            h.suggestion = Some(format!(
                "CREATE VIEW {view} WITH (security_invoker = true) AS ..., so its readers need the table's own grant, or grant the view only to roles that may read {}",
                unreadable.join(", ")
            ));
            v.hazards.push(h);
        }
    }
}

/// Functions the candidate made `SECURITY DEFINER` that roles other than
/// their owner may call (PUBLIC may, unless revoked): each runs with its
/// owner's privileges, row security's bypass included, for every caller.
fn definer_functions(e: &Evidence, after: &BTreeMap<String, Entry>, v: &mut Verdict) {
    for s in e.statements.iter().filter(|s| !s.rolled_back) {
        let sql = s.sql.to_ascii_lowercase();
        let flat = sql.split_whitespace().collect::<Vec<_>>().join(" ");
        if !flat.contains("security definer") || !flat.contains("function") {
            continue;
        }
        for (function, _) in e.after.functions.iter().filter(|(f, _)| !e.before.functions.contains_key(*f)) {
            let name = function.split('(').next().unwrap_or(function);
            let bare = name.rsplit('.').next().unwrap_or(name).to_ascii_lowercase();
            if !super::lines::names_word(&sql, &bare) {
                continue;
            }
            let properties = after.iter().find(|(k, _)| {
                k.strip_prefix("properties of function ")
                    .or_else(|| k.strip_prefix("properties of procedure "))
                    .is_some_and(|f| {
                        f.split('(').next().is_some_and(|n| {
                            n == name || n == short_name(name) || n.rsplit('.').next() == Some(bare.as_str())
                        })
                    })
            });
            let Some((_, properties)) = properties else { continue };
            let callers = others_granted(properties);
            if callers.is_empty() {
                continue;
            }
            let mut h = Hazard::new(
                "access_widened",
                if callers.iter().any(|c| c == "PUBLIC") { Severity::High } else { Severity::Medium },
                format!(
                    "function {function} is SECURITY DEFINER and {} may call it: it runs with its owner's privileges, past row security, for every caller",
                    callers.join(", ")
                ),
                Some(s.line).filter(|l| *l > 0),
            );
            h.suggestion = Some(format!(
                "REVOKE EXECUTE ON FUNCTION {function} FROM PUBLIC, and grant it to the role that needs it"
            ));
            v.hazards.push(h);
        }
    }
}

/// The table a `table NAME` object names, as the catalog keys it.
fn table_of<'a>(e: &'a Evidence, object: &str) -> Option<&'a String> {
    let name = object.strip_prefix("table ")?;
    e.before.tables.keys().find(|k| k.as_str() == name || short_name(k) == name)
}

/// Row security switched off, or no longer forced, on a golden table that is
/// still there; a restrictive policy dropped from one.
fn row_security(
    e: &Evidence,
    before: &BTreeMap<String, Entry>,
    after: &BTreeMap<String, Entry>,
    v: &mut Verdict,
) {
    for (key, was) in before {
        let Some(object) = key.strip_prefix("properties of table ") else { continue };
        let object = format!("table {object}");
        let Some(now) = after.get(key) else { continue };
        let Some(table) = table_of(e, &object) else { continue };
        let policies: Vec<&str> = before
            .keys()
            .filter_map(|k| k.strip_prefix("policy ")?.strip_suffix(&format!(" on {object}")))
            .collect();
        let line = line_naming(e, short_name(table));
        if has(was, "row security on") && !has(now, "row security on") {
            let mut h = Hazard::new(
                "access_widened",
                Severity::High,
                format!(
                    "turns row-level security off on {table}: its {} ({}) no longer limit what roles read or write, so every role granted the table sees all its {} rows",
                    if policies.len() == 1 { "policy" } else { "policies" },
                    if policies.is_empty() { "none yet".to_owned() } else { policies.join(", ") },
                    e.golden_rows(table)
                ),
                line,
            );
            h.suggestion = Some(format!(
                "keep ALTER TABLE {table} ENABLE ROW LEVEL SECURITY; change a policy instead of switching them all off"
            ));
            v.hazards.push(h);
        } else if has(was, "row security forced") && !has(now, "row security forced") {
            v.hazards.push(Hazard::new(
                "access_widened",
                Severity::Medium,
                format!("no longer forces row-level security on {table}: its owner now reads and writes every row, whatever its policies say"),
                line,
            ));
        }
        row_security_narrowed(e, (was, now), (after, &object, table), v);
        // A policy added where row security was off widens nothing: every
        // role granted the table read all of it before.
        let limited = has(was, "row security on") && has(now, "row security on");
        policies_changed(e, (before, after), (&object, table), &policies, limited, v);
    }
}

/// Row security switched on, or forced, on a golden table: roles now see only
/// the rows its permissive policies let them (none, where it has none), its
/// owner too once forced. Nothing changes for a superuser or a role with
/// BYPASSRLS.
fn row_security_narrowed(
    e: &Evidence,
    (was, now): (&Entry, &Entry),
    (after, object, table): (&BTreeMap<String, Entry>, &str, &String),
    v: &mut Verdict,
) {
    let on = !has(was, "row security on") && has(now, "row security on");
    let forced =
        has(now, "row security on") && !has(was, "row security forced") && has(now, "row security forced");
    if !(on || forced) || !e.has_rows(table) {
        return;
    }
    let permissive: Vec<&str> = after
        .iter()
        .filter(|(_, p)| p.definition.starts_with("permissive"))
        .filter_map(|(k, _)| k.strip_prefix("policy ")?.strip_suffix(&format!(" on {object}")))
        .collect();
    let who = match (on, forced) {
        (_, true) => "every role, its owner included,",
        _ => "every role but its owner",
    };
    let (severity, what) = match permissive.is_empty() {
        true => (
            Severity::High,
            format!(
                " with no permissive policy: {who} now reads none of its {} rows and writes none",
                e.golden_rows(table)
            ),
        ),
        false => (
            Severity::Medium,
            format!(
                ": {who} now reads and writes only the rows its permissive {} ({}) let it",
                if permissive.len() == 1 { "policy" } else { "policies" },
                permissive.join(", ")
            ),
        ),
    };
    let mut h = Hazard::new(
        "access_narrowed",
        severity,
        format!(
            "{} {table}{what} (superusers and BYPASSRLS roles aside)",
            if forced { "forces row-level security on" } else { "turns row-level security on for" }
        ),
        // The statement that switches it (its policies may come first).
        super::lines::line_naming_all(e, &[short_name(table), "security"])
            .or_else(|| line_naming(e, short_name(table))),
    );
    h.suggestion = Some(format!(
        "create the policies the application's roles need (CREATE POLICY ... ON {table}) in the same migration, before row-level security is turned on"
    ));
    v.hazards.push(h);
}

/// A golden table's policies changed: a restrictive one dropped or made
/// permissive (access widened), a permissive one added (widened), any one's
/// condition or roles changed (`policy_changed`: it may widen or narrow). A
/// policy renamed, or dropped and made again the same, is none of these.
fn policies_changed(
    e: &Evidence,
    (before, after): (&BTreeMap<String, Entry>, &BTreeMap<String, Entry>),
    (object, table): (&str, &String),
    policies: &[&str],
    row_security: bool,
    v: &mut Verdict,
) {
    let suffix = format!(" on {object}");
    let of = |entries: &BTreeMap<String, Entry>| -> BTreeMap<String, String> {
        entries
            .iter()
            .filter_map(|(k, p)| {
                Some((k.strip_prefix("policy ")?.strip_suffix(&suffix)?.to_owned(), p.definition.clone()))
            })
            .collect()
    };
    let (was, now) = (of(before), of(after));
    let line = |policy: &str| line_naming(e, policy).or_else(|| line_naming(e, "policy"));
    for policy in policies {
        let definition = &was[*policy];
        match now.get(*policy) {
            Some(d) if d == definition => {}
            Some(d) if definition.starts_with("restrictive") && d.starts_with("permissive") => {
                v.hazards.push(Hazard::new(
                    "access_widened",
                    Severity::High,
                    format!("makes restrictive policy {policy} on {table} permissive ({d}): the rows it kept from every role are theirs to see again"),
                    line(policy),
                ))
            }
            Some(d)
                if definition.starts_with("restrictive")
                    && d.starts_with("restrictive")
                    && d.contains(" using (true)") =>
            {
                v.hazards.push(Hazard::new(
                    "access_widened",
                    Severity::High,
                    format!("makes restrictive policy {policy} on {table} let every row through ({d}): the rows it kept from every role are theirs to see again"),
                    line(policy),
                ))
            }
            Some(d) if lets_every_row(d) && !lets_every_row(definition) => v.hazards.push(Hazard::new(
                "access_widened",
                Severity::High,
                format!("changes policy {policy} on {table} to let every row through (was {definition}, now {d}): the roles it names ({}) may now read all of its {} rows", to_whom(d), e.golden_rows(table)),
                line(policy),
            )),
            Some(d) if super::policies::widened_by_or(definition, d) => v.hazards.push(Hazard::new(
                "access_widened",
                Severity::High,
                format!("widens policy {policy} on {table} with an alternative (was {definition}, now {d}): every row it let through, and now also those its new alternative lets through, to the roles it names ({})", to_whom(d)),
                line(policy),
            )),
            Some(d) => v.hazards.push(Hazard::new(
                "policy_changed",
                Severity::Medium,
                format!("changes policy {policy} on {table}: was {definition}, now {d}: check it lets no role read or write more than it should"),
                line(policy),
            )),
            // Renamed, or made again the same under another name.
            None if now.iter().any(|(n, d)| d == definition && !was.contains_key(n)) => {}
            None if definition.starts_with("restrictive") => v.hazards.push(Hazard::new(
                "access_widened",
                Severity::High,
                format!("drops restrictive policy {policy} on {table} ({definition}): the rows it kept from every role are theirs to see again"),
                line(policy),
            )),
            None => {}
        }
    }
    for (policy, definition) in now.iter().filter(|(n, _)| !was.contains_key(*n)) {
        let renamed = was.iter().any(|(n, d)| d == definition && !now.contains_key(n));
        let kept = was.iter().filter(|(n, d)| now.get(*n) == Some(*d)).map(|(_, d)| d.as_str());
        if definition.starts_with("permissive")
            && !renamed
            && row_security
            && !super::policies::adds_nothing(definition, kept)
        {
            let message = match lets_every_row(definition) {
                true => format!(
                    "adds permissive policy {policy} on {table} ({definition}): the roles it names ({}) may now read every one of its {} rows, whatever the other policies keep from them",
                    to_whom(definition),
                    e.golden_rows(table)
                ),
                false => format!(
                    "adds permissive policy {policy} on {table} ({definition}): the roles it names may now {} rows no other policy let them",
                    match definition.split(" to ").next().unwrap_or_default() {
                        "permissive for insert" => "insert",
                        "permissive for update" => "update",
                        "permissive for delete" => "delete",
                        "permissive for select" => "read",
                        _ => "read or write",
                    }
                ),
            };
            let severity = if lets_every_row(definition) { Severity::High } else { Severity::Medium };
            v.hazards.push(Hazard::new("access_widened", severity, message, line(policy)));
        }
    }
}

/// Whether a permissive policy's definition (`permissive for select to
/// public using (true)`) lets every row through.
fn lets_every_row(definition: &str) -> bool {
    definition.starts_with("permissive") && definition.contains(" using (true)")
}

/// The roles a policy's definition names (`... to a, b using ...`).
fn to_whom(definition: &str) -> &str {
    definition.split(" to ").nth(1).and_then(|rest| rest.split(" using ").next()).unwrap_or("public")
}

fn has(entry: &Entry, part: &str) -> bool {
    entry.definition.split("; ").any(|p| p == part)
}

/// The privileges a grant list (`grants alice=r/owner,=a/owner`) gives,
/// by grantee (`PUBLIC` for the empty one).
fn granted(entry: &Entry) -> BTreeMap<String, String> {
    let Some(list) = entry.definition.split("; ").find_map(|p| p.strip_prefix("grants ")) else {
        return BTreeMap::new();
    };
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for item in list.split(',') {
        let Some((grantee, rest)) = item.split_once('=') else { continue };
        let privileges = rest.split('/').next().unwrap_or_default().replace('*', "");
        let grantee =
            if grantee.is_empty() { "PUBLIC".to_owned() } else { grantee.trim_matches('"').to_owned() };
        out.entry(grantee).or_default().push_str(&privileges);
    }
    out
}

/// Each grantee of `now` with the privileges, in words, that it did not
/// hold in `was`.
fn gains<'a>(
    was: &BTreeMap<String, String>,
    now: &'a BTreeMap<String, String>,
) -> Vec<(&'a String, Vec<&'static str>)> {
    now.iter()
        .filter_map(|(grantee, privileges)| {
            let had = was.get(grantee).map(String::as_str).unwrap_or_default();
            let mut gained: Vec<&str> =
                privileges.chars().filter(|p| !had.contains(*p)).map(privilege).collect();
            gained.dedup();
            Some((grantee, gained)).filter(|(_, g)| !g.is_empty())
        })
        .collect()
}

/// A privilege letter of an ACL item in words.
fn privilege(letter: char) -> &'static str {
    match letter {
        'r' => "SELECT",
        'a' => "INSERT",
        'w' => "UPDATE",
        'd' => "DELETE",
        'D' => "TRUNCATE",
        'x' => "REFERENCES",
        't' => "TRIGGER",
        'X' => "EXECUTE",
        'U' => "USAGE",
        'C' => "CREATE",
        'c' => "CONNECT",
        'T' => "TEMPORARY",
        's' => "SET",
        'A' => "ALTER SYSTEM",
        'm' => "MAINTAIN",
        _ => "a privilege",
    }
}

/// Privileges a golden object's grants gained, grantee by grantee.
fn grants(e: &Evidence, before: &BTreeMap<String, Entry>, after: &BTreeMap<String, Entry>, v: &mut Verdict) {
    for (key, was) in before {
        // A relation's, column's, function's or type's properties, or a schema.
        let object = key.strip_prefix("properties of ").unwrap_or(key);
        let Some(now) = after.get(key) else { continue };
        let was = granted(was);
        // What PUBLIC held, every role held: granting it by name adds nothing.
        let everyone: Vec<&str> =
            was.get("PUBLIC").map(|p| p.chars().map(privilege).collect()).unwrap_or_default();
        for (grantee, mut gained) in gains(&was, &granted(now)) {
            gained.retain(|p| !everyone.contains(p));
            if gained.is_empty() {
                continue;
            }
            let public = grantee == "PUBLIC";
            let mut h = Hazard::new(
                "access_widened",
                if public { Severity::High } else { Severity::Medium },
                format!(
                    "grants {} on {object} to {grantee}{}",
                    gained.join(", "),
                    if public { ": every role, those made later included" } else { "" }
                ),
                line_naming(e, "grant"),
            );
            if public {
                h.suggestion = Some("grant to the role that needs it, not PUBLIC".into());
            }
            v.hazards.push(h);
        }
    }
}

/// The owner an entry names (`owner X`), unquoted.
fn owner(entry: &Entry) -> &str {
    entry.definition.split("; ").find_map(|p| p.strip_prefix("owner ")).unwrap_or_default().trim_matches('"')
}

/// Privileges a golden object's grants lost, grantee by grantee
/// (`access_narrowed`): high for `PUBLIC`, every role without a grant of
/// its own. The owners before and after (an owner changed changes whose
/// privileges the list spells out) and the fork's own roles are left out.
fn grants_lost(
    e: &Evidence,
    before: &BTreeMap<String, Entry>,
    after: &BTreeMap<String, Entry>,
    v: &mut Verdict,
) {
    for (key, was) in before {
        let object = key.strip_prefix("properties of ").unwrap_or(key);
        let Some(now) = after.get(key) else { continue };
        let owners = [owner(was), owner(now)];
        for (grantee, lost) in gains(&granted(now), &granted(was)) {
            if owners.contains(&grantee.as_str()) || grantee.starts_with("airlock_") {
                continue;
            }
            let public = grantee == "PUBLIC";
            let reach = if object.starts_with("schema ") && lost.contains(&"USAGE") {
                ", so they can no longer reach any table, view or function in it"
            } else {
                ""
            };
            let mut h = Hazard::new(
                "access_narrowed",
                if public { Severity::High } else { Severity::Medium },
                format!(
                    "revokes {} on {object} from {grantee}{}{reach}",
                    lost.join(", "),
                    if public {
                        ": every role but its owner and those granted it by name loses it"
                    } else {
                        ""
                    }
                ),
                line_naming(e, "revoke").or_else(|| line_naming(e, "grant")),
            );
            h.suggestion = Some(format!(
                "grant {} to the roles that still need it before revoking it from {grantee}",
                lost.join(", ")
            ));
            v.hazards.push(h);
        }
    }
}

/// Triggers of golden tables still there that were dropped (and not made
/// again the same under any name) or switched off.
fn triggers(
    e: &Evidence,
    before: &BTreeMap<String, Entry>,
    after: &BTreeMap<String, Entry>,
    v: &mut Verdict,
) {
    for (table, was) in &e.before.tables {
        let Some(now) = e.after.tables.get(table) else { continue };
        for (name, definition) in &was.triggers {
            // Switched on: a trigger's state is its own entry.
            let enabled = |n: &str| {
                let key = format!("state of trigger {n} on ");
                after
                    .iter()
                    .find(|(k, _)| k.starts_with(&key))
                    .is_none_or(|(_, state)| matches!(state.definition.as_str(), "enabled" | "always"))
            };
            match now.triggers.get(name) {
                Some(d) if d == definition => {}
                Some(d) => v.hazards.push(Hazard::new(
                    "trigger_changed",
                    Severity::Medium,
                    format!("changes trigger {name} on {table}: was {definition}, now {d}: check it still does its work when it should"),
                    line_naming(e, name),
                )),
                None => {}
            }
            if now.triggers.contains_key(name) {
                function_replaced(e, table, name, definition, v);
                continue;
            }
            // The same trigger made again under another name, and on, takes nothing away.
            let unnamed = without_name(name, definition);
            let again = now.triggers.iter().any(|(n, d)| without_name(n, d) == unnamed && enabled(n));
            if again {
                function_replaced(e, table, name, definition, v);
                continue;
            }
            let mut h = Hazard::new(
                "trigger_removed",
                Severity::Medium,
                format!("drops trigger {name} on {table}: what it did no longer happens ({definition})"),
                line_naming(e, name),
            );
            h.suggestion =
                Some("if its work moves elsewhere, say where in the migration; otherwise keep it".into());
            v.hazards.push(h);
        }
    }
    // Triggers added to golden tables (not one made again under a new name):
    // the application's writes now run them too.
    for (table, was) in &e.before.tables {
        let Some(now) = e.after.tables.get(table) else { continue };
        let old: Vec<String> = was.triggers.iter().map(|(n, d)| without_name(n, d)).collect();
        for (name, definition) in now.triggers.iter().filter(|(n, _)| !was.triggers.contains_key(*n)) {
            if old.contains(&without_name(name, definition)) {
                continue;
            }
            v.hazards.push(Hazard::new(
                "trigger_added",
                Severity::Medium,
                format!(
                    "adds trigger {name} on {table}: the application's writes to it now run it too ({definition}), and whatever it writes, locks or refuses with them"
                ),
                line_naming(e, name),
            ));
        }
    }
    for (key, was) in before {
        let Some(trigger) = key.strip_prefix("state of trigger ") else { continue };
        let Some(now) = after.get(key) else { continue };
        let on = |state: &str| matches!(state, "enabled" | "always");
        if on(&was.definition) && !on(&now.definition) {
            let name = trigger.split(" on ").next().unwrap_or(trigger);
            v.hazards.push(Hazard::new(
                "trigger_removed",
                Severity::Medium,
                format!("switches trigger {trigger} off ({}): what it did no longer happens", now.definition),
                line_naming(e, name),
            ));
        }
    }
}

/// A trigger's definition without its name: the same trigger made again
/// under another name reads the same.
fn without_name(name: &str, definition: &str) -> String {
    definition.replacen(name, "", 1)
}

/// The function a golden trigger runs, replaced by the candidate: what the
/// trigger does changed, though the trigger did not.
fn function_replaced(e: &Evidence, table: &str, trigger: &str, definition: &str, v: &mut Verdict) {
    let Some(call) = definition
        .split("EXECUTE FUNCTION ")
        .nth(1)
        .or_else(|| definition.split("EXECUTE PROCEDURE ").nth(1))
    else {
        return;
    };
    let function = call.split('(').next().unwrap_or_default().trim();
    let name = |key: &str| key.split('(').next().unwrap_or_default().to_owned();
    let matches = |key: &String| {
        let k = name(key);
        k == function || short_name(&k) == function || k.rsplit('.').next() == Some(function)
    };
    let mut unchanged: Vec<&String> = Vec::new();
    for (key, was) in e.before.functions.iter().filter(|(k, _)| matches(k)) {
        match e.after.functions.get(key) {
            Some(now) if !e.calls.unchanged(key, was, now) => v.hazards.push(Hazard::new(
                "trigger_changed",
                Severity::Medium,
                format!("replaces function {key}, which trigger {trigger} on {table} runs: what the trigger does on each write changed"),
                line_naming(e, function.rsplit('.').next().unwrap_or(function)),
            )),
            Some(_) => unchanged.push(key),
            None => {}
        }
    }
    called_replaced(e, (table, trigger), unchanged, v);
}

/// Functions down the chain from a trigger's own (`from`, unchanged): those
/// its body names, and theirs, replaced or dropped by the candidate.
fn called_replaced(e: &Evidence, (table, trigger): (&str, &str), from: Vec<&String>, v: &mut Verdict) {
    for changed in super::calls::changed_down(e.calls, (e.before, e.after), from) {
        let (callee, caller) = (changed.function, changed.via.map_or("", String::as_str));
        let named = callee.split('(').next().unwrap_or(callee);
        let effect = match changed.dropped {
            true => "every write that fires the trigger now fails when it gets there",
            false => "what the trigger does on each write changed",
        };
        v.hazards.push(Hazard::new(
            "trigger_changed",
            Severity::Medium,
            format!(
                "{} function {callee}, which {caller} names, down the chain trigger {trigger} on {table} runs: {effect}",
                changed.verb()
            ),
            line_naming(e, named.rsplit('.').next().unwrap_or(named)),
        ));
    }
}
