//! Redis beside PostgreSQL: a golden's key space from a command file, a
//! private `redis-server` per fork reached only as the sandbox's ACL user, the
//! commands that would make it a foothold refused, memory bounded, and reset
//! and delete covering it. Real `redis-server` and `redis-cli`.

use std::process::Command;

use serde_json::Value;

use crate::harness::Daemon;

/// `redis-cli` on a sandbox's socket URL (`unix://user:password@/path`); the
/// password goes in the environment, never on the command line.
fn redis(url: &str, args: &[&str]) -> String {
    let rest = url.strip_prefix("unix://").expect("a unix URL");
    let (auth, path) = rest.split_once('@').expect("credentials in the URL");
    let (user, password) = auth.split_once(':').expect("user and password");
    redis_as(path, Some((user, password)), args)
}

fn redis_as(path: &str, auth: Option<(&str, &str)>, args: &[&str]) -> String {
    let mut cmd = Command::new("redis-cli");
    cmd.args(["-s", path, "--no-auth-warning"]);
    if let Some((user, password)) = auth {
        cmd.args(["--user", user]).env("REDISCLI_AUTH", password);
    }
    let out = cmd.args(args).output().expect("redis-cli runs");
    String::from_utf8_lossy(&out.stdout).trim().to_owned() + String::from_utf8_lossy(&out.stderr).trim()
}

fn redis_url(sb: &Value) -> String {
    sb["redis_socket_url"].as_str().expect("a Redis URL").to_owned()
}

