//! What the running application would feel: its queries planned before and
//! after a candidate (`--app-queries`), and a bounded concurrent workload run
//! while the candidate runs (`--workload`).
//!
//! Both run as the agent role on the candidate's own fork. Nothing they do is
//! kept: queries are only planned (`EXPLAIN`), and a workload's reads run in
//! read-only transactions while its writes are planned — planning takes the
//! same table locks a write takes, so it waits exactly where the write would,
//! without changing a row the measurements would then have to tell apart.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::report::{human_ms, Hazard, Severity};
pub use super::report::{QueryPlan, WorkloadQuery, WorkloadReport};
use airlock_core::error::Result;
use airlock_lifecycle::engine::Engine;
use airlock_lifecycle::sandbox::Sandbox;
use airlock_postgres::catalog::split_qualified;
use airlock_postgres::wire::{Session, TextRows};

/// Most application queries planned per candidate.
pub const MAX_QUERIES: usize = 500;
/// A plan this many times costlier (and at least `REGRESSION_MIN_COST` more) is a regression.
const REGRESSION_RATIO: f64 = 10.0;
const REGRESSION_MIN_COST: f64 = 100.0;

/// A plan, or why there is none.
type Planned = std::result::Result<(f64, Vec<String>), String>;

/// Highest `$n` parameter in a query, outside quotes and comments.
fn parameters(sql: &str) -> usize {
    let b = sql.as_bytes();
    let (mut i, mut max) = (0, 0);
    while i < b.len() {
        match b[i] {
            b'\'' | b'"' => {
                let q = b[i];
                i += 1;
                while i < b.len() && b[i] != q {
                    i += 1;
                }
            }
            b'-' if b.get(i + 1) == Some(&b'-') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'$' if b.get(i + 1).is_some_and(u8::is_ascii_digit)
                && (i == 0 || !b[i - 1].is_ascii_alphanumeric()) =>
            {
                let digits: String =
                    b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).map(|c| *c as char).collect();
                max = max.max(digits.parse().unwrap_or(0));
                i += digits.len();
            }
            _ => {}
        }
        i += 1;
    }
    max
}

/// The statement that runs (or plans) `sql` on a session where it was
/// prepared as `name` when it takes parameters; NULL stands for each one and a
/// generic plan is used, so no parameter value shapes it.
fn invocation(sql: &str, name: &str, explain: &str) -> (Option<String>, String) {
    let n = parameters(sql);
    if n == 0 {
        return (None, format!("{explain}{sql}"));
    }
    let nulls = vec!["NULL"; n].join(", ");
    (Some(format!("PREPARE {name} AS {sql}")), format!("{explain}EXECUTE {name}({nulls})"))
}

async fn run(session: &mut Session, sql: &str) -> std::result::Result<TextRows, String> {
    let mut rows = TextRows::default();
    match session.simple_query(sql, &mut rows).await {
        Err(e) => Err(format!("session failed: {e}")),
        Ok(_) => match rows.error.take() {
            Some(e) => Err(e.message),
            None => Ok(rows),
        },
    }
}

/// Plans one query: its total cost and how it reads each table.
async fn plan(session: &mut Session, sql: &str) -> Planned {
    let (prepare, explain) = invocation(sql, "airlock_app_query", "EXPLAIN (FORMAT JSON) ");
    if let Some(p) = &prepare {
        run(session, p).await?;
    }
    let out = run(session, &explain).await;
    if prepare.is_some() {
        let _ = run(session, "DEALLOCATE airlock_app_query").await;
    }
    let out = out?;
    let json: serde_json::Value =
        serde_json::from_str(out.value().unwrap_or("[]")).map_err(|e| format!("unreadable plan: {e}"))?;
    let top = &json[0]["Plan"];
    let mut access = Vec::new();
    collect_access(top, &mut access);
    access.sort();
    access.dedup();
    Ok((top["Total Cost"].as_f64().unwrap_or(0.0), access))
}

