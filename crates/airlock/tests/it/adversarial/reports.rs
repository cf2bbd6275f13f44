//! What the daemon reports about a sandbox: `describe_schema` and
//! `changes_since_fork` are how a harness (or a reviewer) learns what an agent
//! did, so an agent that wants its work to go unnoticed attacks them. Row
//! security policies must not decide what is counted, every kind of catalog
//! entry the agent can make must show up as a change, and counters wiped by a
//! crash the agent caused must be reported as wiped, not as "unchanged".

use serde_json::{json, Value};

use super::Scene;
use crate::harness::{psql, sql, Daemon};

fn changes(s: &Scene) -> String {
    let out = s.tool("changes_since_fork", json!({}));
    out["text"].as_str().unwrap_or_else(|| panic!("{out}")).to_owned()
}

#[test]
fn row_security_cannot_hide_rows_from_the_count() {
    let s = Scene::new();
    sql(
        &s.agent,
        "ALTER TABLE orders ENABLE ROW LEVEL SECURITY; ALTER TABLE orders FORCE ROW LEVEL SECURITY;
         CREATE POLICY hide ON orders USING (current_user NOT IN ('airlock_reader', 'airlock_admin'));
         DELETE FROM orders WHERE id <= 10",
    );
    let described = s.tool("describe_schema", json!({}))["text"].as_str().unwrap().to_owned();
    assert!(described.contains("orders (table, 990 rows)"), "{described}");
    let text = changes(&s);
    assert!(text.contains("orders: 1000 -> 990 rows"), "{text}");
    assert!(text.contains("+ policy hide on table orders"), "{text}");
    assert!(text.contains("row security forced"), "{text}");
    s.untouched();
}

/// The golden for the catalog-entry test: a trigger, a sequence, a function.
fn richer(d: &Daemon) {
    d.golden(
        "rich",
        "CREATE TABLE items (id serial PRIMARY KEY, name text, price int);
         CREATE FUNCTION touch() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;
         CREATE TRIGGER items_touch BEFORE UPDATE ON items FOR EACH ROW EXECUTE FUNCTION touch();
         CREATE TABLE audit (at timestamptz);",
        "INSERT INTO items (name, price) SELECT 'item ' || g, g FROM generate_series(1, 100) g;",
    );
}

#[test]
fn every_kind_of_catalog_entry_the_agent_makes_is_a_change() {
    let d = Daemon::start(&[]);
    richer(&d);
    let owner = d.fork("rich", &[]);
    let readonly = d.fork("rich", &["--mode", "readonly"]);
    // Nothing done, nothing reported: neither the daemon's own grants to a
    // read-only credential nor its counting functions are the agent's changes.
    for sb in [&owner, &readonly] {
        let out = d.api(
            "POST",
            &format!("/v1/sandboxes/{}/tools/changes_since_fork", sb["id"].as_str().unwrap()),
            "{}",
        );
        let v: Value = serde_json::from_str(&out.1).unwrap();
        assert_eq!(
            (&v["result"]["schema_changes"], &v["result"]["row_changes"]),
            (&json!([]), &json!([])),
            "{v}"
        );
        assert!(v["result"].get("caveats").is_none(), "{v}");
    }
    let agent = crate::harness::dsn(&owner);
    let attempts = [
        ("CREATE RULE swallow AS ON INSERT TO items DO INSTEAD NOTHING", "+ rule swallow on table items"),
        ("CREATE POLICY p ON audit USING (false)", "+ policy p on table audit"),
        ("ALTER TABLE audit ENABLE ROW LEVEL SECURITY", "row security on"),
        ("GRANT ALL ON items TO PUBLIC", "grants =arwdDxt/"),
        ("ALTER TABLE items SET (fillfactor = 50)", "options fillfactor=50"),
        (
            "ALTER TABLE items DISABLE TRIGGER items_touch",
            "state of trigger items_touch on table items: enabled -> disabled",
        ),
        ("ALTER SEQUENCE items_id_seq INCREMENT BY 7", "increment 7"),
        ("ALTER TABLE items ALTER COLUMN name SET STATISTICS 500", "statistics 500"),
        ("CREATE STATISTICS items_stats ON name, price FROM items", "+ statistics object items_stats"),
        ("COMMENT ON TABLE items IS 'nothing to see'", "+ comment on table items nothing to see"),
        ("CREATE TABLE child () INHERITS (audit)", "+ parents of table child public.audit"),
        ("REVOKE EXECUTE ON FUNCTION touch() FROM PUBLIC", "~ properties of function touch(): grants =X/"),
        (
            "CREATE TYPE money2 AS (units int, cents int)",
            "+ type money2 composite (units integer, cents integer)",
        ),
        (
            "CREATE FUNCTION m2(int) RETURNS money2 LANGUAGE sql AS 'SELECT ($1, 0)::money2';
             CREATE CAST (int AS money2) WITH FUNCTION m2(int)",
            "+ cast from integer to money2",
        ),
        (
            "CREATE FUNCTION same(int, int) RETURNS boolean LANGUAGE sql AS 'SELECT true';
             CREATE OPERATOR === (LEFTARG = int, RIGHTARG = int, FUNCTION = same)",
            "+ operator ===(integer,integer)",
        ),
        ("CREATE SCHEMA side", "+ schema side"),
        ("ALTER DEFAULT PRIVILEGES GRANT SELECT ON TABLES TO PUBLIC", "+ default privileges"),
        ("SELECT lo_from_bytea(77, 'x')", "+ large object 77"),
        ("CREATE PUBLICATION everything FOR TABLE items", "+ publication everything"),
    ];
    for (attempt, _) in &attempts {
        psql(&agent, attempt).unwrap_or_else(|e| panic!("{attempt}: {e}"));
    }
    let out = d.api(
        "POST",
        &format!("/v1/sandboxes/{}/tools/changes_since_fork", owner["id"].as_str().unwrap()),
        "{}",
    );
    let text = serde_json::from_str::<Value>(&out.1).unwrap()["text"].as_str().unwrap().to_owned();
    for (attempt, seen) in &attempts {
        assert!(text.contains(seen), "{attempt}: {seen:?} is not in\n{text}");
    }
}