/// A golden with a small schema and a Redis part from a command file.
fn golden_with_redis(d: &Daemon, name: &str) -> Value {
    let schema = d.home.join("schema.sql");
    std::fs::write(&schema, "CREATE TABLE t (id int);\n").unwrap();
    let seed = d.home.join("cache.redis");
    std::fs::write(
        &seed,
        "# the cache an agent starts with\nSET greeting \"hello world\"\nHSET cart:42 apples 3 pears 1\n\
         RPUSH queue 'job one' job2\nSELECT 1\nSET other-db yes\n",
    )
    .unwrap();
    let out = d.cli(&[
        "golden",
        "create",
        name,
        "--schema",
        schema.to_str().unwrap(),
        "--redis-seed",
        seed.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    serde_json::from_str(&out.stdout).unwrap()
}

#[test]
fn every_fork_gets_a_private_redis_from_its_goldens_key_space() {
    let d = Daemon::start(&[]);
    let golden = golden_with_redis(&d, "cache");
    let redis_part = &golden["generations"][0]["redis"];
    assert_eq!(redis_part["keys"], 4, "{golden}");
    assert!(redis_part["rdb_bytes"].as_u64().unwrap() > 0, "{golden}");

    let (a, b) = (d.fork("cache", &[]), d.fork("cache", &[]));
    let (url_a, url_b) = (redis_url(&a), redis_url(&b));
    assert_ne!(url_a, url_b);
    assert_eq!(redis(&url_a, &["GET", "greeting"]), "hello world");
    assert_eq!(redis(&url_a, &["HGET", "cart:42", "apples"]), "3");
    assert_eq!(redis(&url_a, &["LRANGE", "queue", "0", "-1"]), "job one\njob2");
    assert_eq!(redis(&url_a, &["-n", "1", "GET", "other-db"]), "yes");

    // What one sandbox does is its own: FLUSHALL included.
    assert_eq!(redis(&url_a, &["SET", "mine", "a"]), "OK");
    assert_eq!(redis(&url_b, &["FLUSHALL"]), "OK");
    assert_eq!(redis(&url_a, &["GET", "greeting"]), "hello world");
    assert_eq!(redis(&url_b, &["GET", "greeting"]), "");
    assert_eq!(redis(&url_b, &["GET", "mine"]), "");

    // Only the sandbox's own user and password let anyone in.
    let path_a = url_a.split_once('@').unwrap().1;
    let (id_a, id_b) = (a["id"].as_str().unwrap(), b["id"].as_str().unwrap());
    let password_b = url_b.split_once('@').unwrap().0.rsplit_once(':').unwrap().1;
    assert!(redis_as(path_a, None, &["GET", "greeting"]).contains("NOAUTH"));
    assert!(redis_as(path_a, Some(("default", "")), &["GET", "greeting"]).contains("WRONGPASS"));
    assert!(redis_as(path_a, Some((id_b, password_b)), &["GET", "greeting"]).contains("WRONGPASS"));
    assert!(redis_as(path_a, Some((id_a, "guess")), &["GET", "greeting"]).contains("WRONGPASS"));
    assert!(redis_as(path_a, Some(("airlock", password_b)), &["GET", "greeting"]).contains("WRONGPASS"));

    // It runs as the sandbox's own unprivileged user, in a network namespace
    // of its own, listening on no TCP port.
    let found = Command::new("pgrep").args(["-f", path_a]).output().unwrap();
    let pid = String::from_utf8_lossy(&found.stdout).trim().to_owned();
    assert!(!pid.is_empty() && !pid.contains('\n'), "one redis-server for the sandbox: {pid:?}");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid =
        status.lines().find(|l| l.starts_with("Uid:")).unwrap().split_whitespace().nth(1).unwrap().to_owned();
    assert_ne!(uid, "0", "not root");
    let postmaster = d.postmaster_of(id_a);
    let pg_status = std::fs::read_to_string(format!("/proc/{postmaster}/status")).unwrap();
    assert!(pg_status.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some(&uid)));
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/net")).unwrap();
    assert_ne!(ns(&pid), ns("self"), "a network namespace of its own");
    assert!(redis(&url_a, &["CONFIG", "GET", "port"]).ends_with('0'), "no TCP port");

    // `airlock dsn --redis` and `exec`'s REDIS_URL name the same server.
    assert_eq!(d.ok(&["dsn", id_a, "--redis"]).trim(), url_a);
    let ran = d.exec(id_a, "printf %s \"$REDIS_URL\"", "30s");
    assert_eq!(ran["stdout"], url_a, "{ran}");
    // exec code reaches the socket as the server's own clients do.
    let script = format!(
        "pw=${{REDIS_URL#unix://*:}}; pw=${{pw%%@*}}; \
         REDISCLI_AUTH=$pw redis-cli -s {path_a} --user {id_a} --no-auth-warning GET greeting"
    );
    let ran = d.exec(id_a, &script, "30s");
    assert_eq!(ran["stdout"].as_str().unwrap().trim(), "hello world", "{ran}");

    // Reset brings the golden's keys back; delete stops the server.
    assert_eq!(redis(&url_b, &["DBSIZE"]), "0");
    d.ok(&["reset", id_b]);
    assert_eq!(redis(&url_b, &["GET", "greeting"]), "hello world");
    let path_b = url_b.split_once('@').unwrap().1.to_owned();
    d.ok(&["rm", id_b]);
    assert!(!std::path::Path::new(&path_b).exists(), "the socket went with the sandbox");
    let running = Command::new("pgrep").args(["-f", &path_b]).output().unwrap();
    assert!(running.stdout.is_empty(), "no redis-server is left for {path_b}");
}

#[test]
fn suspend_wake_branch_and_the_pool_carry_a_sandboxs_redis() {
    let d = Daemon::start(&[]);
    golden_with_redis(&d, "life");
    // Pool members start with their Redis loaded; a claim binds it like the rest.
    d.json(&["golden", "pool", "life", "--size", "1"]);
    d.wait_for(std::time::Duration::from_secs(30), "a pool member", || {
        d.json(&["golden", "show", "life"])["pooled"] == 1
    });
    let a = d.fork("life", &["--mode", "owner"]);
    let id = a["id"].as_str().unwrap();
    assert_eq!(d.event_kinds(id).iter().filter(|k| *k == "created").count(), 1);
    let url = redis_url(&a);
    assert_eq!(redis(&url, &["GET", "greeting"]), "hello world");
    let claimed = d.fork("life", &["--statement-timeout", "5s"]);
    assert_eq!(redis(&redis_url(&claimed), &["GET", "greeting"]), "hello world", "a claim with other access");

    // Suspend saves the agent's keys in the sandbox's own directory; wake
    // starts from them.
    assert_eq!(redis(&url, &["SET", "progress", "step 3"]), "OK");
    d.ok(&["suspend", id]);
    let path = url.split_once('@').unwrap().1;
    let running = Command::new("pgrep").args(["-f", path]).output().unwrap();
    assert!(running.stdout.is_empty(), "its Redis stopped with it");
    d.ok(&["wake", id]);
    assert_eq!(redis(&url, &["GET", "progress"]), "step 3");

    // A branch takes both stores at one point; after it, each goes its own way.
    let b = d.json(&["branch", id]);
    let branch_url = redis_url(&b);
    assert_ne!(branch_url, url);
    assert_eq!(redis(&branch_url, &["GET", "progress"]), "step 3");
    assert_eq!(redis(&branch_url, &["SET", "progress", "branch"]), "OK");
    assert_eq!(redis(&url, &["GET", "progress"]), "step 3");
    // The branch's credential is its own.
    let (user, password) =
        url.strip_prefix("unix://").unwrap().split_once('@').unwrap().0.split_once(':').unwrap();
    let branch_path = branch_url.split_once('@').unwrap().1;
    assert!(redis_as(branch_path, Some((user, password)), &["GET", "progress"]).contains("WRONGPASS"));
}

#[test]
fn a_sandboxs_redis_refuses_what_would_make_it_a_foothold() {
    let d = Daemon::start(&[]);
    golden_with_redis(&d, "locked");
    let a = d.fork("locked", &[]);
    let url = redis_url(&a);
    for command in [
        vec!["CONFIG", "SET", "dir", "/root"],
        vec!["CONFIG", "SET", "dbfilename", "authorized_keys"],
        vec!["CONFIG", "SET", "maxmemory", "0"],
        vec!["MODULE", "LOAD", "/tmp/x.so"],
        vec!["DEBUG", "SLEEP", "0"],
        vec!["REPLICAOF", "127.0.0.1", "6379"],
        vec!["SLAVEOF", "127.0.0.1", "6379"],
        vec!["MIGRATE", "127.0.0.1", "6379", "greeting", "0", "1000"],
        vec!["SHUTDOWN", "NOSAVE"],
        vec!["ACL", "SETUSER", "default", "on", "nopass", "+@all"],
        vec!["ACL", "LIST"],
        vec!["CLIENT", "KILL", "ID", "1"],
        vec!["SAVE"],
        vec!["BGSAVE"],
        vec!["RESTORE", "k", "0", "x"],
        vec!["MONITOR"],
    ] {
        let said = redis(&url, &command);
        // Refused by the ACL, or (MODULE, DEBUG) by the configuration first.
        let refused = said.contains("NOPERM") || said.contains("command not allowed");
        assert!(refused, "{command:?} was not refused: {said}");
    }
    // What applications use stays.
    assert_eq!(redis(&url, &["CLIENT", "SETNAME", "app"]), "OK");
    assert!(redis(&url, &["KEYS", "*"]).contains("greeting"));
    assert!(redis(&url, &["INFO", "server"]).contains("redis_version"));
    assert_eq!(redis(&url, &["EVAL", "return redis.call('GET', KEYS[1])", "1", "greeting"]), "hello world");
    // Lua stays in its sandbox.
    assert!(redis(&url, &["EVAL", "return os.execute('id')", "0"]).contains("ERR"));

    // A memory hog hits its own ceiling, an OOM error to the client; the
    // neighbour is untouched.
    let b = d.fork("locked", &[]);
    let value = "x".repeat(1 << 20);
    let mut input = Vec::new();
    for i in 0..400 {
        let key = format!("big{i}");
        input.extend_from_slice(
            format!("*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n{value}\r\n", key.len(), value.len())
                .as_bytes(),
        );
    }
    let rest = url.strip_prefix("unix://").unwrap();
    let (auth, path) = rest.split_once('@').unwrap();
    let (user, password) = auth.split_once(':').unwrap();
    let mut pipe = Command::new("redis-cli")
        .args(["-s", path, "--user", user, "--no-auth-warning", "--pipe"])
        .env("REDISCLI_AUTH", password)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        pipe.stdin.take().unwrap().write_all(&input).unwrap();
    }
    let piped = String::from_utf8_lossy(&pipe.wait_with_output().unwrap().stdout).into_owned();
    assert!(!piped.contains("errors: 0,"), "some writes were refused: {piped}");
    // And a client writing one more value gets Redis's OOM error.
    let oom = (0..10).any(|i| {
        let mut one = Command::new("redis-cli")
            .args(["-s", path, "--user", user, "--no-auth-warning", "-x", "SET", &format!("more{i}")])
            .env("REDISCLI_AUTH", password)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        {
            use std::io::Write;
            one.stdin.take().unwrap().write_all(value.as_bytes()).unwrap();
        }
        String::from_utf8_lossy(&one.wait_with_output().unwrap().stdout).contains("OOM command not allowed")
    });
    assert!(oom, "{}", redis(&url, &["INFO", "memory"]));
    assert_eq!(redis(&redis_url(&b), &["GET", "greeting"]), "hello world");
    assert_eq!(redis(&url, &["PING"]), "PONG");
}

