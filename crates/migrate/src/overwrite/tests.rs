use super::*;
use airlock_postgres::catalog::{Column, Table};

fn catalog() -> Catalog {
    let mut c = Catalog::default();
    for (name, columns) in [
        ("public.customers", &["id", "tier", "name", "Score"][..]),
        ("billing.customers", &["id", "plan"][..]),
        ("public.orders", &["id", "total"][..]),
    ] {
        let columns = columns.iter().map(|n| Column { name: (*n).into(), ..Column::default() }).collect();
        c.tables.insert(name.into(), Table { columns, ..Table::default() });
    }
    c
}

fn targets_of(sql: &str) -> Vec<(String, Vec<String>)> {
    let c = catalog();
    let tables = c.tables.keys().cloned().collect();
    let statements = airlock_postgres::split::split(sql).unwrap();
    targets(&statements, &c, &tables).into_iter().map(|t| (t.table, t.columns)).collect()
}

fn owned(t: &str, cs: &[&str]) -> (String, Vec<String>) {
    (t.into(), cs.iter().map(|c| (*c).into()).collect())
}

#[test]
fn the_columns_an_update_sets_are_read_from_any_form_of_it() {
    assert_eq!(targets_of("UPDATE customers SET tier = 'standard'"), [owned("public.customers", &["tier"])]);
    assert_eq!(
        targets_of("update only customers as c set name = upper(c.name), \"Score\" = f(1, 2) where c.id > 3"),
        [owned("public.customers", &["name", "Score"])]
    );
    assert_eq!(
        targets_of("UPDATE customers c SET (tier, name) = (SELECT 'a', 'b'), id = id FROM orders o WHERE o.id = c.id"),
        [owned("billing.customers", &["id"]), owned("public.customers", &["id", "tier", "name"])]
    );
    assert_eq!(
        targets_of("UPDATE billing.customers SET plan = NULL"),
        [owned("billing.customers", &["plan"])]
    );
    // In a function's or a DO block's body too.
    assert_eq!(
        targets_of("DO $$ BEGIN UPDATE customers SET tier = 'x'; END $$"),
        [owned("public.customers", &["tier"])]
    );
    assert_eq!(
        targets_of("ALTER TABLE orders ALTER COLUMN total TYPE int, ALTER id SET DATA TYPE bigint, ALTER COLUMN total SET DEFAULT 0"),
        [owned("public.orders", &["id", "total"])]
    );
    // Nothing that sets no golden column: a row lock, a column added later,
    // a retype that only sets a property.
    assert!(targets_of("SELECT * FROM customers FOR UPDATE").is_empty());
    assert!(targets_of("UPDATE customers SET added_later = 1").is_empty());
    assert!(targets_of("ALTER TABLE orders ALTER COLUMN total SET NOT NULL").is_empty());
    // json to jsonb writes the same values another way; with USING, it is a retype like any.
    assert!(targets_of("ALTER TABLE orders ALTER COLUMN total TYPE jsonb").is_empty());
    assert_eq!(
        targets_of("ALTER TABLE orders ALTER COLUMN total TYPE jsonb USING '{}'"),
        [owned("public.orders", &["total"])]
    );
}

#[test]
fn an_update_the_name_does_not_pin_down_reads_every_table_with_the_column() {
    // The UPDATE SET of a MERGE or an upsert writes the table named after INTO.
    assert_eq!(
        targets_of(
            "MERGE INTO customers c USING orders o ON o.id = c.id WHEN MATCHED THEN UPDATE SET tier = 'x'"
        ),
        [owned("public.customers", &["tier"])]
    );
    assert_eq!(
        targets_of("INSERT INTO customers VALUES (1) ON CONFLICT (id) DO UPDATE SET tier = excluded.tier"),
        [owned("public.customers", &["tier"])]
    );
    // A view, a table renamed on the way, a name a search path decides:
    // every golden table with the column, in every schema.
    assert_eq!(targets_of("UPDATE customer_tiers SET tier = 'x'"), [owned("public.customers", &["tier"])]);
    assert_eq!(
        targets_of("UPDATE customers SET id = 1"),
        [owned("billing.customers", &["id"]), owned("public.customers", &["id"])]
    );
}

