//! Every line of a migration report could be true: numbers from the work each
//! statement really did, hazards that fit the statement, advice for the cause
//! at hand (or none), and locks that say what waits.

use serde_json::{json, Value};

use crate::harness::Daemon;
use crate::migrate::{by_name, daemon, files, hazard, hazard_kinds, path_strs, test};

/// The golden's rows per table (see `migrate::SEED`).
const ORDERS: i64 = 100_000;
const USERS: i64 = 20_000;

fn message(c: &Value, kind: &str) -> String {
    hazard(c, kind)["message"].as_str().unwrap().to_owned()
}

/// The report of `migrate test --json` of `paths` on golden `golden`.
fn test_on(d: &Daemon, golden: &str, paths: &[std::path::PathBuf]) -> Value {
    let mut args = vec!["migrate", "test", "--golden", golden, "--json"];
    args.extend(path_strs(paths));
    let out = d.cli(&args);
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

/// Every number in `text`, commas and all.
fn numbers(text: &str) -> Vec<i64> {
    text.split(|ch: char| !ch.is_ascii_digit() && ch != ',')
        .filter_map(|w| w.replace(',', "").parse().ok())
        .collect()
}

#[test]
fn every_number_and_every_piece_of_advice_fits_what_the_statement_did() {
    let d = daemon();
    let paths = files(
        &d,
        &[
            ("truncate.sql", "TRUNCATE orders;"),
            ("delete_all.sql", "DELETE FROM orders;"),
            ("index.sql", "CREATE INDEX orders_total ON orders (total);"),
            ("reindex.sql", "REINDEX INDEX orders_user;"),
            // (orders' columns are all a view's: users' score is retyped.)
            ("retype.sql", "ALTER TABLE users ALTER COLUMN score TYPE bigint;"),
            ("volatile_not_null.sql", "ALTER TABLE orders ADD COLUMN stamp timestamptz NOT NULL DEFAULT clock_timestamp();"),
            ("constant_not_null.sql", "ALTER TABLE orders ADD COLUMN flag int NOT NULL DEFAULT 1;"),
            ("vacuum_full.sql", "VACUUM FULL orders;"),
            ("cluster.sql", "CLUSTER orders USING orders_pkey;"),
            ("unlogged.sql", "ALTER TABLE orders SET UNLOGGED;"),
            ("check.sql", "ALTER TABLE orders ADD CONSTRAINT total_nonneg CHECK (total >= 0);"),
            ("fk.sql", "ALTER TABLE orders ADD CONSTRAINT orders_user_again FOREIGN KEY (user_id) REFERENCES users (id);"),
            ("update_all.sql", "BEGIN;\nALTER TABLE users ADD COLUMN gift boolean;\nUPDATE users SET gift = false;\nCOMMIT;"),
            ("delete_most.sql", "DELETE FROM orders WHERE id <= 60000;"),
            ("update_most.sql", "UPDATE orders SET note = 'checked' WHERE id <= 70000;"),
            ("drop_table.sql", "DROP TABLE orders CASCADE;"),
            ("drop_column.sql", "ALTER TABLE users DROP COLUMN nickname;"),
            // Rows read from an index alone (the golden is vacuumed: no heap fetch).
            (
                "index_only.sql",
                "BEGIN;\nSET LOCAL enable_seqscan = off;\nSET LOCAL enable_bitmapscan = off;\n\
                 LOCK TABLE orders IN ACCESS EXCLUSIVE MODE;\nSELECT count(*) FROM orders WHERE id > 0;\nCOMMIT;",
            ),
            // A query under the lock whose time is the one row it reads.
            (
                "setval_after_ddl.sql",
                "ALTER TABLE users ADD COLUMN nick text;\nSELECT setval('users_id_seq', (SELECT max(id) FROM users));",
            ),
        ],
    );
    let mut args = path_strs(&paths);
    args.extend(["--max-lock", "20ms"]);
    let (_, report) = test(&d, &args);
    let c = by_name(&report);

    // No count a statement reports is more than its table holds.
    for (name, candidate) in &c {
        for s in candidate["statements"].as_array().unwrap() {
            for (table, n) in s["scanned"].as_object().unwrap() {
                let most = if table.ends_with(".users") { USERS } else { ORDERS };
                assert!(n.as_i64().unwrap() <= most, "{name} reads {n} rows of {table}: {s}");
            }
            for w in s["rewrites"].as_array().unwrap() {
                assert!(w["rows"].as_i64().unwrap() <= ORDERS, "{name}: {w}");
            }
            // A lock another lock of the statement makes redundant is not listed.
            let locks: Vec<(&str, &str)> = s["locks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| (l["relation"].as_str().unwrap(), l["mode"].as_str().unwrap()))
                .collect();
            for (relation, mode) in &locks {
                if *mode != "ACCESS EXCLUSIVE" {
                    assert!(
                        !locks.contains(&(relation, "ACCESS EXCLUSIVE")),
                        "{name}: {mode} beside ACCESS EXCLUSIVE: {locks:?}"
                    );
                }
            }
        }
    }

    // A TRUNCATE swaps files: its estimate is not a row-by-row delete's, and
    // its brief lock is no long_lock.
    let truncate = &c["truncate.sql"];
    let said = message(truncate, "rows_deleted");
    assert!(said.contains("truncates public.orders") && numbers(&said) == [ORDERS], "{said}");
    let deleting = hazard(&c["delete_all.sql"], "rows_deleted")["estimated_ms"].as_f64().unwrap();
    let truncating = hazard(truncate, "rows_deleted")["estimated_ms"].as_f64().unwrap();
    assert!(truncating * 10.0 <= deleting, "truncate est. {truncating} ms, delete est. {deleting} ms");
    assert!(!hazard_kinds(truncate).contains(&"long_lock"), "{truncate}");

    // An index build reads its table once; a SHARE lock lets reads go on.
    let index = &c["index.sql"];
    assert_eq!(index["statements"][0]["scanned"]["public.orders"].as_i64().unwrap_or(0) <= ORDERS, true);
    let said = message(index, "blocking_index_build");
    assert!(said.contains("while its writes wait"), "{said}");
    // REINDEX locks the index itself, which every query planning on the table waits for.
    let said = message(&c["reindex.sql"], "blocking_index_build");
    assert!(said.contains("while its reads and writes wait"), "{said}");

    // Each rewrite cause gets its own safer form, or none.
    let rewrite = |name: &str, table: &str| {
        let h = hazard(&c[name], "table_rewrite");
        let causes = &c[name]["statements"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| s["rewrites"].as_array().unwrap().clone())
            .find(|w| w["table"] == table)
            .unwrap_or_else(|| panic!("{name} rewrote nothing: {}", c[name]))["causes"];
        (
            h["message"].as_str().unwrap().to_owned(),
            h["suggestion"].as_str().map(str::to_owned),
            causes.clone(),
        )
    };
    for (name, table, cause, advice) in [
        ("retype.sql", "public.users", "type_change", Some("new type")),
        ("volatile_not_null.sql", "public.orders", "volatile_default", Some("without the volatile default")),
        ("vacuum_full.sql", "public.orders", "vacuum_full", Some("plain VACUUM")),
        ("cluster.sql", "public.orders", "cluster", Some("--order-by")),
        ("unlogged.sql", "public.orders", "persistence", None),
    ] {
        let (said, suggestion, causes) = rewrite(name, table);
        assert_eq!(causes, serde_json::json!([cause]), "{name}");
        assert!(said.contains("while its reads and writes wait"), "{name}: {said}");
        assert!(numbers(&said).iter().all(|n| *n <= ORDERS), "{name}: {said}");
        match (advice, &suggestion) {
            (Some(words), Some(s)) => {
                assert!(s.contains(words), "{name}: {s}");
                assert!(cause == "volatile_default" || !s.contains("volatile"), "{name}: {s}");
            }
            (None, None) => {}
            _ => panic!("{name}: advice {suggestion:?}, expected {advice:?}"),
        }
    }

    // A column added NOT NULL has no rows to check: the rewrite, or nothing.
    assert!(
        !hazard_kinds(&c["volatile_not_null.sql"]).contains(&"constraint_validation"),
        "{}",
        c["volatile_not_null.sql"]
    );
    assert!(
        !hazard_kinds(&c["constant_not_null.sql"]).contains(&"constraint_validation"),
        "{}",
        c["constant_not_null.sql"]
    );
    assert!(
        !hazard_kinds(&c["constant_not_null.sql"]).contains(&"table_rewrite"),
        "{}",
        c["constant_not_null.sql"]
    );

    // What waits: ADD CHECK holds ACCESS EXCLUSIVE (reads wait too); a foreign
    // key SHARE ROW EXCLUSIVE (writes only).
    let said = message(&c["check.sql"], "constraint_validation");
    assert!(said.contains("while its reads and writes wait"), "{said}");
    let said = message(&c["fk.sql"], "constraint_validation");
    assert!(said.contains("while its writes wait") && !said.contains("reads"), "{said}");

    // Every count in every message is one the tables could hold (a
    // percentage, a line number or a size is never more either).
    for (name, candidate) in &c {
        for h in candidate["hazards"].as_array().unwrap().iter().chain(candidate["notes"].as_array().unwrap())
        {
            let said = h["message"].as_str().unwrap();
            assert!(numbers(said).iter().all(|n| *n <= ORDERS), "{name}: {said}");
        }
    }
    // Each count is what the statement did, against what the table held.
    let said = message(&c["delete_most.sql"], "mass_delete");
    assert!(
        said.starts_with(&format!("deletes 60000 of the {ORDERS} rows of public.orders (60%)")),
        "{said}"
    );
    let said = message(&c["delete_most.sql"], "rows_deleted");
    assert!(numbers(&said).contains(&60_000) && !numbers(&said).contains(&(ORDERS - 60_000)), "{said}");
    let said = message(&c["update_most.sql"], "mass_update");
    assert!(
        said.starts_with(&format!("updates 70000 of the {ORDERS} rows of public.orders (70%)")),
        "{said}"
    );
    assert!(
        !hazard_kinds(&c["update_most.sql"]).contains(&"values_overwritten"),
        "NULLs filled in lose nothing"
    );
    let said = message(&c["drop_table.sql"], "table_dropped");
    assert_eq!(said, format!("drops table public.orders holding {ORDERS} rows"));
    let said = message(&c["drop_column.sql"], "column_dropped");
    assert!(said.contains(&format!("from a table with {USERS} rows")), "{said}");
    let said = message(&c["index.sql"], "blocking_index_build");
    assert!(said.contains(&format!("({ORDERS} rows in the golden)")), "{said}");
    let said = message(&c["check.sql"], "constraint_validation");
    assert!(numbers(&said).contains(&ORDERS), "{said}");

    // An UPDATE reads and writes each row once: 20,000 rows worked, not 40,000.
    let said = message(&c["update_all.sql"], "long_lock");
    assert!(said.contains(&format!("read or write {USERS} rows")), "{said}");
    assert!(numbers(&said).iter().all(|n| *n <= USERS), "{said}");

    // An index-only scan's rows count, though it fetches none from the table.
    let index_only = &c["index_only.sql"];
    let select = index_only["statements"].as_array().unwrap().iter().find(|s| s["line"] == json!(5));
    let select = select.unwrap_or_else(|| panic!("{index_only}"));
    assert_eq!(select["scanned"]["public.orders"], json!(ORDERS), "{select}");
    let said = message(index_only, "long_lock");
    assert!(said.contains(&format!("while line(s) 5 read or write {ORDERS} rows")), "{said}");
    let quick = &c["setval_after_ddl.sql"];
    assert!(!hazard_kinds(quick).contains(&"long_lock"), "{quick}");
}

#[test]
fn what_a_migration_takes_away_is_named_with_what_it_guarded() {
    let d = daemon();
    let paths = files(
        &d,
        &[
            ("drop_fk.sql", "ALTER TABLE orders DROP CONSTRAINT orders_user_id_fkey;"),
            ("drop_not_null.sql", "ALTER TABLE users ALTER COLUMN email DROP NOT NULL;"),
            ("drop_index.sql", "DROP INDEX orders_user;"),
            (
                "replace_index.sql",
                "CREATE INDEX orders_user_total ON orders (user_id, total);\nDROP INDEX orders_user;",
            ),
            ("rename_index.sql", "ALTER INDEX orders_user RENAME TO orders_by_user;"),
            // The constraint made again NOT VALID before the old one goes: nothing is taken away.
            (
                "replace_fk.sql",
                "ALTER TABLE orders ADD CONSTRAINT orders_user_fk2 FOREIGN KEY (user_id) REFERENCES users (id) \
                 ON DELETE CASCADE NOT VALID;\nALTER TABLE orders DROP CONSTRAINT orders_user_id_fkey;",
            ),
            ("unlogged.sql", "ALTER TABLE orders SET UNLOGGED;"),
            ("unlogged_copy.sql", "CREATE UNLOGGED TABLE orders_copy AS SELECT * FROM orders;"),
        ],
    );
    let (_, report) = test(&d, &path_strs(&paths));
    let c = by_name(&report);

    let said = message(&c["drop_fk.sql"], "integrity_removed");
    assert!(said.contains("orders_user_id_fkey") && said.contains("point at public.users rows"), "{said}");
    assert_eq!(hazard(&c["drop_fk.sql"], "integrity_removed")["severity"], "high");
    assert_eq!(hazard(&c["drop_fk.sql"], "integrity_removed")["line"], 1);
    let said = message(&c["drop_not_null.sql"], "integrity_removed");
    assert!(said.contains("public.users.email"), "{said}");

    // The only index behind orders' key to users: each delete of a user reads all of orders.
    let said = message(&c["drop_index.sql"], "key_index_dropped");
    assert!(said.contains("orders_user_id_fkey") && said.contains(&format!("{ORDERS} rows")), "{said}");
    // (ON DELETE CASCADE)
    assert!(said.contains("find the rows to delete with it"), "{said}");
    // Another index serving the key, or the same index under a new name, takes nothing away.
    for name in ["replace_index.sql", "rename_index.sql", "replace_fk.sql"] {
        let kinds = hazard_kinds(&c[name]);
        assert!(
            !kinds.contains(&"key_index_dropped") && !kinds.contains(&"integrity_removed"),
            "{name}: {kinds:?}"
        );
    }

    let said = message(&c["unlogged.sql"], "durability");
    assert!(said.contains("public.orders") && said.contains("crash"), "{said}");
    let said = message(&c["unlogged_copy.sql"], "durability");
    assert!(said.contains(&format!("copies {ORDERS} rows")), "{said}");

    // A materialized view refreshed without CONCURRENTLY: its readers wait,
    // and the safer form says what CONCURRENTLY needs.
    d.golden(
        "views",
        "CREATE TABLE sales (id int PRIMARY KEY, region int NOT NULL, amount int NOT NULL);
         CREATE MATERIALIZED VIEW region_totals AS SELECT region, sum(amount) AS total FROM sales GROUP BY region;
         CREATE UNIQUE INDEX region_totals_region ON region_totals (region);
         CREATE VIEW big_sales AS SELECT id, region, amount FROM sales WHERE amount > 90;
         CREATE SCHEMA billing;
         CREATE TABLE billing.ledger (id serial PRIMARY KEY, amount int NOT NULL);
         CREATE TABLE readings (id int NOT NULL, at date NOT NULL) PARTITION BY RANGE (at);
         CREATE INDEX readings_id ON readings (id);
         CREATE TABLE readings_2025 (id int NOT NULL, at date NOT NULL);
         CREATE TABLE readings_2024 PARTITION OF readings FOR VALUES FROM ('2024-01-01') TO ('2025-01-01');",
        "INSERT INTO sales SELECT g, g % 5000, g % 100 FROM generate_series(1, 50000) g;
         INSERT INTO billing.ledger SELECT g, g FROM generate_series(1, 300) g;
         INSERT INTO readings_2025 SELECT g, date '2025-01-01' + g % 365 FROM generate_series(1, 3000) g;
         INSERT INTO readings SELECT g, date '2024-01-01' + g % 365 FROM generate_series(1, 500) g;
         REFRESH MATERIALIZED VIEW region_totals;",
    );
    let paths = files(
        &d,
        &[
            ("refresh.sql", "REFRESH MATERIALIZED VIEW region_totals;"),
            ("refresh_concurrently.sql", "REFRESH MATERIALIZED VIEW CONCURRENTLY region_totals;"),
            // A schema's CASCADE names none of the tables it drops.
            ("drop_schema.sql", "-- billing moves to its own database\nDROP SCHEMA billing CASCADE;"),
            (
                "attach.sql",
                "ALTER TABLE readings ATTACH PARTITION readings_2025 FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');",
            ),
            ("drop_partitioned.sql", "DROP TABLE readings;"),
            // A schema the file made for its own work, dropped with it: nothing of the golden's.
            (
                "own_schema.sql",
                "CREATE SCHEMA etl_tmp;\nCREATE TABLE etl_tmp.plan_map (a int);\n\
                 INSERT INTO etl_tmp.plan_map VALUES (1);\nDROP SCHEMA etl_tmp CASCADE;",
            ),
            ("overwrite_partitioned.sql", "UPDATE readings SET id = 0;"),
            ("detach.sql", "-- 2024 goes to the archive\nALTER TABLE IF EXISTS readings DETACH PARTITION readings_2024;"),
            // A view that only gains a column at the end: the expand step, no break.
            (
                "view_appended.sql",
                "CREATE OR REPLACE VIEW big_sales AS SELECT id, region, amount, amount * 2 AS doubled FROM sales WHERE amount > 90;",
            ),
            // A view restyled, and one renamed with another in its place over it:
            // the same columns and rows (a note). One whose column is renamed is a break.
            (
                "view_restyled.sql",
                "CREATE OR REPLACE VIEW big_sales AS SELECT s.id, s.region, s.amount FROM sales AS s WHERE NOT s.amount <= 90;",
            ),
            (
                "view_renamed_compat.sql",
                "ALTER VIEW big_sales RENAME TO large_sales;\nCREATE VIEW big_sales AS SELECT id, region, amount FROM large_sales;",
            ),
            (
                "view_column_renamed.sql",
                "DROP VIEW big_sales;\nCREATE VIEW big_sales AS SELECT id, region, amount AS total FROM sales WHERE amount > 90;",
            ),
            // A table made in public under the name billing's table has.
            (
                "shadow.sql",
                "CREATE TABLE IF NOT EXISTS ledger (id int PRIMARY KEY, amount int NOT NULL);\nINSERT INTO ledger VALUES (1, 5);",
            ),
            // A view made again without its filter: same columns, other rows.
            (
                "view_unfiltered.sql",
                "CREATE OR REPLACE VIEW big_sales AS SELECT id, region, amount FROM sales;",
            ),
        ],
    );
    let c = by_name(&test_on(&d, "views", &paths));
    let dropped = hazard(&c["drop_schema.sql"], "table_dropped");
    assert_eq!(
        (&dropped["severity"], &dropped["line"], &dropped["message"]),
        (
            &json!("critical"),
            &json!(2),
            &json!("drops table billing.ledger holding 300 rows (reached by the CASCADE)")
        ),
        "{dropped}"
    );
    // What the schema held besides the table (its sequence, its default) is
    // the schema's and the table's own: no cascade of its own.
    assert!(!hazard_kinds(&c["drop_schema.sql"]).contains(&"cascade"), "{}", c["drop_schema.sql"]);
    let broken = hazard(&c["drop_schema.sql"], "breaks_compatibility");
    assert_eq!(broken["line"], json!(2), "{broken}");
    // ATTACH builds the parent's index on the table and reads every row
    // against the bounds: each with its own safer form.
    let build = hazard(&c["attach.sql"], "blocking_index_build");
    assert!(build["suggestion"].as_str().unwrap().contains("ATTACH adopts a matching one"), "{build}");
    let scan = hazard(&c["attach.sql"], "constraint_validation");
    assert!(
        scan["message"].as_str().unwrap().starts_with(
            "attaching a partition checks every row of public.readings_2025 (3000 rows in the golden)"
        ),
        "{scan}"
    );
    assert!(scan["suggestion"].as_str().unwrap().contains("ATTACH then skips its scan"), "{scan}");
    // A partitioned table's rows are its partitions': they go with it.
    let dropped = hazard(&c["drop_partitioned.sql"], "table_dropped");
    assert_eq!(
        (&dropped["severity"], &dropped["message"]),
        (&json!("critical"), &json!("drops table public.readings_2024 holding 500 rows (a partition of the table dropped, which goes with it)")),
        "{dropped}"
    );
    assert!(!hazard_kinds(&c["drop_partitioned.sql"]).contains(&"cascade"), "{}", c["drop_partitioned.sql"]);
    assert_eq!(c["own_schema.sql"]["hazards"], json!([]), "{}", c["own_schema.sql"]);
    assert_eq!(c["view_appended.sql"]["hazards"], json!([]), "{}", c["view_appended.sql"]);
    // Values overwritten through a partitioned table: told once, against its partitions' rows.
    let lost: Vec<&Value> = c["overwrite_partitioned.sql"]["hazards"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["kind"] == "values_overwritten")
        .collect();
    assert_eq!(lost.len(), 1, "{}", c["overwrite_partitioned.sql"]);
    assert!(
        lost[0]["message"].as_str().unwrap().starts_with("500 of the 500 rows of readings lost their id"),
        "{}",
        lost[0]
    );
    let said = message(&c["detach.sql"], "rows_deleted");
    assert_eq!(said, "detaches partition public.readings_2024 from readings: its 500 rows stay in it, but no query of readings reads them any more");
    let said = message(&c["view_unfiltered.sql"], "breaks_compatibility");
    assert!(said.contains("view public.big_sales is defined otherwise"), "{said}");
    assert_eq!(hazard(&c["view_unfiltered.sql"], "breaks_compatibility")["line"], json!(1));
    for name in ["view_restyled.sql", "view_renamed_compat.sql"] {
        assert!(!hazard_kinds(&c[name]).contains(&"breaks_compatibility"), "{name}: {}", c[name]);
        let note = c[name]["notes"].as_array().unwrap().iter().find(|n| n["kind"] == "breaks_compatibility");
        let said = note.unwrap_or_else(|| panic!("{name}: {}", c[name]))["message"].as_str().unwrap();
        assert!(
            said.starts_with(
                "view public.big_sales is defined otherwise, but shows the same columns and the same"
            ),
            "{said}"
        );
    }
    let shadow = &c["shadow.sql"];
    let note = shadow["notes"].as_array().unwrap().iter().find(|n| n["kind"] == "name_shadowed");
    let note = note.unwrap_or_else(|| panic!("{shadow}"));
    assert_eq!(note["line"], json!(1), "{note}");
    assert!(
        note["message"]
            .as_str()
            .unwrap()
            .starts_with("makes public.ledger while the golden has billing.ledger"),
        "{note}"
    );
    assert!(shadow["passed"].as_bool().unwrap(), "{shadow}");
    let said = message(&c["view_column_renamed.sql"], "breaks_compatibility");
    assert!(said.contains("view public.big_sales is defined otherwise"), "{said}");
    let refresh = hazard(&c["refresh.sql"], "table_rewrite");
    let said = refresh["message"].as_str().unwrap();
    assert!(said.contains("public.region_totals") && said.contains("reads and writes wait"), "{said}");
    assert!(refresh["estimated_ms"].as_f64().is_some(), "{refresh}");
    assert!(refresh["suggestion"].as_str().unwrap().contains("unique index"), "{refresh}");
    // Its readers queue behind the lock it waits for: lock_timeout is worth setting.
    let notes: Vec<&str> =
        c["refresh.sql"]["notes"].as_array().unwrap().iter().map(|n| n["kind"].as_str().unwrap()).collect();
    assert!(notes.contains(&"no_lock_timeout"), "{notes:?} {}", c["refresh.sql"]["statements"]);
    assert!(
        !hazard_kinds(&c["refresh_concurrently.sql"]).contains(&"table_rewrite"),
        "{}",
        c["refresh_concurrently.sql"]
    );
    assert_eq!(c["refresh_concurrently.sql"]["notes"], json!([]), "{}", c["refresh_concurrently.sql"]);
}

#[test]
fn what_an_update_overwrites_is_named_with_the_values_it_replaced() {
    let d = daemon();
    // An UPDATE inside thousands of nested dollar quotes: read eight deep, no further.
    let mut deep = "update users set tenant_id = 1".to_owned();
    for i in 0..5_000 {
        deep = format!("$d{i}${deep}$d{i}$");
    }
    let deep = format!("SELECT length({deep});");
    let paths = files(
        &d,
        &[
            ("deep.sql", &deep),
            // users' tenant_id is 1 + id % 10: 2,000 users each.
            ("retenant.sql", "SELECT 1;\nUPDATE users SET tenant_id = 1 WHERE tenant_id = 2;"),
            ("forget_nicknames.sql", "UPDATE users u SET nickname = NULL;"),
            (
                "in_a_do_block.sql",
                "DO $$ BEGIN UPDATE users SET tenant_id = 3 WHERE tenant_id IN (4, 5); END $$;",
            ),
            ("retype_using.sql", "ALTER TABLE users ALTER COLUMN tenant_id TYPE int USING 1;"),
            // The old values kept first, as the safer form says: a note, not a hazard.
            (
                "kept_first.sql",
                "CREATE TABLE users_tenant_id_before AS SELECT id, tenant_id FROM users;\n\
                 UPDATE users SET tenant_id = 1 WHERE tenant_id = 2;",
            ),
            (
                "kept_in_a_column.sql",
                "ALTER TABLE users ADD COLUMN tenant_was int;\nUPDATE users SET tenant_was = tenant_id WHERE tenant_id = 2;\n\
                 UPDATE users SET tenant_id = 1 WHERE tenant_id = 2;",
            ),
            // The UPDATE SET of a MERGE or an upsert, and an UPDATE through a view.
            (
                "merge.sql",
                "MERGE INTO users u USING (SELECT id FROM users WHERE tenant_id = 2) s ON s.id = u.id\n\
                 WHEN MATCHED THEN UPDATE SET tenant_id = 1;",
            ),
            (
                "upsert.sql",
                "INSERT INTO users (id, tenant_id, email) SELECT id, 1, email FROM users WHERE tenant_id = 2\n\
                 ON CONFLICT (id) DO UPDATE SET tenant_id = excluded.tenant_id;",
            ),
            ("through_a_view.sql", "UPDATE big_orders SET total = 600;"),
            // Computed from itself, on half the rows: it meets the other
            // half's values, but can be undone.
            ("bump_half.sql", "UPDATE orders SET total = total + 1 WHERE id % 2 = 0;"),
            // A CASE that names the column picks rows; it is not the column
            // computed from itself, whatever one odd row does.
            (
                "case_trick.sql",
                "UPDATE users SET tenant_id = (CASE WHEN id = 1 THEN 3 WHEN tenant_id = 2 THEN 1 END)\n\
                 WHERE tenant_id = 2 OR id = 1;",
            ),
            // Values of any length are told by their digest and shown cut short.
            ("long_values.sql", "UPDATE users SET nickname = repeat('x', 10000) WHERE tenant_id = 2;"),
            // Changes that can be read backwards, or too few rows.
            ("upper.sql", "UPDATE users SET email = upper(email);"),
            ("bump.sql", "UPDATE orders SET total = total + 1;"),
            ("backfill.sql", "UPDATE orders SET note = 'n' || id;"),
            ("few.sql", "UPDATE users SET tenant_id = 1 WHERE id <= 40;"),
        ],
    );
    let (_, report) = test(&d, &path_strs(&paths));
    let c = by_name(&report);

    let h = hazard(&c["retenant.sql"], "values_overwritten");
    assert_eq!((&h["severity"], &h["line"]), (&json!("high"), &json!(2)), "{h}");
    let said = h["message"].as_str().unwrap();
    assert!(
        said.starts_with(
            "2,000 of the 20,000 rows of users lost their tenant_id: 2,000 had tenant_id '2', now '1'"
        ),
        "{said}"
    );
    assert!(h["suggestion"].as_str().unwrap().contains("SELECT id, tenant_id FROM users"), "{h}");

    // Every third user has no nickname: the other 13,334 lost theirs.
    let said = message(&c["forget_nicknames.sql"], "values_overwritten");
    assert!(
        said.starts_with("13,334 of the 20,000 rows of users lost their nickname: 13,334 had other values"),
        "{said}"
    );
    assert!(said.contains("now NULL") && said.contains("13,334 distinct values became 1"), "{said}");

    let said = message(&c["in_a_do_block.sql"], "values_overwritten");
    assert!(said.starts_with("4,000 of the 20,000 rows of users lost their tenant_id"), "{said}");
    let said = message(&c["retype_using.sql"], "values_overwritten");
    assert!(said.starts_with("18,000 of the 20,000 rows of users lost their tenant_id"), "{said}");

    let said = message(&c["long_values.sql"], "values_overwritten");
    assert!(said.contains(&format!("now '{}...'", "x".repeat(40))) && said.len() < 1_000, "{said}");

    for (name, place) in
        [("kept_first.sql", "users_tenant_id_before.tenant_id"), ("kept_in_a_column.sql", "users.tenant_was")]
    {
        assert!(!hazard_kinds(&c[name]).contains(&"values_overwritten"), "{name}: {}", c[name]);
        let note = c[name]["notes"].as_array().unwrap().iter().find(|n| n["kind"] == "values_overwritten");
        let said =
            note.unwrap_or_else(|| panic!("{name}: no note: {}", c[name]))["message"].as_str().unwrap();
        assert!(said.starts_with("2,000 of the 20,000 rows of users lost their tenant_id"), "{name}: {said}");
        assert!(said.ends_with(&format!("kept every old value in {place}")), "{name}: {said}");
    }
    for name in ["merge.sql", "upsert.sql"] {
        let said = message(&c[name], "values_overwritten");
        assert!(said.starts_with("2,000 of the 20,000 rows of users lost their tenant_id"), "{name}: {said}");
    }
    let said = message(&c["case_trick.sql"], "values_overwritten");
    assert!(said.starts_with("2,000 of the 20,000 rows of users lost their tenant_id"), "{said}");
    let said = message(&c["through_a_view.sql"], "values_overwritten");
    assert!(said.contains("rows of orders lost their total"), "{said}");

    for name in ["deep.sql", "upper.sql", "bump.sql", "bump_half.sql", "backfill.sql", "few.sql"] {
        assert!(!hazard_kinds(&c[name]).contains(&"values_overwritten"), "{name}: {}", c[name]);
    }

    // Keys changed where a foreign key sets NULL: the referencing rows lose their values.
    d.golden(
        "keyed",
        "CREATE TABLE kinds (id int PRIMARY KEY);
         CREATE TABLE items (id int PRIMARY KEY, kind int REFERENCES kinds ON UPDATE SET NULL);",
        "INSERT INTO kinds SELECT g FROM generate_series(1, 10) g;
         INSERT INTO items SELECT g, 1 + g % 10 FROM generate_series(1, 5000) g;",
    );
    let paths = files(&d, &[("renumber.sql", "UPDATE kinds SET id = id + 100 WHERE id <= 5;")]);
    let c = by_name(&test_on(&d, "keyed", &paths));
    let said = message(&c["renumber.sql"], "values_overwritten");
    assert!(said.starts_with("2,500 of the 5,000 rows of items lost their kind"), "{said}");
}

#[test]
fn values_replaced_one_for_one_or_cut_are_lost_and_a_relabel_is_not() {
    let d = Daemon::start(&[]);
    // Each product on a day of its own, with a slug made from its id.
    d.golden(
        "shop",
        "CREATE TABLE products (id int PRIMARY KEY, name text NOT NULL, slug text NOT NULL UNIQUE,
                                price numeric(10,2) NOT NULL, made timestamp NOT NULL, status text NOT NULL);",
        "INSERT INTO products SELECT g, 'Product ' || g, 'p-' || g, (g % 500) + 0.99,
                timestamp '2020-01-01' + g * interval '1 day 7 minutes', (ARRAY['done', 'open', 'held'])[1 + g % 3]
           FROM generate_series(1, 3000) g;",
    );
    let paths = files(
        &d,
        &[
            // New values no other row holds, computed from other columns:
            // the merge rule sees nothing, yet every old slug is gone.
            ("slugs.sql", "SELECT 1;\nUPDATE products SET slug = lower(replace(name, ' ', '-'));"),
            ("prices_from_ids.sql", "UPDATE products SET price = id / 100.0;"),
            // The time of day cut off, every row still on a day of its own.
            ("days.sql", "UPDATE products SET made = date_trunc('day', made);"),
            (
                "kept_first.sql",
                "CREATE TABLE products_slug_before AS SELECT id, slug FROM products;\n\
                                UPDATE products SET slug = lower(replace(name, ' ', '-'));",
            ),
            // Values another table brings (a FROM) replace the old ones too.
            (
                "from_staging.sql",
                "CREATE TABLE staging AS SELECT id, id * 7 + 1000 AS price FROM products;\n\
                 UPDATE products p SET price = s.price FROM staging s WHERE s.id = p.id;",
            ),
            // A decoy that sets nothing first hides nothing.
            (
                "decoy.sql",
                "UPDATE products SET slug = slug || '' WHERE false;\nUPDATE products SET slug = lower(replace(name, ' ', '-'));",
            ),
            // Too few rows for a hazard: a note.
            ("few.sql", "UPDATE products SET slug = lower(replace(name, ' ', '-')) WHERE id <= 100;"),
            // A copy kept in a column the file adds, then dropped: the values
            // are lost, and the dropped column is the file's own, no golden loss.
            (
                "copy_dropped.sql",
                "ALTER TABLE products ADD COLUMN old_slug text;\nUPDATE products SET old_slug = slug;\n\
                 UPDATE products SET slug = lower(replace(name, ' ', '-'));\nALTER TABLE products DROP COLUMN old_slug;",
            ),
            // A golden column renamed, then dropped, is still the golden's.
            ("renamed_dropped.sql", "ALTER TABLE products RENAME COLUMN status TO state;\nALTER TABLE products DROP COLUMN state;"),
            // Two columns swapped: every value is still in the other.
            ("swap.sql", "UPDATE products SET name = slug, slug = name;"),
            // Controls: a relabel that 1,000 rows share reads backwards; the
            // same slugs made again change nothing; a rise computed from
            // the price itself reads backwards.
            ("relabel.sql", "UPDATE products SET status = 'archived' WHERE status = 'done';"),
            ("same_slugs.sql", "UPDATE products SET slug = 'p-' || id;"),
            ("price_rise.sql", "UPDATE products SET price = round(price * 1.1, 2);"),
            // Half the prices merged into one, the other half changed one
            // for one from another table: the message says both.
            (
                "half_merged.sql",
                "CREATE TABLE fix AS SELECT id, CASE WHEN id % 2 = 0 THEN 1.00 ELSE id END AS price FROM products;\n\
                 UPDATE products p SET price = f.price FROM fix f WHERE f.id = p.id;",
            ),
        ],
    );
    let c = by_name(&test_on(&d, "shop", &paths));

    let h = hazard(&c["slugs.sql"], "values_overwritten");
    assert_eq!((&h["severity"], &h["line"]), (&json!("high"), &json!(2)), "{h}");
    let said = h["message"].as_str().unwrap();
    assert!(
        said.starts_with("3,000 of the 3,000 rows of products lost their slug: 1 had slug 'p-"),
        "{said}"
    );
    assert!(said.contains("', now 'product-"), "{said}");
    assert!(
        said.ends_with(
            "; ...; a value computed from the row's other columns, one no other row holds, replaced each of them, \
             and what they were is not kept anywhere"
        ),
        "{said}"
    );
    assert!(numbers(said).iter().all(|n| *n <= 3_000), "{said}");
    assert!(
        h["suggestion"].as_str().unwrap().contains("CREATE TABLE products_slug_before AS SELECT id, slug"),
        "{h}"
    );
    let said = message(&c["prices_from_ids.sql"], "values_overwritten");
    assert!(said.starts_with("3,000 of the 3,000 rows of products lost their price"), "{said}");

    let h = hazard(&c["days.sql"], "values_overwritten");
    assert_eq!(h["severity"], json!("high"), "{h}");
    let said = h["message"].as_str().unwrap();
    // (Products 1,440 and 2,880 were made at midnight: nothing to cut.)
    assert!(
        said.starts_with("2,998 of the 3,000 rows of products lost their made: 1 had made '2020-"),
        "{said}"
    );
    assert!(said.contains("; date_trunc kept only part of each of them, and what they were"), "{said}");

    let said = message(&c["half_merged.sql"], "values_overwritten");
    // (Product 1 is now 1.00 too.)
    assert!(
        said.starts_with("3,000 of the 3,000 rows of products lost their price: 1,501 had other values"),
        "{said}"
    );
    assert!(
        said.contains(
            "; 1,501 took values that rows with other values hold too, and a value from other rows or tables, \
             one no other row holds, replaced each of the other 1,499, and what they were"
        ),
        "{said}"
    );
    let said = message(&c["from_staging.sql"], "values_overwritten");
    assert!(said.starts_with("3,000 of the 3,000 rows of products lost their price"), "{said}");
    assert!(
        said.contains("; a value from other rows or tables, one no other row holds, replaced each of them"),
        "{said}"
    );
    let said = message(&c["decoy.sql"], "values_overwritten");
    assert!(said.starts_with("3,000 of the 3,000 rows of products lost their slug"), "{said}");
    let dropped = &c["copy_dropped.sql"];
    assert!(
        message(dropped, "values_overwritten")
            .starts_with("3,000 of the 3,000 rows of products lost their slug"),
        "{dropped}"
    );
    assert!(!hazard_kinds(dropped).contains(&"column_dropped"), "{dropped}");
    let said = message(&c["renamed_dropped.sql"], "column_dropped");
    assert!(said.starts_with("drops column public.products."), "{said}");
    let few = &c["few.sql"];
    assert!(!hazard_kinds(few).contains(&"values_overwritten"), "{few}");
    let note = few["notes"].as_array().unwrap().iter().find(|n| n["kind"] == "values_overwritten");
    let said = note.unwrap_or_else(|| panic!("{few}"))["message"].as_str().unwrap();
    assert!(said.starts_with("100 of the 3,000 rows of products lost their slug"), "{said}");
    assert!(
        said.ends_with("(fewer than 1,000 rows and a tenth of the table: a note, not a hazard)"),
        "{said}"
    );
    let swap = &c["swap.sql"];
    assert!(!hazard_kinds(swap).contains(&"values_overwritten"), "{swap}");
    let kept: Vec<&str> = swap["notes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["kind"] == "values_overwritten")
        .map(|n| n["message"].as_str().unwrap())
        .collect();
    assert!(kept.iter().any(|m| m.ends_with("kept every old value in products.name")), "{kept:?}");
    assert!(kept.iter().any(|m| m.ends_with("kept every old value in products.slug")), "{kept:?}");

    let kept = &c["kept_first.sql"];
    assert!(!hazard_kinds(kept).contains(&"values_overwritten"), "{kept}");
    assert!(
        kept["notes"].as_array().unwrap().iter().any(|n| n["kind"] == "values_overwritten"
            && n["message"].as_str().unwrap().ends_with("kept every old value in products_slug_before.slug")),
        "{kept}"
    );
    for name in ["relabel.sql", "same_slugs.sql", "price_rise.sql"] {
        assert!(!hazard_kinds(&c[name]).contains(&"values_overwritten"), "{name}: {}", c[name]);
    }
}

#[test]
fn what_an_update_takes_out_of_json_documents_is_named_by_its_path() {
    let d = daemon();
    // Every document is unlike every other before and after, so only its
    // parts tell what went: a login every fifth event (1,000 of 5,000).
    d.golden(
        "documents",
        "CREATE TABLE events (id int PRIMARY KEY, kind text NOT NULL, payload jsonb NOT NULL, extra json);",
        "INSERT INTO events
         SELECT g, CASE WHEN g % 5 = 0 THEN 'login' ELSE 'view' END,
                jsonb_build_object('ip', '10.' || (g / 256) || '.' || (g % 256) || '.1', 'ua', 'agent ' || (g % 7),
                                   'v', 1, 'ref', NULL,
                                   'meta', jsonb_build_object('ip', '172.16.' || (g % 200) || '.' || (g / 200), 'ok', true)),
                json_build_object('token', md5(g::text), 'n', g)
           FROM generate_series(1, 5000) g;",
    );
    let paths = files(
        &d,
        &[
            ("strip_ip.sql", "-- privacy: stop keeping IP addresses\nUPDATE events SET payload = payload - 'ip' WHERE kind = 'login';"),
            ("mask_nested.sql", "UPDATE events SET payload = jsonb_set(payload, '{meta,ip}', '\"0.0.0.0\"');"),
            ("json_token.sql", "UPDATE events SET extra = (extra::jsonb - 'token')::json;"),
            (
                "kept_first.sql",
                "CREATE TABLE login_ips AS SELECT id AS event_id, payload->>'ip' AS ip FROM events WHERE kind = 'login';\n\
                 UPDATE events SET payload = payload - 'ip' WHERE kind = 'login';",
            ),
            // Kept in a type of its own whose cast to json would give the IP
            // back: reading runs no code of the candidate's, so no cast is
            // called and the range's own text is not the IP.
            (
                "kept_behind_a_cast.sql",
                "CREATE TYPE ip_span AS RANGE (subtype = text);\n\
                 CREATE FUNCTION ip_span_json(ip_span) RETURNS json LANGUAGE sql IMMUTABLE AS $$ SELECT to_json(lower($1)) $$;\n\
                 CREATE CAST (ip_span AS json) WITH FUNCTION ip_span_json(ip_span);\n\
                 CREATE TABLE login_ips AS SELECT id, ip_span(payload->>'ip', payload->>'ip', '[]') AS ip FROM events WHERE kind = 'login';\n\
                 UPDATE events SET payload = payload - 'ip' WHERE kind = 'login';",
            ),
            // Kept for a fifth of the rows only: the rest is said to be lost.
            (
                "kept_some.sql",
                "CREATE TABLE login_ips AS SELECT id, payload->>'ip' AS ip FROM events WHERE kind = 'login';\n\
                 UPDATE events SET payload = payload - 'ip';",
            ),
            // Told at the statement that wrote the documents last.
            (
                "wrap_then_strip.sql",
                "UPDATE events SET payload = jsonb_build_object('inner', payload);\n\
                 UPDATE events SET payload = payload #- '{inner,ip}';",
            ),
            // Made too large or too deep to compare part by part: said so,
            // neither taken as lost whole nor let through.
            (
                "padded.sql",
                "UPDATE events SET payload = (payload - 'ip') || (SELECT jsonb_object_agg('k' || g, g) FROM generate_series(1, 100) g)\n\
                 WHERE kind = 'login';",
            ),
            (
                "wrapped_deep.sql",
                "UPDATE events SET payload = (repeat('{\"w\": ', 20) || payload::text || repeat('}', 20))::jsonb;",
            ),
            // Moved, added, a key of one value or a null dropped: nothing lost.
            (
                "renamed_key.sql",
                "UPDATE events SET payload = (payload - 'ip') || jsonb_build_object('client_ip', payload->'ip');",
            ),
            ("added_key.sql", "UPDATE events SET payload = payload || '{\"source\": \"web\"}';"),
            ("in_arrays.sql", "UPDATE events SET payload = jsonb_build_array(1, jsonb_build_array(payload));"),
            ("constant_dropped.sql", "UPDATE events SET payload = payload - 'v' - 'ref';"),
        ],
    );
    let c = by_name(&test_on(&d, "documents", &paths));

    let h = hazard(&c["strip_ip.sql"], "values_overwritten");
    assert_eq!((&h["severity"], &h["line"]), (&json!("high"), &json!(2)), "{h}");
    let said = h["message"].as_str().unwrap();
    assert!(
        said.starts_with("1,000 of the 5,000 rows of events lost part of their payload: 1,000 held payload->'ip' (such as '10."),
        "{said}"
    );
    assert!(said.contains("1,000 distinct values), now gone; what they held is not kept anywhere"), "{said}");
    assert!(h["suggestion"].as_str().unwrap().contains("SELECT id, payload FROM events"), "{h}");
    let kinds = hazard_kinds(&c["strip_ip.sql"]);
    assert_eq!(kinds.iter().filter(|k| **k == "values_overwritten").count(), 1, "{}", c["strip_ip.sql"]);

    let said = message(&c["mask_nested.sql"], "values_overwritten");
    assert!(
        said.starts_with(
            "5,000 of the 5,000 rows of events lost part of their payload: 5,000 held payload->'meta'->'ip'"
        ),
        "{said}"
    );
    assert!(said.ends_with("now '0.0.0.0'; what they held is not kept anywhere"), "{said}");
    let said = message(&c["json_token.sql"], "values_overwritten");
    assert!(
        said.starts_with(
            "5,000 of the 5,000 rows of events lost part of their extra: 5,000 held extra->'token'"
        ),
        "{said}"
    );

    assert!(!hazard_kinds(&c["kept_first.sql"]).contains(&"values_overwritten"), "{}", c["kept_first.sql"]);
    let note =
        c["kept_first.sql"]["notes"].as_array().unwrap().iter().find(|n| n["kind"] == "values_overwritten");
    let said =
        note.unwrap_or_else(|| panic!("no note: {}", c["kept_first.sql"]))["message"].as_str().unwrap();
    assert!(said.starts_with("1,000 of the 5,000 rows of events lost part of their payload"), "{said}");
    assert!(said.ends_with("kept every value it took in login_ips.ip"), "{said}");

    let h = hazard(&c["kept_behind_a_cast.sql"], "values_overwritten");
    assert_eq!((&h["severity"], &h["line"]), (&json!("high"), &json!(5)), "{h}");
    assert!(h["message"].as_str().unwrap().ends_with("what they held is not kept anywhere"), "{h}");
    let h = hazard(&c["kept_some.sql"], "values_overwritten");
    assert_eq!(h["severity"], json!("high"), "{h}");
    let said = h["message"].as_str().unwrap();
    assert!(said.starts_with("5,000 of the 5,000 rows of events lost part of their payload"), "{said}");
    assert!(
        said.ends_with(
            "the migration kept those of 1,000 rows in login_ips.ip; the other 4,000 are not kept anywhere"
        ),
        "{said}"
    );
    let h = hazard(&c["wrap_then_strip.sql"], "values_overwritten");
    assert_eq!(h["line"], json!(2), "{h}");
    assert!(h["message"].as_str().unwrap().contains("held payload->'ip'"), "{h}");
    for (name, rows) in [("padded.sql", "1,000"), ("wrapped_deep.sql", "5,000")] {
        let found: Vec<&Value> = c[name]["hazards"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|h| h["kind"] == "values_overwritten")
            .collect();
        assert_eq!(found.len(), 1, "{name}: {}", c[name]);
        assert_eq!(found[0]["severity"], json!("medium"), "{name}: {}", found[0]);
        let said = found[0]["message"].as_str().unwrap();
        assert!(
            said.starts_with(&format!("{rows} of the 5,000 rows of events had their payload rewritten into documents too large or deep"))
                && said.ends_with("what they lost is not known"),
            "{name}: {said}"
        );
    }
    for name in ["renamed_key.sql", "added_key.sql", "in_arrays.sql", "constant_dropped.sql"] {
        assert!(!hazard_kinds(&c[name]).contains(&"values_overwritten"), "{name}: {}", c[name]);
    }
}

#[test]
fn a_hazard_falls_on_the_statement_that_did_it_and_a_materialized_views_key_is_missed() {
    let d = daemon();
    d.golden(
        "tickets",
        "CREATE TABLE tickets (id bigserial PRIMARY KEY, state text NOT NULL, opened date NOT NULL,
                               priority text NOT NULL DEFAULT 'normal');
         CREATE FUNCTION known_priority(text) RETURNS boolean LANGUAGE sql IMMUTABLE
           AS $$ SELECT $1 IN ('low', 'normal', 'urgent') $$;
         ALTER TABLE tickets ADD CONSTRAINT tickets_priority_known CHECK (known_priority(priority));
         CREATE TABLE comments (id serial PRIMARY KEY, ticket_id bigint NOT NULL REFERENCES tickets, body text);
         CREATE MATERIALIZED VIEW daily AS SELECT opened, state, count(*) AS n FROM tickets GROUP BY 1, 2;
         CREATE UNIQUE INDEX daily_key ON daily (opened, state);",
        "INSERT INTO tickets (state, opened, priority)
         SELECT (ARRAY['open', 'closed', 'stale'])[1 + g % 3], date '2026-01-01' + g % 90,
                (ARRAY['low', 'normal', 'urgent'])[1 + g % 3]
           FROM generate_series(1, 3000) g;
         INSERT INTO comments (ticket_id, body) SELECT g, 'seen' FROM generate_series(1, 3000, 6) g;
         REFRESH MATERIALIZED VIEW daily;",
    );
    let paths = files(
        &d,
        &[
            // The values go at the retype, not at the DROP DEFAULT that names the column first.
            (
                "retype_using.sql",
                "-- fold 'urgent' into 'normal'\nALTER TABLE tickets ALTER COLUMN priority DROP DEFAULT;\n\
                 ALTER TABLE tickets ALTER COLUMN priority TYPE varchar(10)\n  USING (CASE WHEN priority = 'urgent' THEN 'normal' ELSE priority END);\n\
                 ALTER TABLE tickets ALTER COLUMN priority SET DEFAULT 'normal';",
            ),
            // The identity's new sequence hands out 1: said at the statement that made it.
            (
                "identity.sql",
                "BEGIN;\nALTER TABLE tickets ALTER COLUMN id DROP DEFAULT;\nDROP SEQUENCE tickets_id_seq;\n\
                 ALTER TABLE tickets ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY;\nCOMMIT;",
            ),
            (
                "redefined.sql",
                "DROP MATERIALIZED VIEW daily;\n\
                 CREATE MATERIALIZED VIEW daily AS SELECT opened, state, count(*) AS n FROM tickets WHERE state <> 'stale' GROUP BY 1, 2;",
            ),
            (
                "redefined_with_key.sql",
                "DROP MATERIALIZED VIEW daily;\n\
                 CREATE MATERIALIZED VIEW daily AS SELECT opened, state, count(*) AS n FROM tickets WHERE state <> 'stale' GROUP BY 1, 2;\n\
                 CREATE UNIQUE INDEX daily_key ON daily (opened, state);",
            ),
            ("key_dropped.sql", "SELECT 1;\nDROP INDEX daily_key;"),
            // Made a plain view: it has no indexes to lose (breaks_compatibility tells of it).
            (
                "plain_view.sql",
                "DROP MATERIALIZED VIEW daily;\n\
                 CREATE VIEW daily AS SELECT opened, state, count(*) AS n FROM tickets GROUP BY 1, 2;",
            ),
            // A partition or an inheritance child calls its parent's sequence by design.
            (
                "children.sql",
                "CREATE TABLE hits (id bigserial, at date NOT NULL, PRIMARY KEY (id, at)) PARTITION BY RANGE (at);\n\
                 CREATE TABLE hits_2026 PARTITION OF hits FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');\n\
                 CREATE TABLE tickets_archived () INHERITS (tickets);",
            ),
            // A check dropped by a CASCADE: told at the statement that cascaded.
            ("cascade.sql", "SELECT 1;\nDROP FUNCTION known_priority(text) CASCADE;"),
            // A copy swapped in by renames: the foreign key pointing at the
            // table follows it to its new name, and the copy calls its sequence.
            (
                "copy_and_swap.sql",
                "CREATE TABLE tickets_new (LIKE tickets INCLUDING ALL);\nINSERT INTO tickets_new SELECT * FROM tickets;\n\
                 ALTER TABLE tickets RENAME TO tickets_old;\nALTER TABLE tickets_new RENAME TO tickets;",
            ),
        ],
    );
    let c = by_name(&test_on(&d, "tickets", &paths));

    let h = hazard(&c["retype_using.sql"], "values_overwritten");
    assert_eq!(h["line"], json!(3), "{h}");
    assert!(
        h["message"].as_str().unwrap().starts_with("1,000 of the 3,000 rows of tickets lost their priority"),
        "{h}"
    );
    assert_eq!(hazard(&c["retype_using.sql"], "table_rewrite")["line"], json!(3));
    // The DROP DEFAULT's lock held over the retype adds nothing to the
    // retype's own: one lock hazard, the rewrite's.
    assert!(!hazard_kinds(&c["retype_using.sql"]).contains(&"long_lock"), "{}", c["retype_using.sql"]);

    let h = hazard(&c["identity.sql"], "sequence_behind");
    assert_eq!(h["line"], json!(4), "{h}");

    let h = hazard(&c["redefined.sql"], "integrity_removed");
    assert_eq!((&h["severity"], &h["line"]), (&json!("high"), &json!(1)), "{h}");
    assert_eq!(
        h["message"],
        json!(
            "materialized view public.daily no longer has unique index daily_key on (opened, state): \
               REFRESH MATERIALIZED VIEW CONCURRENTLY on it now fails, and a refresh without \
               CONCURRENTLY blocks every reader of the view while it runs"
        )
    );
    assert!(
        h["suggestion"]
            .as_str()
            .unwrap()
            .contains("CREATE UNIQUE INDEX daily_key ON public.daily (opened, state)"),
        "{h}"
    );
    assert_eq!(hazard(&c["key_dropped.sql"], "integrity_removed")["line"], json!(2));
    assert!(
        !hazard_kinds(&c["redefined_with_key.sql"]).contains(&"integrity_removed"),
        "{}",
        c["redefined_with_key.sql"]
    );

    assert!(!hazard_kinds(&c["children.sql"]).contains(&"sequence_owned_elsewhere"), "{}", c["children.sql"]);
    assert!(!hazard_kinds(&c["plain_view.sql"]).contains(&"integrity_removed"), "{}", c["plain_view.sql"]);

    let h = hazard(&c["cascade.sql"], "integrity_removed");
    assert_eq!((&h["severity"], &h["line"]), (&json!("medium"), &json!(2)), "{h}");

    let swap = &c["copy_and_swap.sql"];
    let h = hazard(swap, "integrity_changed");
    assert_eq!((&h["severity"], &h["line"]), (&json!("high"), &json!(3)), "{h}");
    assert!(
        h["message"].as_str().unwrap().contains(
            "rows of public.comments must now point at rows of public.tickets_old, not of public.tickets"
        ),
        "{h}"
    );
    // At the copy: LIKE ... INCLUDING ALL brought the old table's default.
    let h = hazard(swap, "sequence_owned_elsewhere");
    assert_eq!((&h["severity"], &h["line"]), (&json!("medium"), &json!(1)), "{h}");
    assert_eq!(
        h["message"],
        json!("public.tickets.id takes its default from sequence public.tickets_id_seq, which belongs to public.tickets_old.id: \
               dropping public.tickets_old drops the sequence with it, and then every insert into public.tickets that takes the default fails")
    );
    assert!(
        h["suggestion"]
            .as_str()
            .unwrap()
            .ends_with("ALTER SEQUENCE public.tickets_id_seq OWNED BY public.tickets.id"),
        "{h}"
    );
}

#[test]
fn values_overwritten_where_no_key_pairs_the_rows_are_told_by_counts() {
    let d = Daemon::start(&[]);
    d.golden(
        "unkeyed",
        "CREATE TABLE events (kind text NOT NULL, at int NOT NULL, payload text);
         CREATE TABLE customers (id int PRIMARY KEY, tier text NOT NULL, email text);",
        "INSERT INTO events SELECT CASE WHEN g % 4 = 0 THEN 'error' ELSE 'info' END, g, 'p' || g
           FROM generate_series(1, 8000) g;
         INSERT INTO customers SELECT g, CASE WHEN g % 10 = 0 THEN 'enterprise' ELSE 'standard' END, 'c' || g
           FROM generate_series(1, 20000) g;",
    );
    let paths = files(
        &d,
        &[
            // A table without a primary key.
            ("unkeyed.sql", "UPDATE events SET kind = 'info';"),
            ("unkeyed_null.sql", "SELECT 1;\nUPDATE events SET payload = NULL WHERE at <= 3000;"),
            // The key set in the same statement: no row pairs with its old self.
            ("rekeyed.sql", "UPDATE customers SET id = id + 1000000, tier = 'standard';"),
            // Overwritten, then renamed (the column and its table).
            (
                "renamed_after.sql",
                "UPDATE customers SET tier = 'standard';\nALTER TABLE customers RENAME COLUMN tier TO plan;\n\
                 ALTER TABLE customers RENAME TO clients;",
            ),
            ("unkeyed_renamed_after.sql", "UPDATE events SET kind = 'info';\nALTER TABLE events RENAME kind TO level;"),
            // Its key column renamed after: still paired.
            (
                "key_renamed_after.sql",
                "UPDATE customers SET tier = 'standard';\nALTER TABLE customers RENAME COLUMN id TO customer_id;",
            ),
            // Computed from itself, but 8,000 values became one.
            ("collapsed.sql", "UPDATE events SET at = at * 0 + 1;"),
            // Kept first, under another name for the key: a note.
            (
                "kept_by_another_key.sql",
                "CREATE TABLE tiers_before AS SELECT id AS customer_id, tier AS old_tier FROM customers;\n\
                 UPDATE customers SET tier = 'standard';",
            ),
            // Controls: read backwards, from itself, deleted, or the key alone.
            ("unkeyed_upper.sql", "UPDATE events SET payload = upper(payload);"),
            ("unkeyed_bump.sql", "UPDATE events SET at = at + 1;"),
            ("unkeyed_delete.sql", "DELETE FROM events WHERE kind = 'error';"),
            ("rekeyed_only.sql", "UPDATE customers SET id = id + 1000000;"),
            // Grown past twice its rows first: the read after is bounded, and the table counted.
            (
                "grown.sql",
                "INSERT INTO customers SELECT g, 'standard', 'n' || g FROM generate_series(100001, 130000) g;\n\
                 UPDATE customers SET tier = 'standard';",
            ),
        ],
    );
    let c = by_name(&test_on(&d, "unkeyed", &paths));
    let said = message(&c["grown.sql"], "values_overwritten");
    assert!(
        said.starts_with(
            "2,000 of the 20,000 rows of customers lost their tier (told by how many rows hold each value"
        ),
        "{said}"
    );
    let h = hazard(&c["unkeyed.sql"], "values_overwritten");
    let said = h["message"].as_str().unwrap();
    assert!(
        said.starts_with(
            "2,000 of the 8,000 rows of events lost their kind (told by how many rows hold each value: no key pairs its rows here): 2,000 had kind 'error', now 'info'"
        ),
        "{said}"
    );
    assert!(h["suggestion"].as_str().unwrap().contains("AS SELECT * FROM events"), "{h}");
    let h = hazard(&c["unkeyed_null.sql"], "values_overwritten");
    assert_eq!(h["line"], json!(2), "{h}");
    let said = h["message"].as_str().unwrap();
    assert!(said.starts_with("3,000 of the 8,000 rows of events lost their payload"), "{said}");
    assert!(said.contains("now NULL") && said.contains("3,000 distinct values became 1"), "{said}");
    let said = message(&c["rekeyed.sql"], "values_overwritten");
    assert!(
        said.starts_with(
            "2,000 of the 20,000 rows of customers lost their tier (told by how many rows hold each value"
        ),
        "{said}"
    );
    assert!(said.contains("2,000 had tier 'enterprise', now 'standard'"), "{said}");
    let said = message(&c["renamed_after.sql"], "values_overwritten");
    assert!(
        said.starts_with("2,000 of the 20,000 rows of customers lost their tier: 2,000 had tier 'enterprise', now 'standard'"),
        "{said}"
    );
    let said = message(&c["key_renamed_after.sql"], "values_overwritten");
    assert!(
        said.starts_with("2,000 of the 20,000 rows of customers lost their tier: 2,000 had tier"),
        "{said}"
    );
    let said = message(&c["collapsed.sql"], "values_overwritten");
    assert!(said.starts_with("7,999 of the 8,000 rows of events lost their at (told by"), "{said}");
    let kept = &c["kept_by_another_key.sql"];
    assert!(!hazard_kinds(kept).contains(&"values_overwritten"), "{kept}");
    let note = kept["notes"].as_array().unwrap().iter().find(|n| n["kind"] == "values_overwritten");
    let said = note.unwrap_or_else(|| panic!("no note: {kept}"))["message"].as_str().unwrap();
    assert!(said.ends_with("kept every old value in tiers_before.old_tier"), "{said}");
    let said = message(&c["unkeyed_renamed_after.sql"], "values_overwritten");
    assert!(said.starts_with("2,000 of the 8,000 rows of events lost their kind (told by"), "{said}");
    for name in ["unkeyed_upper.sql", "unkeyed_bump.sql", "unkeyed_delete.sql", "rekeyed_only.sql"] {
        assert!(!hazard_kinds(&c[name]).contains(&"values_overwritten"), "{name}: {}", c[name]);
    }
}

#[test]
fn a_function_replaced_under_an_index_a_check_or_a_triggers_chain_is_named() {
    let d = Daemon::start(&[]);
    d.golden(
        "functions",
        "CREATE FUNCTION norm(t text) RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT lower(t) $$;
         CREATE FUNCTION valid_email(t text) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$ SELECT position('@' in t) > 1 $$;
         CREATE FUNCTION stamp() RETURNS text LANGUAGE plpgsql AS $$ BEGIN RETURN 'v1'; END $$;
         CREATE FUNCTION audit_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.note := stamp(); RETURN NEW; END $$;
         CREATE TABLE users (id int PRIMARY KEY, email text CHECK (valid_email(email)), note text);
         CREATE UNIQUE INDEX users_email ON users (norm(email));
         CREATE TRIGGER users_audit BEFORE INSERT OR UPDATE ON users FOR EACH ROW EXECUTE FUNCTION audit_row();
         CREATE FUNCTION gt_fn(a int, b int) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$ SELECT a > b $$;
         CREATE OPERATOR >>> (LEFTARG = int, RIGHTARG = int, FUNCTION = gt_fn);
         CREATE FUNCTION okv(v int) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$ SELECT v > 0 $$;
         CREATE DOMAIN okint AS int CHECK (okv(VALUE));
         CREATE TABLE amounts (id int PRIMARY KEY, amount int CHECK (amount >>> 0), qty okint);",
        "INSERT INTO users (id, email) SELECT g, 'u' || g || '@x' FROM generate_series(1, 1000) g;
         INSERT INTO amounts SELECT g, g, g FROM generate_series(1, 100) g;",
    );
    let norm =
        "CREATE OR REPLACE FUNCTION norm(t text) RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT t $$;";
    let stamp =
        "CREATE OR REPLACE FUNCTION stamp() RETURNS text LANGUAGE plpgsql AS $$ BEGIN RETURN 'v2'; END $$;";
    let reindexed = format!("{norm}\nREINDEX INDEX users_email;");
    let paths = files(
        &d,
        &[
            ("replace_norm.sql", norm),
            (
                "replace_valid.sql",
                "SELECT 1;\nCREATE OR REPLACE FUNCTION valid_email(t text) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$ SELECT true $$;",
            ),
            ("replace_stamp.sql", stamp),
            // Behind an operator, and under a domain's check.
            (
                "replace_operator.sql",
                "CREATE OR REPLACE FUNCTION gt_fn(a int, b int) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$ SELECT true $$;",
            ),
            (
                "replace_domain_check.sql",
                "CREATE OR REPLACE FUNCTION okv(v int) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$ SELECT true $$;",
            ),
            ("drop_stamp.sql", "DROP FUNCTION stamp();"),
            // Controls: the index made again after, a new function, the same body again.
            ("reindexed.sql", reindexed.as_str()),
            ("new_function.sql", "CREATE FUNCTION other() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$;"),
            (
                "same_body.sql",
                "CREATE OR REPLACE FUNCTION stamp() RETURNS text LANGUAGE plpgsql AS $$ BEGIN RETURN 'v1'; END $$;",
            ),
            // Planner hints change nothing a function returns; a setting can.
            ("hints.sql", "ALTER FUNCTION norm(text) PARALLEL SAFE COST 5;\nALTER FUNCTION stamp() PARALLEL SAFE;"),
            ("setting.sql", "ALTER FUNCTION norm(text) SET DateStyle = 'German';"),
            // A search path pinned to one that finds every name of the body
            // where it was found (hardening), and one that finds stamp() no more.
            (
                "pinned.sql",
                "ALTER FUNCTION norm(text) SET search_path = pg_catalog, pg_temp;
                 ALTER FUNCTION audit_row() SET search_path = public, pg_temp;",
            ),
            ("pinned_away.sql", "ALTER FUNCTION audit_row() SET search_path = pg_catalog, pg_temp;"),
            // A body replaced where the text shows only hints and renames: a
            // swap by names, and dynamic SQL beside a PARALLEL SAFE.
            (
                "swap.sql",
                "CREATE FUNCTION stamp2() RETURNS text LANGUAGE plpgsql AS $$ BEGIN RETURN 'v2'; END $$;\n\
                 ALTER FUNCTION stamp() RENAME TO stamp_old;\nALTER FUNCTION stamp2() RENAME TO stamp;",
            ),
            (
                "hidden.sql",
                "DO $$ BEGIN EXECUTE 'CREATE OR REPLACE FUNCTION st' || 'amp() RETURNS text LANGUAGE plpgsql AS '\n\
                 || quote_literal('BEGIN RETURN ''v3''; END'); END $$;\nALTER FUNCTION stamp() PARALLEL SAFE;",
            ),
        ],
    );
    let c = by_name(&test_on(&d, "functions", &paths));
    for name in ["swap.sql", "hidden.sql"] {
        let said = message(&c[name], "trigger_changed");
        assert!(said.starts_with("replaces function public.stamp()"), "{name}: {said}");
    }
    let said = message(&c["setting.sql"], "function_replaced");
    assert!(said.contains("public.norm(t text), which index users_email"), "{said}");
    let said = message(&c["pinned_away.sql"], "trigger_changed");
    assert!(said.starts_with("replaces function public.audit_row(), which trigger users_audit"), "{said}");
    let h = hazard(&c["replace_norm.sql"], "function_replaced");
    let said = h["message"].as_str().unwrap();
    assert!(said.starts_with("replaces function public.norm(t text), which index users_email on public.users runs: its entries were computed by the old body"), "{said}");
    assert_eq!((&h["severity"], &h["line"]), (&json!("high"), &json!(1)), "{h}");
    assert!(h["suggestion"].as_str().unwrap().contains("REINDEX INDEX CONCURRENTLY users_email"), "{h}");
    let h = hazard(&c["replace_valid.sql"], "function_replaced");
    let said = h["message"].as_str().unwrap();
    assert!(said.starts_with("replaces function public.valid_email(t text), which CHECK constraint users_email_check on public.users runs"), "{said}");
    assert_eq!((&h["severity"], &h["line"]), (&json!("medium"), &json!(2)), "{h}");
    let said = message(&c["replace_operator.sql"], "function_replaced");
    assert!(
        said.starts_with("replaces function public.gt_fn(a integer, b integer), which CHECK constraint amounts_amount_check on public.amounts runs"),
        "{said}"
    );
    let said = message(&c["replace_domain_check.sql"], "function_replaced");
    assert!(
        said.starts_with("replaces function public.okv(v integer), which CHECK constraint okint_check of domain public.okint runs"),
        "{said}"
    );
    let said = message(&c["replace_stamp.sql"], "trigger_changed");
    assert!(
        said.starts_with("replaces function public.stamp(), which public.audit_row() names, down the chain trigger users_audit on public.users runs"),
        "{said}"
    );
    let said = message(&c["drop_stamp.sql"], "trigger_changed");
    assert!(said.starts_with("drops function public.stamp()") && said.contains("now fails"), "{said}");
    for name in ["reindexed.sql", "new_function.sql", "same_body.sql", "hints.sql", "pinned.sql"] {
        let kinds = hazard_kinds(&c[name]);
        assert!(
            !kinds.contains(&"function_replaced") && !kinds.contains(&"trigger_changed"),
            "{name}: {kinds:?}"
        );
    }
}

#[test]
fn a_constraint_made_again_to_hold_otherwise_is_named() {
    let d = Daemon::start(&[]);
    d.golden(
        "kinds",
        "CREATE TABLE kinds (id int PRIMARY KEY);
         CREATE TABLE items (id int PRIMARY KEY, kind int REFERENCES kinds, qty int CHECK (qty > 0));",
        "INSERT INTO kinds SELECT g FROM generate_series(1, 10) g;
         INSERT INTO items SELECT g, 1 + g % 10, 1 + g % 7 FROM generate_series(1, 2000) g;",
    );
    let paths = files(
        &d,
        &[
            (
                "cascade.sql",
                "ALTER TABLE items DROP CONSTRAINT items_kind_fkey,\n\
                 ADD CONSTRAINT items_kind_fkey FOREIGN KEY (kind) REFERENCES kinds ON DELETE CASCADE;",
            ),
            (
                "cascade_renamed.sql",
                "ALTER TABLE items DROP CONSTRAINT items_kind_fkey;\n\
                 ALTER TABLE items ADD CONSTRAINT items_kind_cascades FOREIGN KEY (kind) REFERENCES kinds ON DELETE CASCADE;",
            ),
            (
                "loosen_check.sql",
                "ALTER TABLE items DROP CONSTRAINT items_qty_check, ADD CONSTRAINT items_qty_check CHECK (qty > -100);",
            ),
            // Controls: the same made again NOT VALID and validated; a new constraint.
            (
                "same_again.sql",
                "ALTER TABLE items DROP CONSTRAINT items_qty_check, ADD CONSTRAINT items_qty_check CHECK (qty > 0) NOT VALID;\n\
                 ALTER TABLE items VALIDATE CONSTRAINT items_qty_check;",
            ),
            ("new_check.sql", "ALTER TABLE items ADD CONSTRAINT items_id_positive CHECK (id > 0);"),
            // Renames rewrite definitions and change nothing they hold.
            (
                "renames.sql",
                "ALTER TABLE items RENAME COLUMN qty TO quantity;\nALTER TABLE items RENAME COLUMN id TO item_id;\n\
                 ALTER TABLE kinds RENAME COLUMN id TO kind_id;\nALTER TABLE kinds RENAME TO categories;",
            ),
        ],
    );
    let c = by_name(&test_on(&d, "kinds", &paths));
    let h = hazard(&c["cascade.sql"], "integrity_changed");
    let said = h["message"].as_str().unwrap();
    assert!(
        said.starts_with("changes constraint items_kind_fkey of public.items: was FOREIGN KEY (kind)"),
        "{said}"
    );
    assert!(
        said.contains("ON DELETE CASCADE: deleting a row of") && said.ends_with("where it was refused"),
        "{said}"
    );
    assert_eq!((&h["severity"], &h["line"]), (&json!("high"), &json!(1)), "{h}");
    assert!(h["suggestion"].as_str().unwrap().contains("ON DELETE as it was (NO ACTION)"), "{h}");
    let h = hazard(&c["cascade_renamed.sql"], "integrity_changed");
    let said = h["message"].as_str().unwrap();
    assert!(
        said.starts_with("replaces constraint items_kind_fkey of public.items")
            && said.contains("with items_kind_cascades"),
        "{said}"
    );
    assert_eq!((&h["severity"], &h["line"]), (&json!("high"), &json!(2)), "{h}");
    assert!(
        !hazard_kinds(&c["cascade_renamed.sql"]).contains(&"integrity_removed"),
        "{}",
        c["cascade_renamed.sql"]
    );
    let h = hazard(&c["loosen_check.sql"], "integrity_changed");
    assert!(h["message"].as_str().unwrap().ends_with("rows the old check refused may now be written"), "{h}");
    assert_eq!(h["severity"], json!("medium"), "{h}");
    for name in ["same_again.sql", "new_check.sql", "renames.sql"] {
        let kinds = hazard_kinds(&c[name]);
        assert!(
            !kinds.contains(&"integrity_changed") && !kinds.contains(&"integrity_removed"),
            "{name}: {kinds:?}"
        );
    }
}

#[test]
fn values_overwritten_under_a_new_name_or_by_a_trigger_the_file_makes_are_named() {
    let d = Daemon::start(&[]);
    d.golden(
        "renamed",
        "CREATE TABLE customers (id int PRIMARY KEY, tier text NOT NULL, name text, version int NOT NULL DEFAULT 1,
                                 touched timestamptz);",
        "INSERT INTO customers SELECT g, CASE WHEN g % 4 = 0 THEN 'enterprise' ELSE 'standard' END, 'c' || g, 1 + g % 5,
                '2020-01-01'::timestamptz + g * interval '1 minute'
           FROM generate_series(1, 8000) g;",
    );
    let trigger = |body: &str| {
        format!(
            "CREATE FUNCTION stamp() RETURNS trigger LANGUAGE plpgsql AS $$\nBEGIN\n  {body}\n  RETURN NEW;\nEND $$;\n\
             CREATE TRIGGER customers_stamp BEFORE UPDATE ON customers FOR EACH ROW EXECUTE FUNCTION stamp();\n\
             UPDATE customers SET name = upper(name) WHERE id % 4 = 0;"
        )
    };
    let paths = files(
        &d,
        &[
            (
                "rename_dance.sql",
                "ALTER TABLE customers RENAME COLUMN tier TO plan;\n\
                 UPDATE customers SET plan = 'standard' WHERE plan = 'enterprise';\n\
                 ALTER TABLE customers RENAME COLUMN plan TO tier;",
            ),
            ("trigger.sql", &trigger("NEW.tier := 'standard';")),
            // No statement names the column: through a view renaming it, or
            // an UPDATE whose names are made as it runs.
            (
                "view.sql",
                "CREATE VIEW plans AS SELECT id, tier AS plan FROM customers;
                 UPDATE plans SET plan = 'standard' WHERE plan = 'enterprise';",
            ),
            // A time, but not the clock's.
            (
                "view_time.sql",
                "CREATE VIEW stamps AS SELECT id, touched AS t FROM customers;\n\
                 UPDATE stamps SET t = '2000-01-01' WHERE id % 4 = 0;",
            ),
            // Grown past twice its rows first, or its key set through the view too: by counts.
            (
                "grown.sql",
                "INSERT INTO customers SELECT g, 'standard', 'n' || g, 1, NULL FROM generate_series(100001, 130000) g;\n\
                 CREATE VIEW plans AS SELECT id, tier AS plan FROM customers;\n\
                 UPDATE plans SET plan = 'standard' WHERE plan = 'enterprise';",
            ),
            (
                "rekeyed_view.sql",
                "CREATE VIEW labels AS SELECT id AS ident, name AS label FROM customers;\n\
                 UPDATE labels SET ident = ident + 100000, label = 'x';",
            ),
            // A decoy: an UPDATE of another column of the same table.
            (
                "decoy.sql",
                "CREATE VIEW plans AS SELECT id, tier AS plan FROM customers;\nUPDATE customers SET name = upper(name);\n\
                 UPDATE plans SET plan = 'standard' WHERE plan = 'enterprise';",
            ),
            (
                "execute.sql",
                "DO $$ BEGIN
  EXECUTE format('UPDATE %I SET %I = %L WHERE %I = %L', 'customers', 'tier', 'standard', 'tier', 'enterprise');
END $$;",
            ),
            // Controls: a trigger stamping the time, one bumping a version;
            // unnamed, a bump and a change read backwards through a view.
            ("touch.sql", &trigger("NEW.touched := now();")),
            ("bump.sql", &trigger("NEW.version := OLD.version + 1;")),
            (
                "execute_bump.sql",
                "DO $$ BEGIN EXECUTE 'UPDATE customers SET version = version + 1 WHERE id % 4 = 0'; END $$;",
            ),
            (
                "view_bump.sql",
                "CREATE VIEW versions AS SELECT id, version AS v FROM customers;\nUPDATE versions SET v = v + 1 WHERE id % 4 = 0;",
            ),
            (
                "view_upper.sql",
                "CREATE VIEW labels AS SELECT id, name AS label FROM customers;
UPDATE labels SET label = upper(label);",
            ),
        ],
    );
    let c = by_name(&test_on(&d, "renamed", &paths));
    for name in ["rename_dance.sql", "trigger.sql"] {
        let h = hazard(&c[name], "values_overwritten");
        assert!(
            h["message"]
                .as_str()
                .unwrap()
                .starts_with("2,000 of the 8,000 rows of customers lost their tier: 2,000 had tier 'enterprise', now 'standard'"),
            "{name}: {h}"
        );
    }
    for (name, line) in [("view.sql", 2), ("execute.sql", 1), ("decoy.sql", 2)] {
        let h = hazard(&c[name], "values_overwritten");
        assert_eq!(
            h["message"].as_str().unwrap().split(": 2,000 had").next(),
            Some(
                "2,000 of the 8,000 rows of customers lost their tier (no statement names the column: \
                 it was set through a view, a rule, a trigger or a name made as the file ran)"
            ),
            "{name}: {h}"
        );
        assert_eq!(h["line"], json!(line), "{name}: {h}");
        assert_eq!(
            hazard_kinds(&c[name]).iter().filter(|k| **k == "values_overwritten").count(),
            1,
            "{name}"
        );
    }
    for (name, column) in [("grown.sql", "tier"), ("rekeyed_view.sql", "name")] {
        let said = message(&c[name], "values_overwritten");
        assert!(
            said.contains(&format!("lost their {column} (no statement names the column")),
            "{name}: {said}"
        );
        assert!(said.contains("told by how many rows hold each value"), "{name}: {said}");
    }
    let said = message(&c["view_time.sql"], "values_overwritten");
    assert!(
        said.starts_with("2,000 of the 8,000 rows of customers lost their touched (no statement names"),
        "{said}"
    );
    assert!(said.contains("now '2000-01-01 00:00:00+00'"), "{said}");
    for name in ["touch.sql", "bump.sql", "execute_bump.sql", "view_bump.sql", "view_upper.sql"] {
        assert!(!hazard_kinds(&c[name]).contains(&"values_overwritten"), "{name}: {}", c[name]);
    }
    // A command has no text at all.
    let out = d.cli(&[
        "migrate",
        "test",
        "--golden",
        "renamed",
        "--json",
        "--exec",
        "psql \"$DATABASE_URL\" -v ON_ERROR_STOP=1 -c \"UPDATE customers SET tier = 'standard'\"",
    ]);
    let report: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    let h = hazard(&report["candidates"][0], "values_overwritten");
    assert!(h["message"].as_str().unwrap().contains("lost their tier (no statement names the column"), "{h}");
}