#[test]
fn counters_wiped_by_a_crash_are_reported_as_wiped() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let s = Scene::new();
    sql(&s.agent, "UPDATE orders SET total = 0");
    assert!(changes(&s).contains("updated 1000"));
    assert!(!changes(&s).contains("lost its counts"), "a fork that never crashed was said to");
    // A backend killed from outside (as the kernel kills one over its memory
    // limit, which a session's own work_mem can bring about): the server
    // recovers, and throws its statistics away.
    let mut sleeper = crate::harness::spawn_psql(&s.agent, "SELECT pg_sleep(60)");
    let mut backend = String::new();
    s.d.wait_for(std::time::Duration::from_secs(10), "the sleeping session", || {
        backend = sql(&s.agent, "SELECT pid FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(60)'");
        !backend.is_empty()
    });
    let backend: i32 = backend.parse().unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(backend), nix::sys::signal::Signal::SIGKILL).unwrap();
    let _ = sleeper.wait();
    s.d.wait_for(std::time::Duration::from_secs(30), "the server to recover", || {
        psql(&s.agent, "SELECT 1").is_ok()
    });
    let text = changes(&s);
    assert!(text.contains("lost its counts"), "{text}");
    assert!(!text.contains("updated 1000"), "the counters survived the crash after all: {text}");
    s.untouched();
}

/// A migration whose deletes run at commit, from a deferred constraint trigger.
const DEFERRED_DELETE: &str = "ALTER TABLE orders ADD COLUMN note text;
CREATE FUNCTION public.tidy() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN DELETE FROM orders; RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER tidy AFTER UPDATE ON orders DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.tidy();
UPDATE orders SET note = NULL WHERE id = 1;
DROP TRIGGER tidy ON orders;
DROP FUNCTION public.tidy();
";

#[test]
fn work_deferred_to_commit_cannot_hide_a_migrations_deletes() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    // The file run whole, in one transaction, whose commit fires the trigger
    // (dropped before that commit, it would fire nowhere, under test as on
    // promote); and the update in the file's own transaction, whose COMMIT
    // fires it before the trigger is dropped.
    let (make, drop) = DEFERRED_DELETE.split_at(DEFERRED_DELETE.find("DROP TRIGGER").unwrap());
    let wrapped = format!("BEGIN;\n{make}COMMIT;\n{drop}");
    for (name, text) in [("implicit.sql", make.to_owned()), ("explicit.sql", wrapped)] {
        let path = d.home.join(name);
        std::fs::write(&path, text).unwrap();
        let out = d.cli(&["migrate", "test", "--golden", "shop", "--json", path.to_str().unwrap()]);
        let report: Value =
            serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{name} ({e}): {out:?}"));
        assert_eq!(out.code, 12, "{name} must fail its test: {report}");
        let hazards = report["candidates"][0]["hazards"].as_array().unwrap();
        let deleted = hazards.iter().find(|h| h["kind"] == "rows_deleted");
        assert!(
            deleted.is_some_and(|h| h["message"].as_str().unwrap().contains("1000")),
            "{name}: {hazards:?}"
        );
    }
}

