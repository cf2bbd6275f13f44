//! The report rendered for people and tools: text for a terminal, Markdown for
//! a pull-request comment, SARIF for code scanning.

use super::report::human_ms;
use super::report::{cut, Report, Severity};

impl Report {
    /// The report as text for a terminal.
    pub fn text(&self) -> String {
        let mut out = Vec::new();
        out.push(format!(
            "golden {}@{}: {} candidate(s); {}",
            self.golden,
            self.generation,
            self.candidates.len(),
            self.scale.describe()
        ));
        for c in &self.candidates {
            out.push(String::new());
            let on = c.node.as_deref().map(|n| format!(", on node {n}")).unwrap_or_default();
            out.push(format!(
                "{} {} ({}, {:.0} ms, sha256 {}{on})",
                if c.passed { "PASS" } else { "FAIL" },
                c.name,
                c.kind,
                c.duration_ms,
                &c.sha256[..12]
            ));
            for h in c.hazards.iter().chain(&c.notes) {
                let line = h.line.map(|l| format!(" (line {l})")).unwrap_or_default();
                let estimate =
                    h.estimated_ms.map(|ms| format!(" [est. {}]", human_ms(ms))).unwrap_or_default();
                let label = if h.severity == Severity::Low {
                    "note".to_owned()
                } else {
                    h.severity.as_str().to_owned()
                };
                out.push(format!("  [{label}] {}: {}{line}{estimate}", h.kind, h.message));
                if let Some(s) = &h.suggestion {
                    out.push(format!("      safer: {s}"));
                }
            }
            for s in &c.statements {
                let at = if s.line == 0 { "command  ".to_owned() } else { format!("line {:>4}", s.line) };
                out.push(format!(
                    "  {at}  {:>9.1} ms  {}{}",
                    s.duration_ms,
                    s.tag.as_deref().unwrap_or("-"),
                    if s.rolled_back { " (rolled back)" } else { "" }
                ));
                out.extend(wrap(&s.sql, 90).into_iter().map(|l| format!("             {l}")));
                for l in s.locks.iter().filter(|l| l.blocking && super::hazards::holds_rows(l)) {
                    let estimate =
                        l.estimated_ms.map(|ms| format!(", est. {}", human_ms(ms))).unwrap_or_default();
                    out.push(format!(
                        "             lock {} on {} held {:.1} ms{estimate}",
                        l.mode, l.relation, l.held_ms
                    ));
                }
                for r in &s.rewrites {
                    out.push(format!(
                        "             rewrote {} ({} rows): {}",
                        r.table,
                        s.rewritten_rows(r),
                        r.reason
                    ));
                }
                for b in &s.indexes_built {
                    out.push(format!(
                        "             built index {} on {}{}{}",
                        b.index,
                        b.table,
                        if b.concurrently { " concurrently" } else { "" },
                        if b.valid { "" } else { " (INVALID)" }
                    ));
                }
                for v in &s.validated {
                    out.push(format!(
                        "             checked {} {} on every row of {}",
                        v.kind, v.name, v.table
                    ));
                }
                for r in &s.rows {
                    out.push(format!(
                        "             rows in {}: +{} ~{} -{}{}",
                        r.table,
                        r.inserted,
                        r.updated,
                        r.deleted,
                        if r.truncated { " (truncated)" } else { "" }
                    ));
                }
                for d in &s.dropped {
                    out.push(format!(
                        "             dropped {} {}{}",
                        d.object_type,
                        d.identity,
                        if d.cascade { " (by CASCADE)" } else { "" }
                    ));
                }
            }
            if let Some(f) = &c.failure {
                out.push(format!("  error at line {}: {} ({})", f.line, f.error.message, f.error.sqlstate));
                if let Some(d) = &f.error.detail {
                    out.push(format!("    detail: {d}"));
                }
            }
            if let Some(e) = &c.exec {
                let how = match e.exit_code {
                    Some(code) => format!("exited {code}"),
                    None => "was killed".to_owned(),
                };
                out.push(format!("  command {how}{}", if e.timed_out { " (timed out)" } else { "" }));
            }
            for a in &c.assertions {
                out.push(format!(
                    "  assert {}: {}{}",
                    if a.passed { "ok" } else { "FAILED" },
                    cut(&a.sql, 80),
                    a.detail.as_deref().map(|d| format!(" -> {d}")).unwrap_or_default()
                ));
            }
            if !c.queries.is_empty() {
                let changed =
                    c.queries.iter().filter(|q| q.before != q.after || q.error_after.is_some()).count();
                out.push(format!(
                    "  application queries: {} planned, {changed} planned differently after",
                    c.queries.len()
                ));
            }
            if let Some(w) = &c.workload {
                out.push(format!("  workload ({} sessions, {:.0} ms):", w.clients, w.duration_ms));
                out.extend(w.summary.iter().map(|s| format!("    {s}")));
            }
            if !c.changes.is_empty() {
                out.push("  schema changes against the golden:".into());
                out.extend(c.changes.iter().map(|ch| format!("    {}", ch.line())));
            }
            if !c.drift.is_empty() {
                out.push("  differences from the expected schema:".into());
                out.extend(c.drift.iter().map(|ch| format!("    {}", ch.line())));
            }
        }
        out.push(String::new());
        match &self.best {
            Some(best) => out.push(format!("best passing candidate: {best}")),
            None => out.push("no candidate passed".into()),
        }
        if self.candidates.len() > 1 {
            out.push(format!("ranking: {}", self.ranking.join(" > ")));
        }
        // One entry, one line: a newline in anything the candidate named (an
        // identifier, an error it raised, a file name) cannot start a line of
        // the report's own.
        out.iter().map(|l| l.replace('\n', "\\n").replace('\r', "\\r")).collect::<Vec<_>>().join("\n") + "\n"
    }

