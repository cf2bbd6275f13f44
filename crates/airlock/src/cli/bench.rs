//! `airlock bench fork`: time from a fork request to the first query answered
//! (and, for a golden with a Redis part, the first `PING`: both at once),
//! against the ways a user would otherwise get a fresh database, in one run.
//!
//! Baselines ([`super::bench_baselines`]) run one round after each fork, in
//! turn with them.

use std::time::Instant;

use clap::Subcommand;
use hyper::Method;

use airlock_lifecycle::doctor::Doctor;
use airlock_listen::client::NO_BODY;

use super::bench_baselines::Baselines;
use super::bench_series::{elapsed_ms, first_query, series, Series};
use super::output::{self, Table};
use super::Cli;
use airlock_core::error::{Error, Result};
use airlock_lifecycle::sandbox::{ForkRequest, Forked, Sandbox};

/// Benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Fork request to first query answered, with baselines.
    Fork {
        /// The golden to fork.
        #[arg(long)]
        golden: String,
        /// Forks to time.
        #[arg(long, default_value_t = 20)]
        iterations: usize,
        /// Runs of each baseline (default: as many as --iterations).
        #[arg(long)]
        baseline_iterations: Option<usize>,
        /// Skip the baselines.
        #[arg(long)]
        no_baselines: bool,
        /// Where the first query goes: through the router (plaintext on
        /// loopback, or TLS checked against Airlock's CA, as the DSN says) or
        /// straight to the sandbox's socket.
        #[arg(long, value_enum, default_value = "router")]
        via: Via,
    },
    /// Sustained fork, first query and delete, from several clients at once.
    Churn {
        /// The golden to fork.
        #[arg(long)]
        golden: String,
        /// How long to keep going.
        #[arg(long, default_value = "60s")]
        duration: String,
        /// Clients forking at once.
        #[arg(long, default_value_t = 2)]
        clients: usize,
    },
    /// What the audit log adds to each event recorded, with and without fsync
    /// (on a scratch log next to the data root's own).
    Audit {
        /// Rounds of a pooled fork's events and a tool call's, each store in turn.
        #[arg(long, default_value_t = 2000)]
        rounds: usize,
    },
    /// Time from connecting to a suspended sandbox through the router to its first answer.
    Wake {
        /// The golden to fork.
        #[arg(long)]
        golden: String,
        /// Wakes to time.
        #[arg(long, default_value_t = 20)]
        iterations: usize,
    },
}

/// The path a benchmark's first query takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Via {
    /// The router's TCP port.
    Router,
    /// The router's TCP port with TLS, as a user's DSN connects
    /// (`sslmode=verify-full` against Airlock's CA; `rediss://` for Redis).
    RouterTls,
    /// The sandbox's private unix socket.
    Socket,
}

/// The agent's connection settings for a new sandbox, by the chosen path.
fn agent_config(
    sb: &Sandbox,
    router: Option<&airlock_router::Address>,
    via: Via,
) -> Result<tokio_postgres::Config> {
    let socket = sb.socket_dsn.as_deref().or(sb.dsn.as_deref()).unwrap_or_default();
    let mut config: tokio_postgres::Config =
        socket.parse().map_err(|e| Error::internal(format!("sandbox DSN did not parse: {e}")))?;
    if let (Via::Router, Some(router)) = (via, router) {
        let password = airlock_core::dsn::password(socket).unwrap_or_default();
        config = tokio_postgres::Config::new();
        config
            .host(&router.host)
            .port(router.port)
            .user(airlock_core::dsn::AGENT_ROLE)
            .password(password)
            .dbname(&sb.id)
            .ssl_mode(tokio_postgres::config::SslMode::Disable);
    }
    Ok(config)
}

/// A new sandbox's first answers, asked at once: `SELECT 1` when it has a
/// PostgreSQL (`agent`), and `AUTH` + `PING` when it has a Redis, by `via`.
async fn first_answers(sb: &Sandbox, agent: Option<&tokio_postgres::Config>, via: Via) -> Result<()> {
    let sql = async {
        match (agent, via, sb.dsn.as_deref()) {
            (Some(_), Via::RouterTls, Some(dsn)) => {
                let client = airlock_postgres::target::connect(dsn).await?;
                client.simple_query("SELECT 1").await.map_err(|e| Error::postgres(e.to_string())).map(drop)
            }
            (Some(agent), _, _) => first_query(agent).await,
            (None, _, _) => Ok(()),
        }
    };
    let (sql, ping) = tokio::join!(sql, first_ping(sb, via));
    sql.and(ping)
}

