//! The report as one HTML page to look at (`--format html`): per candidate,
//! its hazards with their safer forms, a timeline of the locks it held, its
//! statements, its schema changes and the rows it changed.
//!
//! The page is whole in itself: its style is inline, it loads nothing and runs
//! nothing. Everything a candidate wrote (its name, its SQL, an identifier, an
//! error it raised) reaches the page only through maud's escaping splices;
//! the one piece of markup not escaped is the fixed style sheet below. A
//! Content-Security-Policy of `default-src 'none'` also tells the browser to
//! run no script and fetch nothing, should anything get through.

use maud::{html, Markup, PreEscaped, DOCTYPE};

use super::locks::blocks_reads;
use super::report::human_ms;
use super::report::{cut, rows_by_table, CandidateReport, Hazard, LockHeld, Report, StatementReport};

/// The page's style: fixed text, no part of it from a report.
const STYLE: &str = "
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #1f2328; background: #fff; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 36px; border-top: 1px solid #d0d7de; padding-top: 16px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
code, pre { font: 12px/1.4 ui-monospace, monospace; }
pre { background: #f6f8fa; padding: 6px 8px; margin: 2px 0; white-space: pre-wrap; word-break: break-word; }
table { border-collapse: collapse; } td, th { border: 1px solid #d0d7de; padding: 3px 8px; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.verdict { display: inline-block; padding: 1px 8px; border-radius: 4px; color: #fff; font-weight: 600; }
.pass { background: #1a7f37; } .fail { background: #6e7781; }
.sev { display: inline-block; min-width: 56px; padding: 0 6px; border-radius: 3px; font-size: 12px; border: 1px solid; text-align: center; }
.sev-critical { border-color: #82071e; color: #82071e; } .sev-high { border-color: #9a3412; color: #9a3412; }
.sev-medium { border-color: #7d4e00; color: #7d4e00; } .sev-low { border-color: #57606a; color: #57606a; }
ul.hazards { list-style: none; padding: 0; } ul.hazards li { margin: 6px 0; }
.safer { margin-left: 64px; color: #0a3069; }
.timeline { position: relative; width: 100%; max-width: 1100px; }
.lane { display: flex; align-items: center; height: 26px; }
.lane .what { width: 300px; flex: none; overflow: hidden; white-space: nowrap; text-overflow: ellipsis; font-size: 12px; }
.lane .track { position: relative; flex: 1; height: 18px; background: #f6f8fa; }
.lane .figures { width: 260px; flex: none; padding-left: 8px; font-size: 12px; white-space: nowrap; }
.bar { position: absolute; top: 2px; height: 14px; min-width: 4px; }
.blocks-reads-and-writes { background: rgb(215, 38, 61); }
.blocks-writes { background: rgb(242, 158, 76); }
.blocks-nothing { background: rgb(143, 163, 184); }
.statement { position: absolute; top: 0; height: 18px; border-left: 1px solid #8c959f; font-size: 11px; padding-left: 2px; overflow: hidden; }
.legend span { display: inline-block; width: 12px; height: 12px; vertical-align: middle; margin: 0 4px 0 12px; }
.change-added { color: #1a7f37; } .change-dropped { color: #82071e; } .change-changed { color: #7d4e00; }
";

impl Report {
    /// The report as one self-contained HTML page.
    pub fn html(&self) -> String {
        let passed = self.candidates.iter().filter(|c| c.passed).count();
        let title = format!("Airlock migration test: {passed} of {} passed", self.candidates.len());
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'";
                    meta name="viewport" content="width=device-width, initial-scale=1";
                    title { (title) }
                    style { (PreEscaped(STYLE)) }
                }
                body {
                    h1 { (title) " on golden " code { (self.golden) "@" (self.generation) } }
                    p { (self.scale.describe()) "." }
                    @if let Some(best) = &self.best { p { "Best passing candidate: " strong { (best) } } }
                    (summary(self))
                    @for (i, c) in self.candidates.iter().enumerate() { (candidate(i, c)) }
                }
            }
        }
        .into_string()
    }
}

/// The table of every candidate, in ranking order.
fn summary(report: &Report) -> Markup {
    let ranked = report.ranking.iter().filter_map(|n| report.candidates.iter().position(|c| &c.name == n));
    let unranked =
        (0..report.candidates.len()).filter(|i| !report.ranking.contains(&report.candidates[*i].name));
    html! {
        table.summary {
            tr { th { "rank" } th { "candidate" } th { "verdict" } th { "hazards" } th { "time" } }
            @for (rank, i) in ranked.chain(unranked).enumerate() {
                @let c = &report.candidates[i];
                tr {
                    td.n { (rank + 1) }
                    td { a href=(format!("#candidate-{i}")) { (c.name) } }
                    td { (verdict(c.passed)) }
                    td { @for h in &c.hazards { code { (h.kind) } " " } }
                    td.n { (human_ms(c.duration_ms)) }
                }
            }
        }
    }
}

fn verdict(passed: bool) -> Markup {
    html! { @if passed { span.verdict.pass { "PASS" } } @else { span.verdict.fail { "FAIL" } } }
}

/// One candidate's section.
fn candidate(i: usize, c: &CandidateReport) -> Markup {
    let rows = rows_by_table(&c.statements, false);
    html! {
        section.candidate id=(format!("candidate-{i}")) {
            h2 { (verdict(c.passed)) " " (c.name) }
            p { (c.kind) ", " (human_ms(c.duration_ms)) ", sha256 " code { (c.sha256.get(..12).unwrap_or(&c.sha256)) }
                @if let Some(node) = &c.node { ", on node " (node) } }
            @if let Some(f) = &c.failure {
                p { strong { "Failed" } " at line " (f.line) ": " (f.error.message) }
            }
            h3 { "Hazards" }
            @if c.hazards.is_empty() && c.notes.is_empty() { p { "None." } }
            ul.hazards { @for h in c.hazards.iter().chain(&c.notes) { (hazard(h)) } }
            @if let Some(x) = &c.exec {
                h3 { "Command" }
                p {
                    @match x.exit_code { Some(code) => { "exited with " (code) }, None => { "killed" } }
                    @if x.timed_out { " (timed out)" }
                }
                @if !x.stdout.is_empty() { h4 { "standard output (its end)" } pre { (x.stdout) } }
                @if !x.stderr.is_empty() { h4 { "standard error (its end)" } pre { (x.stderr) } }
            }
            @if !c.assertions.is_empty() {
                h3 { "Assertions" }
                ul { @for a in &c.assertions { li { @if a.passed { "holds: " } @else { strong { "fails: " } } code { (a.sql) } @if let Some(d) = &a.detail { " (" (d) ")" } } } }
            }
            h3 { "Lock timeline" }
            (timeline(&c.statements))
            h3 { "Statements" }
            (statements(&c.statements))
            h3 { "Schema changes" }
            @if c.changes.is_empty() { p { "None." } }
            ul.changes { @for ch in &c.changes { li class=(format!("change-{}", ch.change)) { code { (ch.line()) } } } }
            h3 { "Row changes" }
            @if rows.is_empty() { p { "None." } } @else {
                table.rows {
                    tr { th { "table" } th { "inserted" } th { "updated" } th { "deleted" } th { "rows changed (compared)" } }
                    @for (table, [inserted, updated, deleted]) in &rows {
                        tr {
                            td { code { (table) } }
                            td.n { (inserted) } td.n { (updated) } td.n { (deleted) }
                            td.n { (c.changed_rows.get(*table).map(|n| n.to_string()).unwrap_or_default()) }
                        }
                    }
                }
            }
        }
    }
}

fn hazard(h: &Hazard) -> Markup {
    let severity = h.severity.as_str();
    html! {
        li {
            span class=(format!("sev sev-{severity}")) { (severity) } " "
            code { (h.kind) } ": " (h.message)
            @if let Some(line) = h.line { " (line " (line) ")" }
            @if let Some(ms) = h.estimated_ms { " [est. " (human_ms(ms)) "]" }
            @if let Some(s) = &h.suggestion { div.safer { "Safer: " (s) } }
        }
    }
}

/// What a lock makes other sessions wait for, as its bar's class.
pub fn blocks(lock: &LockHeld) -> &'static str {
    if blocks_reads(&lock.mode) {
        "blocks-reads-and-writes"
    } else if lock.blocking {
        "blocks-writes"
    } else {
        "blocks-nothing"
    }
}

/// A lock of the timeline: the statement that took it, when, and the lock.
pub struct Bar<'a> {
    /// The statement's place in the candidate.
    pub statement: usize,
    /// When its statement started, milliseconds from the first's start.
    pub start_ms: f64,
    /// The lock.
    pub lock: &'a LockHeld,
}

/// Each statement's start, the locks in the order they were taken, and the
/// span of the whole axis, milliseconds. Statements ran one after another, so
/// each starts where the one before ended; a lock is held from its
/// statement's start for as long as it was measured to be.
pub fn bars(statements: &[StatementReport]) -> (Vec<f64>, Vec<Bar<'_>>, f64) {
    let mut starts = Vec::with_capacity(statements.len());
    let mut at = 0.0;
    for s in statements {
        starts.push(at);
        at += s.duration_ms.max(0.0);
    }
    let bars: Vec<Bar> = statements
        .iter()
        .enumerate()
        // An index's lock that blocks nothing ordinary (each write's ROW
        // EXCLUSIVE on every index) says nothing its table's does not.
        .flat_map(|(i, s)| {
            s.locks.iter().filter(|l| l.kind != "index" || l.blocking).map(move |lock| (i, lock))
        })
        .map(|(i, lock)| Bar { statement: i, start_ms: starts[i], lock })
        .collect();
    let span = bars.iter().map(|b| b.start_ms + b.lock.held_ms.max(0.0)).fold(at, f64::max).max(1.0);
    (starts, bars, span)
}

fn timeline(statements: &[StatementReport]) -> Markup {
    let (starts, bars, span) = bars(statements);
    let pct = |ms: f64| format!("{:.3}%", (ms / span * 100.0).clamp(0.0, 100.0));
    html! {
        @if bars.is_empty() { p { "No lock was held." } } @else {
            div.timeline data-span-ms=(format!("{span:.3}")) {
                div.lane {
                    div.what { "statements (by line), 0 to " (human_ms(span)) }
                    div.track {
                        @for (i, s) in statements.iter().enumerate() {
                            div.statement style=(format!("left: {}; width: {}", pct(starts[i]), pct(s.duration_ms)))
                                title=(cut(&s.sql, 200)) { (s.line) }
                        }
                    }
                    div.figures {}
                }
                @for b in &bars {
                    div.lane {
                        div.what title=(b.lock.relation) {
                            (b.lock.mode) " on " code { (b.lock.relation) } " (line " (statements[b.statement].line) ")"
                        }
                        div.track {
                            div class=(format!("bar {}", blocks(b.lock)))
                                data-statement=(b.statement) data-start-ms=(format!("{:.3}", b.start_ms))
                                data-held-ms=(format!("{:.3}", b.lock.held_ms))
                                style=(format!("left: {}; width: {}", pct(b.start_ms), pct(b.lock.held_ms))) {}
                        }
                        div.figures {
                            "held " (human_ms(b.lock.held_ms))
                            @if let Some(ms) = b.lock.estimated_ms { ", est. " strong { (human_ms(ms)) } " at production size" }
                        }
                    }
                }
                p.legend {
                    span.blocks-reads-and-writes {} "reads and writes wait"
                    span.blocks-writes {} "writes wait"
                    span.blocks-nothing {} "nothing ordinary waits"
                }
            }
        }
    }
}

fn statements(statements: &[StatementReport]) -> Markup {
    html! {
        @if statements.is_empty() { p { "None (a command)." } } @else {
            table.statements {
                tr { th { "line" } th { "time" } th { "what" } th { "SQL" } }
                @for s in statements {
                    tr {
                        td.n { (s.line) }
                        td.n { (format!("{:.1} ms", s.duration_ms)) }
                        td { (s.tag.as_deref().unwrap_or("-")) @if s.rolled_back { " (rolled back)" } }
                        td { pre { (s.sql) } }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
