//! Nothing internal reaches the model, and nothing outlives its tenant: tool
//! errors without paths or logs, exec code that sees only its own processes and
//! a private /tmp, and identities no two sandboxes of any data root share.

use serde_json::json;

use super::Scene;
use crate::harness::Daemon;

#[test]
fn a_failed_tool_call_names_no_path_socket_or_log() {
    let s = Scene::new();
    // Break what a reset needs: the golden generation's data directory.
    let generation = s.d.home.join("volume/goldens/shop/1");
    let aside = s.d.home.join("volume/goldens/shop/aside");
    std::fs::rename(&generation, &aside).unwrap();
    let out = s.tool("reset_database", json!({}));
    std::fs::rename(&aside, &generation).unwrap();
    let text = out.to_string();
    assert!(out["code"].is_string(), "the reset should have failed: {out}");
    for internal in [s.d.home.to_str().unwrap(), "pgdata", ".s.PGSQL", "postgres.log", "/volume/"] {
        assert!(!text.contains(internal), "the agent saw {internal:?}: {text}");
    }
    // A failed reset deletes the sandbox; every tool on it then says so, plainly.
    for tool in ["run_sql", "describe_schema", "changes_since_fork"] {
        let args = if tool == "run_sql" { json!({"sql": "SELECT 1"}) } else { json!({}) };
        let text = s.tool(tool, args).to_string();
        assert!(!text.contains(s.d.home.to_str().unwrap()), "{tool}: {text}");
    }
    s.untouched();
}

#[test]
fn exec_sees_only_its_own_processes_no_cgroups_and_a_private_tmp() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let s = Scene::new();
    let r = s.d.exec(
        &s.id,
        "ls /proc | grep -c '^[0-9]'; ls -A /sys/fs/cgroup | wc -l; echo mine > /tmp/left-behind; \
         touch /var/tmp/left /dev/shm/left 2>/dev/null; ls /tmp",
        "30s",
    );
    let lines: Vec<&str> = r["stdout"].as_str().unwrap().lines().collect();
    let processes: usize = lines[0].trim().parse().unwrap();
    assert!(processes <= 4, "exec code sees {processes} processes: {r}");
    assert_eq!(lines[1].trim(), "0", "exec code sees the host's cgroups: {r}");
    assert!(!std::path::Path::new("/tmp/left-behind").exists(), "exec wrote into the host's /tmp");
    // The next tenant starts with nothing of this one's, whatever uid it gets.
    s.d.ok(&["rm", &s.id]);
    let next = s.d.fork("shop", &[]);
    let r =
        s.d.exec(next["id"].as_str().unwrap(), "ls -A /tmp /var/tmp /dev/shm | grep -c left || true", "30s");
    assert_eq!(r["stdout"].as_str().unwrap().trim(), "0", "{r}");
    s.untouched();
}

#[test]
fn two_data_roots_never_share_a_sandbox_identity() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let s = Scene::new();
    let other = Daemon::start(&[]);
    other.shop("shop");
    let uids = |d: &Daemon| -> Vec<u32> {
        use std::os::unix::fs::MetadataExt;
        std::fs::read_dir(d.home.join("volume/sandboxes"))
            .unwrap()
            .flatten()
            .flat_map(|e| {
                let server = std::fs::metadata(e.path().join("pgdata")).unwrap().uid();
                [server, server + 1]
            })
            .collect()
    };
    for _ in 0..3 {
        other.fork("shop", &[]);
        s.d.fork("shop", &[]);
    }
    let (mine, theirs) = (uids(&s.d), uids(&other));
    assert!(mine.iter().all(|u| !theirs.contains(u)), "{mine:?} / {theirs:?}");
    assert!(mine.iter().chain(&theirs).all(|u| (1_000_000_000..1_000_065_536).contains(u)));
    s.untouched();
}
