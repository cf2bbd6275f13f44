//! The audit log: every lifecycle step, credential, connection and tool call is
//! on record with its door and no secret; `audit verify` names every kind of
//! tampering; a fork is refused when its record cannot be written while a
//! teardown goes on and its record follows a gap record; crashes and a daemon
//! down past a TTL leave a complete chain.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::harness::{dsn, psql, split_password, sql, Daemon, BIN};

/// The records `audit ls` shows for the whole log.
fn records(d: &Daemon) -> Vec<Value> {
    d.json(&["audit", "ls", "--limit", "100000"]).as_array().unwrap().clone()
}

fn of_sandbox<'a>(all: &'a [Value], id: &str) -> Vec<&'a Value> {
    all.iter().filter(|r| r["sandbox"] == id).collect()
}

fn kinds(records: &[&Value]) -> Vec<String> {
    records.iter().map(|r| r["kind"].as_str().unwrap().to_owned()).collect()
}

/// `audit verify --json` on the log under `home`; its exit code and report.
fn verify(home: &Path, extra: &[&str]) -> (i32, Value) {
    let out = Command::new(BIN)
        .args(["audit", "verify", "--json"])
        .args(extra)
        .env("AIRLOCK_HOME", home)
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    (out.status.code().unwrap_or(-1), report)
}

/// Everything under `dir`, as text (to look for secrets).
fn all_text(dir: &Path) -> String {
    let mut text = String::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        if entry.file_type().unwrap().is_file() {
            text += &String::from_utf8_lossy(&std::fs::read(entry.path()).unwrap());
        }
    }
    text
}

fn fingerprint(secret: &str) -> String {
    airlock_core::secret::fingerprint(secret)
}

