use super::*;

/// The documented example: a whole report from a real run.
fn example() -> Report {
    serde_json::from_str(include_str!("../../../../docs/examples/migration-report.json")).unwrap()
}

const HOSTILE: &str = "</script><img src=x onerror=\"document.title='pwned'\"><script>alert(1)</script>";

#[test]
fn nothing_a_candidate_wrote_becomes_markup() {
    let mut report = example();
    let c = &mut report.candidates[0];
    c.name = format!("{HOSTILE}.sql");
    c.statements[0].sql = format!("-- {HOSTILE}\nSELECT 1");
    c.hazards.push(Hazard::new("x", super::super::report::Severity::High, HOSTILE, Some(1)));
    if let Some(lock) = c.statements.iter_mut().flat_map(|s| &mut s.locks).next() {
        lock.relation = format!("public.\"{HOSTILE}\"");
    }
    c.exec = Some(super::super::report::ExecOutcome {
        exit_code: Some(1),
        timed_out: false,
        stdout: HOSTILE.into(),
        stderr: HOSTILE.into(),
    });
    c.assertions.push(super::super::report::Assertion {
        sql: HOSTILE.into(),
        passed: false,
        detail: Some(HOSTILE.into()),
    });
    let page = report.html();
    for tag in ["<script", "<img", "onerror=\""] {
        assert!(!page.contains(tag), "{tag} made it through: {page}");
    }
    assert!(page.contains("&lt;/script&gt;&lt;img src=x onerror="), "{page}");
    // It loads nothing and runs nothing, should anything get through.
    assert!(page.contains("content=\"default-src 'none'; style-src 'unsafe-inline'\""));
    for external in [" src=\"", " href=\"http", "@import", "url("] {
        assert!(!page.contains(external), "{external} in {page}");
    }
}

fn lock(relation: &str, mode: &str, held_ms: f64) -> LockHeld {
    LockHeld {
        relation: relation.into(),
        kind: "table".into(),
        mode: mode.into(),
        held_ms,
        blocking: mode != "ROW EXCLUSIVE",
        observed: false,
        estimated_ms: Some(held_ms * 10.0),
    }
}

#[test]
fn bars_start_with_their_statement_and_come_in_the_order_taken() {
    let mut report = example();
    let c = &mut report.candidates[0];
    let template = c.statements[0].clone();
    c.statements =
        [(1, 5.0, "SHARE", 30.0), (2, 20.0, "ACCESS EXCLUSIVE", 25.0), (3, 5.0, "ROW EXCLUSIVE", 5.0)]
            .into_iter()
            .map(|(line, ms, mode, held)| StatementReport {
                line,
                duration_ms: ms,
                locks: vec![lock("public.orders", mode, held)],
                ..template.clone()
            })
            .collect();
    let (starts, bars, span) = super::bars(&c.statements);
    assert_eq!(starts, [0.0, 5.0, 25.0]);
    assert_eq!(bars.iter().map(|b| b.start_ms).collect::<Vec<_>>(), [0.0, 5.0, 25.0]);
    assert_eq!(span, 30.0);
    let classes: Vec<&str> = bars.iter().map(|b| blocks(b.lock)).collect();
    assert_eq!(classes, ["blocks-writes", "blocks-reads-and-writes", "blocks-nothing"]);

    let page = report.html();
    let order: Vec<usize> = [
        "blocks-writes\" data-statement=\"0\"",
        "blocks-reads-and-writes\" data-statement=\"1\"",
        "blocks-nothing\" data-statement=\"2\"",
    ]
    .iter()
    .map(|needle| page.find(needle).unwrap_or_else(|| panic!("no {needle} in {page}")))
    .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
    assert!(page.contains("left: 16.667%; width: 83.333%"), "{page}");
    assert!(page.contains("est. <strong>250 ms</strong> at production size"), "{page}");
}
