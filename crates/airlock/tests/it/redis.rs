//! Redis beside PostgreSQL: a golden's key space from a command file, a
//! private `redis-server` per fork reached only as the sandbox's ACL user, the
//! commands that would make it a foothold refused, memory bounded, and reset
//! and delete covering it. Real `redis-server` and `redis-cli`.

use std::process::Command;

use serde_json::Value;

use crate::harness::Daemon;

/// `redis-cli` on a sandbox's socket URL (`unix://user:password@/path`); the
/// password goes in the environment, never on the command line.
pub(crate) fn redis(url: &str, args: &[&str]) -> String {
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
pub(crate) fn golden_with_redis(d: &Daemon, name: &str) -> Value {
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

    // A read-only credential reads its Redis and writes nothing there either.
    let ro = d.fork("cache", &["--mode", "readonly"]);
    let ro_url = redis_url(&ro);
    assert_eq!(redis(&ro_url, &["HGET", "cart:42", "apples"]), "3");
    for write in [
        vec!["SET", "k", "v"],
        vec!["DEL", "greeting"],
        vec!["FLUSHALL"],
        vec!["EVAL", "return redis.call('SET', 'k', 'v')", "0"],
    ] {
        let said = redis(&ro_url, &write);
        assert!(said.contains("NOPERM") || said.contains("can't run this command"), "{write:?}: {said}");
    }

    // It runs as the sandbox's own unprivileged user, in the sandbox's own
    // network namespace (its PostgreSQL's, no other sandbox's), listening on
    // loopback there only.
    let found = Command::new("pgrep").args(["-f", &seen(path_a)]).output().unwrap();
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
    assert_eq!(ns(&pid), ns(&postmaster.to_string()), "the sandbox's PostgreSQL's");
    let postmaster_b = d.postmaster_of(id_b);
    assert_ne!(ns(&pid), ns(&postmaster_b.to_string()), "never another sandbox's");
    // The server listens on no port: exec code reaches it through the
    // daemon's door on loopback in the sandbox's network, below.
    assert!(redis(&url_a, &["CONFIG", "GET", "port"]).ends_with("\n0"), "no port");
    let host_ports = Command::new("ss").args(["-ltnp"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&host_ports.stdout).contains(&format!("pid={pid},")),
        "its port is not on the host's network"
    );

    // `exec`'s REDIS_URL is a loopback redis:// URL inside the sandbox's own
    // network namespace, with the same credential as the socket's.
    assert_eq!(d.ok(&["dsn", id_a, "--redis", "--socket"]).trim(), url_a);
    let password = url_a.strip_prefix(&format!("unix://{id_a}:")).unwrap().split_once('@').unwrap().0;
    let ran = d.exec(id_a, "printf %s \"$REDIS_URL\"", "30s");
    assert_eq!(ran["stdout"], format!("redis://{id_a}:{password}@127.0.0.1:6379/0"), "{ran}");
    // redis-cli takes it as it is; so does its socket, as the server's own clients do.
    let script = format!(
        "redis-cli -u \"$REDIS_URL\" --no-auth-warning GET greeting; \
         pw=${{REDIS_URL#redis://*:}}; pw=${{pw%%@*}}; \
         REDISCLI_AUTH=$pw redis-cli -s {path_a} --user {id_a} --no-auth-warning GET greeting"
    );
    let ran = d.exec(id_a, &script, "30s");
    assert_eq!(ran["stdout"].as_str().unwrap().trim(), "hello world\nhello world", "{ran}");
    // Over the size limit inside exec: the same error reply as through the
    // router, in the command's place (no broken pipe), and the server goes on.
    let big = "head -c 9000000 /dev/zero | tr '\\0' a > big; \
               redis-cli -u \"$REDIS_URL\" --no-auth-warning -x SET big < big; \
               redis-cli -u \"$REDIS_URL\" --no-auth-warning PING";
    let ran = d.exec(id_a, big, "60s");
    let out = format!("{}{}", ran["stdout"].as_str().unwrap(), ran["stderr"].as_str().unwrap());
    assert!(out.contains("command too large") && out.contains("PONG"), "{ran}");
    assert!(!out.contains("Broken pipe") && !out.contains("reset by peer"), "{ran}");

    // Each sandbox's Redis counts as its own in the fleet's isolation measure.
    d.wait_for(std::time::Duration::from_secs(10), "the isolation check to see both", || {
        d.json(&["stats"])["isolation"]["sessions"].as_u64().unwrap_or(0) >= 2
    });
    let stats = d.json(&["stats"]);
    assert_eq!(stats["isolation"]["ratio"], 1.0, "{stats}");
    // Reset brings the golden's keys back; delete stops the server.
    assert_eq!(redis(&url_b, &["DBSIZE"]), "0");
    d.ok(&["reset", id_b]);
    assert_eq!(redis(&url_b, &["GET", "greeting"]), "hello world");
    let path_b = url_b.split_once('@').unwrap().1.to_owned();
    d.ok(&["rm", id_b]);
    assert!(!std::path::Path::new(&path_b).exists(), "the socket went with the sandbox");
    let running = Command::new("pgrep").args(["-f", &seen(&path_b)]).output().unwrap();
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
    d.wait_for(std::time::Duration::from_secs(30), "the pool to refill", || {
        d.json(&["golden", "show", "life"])["pooled"] == 1
    });
    let claimed = d.fork("life", &["--statement-timeout", "5s"]);
    let events = d.json(&["events", "--sandbox", claimed["id"].as_str().unwrap()]).to_string();
    assert!(events.contains("\"from_pool\":true"), "{events}");
    assert_eq!(redis(&redis_url(&claimed), &["GET", "greeting"]), "hello world", "a claim with other access");
    // Binding a claim's access gives back writes, never what the agent's
    // rules take away (RESTORE feeds the server crafted encodings).
    let restore = redis(&redis_url(&claimed), &["RESTORE", "k", "0", "x"]);
    assert!(restore.contains("NOPERM"), "a claim re-enabled RESTORE: {restore}");
    d.wait_for(std::time::Duration::from_secs(30), "the pool to refill", || {
        d.json(&["golden", "show", "life"])["pooled"] == 1
    });
    let ro = d.fork("life", &["--mode", "readonly"]);
    let events = d.json(&["events", "--sandbox", ro["id"].as_str().unwrap()]).to_string();
    assert!(events.contains("\"from_pool\":true"), "{events}");
    assert!(
        redis(&redis_url(&ro), &["SET", "k", "v"]).contains("NOPERM"),
        "a read-only claim of a pool member"
    );
    assert_eq!(redis(&redis_url(&ro), &["GET", "greeting"]), "hello world");

    // Suspend saves the agent's keys in the sandbox's own directory; wake
    // starts from them.
    assert_eq!(redis(&url, &["SET", "progress", "step 3"]), "OK");
    d.ok(&["suspend", id]);
    let path = url.split_once('@').unwrap().1;
    let running = Command::new("pgrep").args(["-f", &seen(path)]).output().unwrap();
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

    // Promote makes the sandbox's Redis state the next golden's.
    let promoted = d.json(&["promote", id, "--golden", "promoted"]);
    let part = &promoted["generations"][0]["redis"];
    assert_eq!(part["source"]["kind"], "promoted", "{promoted}");
    assert_eq!(part["keys"], 5, "{promoted}");
    let c = d.fork("promoted", &[]);
    assert_eq!(redis(&redis_url(&c), &["GET", "progress"]), "step 3");
    assert_eq!(redis(&redis_url(&c), &["GET", "greeting"]), "hello world");
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
        // A client exempt from eviction could hold a half-sent command past
        // every buffer limit (and every other client's connection with it).
        vec!["CLIENT", "NO-EVICT", "on"],
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

    // A live Redis over TLS, snapshotted as a replica would take it.
    let live_dir = d.home.join("live-tls");
    std::fs::create_dir_all(&live_dir).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let tls = d.home.join("tls");
    let file = |n: &str| tls.join(n).to_str().unwrap().to_owned();
    let mut live = Command::new("redis-server")
        .args(["--port", "0", "--tls-port", &port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .args(["--tls-cert-file", &file("server.crt"), "--tls-key-file", &file("server.key")])
        .args(["--tls-ca-cert-file", &file("ca.crt"), "--tls-auth-clients", "no"])
        .args(["--user", "app", "on", ">live-secret-77", "~*", "&*", "+@all"])
        .arg("--dir")
        .arg(&live_dir)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let live_cli = |args: &[&str]| {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port, "--tls", "--cacert", &file("ca.crt"), "--user", "app"])
            .arg("--no-auth-warning")
            .args(args)
            .env("REDISCLI_AUTH", "live-secret-77")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let began = std::time::Instant::now();
    while live_cli(&["PING"]) != "PONG" {
        assert!(began.elapsed() < std::time::Duration::from_secs(10), "the live Redis started");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(live_cli(&["SET", "live:key", "from production"]), "OK");
    let url = format!("rediss://app:live-secret-77@127.0.0.1:{port}/?cacert={}", file("ca.crt"));
    let made = d.cli_with(
        &[
            "golden",
            "create",
            "fromlive",
            "--schema",
            schema.to_str().unwrap(),
            "--redis-from-url",
            "-",
            "--json",
        ],
        Some(&url),
    );
    assert_eq!(made.code, 0, "{made:?}");
    assert!(!made.stdout.contains("live-secret-77"), "{}", made.stdout);
    let golden: Value = serde_json::from_str(&made.stdout).unwrap();
    assert!(
        golden["generations"][0]["redis"]["source"]["url"].as_str().unwrap().contains("app:***@"),
        "{golden}"
    );
    let c = d.fork("fromlive", &[]);
    assert_eq!(redis(&redis_url(&c), &["GET", "live:key"]), "from production");
    assert_eq!(live_cli(&["GET", "live:key"]), "from production", "the source is untouched");
    let wrong = url.replace("live-secret-77", "not-it-88");
    let out = d.cli_with(
        &[
            "golden",
            "create",
            "wronglive",
            "--schema",
            schema.to_str().unwrap(),
            "--redis-from-url",
            "-",
            "--json",
        ],
        Some(&wrong),
    );
    assert_ne!(out.code, 0);
    let err: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(err["error"]["code"], "source_failed", "{err}");
    assert!(!out.stdout.contains("not-it-88"), "{}", out.stdout);
    live.kill().unwrap();
    live.wait().unwrap();

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

/// `POST /v1/sandboxes/{id}/tools/{tool}`.
fn tool(d: &Daemon, id: &str, name: &str, args: Value) -> Value {
    let (status, body) = d.api("POST", &format!("/v1/sandboxes/{id}/tools/{name}"), &args.to_string());
    let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    assert_eq!(status, 200, "{v}");
    v
}

#[test]
fn agent_tools_reach_the_tasks_redis_as_its_agent() {
    let d = Daemon::start(&[]);
    golden_with_redis(&d, "tools");
    let a = d.fork("tools", &[]);
    let id = a["id"].as_str().unwrap();

    let r = tool(&d, id, "run_redis", serde_json::json!({"command": ["HGETALL", "cart:42"]}));
    assert_eq!(r["result"]["reply"], serde_json::json!(["apples", "3", "pears", "1"]), "{r}");
    assert_eq!(r["is_error"], false);
    assert!(r["text"].as_str().unwrap().contains("<untrusted-data-"), "{r}");

    // The agent's rules apply to the tool as to any client.
    let r = tool(&d, id, "run_redis", serde_json::json!({"command": ["CONFIG", "SET", "dir", "/tmp"]}));
    assert_eq!(r["is_error"], true, "{r}");
    assert!(r["result"]["error"].as_str().unwrap().starts_with("NOPERM"), "{r}");
    // ... and its record says it was refused, not that it succeeded.
    let calls = d.json(&["audit", "ls", "--sandbox", id, "--kind", "tool_call"]);
    let refused = calls.as_array().unwrap().last().unwrap();
    assert_eq!(refused["detail"]["error"], "NOPERM", "{refused}");

    // Replies are capped like run_sql's, the rest counted.
    let mut push = vec!["RPUSH".to_owned(), "long".to_owned()];
    push.extend((0..500).map(|i| format!("item{i}")));
    tool(&d, id, "run_redis", serde_json::json!({"command": push}));
    let r = tool(&d, id, "run_redis", serde_json::json!({"command": ["LRANGE", "long", "0", "-1"]}));
    assert_eq!(r["result"]["reply"].as_array().unwrap().len(), 200, "{r}");
    assert!(r["result"]["note"].as_str().unwrap().contains("300 more elements"), "{r}");

    // describe_schema and changes_since_fork cover the key space.
    let r = tool(&d, id, "describe_schema", serde_json::json!({}));
    let text = r["text"].as_str().unwrap();
    assert!(text.contains("Redis: 5 keys"), "{text}");
    assert!(text.contains("cart:* (hash): 1"), "{text}");
    let r = tool(&d, id, "changes_since_fork", serde_json::json!({}));
    assert!(r["text"].as_str().unwrap().contains("Redis keys: 4 -> 5"), "{r}");

    // Calls are events; a credential in a command never is.
    tool(&d, id, "run_redis", serde_json::json!({"command": ["AUTH", id, "not-the-password-x9"]}));
    let events = d.json(&["events", "--sandbox", id]).to_string();
    assert!(events.contains("HGETALL cart:42"), "{events}");
    assert!(!events.contains("not-the-password-x9"), "{events}");

    // reset_database puts the Redis back too.
    tool(&d, id, "reset_database", serde_json::json!({}));
    let r = tool(&d, id, "run_redis", serde_json::json!({"command": ["EXISTS", "long"]}));
    assert_eq!(r["result"]["reply"], 0, "{r}");

    // A task without Redis says so.
    d.shop("plain");
    let b = d.fork("plain", &[]);
    let (status, body) = d.api(
        "POST",
        &format!("/v1/sandboxes/{}/tools/run_redis", b["id"].as_str().unwrap()),
        r#"{"command": ["PING"]}"#,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("no Redis"), "{body}");
}

/// `redis-cli` through the router at `url` (`redis[s]://id:password@host:port`),
/// with `extra` options first.
fn via_router(url: &str, extra: &[&str], args: &[&str]) -> String {
    let rest = url.split_once("://").unwrap().1;
    let (auth, addr) = rest.rsplit_once('@').unwrap();
    let (user, password) = auth.split_once(':').unwrap();
    let (host, port) = addr.rsplit_once(':').unwrap();
    let out = Command::new("redis-cli")
        .args(["-h", host, "-p", port, "--no-auth-warning", "--user", user])
        .args(extra)
        .args(args)
        .env("REDISCLI_AUTH", password)
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&out.stdout).trim().to_owned() + String::from_utf8_lossy(&out.stderr).trim()
}

#[test]
fn the_router_reaches_each_sandboxs_redis_by_its_id_with_tls_or_without() {
    let d = Daemon::start(&[]);
    golden_with_redis(&d, "routed");
    let a = d.fork("routed", &[]);
    let id = a["id"].as_str().unwrap();
    let url = a["redis_url"].as_str().expect("a routed Redis URL").to_owned();
    let port = d.redis_router.rsplit_once(':').unwrap().1;
    assert!(
        url.starts_with(&format!("rediss://{id}:")) && url.ends_with(&format!("@127.0.0.1:{port}")),
        "{url}"
    );
    assert_eq!(d.ok(&["dsn", id, "--redis"]).trim(), url);

    // Plaintext and TLS on the one port, TLS verified against Airlock's CA.
    assert_eq!(via_router(&url, &[], &["GET", "greeting"]), "hello world");
    let ca = d.home.join("tls").join("ca.crt");
    assert_eq!(
        via_router(&url, &["--tls", "--cacert", ca.to_str().unwrap()], &["GET", "greeting"]),
        "hello world"
    );
    let b = d.fork("routed", &[]);
    let url_b = b["redis_url"].as_str().unwrap();
    assert_eq!(via_router(url_b, &[], &["SET", "greeting", "other"]), "OK");
    assert_eq!(via_router(&url, &[], &["GET", "greeting"]), "hello world", "each sandbox its own");

    // Nothing before authentication; no way to tell a wrong password from an
    // unknown sandbox or one without Redis.
    let (host, _) = d.redis_router.rsplit_once(':').unwrap();
    let bare = Command::new("redis-cli").args(["-h", host, "-p", port, "GET", "greeting"]).output().unwrap();
    assert!(String::from_utf8_lossy(&bare.stdout).contains("NOAUTH"), "{bare:?}");
    let password = url.split_once("://").unwrap().1.split_once('@').unwrap().0.split_once(':').unwrap().1;
    let wrong = url.replace(password, "wrong-password");
    assert!(via_router(&wrong, &[], &["PING"]).contains("WRONGPASS"));
    let unknown = url.replace(id, "sb-nosuchbox");
    assert!(via_router(&unknown, &[], &["PING"]).contains("WRONGPASS"));
    d.shop("plain");
    let plain = d.fork("plain", &[]);
    let plain_id = plain["id"].as_str().unwrap();
    assert!(plain.get("redis_url").is_none(), "{plain}");
    assert!(via_router(&url.replace(id, plain_id), &[], &["PING"]).contains("WRONGPASS"));

    // A suspended sandbox wakes for its own credential only.
    d.ok(&["suspend", id]);
    assert!(via_router(&wrong, &[], &["PING"]).contains("WRONGPASS"));
    assert_eq!(d.json(&["show", id])["state"], "suspended");
    assert_eq!(via_router(&url, &[], &["GET", "greeting"]), "hello world");
    assert_eq!(d.json(&["show", id])["state"], "running");

    // Connections accepted and refused are events, as on the PostgreSQL port,
    // and no event holds the password.
    d.wait_for(std::time::Duration::from_secs(10), "the connection events", || {
        let kinds = d.event_kinds(id);
        kinds.iter().any(|k| k == "connected")
            && kinds.iter().filter(|k| *k == "connection_refused").count() >= 2
    });
    let events = d.json(&["events", "--sandbox", id]).to_string();
    assert!(events.contains("\"store\":\"redis\"") && events.contains("\"tls\":true"), "{events}");
    assert!(!events.contains(password), "a password in the events");

    // A first command too large to be an AUTH closes the connection.
    use std::io::{Read, Write};
    let mut tcp = std::net::TcpStream::connect(&d.redis_router).unwrap();
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(15))).unwrap();
    let _ = tcp.write_all(format!("*2\r\n$4\r\nAUTH\r\n$100000\r\n{}\r\n", "x".repeat(100000)).as_bytes());
    let mut rest = Vec::new();
    let _ = tcp.read_to_end(&mut rest);
    assert!(!String::from_utf8_lossy(&rest).contains("+OK"));

    // Passwords never reach the logs.
    assert!(!d.logs().contains(password), "a password in the logs");
}

#[test]
fn a_dead_redis_comes_back_and_a_golden_cannot_outgrow_a_forks_ceiling() {
    let d = Daemon::start(&["--memory-limit", "64M"]);
    golden_with_redis(&d, "small");
    let a = d.fork("small", &[]);
    let (id, url) = (a["id"].as_str().unwrap(), redis_url(&a));
    // Its Redis killed (as its memory cgroup would): the reaper starts it again.
    let path = url.split_once('@').unwrap().1;
    let found = Command::new("pgrep").args(["-f", &seen(path)]).output().unwrap();
    let pid = String::from_utf8_lossy(&found.stdout).trim().to_owned();
    Command::new("kill").args(["-9", &pid]).status().unwrap();
    d.wait_for(std::time::Duration::from_secs(20), "its Redis to come back", || {
        redis(&url, &["GET", "greeting"]) == "hello world"
    });
    let events = d.json(&["events", "--sandbox", id]).to_string();
    assert!(events.contains("\"store\":\"redis\""), "{events}");

    // A seed whose data set is past a fork's Redis ceiling (a quarter of the
    // sandbox's memory, 16 MiB here) fails its build: no fork could write to it.
    let seed = d.home.join("big.redis");
    std::fs::write(
        &seed,
        "EVAL \"#!lua flags=allow-oom\\nfor i=1,24 do redis.call('SET', 'k'..i, string.rep('x', 1048576)) end return 1\" 0\n",
    )
    .unwrap();
    let schema = d.home.join("schema.sql");
    let (_, err) = d.fails(&[
        "golden",
        "create",
        "big",
        "--schema",
        schema.to_str().unwrap(),
        "--redis-seed",
        seed.to_str().unwrap(),
    ]);
    assert!(err["message"].as_str().unwrap().contains("more than a sandbox's Redis may hold"), "{err}");
}

#[test]
fn a_listener_planted_at_a_sandboxs_redis_socket_gets_no_credential() {
    use std::io::{Read, Write};
    let d = Daemon::start(&[]);
    golden_with_redis(&d, "planted");
    let a = d.fork("planted", &[]);
    let (id, url) = (a["id"].as_str().unwrap().to_owned(), redis_url(&a));
    let password = url.split_once('@').unwrap().0.rsplit_once(':').unwrap().1.to_owned();
    // The socket's directory is the server's user's: whoever runs as that user
    // may put another listener there (here one of root's, answering anything).
    let path = std::path::PathBuf::from(url.split_once('@').unwrap().1);
    std::fs::remove_file(&path).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let heard = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = heard.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut stream = stream;
            stream.set_read_timeout(Some(std::time::Duration::from_millis(500))).unwrap();
            let mut buf = [0u8; 4096];
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 {
                    break;
                }
                kept.lock().unwrap().extend_from_slice(&buf[..n]);
                let _ = stream.write_all(b"+OK\r\n$10\r\nrogue-data\r\n");
            }
        }
    });
    // The agent's tool, the router and the daemon's own admin work all refuse it.
    let (status, body) =
        d.api("POST", &format!("/v1/sandboxes/{id}/tools/run_redis"), r#"{"command": ["GET", "greeting"]}"#);
    assert_ne!(status, 200, "{body}");
    assert!(!body.contains("rogue-data"), "{body}");
    let routed = a["redis_url"].as_str().unwrap();
    assert!(!via_router(routed, &[], &["GET", "greeting"]).contains("rogue-data"));
    let (_, err) = d.fails(&["suspend", &id]);
    assert!(err["message"].as_str().unwrap().contains("not the instance's user"), "{err}");
    std::thread::sleep(std::time::Duration::from_millis(200));
    let heard = String::from_utf8_lossy(&heard.lock().unwrap()).into_owned();
    assert!(
        !heard.contains(&password) && !heard.contains("AUTH"),
        "a credential reached the listener: {heard}"
    );
}