#[test]
fn every_lifecycle_step_is_on_record_with_its_door_and_never_a_secret() {
    let d = Daemon::start(&["--audit-checkpoint-every", "3"]);
    d.shop("shop");
    let sb = d.fork("shop", &["--name", "task"]);
    let id = sb["id"].as_str().unwrap().to_owned();
    let (_, password) = split_password(&dsn(&sb));
    assert!(!password.is_empty());
    // A client through the router, one with a wrong password, a tool call.
    assert_eq!(sql(&dsn(&sb), "SELECT count(*) FROM orders"), "1000");
    let wrong = dsn(&sb).replace(&password, &"0".repeat(password.len()));
    assert!(psql(&wrong, "SELECT 1").is_err());
    let tool =
        d.api("POST", &format!("/v1/sandboxes/{id}/sql"), r#"{"sql": "DELETE FROM orders WHERE id < 10"}"#);
    assert_eq!(tool.0, 200, "{tool:?}");
    d.ok(&["dsn", &id]);
    d.ok(&["extend", &id, "--ttl", "30m"]);
    d.ok(&["suspend", &id]);
    d.ok(&["wake", &id]);
    d.ok(&["reset", &id]);
    d.exec(&id, "true", "10s");
    let branch = d.ok(&["branch", &id]);
    assert!(branch.contains("postgresql://"));
    d.ok(&["promote", &id, "--golden", "shop2"]);
    d.ok(&["golden", "refresh", "shop"]);
    d.ok(&["rm", &id]);
    let short = d.fork("shop", &["--ttl", "1s"]);
    let short_id = short["id"].as_str().unwrap().to_owned();
    d.wait_for(Duration::from_secs(20), "the short-lived sandbox to expire", || !d.ids().contains(&short_id));
    d.ok(&["golden", "rm", "shop2", "--force"]);

    let all = records(&d);
    let mine = of_sandbox(&all, &id);
    let seen = kinds(&mine);
    for kind in [
        "created",
        "ready",
        "credential_issued",
        "connected",
        "connection_refused",
        "tool_call",
        "extended",
        "suspended",
        "woken",
        "reset",
        "deleted",
    ] {
        assert!(seen.iter().any(|k| k == kind), "no {kind} record for {id}: {seen:?}");
    }
    // Each names its door, golden and generation (a promote names the golden it made).
    for r in &mine {
        let golden = if r["kind"] == "golden_promoted" { "shop2" } else { "shop" };
        assert_eq!(r["golden"], golden, "{r}");
        assert!(r["generation"].as_i64().is_some(), "{r}");
    }
    let door_of =
        |kind: &str| mine.iter().find(|r| r["kind"] == kind).unwrap()["door"].as_str().unwrap().to_owned();
    assert_eq!(door_of("created"), "api");
    assert_eq!(door_of("connected"), "router");
    assert_eq!(door_of("connection_refused"), "router");
    assert_eq!(door_of("tool_call"), "api");
    // Credentials: where each went, by fingerprint.
    let issued: Vec<&&Value> = mine.iter().filter(|r| r["kind"] == "credential_issued").collect();
    let to: Vec<&str> = issued.iter().map(|r| r["detail"]["to"].as_str().unwrap()).collect();
    for expected in ["api:fork", "api:show", "exec"] {
        assert!(to.contains(&expected), "no credential record to {expected}: {to:?}");
    }
    assert!(issued.iter().all(|r| r["detail"]["fingerprint"] == fingerprint(&password)), "{issued:?}");
    // The statement the tool ran, as events keep it.
    let call = mine.iter().find(|r| r["kind"] == "tool_call").unwrap();
    assert!(call["detail"].to_string().contains("DELETE FROM orders"), "{call}");
    let deleted = mine.iter().find(|r| r["kind"] == "deleted").unwrap();
    assert_eq!(deleted["reason"], "user");
    // Goldens, branch and the TTL reap.
    let all_kinds: Vec<&str> = all.iter().map(|r| r["kind"].as_str().unwrap()).collect();
    for kind in ["golden_created", "golden_promoted", "golden_refreshed", "golden_deleted"] {
        assert!(all_kinds.contains(&kind), "no {kind}: {all_kinds:?}");
    }
    assert!(
        all.iter().any(|r| r["kind"] == "created" && r["detail"]["branched_from"] == id.as_str()),
        "no record of the branch"
    );
    let reaped = of_sandbox(&all, &short_id);
    let gone = reaped.iter().find(|r| r["kind"] == "deleted").expect("the expired sandbox's deletion");
    assert_eq!(gone["reason"], "ttl");
    assert_eq!(gone["door"], "reaper");
    // Sequence numbers run without a gap, and each record carries the one before.
    for (i, r) in all.iter().enumerate() {
        assert_eq!(r["seq"], i as u64 + 1);
        if i > 0 {
            assert_eq!(r["prev"], all[i - 1]["hash"]);
        }
    }
    // No secret anywhere in the log, the checkpoints or the key's public half.
    let text = all_text(&d.home.join("audit"));
    assert!(!text.contains(&password), "the password is in the audit log");
    let (code, report) = verify(&d.home, &[]);
    assert_eq!(code, 0, "{report}");
    assert!(report["checkpoints"].as_u64().unwrap() >= 3, "{report}");
    // Filters: one sandbox, a time span, a kind.
    let filtered = d.json(&["audit", "ls", "--sandbox", &id, "--since", "1h"]);
    assert_eq!(filtered.as_array().unwrap().len(), mine.len());
    let creds = d.json(&["audit", "ls", "--kind", "credential_issued", "--since", "1h"]);
    assert!(creds.as_array().unwrap().iter().all(|r| r["kind"] == "credential_issued"));
    assert!(d
        .json(&["audit", "ls", "--since", "1ms", "--kind", "golden_created"])
        .as_array()
        .unwrap()
        .is_empty());
    // The export is JSON lines, each with its hash, the same chain.
    let export = d.ok(&["audit", "export"]);
    let lines: Vec<Value> = export.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), all.len());
    assert_eq!(lines.last().unwrap()["hash"], all.last().unwrap()["hash"]);
    let since = d.ok(&["audit", "export", "--after", &(all.len() - 2).to_string()]);
    assert_eq!(since.lines().count(), 2);
    // A checkpoint asked for now covers the head; verify takes its hash as an anchor.
    let checkpoint = d.json(&["audit", "checkpoint"]);
    let head = records(&d).last().unwrap().clone();
    assert_eq!(checkpoint["seq"], head["seq"]);
    assert_eq!(checkpoint["hash"], head["hash"]);
    let (code, report) = verify(&d.home, &["--anchor", checkpoint["hash"].as_str().unwrap()]);
    assert_eq!((code, report["anchor_found"].clone()), (0, Value::Bool(true)), "{report}");
}

/// A data root holding a copy of `source`'s audit log, to tamper with.
fn copy_of(source: &Path, name: &str) -> PathBuf {
    let home = source.join("tampered").join(name);
    let dir = home.join("audit");
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(source.join("audit")).unwrap().flatten() {
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
        }
    }
    home
}

