//! A cluster on this machine: a real etcd, and three nodes, each a daemon in
//! a network namespace of its own joined to the others by a bridge the test
//! makes, each with its own data root and addresses.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::*;

/// The lease TTL the nodes run with: short, so a lost node shows quickly.
const LEASE: Duration = Duration::from_secs(3);

/// A bridge, a namespace per node, and an etcd on the bridge; all removed on drop.
struct Net {
    bridge: String,
    subnet: u32,
    spaces: Vec<String>,
    /// Each etcd member's process while it runs.
    etcd: Vec<Option<Child>>,
    etcd_dir: PathBuf,
    /// With TLS: the directory of etcd's CA, its server certificate, and a
    /// client certificate for the test's own calls ([`issue`]).
    tls: Option<PathBuf>,
}

/// Runs openssl; panics with its output when it fails.
fn openssl(args: &[&str]) {
    let out = Command::new("openssl").args(args).output().expect("openssl runs");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A CA in `dir` (`ca.crt`, `ca.key`).
fn make_ca(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let (crt, key) = (dir.join("ca.crt"), dir.join("ca.key"));
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=etcd test CA",
        "-keyout",
        key.to_str().unwrap(),
        "-out",
        crt.to_str().unwrap(),
    ]);
}

/// A certificate `NAME.crt` (and `NAME.key`) in `out`, signed by the CA in
/// `ca`: for a server at IP `ip`, or a client when `ip` is None. (etcd's
/// JSON gateway calls etcd itself with the server's certificate, so that one
/// is a client's too.)
fn issue(ca: &Path, out: &Path, name: &str, ip: Option<&str>) -> (PathBuf, PathBuf) {
    std::fs::create_dir_all(out).unwrap();
    let (crt, key, csr, ext) = (
        out.join(format!("{name}.crt")),
        out.join(format!("{name}.key")),
        out.join(format!("{name}.csr")),
        out.join(format!("{name}.ext")),
    );
    let extensions = match ip {
        Some(ip) => format!("subjectAltName=IP:{ip}\nextendedKeyUsage=serverAuth,clientAuth\n"),
        None => "extendedKeyUsage=clientAuth\n".to_owned(),
    };
    std::fs::write(&ext, extensions).unwrap();
    openssl(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-subj",
        &format!("/CN={name}"),
        "-keyout",
        key.to_str().unwrap(),
        "-out",
        csr.to_str().unwrap(),
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        csr.to_str().unwrap(),
        "-CA",
        ca.join("ca.crt").to_str().unwrap(),
        "-CAkey",
        ca.join("ca.key").to_str().unwrap(),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        ext.to_str().unwrap(),
        "-out",
        crt.to_str().unwrap(),
    ]);
    (crt, key)
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip runs");
    assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

impl Net {
    fn new(nodes: &[&str]) -> Net {
        Net::with_members(nodes, 1, false)
    }

    /// A net whose etcd has `members` members; served over TLS, with client
    /// certificates required, when `tls`.
    fn with_members(nodes: &[&str], members: usize, tls: bool) -> Net {
        // A subnet is this test's once it has made the subnet's bridge: tests
        // run at once in other processes, so one taken is passed over, never
        // removed (a bridge left by a killed run just stays out of use).
        let first = (std::process::id() + counter()) % 200;
        let (subnet, bridge) = (0..200)
            .map(|k| 20 + (first + k) % 200)
            .map(|subnet| (subnet, format!("alb{subnet}")))
            .find(|(_, bridge)| {
                Command::new("ip")
                    .args(["link", "add", bridge, "type", "bridge"])
                    .output()
                    .is_ok_and(|o| o.status.success())
            })
            .expect("a free subnet for the test's bridge");
        ip(&["addr", "add", &format!("10.231.{subnet}.1/24"), "dev", &bridge]);
        ip(&["link", "set", &bridge, "up"]);
        let mut spaces = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            let ns = format!("al{subnet}{node}");
            let veth = format!("alv{subnet}{node}");
            // The subnet is ours: what a killed run left under its names goes.
            let _ = Command::new("ip").args(["netns", "del", &ns]).output();
            let _ = Command::new("ip").args(["link", "del", &veth]).output();
            ip(&["netns", "add", &ns]);
            ip(&["link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns]);
            ip(&["link", "set", &veth, "master", &bridge, "up"]);
            ip(&["-n", &ns, "addr", "add", &format!("10.231.{subnet}.{}/24", 11 + i), "dev", "eth0"]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            spaces.push(ns);
        }
        let etcd_dir = plain_base().join(format!("etcd-{}-{}", std::process::id(), counter()));
        let tls = tls.then(|| {
            let dir = etcd_dir.join("tls");
            make_ca(&dir);
            issue(&dir, &dir, "server", Some(&format!("10.231.{subnet}.1")));
            issue(&dir, &dir, "test", None);
            dir
        });
        let mut net =
            Net { bridge, subnet, spaces, etcd: (0..members).map(|_| None).collect(), etcd_dir, tls };
        for k in 0..members {
            net.start_member(k, false);
        }
        for k in 0..members {
            net.wait_member(k);
        }
        net
    }

    fn host(&self) -> String {
        format!("10.231.{}.1", self.subnet)
    }

    /// The address node `i` advertises to its peers.
    fn advertise(&self, i: usize) -> String {
        format!("10.231.{}.{}:7440", self.subnet, 11 + i)
    }

    /// Member `k`'s client URL.
    fn member_url(&self, k: usize) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}:{}", self.host(), 2379 + 10 * k)
    }

    /// A call of etcd's JSON gateway (`v3/kv/CALL`) on the first member, with `body`.
    fn etcd(&self, call: &str, body: &str) -> std::process::Output {
        let url = format!("{}/v3/kv/{call}", self.member_url(0));
        self.curl_etcd().args(["-s", "-X", "POST", "-d", body, &url]).output().unwrap()
    }

    /// curl, with the test's own client certificate when etcd asks for one.
    fn curl_etcd(&self) -> Command {
        let mut curl = Command::new("curl");
        if let Some(dir) = &self.tls {
            curl.arg("--cacert").arg(dir.join("ca.crt"));
            curl.arg("--cert").arg(dir.join("test.crt")).arg("--key").arg(dir.join("test.key"));
        }
        curl
    }

    /// Every member's client URL, as `--cluster` takes them.
    fn etcd_url(&self) -> String {
        (0..self.etcd.len()).map(|k| self.member_url(k)).collect::<Vec<_>>().join(",")
    }

    fn peer_url(&self, k: usize) -> String {
        format!("http://127.0.0.1:{}", 23800 + 10 * self.subnet + k as u32)
    }