fn collect_access(node: &serde_json::Value, out: &mut Vec<String>) {
    let index = node["Index Name"].as_str().map(|i| format!(" using {i}")).unwrap_or_default();
    match (node["Node Type"].as_str(), node["Relation Name"].as_str()) {
        (Some(kind), Some(rel)) => out.push(format!("{kind} on {rel}{index}")),
        // A bitmap index scan names its index, not its table (its heap scan does).
        (Some(kind), None) if !index.is_empty() => out.push(format!("{kind}{index}")),
        _ => {}
    }
    for child in node["Plans"].as_array().into_iter().flatten() {
        collect_access(child, out);
    }
}

/// Plans every query on a fresh session of the sandbox, as the agent role.
pub async fn plan_all(engine: &Engine, sb: &Sandbox, queries: &[String]) -> Result<Vec<Planned>> {
    if queries.is_empty() {
        return Ok(vec![]);
    }
    let mut session = airlock_lifecycle::sandbox::session::connect(engine, sb).await?;
    let _ = run(&mut session, "SET plan_cache_mode = force_generic_plan").await;
    let mut out = Vec::new();
    for q in queries {
        out.push(plan(&mut session, q).await);
    }
    session.close().await;
    Ok(out)
}

/// What a plan regression is told with: the golden's rows per table, and
/// the indexes the candidate dropped with the lines that dropped them.
#[derive(Debug, Default)]
pub struct Context<'a> {
    /// The golden's rows per table, by `schema.name`.
    pub rows: Option<&'a BTreeMap<String, i64>>,
    /// Indexes dropped (`schema.name`) and the line of the statement that dropped each.
    pub dropped_indexes: Vec<(String, usize)>,
}

impl Context<'_> {
    /// The indexes `statements` dropped, with their lines.
    pub fn dropped_by(statements: &[super::report::StatementReport]) -> Vec<(String, usize)> {
        statements
            .iter()
            .filter(|s| !s.rolled_back)
            .flat_map(|s| {
                s.dropped.iter().filter(|d| d.object_type == "index").map(|d| (d.identity.clone(), s.line))
            })
            .collect()
    }

    /// Why a query plans costlier: the indexes it used that are gone (and
    /// where they went), and the tables it now reads whole.
    fn why(&self, before: &[String], after: &[String]) -> Vec<String> {
        let used = |access: &[String]| -> Vec<String> {
            access.iter().filter_map(|a| a.split(" using ").nth(1)).map(str::to_owned).collect()
        };
        let (was, now) = (used(before), used(after));
        let mut out = Vec::new();
        for index in was.iter().filter(|i| !now.contains(i)) {
            let dropped = self.dropped_indexes.iter().find(|(d, _)| split_qualified(d).1 == *index);
            out.push(match dropped {
                Some((_, line)) => format!("it used index {index}, which line {line} drops"),
                None => format!("it no longer uses index {index}"),
            });
        }
        for table in
            after.iter().filter(|a| !before.contains(a)).filter_map(|a| a.strip_prefix("Seq Scan on "))
        {
            let rows = self.rows.and_then(|rows| {
                let mut named = rows.iter().filter(|(t, _)| split_qualified(t).1 == table);
                match (named.next(), named.next()) {
                    (Some((_, n)), None) => Some(*n),
                    _ => None,
                }
            });
            out.push(match rows {
                Some(n) => format!("now each run reads all {n} rows of {table}"),
                None => format!("now each run reads all of {table}"),
            });
        }
        out
    }

    /// The line that dropped an index one of `access` used.
    fn line(&self, access: &[String]) -> Option<usize> {
        access.iter().filter_map(|a| a.split(" using ").nth(1)).find_map(|index| {
            self.dropped_indexes.iter().find(|(d, _)| split_qualified(d).1 == index).map(|(_, l)| *l)
        })
    }
}