fn segment(home: &Path) -> PathBuf {
    home.join("audit").join("segment-00000001.jsonl")
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap().lines().map(str::to_owned).collect()
}

fn write_lines(path: &Path, lines: &[String]) {
    std::fs::write(path, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
}

/// The first problem `verify` reports, which must exist.
fn first_problem(home: &Path, extra: &[&str]) -> Value {
    let (code, report) = verify(home, extra);
    assert_eq!(code, 15, "tampering went unseen: {report}");
    assert_eq!(report["ok"], false);
    report["problems"][0].clone()
}

#[test]
fn verify_names_each_kind_of_tampering() {
    let mut d = Daemon::start(&["--audit-checkpoint-every", "4"]);
    d.shop("shop");
    for _ in 0..4 {
        let sb = d.fork("shop", &[]);
        d.ok(&["rm", sb["id"].as_str().unwrap()]);
    }
    let anchor = d.json(&["audit", "checkpoint"]);
    d.kill9();
    let original = lines(&segment(&d.home));
    assert!(original.len() >= 14, "{}", original.len());
    let (code, report) = verify(&d.home, &[]);
    assert_eq!(code, 0, "{report}");

    // One byte changed: the record that holds it, by line and number.
    let home = copy_of(&d.home, "edited");
    let mut edited = original.clone();
    assert!(edited[4].contains("\"door\":\"api\""));
    edited[4] = edited[4].replacen("\"door\":\"api\"", "\"door\":\"apj\"", 1);
    write_lines(&segment(&home), &edited);
    let p = first_problem(&home, &[]);
    assert_eq!((p["line"].as_u64(), p["seq"].as_u64()), (Some(5), Some(5)), "{p}");
    assert!(p["what"].as_str().unwrap().contains("altered"), "{p}");

    // One record removed.
    let home = copy_of(&d.home, "deleted");
    let mut removed = original.clone();
    removed.remove(5);
    write_lines(&segment(&home), &removed);
    let p = first_problem(&home, &[]);
    assert_eq!((p["line"].as_u64(), p["seq"].as_u64()), (Some(6), Some(7)), "{p}");
    assert!(p["what"].as_str().unwrap().contains("removed"), "{p}");

    // Two records swapped.
    let home = copy_of(&d.home, "swapped");
    let mut swapped = original.clone();
    swapped.swap(2, 3);
    write_lines(&segment(&home), &swapped);
    let p = first_problem(&home, &[]);
    assert_eq!(p["line"].as_u64(), Some(3), "{p}");

    // A record inserted (a copy of another).
    let home = copy_of(&d.home, "inserted");
    let mut inserted = original.clone();
    inserted.insert(7, original[1].clone());
    write_lines(&segment(&home), &inserted);
    let p = first_problem(&home, &[]);
    assert_eq!(p["line"].as_u64(), Some(8), "{p}");

    // The tail cut off: the last checkpoint covers a record that is gone.
    let home = copy_of(&d.home, "truncated");
    write_lines(&segment(&home), &original[..original.len() - 3]);
    let p = first_problem(&home, &[]);
    assert!(p["what"].as_str().unwrap().contains("were removed"), "{p}");
    assert!(p["seq"].as_u64().unwrap() > original.len() as u64 - 3, "{p}");

    // The tail and the checkpoints covering it cut together: only an anchor
    // kept off the host catches it.
    let home = copy_of(&d.home, "truncated-with-checkpoints");
    let keep = original.len() - 3;
    write_lines(&segment(&home), &original[..keep]);
    let checkpoints = home.join("audit/checkpoints.jsonl");
    let kept: Vec<String> = lines(&checkpoints)
        .into_iter()
        .filter(|l| serde_json::from_str::<Value>(l).unwrap()["seq"].as_u64().unwrap() <= keep as u64)
        .collect();
    write_lines(&checkpoints, &kept);
    assert_eq!(verify(&home, &[]).0, 0, "without an anchor this cut is self-consistent");
    let p = first_problem(&home, &["--anchor", anchor["hash"].as_str().unwrap()]);
    assert!(p["what"].as_str().unwrap().contains("anchor"), "{p}");

    // The whole segment rewritten into a chain consistent with itself, with a
    // key of the forger's own: the MACs do not verify, and the checkpoints'
    // signed hashes no longer match.
    let rewrite = |from: usize, lines: &[String]| -> Vec<String> {
        let forger = airlock_state::audit::record::MacKey([9; 32]);
        let mut prev = airlock_state::audit::record::GENESIS.to_owned();
        let mut out = Vec::new();
        for (i, line) in lines.iter().enumerate() {
            let sealed = airlock_state::audit::record::open(line).unwrap();
            if i < from {
                out.push(line.clone());
                prev = sealed.hash;
                continue;
            }
            let mut record = sealed.record;
            if i == from {
                record.detail = serde_json::json!({"forged": true});
            }
            record.prev = prev.clone();
            let (text, hash) = record.seal(&forger);
            out.push(text.trim_end().to_owned());
            prev = hash;
        }
        out
    };
    let home = copy_of(&d.home, "rewritten");
    write_lines(&segment(&home), &rewrite(1, &original));
    let p = first_problem(&home, &[]);
    assert_eq!(p["seq"].as_u64(), Some(2), "{p}");
    assert!(p["what"].as_str().unwrap().contains("rewritten"), "{p}");
    let (_, report) = verify(&home, &[]);
    let problems = report["problems"].to_string();
    assert!(problems.contains("the checkpoint signed at"), "the checkpoints see it too: {problems}");

    // Rewritten from record 10 on, with the checkpoints from there removed:
    // the MACs still show it.
    let home = copy_of(&d.home, "rewritten-checkpoints-cut");
    write_lines(&segment(&home), &rewrite(9, &original));
    let kept: Vec<String> = lines(&checkpoints_of(&home))
        .into_iter()
        .filter(|l| serde_json::from_str::<Value>(l).unwrap()["seq"].as_u64().unwrap() < 10)
        .collect();
    write_lines(&checkpoints_of(&home), &kept);
    let p = first_problem(&home, &[]);
    assert_eq!(p["seq"].as_u64(), Some(10), "{p}");

    // A record appended by someone without the key (a valid hash, chained on).
    let home = copy_of(&d.home, "appended");
    let last = airlock_state::audit::record::open(original.last().unwrap()).unwrap();
    let mut fake = last.record.clone();
    fake.seq += 1;
    fake.prev = last.hash.clone();
    fake.kind = "deleted".into();
    let (text, _) = fake.seal(&airlock_state::audit::record::MacKey([9; 32]));
    let mut appended = original.clone();
    appended.push(text.trim_end().to_owned());
    write_lines(&segment(&home), &appended);
    let p = first_problem(&home, &[]);
    assert_eq!(p["seq"].as_u64(), Some(fake.seq), "{p}");
    assert!(p["what"].as_str().unwrap().contains("MAC"), "{p}");

    // The public key replaced by a forger's, and every checkpoint signed again
    // with it: the key is not the private key's public half.
    let home = copy_of(&d.home, "rekeyed");
    let forger = home.join("forger");
    std::fs::create_dir_all(&forger).unwrap();
    let signer = airlock_state::audit::checkpoint::Signer::load_or_create(&forger).unwrap();
    std::fs::copy(forger.join("signing.pub"), home.join("audit/signing.pub")).unwrap();
    let resigned: Vec<String> = lines(&checkpoints_of(&home))
        .into_iter()
        .map(|l| {
            let c: Value = serde_json::from_str(&l).unwrap();
            serde_json::to_string(&signer.sign(c["seq"].as_u64().unwrap(), c["hash"].as_str().unwrap()))
                .unwrap()
        })
        .collect();
    write_lines(&checkpoints_of(&home), &resigned);
    let p = first_problem(&home, &[]);
    assert_eq!(p["file"], "signing.pub", "{p}");

    // Checkpoints deleted: the records are still the daemon's (their MACs
    // verify), and the report says none of them is covered by a signature.
    let home = copy_of(&d.home, "checkpoints-deleted");
    std::fs::remove_file(checkpoints_of(&home)).unwrap();
    let (code, report) = verify(&home, &[]);
    assert_eq!((code, report["checkpoints"].as_u64()), (0, Some(0)), "{report}");
    assert_eq!(report["unsigned_records"].as_u64(), Some(original.len() as u64), "{report}");

    // A checkpoint forged without the key, and one altered.
    let home = copy_of(&d.home, "forged");
    let stranger = home.join("stranger");
    std::fs::create_dir_all(&stranger).unwrap();
    let signer = airlock_state::audit::checkpoint::Signer::load_or_create(&stranger).unwrap();
    let last = airlock_state::audit::record::open(original.last().unwrap()).unwrap();
    let forged = signer.sign(last.record.seq + 5, &"ab".repeat(32));
    let mut all = lines(&checkpoints_of(&home));
    all.push(serde_json::to_string(&forged).unwrap());
    write_lines(&checkpoints_of(&home), &all);
    let p = first_problem(&home, &[]);
    assert_eq!(p["file"], "checkpoints.jsonl", "{p}");
    assert!(p["what"].as_str().unwrap().contains("forged"), "{p}");
    let home = copy_of(&d.home, "altered-checkpoint");
    let mut all = lines(&checkpoints_of(&home));
    let mut first: Value = serde_json::from_str(&all[0]).unwrap();
    first["seq"] = (first["seq"].as_u64().unwrap() + 1).into();
    all[0] = first.to_string();
    write_lines(&checkpoints_of(&home), &all);
    let p = first_problem(&home, &[]);
    assert_eq!((p["file"].as_str(), p["line"].as_u64()), (Some("checkpoints.jsonl"), Some(1)), "{p}");
    // The text form names the first broken place too.
    let out = Command::new(BIN).args(["audit", "verify"]).env("AIRLOCK_HOME", &home).output().unwrap();
    assert_eq!(out.status.code(), Some(15));
    assert!(String::from_utf8_lossy(&out.stdout).contains("first: checkpoints.jsonl line 1"));
}

fn checkpoints_of(home: &Path) -> PathBuf {
    home.join("audit/checkpoints.jsonl")
}

#[test]
fn segments_rotate_and_retire_without_breaking_verification() {
    let d = Daemon::start(&[
        "--audit-segment-size",
        "4096",
        "--audit-keep-segments",
        "2",
        "--audit-checkpoint-every",
        "5",
    ]);
    d.shop("shop");
    for _ in 0..8 {
        let sb = d.fork("shop", &[]);
        d.ok(&["rm", sb["id"].as_str().unwrap()]);
    }
    let segments: Vec<String> = std::fs::read_dir(d.home.join("audit"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("segment-"))
        .collect();
    assert_eq!(segments.len(), 2, "{segments:?}");
    let retired = std::fs::read_to_string(d.home.join("audit/retired.jsonl")).unwrap();
    assert!(retired.lines().count() >= 2, "{retired}");
    let (code, report) = verify(&d.home, &[]);
    assert_eq!(code, 0, "{report}");
    assert!(report["retired_segments"].as_u64().unwrap() >= 2, "{report}");
    assert!(report["first_seq"].as_u64().unwrap() > 1, "{report}");
    // Each kept segment starts where the one before ended.
    let newest = records(&d);
    assert_eq!(newest.last().unwrap()["seq"], report["last_seq"]);
    // Removing a kept segment is caught, the oldest or the newest.
    let mut names = segments.clone();
    names.sort();
    for name in &names {
        let home = copy_of(&d.home, &format!("removed-{name}"));
        std::fs::remove_file(home.join("audit").join(name)).unwrap();
        let p = first_problem(&home, &[]);
        assert!(p["what"].as_str().unwrap().contains("removed"), "{name}: {p}");
    }
    // So is a retirement note forged to cover a removed segment: notes are signed.
    let home = copy_of(&d.home, "forged-retirement");
    let oldest = home.join("audit").join(&names[0]);
    let last = airlock_state::audit::record::open(lines(&oldest).last().unwrap()).unwrap();
    let notes = lines(&home.join("audit/retired.jsonl"));
    let mut note: Value = serde_json::from_str(notes.last().unwrap()).unwrap();
    note["segment"] = (note["segment"].as_u64().unwrap() + 1).into();
    note["last_seq"] = last.record.seq.into();
    note["last_hash"] = last.hash.clone().into();
    let mut forged = notes.clone();
    forged.push(note.to_string());
    write_lines(&home.join("audit/retired.jsonl"), &forged);
    std::fs::remove_file(&oldest).unwrap();
    let p = first_problem(&home, &[]);
    assert_eq!(p["file"], "retired.jsonl", "{p}");
    assert!(p["what"].as_str().unwrap().contains("forged"), "{p}");
    // And the oldest records of the first segment cut: the chain no longer
    // starts where the retirement notes say.
    let home = copy_of(&d.home, "oldest-records-cut");
    let first = home.join("audit").join(&names[0]);
    write_lines(&first, &lines(&first)[3..]);
    let p = first_problem(&home, &[]);
    assert!(p["what"].as_str().unwrap().contains("removed"), "{p}");
}

/// Makes a file immutable (even root cannot write it) or writable again.
fn immutable(path: &Path, on: bool) {
    let flag = if on { "+i" } else { "-i" };
    let out = Command::new("chattr").arg(flag).arg(path).output().unwrap();
    assert!(
        out.status.success(),
        "chattr {flag} {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Undoes `immutable` on drop, so a failed test leaves a removable data root.
struct Immutable(PathBuf);

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(&self.0).output();
    }
}

#[test]
fn nothing_is_granted_while_the_log_cannot_be_written_and_a_teardown_waits_for_it() {
    let d = Daemon::start(&[]);
    d.shop("shop");
    let kept = d.fork("shop", &[]);
    let kept_id = kept["id"].as_str().unwrap().to_owned();
    let before = records(&d).len();
    let segment = segment(&d.home);
    immutable(&segment, true);
    let _undo = Immutable(segment.clone());

    // A fork, a router connection and a tool call are refused, and say why.
    let (code, err) = d.fails(&["fork", "shop"]);
    assert_eq!((code, err["code"].as_str()), (14, Some("audit_unavailable")), "{err}");
    d.wait_for(Duration::from_secs(10), "the refused fork's sandbox to be gone", || {
        d.sandbox_dirs().len() == 1
    });
    let refused = psql(&dsn(&kept), "SELECT 1").unwrap_err();
    assert!(refused.contains("audit log"), "{refused}");
    let tool = d.api("POST", &format!("/v1/sandboxes/{kept_id}/sql"), r#"{"sql": "SELECT 1"}"#);
    assert_eq!(tool.0, 503, "{tool:?}");
    assert!(tool.1.contains("audit_unavailable"), "{tool:?}");

    // A teardown goes on.
    d.ok(&["rm", &kept_id]);
    assert!(d.ids().is_empty());
    assert_eq!(lines(&segment).len(), before, "nothing was written meanwhile");

    // Once the log can be written, a gap record comes first, then what waited.
    immutable(&segment, false);
    d.wait_for(Duration::from_secs(10), "the waiting records to be written", || {
        records(&d).iter().any(|r| r["kind"] == "audit_gap")
    });
    let all = records(&d);
    let gap = all.iter().position(|r| r["kind"] == "audit_gap").unwrap();
    assert!(all[gap]["detail"]["deferred"].as_u64().unwrap() >= 2, "{}", all[gap]);
    let after: Vec<&Value> = all[gap + 1..].iter().collect();
    assert!(
        after
            .iter()
            .any(|r| r["kind"] == "deleted" && r["sandbox"] == kept_id.as_str() && r["reason"] == "user"),
        "the teardown's record follows the gap: {after:?}"
    );
    let (code, report) = verify(&d.home, &[]);
    assert_eq!(code, 0, "{report}");
    // And forks work again.
    let sb = d.fork("shop", &[]);
    assert_eq!(sql(&dsn(&sb), "SELECT count(*) FROM orders"), "1000");
}

#[test]
fn a_daemon_killed_mid_fork_or_down_past_a_ttl_leaves_a_complete_chain() {
    for point in ["fork.created", "fork.started"] {
        let mut d = Daemon::start(&[]);
        d.shop("shop");
        d.kill9();
        d.crash_at = Some(point.into());
        d.spawn();
        let cut = d.cli(&["fork", "shop"]);
        assert_eq!(cut.code, 9, "{point}: {cut:?}");
        d.wait_died(Duration::from_secs(60));
        d.crash_at = None;
        d.spawn();
        d.wait_for(Duration::from_secs(10), "the half-made sandbox to be gone", || {
            d.sandbox_dirs().is_empty()
        });
        let all = records(&d);
        let created: Vec<&Value> = all.iter().filter(|r| r["kind"] == "created").collect();
        assert_eq!(created.len(), 1, "{point}: {all:?}");
        let id = created[0]["sandbox"].as_str().unwrap();
        let mine = kinds(&of_sandbox(&all, id));
        assert_eq!(mine.last().map(String::as_str), Some("deleted"), "{point}: {mine:?}");
        let deleted = of_sandbox(&all, id).into_iter().find(|r| r["kind"] == "deleted").unwrap().clone();
        assert_eq!(deleted["reason"], "orphan", "{point}");
        assert_eq!(deleted["door"], "daemon", "{point}: reconciliation is the daemon's own");
        assert_eq!(verify(&d.home, &[]).0, 0, "{point}");
    }

    // Down past a sandbox's TTL: the next start reaps it, on record, with the lag.
    let mut d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &["--ttl", "2s"]);
    let id = sb["id"].as_str().unwrap().to_owned();
    d.kill9();
    std::thread::sleep(Duration::from_secs(4));
    d.spawn();
    d.wait_for(Duration::from_secs(20), "the expired sandbox to be reaped", || !d.ids().contains(&id));
    let all = records(&d);
    let gone = of_sandbox(&all, &id)
        .into_iter()
        .find(|r| r["kind"] == "deleted")
        .expect("a deletion record")
        .clone();
    assert_eq!(gone["reason"], "ttl");
    assert_eq!(verify(&d.home, &[]).0, 0);
    // The reap lag counts from expiry, across the restart (once the metrics,
    // which follow the audit log, have read the deletion: it now runs after
    // the API answers).
    d.wait_for(Duration::from_secs(10), "the deletion to be counted", || {
        d.json(&["stats"])["reaping"]["lag"]["count"] == 1
    });
    let stats = d.json(&["stats"]);
    let lag = &stats["reaping"]["lag"];
    assert_eq!(lag["count"], 1, "{stats}");
    assert!(lag["max_ms"].as_f64().unwrap() >= 2000.0, "{stats}");
}

#[test]
fn the_log_heals_a_torn_write_refuses_a_forged_tail_and_checkpoints_what_the_router_writes() {
    let mut d = Daemon::start(&["--audit-checkpoint-every", "3"]);
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    // Router connections alone (written by the router's own process) bring checkpoints.
    let before = lines(&checkpoints_of(&d.home)).len();
    for _ in 0..7 {
        assert_eq!(sql(&dsn(&sb), "SELECT 1"), "1");
    }
    d.wait_for(Duration::from_secs(10), "checkpoints of the router's records", || {
        lines(&checkpoints_of(&d.home)).len() >= before + 2
    });

    // A write cut short by a crash: the next start closes it and says so.
    d.kill9();
    let newest = newest_segment(&d.home);
    let mut file = std::fs::OpenOptions::new().append(true).open(&newest).unwrap();
    std::io::Write::write_all(&mut file, b"{\"hash\":\"0123").unwrap();
    drop(file);
    d.spawn();
    let again = d.fork("shop", &[]);
    assert_eq!(sql(&dsn(&again), "SELECT count(*) FROM orders"), "1000");
    let repaired = d.json(&["audit", "ls", "--kind", "audit_repaired"]);
    assert_eq!(repaired.as_array().unwrap().len(), 1, "{repaired}");
    let (code, report) = verify(&d.home, &[]);
    assert_eq!((code, report["repaired"].as_u64()), (0, Some(1)), "{report}");

    // A record appended without the key is never chained onto: nothing is
    // granted until the log is put right.
    d.kill9();
    let newest = newest_segment(&d.home);
    let last = airlock_state::audit::record::open(lines(&newest).last().unwrap()).unwrap();
    let mut fake = last.record.clone();
    fake.seq += 1;
    fake.prev = last.hash.clone();
    let (text, _) = fake.seal(&airlock_state::audit::record::MacKey([9; 32]));
    let mut all = lines(&newest);
    all.push(text.trim_end().to_owned());
    write_lines(&newest, &all);
    d.spawn();
    let (code, err) = d.fails(&["fork", "shop"]);
    assert_eq!((code, err["code"].as_str()), (15, Some("audit_broken")), "{err}");
    assert!(err["message"].as_str().unwrap().contains("not written with this log's key"), "{err}");
    // Teardowns go on all the same.
    d.ok(&["rm", sb["id"].as_str().unwrap()]);
}

fn newest_segment(home: &Path) -> PathBuf {
    let mut names: Vec<PathBuf> = std::fs::read_dir(home.join("audit"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("segment-"))
        .collect();
    names.sort();
    names.pop().unwrap()
}