    /// Starts member `k` (again, keeping its data, when `again`).
    fn start_member(&mut self, k: usize, again: bool) {
        let client = self.member_url(k);
        let peer = self.peer_url(k);
        let initial =
            (0..self.etcd.len()).map(|j| format!("m{j}={}", self.peer_url(j))).collect::<Vec<_>>().join(",");
        let mut cmd = Command::new("etcd");
        cmd.args(["--name", &format!("m{k}"), "--data-dir"])
            .arg(self.etcd_dir.join(format!("m{k}")))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial, "--initial-cluster-token", &format!("t{}", self.subnet)])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if again {
            cmd.args(["--initial-cluster-state", "existing"]);
        }
        if let Some(dir) = &self.tls {
            cmd.arg("--cert-file").arg(dir.join("server.crt")).arg("--key-file").arg(dir.join("server.key"));
            cmd.arg("--client-cert-auth").arg("--trusted-ca-file").arg(dir.join("ca.crt"));
        }
        self.etcd[k] = Some(cmd.spawn().expect("etcd runs (Debian's etcd-server)"));
    }

    fn wait_member(&self, k: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let health = format!("{}/health", self.member_url(k));
        while !self.curl_etcd().args(["-sf", "--max-time", "1", &health]).output().unwrap().status.success() {
            assert!(Instant::now() < deadline, "etcd member {k} did not answer");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn stop_member(&mut self, k: usize) {
        if let Some(mut c) = self.etcd[k].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The member that leads now.
    fn leader(&self) -> usize {
        (0..self.etcd.len())
            .find(|k| {
                let url = format!("{}/v3/maintenance/status", self.member_url(*k));
                let out = self
                    .curl_etcd()
                    .args(["-s", "--max-time", "2", "-X", "POST", "-d", "{}", &url])
                    .output()
                    .unwrap();
                let status: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
                status["leader"].is_string() && status["leader"] == status["header"]["member_id"]
            })
            .expect("a leader")
    }

    /// Starts a one-member etcd again, with its data.
    fn start_etcd(&mut self) {
        self.start_member(0, true);
        self.wait_member(0);
    }

    fn stop_etcd(&mut self) {
        for k in 0..self.etcd.len() {
            self.stop_member(k);
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.stop_etcd();
        for ns in &self.spaces {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        let _ = Command::new("ip").args(["link", "del", &self.bridge]).output();
        let _ = std::fs::remove_dir_all(&self.etcd_dir);
    }
}

/// Runs the CLI on a data root with no daemon (cluster files only).
fn offline(home: &Path, args: &[&str]) -> Value {
    let out = Command::new(BIN).args(args).arg("--json").env("AIRLOCK_HOME", home).output().unwrap();
    assert!(
        out.status.success(),
        "airlock {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Issues `node`'s join token with the CA in `home`, written to `out`.
fn issue_token(home: &Path, node: &str, advertise: &str, out: &Path) {
    offline(
        home,
        &["cluster", "token", "--node", node, "--advertise", advertise, "--out", out.to_str().unwrap()],
    );
}

/// A node's daemon, in its namespace, with its cluster flags.
fn node(net: &Net, i: usize, name: &str, join: Option<&Path>, extra: &[&str]) -> Daemon {
    let home = fresh_home(&cow_base().unwrap_or_else(plain_base));
    std::fs::create_dir_all(&home).unwrap();
    node_at(net, i, name, home, join, extra)
}

fn node_at(net: &Net, i: usize, name: &str, home: PathBuf, join: Option<&Path>, extra: &[&str]) -> Daemon {
    let mut args = vec![
        "--cluster".to_string(),
        net.etcd_url(),
        "--node".into(),
        name.into(),
        "--advertise".into(),
        net.advertise(i),
        "--lease-ttl".into(),
        format!("{}s", LEASE.as_secs()),
        "--node-label".into(),
        format!("zone={}", if i == 0 { "east" } else { "west" }),
    ];
    if let Some(token) = join {
        args.push("--join".into());
        args.push(token.to_str().unwrap().into());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut d = Daemon::unstarted(home, &args);
    d.launch_script = Some(format!("exec ip netns exec {} \"$@\"", net.spaces[i]));
    d.spawn();
    d
}

fn names_of(list: &Value) -> Vec<(String, String, String)> {
    let mut v: Vec<(String, String, String)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["id"].as_str().unwrap().to_owned(),
                s["node"].as_str().unwrap_or("").to_owned(),
                s["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    v.sort();
    v
}

/// TLS to a node's peer port from the host, with curl: the status line, or the failure.
fn curl_peer(net: &Net, i: usize, ca: &Path, identity: Option<(&Path, &Path)>) -> Result<String, String> {
    let addr = net.advertise(i);
    let host = addr.split(':').next().unwrap();
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "--max-time", "5", "--cacert"]).arg(ca);
    if let Some((cert, key)) = identity {
        cmd.arg("--cert").arg(cert).arg("--key").arg(key);
    }
    cmd.arg(format!("https://{host}:7440/v1/health"));
    let out = cmd.output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!("curl exit {:?}", out.status.code()))
    }
}

/// A token's certificate and key, written as files for curl.
fn unpack_token(token_file: &Path, dir: &Path) -> (PathBuf, PathBuf) {
    use base64::Engine;
    let text = std::fs::read_to_string(token_file).unwrap();
    let body = text.trim().strip_prefix("airlock-join-1.").unwrap();
    let json: Value =
        serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(body).unwrap())
            .unwrap();
    let (cert, key) = (dir.join("peer.crt"), dir.join("peer.key"));
    std::fs::write(&cert, json["cert"].as_str().unwrap()).unwrap();
    std::fs::write(&key, json["key"].as_str().unwrap()).unwrap();
    (cert, key)
}

#[test]
fn three_nodes_place_forward_and_list_forks_report_a_lost_node_and_refuse_work_without_etcd() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: network namespaces need root");
        return;
    }
    let mut net = Net::new(&["a", "b", "c"]);
    // The CA is made on a's data root; b and c join with tokens issued there.
    let home_a = fresh_home(&cow_base().unwrap_or_else(plain_base));
    std::fs::create_dir_all(&home_a).unwrap();
    let init = offline(&home_a, &["cluster", "init"]);
    assert_eq!(init["fingerprint"].as_str().unwrap().len(), 64);
    let tokens = home_a.join("tokens");
    std::fs::create_dir_all(&tokens).unwrap();
    for (i, name) in [(1, "b"), (2, "c"), (0, "x")] {
        let out = tokens.join(name);
        issue_token(&home_a, name, &net.advertise(i), &out);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&out).unwrap().permissions().mode() & 0o777,
            0o600,
            "a token is a secret"
        );
    }
    let a = node_at(&net, 0, "a", home_a.clone(), None, &["--max-sandboxes", "1"]);
    let b = node(&net, 1, "b", Some(&tokens.join("b")), &[]);
    let c = node(&net, 2, "c", Some(&tokens.join("c")), &[]);
    // A token is one node's: c's token does not make a node named d.
    let mut d = Daemon::unstarted(
        fresh_home(&cow_base().unwrap_or_else(plain_base)),
        &[
            "--cluster",
            &net.etcd_url(),
            "--node",
            "d",
            "--advertise",
            &net.advertise(2),
            "--join",
            tokens.join("c").to_str().unwrap(),
        ],
    );
    let refused = d.serve_fails();
    assert!(refused.contains("node \"c\"'s, not \"d\"'s"), "{refused}");

    // Node-to-node TLS: a peer must show a certificate of the cluster's CA.
    let ca = home_a.join("cluster/ca.crt");
    let (x_cert, x_key) = unpack_token(&tokens.join("x"), &tokens);
    assert!(
        curl_peer(&net, 1, &ca, Some((&x_cert, &x_key))).unwrap().contains("\"ok\":true"),
        "a member's certificate is let in"
    );
    assert!(curl_peer(&net, 1, &ca, None).is_err(), "no client certificate: refused");
    let foreign = plain_base().join(format!("foreign-{}-{}", std::process::id(), counter()));
    std::fs::create_dir_all(&foreign).unwrap();
    offline(&foreign, &["cluster", "init"]);
    let foreign_token = foreign.join("t");
    issue_token(&foreign, "b", &net.advertise(1), &foreign_token);
    let (f_cert, f_key) = unpack_token(&foreign_token, &foreign);
    assert!(
        curl_peer(&net, 1, &ca, Some((&f_cert, &f_key))).is_err(),
        "another CA's certificate, even named b: refused"
    );
    let _ = std::fs::remove_dir_all(&foreign);

    // Goldens on a and b; c holds none, so what it is asked goes elsewhere.
    a.shop("shop");
    b.shop("shop");
    let nodes = c.json(&["nodes"]);
    let listed: Vec<(&str, &str)> = nodes
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["name"].as_str().unwrap(), n["state"].as_str().unwrap()))
        .collect();
    assert_eq!(listed, vec![("a", "up"), ("b", "up"), ("c", "up")], "{nodes}");
    c.wait_for(Duration::from_secs(10), "b to announce its golden", || {
        c.json(&["nodes"])[1]["goldens"]["shop"].as_array().is_some_and(|g| !g.is_empty())
    });
    assert_eq!(nodes[0]["labels"]["zone"], "east");
    assert!(
        nodes[2]["free_memory_bytes"].as_u64().unwrap() > 0
            && nodes[2]["free_disk_bytes"].as_u64().unwrap() > 0
    );

    // Placement: the first fork through a stays on a; a is then full, so the next lands on b.
    let first = a.fork("shop", &["--name", "first"]);
    assert_eq!(first["node"], "a", "{first}");
    let second = a.fork("shop", &[]);
    assert_eq!(second["node"], "b", "a fork through a full node lands on another: {second}");
    let (first_id, second_id) =
        (first["id"].as_str().unwrap().to_owned(), second["id"].as_str().unwrap().to_owned());
    assert!(
        second["dsn"].as_str().is_some_and(|d| d.contains(&second_id)),
        "the answer comes back as if local"
    );
    let third = c.fork("shop", &["--node", "b", "--ttl", "1h"]);
    assert_eq!(third["node"], "b");
    let third_id = third["id"].as_str().unwrap().to_owned();
    let (code, err) = c.fails(&["fork", "shop", "--node-label", "zone=north"]);
    assert_eq!((code, err["code"].as_str().unwrap()), (19, "cluster_unavailable"), "{err}");
    let (_, err) = c.fails(&["fork", "shop", "--name", "first"]);
    assert_eq!(err["code"], "name_taken", "a name is the cluster's: {err}");

    // Every node lists every sandbox, and answers for each one.
    let from_c = names_of(&c.json(&["ls"]));
    let mut want = vec![
        (first_id.clone(), "a".to_string(), "running".to_string()),
        (second_id.clone(), "b".into(), "running".into()),
        (third_id.clone(), "b".into(), "running".into()),
    ];
    want.sort();
    assert_eq!(from_c, want);
    assert_eq!(names_of(&a.json(&["ls"])), want);
    // A key no id or name could be is answered here, never looked up as a record's key.
    let (status, body) = c.api("GET", "/v1/sandboxes/first%2F..%2F..%2Fnodes%2Fa", "");
    assert!(status == 404 && body.contains("sandbox_not_found"), "{status} {body}");
    let shown = c.json(&["show", "first"]);
    assert_eq!(shown["id"], first_id.as_str());
    let (status, body) = c.api(
        "POST",
        &format!("/v1/sandboxes/{second_id}/sql"),
        r#"{"sql":"DELETE FROM orders WHERE id <= 10"}"#,
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = a.api(
        "POST",
        &format!("/v1/sandboxes/{second_id}/sql"),
        r#"{"sql":"SELECT count(*) AS n FROM orders"}"#,
    );
    assert!(status == 200 && body.contains("990"), "the same sandbox from another node: {body}");
    let extended = c.json(&["extend", &second_id, "--ttl", "2h"]);
    assert_eq!(extended["id"], second_id.as_str());
    let exec = c.exec(&second_id, "psql \"$DATABASE_URL\" -Atc 'SELECT count(*) FROM orders'", "30s");
    assert_eq!(exec["stdout"].as_str().unwrap().trim(), "990", "{exec}");
    c.ok(&["rm", &first_id]);
    assert!(a.json(&["ls"]).as_array().unwrap().iter().all(|s| s["id"] != first_id.as_str()));
    // b's records name the node that acted and the door a peer's request came through.
    let events = b.json(&["events", "--sandbox", &second_id]);
    let extend_event =
        events.as_array().unwrap().iter().find(|e| e["kind"] == "extended").expect("an extended event");
    assert_eq!(
        (extend_event["door"].as_str(), extend_event["detail"]["node"].as_str()),
        (Some("peer"), Some("b")),
        "{extend_event}"
    );
    // Any node reads them: c's listing is b's, each event naming b.
    let from_c = c.json(&["events", "--sandbox", &second_id]);
    let kinds: Vec<(&str, &str)> = from_c
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["kind"].as_str().unwrap(), e["detail"]["node"].as_str().unwrap_or("")))
        .collect();
    for kind in ["created", "ready", "extended"] {
        assert!(kinds.contains(&(kind, "b")), "{kind} from c: {kinds:?}");
    }
    let all_from_a = a.json(&["events"]);
    let nodes: std::collections::BTreeSet<&str> =
        all_from_a.as_array().unwrap().iter().filter_map(|e| e["detail"]["node"].as_str()).collect();
    assert!(nodes.contains("a") && nodes.contains("b"), "every node's events, from a: {nodes:?}");

    // b dies: within its lease TTL its sandboxes are lost, said once, and forks go elsewhere.
    let mut b = b;
    b.kill9();
    let killed = Instant::now();
    c.wait_for(LEASE + Duration::from_secs(3), "b's sandboxes to be reported lost", || {
        names_of(&c.json(&["ls"])).iter().filter(|(_, n, s)| n == "b" && s == "lost").count() == 2
    });
    let took = killed.elapsed();
    assert!(took <= LEASE + Duration::from_secs(3), "lost after {took:?}");
    let (code, err) = c.fails(&["show", &second_id]);
    assert_eq!((code, err["code"].as_str().unwrap()), (19, "sandbox_lost"), "{err}");
    let nodes = a.json(&["nodes"]);
    let b_node = nodes.as_array().unwrap().iter().find(|n| n["name"] == "b").unwrap();
    assert_eq!((b_node["state"].as_str(), b_node["sandboxes"].as_u64()), (Some("lost"), Some(2)), "{nodes}");
    // Any node's events are every node's (each names its own): a and c both
    // list the one loss, whichever of them recorded it.
    let lost_events = |n: &Daemon| -> usize {
        n.json(&["events", "--sandbox", &second_id])
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "lost")
            .count()
    };
    c.wait_for(Duration::from_secs(3), "a node to record the loss", || lost_events(&a) > 0);
    std::thread::sleep(LEASE / 2);
    assert_eq!((lost_events(&a), lost_events(&c)), (1, 1), "one node says it, once");
    let elsewhere = c.fork("shop", &[]);
    assert_eq!(elsewhere["node"], "a", "{elsewhere}");

    // b comes back: what it still holds is found again, running, with its TTL.
    b.spawn();
    c.wait_for(Duration::from_secs(15), "b's sandboxes to be back", || {
        names_of(&c.json(&["ls"])).iter().filter(|(_, n, s)| n == "b" && s == "running").count() == 2
    });
    let back = b.json(&["events", "--sandbox", &third_id]);
    assert!(
        back.as_array().unwrap().iter().any(|e| e["kind"] == "reconciled" && e["detail"]["found"] == true),
        "{back}"
    );
    let shown = c.json(&["show", &second_id]);
    assert_eq!(shown["expires_at"], extended["expires_at"], "the TTL held through it");

    // etcd gone: no node takes new work on a view that may be stale; nothing is lost.
    net.stop_etcd();
    a.wait_for(LEASE, "a to stop taking forks", || {
        let out = a.cli(&["fork", "shop", "--json"]);
        out.code == 19 && out.stdout.contains("cluster_unavailable")
    });
    net.start_etcd();
    let before: Vec<String> = names_of(&c.json(&["ls"])).into_iter().map(|(id, _, _)| id).collect();
    a.wait_for(Duration::from_secs(15), "a to take forks again", || {
        a.cli(&["fork", "shop", "--json", "--node", "b"]).code == 0
    });
    let after: Vec<String> = names_of(&c.json(&["ls"])).into_iter().map(|(id, _, _)| id).collect();
    assert!(before.iter().all(|id| after.contains(id)), "no sandbox lost: {before:?} → {after:?}");
    assert!(names_of(&c.json(&["ls"])).iter().all(|(_, _, s)| s == "running"));

    // Two nodes fork one name at the same moment: the name is claimed in etcd
    // before either forks, so exactly one gets it.
    for round in 0..3 {
        let name = format!("racer-{round}");
        let (on_b, on_c) = std::thread::scope(|scope| {
            let on_b = scope.spawn(|| b.cli(&["fork", "shop", "--node", "b", "--name", &name, "--json"]));
            let on_c = scope.spawn(|| c.cli(&["fork", "shop", "--node", "c", "--name", &name, "--json"]));
            (on_b.join().unwrap(), on_c.join().unwrap())
        });
        let won: Vec<_> = [&on_b, &on_c].into_iter().filter(|o| o.code == 0).collect();
        assert_eq!(won.len(), 1, "exactly one fork takes {name}: {on_b:?} {on_c:?}");
        let lost = if on_b.code == 0 { &on_c } else { &on_b };
        assert!(lost.stdout.contains("name_taken"), "{lost:?}");
        let listed = a.json(&["ls"]);
        let holders = listed.as_array().unwrap().iter().filter(|sb| sb["name"] == name.as_str()).count();
        assert_eq!(holders, 1, "{listed}");
    }
    drop((a, b, c));
}