#[test]
fn what_a_domain_held_its_columns_to_and_loses_is_named_with_the_columns() {
    let d = Daemon::start(&[]);
    d.golden(
        "domains",
        "CREATE DOMAIN qty AS int NOT NULL CONSTRAINT qty_positive CHECK (VALUE > 0);
         CREATE DOMAIN code AS text CONSTRAINT \"code; shape\" CHECK (VALUE ~ '^[A-Z]{3}$' AND VALUE <> 'A; B');
         CREATE TABLE items (id int PRIMARY KEY, qty qty, code code);
         CREATE TABLE stock (id int PRIMARY KEY, on_hand qty);",
        "INSERT INTO items SELECT g, 1 + g % 7, 'ABC' FROM generate_series(1, 500) g;
         INSERT INTO stock SELECT g, g FROM generate_series(1, 100) g;",
    );
    let paths = files(
        &d,
        &[
            ("drop_check.sql", "SELECT 1;\nALTER DOMAIN qty DROP CONSTRAINT qty_positive;"),
            ("drop_not_null.sql", "ALTER DOMAIN qty DROP NOT NULL;"),
            (
                "loosen.sql",
                "ALTER DOMAIN code DROP CONSTRAINT \"code; shape\";\n\
                 ALTER DOMAIN code ADD CONSTRAINT \"code; shape\" CHECK (VALUE ~ '^[A-Z]+$');",
            ),
            ("off_domain.sql", "ALTER TABLE stock ALTER COLUMN on_hand TYPE int;"),
            // Controls: a rename; the check made again NOT VALID under another
            // name, then validated; a column given another domain that holds the same.
            ("rename.sql", "ALTER DOMAIN qty RENAME TO quantity;"),
            (
                "again.sql",
                "ALTER DOMAIN qty ADD CONSTRAINT qty_above_zero CHECK (VALUE > 0) NOT VALID;\n\
                 ALTER DOMAIN qty DROP CONSTRAINT qty_positive;\nALTER DOMAIN qty VALIDATE CONSTRAINT qty_above_zero;",
            ),
            (
                "same_domain.sql",
                "CREATE DOMAIN amount AS int NOT NULL CHECK (VALUE > 0);\n\
                 ALTER TABLE stock ALTER COLUMN on_hand TYPE amount;",
            ),
        ],
    );
    let c = by_name(&test_on(&d, "domains", &paths));
    let h = hazard(&c["drop_check.sql"], "integrity_removed");
    assert_eq!(
        h["message"],
        json!(
            "drops constraint qty_positive of domain public.qty (CHECK ((VALUE > 0))): values for which it is false \
             may now be written into public.items.qty, public.stock.on_hand"
        ),
        "{h}"
    );
    assert_eq!((&h["severity"], &h["line"]), (&json!("medium"), &json!(2)), "{h}");
    assert!(h["suggestion"].as_str().unwrap().contains("NOT VALID, then VALIDATE"), "{h}");
    let h = hazard(&c["drop_not_null.sql"], "integrity_removed");
    assert_eq!(
        h["message"],
        json!("drops NOT NULL from domain public.qty: NULL may now be written into public.items.qty, public.stock.on_hand"),
        "{h}"
    );
    assert_eq!(h["line"], json!(1), "{h}");
    // The check's name and literal hold "; ".
    let h = hazard(&c["loosen.sql"], "integrity_changed");
    let said = h["message"].as_str().unwrap();
    assert!(said.starts_with("changes constraint code; shape of domain public.code: was CHECK"), "{said}");
    assert!(
        said.contains("'A; B'") && said.ends_with("for every value written into public.items.code"),
        "{said}"
    );
    let h = hazard(&c["off_domain.sql"], "integrity_removed");
    let said = h["message"].as_str().unwrap();
    assert!(said.starts_with("public.stock.on_hand now of type integer, not domain public.qty"), "{said}");
    assert_eq!(
        c["off_domain.sql"]["hazards"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|h| h["kind"] == "integrity_removed")
            .count(),
        2,
        "NOT NULL and the CHECK: {}",
        c["off_domain.sql"]
    );
    for name in ["rename.sql", "again.sql", "same_domain.sql"] {
        let kinds = hazard_kinds(&c[name]);
        assert!(
            !kinds.contains(&"integrity_changed") && !kinds.contains(&"integrity_removed"),
            "{name}: {kinds:?} {}",
            c[name]
        );
    }

    // A domain made over another holds both; a composite type's field is a place too.
    d.golden(
        "layered",
        "CREATE DOMAIN base AS int NOT NULL CHECK (VALUE > 0);
         CREATE DOMAIN capped AS base CHECK (VALUE < 1000);
         CREATE TYPE lineitem AS (q base, note text);
         CREATE TABLE stock (id int PRIMARY KEY, on_hand base, lim capped, last lineitem);",
        "INSERT INTO stock SELECT g, g, g, ROW(g, 'n')::lineitem FROM generate_series(1, 100) g;",
    );
    let paths = files(
        &d,
        &[
            ("drop_base.sql", "ALTER DOMAIN base DROP CONSTRAINT base_check;"),
            // Controls: a column moved to a domain that holds more.
            ("tighter.sql", "ALTER TABLE stock ALTER COLUMN on_hand TYPE capped;"),
        ],
    );
    let c = by_name(&test_on(&d, "layered", &paths));
    let h = hazard(&c["drop_base.sql"], "integrity_removed");
    assert_eq!(
        h["message"],
        json!(
            "drops constraint base_check of domain public.base (CHECK ((VALUE > 0))): values for which it is false \
             may now be written into public.stock.on_hand, public.stock.lim, public.stock.last.q"
        ),
        "{h}"
    );
    let kinds = hazard_kinds(&c["tighter.sql"]);
    assert!(!kinds.contains(&"integrity_removed"), "{kinds:?} {}", c["tighter.sql"]);
}

