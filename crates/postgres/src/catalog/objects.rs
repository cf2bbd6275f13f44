//! Every other catalog entry an agent can make or change, beyond the tables,
//! views, functions, sequences, types and extensions the catalog describes in
//! full: rules, row-level security policies and the switch that turns it on,
//! grants, storage options, disabled triggers, statistics objects, comments,
//! inheritance and partition bounds, casts, operators and their classes,
//! collations, conversions, text search setups, default privileges, large
//! objects, schemas and publications.
//!
//! Each of these can change what the application does, or what a report about
//! it says (a policy can hide every row from a count, a rule can swallow every
//! insert), so `changes_since_fork` must see them. Each entry is named the way
//! PostgreSQL names objects (`pg_describe_object`) and carries a definition or,
//! where PostgreSQL has no readable one, a digest of its catalog row.

use crate::cell::Cell;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use airlock_core::error::Result;

/// One catalog entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Its definition, or a digest of its catalog row.
    pub definition: String,
    /// Whether it describes properties of an object the catalog lists in full
    /// (a table's grants, say): then only a change is news, since the object's
    /// coming and going is reported already.
    #[serde(default)]
    pub property: bool,
}

/// Application namespaces: not PostgreSQL's own (only a superuser can make a
/// schema named `pg_…`), so not Airlock's either.
const APP: &str =
    "(SELECT oid FROM pg_namespace WHERE nspname <> 'information_schema' AND nspname NOT LIKE 'pg\\_%')";

/// A grant list made comparable: PostgreSQL's default written out, and the
/// daemon's own grants to the agent role (a read-only fork's) left out.
fn acl(column: &str, kind: char, owner: &str) -> String {
    format!(
        "(SELECT string_agg(a::text, ',' ORDER BY a::text) FROM unnest(coalesce({column}, acldefault('{kind}', {owner}))) a
          WHERE a::text !~ '^airlock_agent=')"
    )
}

/// Not an extension's member (`class` is its catalog, `oid` its id).
fn own(class: &str, oid: &str) -> String {
    format!(
        "NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = '{class}'::regclass AND d.objid = {oid} AND d.deptype = 'e')"
    )
}

/// A digest of a catalog row, for entries PostgreSQL cannot print.
fn digest(row: &str) -> String {
    format!("'digest ' || md5(to_jsonb({row})::text)")
}