    /// The report as Markdown, for a pull-request comment. Text from the
    /// candidates is escaped, and SQL sits in fences longer than any it holds.
    pub fn markdown(&self) -> String {
        let passed = self.candidates.iter().filter(|c| c.passed).count();
        let mut out = vec![
            format!(
                "## Airlock migration test: {passed} of {} passed on golden `{}@{}`",
                self.candidates.len(),
                md(&self.golden),
                self.generation
            ),
            String::new(),
            format!("_{}._", md(&self.scale.describe())),
            String::new(),
            "| candidate | verdict | hazards | time |".into(),
            "|---|---|---|---|".into(),
        ];
        for c in &self.candidates {
            let kinds: Vec<String> =
                c.hazards.iter().map(|h| format!("`{}` ({})", h.kind, h.severity.as_str())).collect();
            out.push(format!(
                "| {} | {} | {} | {:.0} ms |",
                md(&c.name),
                if c.passed { "✅ pass" } else { "❌ fail" },
                if kinds.is_empty() { "none".into() } else { kinds.join(", ") },
                c.duration_ms
            ));
        }
        for c in &self.candidates {
            out.push(String::new());
            out.push(format!("### {} {}", if c.passed { "✅" } else { "❌" }, md(&c.name)));
            out.push(String::new());
            for h in c.hazards.iter().chain(&c.notes) {
                let line = h.line.map(|l| format!(" (line {l})")).unwrap_or_default();
                let estimate =
                    h.estimated_ms.map(|ms| format!(" — est. {}", human_ms(ms))).unwrap_or_default();
                let label = if h.severity == Severity::Low { "note" } else { h.severity.as_str() };
                out.push(format!("- **{label}** `{}`{line}: {}{estimate}", h.kind, md(&h.message)));
                if let Some(s) = &h.suggestion {
                    out.push(format!("  - safer: {}", md(s)));
                }
            }
            if c.hazards.is_empty() && c.notes.is_empty() {
                out.push("No hazards.".into());
            }
            if let Some(w) = &c.workload {
                out.push(String::new());
                out.push(format!("Workload ({} sessions): {}", w.clients, md(&w.summary.join("; "))));
            }
            if !c.statements.is_empty() {
                out.push(String::new());
                out.push("<details><summary>Statements</summary>".into());
                out.push(String::new());
                for s in &c.statements {
                    out.push(format!(
                        "- line {}: {} in {:.1} ms",
                        s.line,
                        md(s.tag.as_deref().unwrap_or("-")),
                        s.duration_ms
                    ));
                }
                let sql: Vec<&str> = c.statements.iter().map(|s| s.sql.as_str()).collect();
                let body = sql.join(";\n") + ";";
                let fence = "`".repeat(longest_run(&body, '`').max(2) + 1);
                out.push(String::new());
                out.push(format!("{fence}sql"));
                out.push(body);
                out.push(fence);
                out.push(String::new());
                out.push("</details>".into());
            }
        }
        out.join("\n") + "\n"
    }