/// A sandbox's Redis socket as its server names it in its command line: a
/// contained server sees its instance directory under a path of its own, so
/// from the sandbox's id on.
fn seen(socket: &str) -> String {
    let parts: Vec<&str> = socket.rsplitn(4, '/').collect();
    format!("/{}/{}/{}", parts[2], parts[1], parts[0])
}

/// The pid of the `redis-server` serving socket URL `url`.
fn redis_pid(url: &str) -> Option<String> {
    let path = url.split_once('@').unwrap().1;
    let found = Command::new("pgrep").args(["-f", &seen(path)]).output().unwrap();
    let pid = String::from_utf8_lossy(&found.stdout).trim().to_owned();
    (!pid.is_empty()).then_some(pid)
}

#[test]
fn a_golden_of_redis_alone_forks_sandboxes_that_run_no_postgres() {
    let mut d = Daemon::start(&[]);
    let seed = d.home.join("kv.redis");
    std::fs::write(&seed, "SET greeting hello\nHSET user:1 name ada\n").unwrap();
    let seed = seed.to_str().unwrap();
    let g = d.json(&["golden", "create", "kv", "--redis-seed", seed]);
    let m = &g["generations"][0];
    assert_eq!(m["source"]["kind"], "redis_only", "{g}");
    assert_eq!(m["postgres_major"], 0, "{g}");
    assert_eq!(m["redis"]["keys"], 2, "{g}");
    assert!(m["size_bytes"].as_u64().unwrap() > 0, "the RDB's size: {g}");
    assert!(d.ok(&["golden", "show", "kv"]).contains("none (Redis only)"));
    // A PostgreSQL major needs a PostgreSQL source; no source at all is refused.
    let (_, err) = d.fails(&["golden", "create", "kv2", "--redis-seed", seed, "--postgres", "15"]);
    assert_eq!(err["code"], "invalid_request", "{err}");
    let (_, err) = d.fails(&["golden", "create", "nothing"]);
    assert!(err["message"].as_str().unwrap().contains("no source"), "{err}");

    let a = d.fork("kv", &[]);
    let id = a["id"].as_str().unwrap().to_owned();
    assert!(a["dsn"].is_null() && a["socket_dsn"].is_null(), "no PostgreSQL to reach: {a}");
    let url = redis_url(&a);
    assert_eq!(redis(&url, &["GET", "greeting"]), "hello");
    assert!(a["redis_url"].as_str().is_some_and(|u| u.contains(&id)), "{a}");
    let running = Command::new("pgrep").args(["-f", &format!("{id}/pgdata")]).output().unwrap();
    assert!(running.stdout.is_empty(), "no postgres runs for it");
    let (_, err) = d.fails(&["dsn", &id]);
    assert!(err["message"].as_str().unwrap().contains("no PostgreSQL"), "{err}");
    assert_eq!(d.ok(&["dsn", &id, "--redis"]).trim(), a["redis_url"].as_str().unwrap());
    // Without --json, a fork prints what reaches it: its Redis URL.
    let printed = d.ok(&["fork", "kv"]);
    assert!(printed.trim().starts_with("rediss://sb-"), "{printed}");

    // Its credential at the PostgreSQL port is told why, and nothing more.
    let password = url.strip_prefix("unix://").unwrap().split_once('@').unwrap().0.split_once(':').unwrap().1;
    let routed = format!("postgresql://airlock_agent:{password}@{}/{id}?sslmode=disable", d.router);
    let refused = crate::harness::psql(&routed, "SELECT 1").unwrap_err();
    assert!(refused.contains("has no PostgreSQL"), "{refused}");

    // The agent's tools: Redis ones only.
    let (status, body) =
        d.api("POST", &format!("/v1/sandboxes/{id}/tools/run_sql"), r#"{"sql": "SELECT 1"}"#);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("no PostgreSQL"), "{body}");
    let r = tool(&d, &id, "describe_schema", serde_json::json!({}));
    assert!(r["text"].as_str().unwrap().contains("Redis: 2 keys"), "{r}");
    tool(&d, &id, "run_redis", serde_json::json!({"command": ["SET", "progress", "step 1"]}));
    let r = tool(&d, &id, "changes_since_fork", serde_json::json!({}));
    let text = r["text"].as_str().unwrap();
    assert!(text.contains("No PostgreSQL") && text.contains("Redis keys: 2 -> 3"), "{text}");

    // exec gets REDIS_URL and no DATABASE_URL.
    let script =
        "echo \"db=${DATABASE_URL:-none}\"; redis-cli -u \"$REDIS_URL\" --no-auth-warning GET progress";
    let out = d.exec(&id, script, "20s");
    assert_eq!(out["stdout"].as_str().unwrap().trim(), "db=none\nstep 1", "{out}");

    // Suspend saves and stops it; wake starts it from there.
    d.ok(&["suspend", &id]);
    assert!(redis_pid(&url).is_none(), "its Redis stopped");
    d.ok(&["wake", &id]);
    assert_eq!(redis(&url, &["GET", "progress"]), "step 1");

    // A branch takes its Redis; each goes its own way after.
    let b = d.json(&["branch", &id]);
    assert!(b["dsn"].is_null(), "{b}");
    assert_eq!(redis(&redis_url(&b), &["GET", "progress"]), "step 1");
    assert_eq!(redis(&redis_url(&b), &["SET", "progress", "branch"]), "OK");
    assert_eq!(redis(&url, &["GET", "progress"]), "step 1");

    // Killed, it comes back (from what it last saved) and the sandbox lives on.
    let pid = redis_pid(&url).expect("its Redis runs");
    Command::new("kill").args(["-9", &pid]).status().unwrap();
    d.wait_for(std::time::Duration::from_secs(20), "its Redis to come back", || {
        redis(&url, &["GET", "greeting"]) == "hello"
    });
    assert_eq!(d.json(&["show", &id])["state"], "running");

    // The daemon killed and started again keeps it, and its Redis answers.
    d.kill9();
    Command::new("kill").args(["-9", &redis_pid(&url).unwrap()]).status().unwrap();
    d.spawn();
    assert_eq!(d.json(&["show", &id])["state"], "running");
    d.wait_for(std::time::Duration::from_secs(20), "its Redis after the restart", || {
        redis(&url, &["GET", "greeting"]) == "hello"
    });

    // Reset puts the golden's keys back.
    assert_eq!(redis(&url, &["SET", "scratch", "x"]), "OK");
    d.ok(&["reset", &id]);
    assert_eq!(redis(&url, &["EXISTS", "scratch"]), "0");
    assert_eq!(redis(&url, &["GET", "greeting"]), "hello");

    // Pool members of a Redis-only golden are ready Redis servers.
    d.json(&["golden", "pool", "kv", "--size", "1"]);
    d.wait_for(std::time::Duration::from_secs(30), "a pool member", || {
        d.json(&["golden", "show", "kv"])["pooled"] == 1
    });
    let c = d.fork("kv", &["--mode", "readonly"]);
    let events = d.json(&["events", "--sandbox", c["id"].as_str().unwrap()]).to_string();
    assert!(events.contains("\"from_pool\":true"), "{events}");
    assert!(redis(&redis_url(&c), &["SET", "k", "v"]).contains("NOPERM"));
    assert_eq!(redis(&redis_url(&c), &["GET", "greeting"]), "hello");

    // Promote keeps it Redis-only; it cannot become a generation of a golden
    // with PostgreSQL, and has no migrations to test.
    assert_eq!(redis(&url, &["SET", "progress", "promoted"]), "OK");
    let p = d.json(&["promote", &id, "--golden", "kv-next"]);
    assert_eq!(p["generations"][0]["postgres_major"], 0, "{p}");
    let e = d.fork("kv-next", &[]);
    assert_eq!(redis(&redis_url(&e), &["GET", "progress"]), "promoted");
    d.shop("shop");
    let (_, err) = d.fails(&["promote", &id, "--golden", "shop"]);
    assert!(err["message"].as_str().unwrap().contains("has a PostgreSQL part"), "{err}");
    let migration = d.home.join("m.sql");
    std::fs::write(&migration, "CREATE TABLE t (id int);\n").unwrap();
    let (_, err) = d.fails(&["migrate", "test", "--golden", "kv", migration.to_str().unwrap()]);
    assert!(err["message"].as_str().unwrap().contains("no PostgreSQL part"), "{err}");

    // Delete takes its Redis with it.
    d.ok(&["rm", &id]);
    assert!(redis_pid(&url).is_none(), "its Redis is gone");
}

/// `redis-cli` on a sandbox's socket URL, left running in the background.
fn spawn_redis(url: &str, args: &[&str]) -> std::process::Child {
    let rest = url.strip_prefix("unix://").unwrap();
    let (auth, path) = rest.split_once('@').unwrap();
    let (user, password) = auth.split_once(':').unwrap();
    Command::new("redis-cli")
        .args(["-s", path, "--no-auth-warning", "--user", user])
        .args(args)
        .env("REDISCLI_AUTH", password)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn a_runaway_script_is_stopped_and_a_redis_in_use_is_never_suspended() {
    let d = Daemon::start(&[]);
    golden_with_redis(&d, "busy");
    let a = d.fork("busy", &["--idle-suspend", "2s"]);
    let id = a["id"].as_str().unwrap().to_owned();

    // A client holding a connection on the socket keeps the sandbox from idle
    // suspend; once it leaves, the sandbox is suspended.
    let mut subscriber = spawn_redis(&redis_url(&a), &["SUBSCRIBE", "news"]);
    std::thread::sleep(std::time::Duration::from_secs(5));
    assert_eq!(d.json(&["show", &id])["state"], "running", "suspended under an open Redis connection");
    subscriber.kill().unwrap();
    subscriber.wait().unwrap();
    d.wait_for(std::time::Duration::from_secs(20), "the idle suspend", || {
        d.json(&["show", &id])["state"] == "suspended"
    });

    // A script that never ends is killed once Redis calls itself busy...
    let b = d.fork("busy", &[]);
    let (id, url) = (b["id"].as_str().unwrap().to_owned(), redis_url(&b));
    let mut spinner = spawn_redis(&url, &["EVAL", "while true do end", "0"]);
    d.wait_for(std::time::Duration::from_secs(30), "the script to be killed", || {
        d.json(&["events", "--sandbox", &id]).to_string().contains("script_killed")
    });
    spinner.wait().unwrap();
    assert_eq!(redis(&url, &["GET", "greeting"]), "hello world");
    // ...and one that has written, which Redis will not kill, ends with its
    // server, which starts again from what it last saved.
    let mut writer = spawn_redis(&url, &["EVAL", "redis.call('SET', 'half', 'done') while true do end", "0"]);
    d.wait_for(std::time::Duration::from_secs(40), "the server to be stopped and started", || {
        let events = d.json(&["events", "--sandbox", &id]).to_string();
        events.contains("server_stopped") && redis(&url, &["GET", "greeting"]) == "hello world"
    });
    writer.wait().unwrap();
    assert_eq!(redis(&url, &["EXISTS", "half"]), "0");
}

#[test]
fn a_pool_member_whose_redis_died_is_replaced_not_handed_out() {
    let d = Daemon::start(&[]);
    golden_with_redis(&d, "pooled");
    d.json(&["golden", "pool", "pooled", "--size", "1"]);
    let pooled = |d: &Daemon| d.json(&["golden", "show", "pooled"])["pooled"] == 1;
    d.wait_for(std::time::Duration::from_secs(30), "a pool member", || pooled(&d));
    let member = d.pooled_ids()[0].clone();
    let found = Command::new("pgrep").args(["-f", &format!("{member}/run/redis.sock")]).output().unwrap();
    let pid = String::from_utf8_lossy(&found.stdout).trim().to_owned();
    assert!(!pid.is_empty(), "the member's Redis runs");
    Command::new("kill").args(["-9", &pid]).status().unwrap();
    d.wait_for(std::time::Duration::from_secs(30), "the member to be replaced", || {
        d.pooled_ids().first().is_some_and(|id| *id != member) && pooled(&d)
    });
    let a = d.fork("pooled", &[]);
    assert_eq!(redis(&redis_url(&a), &["GET", "greeting"]), "hello world");
}

#[test]
fn a_redis_stuck_in_one_call_is_stopped_and_its_log_stays_bounded() {
    let d = Daemon::start(&["--memory-limit", "64M"]);
    golden_with_redis(&d, "stuck");
    let a = d.fork("stuck", &[]);
    let (id, url) = (a["id"].as_str().unwrap().to_owned(), redis_url(&a));
    let pid = redis_pid(&url).expect("its Redis runs");
    // Every file it writes is bounded by the sandbox's memory (4 x 16 MiB of
    // maxmemory) and 64 MiB.
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max file size")).unwrap().to_owned();
    assert!(line.contains(&(128u64 << 20).to_string()), "{line}");

    // A script can write its server's log at will; past 16 MiB it is emptied.
    let log = d.home.join("volume/sandboxes").join(&id).join("redis.log");
    let flood = "for i = 1, 40000 do redis.log(redis.LOG_WARNING, string.rep('A', 1000)) end return 1";
    assert_eq!(redis(&url, &["EVAL", flood, "0"]), "1");
    d.wait_for(std::time::Duration::from_secs(10), "the log to be emptied", || {
        std::fs::metadata(&log).is_ok_and(|m| m.len() < 16 << 20)
    });

    // A pattern match that backtracks for minutes runs inside one C call,
    // which no SCRIPT KILL reaches: the server answers nothing, and is stopped
    // and started again.
    let mut stuck = spawn_redis(
        &url,
        &["EVAL", "return string.find(string.rep('a', 60), string.rep('a*', 8) .. 'b')", "0"],
    );
    d.wait_for(std::time::Duration::from_secs(40), "the stuck server to be stopped and started", || {
        let events = d.json(&["events", "--sandbox", &id]).to_string();
        events.contains("answered nothing") && redis(&url, &["GET", "greeting"]) == "hello world"
    });
    stuck.wait().unwrap();
    assert_ne!(redis_pid(&url), Some(pid));
}

/// Whatever a client of a sandbox's Redis may ask it (its configuration, every
/// section of its info, its clients, its commands' own docs), no answer names
/// a path of the host; and no command forks a copy of the server out of the
/// script watch's reach.
#[test]
fn a_sandboxs_redis_names_nothing_of_the_host_and_forks_no_copy_of_itself() {
    let d = Daemon::start(&[]);
    golden_with_redis(&d, "paths");
    let a = d.fork("paths", &[]);
    let (id, url) = (a["id"].as_str().unwrap(), redis_url(&a));
    let home = d.home.display().to_string();
    let volume = d.home.parent().unwrap().display().to_string();
    let mut said = String::new();
    for command in [
        vec!["CONFIG", "GET", "*"],
        vec!["INFO", "everything"],
        vec!["CLIENT", "LIST"],
        vec!["CLIENT", "INFO"],
        vec!["MEMORY", "DOCTOR"],
        vec!["LATENCY", "DOCTOR"],
        vec!["SLOWLOG", "GET"],
        vec!["ACL", "WHOAMI"],
    ] {
        let answer = redis(&url, &command);
        let through_tool = tool(&d, id, "run_redis", serde_json::json!({"command": command})).to_string();
        said.push_str(&format!("{command:?}: {answer}\n{through_tool}\n"));
    }
    assert!(said.contains("maxmemory"), "the configuration was read: {said}");
    // Without root there is no root of its own to show the server at
    // (docs/SECURITY.md, "Without root").
    let root = nix::unistd::geteuid().is_root();
    if root {
        for host in [home.as_str(), volume.as_str(), "/var/lib", "sandboxes/", "staging/"] {
            assert!(!said.contains(host), "{host} is named:\n{said}");
        }
        let listed = redis(&url, &["CONFIG", "GET", "dir"]);
        assert!(listed.contains("/airlock/") && listed.contains(id), "{listed}");
    }
    // A debugging session forks the server: refused.
    let debug = redis(&url, &["SCRIPT", "DEBUG", "YES"]);
    assert!(debug.contains("NOPERM"), "{debug}");
    let r = tool(&d, id, "run_redis", serde_json::json!({"command": ["SCRIPT", "DEBUG", "SYNC"]}));
    assert_eq!(r["is_error"], true, "{r}");
    if !root {
        return; // (No cgroup to find a fork in.)
    }
    // Should the server fork anyway (here the admin's slow BGSAVE stands in
    // for any way to), the script watch kills the copy.
    let dir = d.home.join("volume/sandboxes").join(id);
    let admin = std::fs::read_to_string(dir.join("redis.admin")).unwrap();
    let socket = dir.join("run/redis.sock");
    let as_admin = |args: &[&str]| redis_as(socket.to_str().unwrap(), Some(("airlock", admin.trim())), args);
    let server: i32 = redis_pid(&url).expect("the server's pid").parse().unwrap();
    assert_eq!(as_admin(&["CONFIG", "SET", "rdb-key-save-delay", "2000000"]), "OK");
    assert!(as_admin(&["BGSAVE"]).contains("started"), "no background save");
    let children = || -> Vec<i32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/stat")).ok().is_some_and(|s| {
                    s.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().nth(1)?.parse().ok())
                        == Some(server)
                })
            })
            .collect()
    };
    d.wait_for(std::time::Duration::from_secs(10), "the server's fork to be killed", || {
        children().is_empty()
    });
    let events = d.json(&["events", "--sandbox", id]);
    assert!(events.to_string().contains("fork_killed"), "{events}");
}

