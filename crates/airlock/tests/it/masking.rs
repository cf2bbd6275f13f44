//! Masked and subsetted goldens, built from a "production" PostgreSQL of the
//! test's own with people, accounts, orders, payments and support tickets:
//! an email used as a foreign key, a unique phone number, a self-referencing
//! `referred_by`, a cycle between accounts and orders, an address inside
//! `jsonb`, free text quoting email addresses, and a reference the schema does
//! not declare. What a fork holds is checked against the source value by
//! value, and the fork's files are searched byte by byte for source values.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

use crate::harness::{dsn, sql, Daemon};
use crate::imports::{script, Production};

const SOURCE: &str = r#"
CREATE DATABASE shop;
\c shop
CREATE TABLE people (
  id bigserial PRIMARY KEY,
  email text NOT NULL UNIQUE CHECK (email LIKE '%@%'),
  full_name text NOT NULL,
  phone text UNIQUE,
  ssn text,
  born date,
  last_ip inet,
  nickname text,
  profile jsonb,
  referred_by bigint REFERENCES people(id),
  tier text NOT NULL DEFAULT 'standard');
CREATE TABLE accounts (
  id bigserial PRIMARY KEY,
  owner_email text NOT NULL REFERENCES people(email) ON UPDATE CASCADE,
  iban text,
  primary_order bigint);
CREATE TABLE orders (
  id bigserial PRIMARY KEY,
  account_id bigint NOT NULL REFERENCES accounts(id),
  placed_at date NOT NULL,
  total numeric(10,2) NOT NULL CHECK (total > -100),
  shipping_address text);
ALTER TABLE accounts ADD FOREIGN KEY (primary_order) REFERENCES orders(id);
CREATE TABLE payments (id bigserial PRIMARY KEY, order_id bigint NOT NULL REFERENCES orders(id), card_number text, amount numeric(10,2));
CREATE TABLE tickets (id bigserial PRIMARY KEY, person_id bigint REFERENCES people(id), body text);
CREATE TABLE events (id bigserial PRIMARY KEY, actor_email text, kind text);
CREATE TABLE products (id serial PRIMARY KEY, title text);
INSERT INTO people (email, full_name, phone, ssn, born, last_ip, nickname, profile, referred_by)
  SELECT 'user' || g || '@mail' || (g % 7) || '.example-corp.com',
         (ARRAY['Maria','James','Linda','Ahmed','Sofia','Wei'])[1 + g % 6] || ' ' || (ARRAY['Lopez','Smith','Nguyen','Kowalski','Okafor'])[1 + g % 5] || 'son' || g,
         '+44 20 ' || lpad((7946000 + g)::text, 7, '0'),
         lpad((100 + g % 800)::text, 3, '0') || '-' || lpad((g % 97)::text, 2, '0') || '-' || lpad(g::text, 4, '0'),
         date '1960-01-01' + g * 7,
         ('192.168.' || (g / 250) || '.' || (g % 250 + 1))::inet,
         'nick' || g,
         jsonb_build_object('address', jsonb_build_object('street', g || ' Harbour Street', 'city', 'Leeds' || g), 'newsletter', g % 2 = 0),
         CASE WHEN g > 10 THEN g / 10 END
  FROM generate_series(1, 2000) g;
INSERT INTO accounts (owner_email, iban) SELECT email, 'GB82 WEST 1234 5698 7654 32' FROM people WHERE id % 2 = 0;
INSERT INTO orders (account_id, placed_at, total, shipping_address)
  SELECT a.id, date '2025-01-01' + (g % 300), round((10 + g % 500 + (g % 100) / 100.0)::numeric, 2), g || ' Mill Lane, Bristol'
  FROM accounts a, generate_series(1, 3) g;
UPDATE accounts a SET primary_order = (SELECT min(id) FROM orders o WHERE o.account_id = a.id);
INSERT INTO payments (order_id, card_number, amount) SELECT id, '4111 1111 1111 1111', total FROM orders WHERE id % 2 = 1;
INSERT INTO tickets (person_id, body)
  SELECT id, CASE WHEN id % 3 = 0 THEN 'please write back to ' || email || ' about my order' ELSE 'printer on fire again' END
  FROM people WHERE id % 2 = 1;
INSERT INTO events (actor_email, kind) SELECT email, 'login' FROM people WHERE id % 5 = 0;
INSERT INTO products (title) SELECT 'widget ' || g FROM generate_series(1, 50) g;
"#;

