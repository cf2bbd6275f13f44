//! A sandbox is a whole cluster for its owner: an owner-mode agent creates,
//! uses and drops databases of its own (as test runners do), reached through
//! the router by a second path element or by a name holding the sandbox id;
//! each has the guard and the limits, none can be turned against the sandbox's
//! own database, and a reset or a promotion deals with them.

use crate::harness::{dsn, psql, sql, Daemon};

/// The DSN of `database` inside the sandbox whose DSN is `url`, as a second
/// path element.
fn in_database(url: &str, id: &str, database: &str) -> String {
    url.replacen(&format!("/{id}?"), &format!("/{id}/{database}?"), 1)
}

#[test]
fn an_owner_creates_uses_and_drops_databases_of_its_own_as_test_runners_do() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &["--statement-timeout", "2s"]);
    let (id, agent) = (sb["id"].as_str().unwrap().to_owned(), dsn(&sb));

    // A fork does not clone its golden's template1; the first CREATE DATABASE
    // copies it into place.
    let template1 = d.home.join(format!("volume/sandboxes/{id}/pgdata/base/1"));
    assert!(template1.is_dir() && !template1.join("PG_VERSION").exists(), "template1 is not cloned");
    // A Rails-style create, load, test and drop, from the sandbox's own database.
    sql(&agent, "CREATE DATABASE orders_test");
    assert!(template1.join("PG_VERSION").is_file(), "template1 is in place");
    let test_db = in_database(&agent, &id, "orders_test");
    sql(
        &test_db,
        "CREATE TABLE widgets (id int PRIMARY KEY, name text); INSERT INTO widgets VALUES (1, 'a')",
    );
    assert_eq!(sql(&test_db, "SELECT current_database(), count(*) FROM widgets"), "orders_test|1");
    assert_eq!(sql(&agent, "SELECT count(*) FROM orders"), "1000", "the sandbox's own is untouched");
    // A copy of its own database.
    sql(&agent, "CREATE DATABASE orders_copy TEMPLATE orders_test");
    assert_eq!(sql(&in_database(&agent, &id, "orders_copy"), "SELECT name FROM widgets"), "a");

    // The guard and the limits hold there as in the sandbox's own.
    assert_eq!(sql(&test_db, "SHOW airlock.statement_limit"), "2s");
    let held = psql(&test_db, "SET statement_timeout = 0; SELECT pg_sleep(30)").unwrap_err();
    assert!(held.contains("statement limit of 2 s"), "{held}");
    for (attempt, said) in [
        (
            "ALTER DATABASE orders_test SET work_mem = '1MB'",
            "permission denied to change the database's session defaults",
        ),
        (
            "ALTER DATABASE orders_test OWNER TO airlock_owner",
            "permission denied to change the database's owner",
        ),
        ("ALTER DATABASE orders_test RENAME TO other", "permission denied to change the database's name"),
        (
            "ALTER DATABASE orders_test CONNECTION LIMIT 1",
            "permission denied to change the database's options",
        ),
        (
            "ALTER ROLE CURRENT_USER SET work_mem = '1MB'",
            "permission denied to change a role's session defaults",
        ),
        // Nothing made in one can be turned against the sandbox's own database.
        ("DROP DATABASE app", "permission denied to drop database \"app\""),
        ("DROP DATABASE app WITH (FORCE)", "permission denied to drop database \"app\""),
        ("CREATE DATABASE theirs OWNER airlock_owner", "permission denied to create a database with owner"),
        ("CREATE DATABASE tmpl IS_TEMPLATE true", "permission denied to create a database with is_template"),
        (
            "CREATE DATABASE shut ALLOW_CONNECTIONS false",
            "permission denied to create a database with allow_connections",
        ),
        (
            "CREATE DATABASE elsewhere TABLESPACE pg_default",
            "permission denied to create a database with tablespace",
        ),
        (
            "SET ROLE airlock_owner; CREATE DATABASE as_owner",
            "permission denied to create a database as another role",
        ),
    ] {
        let refused = psql(&test_db, attempt).expect_err(attempt);
        assert!(refused.contains(said), "{attempt}: {refused}");
    }
    // No template, and not the maintenance database: the server's access file
    // admits the agent to neither.
    for database in ["template1"] {
        let refused = psql(&in_database(&agent, &id, database), "SELECT 1").expect_err(database);
        assert!(
            refused.contains("pg_hba.conf rejects connection")
                || refused.contains("not currently accepting connections"),
            "{database}: {refused}"
        );
    }

    // With the sandbox id as the user, every name is a database inside it,
    // and `postgres` (the maintenance database Rails and Django assume) is its
    // own: Rails' db:create, db:test:prepare and db:drop as they run.
    let by_id = agent.replacen("postgresql://airlock_agent:", &format!("postgresql://{id}:"), 1);
    let maintenance = by_id.replacen(&format!("/{id}?"), "/postgres?", 1);
    let rails = by_id.replacen(&format!("/{id}?"), "/myapp_test?", 1);
    sql(&maintenance, "CREATE DATABASE myapp_test");
    sql(&rails, "CREATE TABLE schema_migrations (version text PRIMARY KEY); INSERT INTO schema_migrations VALUES ('1')");
    assert_eq!(sql(&rails, "SELECT current_database(), current_user"), "myapp_test|airlock_agent");
    sql(&maintenance, "DROP DATABASE myapp_test");
    // A user naming one sandbox and a database naming another is refused.
    let other = d.fork("shop", &[]);
    let crossed = by_id.replacen(&format!("/{id}?"), &format!("/{}?", other["id"].as_str().unwrap()), 1);
    let refused = psql(&crossed, "SELECT 1").unwrap_err();
    assert!(refused.contains("names one sandbox and database"), "{refused}");

    // A name holding the sandbox id picks that sandbox (Django's test database).
    let django = format!("test_{id}");
    sql(&agent, &format!("CREATE DATABASE \"{django}\""));
    let django_url = agent.replacen(&format!("/{id}?"), &format!("/{django}?"), 1);
    assert_eq!(sql(&django_url, "SELECT current_database()"), django);

    // Dropped by the role that made them; gone at a reset otherwise.
    sql(&agent, "DROP DATABASE orders_test");
    assert!(psql(&test_db, "SELECT 1").unwrap_err().contains("does not exist"));
    let listed = "SELECT string_agg(datname, ',' ORDER BY datname) FROM pg_database WHERE NOT datistemplate";
    assert_eq!(sql(&agent, listed), format!("app,orders_copy,{django}"));
    d.ok(&["reset", &id]);
    assert_eq!(sql(&agent, listed), "app");
}