#[test]
fn a_rewrite_that_keeps_every_count_is_still_a_change() {
    let s = Scene::new();
    sql(&s.agent, "ALTER TABLE orders ALTER COLUMN status TYPE text USING 'forged' || id");
    let out = s.tool("changes_since_fork", json!({}));
    let text = out["text"].as_str().unwrap_or_else(|| panic!("{out}"));
    assert!(!text.contains("Rows: unchanged"), "{text}");
    assert!(text.contains("rewritten, so any row may differ"), "{text}");
    s.untouched();
}

#[test]
fn objects_cannot_be_hidden_inside_an_extension() {
    let s = Scene::new();
    sql(&s.agent, "CREATE EXTENSION hstore; CREATE TABLE stash (a int); CREATE FUNCTION hidden() RETURNS int LANGUAGE sql AS 'SELECT 1'");
    s.refused("ALTER EXTENSION hstore ADD TABLE stash", "permission denied to add objects");
    s.refused("ALTER EXTENSION hstore ADD FUNCTION hidden()", "permission denied to add objects");
    let text = changes(&s);
    assert!(text.contains("stash") && text.contains("hidden"), "{text}");
}

/// Names are kept as PostgreSQL quotes them, so no two objects can merge in a
/// report: a table `c` in a schema `a.b` and a table `b.c` in a schema `a`
/// would both be `a.b.c` joined bare.
#[test]
fn objects_whose_names_join_alike_are_never_merged() {
    let d = Daemon::start(&[]);
    d.golden(
        "dots",
        r#"CREATE SCHEMA "a.b"; CREATE SCHEMA a;
           CREATE TABLE "a.b".c (n int); CREATE TABLE a."b.c" (n int);
           CREATE TABLE public."Mixed" (n int);"#,
        r#"INSERT INTO "a.b".c SELECT generate_series(1, 3);
           INSERT INTO a."b.c" SELECT generate_series(1, 5);
           INSERT INTO public."Mixed" VALUES (1);"#,
    );
    let sb = d.fork("dots", &[]);
    let id = sb["id"].as_str().unwrap();
    sql(&crate::harness::dsn(&sb), r#"DELETE FROM "a.b".c"#);
    let tool = |name: &str| {
        let (status, body) = d.api("POST", &format!("/v1/sandboxes/{id}/tools/{name}"), "{}");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<Value>(&body).unwrap()["text"].as_str().unwrap().to_owned()
    };
    let described = tool("describe_schema");
    assert!(described.contains(r#""a.b".c (table, 0 rows)"#), "{described}");
    assert!(described.contains(r#"a."b.c" (table, 5 rows)"#), "{described}");
    assert!(
        described.contains(r#""Mixed" (table, 1 rows)"#) || described.contains(r#""Mixed" (table, 1 row)"#),
        "{described}"
    );
    let changed = tool("changes_since_fork");
    assert!(changed.contains(r#""a.b".c: 3 -> 0 rows"#), "{changed}");
    assert!(!changed.contains(r#"a."b.c""#), "the other table did not change: {changed}");
    // Objects named like PostgreSQL's own are listed by a promotion's refusal
    // under names that read apart.
    sql(
        &crate::harness::dsn(&sb),
        r#"CREATE TABLE "a.b".pg_class (n int); CREATE TABLE a."b.pg_class" (n int);
           CREATE TABLE a.pg_class (n int)"#,
    );
    let refused = d.cli(&["promote", id, "--golden", "planted"]);
    assert_ne!(refused.code, 0, "{refused:?}");
    for name in [r#"relation "a.b".pg_class"#, r#"relation a.pg_class"#] {
        assert!(refused.stderr.contains(name), "{name} in {}", refused.stderr);
    }
}