const RULES: &str = r#"
[[columns]]
column = "public.people.email"
transform = "email"

[[columns]]
column = "public.people.full_name"
transform = "name"

[[columns]]
column = "public.people.phone"
transform = "phone"

[[columns]]
column = "public.people.ssn"
transform = "partial"
keep_last = 4

[[columns]]
column = "public.people.born"
transform = "date_shift"
max_days = 60

[[columns]]
column = "public.people.last_ip"
transform = "ip"

[[columns]]
column = "public.people.nickname"
transform = "sql"
expression = "'n-' || pg_catalog.md5(value)"

[[columns]]
column = "public.people.profile"
transform = "json"
paths = [
  { path = "address.street", transform = "address" },
  { path = "address.city", transform = "constant", value = "Springfield" },
]

[[columns]]
column = "public.accounts.iban"
transform = "partial"
keep_last = 4

[[columns]]
column = "public.orders.shipping_address"
transform = "address"

[[columns]]
column = "public.orders.total"
transform = "noise"
bound = 5

[[columns]]
column = "public.payments.card_number"
transform = "partial"
keep_last = 4

[[columns]]
column = "public.tickets.body"
transform = "redact"

[[references]]
from = "public.events(actor_email)"
to = "public.people(email)"
"#;

/// The source's values of `column` (`table.column`), as text.
fn values(dsn: &str, query: &str) -> BTreeSet<String> {
    sql(dsn, query).lines().map(str::to_owned).filter(|l| !l.is_empty()).collect()
}

/// Every file under `dir` that holds `needle`.
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
            if meta.is_dir() {
                stack.push(path);
            } else if meta.is_file() {
                let bytes = std::fs::read(&path).unwrap_or_default();
                if bytes.windows(needle.len()).any(|w| w == needle) {
                    found.push(path.display().to_string());
                }
            }
        }
    }
    found
}

/// `golden create NAME --from-url - ARGS... --json`, the source's DSN on stdin.
fn create(d: &Daemon, name: &str, source: &str, args: &[&str]) -> crate::harness::Out {
    let mut all = vec!["golden", "create", name, "--from-url", "-"];
    all.extend_from_slice(args);
    all.push("--json");
    d.cli_with(&all, Some(source))
}

