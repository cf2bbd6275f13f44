//! What agent code sees of the host: a root of its own, in which the host is
//! read-only and holds no socket, no directory anyone may write and no other
//! volume, and in which nothing of a tenant can outlive it. Attempts made from
//! `exec` code and from the sandbox's server's own namespace.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::harness::Daemon;

/// A host's things an agent would like to reach: a directory anyone may
/// write, world-connectable unix sockets (one in `/run`, as a service's; one
/// in the writable directory), each counting the connections it accepts, and
/// a volume of its own mounted from a loop image.
struct HostBait {
    writable: PathBuf,
    sockets: Vec<PathBuf>,
    accepted: Arc<AtomicU32>,
    image: PathBuf,
    volume: PathBuf,
}

impl HostBait {
    fn set() -> HostBait {
        let tag = format!("airlock-view-{}-{}", std::process::id(), crate::harness::counter());
        let writable = PathBuf::from(format!("/var/lib/{tag}"));
        std::fs::create_dir_all(&writable).unwrap();
        std::fs::set_permissions(&writable, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let sockets = vec![PathBuf::from(format!("/run/{tag}.sock")), writable.join(".s.PGSQL.5432")];
        let accepted = Arc::new(AtomicU32::new(0));
        for path in &sockets {
            let _ = std::fs::remove_file(path);
            let listener = UnixListener::bind(path).unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
            let accepted = accepted.clone();
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if conn.is_ok() {
                        accepted.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        }
        let image = PathBuf::from(format!("/var/lib/{tag}.img"));
        let volume = PathBuf::from(format!("/var/lib/{tag}-volume"));
        std::fs::create_dir_all(&volume).unwrap();
        run("truncate", &["-s", "300M", image.to_str().unwrap()]);
        run("mkfs.xfs", &["-q", image.to_str().unwrap()]);
        run("mount", &["-o", "loop", image.to_str().unwrap(), volume.to_str().unwrap()]);
        HostBait { writable, sockets, accepted, image, volume }
    }

    /// Whether a loop device still holds the volume's image.
    fn image_attached(&self) -> bool {
        let out = Command::new("losetup").args(["-j", self.image.to_str().unwrap()]).output().unwrap();
        !String::from_utf8_lossy(&out.stdout).trim().is_empty()
    }
}

impl Drop for HostBait {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.volume).status();
        for path in &self.sockets {
            let _ = std::fs::remove_file(path);
        }
        let _ = std::fs::remove_dir_all(&self.writable);
        let _ = std::fs::remove_dir(&self.volume);
        let _ = std::fs::remove_file(&self.image);
    }
}

fn run(program: &str, args: &[&str]) {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// What a Python script run by `exec` found: one line per attempt, `name ok`
/// or `name refused: why`.
const PROBE: &str = r#"
import os, socket, sys
def attempt(name, f):
    try:
        f(); print(name, "ok")
    except Exception as e:
        print(name, "refused:", type(e).__name__, e)
def write(path):
    with open(path, "w") as f: f.write("left by a tenant")
def connect(path):
    s = socket.socket(socket.AF_UNIX); s.settimeout(2); s.connect(path); s.close()
for i, path in enumerate(sys.argv[1:]):
    if path.startswith("w:"): attempt("write " + path[2:], lambda p=path[2:]: write(p))
    if path.startswith("c:"): attempt("connect " + path[2:], lambda p=path[2:]: connect(p))
attempt("write workdir", lambda: write("own-file"))
attempt("write tmp", lambda: write("/tmp/own-file"))
print("root", " ".join(sorted(os.listdir("/"))))
print("mounts", open("/proc/self/mountinfo").read().count("\n"))
"#;

#[test]
fn agent_code_writes_nothing_of_the_host_connects_to_no_host_socket_and_holds_no_other_volume() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let bait = HostBait::set();
    let d = Daemon::start(&[]);
    d.shop("shop");
    let sb = d.fork("shop", &[]);
    let id = sb["id"].as_str().unwrap();
    let other_root = d.home.parent().unwrap().to_str().unwrap().to_owned();
    let mut args = vec![
        format!("w:{}/planted", bait.writable.display()),
        "w:/usr/local/planted".into(),
        "w:/etc/planted".into(),
        "w:/var/lib/planted".into(),
        "w:/planted".into(),
        format!("w:{}/planted", d.home.display()),
        format!("w:{other_root}/planted"),
        format!("w:{}/planted", bait.volume.display()),
    ];
    args.extend(bait.sockets.iter().map(|s| format!("c:{}", s.display())));
    // Where the host's own PostgreSQL and the daemon listen.
    args.extend(["c:/var/run/postgresql/.s.PGSQL.5432".into(), format!("c:{}", d.socket().display())]);
    let script = format!("python3 - {} <<'EOF'\n{PROBE}\nEOF", args.join(" "));
    let r = d.exec(id, &script, "30s");
    let out = r["stdout"].as_str().unwrap();
    assert_eq!(r["exit_code"], 0, "{r}");
    for line in out.lines().filter(|l| l.starts_with("write ") || l.starts_with("connect ")) {
        let own = line.starts_with("write workdir") || line.starts_with("write tmp");
        assert_eq!(line.ends_with(" ok"), own, "{line}\n{out}");
    }
    assert!(out.lines().filter(|l| l.ends_with(" ok")).count() == 2, "its own places are writable: {out}");
    // The root holds the system's trees, its own data and private directories.
    let root = out.lines().find_map(|l| l.strip_prefix("root ")).unwrap();
    for name in root.split(' ') {
        assert!(
            [
                "bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "run", "sbin", "tmp", "usr",
                "var"
            ]
            .contains(&name)
                || d.home.starts_with(Path::new("/").join(name)),
            "{name} in the sandbox's root: {root}"
        );
    }
    let mounts: usize = out.lines().find_map(|l| l.strip_prefix("mounts ")).unwrap().parse().unwrap();
    assert!(mounts < 30, "a handful of mounts, not the host's: {mounts}");
    assert_eq!(bait.accepted.load(Ordering::SeqCst), 0, "a host socket was reached");
    assert_eq!(std::fs::read_dir(&bait.writable).unwrap().count(), 1, "only the bait's own socket is there");

    // Neither the server's namespace nor exec's holds the host's mounts: the
    // other volume, unmounted on the host while the sandbox runs, is freed.
    let postmaster = d.postmaster_of(id);
    let mountinfo = std::fs::read_to_string(format!("/proc/{postmaster}/mountinfo")).unwrap();
    assert!(!mountinfo.contains(bait.volume.to_str().unwrap()), "{mountinfo}");
    assert!(mountinfo.lines().count() < 30, "{mountinfo}");
    run("umount", &[bait.volume.to_str().unwrap()]);
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(!bait.image_attached(), "a sandbox's namespace still holds the unmounted volume");
    // The server still answers, and what exec wrote went nowhere but its own directory.
    assert_eq!(crate::harness::sql(&crate::harness::dsn(&sb), "SELECT count(*) FROM orders"), "1000");
    for planted in ["/usr/local/planted", "/etc/planted", "/var/lib/planted", "/planted"] {
        assert!(!Path::new(planted).exists(), "{planted} was written on the host");
    }
}

