//! The `opaque_code` check's tests.

use super::*;

#[test]
fn the_default_check_is_one_regular_expression_of_whole_words() {
    let sql = fills_by_chance_sql("d");
    assert!(sql.starts_with("d OPERATOR(pg_catalog.~*) E'\\\\m(now|"), "{sql}");
    assert!(sql.ends_with(")\\\\M'"), "{sql}");
}

fn why(sql: &str) -> Vec<String> {
    let catalog: Catalog = serde_json::from_value(serde_json::json!({
        "tables": {
            "public.audited": {"kind": "table", "columns": [], "constraints": {}, "indexes": {},
                                "triggers": {"log": "CREATE TRIGGER log ..."}},
            "public.users": {"kind": "table", "columns": [], "constraints": {}, "indexes": {}, "triggers": {}},
            "public.on_update_only": {"kind": "table", "columns": [], "constraints": {}, "indexes": {},
                                       "triggers": {"t": "CREATE TRIGGER t BEFORE UPDATE OF a ON public.on_update_only FOR EACH ROW EXECUTE FUNCTION f()"}},
            "public.scored": {"kind": "table", "columns": [{"name": "s", "type": "int", "nullable": true,
                               "default": "rotate_keys(1)"}], "constraints": {}, "indexes": {}, "triggers": {}},
            "public.checked": {"kind": "table", "columns": [], "indexes": {}, "triggers": {},
                               "constraints": {"c": "CHECK (public.rotate_keys(a) > 0)"}},
            "public.kv": {"kind": "table", "columns": [], "indexes": {}, "triggers": {}, "constraints": {}},
            "public.clocked": {"kind": "table", "columns": [
                {"name": "t", "type": "time without time zone", "nullable": true, "default": null},
                {"name": "ttz", "type": "time with time zone", "nullable": true, "default": null}],
                "constraints": {}, "indexes": {}, "triggers": {}},
            "public.stamped": {"kind": "table", "columns": [{"name": "at", "type": "timestamp with time zone", "nullable": true}],
                               "indexes": {}, "triggers": {}, "constraints": {}},
            "public.owned": {"kind": "table", "columns": [], "indexes": {}, "triggers": {},
                             "constraints": {"o": "FOREIGN KEY (k) REFERENCES kv(k) ON UPDATE CASCADE ON DELETE CASCADE"}},
            "public.child": {"kind": "table", "columns": [], "indexes": {}, "triggers": {"t": "CREATE TRIGGER t ..."},
                             "constraints": {"o": "FOREIGN KEY (k) REFERENCES owned(k) ON DELETE SET NULL"}}
        },
        "views": {"public.keyed": "SELECT rotate_keys(1) AS k", "public.plain_view": "SELECT 1 AS one",
                  "public.who": "SELECT a FROM t WHERE b = current_setting('app.tenant')"},
        "objects": {
            "rule r on table public.flags": {"definition": "CREATE RULE r AS ON UPDATE TO flags DO ALSO NOTHING"},
            "policy mine on table public.notes": {"definition": "permissive for all to public using ((owner = CURRENT_USER))"},
            "policy open on table public.kv": {"definition": "permissive for all to public using (true)"},
            "cast from text to tag_t": {"definition": "via to_tag(text) context e method f"},
            "operator ##(text,text)": {"definition": "digest x"},
            "operator class public.c for access method btree": {"definition": "digest y"}
        }, "functions": {"public.rotate_keys(integer)": "x", "app.\"Mixed\"()": "y"},
        "sequences": {"public.users_id_seq": "bigint"}, "types": {}, "extensions": {}
    }))
    .unwrap();
    let statements = airlock_postgres::split::split(sql).unwrap();
    opaque(&statements, &catalog).into_iter().map(|o| o.why).collect()
}

