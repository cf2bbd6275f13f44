use std::collections::HashMap;

use super::super::{digest_of, Cell, Values};
use super::*;

/// A document's parts as [`read_parts`] writes them: each a path and a
/// value (`None` for JSON `null`), the hash a stand-in of the server's.
fn doc(parts: &[(&[&str], Option<&str>)]) -> Cell {
    let hash = |v: &str| {
        v.bytes().fold(1469598103934665603u64, |h, b| (h ^ b as u64).wrapping_mul(1099511628211)) as i64
    };
    let parts: Vec<serde_json::Value> =
        parts.iter().map(|(path, v)| serde_json::json!([path, v.map(hash), v.unwrap_or("null")])).collect();
    let text = serde_json::Value::Array(parts).to_string();
    Cell { digest: digest_of(&format!("{:x}", md5_like(&text))), shown: Some(text) }
}

/// A digest that differs where the text does (these tests need no more).
fn md5_like(text: &str) -> u128 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish() as u128
}

fn values(rows: impl Iterator<Item = (String, Cell)>) -> Values {
    Values {
        columns: vec!["payload".into()],
        rows: rows.map(|(k, c)| (k, vec![c])).collect::<HashMap<_, _>>(),
    }
}

/// What `payload` lost over `n` rows whose document `before(i)` became `after(i)`.
fn judged(n: usize, before: impl Fn(usize) -> Cell, after: impl Fn(usize) -> Cell) -> Option<PartLoss> {
    let b = values((0..n).map(|i| (format!("({i})"), before(i))));
    let a = values((0..n).map(|i| (format!("({i})"), after(i))));
    column_losses(&b, &a, "payload", true)
}

#[test]
fn a_key_stripped_from_every_document_loses_each_of_its_values() {
    let ip = |i: usize| format!("10.0.0.{i}");
    let l = judged(
        100,
        |i| doc(&[(&["ip"], Some(&ip(i))), (&["ua"], Some("curl"))]),
        |_| doc(&[(&["ua"], Some("curl"))]),
    )
    .unwrap();
    assert_eq!(l.lost, 100);
    assert_eq!(l.paths.len(), 1);
    let p = &l.paths[0];
    assert_eq!((p.path.as_str(), p.rows, p.distinct, p.now.as_deref()), ("payload->'ip'", 100, 100, None));
    assert_eq!(group(p).split(" (such").next(), Some("100 held payload->'ip'"));
    assert!(group(p).ends_with("100 distinct values), now gone"), "{}", group(p));
}

#[test]
fn a_nested_value_overwritten_with_one_value_is_lost_and_named_by_its_path() {
    let l = judged(
        50,
        |i| doc(&[(&["meta", "ip"], Some(&format!("10.1.0.{i}"))), (&["n"], Some(&i.to_string()))]),
        |i| doc(&[(&["meta", "ip"], Some("0.0.0.0")), (&["n"], Some(&i.to_string()))]),
    )
    .unwrap();
    assert_eq!(l.lost, 50);
    assert_eq!(l.paths[0].path, "payload->'meta'->'ip'");
    assert_eq!(l.paths[0].now.as_deref(), Some("0.0.0.0"));
}

#[test]
fn a_value_overwritten_where_other_rows_already_held_the_new_one_is_lost() {
    // Half the rows were 'standard' and stay so; the other half become it.
    let tier = |i: usize| if i % 2 == 0 { "enterprise" } else { "standard" };
    let l = judged(
        40,
        |i| doc(&[(&["tier"], Some(tier(i))), (&["n"], Some(&i.to_string()))]),
        |i| doc(&[(&["tier"], Some("standard")), (&["n"], Some(&i.to_string()))]),
    )
    .unwrap();
    assert_eq!(l.lost, 20);
    assert_eq!(group(&l.paths[0]), "20 held payload->'tier' 'enterprise', now 'standard'");
}

