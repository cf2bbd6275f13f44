//! The daemon's own work on what the agent planted: admin sessions reading the
//! catalog and counting rows, the migration probe, promotion. An agent that
//! shadows catalog names, races the admin's reads or plants settings must never
//! get code to run as the admin, forge what the daemon reports, or hide objects.

use std::time::Duration;

use serde_json::json;

use super::Scene;
use crate::harness::{dsn, psql, sql};

/// Functions, an aggregate, an operator and tables named like PostgreSQL's own,
/// each of which records who ran it and tries to make the agent a superuser.
const PLANT: &str = "
    CREATE TABLE public.pwned (who text, at timestamptz DEFAULT now());
    GRANT INSERT ON public.pwned TO PUBLIC;
    CREATE FUNCTION public.escalate() RETURNS bigint LANGUAGE plpgsql AS $f$
    BEGIN
      INSERT INTO public.pwned (who) VALUES (current_user);
      BEGIN EXECUTE 'ALTER ROLE airlock_agent SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
      RETURN 0;
    END $f$;
    CREATE FUNCTION public.json_build_object(VARIADIC text[]) RETURNS json LANGUAGE sql AS 'SELECT public.escalate()::text::json';
    CREATE FUNCTION public.json_agg(anyelement) RETURNS json LANGUAGE sql AS 'SELECT public.escalate()::text::json';
    CREATE FUNCTION public.format_type(oid, integer) RETURNS text LANGUAGE sql AS 'SELECT public.escalate()::text';
    CREATE FUNCTION public.pg_get_viewdef(oid) RETURNS text LANGUAGE sql AS 'SELECT public.escalate()::text';
    CREATE FUNCTION public.pg_backend_pid() RETURNS integer LANGUAGE sql AS 'SELECT public.escalate()::int';
    CREATE FUNCTION public.lower(character varying) RETURNS text LANGUAGE sql AS 'SELECT public.escalate()::text';
    CREATE FUNCTION public.count_any(bigint) RETURNS bigint LANGUAGE sql AS 'SELECT public.escalate()';
    CREATE AGGREGATE public.count(*) (SFUNC = public.count_any, STYPE = bigint, INITCOND = 0);
    CREATE FUNCTION public.int_eq(integer, integer) RETURNS boolean LANGUAGE sql AS 'SELECT public.escalate() = 0';
    CREATE OPERATOR public.= (LEFTARG = integer, RIGHTARG = integer, FUNCTION = public.int_eq);
    CREATE TABLE public.pg_class (oid oid, relname name, relkind \"char\", relnamespace oid);
    CREATE TABLE public.pg_stat_activity (pid int, state text);
    CREATE VIEW public.pg_locks AS SELECT public.escalate() AS pid;";

/// Nothing planted ran as anyone but the agent.
fn nothing_ran_as_the_admin(s: &Scene) {
    let who = sql(&s.agent, "SELECT coalesce(string_agg(DISTINCT who, ','), '') FROM public.pwned");
    assert!(!who.contains("airlock_admin") && !who.contains("airlock_reader"), "planted code ran as {who}");
}

#[test]
fn shadowing_objects_never_run_in_the_daemons_sessions() {
    let s = Scene::new();
    sql(&s.agent, PLANT);
    // Every admin path that reads this sandbox: the schema tools, the idle check
    // (through suspend's count of sessions), a suspend and wake, a branch.
    let described = s.tool("describe_schema", json!({}));
    assert!(described["text"].as_str().unwrap().contains("pwned"), "{described}");
    let changes = s.tool("changes_since_fork", json!({}));
    assert!(changes["text"].as_str().unwrap().contains("pwned"), "{changes}");
    let run = s.tool("run_sql", json!({"sql": "SELECT 1 AS one"}));
    assert_eq!(run["result"]["rows"][0][0], 1, "{run}");
    s.d.ok(&["suspend", &s.id]);
    s.d.ok(&["wake", &s.id]);
    let branch = s.d.json(&["branch", &s.id]);
    assert_eq!(sql(&dsn(&branch), "SELECT count(*) FROM public.pwned WHERE who <> 'airlock_agent'"), "0");
    nothing_ran_as_the_admin(&s);
    s.untouched();
}

#[test]
fn a_table_turned_into_a_view_while_being_counted_runs_nothing_as_the_admin() {
    let s = Scene::new();
    sql(
        &s.agent,
        "CREATE TABLE public.aaa (i int); CREATE TABLE public.zzz (x bigint);
         CREATE TABLE public.pwned (who text); GRANT INSERT ON public.pwned TO PUBLIC;
         CREATE FUNCTION public.pwn() RETURNS bigint LANGUAGE plpgsql SET search_path = public AS $f$
         BEGIN
           INSERT INTO pwned VALUES (current_user);
           BEGIN EXECUTE 'ALTER ROLE airlock_agent SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
           RETURN 1;
         END $f$;",
    );
    // The catalog is read while `aaa` is locked; `zzz` becomes a view before it
    // is counted. Tried through both tools, with the swap landing at a few moments.
    for (round, tool) in ["describe_schema", "changes_since_fork", "describe_schema"].iter().enumerate() {
        let swap = format!(
            "BEGIN; LOCK public.aaa IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(0.{}); \
             CREATE RULE \"_RETURN\" AS ON SELECT TO public.zzz DO INSTEAD SELECT public.pwn() AS x; COMMIT",
            3 + round * 3
        );
        let swapper = crate::harness::spawn_psql(&s.agent, &swap);
        std::thread::sleep(Duration::from_millis(100));
        let _ = s.tool(tool, json!({}));
        let _ = swapper.wait_with_output();
        sql(&s.agent, "DROP VIEW public.zzz; CREATE TABLE public.zzz (x bigint)");
    }
    nothing_ran_as_the_admin(&s);
    s.untouched();
}

#[test]
fn a_view_renamed_into_a_counted_tables_place_runs_nothing_as_the_reader() {
    let s = Scene::new();
    sql(
        &s.agent,
        "CREATE TABLE public.bait (a int); INSERT INTO public.bait VALUES (1);
         CREATE TABLE public.pwned (who text); GRANT INSERT ON public.pwned TO PUBLIC;
         CREATE FUNCTION public.as_reader() RETURNS boolean LANGUAGE plpgsql SET search_path = public AS $f$
         BEGIN INSERT INTO pwned VALUES (current_user); RETURN true; END $f$;
         CREATE VIEW public.bait_v AS SELECT 1 AS a FROM generate_series(1, 7) WHERE public.as_reader();",
    );
    // The table is held until the daemon's count waits on it; then the view
    // takes its name, so the count's second lookup of the name finds the view.
    let swap = "BEGIN; LOCK public.bait IN ACCESS EXCLUSIVE MODE;
        DO $d$ BEGIN
          FOR i IN 1..1000 LOOP
            EXIT WHEN EXISTS (SELECT 1 FROM pg_locks WHERE relation = 'public.bait'::regclass AND NOT granted);
            PERFORM pg_sleep(0.01);
          END LOOP;
        END $d$;
        ALTER TABLE public.bait RENAME TO bait_old; ALTER VIEW public.bait_v RENAME TO bait; COMMIT";
    let swapper = crate::harness::spawn_psql(&s.agent, swap);
    let held = "SELECT count(*) FROM pg_locks WHERE relation = 'public.bait'::regclass AND granted AND mode = 'AccessExclusiveLock'";
    s.d.wait_for(Duration::from_secs(10), "the table to be held", || sql(&s.agent, held) == "1");
    let changes = s.tool("changes_since_fork", json!({}));
    let swapped = swapper.wait_with_output().unwrap();
    assert!(swapped.status.success(), "{}", String::from_utf8_lossy(&swapped.stderr));
    assert_eq!(sql(&s.agent, "SELECT to_regclass('public.bait_old') IS NOT NULL"), "t", "the swap happened");
    nothing_ran_as_the_admin(&s);
    let text = changes["text"].as_str().unwrap();
    assert!(!text.contains("-> 7 rows"), "the view's rows were not counted as the table's: {text}");
    s.untouched();
}

#[test]
fn a_schema_named_like_airlocks_own_hides_nothing() {
    let s = Scene::new();
    sql(&s.agent, "CREATE SCHEMA airlock_probe; CREATE TABLE airlock_probe.hidden (secret text)");
    let text = s.tool("describe_schema", json!({}))["text"].as_str().unwrap().to_owned();
    assert!(text.contains("airlock_probe.hidden"), "{text}");
    let changes = s.tool("changes_since_fork", json!({}))["text"].as_str().unwrap().to_owned();
    assert!(changes.contains("airlock_probe.hidden"), "{changes}");
    s.untouched();
}

#[test]
fn a_candidate_cannot_forge_what_its_migration_test_reports() {
    let s = Scene::new();
    // Shadow what a reading might use, in the candidate's own session and
    // search path, with a temporary pg_class for good measure; then delete
    // every row.
    let candidate = "SET search_path = public, pg_catalog;
        CREATE FUNCTION public.json_build_object(VARIADIC text[]) RETURNS json LANGUAGE sql AS $$ SELECT '{}'::json $$;
        CREATE FUNCTION public.json_agg(anyelement) RETURNS json LANGUAGE sql AS $$ SELECT '[]'::json $$;
        CREATE TEMP TABLE pg_class (oid oid, relname name, relkind \"char\", relnamespace oid, relfilenode oid);
        DELETE FROM orders;";
    let out = s.tool("test_migration", json!({"sql": candidate}));
    let report = &out["result"];
    let candidate = &report["candidates"][0];
    let deleted: i64 = candidate["statements"]
        .as_array()
        .unwrap_or_else(|| panic!("no report of the candidate's statements: {out}\n{}", s.d.log()))
        .iter()
        .flat_map(|st| st["rows"].as_array().cloned().unwrap_or_default())
        .filter(|r| r["table"] == "public.orders")
        .map(|r| r["deleted"].as_i64().unwrap_or(0))
        .sum();
    assert_eq!(deleted, 1000, "the report hides the deletes: {candidate}");
    let kinds: Vec<&str> =
        candidate["hazards"].as_array().unwrap().iter().map(|h| h["kind"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"shadows_catalog"), "{kinds:?}");
    assert_eq!(report["passed"], false);
    s.untouched();
}

#[test]
fn promotion_refuses_planted_objects_unless_told_and_then_lists_them() {
    let s = Scene::new();
    sql(
        &s.agent,
        "CREATE FUNCTION public.lower(character varying) RETURNS text LANGUAGE sql AS 'SELECT ''planted''';",
    );
    let (exit, err) = s.d.fails(&["promote", &s.id, "--golden", "planted"]);
    assert_eq!((exit, err["code"].as_str()), (10, Some("promotion_refused")), "{err}");
    assert!(err["message"].as_str().unwrap().contains("public.lower(character varying)"), "{err}");
    assert!(s.d.fails(&["golden", "show", "planted"]).1["code"] == "golden_not_found", "nothing half-made");
    let golden = s.d.json(&["promote", &s.id, "--golden", "planted", "--allow-planted"]);
    let planted = &golden["generations"][0]["planted"];
    assert!(planted.to_string().contains("public.lower(character varying)"), "{golden}");
    s.untouched();
}

#[test]
fn the_probe_cannot_be_imitated_or_reached_by_the_candidate() {
    let s = Scene::new();
    // A candidate that tries to write the probe's logs, replace its reading, or
    // turn its event triggers off gets PostgreSQL's refusals, and the report
    // still shows the rewrite it did.
    let candidate = "ALTER TABLE orders ALTER COLUMN total TYPE text;";
    let tries = [
        "INSERT INTO pg_airlock_probe.rewrites (relid, relname, reason) VALUES (1, 'x', 0)",
        "CREATE OR REPLACE FUNCTION pg_airlock_probe.reading(bigint, bigint, boolean) RETURNS text LANGUAGE sql AS $$ SELECT '{}' $$",
        "ALTER EVENT TRIGGER airlock_probe_rewrite DISABLE",
        "DROP SCHEMA pg_airlock_probe CASCADE",
    ];
    for attempt in tries {
        let sql_text = format!("{attempt}; {candidate}");
        let report = &s.tool("test_migration", json!({"sql": sql_text}))["result"];
        let failure =
            report["candidates"][0]["failure"]["error"]["message"].as_str().unwrap_or("").to_owned();
        assert!(
            failure.contains("permission denied")
                || failure.contains("must be owner")
                || failure.contains("superuser"),
            "{attempt}: {report}"
        );
    }
    let report = &s.tool("test_migration", json!({"sql": candidate}))["result"];
    let kinds: Vec<&str> = report["candidates"][0]["hazards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["kind"].as_str().unwrap())
        .collect();
    assert!(kinds.contains(&"table_rewrite"), "{report}");
    assert!(psql(&s.agent, "SELECT 1").is_ok());
    s.untouched();
}

#[test]
fn a_comment_cannot_hide_statements_from_a_migration_report() {
    let s = Scene::new();
    // For PostgreSQL the first statement is `SELECT 1 atomic`; a splitter that
    // read `begin` in the comment as a token would send the rest as one blob.
    let candidate = "SELECT 1 -- begin\natomic;\nBEGIN; LOCK TABLE orders IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(1.5); COMMIT;\nSELECT 1 AS \"end\";";
    let report = &s.tool("test_migration", json!({"sql": candidate}))["result"];
    let c = &report["candidates"][0];
    assert!(c["statements"].as_array().unwrap().len() >= 5, "{c}");
    let kinds: Vec<&str> =
        c["hazards"].as_array().unwrap().iter().map(|h| h["kind"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"long_lock"), "{kinds:?}");
    s.untouched();
}

/// A promotion's VACUUM and ANALYZE run the agent's index expressions and the
/// schema hash's pg_dump reads what it made: in a session of the owner role,
/// logged in as itself, never a superuser's (where security-restricted
/// operation would be all that stood in the way). An expression that fails
/// whenever its session is a superuser's lets the promotion through.
#[test]
fn a_promotions_own_work_runs_no_agent_code_in_a_superusers_session() {
    let s = Scene::new();
    sql(
        &s.agent,
        "CREATE FUNCTION watch(int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$
         BEGIN
           IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = session_user) THEN
             RAISE EXCEPTION 'ran in a superuser session (%)', session_user;
           END IF;
           RETURN $1;
         END $$;
         CREATE TABLE watched (n int); INSERT INTO watched SELECT generate_series(1, 100);
         CREATE INDEX ON watched ((watch(n)));",
    );
    let out = s.d.cli(&["promote", &s.id, "--golden", "watched", "--json"]);
    assert_eq!(out.code, 0, "{out:?}");
    let fork = crate::harness::dsn(&s.d.fork("watched", &[]));
    assert_eq!(sql(&fork, "SELECT count(*) FROM watched WHERE watch(n) > 0"), "100");
    s.untouched();
}

/// A function the agent marks immutable runs wherever the planner folds it:
/// in a partial index's predicate, an index expression, a statistics object.
/// Reading a table plans it, so the daemon's reads of what a candidate (or
/// the agent) shaped — a migration test's images of rows, the counts of
/// `describe_schema` and `changes_since_fork` — run it, as whoever reads.
/// None of those may be a superuser.
#[test]
fn functions_the_planner_folds_never_run_as_a_superuser() {
    let s = Scene::new();
    let plant = "
        CREATE SEQUENCE public.leak;
        GRANT UPDATE, SELECT ON public.leak TO PUBLIC;
        CREATE FUNCTION public.climb() RETURNS int LANGUAGE plpgsql VOLATILE AS $f$
        BEGIN
          -- Reading what the agent may not (role verifiers): said in a
          -- sequence, which no rollback undoes.
          IF pg_catalog.has_table_privilege('pg_catalog.pg_authid', 'SELECT') THEN
            PERFORM pg_catalog.setval('public.leak', 42);
          END IF;
          IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
            EXECUTE 'ALTER ROLE airlock_agent SUPERUSER';
            RAISE EXCEPTION '% as %', 'CLIMBED-' || 'TO-SUPERUSER', current_user;
          END IF;
          RETURN 1;
        END $f$;
        CREATE FUNCTION public.folded() RETURNS int LANGUAGE sql IMMUTABLE AS $f$ SELECT public.climb() $f$;
        CREATE FUNCTION public.folded(x bigint) RETURNS bigint LANGUAGE sql IMMUTABLE AS $f$ SELECT x + public.climb() $f$;";
    let candidate = format!(
        "{plant}
        CREATE INDEX bait_partial ON public.orders (id) WHERE public.folded() = 1;
        CREATE INDEX bait_expression ON public.orders (public.folded(id::bigint));
        CREATE STATISTICS bait_stats ON (public.folded(id::bigint)), id FROM public.orders;
        UPDATE public.orders SET id = id WHERE id = 1;
        -- A sequence behind the ids a table holds: the report reads the
        -- column's values past its next one.
        CREATE TABLE public.baited (id int PRIMARY KEY);
        INSERT INTO public.baited SELECT pg_catalog.generate_series(1, 100);
        CREATE INDEX bait_sequenced ON public.baited (id) WHERE public.folded() = 1;
        CREATE SEQUENCE public.bait_ids OWNED BY public.baited.id;"
    );
    let tested = s.tool("test_migration", json!({ "sql": candidate }));
    assert!(!tested.to_string().contains("CLIMBED-TO-SUPERUSER"), "{tested}");
    assert!(tested["result"].is_object(), "the test answered: {tested}");
    assert!(tested.to_string().contains("sequence_behind"), "the sequence's column was read: {tested}");
    // The same planted in the agent's own sandbox, read by the catalog tools.
    sql(
        &s.agent,
        &format!(
            "{plant}
            CREATE TABLE public.bait (a bigint);
            INSERT INTO public.bait VALUES (1);
            CREATE INDEX ON public.bait (a) WHERE public.folded() = 1;
            CREATE INDEX ON public.bait (public.folded(a));
            CREATE STATISTICS bait_stats ON (public.folded(a)), a FROM public.bait;"
        ),
    );
    for tool in ["describe_schema", "changes_since_fork"] {
        let out = s.tool(tool, json!({}));
        assert!(!out.to_string().contains("CLIMBED-TO-SUPERUSER"), "{tool}: {out}");
        assert!(out["text"].as_str().is_some_and(|t| t.contains("bait")), "{tool} read the table: {out}");
    }
    assert_ne!(
        sql(&s.agent, "SELECT last_value FROM public.leak"),
        "42",
        "the reader read more than the agent may"
    );
    // The same in a database the agent created and owns, which the catalog
    // tools read too.
    sql(&s.agent, "CREATE DATABASE baited");
    let baited = s.agent.replacen(&format!("/{}?", s.id), &format!("/{}/baited?", s.id), 1);
    sql(
        &baited,
        &format!(
            "{plant}
            CREATE TABLE public.bait (a bigint);
            INSERT INTO public.bait VALUES (1);
            CREATE INDEX ON public.bait (a) WHERE public.folded() = 1;
            CREATE INDEX ON public.bait (public.folded(a));
            CREATE STATISTICS bait_stats ON (public.folded(a)), a FROM public.bait;"
        ),
    );
    for (tool, args) in
        [("describe_schema", json!({"database": "baited"})), ("changes_since_fork", json!({}))]
    {
        let out = s.tool(tool, args);
        assert!(!out.to_string().contains("CLIMBED-TO-SUPERUSER"), "{tool}: {out}");
        assert!(out.to_string().contains("bait"), "{tool} read the table: {out}");
    }
    assert_ne!(
        sql(&baited, "SELECT last_value FROM public.leak"),
        "42",
        "the reader read more than the agent may"
    );
    s.untouched();
}