#[test]
fn a_read_only_agent_creates_no_database() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let agent = dsn(&d.fork("shop", &["--mode", "readonly"]));
    let refused = psql(&agent, "CREATE DATABASE mine").unwrap_err();
    assert!(
        refused.contains("permission denied to create database") || refused.contains("read-only transaction"),
        "{refused}"
    );
}

/// A golden may hold several databases: a promoted sandbox keeps those its
/// agent created, given to the owner role, and every fork has them, each its
/// own copy.
#[test]
fn a_promotion_keeps_the_databases_the_agent_created_and_forks_have_them() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let (id, agent) = (sb["id"].as_str().unwrap().to_owned(), dsn(&sb));
    sql(&agent, "CREATE DATABASE fixtures");
    sql(&in_database(&agent, &id, "fixtures"), "CREATE TABLE seeds (n int); INSERT INTO seeds VALUES (42)");
    // One named as the default database a golden's build drops is kept too.
    sql(&agent, "CREATE DATABASE postgres");
    d.ok(&["promote", &id, "--golden", "seeded"]);
    let a = d.fork("seeded", &[]);
    let (a_id, a_url) = (a["id"].as_str().unwrap().to_owned(), dsn(&a));
    let listed = "SELECT string_agg(datname, ',' ORDER BY datname) FROM pg_database WHERE NOT datistemplate";
    assert_eq!(sql(&a_url, listed), "app,fixtures,postgres");
    let fixtures = in_database(&a_url, &a_id, "fixtures");
    assert_eq!(sql(&fixtures, "SELECT n FROM seeds"), "42");
    assert_eq!(
        sql(&fixtures, "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'fixtures'"),
        "airlock_owner",
        "the agent's credential lives in no golden"
    );
    // Each fork's is its own; an agent that did not create it cannot drop it.
    sql(&fixtures, "INSERT INTO seeds VALUES (7)");
    let b = d.fork("seeded", &[]);
    let b_fixtures = in_database(&dsn(&b), b["id"].as_str().unwrap(), "fixtures");
    assert_eq!(sql(&b_fixtures, "SELECT count(*) FROM seeds"), "1");
    let refused = psql(&a_url, "DROP DATABASE fixtures").unwrap_err();
    assert!(refused.contains("permission denied to drop database \"fixtures\""), "{refused}");
}

/// A branch of a sandbox whose template1 was never copied, and a golden
/// promoted from one, still create databases: each finds the template where
/// its golden keeps it.
#[test]
fn branches_and_promotions_of_a_sandbox_that_made_no_database_create_databases() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let id = sb["id"].as_str().unwrap().to_owned();
    let branch = d.json(&["branch", &id]);
    sql(&dsn(&branch), "CREATE DATABASE in_branch");
    d.ok(&["promote", &id, "--golden", "plain"]);
    let template = d.home.join("volume/goldens/plain/1/pgdata/base/1/PG_VERSION");
    assert!(template.is_file(), "the promoted golden has its template1");
    let fork = d.fork("plain", &[]);
    sql(&dsn(&fork), "CREATE DATABASE in_fork");
    let again = psql(&dsn(&fork), "CREATE DATABASE in_fork").unwrap_err();
    assert!(again.contains("already exists"), "{again}");
}