    /// The report as SARIF 2.1.0, for code scanning: one result per hazard
    /// (and note), at the candidate's file (its path as given, from `paths`
    /// by name) and line; a hazard of the whole file is placed on the file.
    pub fn sarif(&self, paths: &std::collections::BTreeMap<String, String>) -> serde_json::Value {
        let mut rules: std::collections::BTreeMap<&str, &str> = Default::default();
        let mut results = Vec::new();
        for c in &self.candidates {
            for h in c.hazards.iter().chain(&c.notes) {
                rules.entry(h.kind.as_str()).or_insert(h.severity.as_str());
                let level = match h.severity {
                    Severity::Critical | Severity::High => "error",
                    Severity::Medium => "warning",
                    Severity::Low => "note",
                };
                let text = match &h.suggestion {
                    Some(s) => format!("{} Safer: {s}", h.message),
                    None => h.message.clone(),
                };
                results.push(serde_json::json!({
                    "ruleId": h.kind,
                    "level": level,
                    "message": {"text": text},
                    "locations": [{"physicalLocation": location(paths.get(&c.name).unwrap_or(&c.name), h.line)}],
                    "partialFingerprints": {"candidateSha256": c.sha256},
                    "properties": {"severity": h.severity.as_str(), "estimatedMs": h.estimated_ms}
                }));
            }
        }
        let rules: Vec<serde_json::Value> = rules
            .into_iter()
            .map(|(id, severity)| {
                serde_json::json!({"id": id, "shortDescription": {"text": format!("migration hazard: {id}")},
                    "properties": {"severity": severity}})
            })
            .collect();
        serde_json::json!({
            "version": "2.1.0",
            "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
            "runs": [{
                "tool": {"driver": {"name": "airlock migrate test", "version": env!("CARGO_PKG_VERSION"),
                    "informationUri": "https://github.com/airlock/airlock/blob/main/docs/MIGRATIONS.md", "rules": rules}},
                "results": results,
                "properties": {"golden": self.golden, "generation": self.generation, "passed": self.passed}
            }]
        })
    }
}

/// A SARIF physical location: the file, and the line when there is one.
fn location(uri: &str, line: Option<usize>) -> serde_json::Value {
    match line.filter(|l| *l > 0) {
        Some(line) => serde_json::json!({"artifactLocation": {"uri": uri}, "region": {"startLine": line}}),
        None => serde_json::json!({"artifactLocation": {"uri": uri}}),
    }
}

/// Text escaped for Markdown: nothing in it can open a link, an image, code,
/// emphasis, a table cell or HTML.
fn md(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        match ch {
            '\\' | '`' | '*' | '_' | '[' | ']' | '<' | '>' | '|' | '!' | '#' | '~' | '&' | '@' => {
                out.push('\\');
                out.push(ch);
            }
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// The longest run of `ch` in `text`.
fn longest_run(text: &str, ch: char) -> usize {
    let (mut best, mut run) = (0, 0);
    for c in text.chars() {
        run = if c == ch { run + 1 } else { 0 };
        best = best.max(run);
    }
    best
}

/// A statement's lines, each wrapped at `width` characters (at a space where
/// there is one): the whole statement, never cut short.
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.trim().lines() {
        let mut rest: Vec<char> = line.trim_end().chars().collect();
        loop {
            if rest.len() <= width {
                out.push(rest.iter().collect());
                break;
            }
            let at = rest[..width].iter().rposition(|c| *c == ' ').filter(|i| *i > 0).unwrap_or(width);
            out.push(rest[..at].iter().collect());
            rest = rest[at..].iter().copied().skip_while(|c| *c == ' ').collect();
            if rest.is_empty() {
                break;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_statements_wrap_whole() {
        let sql = format!("UPDATE orders SET note = '{}'\nWHERE id > 10", "x ".repeat(80));
        let lines = wrap(&sql, 40);
        assert!(lines.iter().all(|l| l.chars().count() <= 40));
        assert_eq!(
            lines.join(" ").split_whitespace().collect::<Vec<_>>(),
            sql.split_whitespace().collect::<Vec<_>>()
        );
        assert_eq!(lines.last().map(String::as_str), Some("WHERE id > 10"));
    }

    #[test]
    fn markdown_escapes_what_a_candidate_names() {
        assert_eq!(md("[x](http://e) `a` | b"), "\\[x\\](http://e) \\`a\\` \\| b");
        assert_eq!(longest_run("a ``` b `", '`'), 3);
    }
}
