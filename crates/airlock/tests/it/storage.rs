//! Copy-on-write storage: `storage init` on a host without it, reflink forks that
//! cost no space, the copy fallback, and goldens that no fork can change.

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::harness::{dsn, sql, Daemon};

/// A hash of every file (path and contents) under a golden.
pub fn golden_digest(root: &Path) -> String {
    let mut files = Vec::new();
    collect(root, &mut files);
    files.sort();
    let mut h = Sha256::new();
    for f in files {
        h.update(f.to_string_lossy().as_bytes());
        h.update(std::fs::read(&f).unwrap());
    }
    format!("{:x}", h.finalize())
}

fn collect(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            collect(&p, out)
        } else {
            out.push(p)
        }
    }
}

fn free_bytes(path: &Path) -> u64 {
    let st = nix::sys::statvfs::statvfs(path).unwrap();
    st.blocks_available() as u64 * st.fragment_size() as u64
}

/// Forks, wrecks the forks, and checks the golden's files did not change.
fn forks_never_change_the_golden(d: &Daemon) {
    let golden = d.home.join("volume/goldens/shop/1");
    let before = golden_digest(&golden);
    for _ in 0..2 {
        let sb = d.fork("shop", &[]);
        sql(&dsn(&sb), "DELETE FROM orders");
        sql(&dsn(&sb), "VACUUM FULL orders");
        sql(&dsn(&sb), "INSERT INTO orders SELECT g, 'new', 0 FROM generate_series(1, 5000) g");
        d.ok(&["rm", sb["id"].as_str().unwrap()]);
    }
    assert_eq!(golden_digest(&golden), before, "a fork changed its golden");
}

#[test]
fn storage_init_makes_a_reflink_volume_where_forks_share_the_goldens_blocks() {
    // A data root on the host's own filesystem, as on a fresh machine.
    let base = crate::harness::plain_base();
    let d = Daemon::unstarted(crate::harness::fresh_home(&base), &[]);
    if !nix::unistd::geteuid().is_root() {
        let (_, err) = d.fails(&["storage", "init", "--size", "1G"]);
        assert_eq!(err["code"], "storage_failed");
        return;
    }
    let report = d.json(&["storage", "init", "--fs", "xfs", "--size", "2G"]);
    assert_eq!(report["filesystem"], "xfs");
    assert_eq!(report["quota"], false);
    assert_eq!(report["reflink"], true);
    assert_eq!(report["created"], true);
    assert!(crate::harness::is_mount_point(&d.home.join("volume")));
    // The image holds every sandbox's data: root's alone.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(d.home.join("storage.xfs")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // Running it again is harmless.
    assert_eq!(d.json(&["storage", "init", "--fs", "xfs", "--size", "2G"])["created"], false);

    let doctor = d.json(&["doctor"]);
    assert_eq!(doctor["storage_backend"], "reflink");
    assert_eq!(doctor["filesystem"], "xfs");
    d.golden(
        "shop",
        "CREATE TABLE orders (id int PRIMARY KEY, status text, pad text);",
        "INSERT INTO orders SELECT g, 'pending', repeat('x', 500) FROM generate_series(1, 100000) g;",
    );
    let size = d.json(&["golden", "show", "shop"])["generations"][0]["size_bytes"].as_u64().unwrap();
    assert!(size > 60 << 20, "golden is {size} bytes");
    let volume = d.home.join("volume");
    let free_before = free_bytes(&volume);
    let mut forks = Vec::new();
    for _ in 0..5 {
        let out = d.cli(&["fork", "shop", "--json"]);
        assert_eq!(out.code, 0, "{out:?}");
        assert!(!out.stderr.contains("warning"), "reflink forks carry no warning: {}", out.stderr);
        forks.push(serde_json::from_str::<serde_json::Value>(&out.stdout).unwrap());
    }
    let used = free_before.saturating_sub(free_bytes(&volume));
    assert!(used < size / 2, "5 forks of a {size}-byte golden used {used} bytes: not copy-on-write");
    for f in &forks {
        assert_eq!(sql(&dsn(f), "SELECT count(*) FROM orders"), "100000");
    }
    for f in forks {
        d.ok(&["rm", f["id"].as_str().unwrap()]);
    }
    forks_never_change_the_golden(&d);
}

#[test]
fn without_copy_on_write_forks_copy_and_say_so() {
    let d = Daemon::start(&["--storage", "copy"]);
    assert_eq!(d.json(&["doctor"])["storage_backend"], "copy");
    let doctor = d.ok(&["doctor"]);
    assert!(doctor.contains("warning:"), "doctor warns about the copy fallback: {doctor}");
    d.shop("shop");
    let out = d.cli(&["fork", "shop"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stderr.contains("warning:") && out.stderr.contains("copied every byte"), "{}", out.stderr);
    assert_eq!(sql(out.stdout.trim(), "SELECT count(*) FROM orders"), "1000");
    let v = d.fork("shop", &[]);
    assert!(v["warnings"][0].as_str().unwrap().contains("storage init"));
    forks_never_change_the_golden(&d);
}

#[test]
fn the_probe_picks_reflink_on_xfs_and_copy_elsewhere() {
    let d = Daemon::start(&[]);
    let doctor = d.json(&["doctor"]);
    let expected: &[&str] = match doctor["filesystem"].as_str().unwrap() {
        "xfs" => &["reflink"],
        "btrfs" => &["reflink", "subvolume"],
        _ => &["copy"],
    };
    assert!(expected.contains(&doctor["storage_backend"].as_str().unwrap()), "{doctor}");
    if crate::harness::cow_base().is_some() {
        assert_eq!(doctor["storage_backend"], "reflink");
    }
}