#[test]
fn without_its_daemon_the_redis_port_keeps_expiry_too() {
    use std::io::{Read, Write};
    let mut d = Daemon::start(&[]);
    golden_with_redis(&d, "short");
    let sb = d.fork("short", &["--ttl", "5s"]);
    let url = sb["redis_url"].as_str().unwrap().to_owned();
    let (auth, _) = url.split_once("://").unwrap().1.rsplit_once('@').unwrap();
    let (user, password) = auth.split_once(':').unwrap();
    let login = format!("AUTH {user} {password}\r\n");
    let door = d.redis_router.clone();
    let open = || {
        let mut c = std::net::TcpStream::connect(&door).unwrap();
        c.set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
        c.write_all(login.as_bytes()).unwrap();
        let mut answer = [0u8; 64];
        let n = c.read(&mut answer).unwrap_or(0);
        (c, String::from_utf8_lossy(&answer[..n]).into_owned())
    };
    let (mut held, said) = open();
    assert_eq!(said, "+OK\r\n");
    d.kill9();
    // At its expiry the open session is cut, and the credential is refused.
    let began = std::time::Instant::now();
    let mut buf = [0u8; 64];
    let read = held.read(&mut buf);
    assert!(matches!(read, Ok(0) | Err(_)), "the session outlived its sandbox's expiry: {read:?}");
    assert!(began.elapsed() < std::time::Duration::from_secs(15));
    let (_, said) = open();
    assert!(said.starts_with("-WRONGPASS"), "{said}");
    d.spawn();
}