/// The daemon's peak resident memory, in kB.
fn peak_memory_kb(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn keys_a_candidate_makes_a_megabyte_long_are_held_by_their_digest() {
    let d = Daemon::start(&[]);
    d.golden(
        "textkeys",
        "CREATE TABLE t (id text PRIMARY KEY, tier text NOT NULL);",
        "INSERT INTO t SELECT 'k' || g, CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END FROM generate_series(1, 2000) g;",
    );
    let paths = files(
        &d,
        &[(
            "bloat.sql",
            "ALTER TABLE t DROP CONSTRAINT t_pkey;\n\
             CREATE FUNCTION bloat() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.id := NEW.id || repeat('x', 1000000); RETURN NEW; END $$;\n\
             CREATE TRIGGER bloat BEFORE UPDATE ON t FOR EACH ROW EXECUTE FUNCTION bloat();\n\
             UPDATE t SET tier = 'a';",
        )],
    );
    let before = peak_memory_kb(d.pid());
    let c = by_name(&test_on(&d, "textkeys", &paths));
    assert!(c["bloat.sql"]["hazards"].as_array().is_some_and(|h| !h.is_empty()), "{}", c["bloat.sql"]);
    // 2,000 keys of a megabyte each are 2 GB of text: held whole, the
    // daemon's peak grew by several times that.
    let grown = peak_memory_kb(d.pid()).saturating_sub(before);
    assert!(grown < 300_000, "the daemon's peak memory grew by {grown} kB");
}

#[test]
fn what_a_migration_opens_up_or_switches_off_is_named() {
    let d = Daemon::start(&[]);
    d.golden(
        "guarded",
        "CREATE TABLE accounts (id int PRIMARY KEY, tenant int NOT NULL, balance int NOT NULL, touched timestamptz);
         ALTER TABLE accounts ENABLE ROW LEVEL SECURITY;
         CREATE POLICY tenant_rows ON accounts USING (tenant = 1);
         CREATE POLICY no_negative ON accounts AS RESTRICTIVE USING (balance >= 0);
         CREATE FUNCTION touch() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.touched := now(); RETURN NEW; END $$;
         CREATE TRIGGER accounts_touch BEFORE UPDATE ON accounts FOR EACH ROW EXECUTE FUNCTION touch();
         CREATE SCHEMA private;
         CREATE TABLE memos (id int PRIMARY KEY, tenant int NOT NULL);",
        "INSERT INTO accounts SELECT g, g % 5, g, NULL FROM generate_series(1, 5000) g;
         INSERT INTO memos SELECT g, g % 3 FROM generate_series(1, 300) g;",
    );
    let paths = files(
        &d,
        &[
            ("rls_off.sql", "ALTER TABLE accounts DISABLE ROW LEVEL SECURITY;"),
            ("drop_restrictive.sql", "SELECT 1;\nDROP POLICY no_negative ON accounts;"),
            ("grant_public.sql", "GRANT SELECT, UPDATE ON accounts TO PUBLIC;"),
            ("drop_trigger.sql", "DROP TRIGGER accounts_touch ON accounts;"),
            ("disable_trigger.sql", "ALTER TABLE accounts DISABLE TRIGGER accounts_touch;"),
            ("loosen_restrictive.sql", "ALTER POLICY no_negative ON accounts USING (true);"),
            (
                "restrictive_to_permissive.sql",
                "DROP POLICY no_negative ON accounts;\nCREATE POLICY no_negative ON accounts USING (balance >= 0);",
            ),
            ("add_permissive.sql", "CREATE POLICY everyone ON accounts USING (true);"),
            (
                "policy_or.sql",
                "ALTER POLICY tenant_rows ON accounts USING (tenant = 1 OR current_setting('app.all', true) = 'on');",
            ),
            ("schema_grant.sql", "GRANT USAGE ON SCHEMA private TO PUBLIC;"),
            ("schema_revoke.sql", "-- lock it down\nREVOKE ALL ON SCHEMA public FROM PUBLIC;"),
            // Policies first, then row security on: access only narrows.
            (
                "policy_then_rls.sql",
                "CREATE POLICY memos_tenant ON memos USING (tenant = 1);\nALTER TABLE memos ENABLE ROW LEVEL SECURITY;",
            ),
            (
                "new_trigger.sql",
                "CREATE FUNCTION stamp() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;\n\
                 CREATE TRIGGER accounts_stamp AFTER INSERT ON accounts FOR EACH ROW EXECUTE FUNCTION stamp();",
            ),
            (
                "trigger_when_false.sql",
                "DROP TRIGGER accounts_touch ON accounts;\n\
                 CREATE TRIGGER accounts_touch BEFORE UPDATE ON accounts FOR EACH ROW WHEN (false) EXECUTE FUNCTION touch();",
            ),
            (
                "copy_then_disable.sql",
                "CREATE TRIGGER accounts_touch2 BEFORE UPDATE ON accounts FOR EACH ROW EXECUTE FUNCTION touch();\n\
                 DROP TRIGGER accounts_touch ON accounts;\nALTER TABLE accounts DISABLE TRIGGER accounts_touch2;",
            ),
            (
                "empty_function.sql",
                "CREATE OR REPLACE FUNCTION touch() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;",
            ),
            // Access opened through objects the candidate makes.
            (
                "view_leak.sql",
                "CREATE VIEW all_accounts AS SELECT * FROM accounts;\nGRANT SELECT ON all_accounts TO PUBLIC;",
            ),
            (
                "definer.sql",
                "CREATE FUNCTION leak() RETURNS SETOF accounts LANGUAGE sql SECURITY DEFINER AS 'SELECT * FROM accounts';",
            ),
            ("default_privileges.sql", "ALTER DEFAULT PRIVILEGES GRANT SELECT ON TABLES TO PUBLIC;"),
            // A view over a table PUBLIC cannot read, granted to PUBLIC.
            (
                "view_over_unreadable.sql",
                "CREATE VIEW memo_tenants AS SELECT DISTINCT tenant FROM memos;
GRANT SELECT ON memo_tenants TO PUBLIC;",
            ),
            (
                "invoker_over_unreadable.sql",
                "CREATE VIEW memo_list WITH (security_invoker = true) AS SELECT * FROM memos;
                 GRANT SELECT ON memo_list TO PUBLIC;",
            ),
            // An INSERT policy spelling out what the FOR ALL policy's check holds.
            ("insert_policy_same.sql", "CREATE POLICY tenant_insert ON accounts FOR INSERT WITH CHECK (tenant = 1);"),
            // Granted by name what PUBLIC already holds: nothing opens.
            (
                "granted_what_public_holds.sql",
                "GRANT USAGE ON SCHEMA public TO airlock_agent;
GRANT EXECUTE ON FUNCTION touch() TO airlock_agent;",
            ),
            (
                "invoker_view.sql",
                "CREATE VIEW mine WITH (security_invoker = true) AS SELECT * FROM accounts;\n\
                 GRANT SELECT ON mine TO PUBLIC;",
            ),
            (
                "definer_revoked.sql",
                "CREATE FUNCTION leak() RETURNS SETOF accounts LANGUAGE sql SECURITY DEFINER AS 'SELECT * FROM accounts';\n\
                 REVOKE EXECUTE ON FUNCTION leak() FROM PUBLIC;",
            ),
            // Nothing opened up: a policy renamed; a permissive policy dropped narrows what roles
            // see, a trigger renamed still runs, a column added is just that.
            ("drop_permissive.sql", "DROP POLICY tenant_rows ON accounts;"),
            ("rename_restrictive.sql", "ALTER POLICY no_negative ON accounts RENAME TO no_negative_balance;"),
            ("rename_trigger.sql", "ALTER TRIGGER accounts_touch ON accounts RENAME TO accounts_touched;"),
            ("add_column.sql", "ALTER TABLE accounts ADD COLUMN note text;"),
        ],
    );
    let c = by_name(&test_on(&d, "guarded", &paths));

    let h = hazard(&c["rls_off.sql"], "access_widened");
    let said = h["message"].as_str().unwrap();
    assert!(said.starts_with("turns row-level security off on public.accounts"), "{said}");
    assert!(said.contains("no_negative, tenant_rows") && said.contains("all its 5000 rows"), "{said}");
    assert_eq!((&h["severity"], &h["line"]), (&json!("high"), &json!(1)), "{h}");
    let h = hazard(&c["drop_restrictive.sql"], "access_widened");
    assert!(
        h["message"].as_str().unwrap().starts_with("drops restrictive policy no_negative on public.accounts"),
        "{h}"
    );
    assert_eq!(h["line"], 2, "{h}");
    let said = message(&c["grant_public.sql"], "access_widened");
    assert!(said.starts_with("grants SELECT, UPDATE on table public.accounts to PUBLIC"), "{said}");
    let said = message(&c["drop_trigger.sql"], "trigger_removed");
    assert!(
        said.starts_with("drops trigger accounts_touch on public.accounts") && said.contains("touch()"),
        "{said}"
    );
    let said = message(&c["disable_trigger.sql"], "trigger_removed");
    assert!(said.contains("accounts_touch") && said.contains("(disabled)"), "{said}");
    let said = message(&c["loosen_restrictive.sql"], "access_widened");
    assert!(
        said.starts_with("makes restrictive policy no_negative on public.accounts let every row through"),
        "{said}"
    );
    let said = message(&c["restrictive_to_permissive.sql"], "access_widened");
    assert!(said.starts_with("makes restrictive policy no_negative on public.accounts permissive"), "{said}");
    let h = hazard(&c["add_permissive.sql"], "access_widened");
    assert!(
        h["message"].as_str().unwrap().starts_with("adds permissive policy everyone on public.accounts"),
        "{h}"
    );
    // USING (true): every row, to every role it names.
    assert!(h["message"].as_str().unwrap().contains("may now read every one of its 5000 rows"), "{h}");
    assert_eq!(h["severity"], "high");
    let h = hazard(&c["policy_or.sql"], "access_widened");
    assert_eq!(h["severity"], "high", "{h}");
    assert!(
        h["message"]
            .as_str()
            .unwrap()
            .starts_with("widens policy tenant_rows on public.accounts with an alternative"),
        "{h}"
    );
    let said = message(&c["schema_grant.sql"], "access_widened");
    assert!(said.starts_with("grants USAGE on schema private to PUBLIC"), "{said}");
    let added = hazard(&c["new_trigger.sql"], "trigger_added");
    assert_eq!((&added["severity"], &added["line"]), (&json!("medium"), &json!(2)), "{added}");
    assert!(
        added["message"].as_str().unwrap().starts_with(
            "adds trigger accounts_stamp on public.accounts: the application's writes to it now run it too"
        ),
        "{added}"
    );
    // A copy of a golden trigger under a new name adds nothing.
    assert!(
        !hazard_kinds(&c["copy_then_disable.sql"]).contains(&"trigger_added"),
        "{}",
        c["copy_then_disable.sql"]
    );
    let narrowed_memos = hazard(&c["policy_then_rls.sql"], "access_narrowed");
    assert_eq!(
        (&narrowed_memos["severity"], &narrowed_memos["line"]),
        (&json!("medium"), &json!(2)),
        "{narrowed_memos}"
    );
    assert!(
        !hazard_kinds(&c["policy_then_rls.sql"]).contains(&"access_widened"),
        "{}",
        c["policy_then_rls.sql"]
    );
    let revoked = hazard(&c["schema_revoke.sql"], "access_narrowed");
    assert_eq!((&revoked["severity"], &revoked["line"]), (&json!("high"), &json!(2)), "{revoked}");
    assert!(
        revoked["message"]
            .as_str()
            .unwrap()
            .starts_with("revokes USAGE on schema public from PUBLIC: every role but its owner"),
        "{revoked}"
    );
    assert!(
        revoked["message"]
            .as_str()
            .unwrap()
            .ends_with("so they can no longer reach any table, view or function in it"),
        "{revoked}"
    );
    let said = message(&c["trigger_when_false.sql"], "trigger_changed");
    assert!(
        said.starts_with("changes trigger accounts_touch on public.accounts")
            && said.contains("WHEN (false)"),
        "{said}"
    );
    assert!(
        hazard_kinds(&c["copy_then_disable.sql"]).contains(&"trigger_removed"),
        "{}",
        c["copy_then_disable.sql"]
    );
    let said = message(&c["empty_function.sql"], "trigger_changed");
    assert!(said.contains("touch()") && said.contains("accounts_touch"), "{said}");
    let said = message(&c["view_leak.sql"], "access_widened");
    assert!(
        said.starts_with("view public.all_accounts reads public.accounts") && said.contains("PUBLIC"),
        "{said}"
    );
    let said = message(&c["definer.sql"], "access_widened");
    assert!(
        said.contains("leak()") && said.contains("SECURITY DEFINER") && said.contains("PUBLIC"),
        "{said}"
    );
    let said = message(&c["default_privileges.sql"], "access_widened");
    assert!(said.starts_with("default privileges") && said.contains("SELECT to PUBLIC"), "{said}");
    let h = hazard(&c["view_over_unreadable.sql"], "access_widened");
    assert_eq!((&h["severity"], &h["line"]), (&json!("medium"), &json!(1)), "{h}");
    assert!(
        h["message"].as_str().unwrap().starts_with(
            "view public.memo_tenants reads public.memos with its owner's rights, and every role (PUBLIC) may read the view though not that table"
        ),
        "{h}"
    );
    for name in [
        "invoker_over_unreadable.sql",
        "granted_what_public_holds.sql",
        "insert_policy_same.sql",
        "invoker_view.sql",
        "definer_revoked.sql",
        "drop_permissive.sql",
        "rename_restrictive.sql",
        "rename_trigger.sql",
        "add_column.sql",
    ] {
        let kinds = hazard_kinds(&c[name]);
        assert!(
            ["access_widened", "policy_changed", "trigger_removed", "trigger_changed"]
                .iter()
                .all(|k| !kinds.contains(k)),
            "{name}: {kinds:?}"
        );
    }
}

#[test]
fn sequences_left_behind_defaults_gone_enum_values_renamed_and_what_a_rewrite_does_are_told_once() {
    let d = Daemon::start(&[]);
    d.golden(
        "numbers",
        "CREATE TYPE state AS ENUM ('open', 'cancelled', 'done');
         CREATE SEQUENCE invoice_no START 100;
         CREATE SEQUENCE note_no;
         CREATE TABLE invoices (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                                number bigint NOT NULL DEFAULT nextval('invoice_no') UNIQUE,
                                state state NOT NULL DEFAULT 'open',
                                note int DEFAULT nextval('note_no'));
         CREATE TABLE items (id serial PRIMARY KEY, qty int CHECK (qty > 0));
         CREATE INDEX items_qty ON items (qty);
         CREATE TABLE legacy (id int PRIMARY KEY, name text);
         CREATE TABLE notes (id int PRIMARY KEY, owner text);
         CREATE POLICY own ON notes USING (owner = current_user);
         CREATE TABLE parents (id int PRIMARY KEY);
         CREATE TABLE children (id int PRIMARY KEY, parent int NOT NULL REFERENCES parents ON DELETE CASCADE);
         CREATE TABLE plans (id int PRIMARY KEY, tier text NOT NULL);
         CREATE TABLE bt_plain (id int GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, v int);
         CREATE TYPE postal AS (street text, city text);
         CREATE TABLE labels (id int PRIMARY KEY, code varchar(10) UNIQUE);",
        "INSERT INTO invoices (state) SELECT (ARRAY['open', 'cancelled', 'done']::state[])[1 + g % 3]
           FROM generate_series(1, 2000) g;
         INSERT INTO items (qty) SELECT 1 + g % 5 FROM generate_series(1, 2000) g;
         INSERT INTO legacy SELECT g, 'n' FROM generate_series(1, 500) g;
         INSERT INTO notes SELECT g, 'someone' FROM generate_series(1, 300) g;
         INSERT INTO parents SELECT g FROM generate_series(1, 100) g;
         INSERT INTO children SELECT g, 1 + g % 100 FROM generate_series(1, 1000) g;
         INSERT INTO plans SELECT g, (ARRAY['free', 'pro', 'team'])[1 + g % 3] FROM generate_series(1, 40) g;
         INSERT INTO labels SELECT g, 'L' || g FROM generate_series(1, 500) g;",
    );
    let paths = files(
        &d,
        &[
            ("restart.sql", "-- a new year\nALTER SEQUENCE invoice_no RESTART WITH 100;"),
            ("restart_forward.sql", "ALTER SEQUENCE invoice_no RESTART WITH 5000;"),
            ("setval.sql", "SELECT setval('items_id_seq', 10);"),
            // Sequences brought to the end of their range, or near it.
            ("to_the_top.sql", "SELECT setval('items_id_seq', 2147483647);"),
            ("max_lowered.sql", "ALTER SEQUENCE invoice_no MAXVALUE 2500;"),
            // A small table's every row given one value; values overwritten
            // by a function the file made earlier, said where it ran.
            ("small_table.sql", "UPDATE plans SET tier = 'enterprise';"),
            (
                "through_a_function.sql",
                "CREATE FUNCTION public.close_all() RETURNS void LANGUAGE sql AS $$ UPDATE public.invoices SET state = 'done' $$;\n\
                 SELECT 1;\n\
                 SELECT public.close_all();",
            ),
            ("not_unique.sql", "SELECT setval('note_no', 1000, false);"),
            ("identity.sql", "ALTER TABLE legacy ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY;"),
            (
                "drop_default.sql",
                "ALTER TABLE invoices ALTER COLUMN number DROP DEFAULT;\nALTER TABLE invoices ALTER COLUMN id DROP IDENTITY;",
            ),
            ("enum_rename.sql", "ALTER TYPE state RENAME VALUE 'cancelled' TO 'canceled';"),
            ("sequence_rename.sql", "-- clearer name\nALTER SEQUENCE note_no RENAME TO note_number;"),
            ("always.sql", "-- ids are ours\nALTER TABLE bt_plain ALTER COLUMN id SET GENERATED ALWAYS;"),
            ("new_default.sql", "ALTER TABLE invoices ALTER COLUMN state SET DEFAULT 'done';"),
            ("retype.sql", "ALTER TABLE items ALTER COLUMN qty TYPE bigint;"),
            ("generated.sql", "ALTER TABLE items ADD COLUMN twice int GENERATED ALWAYS AS (qty * 2) STORED;"),
            // The fifth row's qty would be 0: four rows are written, then undone.
            ("fails_midway.sql", "UPDATE items SET qty = qty - 1;"),
            (
                "in_one_transaction.sql",
                "BEGIN;\nALTER TABLE legacy ADD COLUMN tag text;\nUPDATE legacy SET tag = 'x';\n\
                 ALTER TABLE legacy ALTER COLUMN tag SET NOT NULL;\nCOMMIT;",
            ),
            // Controls: sequences put past what their columns hold, a label added.
            (
                "past_the_top.sql",
                "SELECT setval('items_id_seq', (SELECT max(id) FROM items));\n\
                 ALTER TABLE legacy ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (START WITH 501);",
            ),
            ("enum_add.sql", "ALTER TYPE state ADD VALUE 'archived';"),
            // A sequence made OWNED BY a golden table's column runs as on the
            // target, where the table's owner runs the file; one value behind.
            (
                "owned_by.sql",
                "ALTER TABLE plans ADD COLUMN plan_no int UNIQUE;
UPDATE plans SET plan_no = 1000 + id;
                 CREATE SEQUENCE plans_plan_no_seq START 1040 OWNED BY plans.plan_no;
                 ALTER TABLE plans ALTER COLUMN plan_no SET DEFAULT nextval('plans_plan_no_seq');",
            ),
            ("rls_no_policy.sql", "ALTER TABLE legacy ENABLE ROW LEVEL SECURITY;"),
            ("rls_forced.sql", "ALTER TABLE legacy ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;"),
            ("rls_policy.sql", "ALTER TABLE notes ENABLE ROW LEVEL SECURITY;"),
            // The candidate's function refuses the reader: not read is not clear.
            (
                "unreadable.sql",
                "CREATE FUNCTION public.refuse(i int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$\n\
                 BEGIN IF current_user = 'airlock_reader' THEN RAISE EXCEPTION 'not for you'; END IF; RETURN i; END $$;\n\
                 CREATE TABLE bt (id bigserial PRIMARY KEY, v int NOT NULL);\n\
                 INSERT INTO bt (v) SELECT generate_series(1, 500);\n\
                 CREATE INDEX bt_refusing ON bt (v) WHERE public.refuse(1) > 0;\n\
                 SELECT setval('bt_id_seq', 3);",
            ),
            (
                "odd_names.sql",
                "CREATE TABLE \"od.d\" (\"c\"\"ol.1\" serial PRIMARY KEY);\n\
                 INSERT INTO \"od.d\" SELECT generate_series(1, 300);\n\
                 SELECT setval(pg_get_serial_sequence('\"od.d\"', 'c\"ol.1'), 1);",
            ),
            (
                "descending.sql",
                "CREATE SEQUENCE down INCREMENT -1 MINVALUE -1000 MAXVALUE 0 START 0;\n\
                 CREATE TABLE dt (id int PRIMARY KEY DEFAULT nextval('down'));\n\
                 INSERT INTO dt SELECT -g FROM generate_series(0, 99) g;\n\
                 SELECT setval('down', -5);",
            ),
            ("default_added.sql", "ALTER TABLE legacy ALTER COLUMN name SET DEFAULT 'n';"),
            // A parent's key leaves out its children's rows: they repeat, not fail.
            (
                "inherited.sql",
                "CREATE TABLE parent_ids (id serial PRIMARY KEY);\n\
                 CREATE TABLE child_ids () INHERITS (parent_ids);\n\
                 INSERT INTO child_ids SELECT generate_series(1, 200);\n\
                 SELECT setval('parent_ids_id_seq', 5);",
            ),
            (
                "no_cascade.sql",
                "ALTER TABLE children DROP CONSTRAINT children_parent_fkey,\n\
                 ADD CONSTRAINT children_parent_fkey FOREIGN KEY (parent) REFERENCES parents;",
            ),
            (
                "set_null.sql",
                "ALTER TABLE children DROP CONSTRAINT children_parent_fkey,\n\
                 ADD CONSTRAINT children_parent_fkey FOREIGN KEY (parent) REFERENCES parents ON DELETE SET NULL;",
            ),
        ],
    );
    let c = by_name(&test_on(&d, "numbers", &paths));
    // (A test takes at most 32 candidates: the rest in a second.)
    let more = files(
        &d,
        &[
            ("composite_attribute.sql", "ALTER TYPE postal ADD ATTRIBUTE country char(2);"),
            // A widening that keeps the index's files builds nothing; a check
            // written again with a cast for the new type holds the same rows.
            ("widen.sql", "SET lock_timeout = '1s';\nALTER TABLE labels ALTER COLUMN code TYPE text;"),
            ("retype_numeric.sql", "ALTER TABLE items ALTER COLUMN qty TYPE numeric(10,2);"),
            // A comment naming the column is not the statement that drops it.
            ("commented_drop.sql", "-- drop legacy.name, unused\nSET lock_timeout = '1s';\nALTER TABLE legacy DROP COLUMN name;"),
            // The file's own new materialized view waits for no one's queries.
            (
                "own_matview.sql",
                "SET lock_timeout = '1s';\nCREATE MATERIALIZED VIEW plan_counts AS SELECT tier, count(*) FROM plans GROUP BY tier;\n\
                 RESET lock_timeout;\nCREATE UNIQUE INDEX ON plan_counts (tier);",
            ),
        ],
    );
    let c2 = by_name(&test_on(&d, "numbers", &more));
    let behind = |name: &str| {
        let h = hazard(&c[name], "sequence_behind");
        let said = h["message"].as_str().unwrap().to_owned();
        assert_eq!(
            c[name]["hazards"].as_array().unwrap().iter().filter(|h| h["kind"] == "sequence_behind").count(),
            1,
            "{name}: {}",
            c[name]
        );
        (h["severity"].as_str().unwrap().to_owned(), h["line"].clone(), said)
    };
    let (severity, line, said) = behind("restart.sql");
    assert!(said.starts_with("sequence public.invoice_no hands out 100 next, but public.invoices.number already holds values up to 2099"), "{said}");
    assert!(
        said.contains("fail with a duplicate key error (2000 rows hold a value at or past 100)"),
        "{said}"
    );
    assert_eq!((severity.as_str(), line), ("high", json!(2)));
    let (severity, line, said) = behind("setval.sql");
    assert!(said.starts_with("sequence public.items_id_seq hands out 11 next, but public.items.id already holds values up to 2000"), "{said}");
    assert!(said.ends_with("(1990 rows hold a value at or past 11)"), "{said}");
    assert_eq!((severity.as_str(), line), ("high", json!(1)));
    let renamed = hazard(&c["sequence_rename.sql"], "breaks_compatibility");
    assert_eq!(renamed["line"], json!(2), "{renamed}");
    assert!(
        renamed["message"].as_str().unwrap().contains("sequence public.note_no is gone (renamed or moved): code that names it (nextval('note_no'), setval, currval) fails"),
        "{renamed}"
    );
    let widen = &c2["widen.sql"];
    assert!(widen["hazards"].as_array().unwrap().is_empty(), "{widen}");
    assert!(
        !hazard_kinds(&c2["retype_numeric.sql"]).contains(&"integrity_changed"),
        "{}",
        c2["retype_numeric.sql"]
    );
    let dropped = hazard(&c2["commented_drop.sql"], "breaks_compatibility");
    assert_eq!(dropped["line"], json!(3), "{dropped}");
    let own = &c2["own_matview.sql"];
    assert!(own["notes"].as_array().unwrap().iter().all(|n| n["kind"] != "no_lock_timeout"), "{own}");
    let said = message(&c2["composite_attribute.sql"], "breaks_compatibility");
    assert!(
        said.contains("composite type public.postal gains country character(2): a row of its old attributes cast to it (ROW(...)::postal) now fails"),
        "{said}"
    );
    let (severity, line, said) = behind("owned_by.sql");
    assert!(said.starts_with("sequence public.plans_plan_no_seq hands out 1040 next"), "{said}");
    assert!(said.ends_with("(1 row holds a value at or past 1040)"), "{said}");
    assert_eq!((severity.as_str(), line), ("high", json!(4)));
    let (severity, _, said) = behind("not_unique.sql");
    assert!(said.contains("public.invoices.note already holds values up to 2000"), "{said}");
    assert!(
        said.contains("repeat a value another row holds (1001 rows hold a value at or past 1000)"),
        "{said}"
    );
    assert_eq!(severity, "medium");
    let (severity, _, said) = behind("identity.sql");
    assert!(said.starts_with("sequence public.legacy_id_seq hands out 1 next, but public.legacy.id already holds values up to 500"), "{said}");
    assert_eq!(severity, "high");
    assert!(hazard(&c["setval.sql"], "sequence_behind")["suggestion"]
        .as_str()
        .unwrap()
        .contains("setval('public.items_id_seq', (SELECT max(id) FROM public.items))"));

    let said = message(&c["drop_default.sql"], "breaks_compatibility");
    assert!(said.contains("inserts into public.invoices that leave out number now fail: its default (nextval('public.invoice_no'::regclass)) is gone and it is NOT NULL"), "{said}");
    assert!(said.contains("inserts into public.invoices that leave out id now fail: its default (generated always as identity) is gone"), "{said}");
    assert_eq!(hazard(&c["drop_default.sql"], "breaks_compatibility")["line"], json!(1));
    assert_eq!(hazard(&c["enum_rename.sql"], "breaks_compatibility")["line"], json!(1));
    let always = hazard(&c["always.sql"], "breaks_compatibility");
    assert!(
        always["message"]
            .as_str()
            .unwrap()
            .contains("inserts into public.bt_plain that give id a value now fail"),
        "{always}"
    );
    assert_eq!(always["line"], json!(2), "{always}");
    assert!(
        c["always.sql"]["notes"].as_array().unwrap().iter().all(|n| n["kind"] != "default_changed"),
        "{}",
        c["always.sql"]
    );
    let said = message(&c["enum_rename.sql"], "breaks_compatibility");
    assert!(
        said.contains("enum public.state no longer has the value 'cancelled' (renamed or dropped)"),
        "{said}"
    );

    let new_default = &c["new_default.sql"];
    assert_eq!(new_default["passed"], json!(true), "{new_default}");
    let note = new_default["notes"].as_array().unwrap().iter().find(|n| n["kind"] == "default_changed");
    let note = note.unwrap_or_else(|| panic!("{new_default}"))["message"].as_str().unwrap();
    assert!(
        note.starts_with(
            "the default of public.invoices.state changes from 'open'::public.state to 'done'::public.state"
        ),
        "{note}"
    );

    // A type change makes the table's checks and indexes again, checked and
    // built by its rewrite.
    let kinds = hazard_kinds(&c["retype.sql"]);
    assert_eq!(kinds, ["table_rewrite"], "{}", c["retype.sql"]);
    let said = message(&c["generated.sql"], "table_rewrite");
    assert!(
        said.ends_with(
            "while its reads and writes wait: a stored generated column was added, computed for every row"
        ),
        "{said}"
    );
    // What a failing statement wrote before it failed was undone with it.
    let failed = &c["fails_midway.sql"];
    assert!(!hazard_kinds(failed).contains(&"unmeasured_changes"), "{failed}");
    let note = failed["notes"].as_array().unwrap().iter().find(|n| n["kind"] == "unmeasured_changes");
    let note = note.unwrap_or_else(|| panic!("{failed}"));
    assert!(
        note["message"].as_str().unwrap().ends_with(
            "most likely written by the statement that failed before it failed, and undone with it"
        ),
        "{note}"
    );
    assert_eq!(note["line"], json!(1), "{note}");
    // ADD COLUMN took ACCESS EXCLUSIVE earlier in the transaction: reads wait too.
    let said = message(&c["in_one_transaction.sql"], "constraint_validation");
    assert!(said.contains("SET NOT NULL checks every row of public.legacy (500 rows in the golden) while its reads and writes wait"), "{said}");
    // A setval's effect is judged on the fork, not taken for code that
    // tells the fork apart.
    assert_eq!(c["past_the_top.sql"]["passed"], json!(true), "{}", c["past_the_top.sql"]);
    assert!(c["past_the_top.sql"]["hazards"].as_array().unwrap().is_empty(), "{}", c["past_the_top.sql"]);
    // A restart is set back only where it is behind where the sequence stood.
    assert_eq!(c["restart.sql"]["sequences_set_back"], json!(["public.invoice_no"]));
    let forward = &c["restart_forward.sql"];
    assert_eq!((&forward["passed"], &forward["sequences_set_back"]), (&json!(true), &json!([])), "{forward}");
    assert_eq!(forward["sequences_advanced"]["public.invoice_no"], json!(5000 - 1 - 2099), "{forward}");
    let h = hazard(&c["to_the_top.sql"], "sequence_exhausted");
    assert_eq!((&h["severity"], &h["line"]), (&json!("high"), &json!(1)), "{h}");
    assert!(h["message"].as_str().unwrap().starts_with("sequence public.items_id_seq has no value left (it does not cycle): every insert that takes a value from it now fails"), "{h}");
    assert_eq!(hazard_kinds(&c["to_the_top.sql"]), vec!["sequence_exhausted"], "{}", c["to_the_top.sql"]);
    let h = hazard(&c["max_lowered.sql"], "sequence_exhausted");
    assert_eq!(h["severity"], json!("high"), "{h}");
    assert!(
        h["message"].as_str().unwrap().starts_with("sequence public.invoice_no has only 401 values left"),
        "{h}"
    );
    let said = message(&c["small_table.sql"], "values_overwritten");
    assert!(said.starts_with("40 of the 40 rows of plans lost their tier"), "{said}");
    let h = hazard(&c["through_a_function.sql"], "values_overwritten");
    assert_eq!(h["line"], json!(3), "{h}");
    assert_eq!(c["enum_add.sql"]["passed"], json!(true), "{}", c["enum_add.sql"]);

    // Row security turned on: roles see what the policies let them, or nothing.
    let narrowed = |name: &str| {
        let h = hazard(&c[name], "access_narrowed");
        (
            h["severity"].as_str().unwrap().to_owned(),
            h["message"].as_str().unwrap().to_owned(),
            h["line"].clone(),
        )
    };
    assert_eq!(
        narrowed("rls_no_policy.sql"),
        ("high".into(), "turns row-level security on for public.legacy with no permissive policy: every role but its owner now reads none of its 500 rows and writes none (superusers and BYPASSRLS roles aside)".into(), json!(1))
    );
    let (severity, said, _) = narrowed("rls_forced.sql");
    assert_eq!(severity, "high");
    assert!(said.starts_with("forces row-level security on public.legacy with no permissive policy: every role, its owner included, now reads none"), "{said}");
    let (severity, said, _) = narrowed("rls_policy.sql");
    assert_eq!(severity, "medium");
    assert!(said.ends_with("every role but its owner now reads and writes only the rows its permissive policy (own) let it (superusers and BYPASSRLS roles aside)"), "{said}");

    let (severity, _, said) = behind("unreadable.sql");
    assert_eq!(severity, "high");
    assert!(said.contains("public.bt.id could not be read to tell whether its rows hold values at or past it (P0001: not for you)"), "{said}");
    let (_, _, said) = behind("odd_names.sql");
    assert!(said.contains("but public.\"od.d\".\"c\"\"ol.1\" already holds values up to 300: the next inserts that take \"c\"\"ol.1\" from it"), "{said}");
    let (_, _, said) = behind("descending.sql");
    assert!(
        said.starts_with(
            "sequence public.down hands out -6 next, but public.dt.id already holds values down to -99"
        ),
        "{said}"
    );
    assert!(said.ends_with("(94 rows hold a value at or below -6)"), "{said}");
    // The parent's column (whose reading counts the child's rows) and the
    // child's own, whose default is the same sequence.
    let inherited: Vec<&Value> = c["inherited.sql"]["hazards"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["kind"] == "sequence_behind")
        .collect();
    assert_eq!(inherited.len(), 2, "{}", c["inherited.sql"]);
    let parent =
        inherited.iter().find(|h| h["message"].as_str().unwrap().contains("but public.parent_ids.id"));
    let parent = parent.unwrap_or_else(|| panic!("{}", c["inherited.sql"]));
    assert_eq!(parent["severity"], json!("medium"), "{parent}");
    assert!(
        parent["message"]
            .as_str()
            .unwrap()
            .ends_with("repeat a value another row holds (195 rows hold a value at or past 6)"),
        "{parent}"
    );
    let note =
        c["default_added.sql"]["notes"].as_array().unwrap().iter().find(|n| n["kind"] == "default_changed");
    let note = note.unwrap_or_else(|| panic!("{}", c["default_added.sql"]))["message"].as_str().unwrap();
    assert!(
        note.starts_with(
            "public.legacy.name now defaults to 'n'::text: inserts that leave it out now write it"
        ),
        "{note}"
    );
    let (_, said, _) = narrowed("rls_policy.sql");
    assert!(
        said.starts_with("turns row-level security on for public.notes: every role but its owner"),
        "{said}"
    );

    // Deletes that cascaded now fail.
    for (name, why) in [
        ("no_cascade.sql", "(the key is now NO ACTION), where it deleted them"),
        ("set_null.sql", "(ON DELETE SET NULL cannot empty its NOT NULL parent), where it deleted them"),
    ] {
        let h = hazard(&c[name], "integrity_changed");
        let said = h["message"].as_str().unwrap();
        assert!(
            said.contains("deleting a row of")
                && said.contains("that rows of public.children point at now fails"),
            "{said}"
        );
        assert!(said.ends_with(why), "{name}: {said}");
        assert_eq!(h["severity"], json!("high"), "{h}");
    }
}

#[test]
fn types_views_partitions_keys_and_batches_are_told_as_they_are() {
    let d = Daemon::start(&[]);
    d.golden(
        "ledger",
        "CREATE TABLE accounts (id bigserial PRIMARY KEY, balance numeric(12,2) NOT NULL, opened timestamp NOT NULL,
                                ratio double precision NOT NULL, cents int NOT NULL, kind text NOT NULL,
                                holder varchar(200) NOT NULL);
         CREATE MATERIALIZED VIEW daily AS SELECT kind, count(*) AS n FROM accounts GROUP BY 1;
         CREATE UNIQUE INDEX daily_key ON daily (kind);
         CREATE TABLE events (id int NOT NULL, at date NOT NULL) PARTITION BY RANGE (at);
         CREATE TABLE events_2026 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
         CREATE TABLE events_other PARTITION OF events DEFAULT;
         CREATE FUNCTION norm(t text) RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT lower(btrim(t)) $$;
         CREATE TABLE tags (id int PRIMARY KEY, name text NOT NULL CHECK (norm(name) <> ''));
         CREATE UNIQUE INDEX tags_norm ON tags (norm(name));
         CREATE TABLE notes (id int PRIMARY KEY, account_id bigint NOT NULL REFERENCES accounts (id));",
        "INSERT INTO accounts (balance, opened, ratio, cents, kind, holder)
           SELECT (g % 1000) + 0.37, timestamp '2026-01-01' + g * interval '7 minutes', g / 7.0, g, 'k' || g % 5,
                  CASE WHEN g % 100 = 0 THEN 'Holder ' || g || ' ' || repeat('of a very long name ', 5) ELSE 'Holder ' || g END
             FROM generate_series(1, 3000) g;
         REFRESH MATERIALIZED VIEW daily;
         INSERT INTO events SELECT g, date '2026-01-01' + g % 730 FROM generate_series(1, 3000) g;
         INSERT INTO tags SELECT g, 'Tag ' || g FROM generate_series(1, 100) g;
         INSERT INTO notes SELECT g, g FROM generate_series(1, 100) g;",
    );
    let paths = files(
        &d,
        &[
            ("rounded.sql", "ALTER TABLE accounts ALTER COLUMN balance TYPE numeric(12,0);"),
            ("day_only.sql", "SELECT 1;\nALTER TABLE accounts ALTER COLUMN opened TYPE date;"),
            ("whole_ratio.sql", "ALTER TABLE accounts ALTER COLUMN ratio TYPE integer;"),
            // 30 of 3,000 names cut short: few, but a type change is not meant to change any.
            ("short_names.sql", "ALTER TABLE accounts ALTER COLUMN holder TYPE varchar(50) USING left(holder, 50);"),
            // Old values the new type refuses (its USING never met them) are lost too.
            ("overflow.sql", "ALTER TABLE accounts ALTER COLUMN balance TYPE numeric(2,0) USING id % 50;"),
            ("names_fit.sql", "ALTER TABLE accounts ALTER COLUMN holder TYPE varchar(150);"),
            (
                "kept_first.sql",
                "CREATE TABLE accounts_balance_before AS SELECT id, balance FROM accounts;\n\
                 ALTER TABLE accounts ALTER COLUMN balance TYPE numeric(12,0);",
            ),
            // Types that hold every old value: nothing is lost.
            ("wider.sql", "ALTER TABLE accounts ALTER COLUMN balance TYPE numeric(14,2);"),
            ("bigger.sql", "ALTER TABLE accounts ALTER COLUMN cents TYPE bigint;"),
            ("dollars.sql", "ALTER TABLE accounts ALTER COLUMN cents TYPE numeric(12,2) USING cents / 100.0;"),
            ("exact_ratio.sql", "ALTER TABLE accounts ALTER COLUMN ratio TYPE numeric;"),
            ("with_zone.sql", "ALTER TABLE accounts ALTER COLUMN opened TYPE timestamptz;"),
            ("as_text.sql", "ALTER TABLE accounts ALTER COLUMN balance TYPE text;"),
            // The view: made again without data, refreshed without data, and controls.
            (
                "made_empty.sql",
                "DROP MATERIALIZED VIEW daily;\n\
                 CREATE MATERIALIZED VIEW daily AS SELECT kind, count(*) AS n, sum(balance) AS total\n  FROM accounts GROUP BY 1\n  WITH NO DATA;\n\
                 CREATE UNIQUE INDEX daily_key ON daily (kind);",
            ),
            ("emptied.sql", "SELECT 1;\nREFRESH MATERIALIZED VIEW daily WITH NO DATA;"),
            (
                "made_full.sql",
                "DROP MATERIALIZED VIEW daily;\n\
                 CREATE MATERIALIZED VIEW daily AS SELECT kind, count(*) AS n FROM accounts GROUP BY 1 WITH NO DATA;\n\
                 CREATE UNIQUE INDEX daily_key ON daily (kind);\nREFRESH MATERIALIZED VIEW daily;",
            ),
            ("refreshed.sql", "REFRESH MATERIALIZED VIEW CONCURRENTLY daily;"),
            // A golden function of plain SQL under a check and an index runs
            // no code a test could tell from production; replaced, it does.
            ("plain_function.sql", "INSERT INTO tags VALUES (101, ' New tag ');\nUPDATE tags SET name = upper(name) WHERE id <= 10;"),
            (
                "replaced_function.sql",
                "CREATE OR REPLACE FUNCTION norm(t text) RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT lower(btrim(t)) || current_user $$;\n\
                 INSERT INTO tags VALUES (101, 'New tag');",
            ),
            // A partitioned table's index: no CONCURRENTLY for it, so its
            // safer form is one partition at a time.
            ("parent_index.sql", "CREATE INDEX events_id ON events (id);"),
            // A partitioned table's column retyped: its partitions' follow,
            // and are told through it.
            ("parent_retype.sql", "ALTER TABLE events ALTER COLUMN id TYPE text;"),
            ("parent_key.sql", "ALTER TABLE events ADD PRIMARY KEY (id, at);"),
            ("parent_foreign_key.sql", "ALTER TABLE events ADD CONSTRAINT events_account FOREIGN KEY (id) REFERENCES accounts (id);"),
            (
                "parent_index_by_partition.sql",
                "CREATE INDEX events_id ON ONLY events (id);\n\
                 CREATE INDEX CONCURRENTLY events_2026_id ON events_2026 (id);\n\
                 ALTER INDEX events_id ATTACH PARTITION events_2026_id;\n\
                 CREATE INDEX CONCURRENTLY events_other_id ON events_other (id);\n\
                 ALTER INDEX events_id ATTACH PARTITION events_other_id;",
            ),
            // A DO block that commits each batch runs outside a transaction
            // block, as psql runs it: it works, and is told as code.
            (
                "batched.sql",
                "ALTER TABLE accounts ADD COLUMN kind_upper text;\n\
                 DO $$\nDECLARE lo bigint := 0;\nBEGIN\n  WHILE lo < 3000 LOOP\n\
                 UPDATE accounts SET kind_upper = upper(kind) WHERE id > lo AND id <= lo + 500;\n    COMMIT;\n\
                 lo := lo + 500;\n  END LOOP;\nEND $$;",
            ),
            (
                "batched_whole.sql",
                "ALTER TABLE accounts ADD COLUMN kind_upper text;\n\
                 DO $$\nDECLARE lo bigint := 0; hi bigint;\nBEGIN\n  SELECT max(id) INTO hi FROM accounts;\n  WHILE lo < hi LOOP\n\
                 UPDATE accounts SET kind_upper = upper(kind) WHERE id > lo AND id <= lo + 500;\n\
                 lo := lo + 500;\n  END LOOP;\n  RAISE NOTICE 'filled % rows', hi;\nEND $$;",
            ),
            // Foreign keys' checks switched off: only a superuser may, so the
            // test is refused, and says what it would have left unchecked.
            (
                "keys_off.sql",
                "BEGIN;\nALTER TABLE accounts DISABLE TRIGGER ALL;\nDELETE FROM accounts WHERE id <= 10;\n\
                 ALTER TABLE accounts ENABLE TRIGGER ALL;\nCOMMIT;",
            ),
            ("replica_role.sql", "SET session_replication_role = replica;\nDELETE FROM accounts WHERE id <= 10;"),
            // A key made again NOT VALID over rows that now point at nothing.
            (
                "key_over_orphans.sql",
                "ALTER TABLE notes DROP CONSTRAINT notes_account_id_fkey;\nDELETE FROM accounts WHERE id <= 10;\n\
                 ALTER TABLE notes ADD CONSTRAINT notes_account_id_fkey FOREIGN KEY (account_id) REFERENCES accounts (id) NOT VALID;",
            ),
            // The same, with a partial index whose predicate fails when a
            // superuser plans a query of the table: the count is the reader's.
            (
                "key_over_orphans_spied.sql",
                "CREATE FUNCTION spy() RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $$ BEGIN\n\
                 IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN RAISE EXCEPTION 'ran as a superuser'; END IF;\n\
                 RETURN true; END $$;\n\
                 CREATE INDEX notes_spied ON notes (account_id) WHERE spy();\n\
                 ALTER TABLE notes DROP CONSTRAINT notes_account_id_fkey;\nDELETE FROM accounts WHERE id <= 10;\n\
                 ALTER TABLE notes ADD CONSTRAINT notes_account_id_fkey FOREIGN KEY (account_id) REFERENCES accounts (id) NOT VALID;",
            ),
            (
                "key_validated.sql",
                "ALTER TABLE notes DROP CONSTRAINT notes_account_id_fkey;\n\
                 ALTER TABLE notes ADD CONSTRAINT notes_account_id_fkey FOREIGN KEY (account_id) REFERENCES accounts (id) NOT VALID;\n\
                 ALTER TABLE notes VALIDATE CONSTRAINT notes_account_id_fkey;",
            ),
            ("own_triggers_off.sql", "ALTER TABLE accounts DISABLE TRIGGER USER;\nALTER TABLE accounts ENABLE TRIGGER USER;"),
            // One that commits its batches, then fails: what it committed stays.
            (
                "batched_then_fails.sql",
                "DO $$\nDECLARE lo bigint := 0;\nBEGIN\n  WHILE lo < 3000 LOOP\n\
                 UPDATE accounts SET kind = upper(kind) WHERE id > lo AND id <= lo + 1000;\n    COMMIT;\n\
                 lo := lo + 1000;\n  END LOOP;\n  RAISE EXCEPTION 'stopped';\nEND $$;",
            ),
            // A new partition beside a DEFAULT one reads the DEFAULT one for
            // its rows, as ATTACH does, unless a CHECK already excludes them.
            (
                "new_partition.sql",
                "CREATE TABLE events_2030 PARTITION OF events FOR VALUES FROM ('2030-01-01') TO ('2031-01-01');",
            ),
            (
                "new_partition_checked.sql",
                "ALTER TABLE events_other ADD CONSTRAINT events_other_before_2030 CHECK (at < '2030-01-01') NOT VALID;\n\
                 ALTER TABLE events_other VALIDATE CONSTRAINT events_other_before_2030;\n\
                 CREATE TABLE events_2030 PARTITION OF events FOR VALUES FROM ('2030-01-01') TO ('2031-01-01');",
            ),
        ],
    );
    // (At most 32 candidates a run.)
    let mut c = by_name(&test_on(&d, "ledger", &paths[..paths.len() / 2]));
    c.extend(by_name(&test_on(&d, "ledger", &paths[paths.len() / 2..])));

    let h = hazard(&c["rounded.sql"], "values_overwritten");
    assert_eq!((&h["severity"], &h["line"]), (&json!("high"), &json!(1)), "{h}");
    let said = h["message"].as_str().unwrap();
    assert!(
        said.starts_with(
            "3,000 of the 3,000 rows of accounts lost their balance to its new type, which cannot hold them \
             (numeric(12,2) -> numeric(12,0)): 3 had balance '"
        ),
        "{said}"
    );
    assert!(
        said.contains("3 had balance '1.37', now '1'")
            && said.ends_with("what they were is not kept anywhere"),
        "{said}"
    );
    assert!(numbers(said).iter().all(|n| *n <= 3_000), "{said}");
    assert!(
        h["suggestion"]
            .as_str()
            .unwrap()
            .contains("CREATE TABLE accounts_balance_before AS SELECT id, balance FROM accounts"),
        "{h}"
    );
    // One loss for the column, told by its type, not again as values made alike.
    assert_eq!(hazard_kinds(&c["rounded.sql"]).iter().filter(|k| **k == "values_overwritten").count(), 1);

    let h = hazard(&c["day_only.sql"], "values_overwritten");
    assert_eq!(h["line"], json!(2), "{h}");
    assert!(
        h["message"].as_str().unwrap().contains(
            "lost their opened to its new type, which cannot hold them (timestamp without time zone -> date)"
        ),
        "{h}"
    );
    let said = message(&c["whole_ratio.sql"], "values_overwritten");
    assert!(said.contains("(double precision -> integer)") && said.contains("now '1'"), "{said}");

    let notes = c["kept_first.sql"]["notes"].as_array().unwrap();
    assert!(!hazard_kinds(&c["kept_first.sql"]).contains(&"values_overwritten"), "{}", c["kept_first.sql"]);
    assert!(
        notes.iter().any(|n| n["kind"] == "values_overwritten"
            && n["message"]
                .as_str()
                .unwrap()
                .ends_with("kept every old value in accounts_balance_before.balance")),
        "{notes:?}"
    );
    for held in ["wider.sql", "bigger.sql", "dollars.sql", "exact_ratio.sql", "with_zone.sql", "as_text.sql"]
    {
        assert!(!hazard_kinds(&c[held]).contains(&"values_overwritten"), "{held}: {}", c[held]);
    }

    let h = hazard(&c["made_empty.sql"], "matview_unpopulated");
    assert_eq!((&h["severity"], &h["line"]), (&json!("high"), &json!(2)), "{h}");
    assert_eq!(
        h["message"],
        json!(
            "materialized view public.daily is left without data: every query that reads it fails \
             (\"materialized view has not been populated\") until a REFRESH MATERIALIZED VIEW without \
             CONCURRENTLY fills it, and that refresh blocks every reader of the view while it runs"
        )
    );
    assert!(h["suggestion"].as_str().unwrap().ends_with("REFRESH MATERIALIZED VIEW public.daily"), "{h}");
    assert_eq!(hazard(&c["emptied.sql"], "matview_unpopulated")["line"], json!(2));
    for full in ["made_full.sql", "refreshed.sql", "rounded.sql"] {
        assert!(!hazard_kinds(&c[full]).contains(&"matview_unpopulated"), "{full}: {}", c[full]);
    }

    let h = hazard(&c["new_partition.sql"], "constraint_validation");
    assert_eq!(
        h["message"],
        json!("making a partition checks every row of the DEFAULT partition public.events_other (1460 rows in the golden) \
               for rows that belong to the new partition while its reads and writes wait"),
        "{h}"
    );
    assert!(h["suggestion"].as_str().unwrap().contains("that excludes the new partition's bounds"), "{h}");
    // (Its VALIDATE, in the file's one transaction, is told as such; the
    // new partition reads nothing.)
    let checked = &c["new_partition_checked.sql"];
    let at_creation = checked["hazards"]
        .as_array()
        .unwrap()
        .iter()
        .any(|h| h["kind"] == "constraint_validation" && h["line"] == json!(3));
    assert!(!at_creation, "{checked}");

    assert!(!hazard_kinds(&c["plain_function.sql"]).contains(&"opaque_code"), "{}", c["plain_function.sql"]);
    let said = message(&c["replaced_function.sql"], "opaque_code");
    assert!(said.contains("line 2: writes tags, whose defaults, checks or indexes run norm()"), "{said}");

    let builds: Vec<&Value> = c["parent_index.sql"]["hazards"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["kind"] == "blocking_index_build")
        .collect();
    // One hazard for the statement, with every partition's rows.
    assert_eq!(builds.len(), 1, "{}", c["parent_index.sql"]);
    assert!(
        builds[0]["message"].as_str().unwrap().ends_with(
            "; the same for 1 more partition of public.events: events_other (1460 rows) (2 partitions, 3000 rows in the golden, in all)"
        ),
        "{}",
        builds[0]
    );
    for h in builds {
        assert!(
            h["suggestion"]
                .as_str()
                .unwrap()
                .starts_with("CREATE INDEX ... ON ONLY public.events (made at once"),
            "{h}"
        );
    }
    let retyped = &c["parent_retype.sql"];
    let said = message(retyped, "breaks_compatibility");
    assert!(said.contains("column public.events.id changes type integer -> text"), "{said}");
    assert!(!said.contains("events_2026") && !said.contains("events_other"), "{said}");
    let note = retyped["notes"].as_array().unwrap().iter().find(|n| n["kind"] == "no_lock_timeout");
    let said = note.unwrap_or_else(|| panic!("{retyped}"))["message"].as_str().unwrap();
    assert!(
        said.starts_with("the file takes write-blocking locks on public.events (its partitions) with"),
        "{said}"
    );
    let by_partition = &c["parent_index_by_partition.sql"];
    assert!(!hazard_kinds(by_partition).contains(&"blocking_index_build"), "{by_partition}");
    let h = hazard(&c["parent_key.sql"], "blocking_index_build");
    assert!(
        h["suggestion"]
            .as_str()
            .unwrap()
            .starts_with("for each partition of public.events, CREATE UNIQUE INDEX CONCURRENTLY on it"),
        "{h}"
    );
    let batched = &c["batched.sql"];
    assert_eq!(hazard_kinds(batched), vec!["opaque_code"], "{batched}");
    assert!(
        message(batched, "opaque_code").contains("line 2: a DO block that commits as it goes"),
        "{batched}"
    );
    // The same block run whole, in the file's transaction: what it runs is plain.
    let whole = &c["batched_whole.sql"];
    assert!(!hazard_kinds(whole).contains(&"opaque_code"), "{whole}");
    assert!(batched["failure"].is_null(), "{batched}");
    assert_eq!(batched["changed_rows"]["public.accounts"], json!(3000), "{batched}");
    let h = hazard(&c["short_names.sql"], "values_overwritten");
    assert_eq!(h["severity"], json!("medium"), "{h}");
    let said = h["message"].as_str().unwrap();
    assert!(
        said.starts_with(
            "30 of the 3,000 rows of accounts lost their holder to its new type, which cannot hold them \
             (character varying(200) -> character varying(50)): 1 had holder 'Holder 100 of a very long name of a very"
        ),
        "{said}"
    );
    assert!(!hazard_kinds(&c["names_fit.sql"]).contains(&"values_overwritten"), "{}", c["names_fit.sql"]);
    let checks: Vec<&Value> = c["parent_foreign_key.sql"]["hazards"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["kind"] == "constraint_validation")
        .collect();
    assert_eq!(checks.len(), 1, "{}", c["parent_foreign_key.sql"]);
    for h in checks {
        assert!(
            h["suggestion"]
                .as_str()
                .unwrap()
                .starts_with("for each partition of public.events, add the foreign key NOT VALID"),
            "{h}"
        );
    }
    let h = hazard(&c["keys_off.sql"], "integrity_removed");
    assert_eq!((&h["severity"], &h["line"]), (&json!("high"), &json!(2)), "{h}");
    let said = h["message"].as_str().unwrap();
    assert!(
        said.starts_with("switches off every trigger of public.accounts until it is enabled again, the checks of its foreign keys among them (notes.notes_account_id_fkey)")
            && said.ends_with("refused under test, where the migration is not a superuser's, so what the rest of the file leaves then was not measured"),
        "{said}"
    );
    assert!(hazard(&c["keys_off.sql"], "failed")["message"].as_str().unwrap().contains("system trigger"));
    let said = message(&c["replica_role.sql"], "integrity_removed");
    assert!(said.starts_with("sets session_replication_role to replica"), "{said}");
    assert!(
        !hazard_kinds(&c["own_triggers_off.sql"]).contains(&"integrity_removed"),
        "{}",
        c["own_triggers_off.sql"]
    );
    // What the old code meets: rounding, not a break.
    let said = message(&c["rounded.sql"], "breaks_compatibility");
    assert!(
        said.ends_with("changes type numeric(12,2) -> numeric(12,0) (its writes are rounded to what the new type holds, or refused past its range, with no error to say so when rounded)"),
        "{said}"
    );
    let h = hazard(&c["key_over_orphans.sql"], "integrity_removed");
    assert_eq!((&h["severity"], &h["line"]), (&json!("high"), &json!(3)), "{h}");
    assert_eq!(
        h["message"],
        json!("foreign key notes_account_id_fkey of public.notes is NOT VALID now, where it was checked, and 10 rows of public.notes \
               point at no row of public.accounts: the key holds only for new writes, and what it guarded is broken")
    );
    let validated = &c["key_validated.sql"];
    assert!(!hazard_kinds(validated).contains(&"integrity_removed"), "{validated}");
    let spied = &c["key_over_orphans_spied.sql"];
    let h = hazard(spied, "integrity_removed");
    assert!(
        h["message"]
            .as_str()
            .unwrap()
            .contains("and 10 rows of public.notes point at no row of public.accounts"),
        "{spied}"
    );
    let said = message(&c["overflow.sql"], "values_overwritten");
    assert!(
        said.starts_with("3,000 of the 3,000 rows of accounts lost their balance to its new type, which cannot hold them (numeric(12,2) -> numeric(2,0))"),
        "{said}"
    );
    let failing = &c["batched_then_fails.sql"];
    let h = hazard(failing, "partial_commit");
    assert_eq!(
        h["message"],
        json!("line 1 failed after committing part of its own work (rows of public.accounts: 3000 updated): the database is left half-migrated"),
        "{failing}"
    );
    assert!(!hazard_kinds(failing).contains(&"unmeasured_changes"), "{failing}");
    assert!(
        failing["notes"].as_array().unwrap().iter().all(|n| n["kind"] != "unmeasured_changes"),
        "{failing}"
    );
}