fn write_rules(d: &Daemon, name: &str, text: &str) -> String {
    let path = d.home.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// A source server named `name` holding SOURCE's `shop` database, a daemon,
/// and the DSN of `shop` (the server stops when its handle goes).
fn shop_source(name: &str) -> (Production, Daemon, String) {
    let prod = Production::start(name);
    script(&prod.dsn("postgres"), SOURCE);
    let source = prod.dsn("shop");
    (prod, Daemon::start(&[]), source)
}

#[test]
fn a_scan_finds_every_sensitive_column_and_a_build_refuses_one_without_a_rule() {
    let (_prod, d, source) = shop_source("scan");
    let out = d.cli_with(&["golden", "scan", "--from-url", "-", "--json"], Some(&source));
    assert_eq!(out.code, 0, "{out:?}");
    let scan: Value = serde_json::from_str(&out.stdout).unwrap();
    let found: BTreeSet<&str> =
        scan["columns"].as_array().unwrap().iter().map(|c| c["column"].as_str().unwrap()).collect();
    for sensitive in [
        "public.people.email",
        "public.people.full_name",
        "public.people.phone",
        "public.people.ssn",
        "public.people.born",
        "public.people.last_ip",
        "public.people.profile",
        "public.accounts.owner_email",
        "public.accounts.iban",
        "public.orders.shipping_address",
        "public.payments.card_number",
        "public.tickets.body",
        "public.events.actor_email",
    ] {
        assert!(found.contains(sensitive), "the scan missed {sensitive}: {found:?}");
    }
    for plain in
        ["public.products.title", "public.events.kind", "public.people.tier", "public.orders.placed_at"]
    {
        assert!(!found.contains(plain), "{plain} holds nothing personal: {found:?}");
    }
    let profile =
        scan["columns"].as_array().unwrap().iter().find(|c| c["column"] == "public.people.profile").unwrap();
    let paths: Vec<&str> = profile["proposed"]["paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["path"].as_str().unwrap())
        .collect();
    assert!(paths.contains(&"address.street"), "{paths:?}");
    // The proposed rules file builds as it is (the scan's rules are rules).
    let proposed = write_rules(&d, "proposed.toml", scan["rules"].as_str().unwrap());
    let out = create(&d, "proposed", &source, &["--mask", &proposed]);
    assert_eq!(out.code, 0, "the proposed rules build: {out:?}");

    // Without a rule for the tickets' free text, the build refuses and names it.
    let missing = write_rules(
        &d,
        "missing.toml",
        &RULES.replace(
            "column = \"public.tickets.body\"\ntransform = \"redact\"",
            "column = \"public.products.title\"\ntransform = \"redact\"",
        ),
    );
    let out = create(&d, "leaky", &source, &["--mask", &missing]);
    assert_eq!(out.code, 18, "{out:?}");
    let err: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(err["error"]["code"], "mask_unmasked");
    assert!(err["error"]["message"].as_str().unwrap().contains("public.tickets.body"), "{err}");
    assert!(err["error"]["hint"].as_str().unwrap().contains("--allow-unmasked public.tickets.body"), "{err}");
    assert!(
        d.json(&["golden", "ls"]).as_array().unwrap().iter().all(|g| g["name"] != "leaky"),
        "nothing half-made"
    );
    let staging: Vec<_> =
        std::fs::read_dir(d.home.join("volume/staging")).map(|r| r.flatten().collect()).unwrap_or_default();
    assert!(staging.is_empty(), "the staging area is empty: {staging:?}");
    // Allowed on purpose, it builds; a typo in the allowance is refused.
    let out = create(&d, "leaky", &source, &["--mask", &missing, "--allow-unmasked", "public.tickets.bdy"]);
    assert_eq!(out.code, 18, "{out:?}");
    assert!(out.stdout.contains("names no column"), "{out:?}");
    // A rule that cannot hold a unique column's values apart is refused before anything is built.
    let bad = write_rules(&d, "bad.toml", &RULES.replace("transform = \"phone\"", "transform = \"redact\""));
    let out = create(&d, "bad", &source, &["--mask", &bad]);
    assert_eq!(out.code, 18, "{out:?}");
    assert!(out.stdout.contains("public.people.phone is in a unique key"), "{out:?}");
    let typo = write_rules(
        &d,
        "typo.toml",
        "[[columns]]\ncolumn = \"public.people.email\"\ntransform = \"shuffle\"\n",
    );
    let out = create(&d, "bad", &source, &["--mask", &typo]);
    assert_eq!(out.code, 18, "{out:?}");
    assert!(out.stdout.contains("not a transformer"), "{out:?}");
}

#[test]
fn a_masked_golden_holds_no_source_value_joins_as_its_source_and_masks_alike_each_build() {
    let (_prod, d, source) = shop_source("masked");
    let rules = write_rules(&d, "rules.toml", RULES);
    let out = create(&d, "masked", &source, &["--mask", &rules]);
    assert_eq!(out.code, 0, "{out:?}");
    let g: Value = serde_json::from_str(&out.stdout).unwrap();
    let m = &g["generations"][0];
    let report = &m["import"]["masking"];
    assert_eq!(report["passed"], true, "{report}");
    let because = |col: &str| {
        report["columns"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["column"] == col)
            .map(|c| c["because"].as_str().unwrap().to_owned())
    };
    assert_eq!(because("public.accounts.owner_email").as_deref(), Some("follows public.people.email"));
    assert_eq!(because("public.events.actor_email").as_deref(), Some("follows public.people.email"));
    assert!(report["columns"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["leaks"] == 0 && c["checked"] == "every value"));
    assert!(report["elsewhere"]["columns_searched"].as_u64().unwrap() > 10, "{report}");
    assert!(m["masking"]["leak_check_passed"] == true, "the manifest records it: {m}");
    let shown = d.ok(&["golden", "show", "masked"]);
    assert!(shown.contains("MASKED: ") && shown.contains("leak check PASSED"), "{shown}");

    let sb = d.fork("masked", &[]);
    let fork = dsn(&sb);
    // No source value of a masked column is in the fork's masked columns.
    for (query, what) in [
        ("SELECT email FROM people", "emails"),
        ("SELECT full_name FROM people", "names"),
        ("SELECT phone FROM people", "phones"),
        ("SELECT ssn FROM people", "ssns"),
        ("SELECT last_ip::text FROM people", "ips"),
        ("SELECT nickname FROM people", "nicknames"),
        ("SELECT owner_email FROM accounts", "account emails"),
        ("SELECT actor_email FROM events", "event emails"),
        ("SELECT shipping_address FROM orders", "addresses"),
        ("SELECT card_number FROM payments", "cards"),
        ("SELECT body FROM tickets", "ticket text"),
        ("SELECT profile->'address'->>'street' FROM people", "streets"),
    ] {
        let (raw, masked) = (values(&source, query), values(&fork, query));
        assert!(!masked.is_empty(), "{what} are there");
        let common: Vec<_> = raw.intersection(&masked).take(3).collect();
        assert!(common.is_empty(), "source {what} are in the fork: {common:?}");
    }
    // Row by row, noise and shifts moved every value, within their bounds.
    let pairs = |q: &str, db: &str| -> Vec<(String, String)> {
        sql(db, q)
            .lines()
            .map(|l| {
                let (a, b) = l.split_once('|').unwrap();
                (a.to_owned(), b.to_owned())
            })
            .collect()
    };
    let raw_totals = pairs("SELECT id, total FROM orders ORDER BY id", &source);
    let masked_totals = pairs("SELECT id, total FROM orders ORDER BY id", &fork);
    for ((i, a), (j, b)) in raw_totals.iter().zip(&masked_totals) {
        assert_eq!(i, j);
        let (a, b): (f64, f64) = (a.parse().unwrap(), b.parse().unwrap());
        assert!(a != b && (a - b).abs() <= 5.0, "order {i}: {a} -> {b}");
    }
    let raw_born: Vec<(String, String)> = pairs("SELECT id, born FROM people ORDER BY id", &source);
    let masked_born: Vec<(String, String)> = pairs("SELECT id, born FROM people ORDER BY id", &fork);
    assert_ne!(raw_born[0].1, masked_born[0].1, "dates moved");
    // Joins on masked keys find what the source's find, and constraints hold.
    for q in [
        "SELECT count(*) FROM accounts a JOIN people p ON p.email = a.owner_email",
        "SELECT count(*) FROM events e JOIN people p ON p.email = e.actor_email",
        "SELECT count(*) FROM people c JOIN people p ON p.id = c.referred_by",
        "SELECT count(*) FROM orders o JOIN accounts a ON a.primary_order = o.id",
        "SELECT count(DISTINCT phone) FROM people",
        "SELECT count(*) FROM people WHERE profile->'address'->>'city' = 'Springfield'",
        "SELECT count(*) FROM people WHERE (profile->>'newsletter')::boolean",
    ] {
        let expected = if q.contains("Springfield") {
            sql(&source, "SELECT count(*) FROM people")
        } else {
            sql(&source, q)
        };
        assert_eq!(sql(&fork, q), expected, "{q}");
    }
    assert_eq!(sql(&fork, "SELECT count(*) FROM payments WHERE card_number <> 'XXXX XXXX XXXX 1111'"), "0");
    assert_eq!(sql(&fork, "SELECT count(*) FROM tickets WHERE body <> '[redacted]'"), "0");
    assert_eq!(sql(&fork, "SELECT count(*) FROM people WHERE email NOT LIKE '%@example.%'"), "0");
    // The agent's writes meet the same constraints: masked keys still reference.
    assert!(crate::harness::psql(&fork, "INSERT INTO accounts (owner_email) VALUES ('nobody@nowhere.io')")
        .is_err());

    // An independent search of the fork's and the golden's files: no source
    // value of a masked column, in any data file, WAL segment or log.
    let needles: Vec<String> = vec![
        sql(&source, "SELECT email FROM people WHERE id = 3"),
        sql(&source, "SELECT email FROM people WHERE id = 1999"),
        sql(&source, "SELECT phone FROM people WHERE id = 42"),
        sql(&source, "SELECT ssn FROM people WHERE id = 42"),
        sql(&source, "SELECT full_name FROM people WHERE id = 42"),
        "4111 1111 1111 1111".into(),
        "GB82 WEST 1234 5698 7654 32".into(),
        "Harbour Street".into(),
        "Mill Lane".into(),
        "example-corp.com".into(),
    ];
    let sandbox_dir = d.home.join("volume/sandboxes").join(sb["id"].as_str().unwrap());
    let roots = [
        sandbox_dir,
        d.home.join("volume/goldens"),
        d.home.join("volume/imports"),
        d.home.join("daemon.log"),
    ];
    for needle in &needles {
        for root in &roots {
            let holding = if root.is_file() {
                if std::fs::read(root).unwrap().windows(needle.len()).any(|w| w == needle.as_bytes()) {
                    vec![root.display().to_string()]
                } else {
                    vec![]
                }
            } else {
                files_holding(root, needle.as_bytes())
            };
            assert!(holding.is_empty(), "source value {needle:?} is in {holding:?}");
        }
    }
    let wal = std::fs::read_dir(d.home.join("volume/goldens/masked/1/pgdata/pg_wal"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().len() == 24)
        .count();
    assert_eq!(wal, 1, "the golden's write-ahead log was emptied");

    // The same rules with the same key mask alike (a refresh); another
    // golden has a key of its own, and masks otherwise.
    let first = sql(&fork, "SELECT email || phone || full_name FROM people WHERE id = 7");
    d.ok(&["golden", "refresh", "masked"]);
    let again = d.fork("masked", &[]);
    assert_eq!(sql(&dsn(&again), "SELECT email || phone || full_name FROM people WHERE id = 7"), first);
    let out = create(&d, "masked2", &source, &["--mask", &rules]);
    assert_eq!(out.code, 0, "{out:?}");
    let other = d.fork("masked2", &[]);
    let theirs = sql(&dsn(&other), "SELECT email FROM people WHERE id = 7");
    assert_ne!(theirs, sql(&fork, "SELECT email FROM people WHERE id = 7"));
    // A promotion of a fork keeps the record of how its data was masked.
    let promoted = d.json(&["promote", sb["id"].as_str().unwrap(), "--golden", "from-fork"]);
    let record = &promoted["generations"][0]["masking"];
    assert_eq!(record["leak_check_passed"], true, "{promoted}");
    assert!(record["inherited_from"].as_str().unwrap().starts_with("masked"), "{record}");
}

#[test]
fn a_subset_follows_references_both_ways_and_every_reference_holds() {
    let (_prod, d, source) = shop_source("subset");
    // The rules file adds the reference the schema does not declare.
    let refs = write_rules(
        &d,
        "refs.toml",
        "[[references]]\nfrom = \"public.events(actor_email)\"\nto = \"public.people(email)\"\n",
    );
    let out = create(
        &d,
        "slice",
        &source,
        &["--mask", &refs, "--subset", "public.people: id > 100", "--subset-percent", "2"],
    );
    assert_eq!(out.code, 0, "{out:?}");
    let g: Value = serde_json::from_str(&out.stdout).unwrap();
    let report = &g["generations"][0]["import"]["subset"];
    assert!(report["references_checked"].as_u64().unwrap() >= 7, "{report}");
    let sb = d.fork("slice", &[]);
    let fork = dsn(&sb);
    let table = |name: &str| {
        report["tables"].as_array().unwrap().iter().find(|t| t["table"] == name).unwrap().clone()
    };
    for name in [
        "public.people",
        "public.accounts",
        "public.orders",
        "public.payments",
        "public.tickets",
        "public.events",
        "public.products",
    ] {
        let t = table(name);
        let short = name.trim_start_matches("public.");
        assert_eq!(
            t["kept_rows"].as_i64().unwrap().to_string(),
            sql(&fork, &format!("SELECT count(*) FROM {short}")),
            "{t}"
        );
        assert_eq!(
            t["source_rows"].as_i64().unwrap().to_string(),
            sql(&source, &format!("SELECT count(*) FROM {short}")),
            "{t}"
        );
        assert!(!t["why"].as_str().unwrap().is_empty());
    }
    let people: i64 = sql(&fork, "SELECT count(*) FROM people").parse().unwrap();
    assert!(people > 0 && people < 2000, "a slice: {people} people");
    assert_eq!(table("public.products")["why"], "whole: no reference connects it to the subset");
    // Children of the chosen people came whole. The chosen ones, worked out
    // again here on the source (the same hash of the row picks the same 2%),
    // and their children by referred_by, to the end: each one's tickets,
    // accounts and events are all in the fork.
    let chosen = sql(
        &source,
        "WITH RECURSIVE down AS (
           SELECT id, email FROM people x WHERE id > 100 AND abs(hashtextextended(x::text, 0) % 1000000) < 20000
           UNION SELECT p.id, p.email FROM people p JOIN down d ON p.referred_by = d.id)
         SELECT string_agg(id::text, ',') FROM down",
    );
    assert!(!chosen.is_empty(), "2% of 1900 people were chosen");
    for child in [
        format!("SELECT count(*) FROM tickets WHERE person_id IN ({chosen})"),
        format!("SELECT count(*) FROM accounts WHERE owner_email IN (SELECT email FROM people WHERE id IN ({chosen}))"),
        format!("SELECT count(*) FROM events WHERE actor_email IN (SELECT email FROM people WHERE id IN ({chosen}))"),
        format!("SELECT count(*) FROM people WHERE id IN ({chosen})"),
    ] {
        assert_eq!(sql(&fork, &child), sql(&source, &child), "{child}");
    }
    let ids = sql(&fork, "SELECT string_agg(id::text, ',' ORDER BY id) FROM people");
    for orphan in [
        "SELECT count(*) FROM people c WHERE referred_by IS NOT NULL AND NOT EXISTS (SELECT 1 FROM people p WHERE p.id = c.referred_by)",
        "SELECT count(*) FROM accounts a WHERE NOT EXISTS (SELECT 1 FROM people p WHERE p.email = a.owner_email)",
        "SELECT count(*) FROM accounts a WHERE primary_order IS NOT NULL AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = a.primary_order)",
        "SELECT count(*) FROM orders o WHERE NOT EXISTS (SELECT 1 FROM accounts a WHERE a.id = o.account_id)",
        "SELECT count(*) FROM payments y WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = y.order_id)",
        "SELECT count(*) FROM events e WHERE NOT EXISTS (SELECT 1 FROM people p WHERE p.email = e.actor_email)",
    ] {
        assert_eq!(sql(&fork, orphan), "0", "{orphan}");
    }
    // Referrers of kept people came along as parents; the chosen ones' referred came as children.
    assert!(
        sql(&fork, "SELECT count(*) FROM people WHERE id <= 100").parse::<i64>().unwrap() > 0,
        "parents by referred_by"
    );
    // Sequences continue past the highest id kept.
    let next: i64 = sql(&fork, "SELECT nextval('people_id_seq')").parse().unwrap();
    let max: i64 = sql(&fork, "SELECT max(id) FROM people").parse().unwrap();
    assert!(next > max);
    // The same subset every build of the same data.
    let out = create(
        &d,
        "slice2",
        &source,
        &["--mask", &refs, "--subset", "public.people: id > 100", "--subset-percent", "2"],
    );
    assert_eq!(out.code, 0, "{out:?}");
    let other = d.fork("slice2", &[]);
    assert_eq!(sql(&dsn(&other), "SELECT string_agg(id::text, ',' ORDER BY id) FROM people"), ids);
    // A subset of a table the source lacks is refused, and so is a percent alone.
    let out = create(&d, "x", &source, &["--subset", "public.nope"]);
    assert_eq!(out.code, 18, "{out:?}");
    assert!(out.stdout.contains("public.nope"), "{out:?}");
}

#[test]
fn a_masked_redis_part_holds_masked_values_only_and_a_left_copy_fails_the_build() {
    let (_prod, d, source) = shop_source("redis");
    let redis_rules =
        "\n[[redis]]\npattern = \"user:*\"\nfields = [\"email\", \"name\"]\ntransform = \"email\"\n\n\
                       [[redis]]\npattern = \"session:*\"\ntransform = \"email\"\n";
    let rules = write_rules(&d, "rules.toml", &format!("{RULES}{redis_rules}"));
    let seed = |extra: &str| {
        let path = d.home.join("cache.redis");
        std::fs::write(
            &path,
            format!(
                "HSET user:1 email jane.doe@corp.io name \"Jane Doe\" plan gold\nHSET user:2 email bob@corp.io plan free\n\
                 SET session:abc jane.doe@corp.io\nSET session:def bob@corp.io\nSELECT 1\nSET session:xyz carol@corp.io\n{extra}"
            ),
        )
        .unwrap();
        path.display().to_string()
    };
    // A copy of a masked value under a key no rule reaches fails the build.
    for copy in [
        "SET copy-of-email jane.doe@corp.io",
        "SET seen:JANE.DOE@CORP.IO 1",
        "LPUSH recent x jane.doe@corp.io",
        "SET cache:1 \"{'e': 'jane.doe@corp.io'}\"",
    ] {
        let leaky = seed(&format!("{copy}\n"));
        let out = create(&d, "cache", &source, &["--mask", &rules, "--redis-seed", &leaky]);
        assert_eq!(out.code, 18, "{copy}: {out:?}");
        assert!(out.stdout.contains("mask_leak") && !out.stdout.contains("jane.doe"), "{out:?}");
    }
    let leaky = seed("SET copy-of-email jane.doe@corp.io\n");
    let out = create(&d, "cache", &source, &["--mask", &rules, "--redis-seed", &leaky]);
    assert_eq!(out.code, 18, "{out:?}");
    assert!(out.stdout.contains("mask_leak") && !out.stdout.contains("jane.doe"), "{out:?}");
    let clean = seed("");
    let out = create(&d, "cache", &source, &["--mask", &rules, "--redis-seed", &clean]);
    assert_eq!(out.code, 0, "{out:?}");
    let g: Value = serde_json::from_str(&out.stdout).unwrap();
    let lines = g["generations"][0]["masking"]["redis"].as_array().unwrap().clone();
    assert!(
        lines.iter().any(|l| l.as_str().unwrap().starts_with("user:* [email, name]: email: 3 values")),
        "{lines:?}"
    );
    let sb = d.fork("cache", &[]);
    let url = sb["redis_socket_url"].as_str().unwrap();
    let session = crate::redis::redis(url, &["GET", "session:abc"]);
    assert!(session.contains("@example.") && session != "jane.doe@corp.io", "{session}");
    assert_eq!(
        crate::redis::redis(url, &["HGET", "user:1", "email"]),
        session,
        "the same value masks alike in every key"
    );
    assert_eq!(crate::redis::redis(url, &["HGET", "user:1", "plan"]), "gold", "other fields are kept");
    assert!(!crate::redis::redis(url, &["HGET", "user:1", "name"]).contains("Jane"));
    let other_db = crate::redis::redis(url, &["-n", "1", "GET", "session:xyz"]);
    assert!(other_db.contains("@example.") && !other_db.contains("carol"), "{other_db}");
}

#[test]
fn copies_inside_arrays_search_vectors_bytes_and_rare_notes_fail_the_build_and_errors_quote_no_row() {
    let prod = Production::start("copies");
    script(
        &prod.dsn("postgres"),
        r#"
CREATE DATABASE copies;
\c copies
CREATE TABLE people (id serial PRIMARY KEY, email text NOT NULL UNIQUE, phone text);
INSERT INTO people (email, phone) SELECT 'secret' || g || '@realcorp-mail.com', '+44 20 ' || (7946000 + g) FROM generate_series(1, 500) g;
CREATE TABLE notes (id serial PRIMARY KEY, body text);
INSERT INTO notes (body) SELECT 'nothing to see here' FROM generate_series(1, 5000);
INSERT INTO notes (body) VALUES ('please write back to secret77@realcorp-mail.com today');
"#,
    );
    let d = Daemon::start(&[]);
    let rules = write_rules(
        &d,
        "rules.toml",
        "[[columns]]\ncolumn = \"public.people.email\"\ntransform = \"email\"\n\
         [[columns]]\ncolumn = \"public.people.phone\"\ntransform = \"phone\"\n",
    );
    let build = |db: &str, name: &str, rules: &str| create(&d, name, &prod.dsn(db), &["--mask", rules]);
    // One note in five thousand quotes an email: the scan's sample misses it,
    // the leak check, which reads every row, does not.
    let out = build("copies", "rare", &rules);
    assert_eq!(out.code, 18, "{out:?}");
    assert!(out.stdout.contains("mask_leak") && out.stdout.contains("public.notes.body: 1 rows"), "{out:?}");
    assert!(!out.stdout.contains("realcorp"), "the error names the column, never the value: {out:?}");
    // Copies in an array, a search vector, bytes and XML fail it too.
    for (column, fill) in [
        ("alt_emails text[]", "ARRAY[email, 'x']"),
        ("search_doc tsvector", "to_tsvector('simple', email)"),
        ("payload bytea", "convert_to(email, 'UTF8')"),
        ("doc xml", "xmlelement(name contact, email)"),
        ("link text", "'https://app.example/reset?email=' || replace(email, '@', '%40')"),
        ("shout text", "upper(email)"),
        ("escaped json", "('{\"e\": \"' || replace(email, '@', '\\u0040') || '\"}')::json"),
    ] {
        let name = column.split(' ').next().unwrap();
        script(
            &prod.dsn("copies"),
            &format!(
                "DELETE FROM notes WHERE body LIKE '%realcorp%'; DROP TABLE IF EXISTS copy; \
                 CREATE TABLE copy AS SELECT id, {fill} AS {name} FROM people; ALTER TABLE copy ALTER {name} TYPE {}",
                column.split_once(' ').unwrap().1
            ),
        );
        // Left unmasked on purpose (where the scan would refuse it), the leak check is what stops it.
        let allowed = format!("public.copy.{name}");
        let out =
            create(&d, "copied", &prod.dsn("copies"), &["--mask", &rules, "--allow-unmasked", &allowed]);
        assert_eq!(out.code, 18, "{column}: {out:?}");
        assert!(out.stdout.contains(&format!("public.copy.{name}: 500 rows")), "{column}: {out:?}");
    }
    // A large object holding one fails it too.
    script(&prod.dsn("copies"), "DROP TABLE copy; SELECT lo_from_bytea(0, convert_to('note: ' || email, 'UTF8')) FROM people WHERE id = 9");
    let out = build("copies", "copied", &rules);
    assert_eq!(out.code, 18, "{out:?}");
    assert!(out.stdout.contains("large object"), "{out:?}");
    script(&prod.dsn("copies"), "SELECT lo_unlink(oid) FROM pg_largeobject_metadata");
    // A masked build's errors quote no row: a data error in an sql rule, and
    // a failed restore (a check whose function raises with the value).
    let sql_rule = write_rules(
        &d,
        "sql.toml",
        "[[columns]]\ncolumn = \"public.people.email\"\ntransform = \"email\"\n\
         [[columns]]\ncolumn = \"public.people.phone\"\ntransform = \"sql\"\n\
         expression = \"(pg_catalog.regexp_replace(value, '[^0-9]', '', 'g'))::int::text\"\n",
    );
    let out = build("copies", "sqlerr", &sql_rule);
    assert_eq!(out.code, 18, "{out:?}");
    assert!(out.stdout.contains("out of range") && !out.stdout.contains("4420794"), "{out:?}");
    script(
        &prod.dsn("postgres"),
        r#"
CREATE DATABASE badcheck;
\c badcheck
CREATE FUNCTION email_ok(t text) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN
  IF current_database() <> 'badcheck' THEN RAISE EXCEPTION 'email % rejected outside production', t; END IF;
  RETURN true; END $$;
CREATE TABLE people (id serial PRIMARY KEY, email text NOT NULL UNIQUE CHECK (public.email_ok(email)), phone text);
INSERT INTO people (email, phone) VALUES ('secret1@realcorp-mail.com', '+44 20 7946001');
"#,
    );
    let out = build("badcheck", "badcheck", &rules);
    assert_ne!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("people"), "the error names the table: {out:?}");
    assert!(!out.stdout.contains("realcorp") && !out.stdout.contains("7946001"), "{out:?}");
    assert!(!d.log().contains("realcorp"), "nor does the daemon's log");
}

#[test]
fn a_cast_the_dump_defines_never_runs_as_a_superuser_while_masking_reads_values() {
    // The dump defines a cast of its own type to text: the scan and the leak
    // check cast every value to text, and the cast counts its calls and
    // fails the build if it ever runs as a superuser.
    let prod = Production::start("casts");
    script(
        &prod.dsn("postgres"),
        r#"
CREATE DATABASE casts;
\c casts
CREATE SEQUENCE cast_calls;
CREATE TYPE mood AS ENUM ('calm', 'cross');
CREATE FUNCTION mood_text(m mood) RETURNS text LANGUAGE plpgsql AS $$ BEGIN
  PERFORM pg_catalog.nextval('public.cast_calls');
  IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
    RAISE EXCEPTION 'the dump''s cast ran as a superuser';
  END IF;
  RETURN m::varchar; END $$;
CREATE CAST (mood AS text) WITH FUNCTION mood_text(mood);
CREATE TABLE people (id serial PRIMARY KEY, email text NOT NULL UNIQUE, mood mood);
INSERT INTO people (email, mood) SELECT 'secret' || g || '@realcorp-mail.com', 'calm' FROM generate_series(1, 50) g;
CREATE TABLE events (id serial PRIMARY KEY, actor text, mood mood);
INSERT INTO events (actor, mood) SELECT email, mood FROM people;
"#,
    );
    let d = Daemon::start(&[]);
    let rules = write_rules(
        &d,
        "rules.toml",
        "[[columns]]\ncolumn = \"public.people.email\"\ntransform = \"email\"\n\
         [[references]]\nfrom = \"public.events(actor)\"\nto = \"public.people(email)\"\n",
    );
    let out = create(&d, "casts", &prod.dsn("casts"), &["--mask", &rules]);
    assert_eq!(out.code, 0, "{out:?}");
    let fork = dsn(&d.fork("casts", &[]));
    let calls: i64 = sql(&fork, "SELECT last_value FROM cast_calls WHERE is_called").parse().unwrap_or(0);
    assert!(
        calls > 1,
        "the build cast the dump's type to text with the dump's cast ({calls} calls), as the owner role"
    );
}