#[test]
fn constants_nested_deep_are_read_so_far_and_no_further() {
    let mut sql = "update customers set tier = 'x'".to_owned();
    for i in 0..5_000 {
        sql = format!("$q{i}${sql}$q{i}$");
    }
    // No overflow, however deep; eight levels are read.
    assert!(targets_of(&format!("SELECT length({sql})")).is_empty());
    let mut sql = "update customers set tier = 'x'".to_owned();
    for i in 0..8 {
        sql = format!("$q{i}${sql}$q{i}$");
    }
    assert_eq!(targets_of(&format!("SELECT {sql}")), [owned("public.customers", &["tier"])]);
}

#[test]
fn reading_a_file_takes_time_in_proportion_to_its_length() {
    // Each SET list and ALTER TABLE ends before the next statement's word:
    // no token is read again for every one before it (400 KB took minutes).
    let updates = format!("SELECT length('{}')", "update set a = 1 ".repeat(25_000));
    assert!(targets_of(&updates).is_empty());
    let alters = format!("SELECT length('{}')", "alter table orders alter total type int ".repeat(10_000));
    assert_eq!(targets_of(&alters), [owned("public.orders", &["total"])]);
    let assigned = format!("SELECT length('{}')", "then new.total = 1 ".repeat(25_000));
    assert_eq!(targets_of(&assigned), [owned("public.orders", &["total"])]);
}

#[test]
fn a_key_that_sets_null_where_it_is_referenced_is_read_there_too() {
    let mut c = catalog();
    let mut products = Table {
        columns: ["id", "category"]
            .iter()
            .map(|n| Column { name: (*n).into(), ..Column::default() })
            .collect(),
        ..Table::default()
    };
    products.constraints.insert(
        "products_category_fkey".into(),
        "FOREIGN KEY (category) REFERENCES orders(id) ON UPDATE SET NULL".into(),
    );
    c.tables.insert("public.products".into(), products);
    let tables = c.tables.keys().cloned().collect();
    for sql in ["UPDATE orders SET id = id + 100 WHERE id < 6", "DELETE FROM orders WHERE id < 6"] {
        let statements = airlock_postgres::split::split(sql).unwrap();
        let found: Vec<(String, Vec<String>)> =
            targets(&statements, &c, &tables).into_iter().map(|t| (t.table, t.columns)).collect();
        assert!(found.contains(&owned("public.products", &["category"])), "{sql}: {found:?}");
    }
}

#[test]
fn a_column_computed_from_itself_is_told_apart() {
    let c = catalog();
    let tables = c.tables.keys().cloned().collect();
    let from_itself = |sql: &str| {
        let statements = airlock_postgres::split::split(sql).unwrap();
        targets(&statements, &c, &tables)[0].from_itself.iter().cloned().collect::<Vec<String>>()
    };
    assert_eq!(from_itself("UPDATE orders SET total = total + 1, id = 7"), ["total"]);
    // A tuple's one expression sets several columns: none counts as from itself.
    assert!(from_itself("UPDATE orders SET (total, id) = (round(total), 1)").is_empty());
    assert!(from_itself(
        "INSERT INTO orders VALUES (1) ON CONFLICT (id) DO UPDATE SET total = excluded.total"
    )
    .is_empty());
    assert_eq!(from_itself("UPDATE orders SET total = round(total::numeric * 1.1, 2)"), ["total"]);
    // A CASE, a comparison, another column or function picks which rows get
    // which value: not computed from itself alone.
    assert!(from_itself(
        "UPDATE orders SET total = (CASE WHEN id = 1 THEN 0 WHEN total = 5 THEN 6 END) WHERE total = 5 OR id = 1"
    )
    .is_empty());
    assert!(from_itself("UPDATE orders SET total = total + id").is_empty());
    assert!(from_itself("UPDATE orders SET total = greatest(total, 10)").is_empty());
    assert_eq!(from_itself("ALTER TABLE orders ALTER COLUMN total TYPE int"), ["total"]);
    assert!(from_itself("ALTER TABLE orders ALTER COLUMN total TYPE int USING 0").is_empty());
    // Set from itself in one statement and not in another: not from itself.
    assert!(from_itself("UPDATE orders SET total = total * 2; UPDATE orders SET total = 0").is_empty());
}

