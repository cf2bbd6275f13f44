//! Refused logins on record, within a budget. A client needs only a sandbox's
//! (or grant's) name to be refused (names show in `ps`, and an agent knows its
//! own), and each refusal was one record in the audit log: a loop of wrong
//! passwords grew the log without bound, one record per attempt.
//!
//! Now refusals are tallied per name and store (PostgreSQL, Redis, a grant) in
//! windows of [`WINDOW`]. In each window a tally's first refusal is always
//! recorded one by one, and the next ones up to [`PER_NAME`] while the router
//! has recorded fewer than [`IN_ALL`] in the window; the rest are counted. When
//! the window closes, each tally with a count gets one `connection_refused`
//! record that stands for them: how many (`detail.refusals`), the first and
//! the last (`first_at`, `last_at`) and where they came from (`sources`: up to
//! [`SOURCES`] addresses, without the port, or local uids, each with its count;
//! `other_sources` counts the rest). Every refusal is still on record, and the
//! log grows by at most `IN_ALL` records and two per tally in a window,
//! however fast the refusals come.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use airlock_core::clock::Timestamp;
use airlock_core::events::NewEvent;

/// How long a window runs before what it counted is recorded.
pub const WINDOW: Duration = Duration::from_secs(10);

/// Refusals of one name and store recorded one by one in a window.
pub const PER_NAME: u32 = 10;

/// Refusals recorded one by one in a window, among all names, beyond each
/// tally's first (which is always recorded).
pub const IN_ALL: u32 = 100;

/// Sources a summary names, each with its count.
pub const SOURCES: usize = 16;

/// The router's budget of refusals recorded one by one, and what it counted.
#[derive(Default)]
pub struct Refusals {
    ledger: Mutex<Ledger>,
}

#[derive(Default)]
struct Ledger {
    /// When the current window opened; none before the first refusal.
    opened: Option<Instant>,
    recorded: u32,
    tallies: HashMap<(String, String), Tally>,
}

#[derive(Default)]
struct Tally {
    recorded: u32,
    counted: u64,
    first_at: Option<Timestamp>,
    last_at: Option<Timestamp>,
    sources: BTreeMap<String, u64>,
    other_sources: u64,
    /// The last counted refusal's record, the summary's model.
    last: Option<NewEvent>,
}

impl Refusals {
    /// Whether the refusal of `name` that `event` records is written now;
    /// false if it is counted instead, for the window's summary.
    pub fn admit(&self, name: &str, event: &NewEvent) -> bool {
        let store = event.detail.get("store").and_then(|s| s.as_str()).unwrap_or("postgres").to_owned();
        let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        ledger.opened.get_or_insert_with(Instant::now);
        let all = ledger.recorded;
        let tally = ledger.tallies.entry((name.to_owned(), store)).or_default();
        if tally.recorded == 0 || (tally.recorded < PER_NAME && all < IN_ALL) {
            tally.recorded += 1;
            ledger.recorded += 1;
            return true;
        }
        let now = Timestamp::now();
        tally.counted += 1;
        tally.first_at.get_or_insert(now);
        tally.last_at = Some(now);
        let client = event.detail.get("client").and_then(|c| c.as_str()).unwrap_or("unknown");
        let from = source(client);
        let room = tally.sources.len() < SOURCES;
        match tally.sources.get_mut(&from) {
            Some(n) => *n += 1,
            None if room => {
                tally.sources.insert(from, 1);
            }
            None => tally.other_sources += 1,
        }
        tally.last = Some(event.clone());
        false
    }

    /// Closes the window if it has run [`WINDOW`] by `now` (or whatever its
    /// age if `force`, as the router stops): the summaries to record, one per
    /// tally with refusals counted.
    pub fn close(&self, now: Instant, force: bool) -> Vec<NewEvent> {
        let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        match ledger.opened {
            Some(opened) if force || now.duration_since(opened) >= WINDOW => {}
            _ => return Vec::new(),
        }
        let closed = std::mem::take(&mut *ledger);
        closed.tallies.into_values().filter_map(Tally::summary).collect()
    }
}

/// Where a refusal came from, as a summary counts it: a TCP client's address
/// without its port (each connection has another), a local client's uid
/// without its pid.
fn source(client: &str) -> String {
    match client.parse::<std::net::SocketAddr>() {
        Ok(addr) => addr.ip().to_string(),
        Err(_) => client.split(",pid=").next().unwrap_or(client).to_owned(),
    }
}

