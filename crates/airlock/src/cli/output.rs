//! Human and JSON output, and error reporting.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use airlock_core::clock::Timestamp;
use airlock_core::error::Error;
use airlock_core::events::Event;
use airlock_lifecycle::doctor::Doctor;
use airlock_lifecycle::golden::Golden;
use airlock_lifecycle::sandbox::Sandbox;

/// Writes one line to stdout. When the reader has gone (`airlock ls | head`),
/// the process ends quietly with success, as the reader wanted no more.
pub fn line(text: &str) {
    write_stdout(format!("{text}\n").as_bytes());
}

/// Writes bytes to stdout as they are; a reader that has gone ends the process
/// quietly (see [`line`]).
pub fn write_stdout(bytes: &[u8]) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(bytes).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: writing to stdout failed: {e}");
        std::process::exit(1);
    }
}

/// Prints `value` as JSON, or the human text `human` makes.
pub fn print<T: Serialize>(json: bool, value: &T, human: impl FnOnce() -> String) {
    if json {
        line(&serde_json::to_string_pretty(value).expect("output serializes"));
    } else {
        let text = human();
        if !text.is_empty() {
            line(text.trim_end());
        }
    }
}

/// Reports an error: JSON on stdout with `--json`, else `error[code]` and a hint on stderr.
pub fn error(e: &Error, json: bool) {
    if json {
        line(&serde_json::json!({ "error": e }).to_string());
    } else {
        eprintln!("error[{}]: {}\n  hint: {}", e.code.as_str(), e.message, e.hint);
    }
}

/// A spinner with elapsed time on stderr for long requests; hidden for JSON or without a terminal.
pub fn spinner(json: bool, message: String) -> ProgressBar {
    if json {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    bar.set_style(ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("valid template"));
    bar.set_message(message);
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

/// A plain text table with left-aligned columns.
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headings.
    pub fn new(headings: &[&str]) -> Table {
        Table { rows: vec![headings.iter().map(|h| h.to_string()).collect()] }
    }

    /// Adds a row.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as text.
    pub fn render(&self) -> String {
        let cols = self.rows[0].len();
        let widths: Vec<usize> = (0..cols)
            .map(|c| self.rows.iter().map(|r| r.get(c).map_or(0, |s| s.chars().count())).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        for row in &self.rows {
            let line: Vec<String> =
                row.iter().enumerate().map(|(i, s)| format!("{s:<w$}", w = widths[i])).collect();
            out.push_str(line.join("  ").trim_end());
            out.push('\n');
        }
        out
    }
}

/// Bytes as B/KiB/MiB/GiB.
pub fn bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i < units.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[i])
    }
}