/// Pairs the plans before and after, and the hazards they show.
pub fn compare(
    queries: &[String],
    before: Vec<Planned>,
    after: Vec<Planned>,
    context: &Context,
) -> (Vec<QueryPlan>, Vec<Hazard>) {
    let mut plans = Vec::new();
    let (mut broken, mut slower) = (Vec::new(), Vec::new());
    let mut line = None;
    for ((sql, b), a) in queries.iter().zip(before).zip(after) {
        let short = super::report::cut(&one_line(sql), 300);
        let mut p = QueryPlan {
            sql: short.clone(),
            before: None,
            after: None,
            access_before: vec![],
            access_after: vec![],
            error_before: None,
            error_after: None,
        };
        match b {
            Ok((cost, access)) => (p.before, p.access_before) = (Some(cost), access),
            Err(e) => p.error_before = Some(e),
        }
        match a {
            Ok((cost, access)) => (p.after, p.access_after) = (Some(cost), access),
            Err(e) => p.error_after = Some(e),
        }
        match (p.before, p.after, &p.error_after) {
            (Some(_), None, Some(e)) => broken.push(format!("{} ({e})", super::report::cut(&short, 80))),
            (Some(b), Some(a), _) if a >= b * REGRESSION_RATIO && a - b >= REGRESSION_MIN_COST => {
                let how = if p.access_before != p.access_after {
                    format!(": {} -> {}", p.access_before.join(", "), p.access_after.join(", "))
                } else {
                    String::new()
                };
                let why = context.why(&p.access_before, &p.access_after);
                let why = if why.is_empty() { String::new() } else { format!("; {}", why.join("; ")) };
                line = line.or(context.line(&p.access_before));
                slower.push(format!("{} (cost {b:.0} -> {a:.0}{how}{why})", super::report::cut(&short, 80)));
            }
            _ => {}
        }
        plans.push(p);
    }
    let mut hazards = Vec::new();
    if !broken.is_empty() {
        let mut h = Hazard::new(
            "breaks_queries",
            Severity::High,
            format!(
                "{} of the application's queries no longer plan after it: {}",
                broken.len(),
                some_of(&broken)
            ),
            None,
        );
        h.suggestion = Some("keep the old names and types until the application no longer uses them".into());
        hazards.push(h);
    }
    if !slower.is_empty() {
        let mut h = Hazard::new(
            "plan_regression",
            Severity::Medium,
            format!(
                "{} of the application's queries plan at least {REGRESSION_RATIO:.0}x costlier after it: {}",
                slower.len(),
                some_of(&slower)
            ),
            line,
        );
        h.suggestion = Some("keep (or recreate) the index these queries used".into());
        hazards.push(h);
    }
    (plans, hazards)
}

/// A query on one line for a message: its comment lines left out, its
/// whitespace collapsed.
fn one_line(sql: &str) -> String {
    let code: Vec<&str> = sql.lines().filter(|l| !l.trim_start().starts_with("--")).collect();
    code.join(" ").split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Up to three items, and how many more there are.
fn some_of(items: &[String]) -> String {
    let shown = items.iter().take(3).cloned().collect::<Vec<_>>().join("; ");
    match items.len() {
        n if n > 3 => format!("{shown}; and {} more", n - 3),
        _ => shown,
    }
}

/// A workload to run beside the candidate.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WorkloadSpec {
    /// The application's queries, run round-robin; empty for the default mix
    /// (a read and a write on each golden table the candidate names).
    #[serde(default)]
    pub queries: Vec<String>,
    /// Sessions at once (default 4, at most 8).
    #[serde(default)]
    pub clients: Option<usize>,
}

/// A latency past which a query counts as having waited.
const WAITED_MS: f64 = 100.0;
/// Pause between one session's runs, so the workload stays light on the machine.
const PACE: Duration = Duration::from_millis(10);

/// One query of the workload, ready to run.
#[derive(Clone)]
struct Job {
    label: String,
    kind: &'static str,
    prepare: Option<String>,
    run: String,
}

/// A table's key (as PostgreSQL quotes it: `schema.name`) as SQL.
fn quoted(table: &str) -> String {
    table.to_owned()
}