#[test]
fn a_lost_etcd_leader_of_three_or_a_member_restart_during_forks_loses_no_sandbox() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: network namespaces need root");
        return;
    }
    let mut net = Net::with_members(&["a", "b"], 3, false);
    let home_a = fresh_home(&cow_base().unwrap_or_else(plain_base));
    std::fs::create_dir_all(&home_a).unwrap();
    offline(&home_a, &["cluster", "init"]);
    let token = home_a.join("b.token");
    issue_token(&home_a, "b", &net.advertise(1), &token);
    let a = node_at(&net, 0, "a", home_a.clone(), None, &[]);
    let b = node(&net, 1, "b", Some(&token), &[]);
    b.shop("shop");
    let mut made = Vec::new();
    for round in 0..6 {
        if round == 2 {
            // The leader goes while forks go on; the other two elect another.
            let leader = net.leader();
            net.stop_member(leader);
        }
        if round == 4 {
            // Every member back: the one stopped rejoins with its data.
            let stopped = (0..3).find(|k| net.etcd[*k].is_none()).unwrap();
            net.start_member(stopped, true);
            net.wait_member(stopped);
        }
        let started = Instant::now();
        let forked = loop {
            let out = a.cli(&["fork", "shop", "--json"]);
            if out.code == 0 {
                break serde_json::from_str::<Value>(&out.stdout).unwrap();
            }
            assert!(started.elapsed() < Duration::from_secs(15), "forks stopped for good: {out:?}");
            std::thread::sleep(Duration::from_millis(200));
        };
        assert_eq!(forked["node"], "b");
        made.push(forked["id"].as_str().unwrap().to_owned());
    }
    // No node was counted lost, and every sandbox is listed, running, from both nodes.
    std::thread::sleep(LEASE);
    for n in [&a, &b] {
        let listed = names_of(&n.json(&["ls"]));
        assert_eq!(listed.len(), made.len(), "{listed:?}");
        assert!(
            listed.iter().all(|(id, node, state)| made.contains(id) && node == "b" && state == "running"),
            "{listed:?}"
        );
        let nodes = n.json(&["nodes"]);
        assert!(nodes.as_array().unwrap().iter().all(|n| n["state"] == "up"), "{nodes}");
    }
    let events = b.json(&["events", "--limit", "1000"]);
    assert!(
        !events.as_array().unwrap().iter().any(|e| e["kind"] == "lost" || e["kind"] == "reconciled"),
        "{events}"
    );
}