/// `POST /v1/sandboxes/{id}/tools/{tool}`: the status and the answer.
fn tool(d: &Daemon, id: &str, name: &str, args: serde_json::Value) -> (u16, serde_json::Value) {
    let (status, body) = d.api("POST", &format!("/v1/sandboxes/{id}/tools/{name}"), &args.to_string());
    (status, serde_json::from_str(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}")))
}

/// The agent's tools see every database of the sandbox: describe_schema
/// names the others and describes any one asked for, and changes_since_fork
/// lists the databases created since the fork and what changed in those the
/// golden holds.
#[test]
fn describe_schema_and_changes_since_fork_see_every_database_of_the_sandbox() {
    use serde_json::json;
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let (id, agent) = (sb["id"].as_str().unwrap().to_owned(), dsn(&sb));
    sql(&agent, "CREATE DATABASE orders_test");
    let test_db = in_database(&agent, &id, "orders_test");
    sql(&test_db, "CREATE TABLE widgets (id int PRIMARY KEY, name text); INSERT INTO widgets SELECT g, 'w' FROM generate_series(1, 3) g");

    let (status, own) = tool(&d, &id, "describe_schema", json!({}));
    assert_eq!(status, 200, "{own}");
    let result = &own["result"];
    assert_eq!(result["database"], "app");
    assert_eq!(result["databases"], json!(["app", "orders_test"]));
    assert!(result["catalog"]["tables"].get("public.orders").is_some(), "{result}");
    assert!(own["text"].as_str().unwrap().contains("The sandbox also holds: orders_test."), "{own}");

    let (_, other) = tool(&d, &id, "describe_schema", json!({"database": "orders_test"}));
    let result = &other["result"];
    assert_eq!(result["database"], "orders_test", "{other}");
    assert!(result["catalog"]["tables"].get("public.orders").is_none(), "{result}");
    assert_eq!(result["rows"]["public.widgets"], json!({"rows": 3, "exact": true}), "{result}");
    assert!(other["text"].as_str().unwrap().contains("widgets"), "{other}");
    let (_, one) = tool(&d, &id, "describe_schema", json!({"database": "orders_test", "table": "widgets"}));
    assert_eq!(one["result"]["catalog"]["tables"].as_object().unwrap().len(), 1, "{one}");
    // A database that is not there, or is not the sandbox's to read, is the
    // model's mistake: a tool error naming the databases there are.
    for wrong in ["nosuch", "template1", "postgres"] {
        let (status, refused) = tool(&d, &id, "describe_schema", json!({"database": wrong}));
        assert_eq!(status, 200, "{refused}");
        assert_eq!(refused["is_error"], true, "{refused}");
        let said = refused["text"].as_str().unwrap();
        assert!(said.contains("no database named") && said.contains("app, orders_test"), "{said}");
    }

    let (_, changes) = tool(&d, &id, "changes_since_fork", json!({}));
    let result = &changes["result"];
    assert_eq!(result["databases"].as_array().unwrap().len(), 1, "{result}");
    let created = &result["databases"][0];
    assert_eq!(
        (created["name"].as_str(), created["change"].as_str()),
        (Some("orders_test"), Some("created"))
    );
    assert_eq!(created["row_changes"][0]["table"], "widgets", "{created}");
    assert_eq!(created["row_changes"][0]["rows"], 3, "{created}");
    assert!(
        result["schema_changes"].as_array().unwrap().is_empty(),
        "the sandbox's own is unchanged: {result}"
    );
    let text = changes["text"].as_str().unwrap();
    assert!(text.contains("Database orders_test: created, with 1 table."), "{text}");
    assert!(text.contains("widgets: - -> 3 rows"), "{text}");

    // A golden promoted with a database of the agent's records it, so a fork
    // of it is compared there too: unchanged at first, then what changed.
    d.ok(&["promote", &id, "--golden", "withtests"]);
    let fork = d.fork("withtests", &[]);
    let (fork_id, fork_url) = (fork["id"].as_str().unwrap().to_owned(), dsn(&fork));
    let (_, fresh) = tool(&d, &fork_id, "changes_since_fork", json!({}));
    assert!(fresh["result"].get("databases").is_none(), "{fresh}");
    assert!(fresh["result"].get("caveats").is_none(), "{fresh}");
    let kept = in_database(&fork_url, &fork_id, "orders_test");
    sql(&kept, "DELETE FROM widgets WHERE id = 1; CREATE TABLE gadgets (id int)");
    let (_, changed) = tool(&d, &fork_id, "changes_since_fork", json!({}));
    let database = &changed["result"]["databases"][0];
    assert_eq!(database["change"], "changed", "{changed}");
    assert!(
        database["schema_changes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == "gadgets" && c["change"] == "added"),
        "{database}"
    );
    let widgets = database["row_changes"].as_array().unwrap().iter().find(|r| r["table"] == "widgets");
    assert_eq!(widgets.map(|w| (w["golden_rows"].as_i64(), w["deleted"].as_i64())), Some((Some(3), Some(1))));
    let text = changed["text"].as_str().unwrap();
    assert!(text.contains("Database orders_test:\n  Schema: 1 changes"), "{text}");
    // A reset puts it back as the golden holds it.
    d.ok(&["reset", &fork_id]);
    let (_, after) = tool(&d, &fork_id, "changes_since_fork", json!({}));
    assert!(after["result"].get("databases").is_none(), "{after}");
}