/// What a raw client connected to the router's Redis port at `addr`, as the
/// sandbox named in `url`, reads back for `commands` sent at once, up to the
/// server's end of stream.
fn pipelined(addr: &str, url: &str, commands: &[Vec<u8>]) -> Vec<u8> {
    use std::io::{Read, Write};
    let auth = url.split_once("://").unwrap().1.rsplit_once('@').unwrap().0;
    let (user, password) = auth.split_once(':').unwrap();
    let mut tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
    let mut all = airlock_redis::resp::command(&["AUTH", user, password]);
    for c in commands {
        all.extend_from_slice(c);
    }
    // Written while the replies are read, as a pipelining client does.
    let mut writer = tcp.try_clone().unwrap();
    let sending = std::thread::spawn(move || {
        let _ = writer.write_all(&all);
        let _ = writer.shutdown(std::net::Shutdown::Write);
    });
    let mut replies = Vec::new();
    let _ = tcp.read_to_end(&mut replies);
    sending.join().unwrap();
    replies
}

#[test]
fn a_command_over_the_size_limit_gets_an_error_reply_in_its_place() {
    let d = Daemon::start(&[]);
    golden_with_redis(&d, "sized");
    let a = d.fork("sized", &[]);
    let url = a["redis_url"].as_str().unwrap().to_owned();
    let limit = airlock_redis::server::MAX_COMMAND as usize;
    let cmd = |args: &[&[u8]]| airlock_redis::resp::command(args);
    let set_of = |n: usize| cmd(&[b"SET", b"big", &vec![b'v'; n]]);
    // The largest SET that fits: the command is the limit to the byte.
    // (A value's length takes seven digits from 1,000,000 to past the limit.)
    let fits = limit - (set_of(1_000_000).len() - 1_000_000);
    assert_eq!(set_of(fits).len(), limit);

    // At the limit: taken, and the session goes on.
    let replies = pipelined(&d.redis_router, &url, &[set_of(fits), cmd(&[b"STRLEN", b"big"])]);
    assert_eq!(String::from_utf8_lossy(&replies), format!("+OK\r\n+OK\r\n:{fits}\r\n"));

    // One byte over: refused in its place, in order, and the session goes
    // on, in a transaction too (which the refusal aborts, as any error would).
    let replies = pipelined(
        &d.redis_router,
        &url,
        &[
            cmd(&[b"SET", b"before", b"1"]),
            set_of(fits + 1),
            cmd(&[b"SET", b"after", b"1"]),
            cmd(&[b"MULTI"]),
            cmd(&[b"SET", b"in-multi", b"1"]),
            set_of(fits + 1),
            cmd(&[b"EXEC"]),
        ],
    );
    let text = String::from_utf8_lossy(&replies);
    let lines: Vec<&str> = text.split("\r\n").collect();
    assert_eq!(lines.len(), 9, "{text}");
    assert_eq!(&lines[..2], ["+OK", "+OK"], "{text}");
    assert!(lines[2].starts_with("-ERR command too large: 8.0 MB, over the 8 MB"), "{text}");
    assert!(!lines[2].contains("closed") && !text.contains("airlock-refused"), "{text}");
    assert_eq!(&lines[3..6], ["+OK", "+OK", "+QUEUED"], "{text}");
    assert!(lines[6].starts_with("-ERR command too large") && lines[7].starts_with("-EXECABORT"), "{text}");
    // Several arguments, each on its way before the one that goes over:
    // the command cannot be taken back, so the session ends with the error.
    let half = vec![b'v'; limit / 2];
    let replies = pipelined(&d.redis_router, &url, &[cmd(&[b"MSET", b"x", &half, b"y", &half])]);
    let text = String::from_utf8_lossy(&replies);
    assert!(
        text.contains("-ERR command too large") && text.ends_with("The connection is closed.\r\n"),
        "{text}"
    );
    // A 40 MB value, far over what the server's clients may hold together.
    let replies = pipelined(&d.redis_router, &url, &[set_of(40 << 20), cmd(&[b"PING"])]);
    let text = String::from_utf8_lossy(&replies);
    assert!(text.contains("-ERR command too large: 40.0 MB") && text.ends_with("+PONG\r\n"), "{text}");

    // A header Redis reads though it ends oddly (a CR and any byte) keeps
    // the commands after it judged.
    let mut odd = b"*1\r\n$4\rXPING\r\n".to_vec();
    odd.extend_from_slice(&set_of(fits + 1));
    let replies = pipelined(&d.redis_router, &url, &[odd]);
    let text = String::from_utf8_lossy(&replies);
    assert!(text.starts_with("+OK\r\n+PONG\r\n-ERR command too large"), "{text}");
    // A server held from answering (a client blocked in BLPOP) does not hold
    // the router: a command that broke the session is refused all the same,
    // and the session ends.
    let began = std::time::Instant::now();
    let replies = pipelined(
        &d.redis_router,
        &url,
        &[cmd(&[b"BLPOP", b"nothing", b"0"]), cmd(&[b"MSET", b"x", &half, b"y", &half])],
    );
    assert!(String::from_utf8_lossy(&replies).contains("-ERR command too large"), "{replies:?}");
    assert!(began.elapsed() < std::time::Duration::from_secs(30), "{:?}", began.elapsed());

    assert_eq!(via_router(&url, &[], &["GET", "before"]), "1");
    assert_eq!(via_router(&url, &[], &["GET", "after"]), "1", "what came after a refusal in place ran");
    assert_eq!(via_router(&url, &[], &["EXISTS", "in-multi", "x", "y"]), "0");
    assert_eq!(
        via_router(&url, &[], &["STRLEN", "big"]),
        fits.to_string(),
        "the refused SET changed nothing"
    );

    // redis-cli, with the value from its standard input, says the same.
    let file = d.home.join("big-value");
    std::fs::write(&file, vec![b'v'; limit]).unwrap();
    let rest = url.split_once("://").unwrap().1;
    let (auth, addr) = rest.rsplit_once('@').unwrap();
    let (user, password) = auth.split_once(':').unwrap();
    let (host, port) = addr.rsplit_once(':').unwrap();
    let out = Command::new("sh")
        .args([
            "-c",
            "redis-cli -h \"$1\" -p \"$2\" --user \"$3\" --no-auth-warning -x SET big < \"$4\"",
            "sh",
        ])
        .args([host, port, user, file.to_str().unwrap()])
        .env("REDISCLI_AUTH", password)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("ERR command too large"), "{said}");

    // Redis itself refuses any one argument over the limit, for code inside
    // the sandbox that reaches it without the router.
    let dir = d.home.join("volume").join("sandboxes").join(a["id"].as_str().unwrap());
    let conf = std::fs::read_to_string(dir.join("redis.conf")).unwrap_or_default();
    assert!(conf.contains(&format!("proto-max-bulk-len {limit}")), "{conf}");
}