/// Three nodes on `net`: a keeps the CA (in `home_a`), and b and c join
/// with tokens issued there (kept in `tokens`).
struct Three {
    home_a: PathBuf,
    tokens: PathBuf,
    a: Daemon,
    b: Daemon,
    c: Daemon,
}

/// Node a's data root, the cluster's CA made in it, and the join tokens it
/// issued b and c (in `tokens/`, by name).
fn ca_node_home(net: &Net) -> (PathBuf, PathBuf) {
    let home_a = fresh_home(&cow_base().unwrap_or_else(plain_base));
    std::fs::create_dir_all(&home_a).unwrap();
    offline(&home_a, &["cluster", "init"]);
    let tokens = home_a.join("tokens");
    std::fs::create_dir_all(&tokens).unwrap();
    for (i, name) in [(1, "b"), (2, "c")] {
        issue_token(&home_a, name, &net.advertise(i), &tokens.join(name));
    }
    (home_a, tokens)
}

impl Three {
    fn start(net: &Net) -> Three {
        let (home_a, tokens) = ca_node_home(net);
        let a = node_at(net, 0, "a", home_a.clone(), None, &[]);
        let b = node(net, 1, "b", Some(&tokens.join("b")), &[]);
        let c = node(net, 2, "c", Some(&tokens.join("c")), &[]);
        Three { home_a, tokens, a, b, c }
    }
}

#[test]
fn a_revoked_node_certificate_is_refused_by_every_node_and_router() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: network namespaces need root");
        return;
    }
    let net = Net::new(&["a", "b", "c"]);
    let Three { home_a, tokens, a, b, c } = Three::start(&net);
    let ca = home_a.join("cluster/ca.crt");
    let (c_cert, c_key) = unpack_token(&tokens.join("c"), &tokens);
    b.shop("shop");
    let sb = b.fork("shop", &["--node", "b"]);
    c.wait_for(Duration::from_secs(10), "c to see b's router relay", || {
        c.json(&["nodes"])[1]["relay"].as_str().is_some_and(|r| r.ends_with(":7441"))
    });
    // Before: c's certificate is a member's everywhere.
    for i in [0, 1] {
        assert!(curl_peer(&net, i, &ca, Some((&c_cert, &c_key))).is_ok(), "node {i} lets c in");
    }
    assert_eq!(psql_in(&net, 2, &through(&dsn(&sb), &c), "SELECT count(*) FROM orders").unwrap(), "1000");
    assert_eq!(c.json(&["show", sb["id"].as_str().unwrap()])["id"], sb["id"]);

    // A session relayed through c's router, open when c is revoked.
    let open = psql_started(&net, 2, &through(&dsn(&sb), &c), "SELECT pg_sleep(25)");
    let began = Instant::now();
    std::thread::sleep(Duration::from_millis(500));

    // Revoked on the CA's node, with the daemon running there.
    let (code, err) = a.fails(&["cluster", "revoke", "nobody"]);
    assert_eq!((code, err["code"].as_str()), (3, Some("invalid_arguments")), "{err}");
    assert!(err["message"].as_str().unwrap().contains("issued no certificate"), "{err}");
    let done = a.json(&["cluster", "revoke", "c"]);
    assert_eq!((done["node"].as_str(), done["number"].as_u64()), (Some("c"), Some(1)), "{done}");
    assert_eq!(done["certificates"].as_array().unwrap().len(), 1);
    // c asks b again and again, so its kept-open connection to b never
    // goes idle: b cuts it off once b has the list, and refuses c from then on.
    let id = sb["id"].as_str().unwrap();
    c.wait_for(Duration::from_secs(15), "b to cut c off", || c.cli(&["show", id]).code != 0);
    let (code, err) = c.fails(&["show", id]);
    assert_eq!((code, err["code"].as_str()), (19, Some("cluster_unavailable")), "{err}");
    // a takes it at its next round and puts it in etcd; b reads it there.
    a.wait_for(Duration::from_secs(15), "a and b to refuse c's certificate", || {
        [0, 1].iter().all(|i| curl_peer(&net, *i, &ca, Some((&c_cert, &c_key))).is_err())
    });
    // b's router, a process of its own, follows the list: c's router is refused on b's relay port.
    b.wait_for(Duration::from_secs(10), "b's router to refuse c's relay", || {
        psql_in(&net, 2, &through(&dsn(&sb), &c), "SELECT 1").is_err()
    });
    let err = psql_in(&net, 2, &through(&dsn(&sb), &c), "SELECT 1").unwrap_err();
    assert!(err.contains("cannot be reached through this router now"), "{err}");
    // The session open before was cut off, before its query could end (it
    // would succeed after 25 s, within the sandbox's statement timeout).
    let ended = open.wait_with_output().unwrap();
    assert!(!ended.status.success(), "{ended:?}");
    assert!(began.elapsed() < Duration::from_secs(25), "cut off after {:?}", began.elapsed());
    // A member not revoked still gets through.
    assert_eq!(a.json(&["show", sb["id"].as_str().unwrap()])["id"], sb["id"]);
    assert_eq!(psql_in(&net, 0, &through(&dsn(&sb), &a), "SELECT count(*) FROM orders").unwrap(), "1000");
    // A list put back in etcd by hand that is not the CA's changes nothing.
    let forged = serde_json::json!({"list": "e30=", "signature": "AAAA"}).to_string();
    let key = base64_text("/airlock/v1/revoked");
    let put = format!("{{\"key\":\"{key}\",\"value\":\"{}\"}}", base64_text(&forged));
    assert!(net.etcd("put", &put).status.success());
    std::thread::sleep(LEASE);
    assert!(curl_peer(&net, 1, &ca, Some((&c_cert, &c_key))).is_err(), "still refused");
    // Whichever node's round reads it first says so and puts its own list
    // back, so the others may never see it: c, revoked, still reads etcd.
    b.wait_for(Duration::from_secs(10), "the forgery to be in a log", || {
        [&a, &b, &c].iter().any(|node| node.log().contains("not the CA's"))
    });
    // The node that keeps the CA puts its list back.
    a.wait_for(Duration::from_secs(10), "a to put the CA's list back", || {
        let out = net.etcd("range", &format!("{{\"key\":\"{key}\"}}"));
        !String::from_utf8_lossy(&out.stdout).contains(&base64_text(&forged))
    });
}