/// Queries returning (name, definition, property) rows.
fn queries() -> Vec<String> {
    let rel_acl = acl("c.relacl", 'r', "c.relowner");
    let seq_acl = acl("c.relacl", 's', "c.relowner");
    vec![
        // Properties of tables, views, sequences and indexes.
        format!(
            "SELECT 'properties of ' || pg_describe_object('pg_class'::regclass, c.oid, 0),
                    concat_ws('; ', 'owner ' || c.relowner::regrole::text,
                        'grants ' || CASE c.relkind WHEN 'S' THEN {seq_acl} ELSE {rel_acl} END,
                        'options ' || array_to_string(c.reloptions, ','),
                        CASE WHEN c.relrowsecurity THEN 'row security on' END,
                        CASE WHEN c.relforcerowsecurity THEN 'row security forced' END,
                        'persistence ' || c.relpersistence::text, 'replica identity ' || c.relreplident::text,
                        'partition ' || pg_get_expr(c.relpartbound, c.oid),
                        CASE WHEN NOT c.relispopulated THEN 'not populated' END,
                        (SELECT CASE WHEN i.indisclustered THEN 'clustered' END
                           FROM pg_index i WHERE i.indexrelid = c.oid)),
                    true
             FROM pg_class c
             WHERE c.relnamespace IN {APP} AND c.relkind IN ('r', 'p', 'f', 'v', 'm', 'S', 'i', 'I') AND {}",
            own("pg_class", "c.oid")
        ),
        // Properties of columns. Options named `pg_...` are the server's own
        // stamps (some builds record one per column, different in every copy),
        // never a user's: only the settable ones are compared.
        format!(
            "SELECT 'properties of ' || pg_describe_object('pg_class'::regclass, a.attrelid, a.attnum),
                    concat_ws('; ', 'grants ' || {},
                        'options ' || (SELECT string_agg(o, ',') FROM unnest(a.attoptions) o WHERE o NOT LIKE 'pg\\_%'),
                        'collation ' || a.attcollation::regcollation::text, 'statistics ' || a.attstattarget,
                        'storage ' || a.attstorage::text, 'compression ' || nullif(pg_catalog.to_jsonb(a) ->> 'attcompression', ''),
                        'fdw options ' || array_to_string(a.attfdwoptions, ',')),
                    true
             FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
             WHERE c.relnamespace IN {APP} AND c.relkind IN ('r', 'p', 'f', 'v', 'm')
               AND a.attnum > 0 AND NOT a.attisdropped AND {}",
            acl("a.attacl", 'c', "c.relowner"),
            own("pg_class", "c.oid")
        ),
        // Owners and grants of functions and types; aggregates' definitions.
        format!(
            "SELECT 'properties of ' || pg_describe_object('pg_proc'::regclass, p.oid, 0),
                    concat_ws('; ', 'owner ' || p.proowner::regrole::text, 'grants ' || {},
                              CASE WHEN p.prokind = 'a' THEN (SELECT {} FROM pg_aggregate g WHERE g.aggfnoid = p.oid) END),
                    true
             FROM pg_proc p WHERE p.pronamespace IN {APP} AND {}",
            acl("p.proacl", 'f', "p.proowner"),
            digest("g"),
            own("pg_proc", "p.oid")
        ),
        format!(
            "SELECT 'properties of ' || pg_describe_object('pg_type'::regclass, t.oid, 0),
                    concat_ws('; ', 'owner ' || t.typowner::regrole::text, 'grants ' || {}), true
             FROM pg_type t WHERE t.typnamespace IN {APP} AND t.typtype IN ('e', 'd', 'r', 'm')
               AND {}",
            acl("t.typacl", 'T', "t.typowner"),
            own("pg_type", "t.oid")
        ),
        // What a domain holds its values to: NOT NULL, its default and its
        // CHECK constraints by name (NOT NULL is read from the type alone,
        // since PostgreSQL 17 also records it as a constraint). A property of
        // the type, so a golden recorded before this was read shows no change.
        format!(
            "SELECT 'constraints of ' || pg_describe_object('pg_type'::regclass, t.oid, 0),
                    concat_ws('; ', CASE WHEN t.typnotnull THEN 'not null' END, 'default ' || t.typdefault,
                        (SELECT string_agg('constraint ' || quote_ident(k.conname) || ' ' || pg_get_constraintdef(k.oid),
                                           '; ' ORDER BY k.conname)
                           FROM pg_constraint k WHERE k.contypid = t.oid AND k.contype = 'c')),
                    true
             FROM pg_type t WHERE t.typnamespace IN {APP} AND t.typtype = 'd' AND {}",
            own("pg_type", "t.oid")
        ),
        // Sequences' parameters; triggers switched off or on.
        "SELECT 'parameters of ' || pg_describe_object('pg_class'::regclass, s.seqrelid, 0),
                concat_ws(' ', 'start', s.seqstart, 'increment', s.seqincrement, 'min', s.seqmin, 'max', s.seqmax,
                          'cache', s.seqcache, CASE WHEN s.seqcycle THEN 'cycle' END), true
         FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid WHERE c.relnamespace IN {APP}"
            .replace("{APP}", APP),
        "SELECT 'state of ' || pg_describe_object('pg_trigger'::regclass, t.oid, 0),
                CASE t.tgenabled WHEN 'O' THEN 'enabled' WHEN 'D' THEN 'disabled'
                                 WHEN 'R' THEN 'replica only' ELSE 'always' END, true
         FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
         WHERE c.relnamespace IN {APP} AND NOT t.tgisinternal"
            .replace("{APP}", APP),
        // Schemas.
        format!(
            "SELECT pg_describe_object('pg_namespace'::regclass, n.oid, 0),
                    concat_ws('; ', 'owner ' || n.nspowner::regrole::text, 'grants ' || {}), false
             FROM pg_namespace n WHERE n.oid IN {APP}",
            acl("n.nspacl", 'n', "n.nspowner")
        ),
        // Rules (a view's own is its definition), policies, statistics objects.
        "SELECT pg_describe_object('pg_rewrite'::regclass, r.oid, 0),
                pg_get_ruledef(r.oid) || CASE r.ev_enabled WHEN 'D' THEN ' (disabled)' ELSE '' END, false
         FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class
         WHERE c.relnamespace IN {APP} AND r.rulename <> '_RETURN'"
            .replace("{APP}", APP),
        "SELECT pg_describe_object('pg_policy'::regclass, p.oid, 0),
                concat_ws(' ', CASE WHEN p.polpermissive THEN 'permissive' ELSE 'restrictive' END,
                    'for', CASE p.polcmd WHEN 'r' THEN 'select' WHEN 'a' THEN 'insert' WHEN 'w' THEN 'update'
                                         WHEN 'd' THEN 'delete' ELSE 'all' END,
                    'to', (SELECT string_agg(CASE WHEN r = 0 THEN 'public' ELSE r::regrole::text END, ',' ORDER BY r)
                           FROM unnest(p.polroles) r),
                    'using (' || pg_get_expr(p.polqual, p.polrelid) || ')',
                    'with check (' || pg_get_expr(p.polwithcheck, p.polrelid) || ')'), false
         FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid WHERE c.relnamespace IN {APP}"
            .replace("{APP}", APP),
        "SELECT pg_describe_object('pg_statistic_ext'::regclass, s.oid, 0),
                pg_get_statisticsobjdef(s.oid) || coalesce(' target ' || nullif(s.stxstattarget, -1), ''), false
         FROM pg_statistic_ext s WHERE s.stxnamespace IN {APP}"
            .replace("{APP}", APP),
        // Comments on the application's objects, and who inherits from whom.
        "SELECT 'comment on ' || pg_describe_object(d.classoid, d.objoid, d.objsubid), d.description, false
         FROM pg_description d WHERE d.objoid >= 16384
           AND NOT (d.classoid = 'pg_namespace'::regclass AND d.objoid NOT IN {APP})
           AND pg_describe_object(d.classoid, d.objoid, d.objsubid) IS NOT NULL"
            .replace("{APP}", APP),
        "SELECT 'parents of ' || pg_describe_object('pg_class'::regclass, i.inhrelid, 0),
                string_agg(i.inhparent::regclass::text, ', ' ORDER BY i.inhseqno), false
         FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE c.relnamespace IN {APP}
         GROUP BY i.inhrelid"
            .replace("{APP}", APP),
        // Casts, operators and what indexes do with them; collations, conversions, text search.
        format!(
            "SELECT pg_describe_object('pg_cast'::regclass, k.oid, 0),
                    concat_ws(' ', 'via', nullif(k.castfunc, 0)::regprocedure::text, 'context', k.castcontext::text,
                              'method', k.castmethod::text), false
             FROM pg_cast k WHERE k.oid >= 16384 AND {}",
            own("pg_cast", "k.oid")
        ),
        catalog_rows("pg_operator", "o", "o.oprnamespace"),
        catalog_rows("pg_opclass", "o", "o.opcnamespace"),
        catalog_rows("pg_opfamily", "o", "o.opfnamespace"),
        catalog_rows("pg_collation", "o", "o.collnamespace"),
        catalog_rows("pg_conversion", "o", "o.connamespace"),
        catalog_rows("pg_ts_dict", "o", "o.dictnamespace"),
        format!(
            "SELECT pg_describe_object('pg_ts_config'::regclass, o.oid, 0),
                    {} || ' ' || coalesce((SELECT md5(string_agg(m::text, ',' ORDER BY m::text))
                                           FROM pg_ts_config_map m WHERE m.mapcfg = o.oid), ''), false
             FROM pg_ts_config o WHERE o.cfgnamespace IN {APP} AND {}",
            digest("o"),
            own("pg_ts_config", "o.oid")
        ),
        format!(
            "SELECT pg_describe_object(a.classid, a.objid, 0), {}, false
             FROM (SELECT 'pg_amop'::regclass AS classid, oid AS objid, to_jsonb(x) AS row, amopfamily AS family FROM pg_amop x
                   UNION ALL
                   SELECT 'pg_amproc'::regclass, oid, to_jsonb(x), amprocfamily FROM pg_amproc x) a
             JOIN pg_opfamily f ON f.oid = a.family WHERE f.opfnamespace IN {APP} AND {}",
            "'digest ' || md5(a.row::text)",
            own("pg_opfamily", "f.oid")
        ),
        // Default privileges, large objects, publications, foreign servers, transforms.
        "SELECT pg_describe_object('pg_default_acl'::regclass, d.oid, 0), d.defaclacl::text, false
         FROM pg_default_acl d"
            .to_owned(),
        format!(
            "SELECT 'large object ' || l.oid, concat_ws('; ', 'owner ' || l.lomowner::regrole::text, 'grants ' || {}), false
             FROM pg_largeobject_metadata l",
            acl("l.lomacl", 'L', "l.lomowner")
        ),
        // (Their OIDs, and those of their owners and wrappers, differ in
        // every copy: a wrapper by name, owners set aside as a build sets
        // them.)
        "SELECT pg_describe_object('pg_publication'::regclass, p.oid, 0),
                concat_ws('; ', 'digest ' || md5((to_jsonb(p) - 'oid' - 'pubowner')::text),
                    'tables ' || (SELECT string_agg(r.prrelid::regclass::text, ',' ORDER BY r.prrelid::regclass::text)
                                    FROM pg_publication_rel r WHERE r.prpubid = p.oid)), false
         FROM pg_publication p"
            .to_owned(),
        "SELECT pg_describe_object('pg_foreign_server'::regclass, s.oid, 0),
                concat_ws('; ', 'wrapper ' || (SELECT w.fdwname FROM pg_foreign_data_wrapper w WHERE w.oid = s.srvfdw),
                    'digest ' || md5((to_jsonb(s) - 'oid' - 'srvowner' - 'srvfdw')::text)), false
         FROM pg_foreign_server s"
            .to_owned(),
        format!(
            "SELECT pg_describe_object('pg_transform'::regclass, t.oid, 0), {}, false FROM pg_transform t WHERE t.oid >= 16384",
            digest("t")
        ),
    ]
}

/// Entries of a catalog with a namespace and no readable definition: digests.
fn catalog_rows(catalog: &str, alias: &str, namespace: &str) -> String {
    format!(
        "SELECT pg_describe_object('{catalog}'::regclass, {alias}.oid, 0), {}, false
         FROM {catalog} {alias} WHERE {namespace} IN {APP} AND {}",
        digest(alias),
        own(catalog, &format!("{alias}.oid"))
    )
}

/// Reads every entry, by name. The session's search path must be pinned to
/// `pg_catalog` (as [`super::read`] does), so names print the same in every
/// database and nothing the agent made stands in for a catalog function.
pub async fn read(client: &tokio_postgres::Client) -> Result<BTreeMap<String, Entry>> {
    let mut entries = BTreeMap::new();
    for sql in queries() {
        for row in client.query(&sql, &[]).await.map_err(super::query_error)? {
            let (Some(name), definition) = (row.cell::<Option<String>>(0)?, row.cell::<Option<String>>(1)?)
            else {
                continue;
            };
            entries
                .insert(name, Entry { definition: definition.unwrap_or_default(), property: row.cell(2)? });
        }
    }
    Ok(entries)
}