#[test]
fn a_flood_inside_exec_holds_a_bounded_share_of_the_daemons_descriptors() {
    let d = Daemon::start(&[]);
    golden_with_redis(&d, "cache");
    let sb = d.fork("cache", &[]);
    let id = sb["id"].as_str().unwrap();
    let fds = || std::fs::read_dir(format!("/proc/{}/fd", d.pid())).unwrap().count();
    let before = fds();
    // 1000 connections held open to the loopback door while counting: the
    // door relays at most 256 at once, and the server takes no more.
    let flood = r#"python3 - <<'PY'
import socket, time
held = []
for _ in range(1000):
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect(("127.0.0.1", 6379))
        held.append(s)
    except OSError:
        pass
time.sleep(4)
PY"#;
    let child = d.spawn_cli_output(&["exec", id, "--timeout", "30s", "--", "bash", "-c", flood]);
    std::thread::sleep(std::time::Duration::from_secs(3));
    let during = fds();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        during < before + 2 * 256 + 64,
        "the daemon held {during} descriptors, {before} before the flood"
    );
    // The daemon still answers, and the door still serves the next exec.
    let ran = d.exec(id, "redis-cli -u \"$REDIS_URL\" --no-auth-warning PING", "30s");
    assert_eq!(ran["stdout"].as_str().unwrap().trim(), "PONG", "{ran}");
}