fn base64_text(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// `airlock serve` for node `name` in node `i`'s namespace, which must fail;
/// its output.
fn serve_refused(net: &Net, i: usize, name: &str, home: &Path, cluster: &str, extra: &[&str]) -> String {
    let mut cmd = in_ns(net, i, BIN);
    cmd.args(["serve", "--cluster", cluster, "--node", name, "--advertise", &net.advertise(i)])
        .args(extra)
        .env("AIRLOCK_HOME", home)
        .env("AIRLOCK_ROUTER", "127.0.0.1:0")
        .env("AIRLOCK_REDIS_ROUTER", "127.0.0.1:0")
        .env("AIRLOCK_GATEWAY", "127.0.0.1:0")
        .stdin(Stdio::null());
    let out = cmd.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "the daemon started: {text}");
    text
}

/// `serve`'s flags for etcd over TLS: the CA, and a client certificate and key.
fn etcd_flags(ca: &Path, client: Option<(&Path, &Path)>) -> Vec<String> {
    let mut flags = vec!["--etcd-ca".to_string(), ca.display().to_string()];
    if let Some((cert, key)) = client {
        flags.extend([
            "--etcd-cert".into(),
            cert.display().to_string(),
            "--etcd-key".into(),
            key.display().to_string(),
        ]);
    }
    flags
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn etcd_over_tls_checks_etcds_certificate_and_shows_each_nodes_own() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: network namespaces need root");
        return;
    }
    let net = Net::with_members(&["a", "b", "c"], 1, true);
    let tls = net.tls.clone().unwrap();
    let certs = tls.join("nodes");
    let ca = tls.join("ca.crt");
    let (home_a, tokens) = ca_node_home(&net);
    let own = |name: &str| {
        let (crt, key) = issue(&tls, &certs, name, None);
        etcd_flags(&ca, Some((&crt, &key)))
    };
    let a = node_at(&net, 0, "a", home_a.clone(), None, &strs(&own("a")));
    let b = node(&net, 1, "b", Some(&tokens.join("b")), &strs(&own("b")));
    // The files are kept for later starts and the router, root's alone.
    {
        use std::os::unix::fs::PermissionsExt;
        let key = std::fs::metadata(home_a.join("cluster/etcd-client.key")).unwrap();
        assert_eq!(key.permissions().mode() & 0o777, 0o600);
    }
    // Both nodes are in, a fork asked of b lands on a (the golden's holder),
    // and b's router, which reads etcd too, reaches it.
    a.shop("shop");
    let nodes = b.json(&["nodes"]);
    assert_eq!(nodes.as_array().unwrap().len(), 2, "{nodes}");
    let sb = b.fork("shop", &[]);
    assert_eq!(sb["node"], "a", "{sb}");
    assert_eq!(psql_in(&net, 1, &through(&dsn(&sb), &b), "SELECT count(*) FROM orders").unwrap(), "1000");
    // A later start needs no flags: what was kept is used.
    let mut first_b = b;
    first_b.kill9();
    let b = node_at(&net, 1, "b", first_b.home.clone(), None, &[]);
    let id = sb["id"].as_str().unwrap();
    assert_eq!(b.json(&["show", id])["id"], id, "found on a through etcd");

    // Refused, each with what was wrong; c joins with its token first.
    let home_c = fresh_home(&plain_base());
    let url = net.etcd_url();
    let token_c = tokens.join("c");
    let out = serve_refused(&net, 2, "c", &home_c, &url, &["--join", token_c.to_str().unwrap()]);
    assert!(out.contains("no CA to check them against") && out.contains("--etcd-ca"), "{out}");
    // No client certificate: etcd asks for one.
    let out = serve_refused(&net, 2, "c", &home_c, &url, &strs(&etcd_flags(&ca, None)));
    assert!(out.contains("no etcd member answered"), "{out}");
    // A client certificate of another CA.
    let foreign = tls.join("foreign");
    make_ca(&foreign);
    let (f_crt, f_key) = issue(&foreign, &foreign, "c", None);
    let out = serve_refused(&net, 2, "c", &home_c, &url, &strs(&etcd_flags(&ca, Some((&f_crt, &f_key)))));
    assert!(out.contains("no etcd member answered"), "{out}");
    // etcd's certificate checked against another CA: not etcd.
    let (c_crt, c_key) = issue(&tls, &certs, "c", None);
    let theirs = etcd_flags(&foreign.join("ca.crt"), Some((&c_crt, &c_key)));
    let out = serve_refused(&net, 2, "c", &home_c, &url, &strs(&theirs));
    assert!(out.contains("TLS") && out.contains("certificate"), "{out}");
    // Plaintext to a TLS member, and files that are not PEM.
    let plain = url.replace("https://", "http://");
    let out = serve_refused(&net, 2, "c", &home_c, &plain, &[]);
    assert!(out.contains("no etcd member answered"), "{out}");
    let out = serve_refused(&net, 2, "c", &home_c, &url, &["--etcd-ca", token_c.to_str().unwrap()]);
    assert!(out.contains("--etcd-ca") && out.contains("does not read"), "{out}");
    // With its own certificate, c joins.
    let c = node_at(&net, 2, "c", home_c.clone(), None, &strs(&etcd_flags(&ca, Some((&c_crt, &c_key)))));
    assert_eq!(c.json(&["nodes"]).as_array().unwrap().len(), 3);
    let _ = (a, b, first_b);
}