#[test]
fn a_key_renamed_added_or_of_one_value_dropped_or_a_null_dropped_loses_nothing() {
    let ip = |i: usize| format!("10.0.0.{i}");
    let cases: Vec<(&str, Box<dyn Fn(usize) -> Cell>, Box<dyn Fn(usize) -> Cell>)> = vec![
        (
            "renamed",
            Box::new(move |i| doc(&[(&["ip"], Some(&ip(i)))])),
            Box::new(move |i| doc(&[(&["client_ip"], Some(&format!("10.0.0.{i}")))])),
        ),
        (
            "added",
            Box::new(|i| doc(&[(&["n"], Some(&i.to_string()))])),
            Box::new(|i| doc(&[(&["n"], Some(&i.to_string())), (&["source"], Some("web"))])),
        ),
        (
            "one value dropped",
            Box::new(|i| doc(&[(&["n"], Some(&i.to_string())), (&["v"], Some("1"))])),
            Box::new(|i| doc(&[(&["n"], Some(&i.to_string()))])),
        ),
        (
            "a null dropped",
            Box::new(|i| doc(&[(&["n"], Some(&i.to_string())), (&["ref"], None)])),
            Box::new(|i| doc(&[(&["n"], Some(&i.to_string()))])),
        ),
        (
            "a value changed in every row, each its own",
            Box::new(|i| doc(&[(&["n"], Some(&i.to_string()))])),
            Box::new(|i| doc(&[(&["n"], Some(&(i + 1000).to_string()))])),
        ),
    ];
    for (name, before, after) in cases {
        let lost = judged(30, before, after).map_or(0, |l| l.lost);
        assert_eq!(lost, 0, "{name}");
    }
}

#[test]
fn a_document_not_judged_or_unchanged_is_left_out() {
    assert!(judged(
        10,
        |i| doc(&[(&["n"], Some(&i.to_string()))]),
        |i| doc(&[(&["n"], Some(&i.to_string()))])
    )
    .is_none());
    // More parts than are read: no parts, not judged.
    let unread = || Cell { digest: 7, shown: None };
    let l = judged(10, |i| doc(&[(&["n"], Some(&i.to_string()))]), |_| unread());
    assert_eq!(l.map_or(0, |l| l.lost), 0);
}

#[test]
fn the_parts_read_is_one_expression_of_the_column_given() {
    let sql = read_parts("t.\"Payload\"", "jsonb");
    assert!(sql.starts_with("(SELECT") && sql.ends_with(')'), "{sql}");
    assert!(sql.contains("SELECT ARRAY[]::text[], t.\"Payload\", 0") && sql.contains("'{}'"), "{sql}");
    assert_eq!(sql.matches('(').count(), sql.matches(')').count());
    // Never through to_jsonb or a cast of a type a candidate may have made.
    assert!(read_parts("t.p", "json").contains("(t.p)::pg_catalog.jsonb"));
    let other = read_parts("t.ip", "public.ip_box");
    assert!(other.contains("pg_catalog.to_jsonb(pg_catalog.format('%s', t.ip))"), "{other}");
    assert!(!other.contains("to_jsonb(t.ip)") && !other.contains("t.ip::"), "{other}");
}

#[test]
fn a_counter_bumped_in_some_rows_can_be_undone_but_not_when_set_from_elsewhere() {
    // Even rows' counters go up by one and meet the odd rows' unchanged values.
    let before =
        |i: usize| doc(&[(&["n"], Some(&(i / 2).to_string())), (&["id"], Some(&format!("row {i}")))]);
    let after = |i: usize| {
        let n = if i % 2 == 0 { i / 2 + 1 } else { i / 2 };
        doc(&[(&["n"], Some(&n.to_string())), (&["id"], Some(&format!("row {i}")))])
    };
    let b = values((0..60).map(|i| (format!("({i})"), before(i))));
    let a = values((0..60).map(|i| (format!("({i})"), after(i))));
    assert_eq!(column_losses(&b, &a, "payload", true).map_or(0, |l| l.lost), 0);
    // Not computed from itself: each bumped row now holds what another row
    // held (all but the one bumped past every odd row's value).
    assert_eq!(column_losses(&b, &a, "payload", false).map_or(0, |l| l.lost), 29);
}

#[test]
fn a_path_is_written_as_sql_reaches_it() {
    let path = |keys: &[&str]| path_of("payload", &keys.iter().map(|k| k.to_string()).collect::<Vec<_>>());
    assert_eq!(path(&["meta", "ip"]), "payload->'meta'->'ip'");
    assert_eq!(path(&["hops", "[2]", "it's"]), "payload->'hops'->2->'it''s'");
    assert_eq!(path(&["[x]"]), "payload->'[x]'");
}