#[test]
fn records_are_read_as_record_out_writes_them() {
    // Cut short, a field is read as far as it goes.
    assert_eq!(record_fields("(\"a long"), [Some("a long".to_owned())]);
    assert_eq!(record_fields("(enterprise)"), [Some("enterprise".to_owned())]);
    assert_eq!(record_fields("()"), [None]);
    assert_eq!(record_fields("(\"\")"), [Some(String::new())]);
    assert_eq!(
        record_fields(r#"(1,"a, ""b"" \\c",)"#),
        [Some("1".to_owned()), Some(r#"a, "b" \c"#.to_owned()), None]
    );
}

fn values(rows: &[(i64, Option<&str>)]) -> Values {
    Values {
        columns: vec!["tier".into()],
        rows: rows.iter().map(|(k, v)| (format!("({k})"), vec![cell(*v)])).collect(),
    }
}

#[test]
fn a_value_is_lost_when_its_row_now_holds_what_rows_of_another_value_hold() {
    // 20 enterprise rows set to standard, beside 80 that were standard already.
    let before: Vec<(i64, Option<&str>)> =
        (0..100).map(|i| (i, Some(if i < 20 { "enterprise" } else { "standard" }))).collect();
    let after: Vec<(i64, Option<&str>)> = (0..100).map(|i| (i, Some("standard"))).collect();
    let l = lost(&values(&before), &values(&after), "tier", &Making::Mixed).unwrap();
    assert_eq!((l.changed, l.lost, l.distinct), (20, 20, (1, 1)));
    assert_eq!(l.into, [(Some("standard".into()), 20, vec![(Some("enterprise".into()), 20)])]);

    // Read backwards, nothing is lost: a renamed value, a NULL filled in.
    let renamed: Vec<(i64, Option<&str>)> =
        before.iter().map(|(k, v)| (*k, if *v == Some("enterprise") { Some("gold") } else { *v })).collect();
    assert_eq!(lost(&values(&before), &values(&renamed), "tier", &Making::Mixed).unwrap().lost, 0);
    let empty: Vec<(i64, Option<&str>)> = (0..100).map(|i| (i, None)).collect();
    let filled: Vec<(i64, Option<&str>)> =
        (0..100).map(|i| (i, Some(if i % 2 == 0 { "a" } else { "b" }))).collect();
    assert_eq!(lost(&values(&empty), &values(&filled), "tier", &Making::Mixed).unwrap().lost, 0);

    // Computed from itself: qty + 1 on half the rows meets the other half's
    // values, but can be undone; rounding two values into one cannot.
    let qty: Vec<(i64, Option<&str>)> =
        (0..100).map(|i| (i, Some(["1", "2", "3", "4"][i as usize % 4]))).collect();
    let bumped: Vec<(i64, Option<&str>)> = qty
        .iter()
        .map(|(k, v)| (*k, if k % 2 == 0 { Some(["2", "3", "4", "5"][*k as usize % 4]) } else { *v }))
        .collect();
    assert_eq!(lost(&values(&qty), &values(&bumped), "tier", &Making::Itself).unwrap().lost, 0);
    assert!(lost(&values(&qty), &values(&bumped), "tier", &Making::Mixed).unwrap().lost > 0);
    let rounded: Vec<(i64, Option<&str>)> =
        qty.iter().map(|(k, v)| (*k, if *v == Some("2") { Some("1") } else { *v })).collect();
    let halved: Vec<(i64, Option<&str>)> =
        qty.iter().map(|(k, _)| (*k, Some(if k % 4 < 2 { "1" } else { "2" }))).collect();
    assert_eq!(
        lost(&values(&qty), &values(&rounded), "tier", &Making::Itself).unwrap().lost,
        25,
        "one value, like a constant"
    );
    assert_eq!(lost(&values(&qty), &values(&halved), "tier", &Making::Itself).unwrap().lost, 50);

    // Every value put to NULL: each row that held one lost it.
    let l = lost(&values(&filled), &values(&empty), "tier", &Making::Mixed).unwrap();
    assert_eq!((l.lost, l.distinct), (100, (2, 1)));
}

#[test]
fn a_hazard_needs_a_thousand_rows_or_a_tenth_of_the_table() {
    assert!(enough(1_000, 1_000_000));
    assert!(!enough(999, 1_000_000));
    assert!(enough(2_000, 20_000));
    assert!(!enough(19, 100));
    assert!(enough(20, 200));
    assert!(!enough(20, 201));
    assert!(enough(40, 40));
}

#[test]
fn the_message_names_the_column_the_rows_and_the_values() {
    let before: Vec<(i64, Option<&str>)> =
        (0..20_000).map(|i| (i, Some(if i < 2_000 { "enterprise" } else { "standard" }))).collect();
    let after: Vec<(i64, Option<&str>)> = (0..20_000).map(|i| (i, Some("standard"))).collect();
    let t = Target {
        table: "public.customers".into(),
        columns: vec!["tier".into()],
        from_itself: BTreeSet::new(),
        discards: BTreeMap::new(),
        line: 3,
        named: true,
    };
    let (b, a) = (
        BTreeMap::from([(t.table.clone(), values(&before))]),
        BTreeMap::from([(t.table.clone(), values(&after))]),
    );
    let rows = BTreeMap::from([(t.table.clone(), 20_000)]);
    let (h, notes) = report(&losses(&[t], &b, &a, &rows), &b, &[], &Shape::default());
    assert_eq!((h.len(), notes.len()), (1, 0));
    assert_eq!(h[0].kind, "values_overwritten");
    assert_eq!(h[0].line, Some(3));
    assert!(
        h[0].message.starts_with("2,000 of the 20,000 rows of customers lost their tier: 2,000 had tier 'enterprise', now 'standard'"),
        "{}",
        h[0].message
    );
    assert!(h[0]
        .suggestion
        .as_deref()
        .unwrap()
        .contains("CREATE TABLE customers_tier_before AS SELECT id, tier"));
}

#[test]
fn values_kept_elsewhere_by_the_migration_are_a_note() {
    let before: Vec<(i64, Option<&str>)> =
        (0..2_000).map(|i| (i, Some(if i < 500 { "enterprise" } else { "standard" }))).collect();
    let after: Vec<(i64, Option<&str>)> = (0..2_000).map(|i| (i, Some("standard"))).collect();
    let t = Target {
        table: "public.customers".into(),
        columns: vec!["tier".into()],
        from_itself: BTreeSet::new(),
        discards: BTreeMap::new(),
        line: 2,
        named: true,
    };
    let (b, a) = (
        BTreeMap::from([(t.table.clone(), values(&before))]),
        BTreeMap::from([(t.table.clone(), values(&after))]),
    );
    let rows = BTreeMap::from([(t.table.clone(), 2_000)]);
    // A copy of the enterprise rows' keys and tiers, in a column named otherwise.
    let mut copy = values(&before[..500]);
    copy.columns = vec!["old_tier".into()];
    let kept = BTreeMap::from([("public.tiers_before".to_owned(), copy.clone())]);
    let (h, notes) =
        report(&losses(std::slice::from_ref(&t), &b, &a, &rows), &b, &[&kept], &Shape::default());
    assert!(h.is_empty(), "{h:?}");
    assert!(
        notes[0].message.ends_with("kept every old value in tiers_before.old_tier"),
        "{}",
        notes[0].message
    );
    // One row missing from the copy: not kept.
    copy.rows.remove("(7)");
    let kept = BTreeMap::from([("public.tiers_before".to_owned(), copy)]);
    let (h, notes) = report(&losses(&[t], &b, &a, &rows), &b, &[&kept], &Shape::default());
    assert_eq!((h.len(), notes.len()), (1, 0));
}

fn counted(values: &[(Option<&str>, i64)]) -> std::collections::HashMap<Cell, i64> {
    values.iter().map(|(v, n)| (cell(*v), *n)).collect()
}

#[test]
fn without_pairs_a_value_is_lost_when_its_rows_joined_a_value_held_before_or_many_became_few() {
    // 2,000 enterprise rows became standard, beside 18,000 standard already.
    let tiers = counted(&[(Some("enterprise"), 2_000), (Some("standard"), 18_000)]);
    let l = counts::lost(&tiers, &counted(&[(Some("standard"), 20_000)]), &Making::Mixed);
    assert_eq!((l.changed, l.lost, l.distinct), (2_000, 2_000, (1, 1)));
    assert_eq!(l.into, [(Some("standard".into()), 2_000, vec![(Some("enterprise".into()), 2_000)])]);
    assert!(l.keys.is_empty());

    // Three values set to NULL (none was NULL): many became one.
    let three = counted(&[(Some("a"), 10), (Some("b"), 20), (Some("c"), 30)]);
    let l = counts::lost(&three, &counted(&[(None, 60)]), &Making::Mixed);
    assert_eq!((l.lost, l.distinct), (60, (3, 1)));

    // Renamed one for one, NULLs filled in, rows deleted or added: nothing lost.
    let renamed = counted(&[(Some("A"), 10), (Some("B"), 20), (Some("C"), 30)]);
    assert_eq!(counts::lost(&three, &renamed, &Making::Mixed).lost, 0);
    let filled =
        counts::lost(&counted(&[(None, 50), (Some("x"), 50)]), &counted(&[(Some("x"), 100)]), &Making::Mixed);
    assert_eq!(filled.lost, 0);
    assert_eq!(counts::lost(&three, &counted(&[(Some("c"), 30)]), &Making::Mixed).lost, 0);
    assert_eq!(
        counts::lost(&three, &counted(&[(Some("a"), 110), (Some("b"), 20), (Some("c"), 30)]), &Making::Mixed)
            .lost,
        0
    );

    // Rows deleted and others made anew with a value already held: as many
    // as left lost their values, no more.
    let l = counts::lost(&tiers, &counted(&[(Some("standard"), 25_000)]), &Making::Mixed);
    assert_eq!(l.lost, 2_000);
    assert!(l.into.iter().all(|(_, n, was)| *n <= 2_000 && was.iter().all(|(_, m)| *m <= 2_000)), "{l:?}");
}

#[test]
fn a_loss_told_by_counts_says_so_and_a_table_without_a_key_is_kept_whole() {
    let t = Target {
        table: "public.events".into(),
        columns: vec!["kind".into()],
        from_itself: BTreeSet::new(),
        discards: BTreeMap::new(),
        line: 1,
        named: true,
    };
    let before = BTreeMap::from([(
        t.table.clone(),
        counts::Counts::from([(
            "kind".to_owned(),
            counted(&[(Some("error"), 2_000), (Some("info"), 6_000)]),
        )]),
    )]);
    let after = BTreeMap::from([(
        t.table.clone(),
        counts::Counts::from([("kind".to_owned(), counted(&[(Some("info"), 8_000)]))]),
    )]);
    let rows = BTreeMap::from([(t.table.clone(), 8_000)]);
    let losses = counted_losses(std::slice::from_ref(&t), &before, &after, &rows);
    let (h, notes) = report(&losses, &BTreeMap::new(), &[], &Shape::default());
    assert_eq!((h.len(), notes.len()), (1, 0));
    assert!(
        h[0].message.starts_with(
            "2,000 of the 8,000 rows of events lost their kind (told by how many rows hold each value: no key pairs its rows here): 2,000 had kind 'error', now 'info'"
        ),
        "{}",
        h[0].message
    );
    assert!(h[0]
        .suggestion
        .as_deref()
        .unwrap()
        .contains("CREATE TABLE events_kind_before AS SELECT * FROM events"));
    // A column computed from itself is judged by counts only where it collapsed.
    let mut bumped = t.clone();
    bumped.from_itself.insert("kind".into());
    assert!(counted_losses(std::slice::from_ref(&bumped), &before, &after, &rows).is_empty());
    let five = counted(&[(Some("1"), 2_000), (Some("2"), 2_000), (Some("3"), 2_000), (Some("4"), 2_000)]);
    let shifted = counted(&[(Some("2"), 2_000), (Some("3"), 2_000), (Some("4"), 2_000), (Some("5"), 2_000)]);
    let one = counted(&[(Some("1"), 8_000)]);
    let counts_of = |c| BTreeMap::from([(t.table.clone(), counts::Counts::from([("kind".to_owned(), c)]))]);
    let lost =
        |a| counted_losses(std::slice::from_ref(&bumped), &counts_of(five.clone()), &counts_of(a), &rows);
    assert!(lost(shifted).is_empty());
    assert_eq!(lost(one)[0].lost.lost, 6_000);
    // Without a key to pair by, a target is counted.
    let (paired, by_counts) =
        by_pairing(vec![t], &Shape::default(), &BTreeSet::from(["public.events".into()]));
    assert_eq!((paired.len(), by_counts.len()), (0, 1));
}

#[test]
fn an_update_under_names_an_earlier_statement_gave_sets_the_golden_columns() {
    assert_eq!(
        targets_of(
            "ALTER TABLE customers RENAME COLUMN tier TO plan;\nUPDATE customers SET plan = 'standard';\n\
             ALTER TABLE customers RENAME COLUMN plan TO tier;"
        ),
        [owned("public.customers", &["tier"])]
    );
    assert_eq!(
        targets_of(
            "ALTER TABLE public.customers RENAME TO clients;\nALTER TABLE clients RENAME tier TO level;\n\
             ALTER TABLE clients RENAME COLUMN level TO grade;\nUPDATE clients SET grade = NULL, name = 'x';"
        ),
        [owned("public.customers", &["tier", "name"])]
    );
    // A column renamed away leaves its old name to whatever takes it.
    assert!(targets_of("ALTER TABLE orders RENAME COLUMN total TO amount;\nUPDATE orders SET id = id")
        .iter()
        .all(|(_, c)| !c.contains(&"total".to_string())));
}

#[test]
fn a_trigger_function_setting_a_column_of_its_row_targets_it() {
    let trigger = |body: &str| {
        format!(
            "CREATE FUNCTION f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN {body} RETURN NEW; END $$;\n\
             CREATE TRIGGER t BEFORE UPDATE ON orders FOR EACH ROW EXECUTE FUNCTION f();"
        )
    };
    assert_eq!(targets_of(&trigger("NEW.total := 0;")), [owned("public.orders", &["total"])]);
    assert_eq!(
        targets_of(&trigger("IF NEW.id > 5 THEN NEW.tier = 'standard'; END IF;")),
        [owned("public.customers", &["tier"])]
    );
    // A comparison is no assignment; a clock stamp overwrites nothing anyone keeps.
    assert!(targets_of(&trigger("IF NEW.total = OLD.total THEN RETURN NULL; END IF;")).is_empty());
    assert!(targets_of(&trigger("NEW.total := now();")).is_empty());
    assert_eq!(
        targets_of(&trigger("NEW.total := CASE WHEN now() > '2020-01-01' THEN 0 END;")),
        [owned("public.orders", &["total"])]
    );
    // A trigger stamping the row keeps a record of the change, and so does
    // an UPDATE setting the clock's time.
    assert!(targets_of(&trigger("NEW.total := now() AT TIME ZONE 'utc';")).is_empty());
    assert!(targets_of("UPDATE orders SET total = current_timestamp::date").is_empty());
    assert_eq!(
        targets_of("UPDATE orders SET total = 0, id = now() AT TIME ZONE 'utc'"),
        [owned("public.orders", &["total"])]
    );
    // A bump of its own value is computed from itself.
    let c = catalog();
    let tables = c.tables.keys().cloned().collect();
    let statements = airlock_postgres::split::split(&trigger("NEW.total := OLD.total + 1;")).unwrap();
    let found = targets(&statements, &c, &tables);
    assert_eq!(found[0].from_itself.iter().collect::<Vec<_>>(), ["total"]);
}

/// A value read with its text (`None`: NULL).
fn cell(v: Option<&str>) -> Cell {
    Cell { digest: v.map_or(NULL_DIGEST, digest_of), shown: v.map(str::to_owned) }
}

#[test]
fn a_value_computed_without_the_old_one_or_cut_from_it_discards_it() {
    let c = catalog();
    let tables = c.tables.keys().cloned().collect();
    let discards = |sql: &str| {
        let statements = airlock_postgres::split::split(sql).unwrap();
        targets(&statements, &c, &tables)[0].discards.clone().into_iter().collect::<Vec<(String, Discard)>>()
    };
    let others = |c: &str| vec![(c.to_owned(), Discard::Others)];
    let cut = |c: &str, f: &str| vec![(c.to_owned(), Discard::Cut(f.into()))];
    // From the row's other columns and constants alone.
    assert_eq!(
        discards("UPDATE customers SET name = lower(regexp_replace(tier, '\\s+', '-', 'g'))"),
        others("name")
    );
    assert_eq!(discards("UPDATE orders SET total = id / 100.0"), others("total"));
    assert_eq!(discards("UPDATE customers SET tier = 'standard' WHERE tier = 'enterprise'"), others("tier"));
    assert_eq!(discards("ALTER TABLE orders ALTER COLUMN total TYPE numeric USING id * 2"), others("total"));
    // Read only where it cannot shape the value: times zero, or as the last
    // fallback of a coalesce (replaced wherever the others hold a value).
    assert_eq!(discards("UPDATE orders SET total = total * 0 + 1000 + id"), others("total"));
    assert_eq!(discards("UPDATE customers SET name = coalesce(tier, name)"), others("name"));
    assert_eq!(
        discards("UPDATE customers c SET name = coalesce((SELECT max(o.id) FROM orders o WHERE o.id = c.id), c.name)"),
        vec![("name".to_owned(), Discard::Elsewhere)]
    );
    assert_eq!(
        discards(
            "CREATE FUNCTION f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.name := upper(NEW.tier); RETURN NEW; END $$;\n\
             CREATE TRIGGER t BEFORE UPDATE ON customers FOR EACH ROW EXECUTE FUNCTION f();"
        ),
        others("name")
    );
    // Its own value cut to a part.
    assert_eq!(discards("UPDATE orders SET total = date_trunc('day', total)"), cut("total", "date_trunc"));
    assert_eq!(discards("UPDATE orders SET total = round(total)::int"), cut("total", "round"));
    assert_eq!(
        discards("UPDATE customers SET name = substring(name from 1 for 50)"),
        cut("name", "substring")
    );
    assert_eq!(
        discards("ALTER TABLE customers ALTER COLUMN name TYPE text USING left(name, 3)"),
        cut("name", "left")
    );
    assert_eq!(discards("UPDATE customers SET tier = md5(tier)"), cut("tier", "md5"));
    assert_eq!(discards("UPDATE customers SET tier = md5(tier) || '@anon.invalid'"), cut("tier", "md5"));
    // Values from other rows, without its own: a FROM, a subquery, the rows
    // an upsert or a MERGE offers.
    let elsewhere = vec![("total".to_owned(), Discard::Elsewhere)];
    for sql in [
        "UPDATE orders o SET total = s.total FROM staging s WHERE s.id = o.id",
        "UPDATE orders o SET total = (SELECT sum(id) FROM customers c WHERE c.id = o.id)",
        "INSERT INTO orders VALUES (1) ON CONFLICT (id) DO UPDATE SET total = excluded.total",
        "MERGE INTO orders o USING staging s ON s.id = o.id WHEN MATCHED THEN UPDATE SET total = 7",
    ] {
        assert_eq!(discards(sql), elsewhere, "{sql}");
    }
    // Set two ways, one discarding: discarding, whatever the other did (a
    // decoy that sets nothing first hides nothing).
    assert_eq!(
        discards("UPDATE orders SET total = total || '' WHERE false; UPDATE orders SET total = id * 2"),
        others("total")
    );
    assert_eq!(
        discards("UPDATE orders SET total = id * 2; UPDATE orders SET total = total + 1"),
        others("total")
    );
    // Neither: arithmetic inside a cut, the value's own part, its own value
    // with others (FROM or not), a CASE over the column.
    for sql in [
        "UPDATE orders SET total = round(total * 1.1, 2)",
        "UPDATE orders SET total = total + id",
        "UPDATE customers SET name[1] = 'x'",
        "UPDATE orders o SET total = o.total + s.total FROM staging s WHERE s.id = o.id",
        "UPDATE customers SET tier = CASE WHEN tier = 'a' THEN 'b' ELSE tier END",
        "UPDATE customers SET name = coalesce(name, tier)",
        "UPDATE orders SET total = total * 10 + id",
    ] {
        assert_eq!(discards(sql), [], "{sql}");
    }
}

#[test]
fn a_value_replaced_by_one_no_other_row_holds_is_lost_when_made_discarding_it() {
    // prices set from the key: every row its own new value, none alike.
    let before: Vec<(i64, Option<&str>)> =
        (0..100).map(|i| (i, Some(["9.99", "4.50", "12.00"][i as usize % 3]))).collect();
    let numbers: Vec<String> = (0..100).map(|i| format!("{i}.01")).collect();
    let after: Vec<(i64, Option<&str>)> = (0..100).map(|i| (i, Some(numbers[i as usize].as_str()))).collect();
    let l = lost(&values(&before), &values(&after), "tier", &Making::Discarding(Discard::Others)).unwrap();
    assert_eq!((l.changed, l.lost, l.alone), (100, 100, 100));
    // The merge rule alone sees nothing there.
    assert_eq!(lost(&values(&before), &values(&after), "tier", &Making::Mixed).unwrap().lost, 0);
    // A relabel that many rows share can be read backwards: 'done' ->
    // 'archived', whatever made it; a NULL filled in loses nothing either.
    let statuses: Vec<(i64, Option<&str>)> = (0..100)
        .map(|i| (i, if i < 10 { None } else { Some(if i < 60 { "done" } else { "open" }) }))
        .collect();
    let archived: Vec<(i64, Option<&str>)> = statuses
        .iter()
        .map(|(k, v)| {
            (
                *k,
                if *v == Some("done") {
                    Some("archived")
                } else if v.is_none() {
                    Some(["a", "b"][*k as usize % 2])
                } else {
                    *v
                },
            )
        })
        .collect();
    assert_eq!(
        lost(&values(&statuses), &values(&archived), "tier", &Making::Discarding(Discard::Others))
            .unwrap()
            .lost,
        0
    );
    // Some merged, some alone: both counted, and told apart.
    let half: Vec<(i64, Option<&str>)> =
        (0..100).map(|i| (i, Some(if i < 50 { "same" } else { numbers[i as usize].as_str() }))).collect();
    let l = lost(&values(&before), &values(&half), "tier", &Making::Discarding(Discard::Others)).unwrap();
    assert_eq!((l.lost, l.alone), (100, 50));

    // By counts, where no key pairs the rows: new values one row each.
    let was = counts::of_values(&values(&before)).remove("tier").unwrap();
    let now = counts::of_values(&values(&after)).remove("tier").unwrap();
    let l = counts::lost(&was, &now, &Making::Discarding(Discard::Others));
    assert_eq!((l.lost, l.alone), (100, 100));
    assert_eq!(counts::lost(&was, &now, &Making::Mixed).lost, 0);
    let relabelled = counts::of_values(&values(&archived)).remove("tier").unwrap();
    let statuses = counts::of_values(&values(&statuses)).remove("tier").unwrap();
    assert_eq!(counts::lost(&statuses, &relabelled, &Making::Discarding(Discard::Others)).lost, 0);
}

#[test]
fn a_one_for_one_replacement_is_told_as_such_and_a_cut_is_high() {
    let before: Vec<(i64, Option<&str>)> =
        (0..2_000).map(|i| (i, Some(["blue-shirt-1", "red-hat-2"][i as usize % 2]))).collect();
    let slugs: Vec<String> = (0..2_000).map(|i| format!("item-{i}")).collect();
    let after: Vec<(i64, Option<&str>)> = (0..2_000).map(|i| (i, Some(slugs[i as usize].as_str()))).collect();
    let target = |discard: Discard| Target {
        table: "public.customers".into(),
        columns: vec!["tier".into()],
        from_itself: BTreeSet::new(),
        discards: BTreeMap::from([("tier".to_owned(), discard)]),
        line: 4,
        named: true,
    };
    let (b, a) = (
        BTreeMap::from([("public.customers".to_owned(), values(&before))]),
        BTreeMap::from([("public.customers".to_owned(), values(&after))]),
    );
    let rows = BTreeMap::from([("public.customers".to_owned(), 2_000)]);
    let told = |t: Target| {
        let (h, notes) = report(&losses(&[t], &b, &a, &rows), &b, &[], &Shape::default());
        assert!(notes.is_empty());
        assert_eq!(h.len(), 1);
        h.into_iter().next().unwrap()
    };
    let h = told(target(Discard::Others));
    assert_eq!(h.severity, Severity::High);
    assert!(
        h.message.starts_with("2,000 of the 2,000 rows of customers lost their tier: 1 had tier "),
        "{}",
        h.message
    );
    assert!(
        h.message.ends_with("; ...; a value computed from the row's other columns, one no other row holds, replaced each of them, and what they were is not kept anywhere"),
        "{}",
        h.message
    );
    let h = told(target(Discard::Cut("left".into())));
    assert_eq!(h.severity, Severity::High);
    assert!(h.message.contains("; left kept only part of each of them, and what they were"), "{}", h.message);
    let h = told(target(Discard::Cut("md5".into())));
    assert!(h.message.contains("; md5 kept only a hash of each of them"), "{}", h.message);
    let h = told(target(Discard::Elsewhere));
    assert!(
        h.message
            .contains("; a value from other rows or tables, one no other row holds, replaced each of them"),
        "{}",
        h.message
    );
    // Too few for a hazard: a note that says so.
    let few: Vec<(i64, Option<&str>)> = (0..2_000)
        .map(|i| (i, if i < 600 { Some(slugs[i as usize].as_str()) } else { before[i as usize].1 }))
        .collect();
    let a = BTreeMap::from([("public.customers".to_owned(), values(&few))]);
    let rows = BTreeMap::from([("public.customers".to_owned(), 20_000)]);
    let (h, notes) = report(&losses(&[target(Discard::Others)], &b, &a, &rows), &b, &[], &Shape::default());
    assert!(h.is_empty(), "{h:?}");
    assert_eq!(notes.len(), 1);
    assert_eq!(notes[0].severity, Severity::Low);
    assert!(
        notes[0].message.starts_with("600 of the 20,000 rows of customers lost their tier"),
        "{}",
        notes[0].message
    );
    assert!(
        notes[0].message.ends_with("(fewer than 1,000 rows and a tenth of the table: a note, not a hazard)"),
        "{}",
        notes[0].message
    );
}