/// A command run inside node `i`'s namespace.
fn in_ns(net: &Net, i: usize, program: &str) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &net.spaces[i], program]);
    cmd
}

/// psql running `sql` in node `i`'s namespace, in the background.
fn psql_started(net: &Net, i: usize, dsn: &str, sql: &str) -> Child {
    crate::harness::spawn_psql_by(in_ns(net, i, "psql"), dsn, sql)
}

/// psql in node `i`'s namespace: its answer, or what it said on failure.
fn psql_in(net: &Net, i: usize, dsn: &str, sql: &str) -> Result<String, String> {
    psql_by(in_ns(net, i, "psql"), dsn, sql)
}

/// redis-cli in node `i`'s namespace, with `args` after the URL.
fn redis_in(net: &Net, i: usize, url: &str, tls_ca: Option<&Path>, args: &[&str]) -> String {
    let mut cmd = in_ns(net, i, "redis-cli");
    cmd.args(["--no-auth-warning", "-u", url]);
    if let Some(ca) = tls_ca {
        cmd.arg("--tls").arg("--cacert").arg(ca);
    }
    let out = cmd.args(args).stdin(Stdio::null()).output().unwrap();
    format!("{}{}", String::from_utf8_lossy(&out.stdout).trim(), String::from_utf8_lossy(&out.stderr).trim())
}

/// `dsn` with its router's address and CA replaced by node `d`'s.
fn through(dsn: &str, d: &Daemon) -> String {
    let (userinfo, rest) = dsn.split_once('@').unwrap();
    let (_, path) = rest.split_once('/').unwrap();
    let (database, _) = path.split_once('?').unwrap();
    let ca = d.home.join("tls/ca.crt");
    format!("{userinfo}@{}/{database}?sslmode=verify-full&sslrootcert={}", d.router, ca.display())
}

#[test]
fn any_nodes_router_relays_psql_redis_cli_and_cancel_requests_to_the_sandboxs_node() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: network namespaces need root");
        return;
    }
    let net = Net::new(&["a", "b"]);
    let home_a = fresh_home(&cow_base().unwrap_or_else(plain_base));
    std::fs::create_dir_all(&home_a).unwrap();
    offline(&home_a, &["cluster", "init"]);
    let token = home_a.join("token-b");
    issue_token(&home_a, "b", &net.advertise(1), &token);
    // Few router slots, so the idle flood below outnumbers them on the relay port too.
    let a = node_at(&net, 0, "a", home_a.clone(), None, &["--router-max-connections", "64"]);
    let b = node(&net, 1, "b", Some(&token), &[]);
    crate::redis::golden_with_redis(&a, "cache");
    let sb = a.fork("cache", &["--name", "relayed"]);
    assert_eq!(sb["node"], "a", "{sb}");
    let id = sb["id"].as_str().unwrap();
    b.wait_for(Duration::from_secs(10), "b to see a's router relay", || {
        b.json(&["nodes"])[0]["relay"].as_str().is_some_and(|r| r.ends_with(":7441"))
    });

    // psql on b's host, through b's router (TLS verified against b's CA), on a's sandbox.
    let via_b = through(&dsn(&sb), &b);
    let via_a = through(&dsn(&sb), &a);
    let conn = psql_in(&net, 1, &via_b, "SELECT current_setting('airlock.connection')").unwrap();
    assert!(conn.contains("entry=b"), "the owner knows the client came through b: {conn}");
    assert!(
        conn.contains("channel_binding=tls-server-end-point") && conn.contains("tls=TLSv1.3"),
        "SCRAM-SHA-256-PLUS bound to b's certificate, which the client saw: {conn}"
    );
    psql_in(&net, 1, &via_b, "INSERT INTO t VALUES (42)").unwrap();
    assert_eq!(psql_in(&net, 0, &via_a, "SELECT count(*) FROM t WHERE id = 42").unwrap(), "1");
    // By name too, and with the sandbox as the user and a database inside it.
    let by_name = via_b.replace(&format!("/{id}?"), "/relayed?");
    assert_eq!(psql_in(&net, 1, &by_name, "SELECT 1").unwrap(), "1");
    let (userinfo, rest) = via_b.split_once('@').unwrap();
    let password = userinfo.rsplit_once(':').unwrap().1;
    let as_user = format!("postgresql://{id}:{password}@{}", rest.replace(&format!("/{id}?"), "/postgres?"));
    assert_eq!(psql_in(&net, 1, &as_user, "SELECT current_database()").unwrap(), "app");
    // The owner authenticates: a wrong password is refused as on a's own port.
    let wrong = via_b.replace(&format!(":{password}@"), ":not-the-password@");
    let err = psql_in(&net, 1, &wrong, "SELECT 1").unwrap_err();
    assert!(err.contains("password authentication failed"), "{err}");
    let err = psql_in(&net, 1, &via_b.replace(id, "sb-zzzzzzzzzz"), "SELECT 1").unwrap_err();
    assert!(err.contains("does not exist"), "{err}");
    // Plaintext through b (the relay itself is mutual TLS).
    let plain_b = via_b.split_once('?').unwrap().0.to_owned() + "?sslmode=disable";
    assert_eq!(psql_in(&net, 1, &plain_b, "SELECT count(*) FROM t").unwrap(), "1");

    // A cancel request sent to b stops the query on a.
    let slow = psql_started(&net, 1, &plain_b, "SELECT pg_sleep(30)");
    let deadline = Instant::now() + Duration::from_secs(10);
    let running = "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(30)'";
    while psql_in(&net, 0, &via_a, running).unwrap() != "1" {
        assert!(Instant::now() < deadline, "the slow query never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let t = Instant::now();
    assert!(Command::new("kill").args(["-INT", &slow.id().to_string()]).status().unwrap().success());
    let out = slow.wait_with_output().unwrap();
    assert!(t.elapsed() < Duration::from_secs(10), "the cancel took {:?}", t.elapsed());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("canceling statement due to user request"),
        "{out:?}"
    );

    // redis-cli through b's Redis port, plaintext and TLS.
    let redis_b = b.redis_router.clone();
    let url = format!("redis://{id}:{password}@{redis_b}");
    assert_eq!(redis_in(&net, 1, &url, None, &["GET", "greeting"]), "hello world");
    assert_eq!(redis_in(&net, 1, &url, None, &["SET", "from-b", "yes"]), "OK");
    let tls_url = format!("rediss://{id}:{password}@{redis_b}");
    let ca_b = b.home.join("tls/ca.crt");
    assert_eq!(redis_in(&net, 1, &tls_url, Some(&ca_b), &["GET", "from-b"]), "yes");
    let url_a = format!("redis://{id}:{password}@{}", a.redis_router);
    assert_eq!(redis_in(&net, 0, &url_a, None, &["GET", "from-b"]), "yes", "b's write is on a's sandbox");
    let wrong = format!("redis://{id}:nope@{redis_b}");
    let refused = redis_in(&net, 1, &wrong, None, &["GET", "greeting"]);
    assert!(refused.contains("WRONGPASS"), "{refused}");

    // The relay port takes only a cluster member: no client certificate, or a
    // plaintext header claiming anything, gets nothing.
    let relay_a = net.advertise(0).replace(":7440", ":7441");
    let out = Command::new("curl")
        .args(["-s", "--max-time", "5", "--cacert"])
        .arg(home_a.join("cluster/ca.crt"))
        .arg(format!("https://{relay_a}/"))
        .output()
        .unwrap();
    assert!(!out.status.success() && out.stdout.is_empty(), "{out:?}");
    use std::io::{Read, Write};
    let mut raw = std::net::TcpStream::connect(&relay_a).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let forged = format!(
        "AIRLOCK-RELAY-1 {{\"door\":\"postgres\",\"node\":\"b\",\"peer\":\"10.0.0.1:1\",\"tls\":\"tls=TLSv1.3\",\"end_point\":null}}\n"
    );
    raw.write_all(forged.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let _ = raw.read_to_end(&mut answer);
    assert!(answer.iter().all(|b| *b != b'R'), "a plaintext relay client got an answer: {answer:?}");
    assert!(!answer.windows(4).any(|w| w == b"SCRA"), "{answer:?}");

    // Idle connections from one address, hundreds of them, with no
    // certificate: they hold neither a's relay port nor its node-to-node
    // port against the members.
    let peer_a = net.advertise(0);
    let mut idle = Vec::new();
    for addr in [&relay_a, &peer_a] {
        for _ in 0..150 {
            if let Ok(c) =
                std::net::TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(2))
            {
                idle.push(c);
            }
        }
    }
    assert!(idle.len() >= 250, "{} idle connections made", idle.len());
    for round in 0..3 {
        let t = Instant::now();
        assert_eq!(psql_in(&net, 1, &via_b, "SELECT 1").unwrap(), "1", "round {round}: routed through b");
        assert_eq!(b.json(&["show", id])["id"], id, "round {round}: forwarded to a");
        assert!(t.elapsed() < Duration::from_secs(5), "round {round} waited {:?}", t.elapsed());
    }
    drop(idle);

    // The owner recorded the relayed connections, naming the node they came through.
    let events = a.json(&["events", "--sandbox", id]);
    let relayed = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "connected")
        .filter(|e| e["detail"]["entry"] == "b")
        .count();
    assert!(relayed >= 4, "{events}");
}