/// An RDB file written by a `redis-server` of the test's own, holding `keys`.
fn rdb_of(dir: &std::path::Path, keys: &[(&str, &str)]) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let socket = dir.join("redis.sock");
    let mut server = Command::new("redis-server")
        .args(["--port", "0", "--unixsocket"])
        .arg(&socket)
        .arg("--dir")
        .arg(dir)
        .args(["--save", "", "--appendonly", "no"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let began = std::time::Instant::now();
    while redis_as(socket.to_str().unwrap(), None, &["PING"]) != "PONG" {
        assert!(began.elapsed() < std::time::Duration::from_secs(10), "redis-server started");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for (k, v) in keys {
        assert_eq!(redis_as(socket.to_str().unwrap(), None, &["SET", k, v]), "OK");
    }
    assert_eq!(redis_as(socket.to_str().unwrap(), None, &["SAVE"]), "OK");
    server.kill().unwrap();
    server.wait().unwrap();
    dir.join("dump.rdb")
}

#[test]
fn a_redis_part_from_an_rdb_file_and_bad_seeds_fail_clearly() {
    let d = Daemon::start(&[]);
    let schema = d.home.join("schema.sql");
    std::fs::write(&schema, "CREATE TABLE t (id int);\n").unwrap();
    let rdb = rdb_of(&d.home.join("live-redis"), &[("session:1", "alice"), ("session:2", "bob")]);
    let made = d.cli(&[
        "golden",
        "create",
        "snap",
        "--schema",
        schema.to_str().unwrap(),
        "--redis-rdb",
        rdb.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(made.code, 0, "{made:?}");
    let golden: Value = serde_json::from_str(&made.stdout).unwrap();
    assert_eq!(golden["generations"][0]["redis"]["keys"], 2, "{golden}");
    assert_eq!(golden["generations"][0]["redis"]["source"]["kind"], "rdb", "{golden}");
    let a = d.fork("snap", &[]);
    assert_eq!(redis(&redis_url(&a), &["GET", "session:2"]), "bob");
    // A refresh builds the Redis part again from the same file.
    std::fs::remove_dir_all(d.home.join("live-redis")).unwrap();
    rdb_of(&d.home.join("live-redis"), &[("session:3", "carol")]);
    let refreshed = d.json(&["golden", "refresh", "snap"]);
    assert_eq!(refreshed["current_generation"], 2, "{refreshed}");
    let b = d.fork("snap", &[]);
    assert_eq!(redis(&redis_url(&b), &["GET", "session:3"]), "carol");
    assert_eq!(redis(&redis_url(&a), &["GET", "session:2"]), "bob", "the older fork keeps its generation");

    // A seed with an error names its file and line; a seed may not reach
    // outside its server either; a file that is not an RDB fails. Nothing is made.
    let bad = d.home.join("bad.redis");
    let schema = schema.to_str().unwrap();
    let fails = |kind: &str, file: &std::path::Path| {
        d.fails(&["golden", "create", "bad", "--schema", schema, kind, file.to_str().unwrap()]).1
    };
    std::fs::write(&bad, "SET a 1\nHSET onlykey\n").unwrap();
    let err = fails("--redis-seed", &bad);
    assert_eq!(err["code"], "seed_failed", "{err}");
    assert!(err["message"].as_str().unwrap().contains("bad.redis:2"), "{err}");
    std::fs::write(&bad, "CONFIG SET dir /root\n").unwrap();
    let err = fails("--redis-seed", &bad);
    assert!(err["message"].as_str().unwrap().contains("NOPERM"), "{err}");
    let err = fails("--redis-rdb", std::path::Path::new(schema));
    assert_eq!(err["code"], "seed_failed", "{err}");
    assert!(d.json(&["golden", "ls"]).as_array().unwrap().iter().all(|g| g["name"] != "bad"));
}