/// `AUTH` and `PING` on a sandbox's Redis, through the router's Redis port
/// (plaintext) or its socket; nothing when it has no Redis.
async fn first_ping(sb: &Sandbox, via: Via) -> Result<()> {
    let routed = sb.redis_url.as_deref().filter(|_| matches!(via, Via::Router | Via::RouterTls));
    let Some(url) = routed.or(sb.redis_socket_url.as_deref()) else { return Ok(()) };
    let bad = || Error::internal("a sandbox's Redis URL did not parse");
    let (scheme, rest) = url.split_once("://").ok_or_else(bad)?;
    let (auth, address) = rest.rsplit_once('@').ok_or_else(bad)?;
    let (user, password) = auth.split_once(':').ok_or_else(bad)?;
    let failed = |e: std::io::Error| Error::internal(format!("benchmark Redis connection failed: {e}"));
    match scheme {
        "unix" => {
            auth_and_ping(tokio::net::UnixStream::connect(address).await.map_err(failed)?, user, password)
                .await
        }
        _ if via == Via::RouterTls => {
            // Checked against the CA the sandbox's DSN names, as a client given it would.
            let ca = sb
                .dsn
                .as_deref()
                .and_then(|d| d.split("sslrootcert=").nth(1))
                .map(|c| c.split('&').next().unwrap_or(c));
            let config = airlock_postgres::target::client_config("verify-full", ca)?;
            let host = address.rsplit_once(':').map_or(address, |(h, _)| h).to_owned();
            let name = rustls::pki_types::ServerName::try_from(host)
                .map_err(|e| Error::internal(format!("the router's Redis address: {e}")))?;
            let tcp = tokio::net::TcpStream::connect(address).await.map_err(failed)?;
            let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
                .connect(name, tcp)
                .await
                .map_err(failed)?;
            auth_and_ping(tls, user, password).await
        }
        _ => {
            auth_and_ping(tokio::net::TcpStream::connect(address).await.map_err(failed)?, user, password)
                .await
        }
    }
}

async fn auth_and_ping(
    stream: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send,
    user: &str,
    password: &str,
) -> Result<()> {
    use airlock_redis::resp::{call, Reply};
    let mut stream = tokio::io::BufStream::new(stream);
    for args in [&["AUTH", user, password][..], &["PING"]] {
        match call(&mut stream, args).await? {
            Reply::Status(_) => {}
            other => return Err(Error::internal(format!("the sandbox's Redis answered {other:?}"))),
        }
    }
    Ok(())
}