#[test]
fn plain_ddl_and_dml_are_transparent() {
    for sql in [
        "ALTER TABLE users ADD COLUMN created_at timestamptz NOT NULL DEFAULT now()",
        "ALTER TABLE users ADD COLUMN id2 uuid DEFAULT gen_random_uuid()",
        "CREATE TABLE t (a int, at timestamptz DEFAULT (current_timestamp + interval '1 day'))",
        "UPDATE users SET email = lower(email) WHERE email <> lower(email)",
        "INSERT INTO users (email) SELECT 'now() ' || 'current_user' FROM generate_series(1, 3)",
        "CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$ BEGIN RETURN current_database(); END $$",
        "CREATE INDEX ON users (lower(email)); COMMENT ON TABLE users IS 'pg_stat_activity'",
        "-- DO this later\nALTER TABLE users RENAME COLUMN \"now\" TO then",
        "CREATE EXTENSION IF NOT EXISTS pg_trgm",
        "INSERT INTO users (note) VALUES ('done now'), ('today''s')",
        "ALTER TABLE users ADD COLUMN day date NOT NULL DEFAULT 'today'",
        // A table that holds a time, named as one, and records made of the data's own JSON.
        "INSERT INTO stamped (at) VALUES ('2020-01-01'); SELECT (s).at FROM stamped s",
        "UPDATE users SET at = x.at FROM jsonb_to_recordset(users.doc) AS x(at timestamptz)",
        "UPDATE users SET n = (jsonb_populate_record(NULL::stamped, users.doc)).at IS NULL",
        "SELECT * FROM jsonb_to_record(jsonb_build_object('n', 1)) AS x(n int)",
        "SELECT x.date FROM jsonb_to_record(users.doc || '{}') AS x(n int, date text) JOIN stamped ON true",
        "ALTER TABLE users ADD COLUMN n bigint DEFAULT nextval('users_n_seq')",
        // Statements about a table read none of its rows through its policies,
        // and an insert fires no trigger that fires on updates alone.
        "ALTER TABLE notes ADD COLUMN category text",
        "COMMENT ON TABLE notes IS 'tenant documents'",
        "CREATE POLICY open ON notes FOR SELECT USING (true)",
        "INSERT INTO on_update_only VALUES (1)",
        "CREATE POLICY tenant ON notes USING (owner = current_setting('app.tenant', true))",
        "ALTER POLICY tenant ON notes USING (owner = current_user)",
        "CREATE TYPE delivery AS ENUM ('today', 'tomorrow', 'later')",
        "ALTER TABLE users ADD COLUMN pg_version text",
        // What a setval does is seen on the fork (sequence_behind, sequence_exhausted).
        "SELECT setval('users_id_seq', 9223372036854775807)",
        "SELECT setval('users_id_seq', (SELECT max(id) FROM users))",
        "UPDATE users SET since = date'2020-01-01' WHERE note = E'it''s \\' done'",
        "CREATE TYPE mood AS ENUM ('sad', 'ok')",
        "ALTER TABLE users ADD COLUMN \"user\" text",
        "ALTER DEFAULT PRIVILEGES FOR USER app_owner GRANT SELECT ON TABLES TO reader",
        "INSERT INTO users SELECT * FROM plain_view",
        "UPDATE users SET note = 'back today at 10'",
        "ALTER TABLE users ADD COLUMN a int DEFAULT 1, ADD COLUMN r float8 DEFAULT random()",
        "WITH l AS (INSERT INTO users VALUES (1) RETURNING 1) UPDATE users SET a = 1",
        "INSERT INTO kv VALUES ('a'); UPDATE users SET v = v # 'x'",
        "DROP FUNCTION rotate_keys(integer)",
        "ALTER FUNCTION rotate_keys(integer) OWNER TO app",
        "COMMENT ON FUNCTION rotate_keys(integer) IS 'x'",
        "GRANT EXECUTE ON FUNCTION rotate_keys(integer) TO app",
        "DROP EXTENSION IF EXISTS pg_trgm",
        "UPDATE users SET email = pg_catalog.lower(email)",
        "ALTER TABLE users ADD COLUMN at timestamptz DEFAULT now()::timestamp(0)",
        "ALTER TABLE users ADD COLUMN k uuid NOT NULL DEFAULT gen_random_uuid(), ADD COLUMN j int",
        "UPDATE users SET note = E'line\\nbreak', n = U&'d\\0061t\\+000061'",
        "SET lock_timeout = '5s'; SET search_path TO app, public",
        "SELECT pg_sleep(2); SELECT pg_sleep('0.5')",
        "UPDATE users SET day = created_at::date, t = '2025-01-01'::timestamptz, u = date_trunc('day', created_at)::date",
        "UPDATE users SET d = CAST(created_at AS date), e = CAST('2025-01-01' AS date), f = to_date(s, 'YYYY')::date",
        // A column read into a time, however written: the data's, not code.
        "UPDATE users SET day = date(created_at), d = pg_catalog.date(u.\"Created\"), e = date(created_at AT TIME ZONE 'UTC')",
        "UPDATE users SET day = (created_at AT TIME ZONE 'UTC')::date, at = (payload->>'ts')::timestamptz",
        "UPDATE users SET at = (u.payload #>> '{a,b}')::timestamptz, d = CAST(payload -> 'x' ->> 0 AS date)",
        "UPDATE users SET d = (created_at AT TIME ZONE 'Europe/Paris')::date, e = (payload -> -1 ->> 'ts')::date",
        // ... wherever the cast stands, and through parentheses or a cast into a time.
        "SELECT (created_at)::date FROM users GROUP BY (created_at AT TIME ZONE 'UTC')::date",
        "INSERT INTO days (d) SELECT (payload->>'ts')::date FROM users WHERE a AND (o.payload->>'d')::date = users.d",
        "DELETE FROM users WHERE (payload->>'ts')::timestamptz < '2020-01-01' RETURNING (payload->>'ts')::date",
        "UPDATE users SET d = CASE WHEN a THEN (payload->>'d')::date ELSE (created_at AT TIME ZONE 'UTC')::date END",
        "UPDATE users SET d = date(created_at::timestamp), e = (created_at::timestamptz AT TIME ZONE 'UTC')::date",
        "UPDATE users SET d = ((payload->>'ts'))::date, e = CAST((payload->>'ts') AS date)",
        "CREATE TABLE stamps (a timestamp(0), b time(3) with time zone, c timestamptz (6)); ALTER TABLE stamps ALTER COLUMN a TYPE timestamp(3)",
        "UPDATE posts SET body = 'now or never', note = 'today is a good day'",
        "ALTER TABLE users ADD COLUMN e date DEFAULT date(make_timestamp(2026, 1, 1, 0, 0, 0))",
        "ALTER TABLE users ALTER COLUMN at TYPE timestamp(0), ADD COLUMN d date",
        "BEGIN; SET LOCAL lock_timeout = '1s'; ALTER TABLE users ADD COLUMN e int; COMMIT;",
        "UPDATE posts SET body = 'right now', tags = '{news,today-ish}', meta = '{\"when\": \"soon\"}'",
        // A file that runs whole is one transaction under test as on promote.
        "SET LOCAL search_path = scratch; UPDATE orders SET amount = 0",
        // The schema's own sequence behind a column, a setting made as SET
        // makes it, and a dump's preamble setting what the lexer reads by.
        "SELECT setval(pg_get_serial_sequence('public.customers', 'id'), coalesce(max(id), 1)) FROM customers",
        "SELECT set_config('lock_timeout', '3s', false)",
        "SET standard_conforming_strings = on; SET client_encoding = 'UTF8'",
        "SET escape_string_warning = off",
        // Limits on waiting, put back: how long the file may wait, not what it does.
        "RESET lock_timeout",
        "SET LOCAL statement_timeout TO DEFAULT",
        "SET lock_timeout = DEFAULT",
    ] {
        assert_eq!(why(sql), Vec::<String>::new(), "{sql}");
    }
}