fn remaining(t: Timestamp) -> String {
    let d = t.remaining();
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

fn labels(sb: &Sandbox) -> String {
    sb.labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

/// The sandbox list.
pub fn sandboxes(list: &[Sandbox]) -> String {
    if list.is_empty() {
        return "no sandboxes".into();
    }
    // A cluster's listing says each sandbox's node; a lone daemon's has none to say.
    let clustered = list.iter().any(|sb| sb.node.is_some());
    let mut heads = vec!["ID", "NAME", "GOLDEN", "STATE", "EXPIRES IN", "LABELS"];
    if clustered {
        heads.insert(4, "NODE");
    }
    let mut t = Table::new(&heads);
    for sb in list {
        let mut row = vec![
            sb.id.clone(),
            sb.name.clone().unwrap_or_default(),
            format!("{}@{}", sb.golden, sb.generation),
            sb.state.as_str().into(),
            remaining(sb.expires_at),
            labels(sb),
        ];
        if clustered {
            row.insert(4, sb.node.clone().unwrap_or_default());
        }
        t.row(row);
    }
    t.render()
}

/// The cluster's nodes, one a line.
pub fn nodes(list: &[airlock_cluster::records::NodeRecord]) -> String {
    let mut t = Table::new(&[
        "NODE",
        "STATE",
        "ADDRESS",
        "SANDBOXES",
        "RUNNING",
        "FREE MEMORY",
        "FREE DISK",
        "GOLDENS",
        "LABELS",
    ]);
    for n in list {
        let goldens = n
            .goldens
            .iter()
            .map(|(g, gens)| format!("{g}@{}", gens.last().copied().unwrap_or(0)))
            .collect::<Vec<_>>()
            .join(",");
        let node_labels = n.labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
        t.row(vec![
            n.name.clone(),
            n.state.clone(),
            n.advertise.clone(),
            if n.state == "up" {
                format!("{}/{}", n.sandboxes, n.max_sandboxes)
            } else {
                n.sandboxes.to_string()
            },
            if n.state == "up" { format!("{}/{}", n.running, n.max_running) } else { String::new() },
            if n.state == "up" { format!("{}M", n.free_memory_bytes >> 20) } else { String::new() },
            if n.state == "up" { format!("{}M", n.free_disk_bytes >> 20) } else { String::new() },
            goldens,
            node_labels,
        ]);
    }
    t.render()
}

/// One sandbox, field by field (the DSN only through `airlock dsn`).
pub fn sandbox(sb: &Sandbox) -> String {
    let mut t = Table::new(&["FIELD", "VALUE"]);
    t.row(vec!["id".into(), sb.id.clone()]);
    t.row(vec!["name".into(), sb.name.clone().unwrap_or_default()]);
    t.row(vec!["golden".into(), format!("{}@{}", sb.golden, sb.generation)]);
    t.row(vec!["state".into(), sb.state.as_str().into()]);
    t.row(vec!["created_at".into(), sb.created_at.to_rfc3339()]);
    t.row(vec![
        "expires_at".into(),
        format!("{} (in {})", sb.expires_at.to_rfc3339(), remaining(sb.expires_at)),
    ]);
    t.row(vec!["labels".into(), labels(sb)]);
    t.row(vec!["mode".into(), format!("{:?}", sb.access.mode).to_lowercase()]);
    let l = &sb.access.limits;
    t.row(vec![
        "limits".into(),
        format!(
            "statement_timeout={}ms lock_timeout={}ms idle_in_transaction={}ms temp_file_limit={}kB work_mem={}kB connections={}",
            l.statement_timeout_ms, l.lock_timeout_ms, l.idle_in_transaction_timeout_ms, l.temp_file_limit_kb, l.work_mem_kb, l.connection_limit
        ),
    ]);
    t.row(vec!["dsn".into(), format!("`airlock dsn {}`", sb.id)]);
    t.render()
}

/// The golden list.
pub fn goldens(list: &[Golden]) -> String {
    if list.is_empty() {
        return "no goldens".into();
    }
    let mut t = Table::new(&["NAME", "GENERATION", "SIZE", "SANDBOXES", "POOL", "CREATED"]);
    for g in list {
        let cur = g.current();
        t.row(vec![
            g.name.clone(),
            g.current_generation.to_string(),
            cur.map(|m| bytes(m.size_bytes)).unwrap_or_default(),
            g.sandboxes.to_string(),
            format!("{}/{}", g.pooled, g.pool_size),
            cur.map(|m| m.created_at.to_rfc3339()).unwrap_or_default(),
        ]);
    }
    t.render()
}

/// A golden build's progress, for the spinner.
pub fn build_progress(name: &str, p: &airlock_lifecycle::golden::progress::BuildProgress) -> String {
    let mut text = format!("building golden {name}: {}", p.phase);
    if p.tables_total > 0 {
        text.push_str(&format!(", {}/{} tables", p.tables_done.min(p.tables_total), p.tables_total));
    } else if p.tables_done > 0 {
        text.push_str(&format!(", {} tables", p.tables_done));
    }
    if p.bytes > 0 {
        text.push_str(&format!(", {}", bytes(p.bytes)));
    }
    text
}

/// An import's fidelity report, a few lines.
pub fn import_report(r: &airlock_postgres::imported::Report) -> String {
    let mut out = format!(
        "import: {} tables, {} rows, {} in {:.1}s (dump {:.1}s{}, restore {:.1}s, {} jobs)\n",
        r.tables,
        r.rows,
        bytes(r.bytes),
        r.dump_seconds + r.restore_seconds,
        r.dump_seconds,
        if r.resumed { ", resumed from a kept dump" } else { "" },
        r.restore_seconds,
        r.jobs
    );
    out.push_str(&format!(
        "fidelity: {}\n",
        if !r.compared {
            "a dump file: every entry restored; no live source to compare with".to_owned()
        } else if r.differs() {
            format!("DIFFERS: {}", r.differences(20))
        } else {
            format!(
                "catalog and row counts match the source ({})",
                r.source_version.as_deref().unwrap_or("?")
            )
        }
    ));
    if let Some(note) = &r.major_note {
        out.push_str(&format!("note: {note}\n"));
    }
    if !r.imported.extensions.is_empty() {
        let list: Vec<String> =
            r.imported.extensions.iter().map(|e| format!("{} {}", e.name, e.version)).collect();
        out.push_str(&format!("extensions: {}\n", list.join(", ")));
    }
    if !r.imported.roles.is_empty() {
        out.push_str(&format!("roles created (NOLOGIN): {}\n", r.imported.roles.join(", ")));
    }
    for line in &r.imported.not_carried {
        out.push_str(&format!("not carried: {line}\n"));
    }
    if let Some(m) = &r.masking {
        out.push_str(&format!(
            "masking: {} columns masked in {:.1}s; {} unique keys and {} references holding on the masked values; leak check {}\n",
            m.columns.len(),
            m.seconds,
            m.unique_keys_checked,
            m.references_checked,
            if m.passed { "PASSED" } else { "FAILED" }
        ));
        let mut t = Table::new(&[
            "COLUMN",
            "TRANSFORM",
            "BECAUSE",
            "DISTINCT",
            "REDRAWN",
            "KEPT",
            "CHECKED",
            "LEAKS",
        ]);
        for c in &m.columns {
            t.row(vec![
                c.column.clone(),
                c.transform.clone(),
                c.because.clone(),
                c.distinct_values.to_string(),
                c.collisions_resolved.to_string(),
                c.kept.to_string(),
                c.checked.clone(),
                c.leaks.to_string(),
            ]);
        }
        out.push_str(&t.render());
        let e = &m.elsewhere;
        out.push_str(&format!(
            "leak search: {} source values looked for, whole or inside, in {} columns (every row, {}); found {}\n",
            e.values,
            e.columns_searched,
            bytes(e.bytes_searched),
            if e.found.is_empty() { "none".to_owned() } else { e.found.join("; ") }
        ));
        for c in &m.allowed_unmasked {
            out.push_str(&format!("left unmasked on purpose: {c}\n"));
        }
    }
    if let Some(s) = &r.subset {
        out.push_str(&format!(
            "subset: from {}{}; {} references checked, all holding ({:.1}s)\n",
            s.roots.join("; "),
            s.percent.map_or(String::new(), |p| format!(", {p}%")),
            s.references_checked,
            s.seconds
        ));
        let mut t = Table::new(&["TABLE", "SOURCE ROWS", "KEPT", "WHY"]);
        for table in &s.tables {
            t.row(vec![
                table.table.clone(),
                table.source_rows.to_string(),
                table.kept_rows.to_string(),
                table.why.clone(),
            ]);
        }
        out.push_str(&t.render());
    }
    out
}

/// What `golden scan` found.
pub fn scan(r: &airlock_lifecycle::golden::scan::ScanReport, written: bool) -> String {
    let mut t = Table::new(&["COLUMN", "TYPE", "HOLDS", "PROPOSED", "WHY"]);
    for c in &r.columns {
        t.row(vec![
            c.column.clone(),
            c.type_name.clone(),
            c.class.clone(),
            c.proposed.transform.clone(),
            c.reason.clone(),
        ]);
    }
    let mut out = format!(
        "{} columns of {} tables hold personal data ({} rows sampled per table at most, {:.1}s)\n",
        r.columns.len(),
        r.tables,
        r.sample,
        r.seconds
    );
    out.push_str(&t.render());
    if !written {
        out.push_str("\nproposed rules (pass --out FILE to write them):\n\n");
        out.push_str(&r.rules);
    }
    out
}

/// What `golden replicate` did, one line per node.
pub fn replicated(done: &[airlock_cluster::replicate::Fetched]) -> String {
    let lines: Vec<String> = done
        .iter()
        .map(|f| match &f.from {
            None => format!("{}: holds {} generation {} already", f.node, f.golden, f.generation),
            Some(from) => format!(
                "{}: {} generation {} from {from}, {:.1} MB in {:.1}s ({:.0} MB/s){}, every file checked",
                f.node,
                f.golden,
                f.generation,
                f.bytes as f64 / 1e6,
                f.seconds,
                f.mb_per_s,
                if f.attempts > 1 { format!(", {} tries", f.attempts) } else { String::new() }
            ),
        })
        .collect();
    lines.join("\n")
}

/// One golden and its generations.
pub fn golden(g: &Golden) -> String {
    let mut out = format!(
        "golden {} (current generation {}, {} sandboxes, pool {}/{})\nsource: {}\n\n",
        g.name,
        g.current_generation,
        g.sandboxes,
        g.pooled,
        g.pool_size,
        serde_json::to_string(&g.source).unwrap_or_default()
    );
    let mut t = Table::new(&["GENERATION", "POSTGRES", "SIZE", "SCHEMA HASH", "CREATED"]);
    for m in &g.generations {
        t.row(vec![
            m.generation.to_string(),
            if m.has_postgres() { m.postgres_version.clone() } else { "none (Redis only)".into() },
            bytes(m.size_bytes),
            if m.has_postgres() { m.schema_hash.chars().take(12).collect() } else { "-".into() },
            m.created_at.to_rfc3339(),
        ]);
    }
    out.push_str(&t.render());
    if let Some(m) = g.current().and_then(|m| m.masking.as_ref()) {
        out.push_str(&format!(
            "\nMASKED: {} columns ({}), leak check {}{}{}\n",
            m.columns.len(),
            m.columns.join(", "),
            if m.leak_check_passed { "passed" } else { "not run" },
            m.subset.as_ref().map_or(String::new(), |s| format!("; subset of {s}")),
            m.inherited_from.as_ref().map_or(String::new(), |f| format!("; promoted from a fork of {f}"))
        ));
    } else if g.current().is_some_and(|m| m.has_postgres()) {
        out.push_str("\nnot masked: the golden holds its source's values\n");
    }
    if let Some(redis) = g.current().and_then(|m| m.redis.as_ref()) {
        out.push_str(&format!(
            "\nredis: {} keys, {} in memory, RDB {}\n",
            redis.keys,
            bytes(redis.memory_bytes),
            bytes(redis.rdb_bytes)
        ));
    }
    if let Some(report) = g.current().and_then(|m| m.import.as_ref()) {
        out.push('\n');
        out.push_str(&import_report(report));
    }
    out
}

/// The event list.
pub fn events(list: &[Event]) -> String {
    let mut t = Table::new(&["TIME", "KIND", "DOOR", "SANDBOX", "GOLDEN", "REASON", "DETAIL"]);
    for e in list {
        t.row(vec![
            e.at.to_rfc3339(),
            e.kind.clone(),
            e.door.clone().unwrap_or_default(),
            e.sandbox.clone().unwrap_or_default(),
            e.golden.clone().unwrap_or_default(),
            e.reason.clone().unwrap_or_default(),
            if e.detail.as_object().is_some_and(|o| o.is_empty()) {
                String::new()
            } else {
                printable(&e.detail.to_string())
            },
        ]);
    }
    t.render()
}

/// Text an agent may have written, safe for a terminal: control characters,
/// line separators and bidirectional overrides (which can make a line read
/// as another) shown as `\u{...}` escapes.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            let hidden = (c.is_control() && c != '\t')
                || matches!(c, '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{061c}')
                || ('\u{202a}'..='\u{202e}').contains(&c)
                || ('\u{2066}'..='\u{2069}').contains(&c);
            if hidden {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// PostgreSQL majors the daemon runs on.
pub fn majors(majors: &[airlock_postgres::majors::MajorInfo]) -> String {
    let mut t = Table::new(&["MAJOR", "VERSION", "ORIGIN", "BIN", "CLIENT TOOLS", "STATE"]);
    for m in majors {
        t.row(vec![
            format!("{}{}", m.major, if m.default { "*" } else { "" }),
            m.version.clone(),
            m.origin.clone(),
            m.bin.clone(),
            m.clients.clone().unwrap_or_else(|| "-".into()),
            m.problem.clone().unwrap_or_else(|| "ready".into()),
        ]);
    }
    t.render()
}

/// What `postgres install` did.
pub fn installed(reports: &[airlock_postgres::install::Report]) -> String {
    let mut lines: Vec<String> = reports
        .iter()
        .map(|r| match r.already {
            true => format!("PostgreSQL {} was already installed in {}", r.version, r.dir),
            false => format!("installed PostgreSQL {} in {}", r.version, r.dir),
        })
        .collect();
    lines.extend(reports.iter().filter_map(|r| r.clients.as_ref()).map(|c| format!("client tools in {c}")));
    lines.push("restart the daemon (`airlock daemon stop`) so it finds them".into());
    lines.join("\n")
}

/// The doctor report.
pub fn doctor(d: &Doctor) -> String {
    let mut t = Table::new(&["CHECK", "VALUE"]);
    t.row(vec!["airlock".into(), d.version.clone()]);
    t.row(vec!["data root".into(), d.home.clone()]);
    t.row(vec!["volume".into(), format!("{} ({})", d.volume, d.filesystem)]);
    t.row(vec!["storage backend".into(), format!("{:?}", d.storage_backend).to_lowercase()]);
    t.row(vec!["postgres".into(), format!("{} ({})", d.postgres_version, d.postgres_bin)]);
    t.row(vec!["extensions".into(), format!("{} available: {}", d.extensions.len(), d.extensions.join(" "))]);
    for m in &d.postgres_majors {
        let state = match &m.problem {
            Some(why) => format!("unusable: {why}"),
            None => format!("{} {} ({})", m.version, m.origin, m.bin),
        };
        t.row(vec![format!("postgres {}{}", m.major, if m.default { " (default)" } else { "" }), state]);
    }
    t.row(vec!["daemon user".into(), d.daemon_user.clone()]);
    t.row(vec!["instance user".into(), d.instance_user.clone()]);
    t.row(vec!["one OS user per sandbox".into(), d.per_sandbox_users.to_string()]);
    t.row(vec!["network namespace per sandbox".into(), d.network_namespaces.to_string()]);
    let cg = match &d.cgroups {
        airlock_host::cgroup::Cgroups::V2 { .. } => "v2",
        airlock_host::cgroup::Cgroups::V1 { .. } => "v1",
        airlock_host::cgroup::Cgroups::Unavailable => "unavailable",
    };
    t.row(vec![
        "cgroup limits".into(),
        format!(
            "{cg}: memory {}, pids {}, cpu weight {}",
            bytes(d.cgroup_limits.memory_bytes),
            d.cgroup_limits.pids,
            d.cgroup_limits.cpu_weight
        ),
    ]);
    t.row(vec!["disk limit (growth)".into(), bytes(d.disk_limit_bytes)]);
    t.row(vec!["max sandboxes / running".into(), format!("{} / {}", d.max_sandboxes, d.max_running)]);
    t.row(vec!["max disk (volume)".into(), d.max_disk_bytes.map_or_else(|| "no limit".to_owned(), bytes)]);
    t.row(vec![
        "idle suspend (default)".into(),
        match d.default_idle_suspend_seconds {
            0 => "never".to_owned(),
            s => format!("{s}s"),
        },
    ]);
    let router = match &d.router {
        None => "off".to_owned(),
        Some(r) => {
            let mode = format!("{:?}", r.tls).to_lowercase();
            let tls = match (r.tls, &r.ca) {
                (airlock_router::TlsMode::Off, _) => "no TLS".to_owned(),
                (_, Some(ca)) => format!("TLS {mode}, CA {}", ca.display()),
                (_, None) => format!("TLS {mode}, configured certificate"),
            };
            format!("{}:{} ({tls})", r.host, r.port)
        }
    };
    t.row(vec!["router".into(), router]);
    t.row(vec!["mcp gateway".into(), d.gateway.clone().map_or("off".into(), |g| format!("{g}/mcp/TOKEN"))]);
    t.row(vec!["default / max TTL".into(), format!("{}s / {}s", d.default_ttl_seconds, d.max_ttl_seconds)]);
    let mut out = t.render();
    for w in &d.warnings {
        out.push_str(&format!("warning: {w}\n"));
    }
    out
}

/// Live targets as a table.
pub fn targets(list: &[airlock_live::target::Target]) -> String {
    if list.is_empty() {
        return "no live targets".into();
    }
    let mut t = Table::new(&["NAME", "DATABASE", "USER", "VERSION", "TLS", "ADDED"]);
    for target in list {
        let c = &target.checks;
        t.row(vec![
            target.name.clone(),
            c.database.clone(),
            c.user.clone(),
            c.server_version.clone(),
            if c.tls { "yes".into() } else { "no".into() },
            target.added_at.to_rfc3339(),
        ]);
    }
    t.render()
}

/// One live target, as lines.
pub fn target(t: &airlock_live::target::Target) -> String {
    let c = &t.checks;
    let mut lines = vec![
        format!("live target {}", t.name),
        format!("  dsn:      {} (its password is kept by the daemon alone)", c.dsn),
        format!(
            "  database: {} as {}{}",
            c.database,
            c.user,
            if c.superuser { " (a superuser)" } else { "" }
        ),
        format!(
            "  server:   PostgreSQL {}, {}",
            c.server_version,
            if c.tls { "over TLS" } else { "not encrypted" }
        ),
        format!("  added:    {}", t.added_at.to_rfc3339()),
    ];
    for gap in &c.cannot_take_away {
        lines.push(format!("  note: {gap}"));
    }
    lines.join("\n")
}

/// A grant as minted: its DSN, what it may read, and what it cannot be kept from.
pub fn granted(g: &airlock_live::grant::Granted) -> String {
    let mut lines = vec![g.dsn.clone(), grant(&g.grant)];
    lines.push("(the DSN is shown this once; `airlock revoke ID` ends the grant)".into());
    lines.join("\n")
}

/// One grant, as lines.
pub fn grant(g: &airlock_live::grant::Grant) -> String {
    let mut lines = vec![
        format!("grant {} on {} as role {}", g.id, g.target, g.role),
        format!("  reads:    {}", g.tables.join(", ")),
    ];
    if let Some(w) = &g.where_clause {
        lines.push(format!("  rows:     where {w} (through views in schema {})", g.search_path.join(", ")));
    }
    lines.push(format!(
        "  limits:   statements {} ms, {} sessions, until {}",
        g.statement_timeout_ms,
        g.connections,
        g.expires_at.to_rfc3339()
    ));
    for gap in &g.cannot_take_away {
        lines.push(format!("  note: {gap}"));
    }
    lines.join("\n")
}

/// Live grants as a table.
pub fn grants(list: &[airlock_live::grant::Grant]) -> String {
    if list.is_empty() {
        return "no live grants".into();
    }
    let mut t = Table::new(&["ID", "TARGET", "TABLES", "WHERE", "EXPIRES"]);
    for g in list {
        t.row(vec![
            g.id.clone(),
            g.target.clone(),
            g.tables.join(","),
            g.where_clause.clone().unwrap_or_else(|| "-".into()),
            g.expires_at.to_rfc3339(),
        ]);
    }
    t.render()
}