/// The jobs: the given queries (reads run read-only, writes planned), or the
/// default mix on the golden tables whose names the candidate's text mentions.
fn jobs(spec: &WorkloadSpec, candidate_text: &str, tables: &[String]) -> Vec<Job> {
    if spec.queries.is_empty() {
        let words: std::collections::BTreeSet<String> = candidate_text
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .map(|w| w.to_lowercase())
            .collect();
        let touched =
            tables.iter().filter(|t| words.contains(&t.rsplit('.').next().unwrap_or("").to_lowercase()));
        return touched
            .take(4)
            .flat_map(|t| {
                let q = quoted(t);
                [
                    Job {
                        label: format!("reads of {t}"),
                        kind: "read",
                        prepare: None,
                        run: format!("BEGIN READ ONLY; SELECT 1 FROM {q} LIMIT 1; ROLLBACK"),
                    },
                    // The lock every INSERT, UPDATE and DELETE takes, and nothing else.
                    Job {
                        label: format!("writes to {t}"),
                        kind: "write",
                        prepare: None,
                        run: format!("BEGIN; LOCK TABLE {q} IN ROW EXCLUSIVE MODE; ROLLBACK"),
                    },
                ]
            })
            .collect();
    }
    spec.queries
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let lower = q.to_lowercase();
            // A read that locks rows (FOR UPDATE) counts as a write.
            let writes = lower
                .split(|c: char| !c.is_alphanumeric())
                .any(|w| matches!(w, "insert" | "update" | "delete" | "merge" | "share"));
            let name = format!("airlock_w{i}");
            let label = super::report::cut(&one_line(q), 80);
            if writes {
                let (prepare, run) = invocation(q, &name, "EXPLAIN ");
                Job { label, kind: "write", prepare, run: format!("BEGIN; {run}; ROLLBACK") }
            } else {
                let (prepare, run) = invocation(q, &name, "");
                Job { label, kind: "read", prepare, run: format!("BEGIN READ ONLY; {run}; ROLLBACK") }
            }
        })
        .collect()
}

/// A workload with its sessions open and its queries prepared, ready to run
/// the moment the candidate starts. (Preparing takes the locks a query takes,
/// so it is done before the candidate can hold them.)
pub struct Workload {
    jobs: Vec<Job>,
    sessions: Vec<Session>,
}

impl Workload {
    /// Opens the sessions (as the agent role) and prepares the queries.
    pub async fn prepare(
        engine: &Engine,
        sb: &Sandbox,
        spec: &WorkloadSpec,
        candidate_text: &str,
        tables: &[String],
        statement_timeout: Duration,
    ) -> Result<Workload> {
        let jobs = jobs(spec, candidate_text, tables);
        let clients = if jobs.is_empty() { 0 } else { spec.clients.unwrap_or(4).clamp(1, 8).min(jobs.len()) };
        let mut sessions = Vec::new();
        for _ in 0..clients {
            let mut s = airlock_lifecycle::sandbox::session::connect(engine, sb).await?;
            let _ = run(&mut s, &format!("SET statement_timeout = {}", statement_timeout.as_millis())).await;
            let _ = run(&mut s, "SET plan_cache_mode = force_generic_plan").await;
            for j in &jobs {
                if let Some(p) = &j.prepare {
                    let _ = run(&mut s, p).await;
                }
            }
            sessions.push(s);
        }
        Ok(Workload { jobs, sessions })
    }