pub(super) async fn run(cli: &Cli, cmd: &BenchCommand) -> Result<i32> {
    let (golden, iterations, baseline_iterations, no_baselines, via) = match cmd {
        BenchCommand::Fork { golden, iterations, baseline_iterations, no_baselines, via } => {
            (golden, iterations, baseline_iterations, no_baselines, via)
        }
        BenchCommand::Churn { golden, duration, clients } => {
            return churn(cli, golden, duration, *clients).await
        }
        BenchCommand::Wake { golden, iterations } => return wake(cli, golden, *iterations).await,
        BenchCommand::Audit { rounds } => return super::bench_audit::run(cli, *rounds),
    };
    let client = cli.client()?;
    let doctor: Doctor = client.call(Method::GET, "/v1/doctor", NO_BODY).await?;
    let router = doctor.router.as_ref();
    let iterations = (*iterations).max(1);
    let req = ForkRequest { golden: golden.clone(), ttl_seconds: Some(600), ..Default::default() };
    let golden_info: airlock_lifecycle::golden::Golden =
        client.call(Method::GET, &format!("/v1/goldens/{golden}"), NO_BODY).await?;
    let pooled = golden_info.pool_size > 0;
    let mut fork_ms = Vec::new();
    let runs = baseline_iterations.unwrap_or(iterations).max(1);
    // (None for a Redis-only golden: the baselines load a PostgreSQL part.)
    let mut baselines = match no_baselines {
        false => {
            let bar =
                output::spinner(cli.json, format!("loading {golden} into the baselines' scratch servers"));
            let prepared = Baselines::prepare(cli, &client, &req, &doctor).await;
            bar.finish_and_clear();
            prepared?
        }
        true => None,
    };
    let bar = output::spinner(
        cli.json,
        match &baselines {
            Some(_) => format!("forking {golden} {iterations} times, each followed by a round of baselines"),
            None => format!("forking {golden} {iterations} times"),
        },
    );
    let mut answer_ms = Vec::new();
    let mut floor_ms = Vec::new();
    let mut timed = async {
        for i in 0..iterations {
            fork_once(
                &client,
                &req,
                golden,
                pooled,
                router,
                *via,
                (&mut fork_ms, &mut answer_ms, &mut floor_ms),
            )
            .await?;
            if let (Some(baselines), true) = (baselines.as_mut(), i < runs) {
                baselines.round(i).await?;
            }
        }
        Ok::<_, Error>(())
    }
    .await;
    bar.finish_and_clear();
    let name = match (pooled, via) {
        (true, Via::Router) => "airlock_fork_from_pool",
        (false, Via::Router) => "airlock_fork",
        (true, Via::RouterTls) => "airlock_fork_from_pool_tls",
        (false, Via::RouterTls) => "airlock_fork_tls",
        (true, Via::Socket) => "airlock_fork_from_pool_via_socket",
        (false, Via::Socket) => "airlock_fork_via_socket",
    };
    let mut all = vec![];
    if let Some(baselines) = baselines.take() {
        match baselines.finish().await {
            Ok(series) => all.extend(series),
            Err(e) => timed = timed.and(Err(e)),
        }
    }
    timed?;
    all.splice(
        0..0,
        [
            series(name, fork_ms),
            series("  of which: API answer with the DSN", answer_ms),
            series("  floor: a second connect + query", floor_ms),
        ],
    );
    let base = all[0].p50_ms;
    for s in &mut all {
        s.vs_airlock = (s.p50_ms / base * 100.0).round() / 100.0;
    }
    let title = format!("golden {golden}: fork request to first query (and Redis PING) answered");
    report(cli, &title, serde_json::json!({"golden": golden}), &all, true);
    Ok(0)
}