#[test]
fn code_that_can_look_around_is_opaque() {
    let cases = [
        ("DO $$ BEGIN EXECUTE 'UPDATE users SET email = ''x'''; END $$", "DO block"),
        ("do language plpgsql 'begin null'", "DO block"),
        ("CALL reset_all()", "CALL"),
        ("PREPARE p AS DELETE FROM users; EXECUTE p", "prepared"),
        ("UPDATE users SET email = 'x' WHERE current_database() = 'prod'", "current_database()"),
        ("DELETE FROM users WHERE current_user = 'app'", "CURRENT_USER"),
        ("DELETE FROM users WHERE to_regnamespace('airlock_probe') IS NULL", "to_regnamespace()"),
        ("UPDATE users SET email = 'x' WHERE (SELECT count(*) FROM pg_stat_activity) > 3", "pg_stat_activity"),
        ("UPDATE users SET email = 'x' WHERE EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = 'p')", "pg_namespace"),
        ("UPDATE users SET email = 'x' WHERE now() > '2027-01-01'", "now()"),
        ("UPDATE users SET a = 1 WHERE random() < 0.5", "random()"),
        ("SELECT setval('users_id_seq', 1) WHERE version() LIKE '%x%'", "version()"),
        ("SELECT rotate_keys(1)", "rotate_keys()"),
        ("SELECT app.\"Mixed\"()", "mixed()"),
        ("INSERT INTO audited VALUES (1)", "triggers"),
        ("CREATE FUNCTION g() RETURNS void LANGUAGE sql AS 'DELETE FROM users'; SELECT g()", "g()"),
        ("CREATE TRIGGER t BEFORE INSERT ON users FOR EACH ROW EXECUTE FUNCTION f(); INSERT INTO users VALUES (1)", "triggers"),
        ("CREATE RULE r AS ON INSERT TO users DO INSTEAD NOTHING; INSERT INTO public.users VALUES (1)", "rule"),
        ("SELECT query_to_xml('DELETE FROM users RETURNING 1', true, true, '')", "query_to_xml()"),
        ("UPDATE users SET a = pg_database_size(current_database())", "pg_database_size()"),
        ("UPDATE users SET n = (SELECT reltuples FROM pg_class WHERE relname = 'users')", "pg_class"),
        ("DELETE FROM users WHERE user = 'app'", "USER"),
        ("CREATE USER MAPPING FOR USER SERVER s", "USER"),
        ("INSERT INTO scored DEFAULT VALUES", "defaults, checks or indexes run rotate_keys()"),
        ("UPDATE public.checked SET a = 2", "run rotate_keys()"),
        ("INSERT INTO users SELECT k FROM keyed", "view keyed"),
        ("UPDATE users SET n = 'users'::regclass::int", "casts to regclass"),
        ("UPDATE users SET at = CURRENT_TIMESTAMP(6)", "CURRENT_TIMESTAMP"),
        ("UPDATE users SET at = 'today 00:00'::timestamptz", "'today 00:00'"),
        ("UPDATE users SET at = 'yesterday 12:00+02'", "'yesterday 12:00+02'"),
        ("UPDATE users SET note = DEFAULT, n = random() * 10", "random()"),
        ("WITH l AS (INSERT INTO users VALUES (1) RETURNING 1) UPDATE audited SET a = 1", "audited"),
        ("TRUNCATE TABLE audited", "audited"),
        ("UPDATE users SET v = 'no'\n'w'::timestamptz::text", "'now'"),
        ("UPDATE users SET v = \"xmin\"::text || \"ctid\"::text", "xmin"),
        ("UPDATE users SET v = 'users'::\"regclass\"::int", "regclass"),
        // A delete cascades to owned, whose delete sets child's key NULL: an update, which its trigger fires on.
        ("DELETE FROM kv WHERE k = 'b'", "carry the write to child"),
        ("UPDATE flags SET on_ = false", "triggers or rules"),
        ("UPDATE users SET v = (CAST(v AS tag_t)).label", "type tag_t"),
        ("UPDATE users SET v = v ## 'x'", "operator ##"),
        ("INSERT INTO users SELECT 1 ON CONFLICT (id) DO UPDATE SET a = 2; DELETE FROM ONLY public.audited", "audited"),
        ("UPDATE users SET n = 1 WHERE EXISTS (SELECT FROM U&\"\\0070g_namespace\")", "Unicode-escaped"),
        ("SET standard_conforming_strings = off", "standard_conforming_strings"),
        ("SET standard_conforming_strings TO 'off'", "standard_conforming_strings"),
        ("SET backslash_quote = on", "backslash_quote"),
        ("SELECT set_config('search_path', current_setting('search_path') || ', x', false)", "current_setting()"),
        ("DELETE FROM users WHERE created < 'now'", "'now'"),
        ("DELETE FROM users WHERE day = 'Tomorrow'::date", "'tomorrow'"),
        ("DELETE FROM users TABLESAMPLE BERNOULLI (50)", "TABLESAMPLE"),
        ("UPDATE users SET id2 = gen_random_uuid()", "gen_random_uuid()"),
        ("DELETE FROM users WHERE xmin::text::int % 2 = 0", "xmin"),
        ("DELETE FROM users WHERE 'users'::regclass::oid > 20000", "casts to oid"),
        ("DELETE FROM users WHERE nextval('s') > 1000", "nextval()"),
        ("NOTIFY cache_flush, 'all'", "NOTIFY"),
        ("SELECT lo_unlink(16400)", "lo_unlink()"),
        ("CREATE OPERATOR === (LEFTARG = int, RIGHTARG = int, FUNCTION = rotate_keys)", "operator that runs rotate_keys"),
        ("CREATE FUNCTION h(int, int) RETURNS int LANGUAGE sql AS 'SELECT 1'; CREATE AGGREGATE a(int) (SFUNC = h, STYPE = int)", "aggregate that runs h"),
        ("CREATE FUNCTION is_prod(users) RETURNS bool LANGUAGE sql AS $$SELECT true$$; UPDATE users u SET a = 1 WHERE u.is_prod", "names is_prod"),
        ("UPDATE users u SET a = 1 WHERE u.rotate_keys > 0", "names rotate_keys"),
        ("DELETE FROM users WHERE getpgusername() = 'app'", "getpgusername()"),
        ("DELETE FROM users WHERE row_security_active('users')", "row_security_active()"),
        ("UPDATE users SET v = database_to_xmlschema(true, true, '')::text", "database_to_xmlschema()"),
        ("UPDATE users SET v = table_to_xml_and_xmlschema('users', true, true, '')::text", "xmlschema()"),
        ("UPDATE users SET v = shobj_description(1, 'pg_database')", "shobj_description()"),
        ("DELETE FROM users WHERE EXISTS (SELECT FROM pg_group)", "pg_group"),
        ("DELETE FROM users WHERE EXISTS (SELECT FROM pg_catalog.pg_db_role_setting)", "pg_db_role_setting"),
        ("DELETE FROM users WHERE EXISTS (SELECT FROM pg_policies)", "pg_policies"),
        ("UPDATE users SET n = (regclass 'users')::int", "regclass"),
        ("UPDATE users SET n = regclass('users')::int", "regclass"),
        ("UPDATE users SET n = oid '123'", "oid"),
        ("RESET ALL", "puts settings back"),
        ("RESET TimeZone", "puts settings back"),
        ("DISCARD ALL", "puts settings back"),
        ("UPDATE accounts SET at = ('{now}'::timestamptz[])[1]", "reads the time"),
        ("UPDATE accounts SET t = lower('[now,infinity)'::tstzrange)", "reads the time"),
        ("UPDATE accounts SET t = (jsonb_populate_record(NULL::accounts, '{\"paid_until\": \"now\"}')).paid_until", "reads the time"),
        ("ALTER TABLE users ADD COLUMN a boolean DEFAULT ((jsonb_populate_record(NULL::accounts, '{\"paid_until\": \"NoW\"}')).paid_until > '2026-12-03')", "reads the time"),
        ("UPDATE users SET r = '(1,x,today)'::users", "reads the time"),
        ("-- note\rDO $$ BEGIN NULL; EXCEPTION WHEN others THEN NULL; END $$", "DO block"),
        ("UPDATE kv SET v = 'a' -- tidy\rWHERE now() > '2026-01-01'", "now()"),
        ("DROP DATABASE IF EXISTS shop_staging", "acts on the server beyond this database"),
        ("ALTER DATABASE shop CONNECTION LIMIT 0", "acts on the server beyond this database"),
        ("CREATE ROLE reporting", "acts on the server beyond this database"),
        ("ALTER USER app_owner PASSWORD 'x'", "acts on the server beyond this database"),
        ("REASSIGN OWNED BY app_owner TO app_admin", "acts on the server beyond this database"),
        ("COMMENT ON DATABASE shop IS 'x'", "acts on the server beyond this database"),
        ("ALTER SYSTEM SET work_mem = '1GB'", "acts on the server beyond this database"),
        ("SET DateStyle TO DEFAULT", "sets a setting to"),
        ("SET search_path = DEFAULT", "sets a setting to"),
        ("UPDATE users SET at = E'\\164oday'::date", "'today'"),
        ("UPDATE users SET at = E'\\x74oday'::date", "'today'"),
        ("UPDATE users SET at = ('to' || 'day')::date", "'today'"),
        ("UPDATE users SET at = U&'\\0074oday'::date", "'today'"),
        ("ALTER TABLE users ADD COLUMN suspended bool NOT NULL DEFAULT (now() > '2026-08-01')", "now()"),
        ("ALTER TABLE users ADD COLUMN k int DEFAULT CASE WHEN random() > 0.5 THEN 1 ELSE 0 END", "random()"),
        ("UPDATE users SET n = 1 WHERE (SELECT true FROM pg_sleep((SELECT count(*) FROM users) / 1000))", "pg_sleep()"),
        ("ALTER TABLE users ADD COLUMN function int DEFAULT rotate_keys(1)", "rotate_keys()"),
        ("UPDATE users SET at = concat('no', 'w')::timestamptz", "casts text it computes to timestamptz"),
        ("UPDATE users SET at = reverse('won')::timestamptz", "casts text it computes"),
        ("UPDATE users SET at = concat('no', 'w')::text::timestamptz", "casts text it computes to timestamptz"),
        ("UPDATE users SET at = (ARRAY[concat('no', 'w')]::timestamptz[])[1]", "casts text it computes to timestamptz"),
        // Into a row type that holds a time, or a record made of JSON with one.
        ("UPDATE users SET at = (concat('(to', 'day)')::stamped).at", "casts text it computes to stamped"),
        ("UPDATE users SET at = (concat('(to', 'day)')::public.\"stamped\").at", "casts text it computes to stamped"),
        ("UPDATE users SET day = concat('to', 'day')::\"date\"", "casts text it computes to date"),
        ("UPDATE users SET day = CAST(concat('to', 'day') AS pg_catalog.date)", "casts text it computes to date"),
        ("UPDATE users SET day = pg_catalog.date(concat('to', 'day'))", "casts text it computes to date"),
        ("UPDATE users SET r = concat('[no', 'w,)')::tstzrange", "casts text it computes to tstzrange"),
        // Not a column: text made or a value of the server's.
        ("UPDATE users SET day = date(concat('to', 'day'))", "casts text it computes to date"),
        ("UPDATE users SET day = date(created_at || '')", "casts text it computes to date"),
        ("UPDATE users SET day = (current_user)::date", "casts text it computes to date"),
        ("UPDATE users SET day = date(session_user)", "casts text it computes to date"),
        ("UPDATE users SET at = (payload->>concat('t', 's'))::timestamptz", "casts text it computes to timestamptz"),
        ("UPDATE users SET at = (s AT TIME ZONE zone)::date", "casts text it computes to date"),
        ("UPDATE users SET at = CAST(lower(s) AS date)", "casts text it computes to date"),
        // In a definition too; a cast's alias named `cast` hides nothing.
        ("CREATE TABLE days AS SELECT date(concat('to', 'day')) AS d", "casts text it computes to date"),
        ("ALTER TABLE users ALTER COLUMN d TYPE date USING date(concat('to', 'day'))", "casts text it computes to date"),
        ("UPDATE users SET d = CAST((SELECT concat('to', 'day') AS cast) AS date)", "casts text it computes to date"),
        ("UPDATE users SET at = 'today EST'::timestamptz", "'today est'"),
        ("UPDATE users SET at = 'tomorrow Europe/Berlin'::timestamptz", "'tomorrow europe/berlin'"),
        // A zone that is a setting, or a zone given to a time of day.
        ("UPDATE users SET d = (created_at AT TIME ZONE 'localtime')::date", "casts text it computes to date"),
        ("UPDATE users SET d = (created_at AT TIME ZONE 'EST')::date", "casts text it computes to date"),
        ("UPDATE users SET t2 = (created_at AT TIME ZONE 'UTC')::time", "casts text it computes to time"),
        ("UPDATE users SET t2 = CAST(ttz AT TIME ZONE 'America/New_York' AS time)", "casts text it computes to time"),
        ("UPDATE clocked SET t2 = ttz AT TIME ZONE 'America/New_York'", "gives ttz, a time of day, a time zone"),
        ("UPDATE clocked SET t2 = (t AT TIME ZONE 'UTC')::time", "gives t, a time of day, a time zone"),
        ("UPDATE clocked SET t2 = timetz(t)", "gives t, a time of day, a time zone"),
        ("UPDATE clocked SET t2 = c.t::timetz FROM clocked c", "gives t, a time of day, a time zone"),
        ("UPDATE clocked SET t2 = CAST(t AS time with time zone)", "gives t, a time of day, a time zone"),
        ("UPDATE users SET at = (SELECT (c.t)::date FROM (SELECT concat('to', 'day') AS t) c WHERE (now()) IS NOT NULL)", "now()"),
        (
            "UPDATE users SET day = (SELECT d FROM jsonb_to_record(jsonb_build_object('d', concat('to', 'day'))) AS x(d date))",
            "through jsonb_to_record",
        ),
        (
            "INSERT INTO stamped SELECT * FROM jsonb_populate_record(NULL::stamped, jsonb_build_object('at', concat('no', 'w')))",
            "through jsonb_populate_record",
        ),
        ("SELECT * FROM json_to_recordset('[{\"r\": \"[' || 'now,)\"}]') AS x(r tstzrange)", "through json_to_recordset"),
        ("UPDATE users SET d = CAST(translate('xoday', 'x', 't') AS date)", "casts text it computes to date"),
        ("UPDATE users SET d = date(format('%sday', 'to'))", "casts text it computes to date"),
        ("UPDATE users SET d = ('{\"a\": \"now\"}'::jsonb ->> 'a')::date", "casts text it computes to date"),
        ("SELECT * FROM ts_stat('SELECT to_tsvector(current_user)')", "ts_stat()"),
        ("ALTER TABLE users ADD COLUMN flag text DEFAULT now()::text; UPDATE users SET flag = 'x' WHERE id = 1", "writes flag, which the file filled"),
        ("INSERT INTO users SELECT a FROM who", "view who, which read current_setting"),
        ("DELETE FROM users WHERE id IN (SELECT id FROM notes)", "notes, whose row policies read current_user"),
        ("UPDATE notes SET body = 'x'", "writes notes, whose row policies read current_user"),
        ("UPDATE on_update_only SET a = 1", "writes on_update_only, whose triggers or rules run code"),
        ("INSERT INTO on_update_only VALUES (1) ON CONFLICT (a) DO UPDATE SET a = 2", "whose triggers or rules run code"),
        ("MERGE INTO on_update_only t USING users u ON t.a = u.id WHEN MATCHED THEN DELETE", "whose triggers or rules run code"),
        ("CREATE TABLE copy AS SELECT * FROM notes", "notes, whose row policies read current_user"),
        // A sequence read as a table: its position differs where it runs.
        ("INSERT INTO users (v) SELECT last_value FROM public.users_id_seq", "reads sequence users_id_seq as a table"),
        ("CREATE SEQUENCE s2;\nSELECT is_called FROM s2", "reads sequence s2 as a table"),
    ];
    for (sql, said) in cases {
        let got = why(sql);
        assert!(got.iter().any(|w| w.contains(said)), "{sql}: {got:?}");
    }
    // An update carries only through keys that act on update: owned's
    // update reaches no further (child's key acts on delete alone).
    for sql in ["UPDATE owned SET v = 1 WHERE k = 'b'", "UPDATE kv SET v = 'x' WHERE k = 'b'"] {
        let got = why(sql);
        assert!(!got.iter().any(|w| w.contains("carry the write")), "{sql}: {got:?}");
    }
}