    /// Runs until `done` is set; what it felt.
    pub async fn run(self, done: &AtomicBool) -> WorkloadReport {
        let Workload { jobs, sessions } = self;
        if jobs.is_empty() {
            return WorkloadReport {
                summary: vec!["no workload ran: the candidate names none of the golden's tables".into()],
                ..Default::default()
            };
        }
        let clients = sessions.len();
        let started = Instant::now();
        let loops = sessions.into_iter().enumerate().map(|(c, mut session)| {
            let jobs = &jobs;
            async move {
                let mut times: BTreeMap<usize, Timings> = BTreeMap::new();
                let mut k = c;
                while !done.load(Ordering::Relaxed) {
                    let i = k % jobs.len();
                    k += 1;
                    let began = Instant::now();
                    let out = run(&mut session, &jobs[i].run).await;
                    let entry = times.entry(i).or_default();
                    entry.0.push(began.elapsed().as_secs_f64() * 1e3);
                    if let Err(e) = out {
                        entry.1 += 1;
                        entry.2.get_or_insert(e);
                        let _ = run(&mut session, "ROLLBACK").await;
                    }
                    tokio::time::sleep(PACE).await;
                }
                session.close().await;
                times
            }
        });
        let mut merged: BTreeMap<usize, Timings> = BTreeMap::new();
        for client in futures_util::future::join_all(loops).await {
            for (i, (t, errors, error)) in client {
                let m = merged.entry(i).or_default();
                m.0.extend(t);
                m.1 += errors;
                if m.2.is_none() {
                    m.2 = error;
                }
            }
        }
        let mut report = WorkloadReport {
            clients,
            duration_ms: started.elapsed().as_secs_f64() * 1e3,
            ..Default::default()
        };
        for (i, (mut t, errors, error)) in merged {
            t.sort_by(f64::total_cmp);
            let pct = |p: f64| t.get(((t.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0.0);
            let q = WorkloadQuery {
                label: jobs[i].label.clone(),
                kind: jobs[i].kind.into(),
                runs: t.len(),
                p50_ms: round(pct(0.5)),
                p95_ms: round(pct(0.95)),
                max_ms: round(t.last().copied().unwrap_or(0.0)),
                errors,
                error,
            };
            if q.max_ms >= WAITED_MS {
                report.summary.push(format!(
                    "{} waited up to {} (p95 {})",
                    q.label,
                    human_ms(q.max_ms),
                    human_ms(q.p95_ms)
                ));
            }
            report.queries.push(q);
        }
        if report.summary.is_empty() {
            report.summary.push(format!("no workload query waited {WAITED_MS:.0} ms or more"));
        }
        report
    }
}

/// One query's latencies, failures and first error.
type Timings = (Vec<f64>, usize, Option<String>);

fn round(ms: f64) -> f64 {
    (ms * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_counted_outside_quotes() {
        assert_eq!(parameters("SELECT * FROM t WHERE a = $1 AND b = $12"), 12);
        assert_eq!(parameters("SELECT '$3' -- $4\n, $$x$$"), 0);
        assert_eq!(parameters("SELECT 1"), 0);
        let (prepare, run) = invocation("SELECT $2::int", "q", "EXPLAIN ");
        assert_eq!(prepare.as_deref(), Some("PREPARE q AS SELECT $2::int"));
        assert_eq!(run, "EXPLAIN EXECUTE q(NULL, NULL)");
    }

    #[test]
    fn regressions_and_breaks_are_told_apart() {
        let q = vec!["SELECT a".to_owned(), "SELECT b".to_owned(), "SELECT c".to_owned()];
        let before = vec![Ok((8.0, vec!["Index Scan on t".into()])), Ok((5.0, vec![])), Ok((5.0, vec![]))];
        let after = vec![
            Ok((1800.0, vec!["Seq Scan on t".into()])),
            Err("column \"b\" does not exist".into()),
            Ok((6.0, vec![])),
        ];
        let (plans, hazards) = compare(&q, before, after, &Context::default());
        assert_eq!(plans.len(), 3);
        let kinds: Vec<&str> = hazards.iter().map(|h| h.kind.as_str()).collect();
        assert_eq!(kinds, ["breaks_queries", "plan_regression"]);
        assert!(hazards[1].message.contains("Index Scan on t -> Seq Scan on t"));
    }

    #[test]
    fn a_regression_names_the_index_gone_and_the_rows_now_read() {
        let q = vec!["SELECT * FROM t WHERE a = $1".to_owned()];
        let before = vec![Ok((8.0, vec!["Index Scan on t using t_a".into()]))];
        let after = vec![Ok((1800.0, vec!["Seq Scan on t".into()]))];
        let rows = BTreeMap::from([("public.t".to_owned(), 40_000)]);
        let context = Context { rows: Some(&rows), dropped_indexes: vec![("public.t_a".into(), 3)] };
        let (_, hazards) = compare(&q, before, after, &context);
        let said = &hazards[0].message;
        assert!(
            said.contains("it used index t_a, which line 3 drops; now each run reads all 40000 rows of t"),
            "{said}"
        );
        assert_eq!(hazards[0].line, Some(3));
    }
}