impl Tally {
    fn summary(self) -> Option<NewEvent> {
        let mut event = self.last?;
        let mut detail = serde_json::Map::new();
        // What names the tally (its store, grant, TLS, entry node); the last
        // attempt's address and steps would stand for none of the others.
        if let Some(kept) = event.detail.as_object() {
            for (k, v) in kept {
                if !matches!(k.as_str(), "client" | "phases") {
                    detail.insert(k.clone(), v.clone());
                }
            }
        }
        detail.insert("refusals".into(), self.counted.into());
        let at = |t: Option<Timestamp>| t.unwrap_or_else(Timestamp::now).to_rfc3339();
        detail.insert("first_at".into(), at(self.first_at).into());
        detail.insert("last_at".into(), at(self.last_at).into());
        detail.insert("sources".into(), serde_json::to_value(self.sources).expect("a map of counts"));
        detail.insert("other_sources".into(), self.other_sources.into());
        event.detail = detail.into();
        Some(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_core::events::EventKind;

    fn refused(client: &str, store: Option<&str>) -> NewEvent {
        let mut detail = serde_json::json!({"client": client, "tls": false, "phases": {"startup_ms": 1.0}});
        if let Some(store) = store {
            detail["store"] = store.into();
        }
        NewEvent {
            kind: EventKind::ConnectionRefused,
            sandbox: Some("sb".into()),
            detail,
            ..Default::default()
        }
    }

    #[test]
    fn a_names_refusals_past_its_budget_are_counted_and_summed_up_when_the_window_closes() {
        let r = Refusals::default();
        let admitted =
            (0..25).filter(|n| r.admit("a", &refused(&format!("10.0.0.1:{}", 4000 + n), None))).count();
        assert_eq!(admitted, PER_NAME as usize);
        // Another store of the same name, and another name, have budgets of their own.
        assert!(r.admit("a", &refused("10.0.0.2:5000", Some("redis"))));
        assert!(r.admit("b", &refused("10.0.0.2:5001", None)));
        assert!(r.close(Instant::now(), false).is_empty(), "the window closed early");
        let summaries = r.close(Instant::now() + WINDOW, false);
        assert_eq!(summaries.len(), 1, "{summaries:?}");
        let s = &summaries[0];
        assert_eq!(s.kind, EventKind::ConnectionRefused);
        assert_eq!(s.detail["refusals"], 15);
        assert_eq!(s.detail["sources"], serde_json::json!({"10.0.0.1": 15}));
        assert_eq!(s.detail["other_sources"], 0);
        assert_eq!(s.detail["tls"], false);
        assert!(s.detail.get("phases").is_none() && s.detail.get("client").is_none(), "{}", s.detail);
        assert!(s.detail["first_at"].is_string() && s.detail["last_at"].is_string(), "{}", s.detail);
        // A new window, a new budget; nothing left to sum up.
        assert!(r.admit("a", &refused("10.0.0.1:1", None)));
        assert!(r.close(Instant::now(), true).is_empty());
    }

    #[test]
    fn all_names_together_are_held_to_the_routers_budget_but_each_names_first_is_recorded() {
        let r = Refusals::default();
        // Ten names with many refusals each use the router's budget up...
        for n in 0..10 {
            for _ in 0..20 {
                r.admit(&format!("flooded{n}"), &refused("10.0.0.9:1", None));
            }
        }
        // ...and a victim's first refusal is still recorded on its own, its second counted.
        assert!(r.admit("victim", &refused("10.0.0.7:1", None)));
        assert!(!r.admit("victim", &refused("10.0.0.7:2", None)));
        let summaries = r.close(Instant::now(), true);
        let counted: u64 = summaries.iter().map(|s| s.detail["refusals"].as_u64().unwrap()).sum();
        assert_eq!(counted, 10 * 20 - u64::from(IN_ALL) + 1);
    }

    #[test]
    fn a_summary_names_a_bounded_number_of_sources_and_counts_the_rest() {
        let r = Refusals::default();
        r.admit("a", &refused("local:uid=7,pid=1", None));
        for n in 0..(SOURCES + 40) {
            r.admit("a", &refused(&format!("[fd00::{n:x}]:99"), None));
        }
        for pid in 2..6 {
            r.admit("a", &refused(&format!("local:uid=7,pid={pid}"), None));
        }
        let s = &r.close(Instant::now(), true)[0];
        let sources = s.detail["sources"].as_object().unwrap();
        assert_eq!(sources.len(), SOURCES);
        let named: u64 = sources.values().map(|v| v.as_u64().unwrap()).sum();
        assert_eq!(
            named + s.detail["other_sources"].as_u64().unwrap(),
            s.detail["refusals"].as_u64().unwrap()
        );
    }
}