#[test]
fn a_uid_whose_file_outlived_its_sandbox_is_not_leased_again() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    // Two pairs of uids in all, so a freed pair is the next one leased.
    let first = 1_000_070_000 + 4 * (std::process::id() % 1000);
    let range = format!("{first}-{}", first + 3);
    let leases = crate::harness::fresh_home(&crate::harness::plain_base());
    let d = Daemon::start(&["--uid-range", &range, "--lease-dir", leases.to_str().unwrap()]);
    d.shop("shop");
    let a = d.fork("shop", &[]);
    let uid_of = |id: &str| -> u32 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(d.home.join("volume/sandboxes").join(id).join("pgdata")).unwrap().uid()
    };
    let a_uid = uid_of(a["id"].as_str().unwrap());
    d.ok(&["rm", a["id"].as_str().unwrap()]);
    // A file of the freed pair's exec user, where a tenant could once leave
    // one, some directories down.
    let top = PathBuf::from(format!("/var/tmp/airlock-left-{}", std::process::id()));
    let left = top.join("a/b/c");
    std::fs::create_dir_all(&left).unwrap();
    let left = left.join("file");
    std::fs::write(&left, "from a tenant").unwrap();
    std::os::unix::fs::chown(&left, Some(a_uid + 1), Some(a_uid + 1)).unwrap();
    let b = d.fork("shop", &[]);
    assert_ne!(uid_of(b["id"].as_str().unwrap()), a_uid, "the pair was leased again with a file on the host");
    let (code, err) = d.fails(&["fork", "shop"]);
    assert_ne!(code, 0);
    assert_eq!(err["code"], "capacity_exhausted", "{err}");
    std::fs::remove_dir_all(&top).unwrap();
    let c = d.fork("shop", &[]);
    assert_eq!(uid_of(c["id"].as_str().unwrap()), a_uid, "free again once nothing of it is left");
    drop(d);
    let _ = std::fs::remove_dir_all(&leases);
}

#[test]
fn a_daemon_a_command_starts_by_itself_leases_where_its_data_root_always_has() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let first = 1_000_080_000 + 8 * (std::process::id() % 1000);
    let range = format!("{first}-{}", first + 7);
    let leases = crate::harness::fresh_home(&crate::harness::plain_base());
    let mut d = Daemon::start(&["--uid-range", &range, "--lease-dir", leases.to_str().unwrap()]);
    d.shop("shop");
    let uid_of = |d: &Daemon, id: &str| -> u32 {
        std::fs::metadata(d.home.join("volume/sandboxes").join(id).join("pgdata")).unwrap().uid()
    };
    let a = d.fork("shop", &[]);
    d.kill9();
    // The next command finds no daemon and starts one itself, with none of
    // the flags: it leases where the data root always has, so no daemon of
    // that lease directory can hand out the same uid.
    let b = d.fork("shop", &[]);
    for sb in [&a, &b] {
        let uid = uid_of(&d, sb["id"].as_str().unwrap());
        assert!((first..=first + 7).contains(&uid), "uid {uid} is outside {range}");
        assert!(leases.join(uid.to_string()).is_file(), "uid {uid} is not leased in {}", leases.display());
    }
    // Given another place while sandboxes hold uids of this one, a daemon refuses to start.
    for pid in crate::harness::processes_mentioning(&d.home) {
        if std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| c.ends_with(b" serve\0") || c.ends_with(b"\0serve\0"))
        {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
    d.wait_for(std::time::Duration::from_secs(10), "the daemon the command started to end", || {
        std::os::unix::net::UnixStream::connect(d.socket()).is_err()
    });
    d.args = vec!["--uid-range".into(), format!("{}-{}", first + 8, first + 15)];
    let refused = d.serve_fails();
    assert!(
        refused.contains("lease their uids in") && refused.contains(leases.to_str().unwrap()),
        "{refused}"
    );
    drop(d);
    let _ = std::fs::remove_dir_all(&leases);
}