/// One timed fork: to the API's answer, to the first answers, and the floor
/// (the same connection and query again, on a server already up); then
/// deleted. With a warm pool, it first waits (off the clock) for the pool to
/// be full, so the figure is a claim, not a cold fork after the pool ran dry.
async fn fork_once(
    client: &airlock_listen::client::Client,
    req: &ForkRequest,
    golden: &str,
    pooled: bool,
    router: Option<&airlock_router::Address>,
    via: Via,
    (fork_ms, answer_ms, floor_ms): (&mut Vec<f64>, &mut Vec<f64>, &mut Vec<f64>),
) -> Result<()> {
    if pooled {
        let deadline = Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let g: airlock_lifecycle::golden::Golden =
                client.call(Method::GET, &format!("/v1/goldens/{golden}"), NO_BODY).await?;
            if g.pooled >= g.pool_size || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    let t = Instant::now();
    let forked: Forked = client.call(Method::POST, "/v1/sandboxes", Some(req)).await?;
    answer_ms.push(elapsed_ms(t));
    // A sandbox of a Redis-only golden has no DSN, and no query to answer.
    let agent =
        forked.sandbox.dsn.is_some().then(|| agent_config(&forked.sandbox, router, via)).transpose()?;
    first_answers(&forked.sandbox, agent.as_ref(), via).await?;
    fork_ms.push(elapsed_ms(t));
    let t = Instant::now();
    first_answers(&forked.sandbox, agent.as_ref(), via).await?;
    floor_ms.push(elapsed_ms(t));
    let _: Sandbox =
        client.call(Method::DELETE, &format!("/v1/sandboxes/{}", forked.sandbox.id), NO_BODY).await?;
    Ok(())
}

/// Prints series as a table (or JSON with `extra` fields), with a column comparing
/// each median to the first series' when `compare`.
fn report(cli: &Cli, title: &str, extra: serde_json::Value, all: &[Series], compare: bool) {
    let mut value = serde_json::json!({"results": all});
    if let (Some(v), serde_json::Value::Object(extra)) = (value.as_object_mut(), extra) {
        v.extend(extra);
    }
    output::print(cli.json, &value, || {
        let mut columns = vec!["METHOD", "RUNS", "P50 MS", "P99 MS", "MIN MS", "MAX MS"];
        if compare {
            columns.push("VS AIRLOCK");
        }
        let mut t = Table::new(&columns);
        for s in all {
            let mut row = vec![
                s.method.clone(),
                s.runs.to_string(),
                format!("{:.1}", s.p50_ms),
                format!("{:.1}", s.p99_ms),
                format!("{:.1}", s.min_ms),
                format!("{:.1}", s.max_ms),
            ];
            if compare {
                row.push(format!("{:.2}x", s.vs_airlock));
            }
            t.row(row);
        }
        format!("{title}\n\n{}", t.render())
    });
}

/// Forks, answers a first query through the router and deletes, from `clients`
/// loops at once, for `duration`; reports the rate and each cycle's time.
async fn churn(cli: &Cli, golden: &str, duration: &str, clients: usize) -> Result<i32> {
    let duration = airlock_core::validate::duration("--duration", duration)?;
    let client = std::sync::Arc::new(cli.client()?);
    let doctor: Doctor = client.call(Method::GET, "/v1/doctor", NO_BODY).await?;
    let router = std::sync::Arc::new(doctor.router);
    let req = ForkRequest { golden: golden.to_owned(), ttl_seconds: Some(600), ..Default::default() };
    let bar = output::spinner(
        cli.json,
        format!("forking and deleting {golden} for {duration:?} from {clients} clients"),
    );
    let began = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients.max(1) {
        let (client, router, req) = (client.clone(), router.clone(), req.clone());
        tasks.push(tokio::spawn(async move {
            let mut cycles = Vec::new();
            while began.elapsed() < duration {
                let t = Instant::now();
                let forked: Forked = client.call(Method::POST, "/v1/sandboxes", Some(&req)).await?;
                first_query(&agent_config(&forked.sandbox, router.as_ref().as_ref(), Via::Router)?).await?;
                let path = format!("/v1/sandboxes/{}", forked.sandbox.id);
                let _: Sandbox = client.call(Method::DELETE, &path, NO_BODY).await?;
                cycles.push(elapsed_ms(t));
            }
            Ok::<_, Error>(cycles)
        }));
    }
    let mut cycles = Vec::new();
    for t in tasks {
        cycles.extend(t.await??);
    }
    let seconds = began.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let rate = cycles.len() as f64 / seconds;
    let all = [series("fork_query_delete_cycle", cycles)];
    let title =
        format!("golden {golden}: {:.1} fork-query-delete cycles per second over {seconds:.0} s", rate);
    report(
        cli,
        &title,
        serde_json::json!({"golden": golden, "per_second": rate, "seconds": seconds}),
        &all,
        false,
    );
    Ok(0)
}

/// Suspends one sandbox again and again and times a router connection's first
/// answer (the wake included), against the same connection to it running.
async fn wake(cli: &Cli, golden: &str, iterations: usize) -> Result<i32> {
    let client = cli.client()?;
    let doctor: Doctor = client.call(Method::GET, "/v1/doctor", NO_BODY).await?;
    let req = ForkRequest { golden: golden.to_owned(), ttl_seconds: Some(600), ..Default::default() };
    let forked: Forked = client.call(Method::POST, "/v1/sandboxes", Some(&req)).await?;
    let config = agent_config(&forked.sandbox, doctor.router.as_ref(), Via::Router)?;
    let path = format!("/v1/sandboxes/{}", forked.sandbox.id);
    let bar = output::spinner(cli.json, format!("waking a sandbox of {golden} {iterations} times"));
    let (mut woken, mut running) = (Vec::new(), Vec::new());
    for _ in 0..iterations.max(1) {
        let _: Sandbox = client.call(Method::POST, &format!("{path}/suspend"), NO_BODY).await?;
        let t = Instant::now();
        first_query(&config).await?;
        woken.push(elapsed_ms(t));
        let t = Instant::now();
        first_query(&config).await?;
        running.push(elapsed_ms(t));
    }
    let _: Sandbox = client.call(Method::DELETE, &path, NO_BODY).await?;
    bar.finish_and_clear();
    let all = [series("connect_to_suspended", woken), series("connect_to_running", running)];
    report(
        cli,
        &format!("golden {golden}: connect and first query through the router"),
        serde_json::json!({"golden": golden}),
        &all,
        false,
    );
    Ok(0)
}