/// Flips one byte in the middle of the largest file of a node's golden
/// generation (as bit rot would); returns the file, to flip it back.
fn flip_largest_file(home: &Path, golden: &str) -> PathBuf {
    let inventory: Value = serde_json::from_slice(
        &std::fs::read(home.join(format!("volume/goldens/{golden}/1/files.json"))).unwrap(),
    )
    .unwrap();
    let largest = inventory["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "file")
        .max_by_key(|e| e["size"].as_u64().unwrap())
        .unwrap();
    let path = home.join(format!("volume/goldens/{golden}/1")).join(largest["path"].as_str().unwrap());
    let mut bytes = std::fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x5a;
    std::fs::write(&path, bytes).unwrap();
    path
}

/// The holders a node's transfers of `golden` were refused from, in order,
/// as its log tells them.
fn refused_transfers(d: &Daemon, golden: &str) -> Vec<String> {
    d.log()
        .lines()
        .filter(|l| l.contains("transfer was refused") && l.contains(golden))
        .filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("from=")).map(str::to_owned))
        .collect()
}

/// `.replica` staging directories left on a node.
fn replica_leftovers(home: &Path) -> Vec<String> {
    std::fs::read_dir(home.join("volume/staging"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".replica"))
        .collect()
}

#[test]
fn goldens_are_replicated_checked_against_their_hashes_fetched_at_a_first_fork_and_refused_when_corrupt() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: network namespaces need root");
        return;
    }
    let net = Net::new(&["a", "b", "c"]);
    let Three { home_a, a, b, c, .. } = Three::start(&net);

    // A golden with a Redis part, built on a alone, replicated ahead of time to c.
    crate::redis::golden_with_redis(&a, "cache");
    let done = a.json(&["golden", "replicate", "cache", "--nodes", "c"]);
    let first = &done[0];
    assert_eq!((first["node"].as_str(), first["from"].as_str()), (Some("c"), Some("a")), "{done}");
    assert_eq!((first["already"].as_bool(), first["attempts"].as_u64()), (Some(false), Some(1)), "{done}");
    assert!(first["bytes"].as_u64().unwrap() > 1 << 20, "{done}");
    let on_c = c.json(&["golden", "show", "cache"]);
    let on_a = a.json(&["golden", "show", "cache"]);
    assert_eq!(on_c["generations"][0]["schema_hash"], on_a["generations"][0]["schema_hash"]);
    assert_eq!(on_c["generations"][0]["redis"]["keys"], 4, "{on_c}");
    let replicated: Vec<Value> = c
        .json(&["events"])
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "golden_replicated" && e["golden"] == "cache")
        .cloned()
        .collect();
    assert_eq!(replicated.len(), 1, "{replicated:?}");
    assert_eq!(replicated[0]["detail"]["from"], "a");
    // Asked again: held already, nothing sent.
    let again = c.json(&["golden", "replicate", "cache", "--nodes", "c"]);
    assert_eq!(again[0]["already"], true, "{again}");
    // c announces it, and a fork on c reads the data and the Redis keys.
    c.wait_for(Duration::from_secs(10), "c to announce its golden", || {
        a.json(&["nodes"])[2]["goldens"]["cache"].as_array().is_some_and(|g| !g.is_empty())
    });
    let sb = a.fork("cache", &["--node", "c"]);
    assert_eq!(sb["node"], "c", "{sb}");
    let via_c = through(&dsn(&sb), &c);
    assert_eq!(psql_in(&net, 2, &via_c, "SELECT count(*) FROM t").unwrap(), "0");
    let id = sb["id"].as_str().unwrap();
    let password = split_password(&dsn(&sb)).1;
    let url = format!("redis://{id}:{password}@{}", c.redis_router);
    assert_eq!(redis_in(&net, 2, &url, None, &["GET", "greeting"]), "hello world");

    // On demand: b holds no golden; a fork placed there fetches it first.
    a.shop("shop");
    let on_b = a.fork("shop", &["--node", "b"]);
    assert_eq!(on_b["node"], "b", "{on_b}");
    let kinds: Vec<String> = b
        .json(&["events"])
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["golden"] == "shop")
        .map(|e| e["kind"].as_str().unwrap().to_owned())
        .collect();
    assert!(kinds.contains(&"golden_replicated".to_string()), "{kinds:?}");
    let via_b = through(&dsn(&on_b), &b);
    assert_eq!(psql_in(&net, 1, &via_b, "SELECT count(*) FROM orders").unwrap(), "1000");

    b.wait_for(Duration::from_secs(10), "b to announce shop", || {
        c.json(&["nodes"])[1]["goldens"]["shop"].as_array().is_some_and(|g| !g.is_empty())
    });
    migration_tests_spread_over_the_holders_and_promote_where_sealed(&net, &a, &b, &c);

    // a's copy rots. c's transfer from a (the least busy holder) is refused,
    // and tried again from b, whose copy is whole. The migration tests' forks
    // on a are gone once a has said so at a round of its own. Which holder
    // goes first is the load each announced at the moment c asks, and that
    // can change between this wait and the transfer (or a's lease lapse on a
    // loaded host): what must hold is that a's copy is never taken, and that
    // a try of it is refused and followed by b's.
    c.wait_for(Duration::from_secs(15), "a to announce fewer running sandboxes than b", || {
        let nodes = c.json(&["nodes"]);
        let running = |name: &str| {
            nodes.as_array().unwrap().iter().find(|n| n["name"] == name).and_then(|n| n["running"].as_u64())
        };
        matches!((running("a"), running("b")), (Some(on_a), Some(on_b)) if on_a < on_b)
    });
    let rotten = flip_largest_file(&home_a, "shop");
    let done = c.json(&["golden", "replicate", "shop", "--nodes", "c"]);
    assert_eq!(done[0]["from"].as_str(), Some("b"), "{done}");
    let tried_first: Vec<String> = refused_transfers(&c, "shop");
    match done[0]["attempts"].as_u64() {
        Some(2) => assert_eq!(tried_first, ["a"], "{done}"),
        Some(1) => assert!(tried_first.is_empty(), "{done} {tried_first:?}"),
        _ => panic!("one refused try at most: {done}"),
    }
    assert!(replica_leftovers(&c.home).is_empty());
    assert_eq!(
        psql_in(
            &net,
            2,
            &through(&dsn(&c.fork("shop", &["--node", "c"])), &c),
            "SELECT sum(total) FROM orders"
        )
        .unwrap(),
        "750750.0"
    );

    // Both copies rot: every try is refused, and nothing is kept or published.
    offline_rm_golden(&c, "shop");
    flip_largest_file(&b.home, "shop");
    let (code, err) = c.fails(&["golden", "replicate", "shop", "--nodes", "c"]);
    assert_eq!((code, err["code"].as_str()), (19, Some("replication_failed")), "{err}");
    let message = err["message"].as_str().unwrap();
    assert!(message.contains("does not match its SHA-256") && message.contains("3 tries"), "{message}");
    let tried: std::collections::BTreeSet<String> = refused_transfers(&c, "shop").into_iter().collect();
    assert_eq!(tried, ["a".to_string(), "b".to_string()].into(), "each holder was tried in turn");
    assert!(c.cli(&["golden", "show", "shop"]).code != 0, "a refused transfer published nothing");
    assert!(replica_leftovers(&c.home).is_empty(), "{:?}", replica_leftovers(&c.home));
    let _ = rotten;
}