/// Why `sql` is opaque against a golden whose functions written in SQL
/// keep their bodies (`bodies`: false leaves them out, as a golden built
/// before they were read).
fn why_with_bodies(sql: &str, bodies: bool) -> Vec<String> {
    let mut catalog: Catalog = serde_json::from_value(serde_json::json!({
        "tables": {
            "public.normed": {"kind": "table", "columns": [], "constraints": {}, "triggers": {},
                              "indexes": {"normed_name": "CREATE INDEX normed_name ON public.normed USING btree (public.norm(name))"}},
            "public.stamped": {"kind": "table", "columns": [], "indexes": {}, "triggers": {},
                               "constraints": {"c": "CHECK ((public.stamp(name) IS NOT NULL))"}}
        },
        "views": {},
        "functions": {"public.norm(text)": "a", "public.stamp(text)": "b", "public.chain(text)": "c",
                      "public.mixed(integer)": "d", "public.mixed(text)": "e",
                      "public.day_of(text)": "f", "public.at_of(jsonb)": "g"},
        "sequences": {}, "types": {}, "extensions": {}
    }))
    .unwrap();
    if bodies {
        catalog.sql_bodies = Some(
            [
                ("public.norm(text)", "SELECT lower($1)"),
                ("public.stamp(text)", "SELECT $1 || now()"),
                ("public.chain(text)", "SELECT norm($1)"),
                ("public.mixed(integer)", "SELECT $1 + 1"),
                // A parameter's name reads like a column's, but its text is the caller's.
                ("public.day_of(text)", "SELECT date(p)"),
                ("public.at_of(jsonb)", "SELECT (p->>'ts')::timestamptz"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        );
    }
    let statements = airlock_postgres::split::split(sql).unwrap();
    opaque(&statements, &catalog).into_iter().map(|o| o.why).collect()
}

#[test]
fn a_golden_function_of_plain_sql_runs_no_code_a_test_could_tell_from_production() {
    for sql in
        ["INSERT INTO normed (name) VALUES ('A')", "SELECT norm('A')", "UPDATE normed SET name = norm(name)"]
    {
        assert_eq!(why_with_bodies(sql, true), Vec::<String>::new(), "{sql}");
        // A golden recorded without the bodies: opaque, as before.
        assert!(!why_with_bodies(sql, false).is_empty(), "{sql}");
    }
    for (sql, said) in [
        // Its body reads the clock.
        ("INSERT INTO stamped (name) VALUES ('A')", "writes stamped, whose defaults, checks or indexes run stamp()"),
        // Its body calls code the database holds.
        ("SELECT chain('a')", "calls chain()"),
        // One of its overloads is not written in SQL.
        ("SELECT mixed(1)", "calls mixed()"),
        // Its body casts a parameter into a time.
        ("SELECT day_of(concat('to', 'day'))", "calls day_of()"),
        ("SELECT at_of(jsonb_build_object('ts', concat('no', 'w')))", "calls at_of()"),
        // Replaced or altered by the file: its code is the file's now.
        (
            "CREATE OR REPLACE FUNCTION norm(t text) RETURNS text LANGUAGE sql AS $$ SELECT t || now() $$;\nINSERT INTO normed (name) VALUES ('A')",
            "writes normed, whose defaults, checks or indexes run norm()",
        ),
        (
            "ALTER FUNCTION norm(text) SET search_path = elsewhere;\nINSERT INTO normed (name) VALUES ('A')",
            "writes normed, whose defaults, checks or indexes run norm()",
        ),
    ] {
        let why = why_with_bodies(sql, true);
        assert!(why.iter().any(|w| w.starts_with(said)), "{sql}: {why:?}");
    }
}

#[test]
fn a_do_block_of_plain_plpgsql_is_what_it_runs() {
    // Plain: its statements and expressions are judged as the file's own.
    for sql in [
        "DO $$ BEGIN UPDATE users SET email = 'x'; END $$",
        "do language plpgsql 'begin null; end'",
        "DO $$ BEGIN NULL; END $$ LANGUAGE plpgsql",
        "DO $$ BEGIN FOR i IN 1..150 LOOP UPDATE users SET score = score + 1 WHERE id = 15000 + i; END LOOP; END $$",
        "DO $$\nDECLARE\n  lo bigint := 0;\n  hi bigint;\n  n int DEFAULT 2000;\nBEGIN\n  SELECT max(id) INTO STRICT hi FROM users;\n\
           WHILE lo < hi LOOP\n    UPDATE users SET email = lower(email) WHERE id > lo AND id <= lo + n;\n    lo := lo + n;\n  END LOOP;\n\
           IF hi > 10 THEN RAISE NOTICE 'done % rows', hi; ELSIF hi = 0 THEN RETURN; ELSE NULL; END IF;\nEND $$;",
        "DO $$ DECLARE r record; n int; BEGIN FOR r IN SELECT id FROM users LOOP PERFORM r.id; END LOOP;\n\
           FOR i IN REVERSE 10 .. 1 BY 2 LOOP INSERT INTO users VALUES (i); EXIT WHEN i < 3; END LOOP;\n\
           GET DIAGNOSTICS n = ROW_COUNT; BEGIN DELETE FROM users WHERE k = n; END; END $$",
        // Labels, ELSEIF, FOREACH, ASSERT, RAISE ... USING, GET DIAGNOSTICS with := and a query in parentheses.
        "DO $$ <<outer>> DECLARE n int; ids int[] := ARRAY[1, 2]; i int; BEGIN\n\
           <<rows>> FOR i IN (SELECT id FROM users ORDER BY id) LOOP EXIT rows WHEN i > 10; CONTINUE rows; END LOOP rows;\n\
           FOREACH i IN ARRAY ids LOOP DELETE FROM users WHERE id = i; END LOOP;\n\
           GET CURRENT DIAGNOSTICS n := ROW_COUNT;\n\
           IF n > 1 THEN NULL; ELSEIF n = 1 THEN RAISE NOTICE 'one' USING HINT = 'h', DETAIL := 'd'; END IF;\n\
           <<inner>> BEGIN RAISE EXCEPTION USING MESSAGE = 'x', ERRCODE = 'P0001'; END inner; RAISE unique_violation;\n\
           RAISE SQLSTATE '22012'; EXIT outer; END outer $$",
        // Columns and constants cast into times, and a variable into an interval or text.
        "DO $$ DECLARE n int := 3; BEGIN UPDATE users SET day = created_at::date, at = (n || ' days')::interval + created_at\n\
           WHERE created_at < '2020-01-01'::date AND CAST(created_at AS date) > '2019-01-01' AND n::text <> ''; END $$",
    ] {
        assert_eq!(why(sql), Vec::<String>::new(), "{sql}");
    }
    // What it runs is judged: the clock, a catalog, a function the database holds, a trigger.
    for (sql, said) in [
        ("DO $$ DECLARE t text := now()::text; BEGIN NULL; END $$", "now()"),
        ("DO $$ DECLARE s regnamespace := 'pg_airlock_probe'; BEGIN NULL; END $$", "DO block (code"),
        (
            "DO $$ BEGIN IF EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = 'p') THEN DELETE FROM users; END IF; END $$",
            "pg_namespace",
        ),
        ("DO $$ BEGIN RAISE NOTICE '%', current_user; END $$", "CURRENT_USER"),
        ("DO $$ BEGIN FOR i IN 1 .. rotate_keys(1) LOOP NULL; END LOOP; END $$", "rotate_keys"),
        ("DO $$ BEGIN UPDATE audited SET a = 1; END $$", "trigger"),
        ("DO $$ DECLARE n int; BEGIN SELECT count(*) INTO n FROM users WHERE random() < 0.5; END $$", "random()"),
        ("DO $$ BEGIN RAISE NOTICE 'x' USING DETAIL = now()::text; END $$", "now()"),
        (
            "DO $$ DECLARE s text; BEGIN FOREACH s IN ARRAY (SELECT array_agg(nspname::text) FROM pg_catalog.pg_namespace) LOOP NULL; END LOOP; END $$",
            "pg_namespace",
        ),
        (
            "DO $$ DECLARE r record; BEGIN FOR r IN (SELECT nspname FROM pg_catalog.pg_namespace) LOOP DELETE FROM users; END LOOP; END $$",
            "pg_namespace",
        ),
        ("DO $$ BEGIN <<l>> LOOP EXIT l WHEN clock_timestamp() > '2030-01-01'; END LOOP l; END $$", "clock_timestamp"),
    ] {
        let found = why(sql);
        assert!(found.iter().any(|w| w.contains(said)), "{sql}: {found:?}");
    }
    // A block that commits as it goes is code a person reads: what it
    // commits is checked only after it is kept.
    let found = why(
        "DO $$ DECLARE lo int := 0; BEGIN WHILE lo < 10 LOOP UPDATE users SET email = 'x' WHERE id = lo; COMMIT; lo := lo + 1; END LOOP; END $$",
    );
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("a DO block that commits as it goes"), "{found:?}");
    // Run outside a transaction block as the runner decides it (the word
    // anywhere in it), it is judged so too.
    let found = why("DO $$ BEGIN RAISE NOTICE 'nothing to commit'; END $$");
    assert!(found.iter().any(|w| w.contains("a DO block that commits as it goes")), "{found:?}");
    // Anything past plain PL/pgSQL leaves the block opaque as a whole.
    for sql in [
        "DO $$ BEGIN EXECUTE format('UPDATE %I SET a = 1', 'users'); END $$",
        "DO $$ DECLARE c CURSOR FOR SELECT 1; BEGIN OPEN c; END $$",
        "DO $$ BEGIN CASE WHEN true THEN NULL; END CASE; END $$",
        "DO $$ BEGIN GET STACKED DIAGNOSTICS n = MESSAGE_TEXT; END $$",
        "DO $$ BEGIN GET DIAGNOSTICS n = PG_CONTEXT; END $$",
        "DO $$ BEGIN RAISE NOTICE 'x' USING SOMETHING = 1; END $$",
        "DO $$ BEGIN EXIT (SELECT 1); END $$",
        "DO $$ DECLARE r record; BEGIN FOR r IN (SELECT 1) UNION (SELECT 2) LOOP NULL; END LOOP; END $$",
        "DO $$ BEGIN CALL p(); END $$",
        "DO $$ BEGIN SET search_path = x; END $$",
        "DO $$ BEGIN ALTER TABLE users ADD COLUMN a int; END $$",
        "DO LANGUAGE plperl $$ 1 $$",
        // ASSERT runs only where plpgsql.check_asserts is on: a row count it
        // sets (or a sequence it moves) differs where asserts are off.
        "DO $$ DECLARE n int; BEGIN ASSERT (SELECT true); GET DIAGNOSTICS n = ROW_COUNT; DELETE FROM users WHERE id % 2 = n; END $$",
        // Variables whose text is read by the clock's rules: of a time type
        // however spelt, a range of them, a type of the database's own.
        "DO $$ DECLARE d \"date\"; BEGIN d := concat('to', 'day'); UPDATE users SET day = d; END $$",
        "DO $$ DECLARE d _date; BEGIN d := concat('{to', 'day}'); END $$",
        "DO $$ DECLARE r tstzrange; BEGIN r := concat('[no', 'w,)'); END $$",
        "DO $$ DECLARE u users; BEGIN u := concat('(1,x,,to', 'day)'); END $$",
        // A variable's computed text cast into a time, however the cast is written.
        "DO $$ DECLARE s text := concat('no', 'w'); BEGIN UPDATE users SET at = s::timestamptz; END $$",
        "DO $$ DECLARE s text; BEGIN FOREACH s IN ARRAY ARRAY[concat('to', 'day')] LOOP UPDATE users SET day = s::pg_catalog.date; END LOOP; END $$",
        "DO $$ DECLARE s text; BEGIN SELECT concat('no', 'w') INTO s; UPDATE users SET at = CAST(s AS timestamptz); END $$",
        "DO $$ DECLARE s text := 'x'; BEGIN UPDATE users SET day = date(s); END $$",
        "DO $$ DECLARE v text := concat('(yester', 'day)'); BEGIN UPDATE users SET at = (v::stamped).at; END $$",
        "DO $$ DECLARE r record; BEGIN FOR r IN SELECT concat('to', 'day') AS t LOOP UPDATE users SET day = r.t::date; END LOOP; END $$",
        "DO $$ DECLARE v text := concat('to', 'day'); BEGIN UPDATE users SET day = (v || '')::text::\"date\"; END $$",
        // Quoted, a variable is the same variable.
        "DO $$ DECLARE v text := concat('no','w'); BEGIN UPDATE users SET at = CAST(\"v\" AS timestamptz); END $$",
        "DO $$ DECLARE v text := concat('no','w'); BEGIN UPDATE users SET d = date(\"v\"); END $$",
        "DO $$ DECLARE j jsonb := jsonb_build_object('ts', concat('no','w')); BEGIN UPDATE users SET at = (\"j\"->>'ts')::timestamptz; END $$",
        "DO $$ DECLARE r record; BEGIN FOR r IN SELECT concat('no','w') AS t LOOP UPDATE users SET at = (\"r\".t)::timestamptz; END LOOP; END $$",
        "DO $$ <<b>> DECLARE v text := concat('no','w'); BEGIN UPDATE users SET d = date(\"b\".\"v\"); END $$",
        "DO $$ DECLARE \"V\" text := concat('no','w'); BEGIN UPDATE users SET d = date(\"V\"); END $$",
        "DO $$ BEGIN NULL; $$",
    ] {
        let found = why(sql);
        assert!(found.iter().any(|w| w.contains("a DO block (code")), "{sql}: {found:?}");
    }
}

#[test]
fn do_blocks_that_tell_the_test_apart_another_way_are_opaque() {
    // Each inserts one row here and another on production.
    let payload = "INSERT INTO users (email) VALUES (who);";
    for (sql, why_said) in [
        // A named argument's := in a declaration's default.
        (
            format!(
                "DO $$ DECLARE live boolean DEFAULT pg_catalog.to_regnamespace('p') IS NULL AND make_interval(days := 0) IS NOT NULL;\n\
                 who text := 'a'; BEGIN IF live THEN who := 'b'; END IF; {payload} END $$;"
            ),
            "to_regnamespace",
        ),
        // Dollar quotes whose tags differ only in case, or are not letters.
        (
            format!(
                "DO $do$ DECLARE who text := 'a'; BEGIN PERFORM $X$ $x$ $X$;\n\
                 IF to_regnamespace('p') IS NULL THEN who := 'b'; END IF; PERFORM $x$ $X$ $x$; {payload} END $do$;"
            ),
            "to_regnamespace",
        ),
        (
            format!(
                "DO $do$ DECLARE who text := 'a'; BEGIN PERFORM $€$'$€$;\n\
                 IF to_regnamespace($n$p$n$) IS NULL THEN who := 'b'; END IF; PERFORM $€$'$€$; {payload} END $do$;"
            ),
            "to_regnamespace",
        ),
        // Strings read another way once standard_conforming_strings is off.
        ("SELECT set_config('standard_conforming_strings', 'off', true)".to_owned(), "standard_conforming_strings"),
        // A setting put back to the target's own, through set_config.
        (
            format!(
                "DO $$ DECLARE who text := 'a'; BEGIN IF set_config('application_name', NULL, true) IS DISTINCT FROM 'x' THEN who := 'b'; END IF; {payload} END $$;"
            ),
            "set_config",
        ),
        // Text assigned to a date variable, read by the clock's rules.
        (
            format!("DO $$ DECLARE d date; who text := 'a'; BEGIN d := concat('to', 'day'); {payload} END $$;"),
            "DO block (code",
        ),
        // 'today' spelt with an escape character of its own.
        ("UPDATE users SET email = U&'!0074oday' UESCAPE '!'".to_owned(), "UESCAPE"),
        // A variable of a catalog column's type.
        (
            format!("DO $$ DECLARE f pg_type.typinput%TYPE := 'seed'; who text := 'a'; BEGIN {payload} END $$;"),
            "DO block (code",
        ),
        // Privileges written out with the bootstrap superuser's name.
        (
            format!(
                "DO $$ DECLARE who text := 'a'; BEGIN IF strpos(acldefault('r', 10)::text, 'airlock') = 0 THEN who := 'b'; END IF; {payload} END $$;"
            ),
            "acldefault",
        ),
    ] {
        let found = why(&sql);
        assert!(found.iter().any(|w| w.contains(why_said)), "{sql}: {found:?}");
    }
    // The lexer's own settings set to what it reads by, and a plain setting, are not code.
    assert_eq!(why("SELECT set_config('standard_conforming_strings', 'on', false)"), Vec::<String>::new());
}
