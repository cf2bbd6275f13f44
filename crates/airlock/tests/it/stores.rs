//! A third kind of store beside PostgreSQL and Redis: a directory of files a
//! golden generation carries (`files/`). The lifecycle knows no kind by name,
//! so this kind is forked, branched, suspended, woken, reset and deleted with
//! its sandbox through the same interface as the others; this test proves
//! each step does it.

use crate::harness::*;
use serde_json::Value;

/// Runs `script` in sandbox `id` and insists it succeeds; its stdout.
fn run(d: &Daemon, id: &str, script: &str) -> String {
    let out: Value = d.exec(id, script, "30s");
    assert_eq!(out["exit_code"], 0, "{script}: {out}\nlog:\n{}", d.log());
    out["stdout"].as_str().unwrap().to_owned()
}

#[test]
fn a_directory_of_files_is_a_store_forked_branched_suspended_reset_and_deleted_with_its_sandbox() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    // The golden's files part, laid down as a builder of that kind would.
    let part = d.home.join("volume/goldens/shop/1/files");
    std::fs::create_dir_all(part.join("notes")).unwrap();
    std::fs::write(part.join("notes/readme.txt"), "from the golden\n").unwrap();

    // A fork holds its own copy, which its code reads and writes.
    let a = d.fork("shop", &[]);
    let id = a["id"].as_str().unwrap().to_owned();
    let seen =
        run(&d, &id, r#"cat "$AIRLOCK_FILES/notes/readme.txt"; echo agent > "$AIRLOCK_FILES/written.txt""#);
    assert_eq!(seen, "from the golden\n");
    assert!(!part.join("written.txt").exists(), "a fork's write reached its golden");
    // Beside its PostgreSQL, which works as it did.
    assert_eq!(sql(&dsn(&a), "SELECT count(*) FROM orders"), "1000");

    // A branch holds the source's files at the instant it was made, as its own.
    let b = d.json(&["branch", &id]);
    let bid = b["id"].as_str().unwrap().to_owned();
    assert_eq!(run(&d, &bid, r#"cat "$AIRLOCK_FILES/written.txt""#), "agent\n");
    run(&d, &bid, r#"echo branch > "$AIRLOCK_FILES/written.txt""#);
    assert_eq!(
        run(&d, &id, r#"cat "$AIRLOCK_FILES/written.txt""#),
        "agent\n",
        "a branch's write reached its source"
    );

    // Suspended and woken (exec wakes it), its files are as it left them.
    d.ok(&["suspend", &id]);
    assert_eq!(d.json(&["show", &id])["state"], "suspended");
    assert_eq!(run(&d, &id, r#"cat "$AIRLOCK_FILES/written.txt""#), "agent\n");
    assert_eq!(d.json(&["show", &id])["state"], "running");

    // A reset gives back the golden's files and nothing the agent wrote.
    d.ok(&["reset", &id]);
    let listed = run(&d, &id, r#"cd "$AIRLOCK_FILES" && find . -type f | sort"#);
    assert_eq!(listed, "./notes/readme.txt\n");
    assert_eq!(run(&d, &bid, r#"cat "$AIRLOCK_FILES/written.txt""#), "branch\n", "a reset reached a branch");

    // Deleted, its files go with it; the branch keeps its own.
    d.ok(&["rm", &id]);
    assert!(!d.sandbox_dirs().contains(&id), "{:?}", d.sandbox_dirs());
    assert_eq!(run(&d, &bid, r#"cat "$AIRLOCK_FILES/written.txt""#), "branch\n");
    d.ok(&["rm", &bid]);
    assert!(d.sandbox_dirs().is_empty(), "{:?}", d.sandbox_dirs());
    assert_eq!(std::fs::read_to_string(part.join("notes/readme.txt")).unwrap(), "from the golden\n");
}