/// `migrate test` asked of c, which holds no `shop`: its candidates are
/// spread over a and b, which do; the report is one, sealed by c; a promote
/// asked of b is carried out by c, against the row records it kept from the
/// node that tested the candidate.
fn migration_tests_spread_over_the_holders_and_promote_where_sealed(
    net: &Net,
    a: &Daemon,
    b: &Daemon,
    c: &Daemon,
) {
    let dir = c.home.join("candidates");
    std::fs::create_dir_all(&dir).unwrap();
    let files = [
        ("add_note.sql", "ALTER TABLE orders ADD COLUMN note text;"),
        ("pay_first.sql", "UPDATE orders SET status = 'paid' WHERE id <= 10;"),
        ("drop_total.sql", "ALTER TABLE orders DROP COLUMN total;"),
        ("index_status.sql", "CREATE INDEX orders_status ON orders (status);"),
    ];
    let mut args =
        vec!["migrate".to_string(), "test".into(), "--golden".into(), "shop".into(), "--json".into()];
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
        args.push(dir.join(name).to_str().unwrap().into());
    }
    let report_file = dir.join("report.json");
    args.extend(["--report".into(), report_file.to_str().unwrap().into()]);
    let out = c.cli(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(out.code, 12, "one candidate fails: {out:?}\n{}", c.log());
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(report["node"], "c", "sealed by the node asked");
    let candidates = report["candidates"].as_array().unwrap();
    let names: Vec<&str> = candidates.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, files.iter().map(|f| f.0).collect::<Vec<_>>(), "in the order given");
    let ran_on: std::collections::BTreeSet<&str> =
        candidates.iter().map(|c| c["node"].as_str().unwrap()).collect();
    assert_eq!(ran_on, ["a", "b"].into(), "spread over the holders: {report}");
    let by_name = crate::migrate::by_name(&report);
    assert_eq!(by_name["add_note.sql"]["passed"], true, "{report}");
    assert_eq!(by_name["pay_first.sql"]["passed"], true, "{report}");
    assert_eq!(by_name["drop_total.sql"]["passed"], false, "{report}");
    assert_eq!(report["ranking"].as_array().unwrap().len(), 4);
    assert_eq!(report["ranking"].as_array().unwrap().last().unwrap(), "drop_total.sql", "ranked as one run");
    assert!(!by_name["pay_first.sql"]["row_record"].as_str().unwrap().is_empty());
    // Each node records the candidates it ran, and c's events show them all.
    let tested: Vec<Value> = c
        .json(&["events"])
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "migration_tested")
        .cloned()
        .collect();
    let nodes: std::collections::BTreeSet<&str> =
        tested.iter().map(|e| e["detail"]["node"].as_str().unwrap()).collect();
    assert_eq!(nodes, ["a", "b"].into(), "{tested:?}");
    // The row records are the cluster's to read, on the peer port alone.
    let name = by_name["pay_first.sql"]["row_record"].as_str().unwrap();
    let (status, body) = b.api("GET", &format!("/v1/migrations/rows?name={}", name.replace('/', "%2F")), "");
    assert_eq!(status, 401, "{body}");

    // Promoted through b onto a clean copy: carried out by c, which sealed it.
    let target_sb = a.fork("shop", &["--node", "a"]);
    let target = target_sb["socket_dsn"].as_str().unwrap().to_owned();
    let report_path = report_file.to_str().unwrap();
    let pay_first = dir.join("pay_first.sql");
    let (code, out) = crate::migrate::promote(b, report_path, &target, pay_first.to_str().unwrap(), &[]);
    assert_eq!(code, 0, "{out}\n{}", c.log());
    assert_eq!(sql(&target, "SELECT count(*) FROM orders WHERE id <= 10 AND status = 'paid'"), "10");
    let promoted: Vec<Value> = c
        .json(&["events"])
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "migration_promoted")
        .cloned()
        .collect();
    assert_eq!(promoted.len(), 1, "{promoted:?}");
    assert_eq!(promoted[0]["detail"]["node"], "c", "{promoted:?}");
    // A report whose sealer is changed on the way goes to that node, whose
    // key did not seal it: refused.
    let mut edited: Value = serde_json::from_slice(&std::fs::read(&report_file).unwrap()).unwrap();
    edited["node"] = "a".into();
    let edited_file = dir.join("edited.json");
    std::fs::write(&edited_file, edited.to_string()).unwrap();
    let other = a.fork("shop", &["--node", "a"]);
    let promote_edited = || {
        crate::migrate::promote(
            b,
            edited_file.to_str().unwrap(),
            other["socket_dsn"].as_str().unwrap(),
            pay_first.to_str().unwrap(),
            &[],
        )
    };
    let (code, out) = promote_edited();
    assert_eq!(code, 10, "{out}");
    assert!(out.contains("seal"), "{out}");
    // A node record put in etcd by hand, naming a node "evil" at c's address:
    // a report naming "evil" would have its promote (the target's password
    // in it) sent there. c's certificate does not carry the name, so the
    // handshake fails and nothing is sent.
    let key = |name: &str| base64_text(&format!("/airlock/v1/nodes/{name}"));
    let range = format!("{{\"key\":\"{}\"}}", key("c"));
    let out = net.etcd("range", &range);
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    let record = {
        use base64::Engine;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(answer["kvs"][0]["value"].as_str().unwrap())
            .unwrap();
        let mut record: Value = serde_json::from_slice(&bytes).unwrap();
        record["name"] = "evil".into();
        record.to_string()
    };
    let put = format!("{{\"key\":\"{}\",\"value\":\"{}\"}}", key("evil"), base64_text(&record));
    assert!(net.etcd("put", &put).status.success());
    edited["node"] = "evil".into();
    std::fs::write(&edited_file, edited.to_string()).unwrap();
    let (code, out) = promote_edited();
    assert_eq!(code, 19, "{out}");
    assert!(out.contains("evil") && out.contains("certificate"), "{out}");
    assert!(!c.log().contains("migrations/promote"), "nothing reached c");
    let delete = format!("{{\"key\":\"{}\"}}", key("evil"));
    net.etcd("deleterange", &delete);
    // The targets go: what follows places by load.
    for sb in [&other, &target_sb] {
        b.ok(&["rm", sb["id"].as_str().unwrap()]);
    }
}

/// Removes a golden from a node, after every sandbox of it in the cluster.
fn offline_rm_golden(d: &Daemon, golden: &str) {
    for sb in d.json(&["ls"]).as_array().unwrap() {
        if sb["golden"] == golden {
            d.ok(&["rm", sb["id"].as_str().unwrap()]);
        }
    }
    d.ok(&["golden", "rm", golden]);
}
