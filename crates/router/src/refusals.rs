//! Refused logins on record, within a budget. A client needs only a sandbox's
//! (or grant's) name to be refused (names show in `ps`, and an agent knows its
//! own), and each refusal was one record in the audit log: a loop of wrong
//! passwords grew the log without bound, one record per attempt.
//!
//! Now refusals are tallied per name, store (PostgreSQL, Redis, a grant), TLS
//! or not and entry node, in windows of [`WINDOW`]. In each window a tally's
//! first refusal is always recorded one by one, and its next ones, up to
//! [`PER_NAME`] in all, while the router has recorded fewer than [`IN_ALL`] in
//! the window; the rest are counted. When the window closes, each tally with a
//! count gets one `connection_refused` record that stands for them: how many
//! (`detail.refusals`), the first and the last (`first_at`, `last_at`), and
//! where they came from: `sources`, the [`SOURCES`] with the highest counts (an
//! IPv4 address, an IPv6 /64, a local uid), each with the refusals surely
//! theirs, and `other_sources`, the refusals not surely from a named source.
//! Counts are kept by the Space-Saving method over [`TRACKED`] counters, so
//! any source that made more than one in [`SOURCES`] of the tally's refusals
//! is named, however many decoys came first or in between. Every refusal is
//! still on record, and the log grows by at most `IN_ALL` records and two per
//! tally in a window, however fast the refusals come.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use airlock_core::clock::Timestamp;
use airlock_core::events::NewEvent;

/// How long a window runs before what it counted is recorded.
pub const WINDOW: Duration = Duration::from_secs(10);

/// Refusals of one tally recorded one by one in a window, its first included.
pub const PER_NAME: u32 = 10;

/// Refusals recorded one by one in a window, among all tallies, past which a
/// tally's refusals are counted (its first is recorded all the same).
pub const IN_ALL: u32 = 100;

/// Sources a summary names, those with the highest counts.
pub const SOURCES: usize = 16;

/// Sources a tally keeps a count of while it counts.
pub const TRACKED: usize = 64;

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
    tallies: HashMap<Key, Tally>,
    /// The router is stopping: nothing is counted any more, each refusal is
    /// recorded on its own, since no window will close.
    stopping: bool,
}

/// What a tally's refusals share.
#[derive(PartialEq, Eq, Hash)]
struct Key {
    name: String,
    store: String,
    tls: bool,
    entry: Option<String>,
}

#[derive(Default)]
struct Tally {
    recorded: u32,
    counted: u64,
    first_at: Option<Timestamp>,
    last_at: Option<Timestamp>,
    sources: HashMap<String, Count>,
    /// The first counted refusal's record, the summary's model: what it keeps
    /// of it (the sandbox, store, grant, TLS, entry) is the same for the
    /// whole tally.
    model: Option<NewEvent>,
}

/// A source's count, and how much of it may be the sources it took the place
/// of (Space-Saving's overestimate).
struct Count {
    count: u64,
    over: u64,
}

impl Refusals {
    /// Whether the refusal of `name` that `event` records is written now;
    /// false if it is counted instead, for the window's summary.
    pub fn admit(&self, name: &str, event: &NewEvent) -> bool {
        let text = |k: &str| event.detail.get(k).and_then(|v| v.as_str()).map(str::to_owned);
        let key = Key {
            name: name.to_owned(),
            store: text("store").unwrap_or_else(|| "postgres".into()),
            tls: event.detail.get("tls").and_then(|v| v.as_bool()).unwrap_or(false),
            entry: text("entry"),
        };
        let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        if ledger.stopping {
            return true;
        }
        ledger.opened.get_or_insert_with(Instant::now);
        let all = ledger.recorded;
        let tally = ledger.tallies.entry(key).or_default();
        if tally.recorded == 0 || (tally.recorded < PER_NAME && all < IN_ALL) {
            tally.recorded += 1;
            ledger.recorded += 1;
            return true;
        }
        let now = Timestamp::now();
        tally.counted += 1;
        tally.first_at.get_or_insert(now);
        tally.last_at = Some(now);
        tally.count_source(source(&text("client").unwrap_or_else(|| "unknown".into())));
        tally.model.get_or_insert_with(|| event.clone());
        false
    }

    /// Closes the window if it has run [`WINDOW`] by `now`: the summaries to
    /// record, one per tally with refusals counted.
    pub fn close(&self, now: Instant) -> Vec<NewEvent> {
        let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        match ledger.opened {
            Some(opened) if now.duration_since(opened) >= WINDOW => {}
            _ => return Vec::new(),
        }
        ledger.summaries()
    }

    /// Closes the window whatever its age, as the router stops, and counts
    /// nothing from then on: the summaries to record.
    pub fn close_for_good(&self) -> Vec<NewEvent> {
        let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        ledger.stopping = true;
        ledger.summaries()
    }
}

impl Ledger {
    /// Ends the window: the summaries of what it counted.
    fn summaries(&mut self) -> Vec<NewEvent> {
        self.opened = None;
        self.recorded = 0;
        std::mem::take(&mut self.tallies).into_values().filter_map(Tally::summary).collect()
    }
}

/// Where a refusal came from, as a summary counts it: a TCP client's IPv4
/// address or IPv6 /64 without its port (each connection has another port,
/// and one holder of a /64 has all its addresses), a local client's uid
/// without its pid.
fn source(client: &str) -> String {
    match client.parse::<SocketAddr>().map(|a| a.ip()) {
        Ok(IpAddr::V4(v4)) => v4.to_string(),
        Ok(IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let s = v6.segments();
                format!("{}/64", Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        Err(_) => client.split(",pid=").next().unwrap_or(client).to_owned(),
    }
}

impl Tally {
    /// Counts a refusal from `from`: a source new to a full tally takes the
    /// place of the least counted, with its count (Space-Saving).
    fn count_source(&mut self, from: String) {
        if let Some(c) = self.sources.get_mut(&from) {
            c.count += 1;
            return;
        }
        if self.sources.len() >= TRACKED {
            let least = self.sources.iter().min_by_key(|(_, c)| c.count).map(|(k, c)| (k.clone(), c.count));
            if let Some((least, min)) = least {
                self.sources.remove(&least);
                self.sources.insert(from, Count { count: min + 1, over: min });
                return;
            }
        }
        self.sources.insert(from, Count { count: 1, over: 0 });
    }

    fn summary(self) -> Option<NewEvent> {
        let mut event = self.model?;
        let mut detail = serde_json::Map::new();
        // What the tally's refusals share (its store, grant, TLS, entry
        // node); one attempt's address and steps would stand for none of
        // the others.
        if let Some(kept) = event.detail.as_object() {
            for (k, v) in kept {
                if !matches!(k.as_str(), "client" | "phases") {
                    detail.insert(k.clone(), v.clone());
                }
            }
        }
        let mut ranked: Vec<_> = self.sources.into_iter().collect();
        ranked.sort_by(|(a, x), (b, y)| y.count.cmp(&x.count).then_with(|| a.cmp(b)));
        let named: BTreeMap<String, u64> =
            ranked.into_iter().take(SOURCES).map(|(k, c)| (k, c.count.saturating_sub(c.over))).collect();
        let other = self.counted.saturating_sub(named.values().sum());
        detail.insert("refusals".into(), self.counted.into());
        let at = |t: Option<Timestamp>| t.unwrap_or_else(Timestamp::now).to_rfc3339();
        detail.insert("first_at".into(), at(self.first_at).into());
        detail.insert("last_at".into(), at(self.last_at).into());
        detail.insert("sources".into(), serde_json::to_value(named).expect("a map of counts"));
        detail.insert("other_sources".into(), other.into());
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
        assert!(r.close(Instant::now()).is_empty(), "the window closed early");
        let summaries = r.close(Instant::now() + WINDOW);
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
        assert!(r.close_for_good().is_empty());
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
        let summaries = r.close_for_good();
        let counted: u64 = summaries.iter().map(|s| s.detail["refusals"].as_u64().unwrap()).sum();
        assert_eq!(counted, 10 * 20 - u64::from(IN_ALL) + 1);
    }

    #[test]
    fn a_summary_names_a_bounded_number_of_sources_and_counts_the_rest() {
        let r = Refusals::default();
        r.admit("a", &refused("local:uid=7,pid=1", None));
        for n in 0..(TRACKED + 40) {
            r.admit("a", &refused(&format!("[fd00:{n:x}::1]:99"), None));
        }
        for pid in 2..6 {
            r.admit("a", &refused(&format!("local:uid=7,pid={pid}"), None));
        }
        let s = &r.close_for_good()[0];
        let sources = s.detail["sources"].as_object().unwrap();
        assert_eq!(sources.len(), SOURCES);
        let named: u64 = sources.values().map(|v| v.as_u64().unwrap()).sum();
        assert_eq!(
            named + s.detail["other_sources"].as_u64().unwrap(),
            s.detail["refusals"].as_u64().unwrap()
        );
        // A local client is counted by its uid, whatever its pid.
        assert_eq!(sources.get("local:uid=7").and_then(|v| v.as_u64()), Some(4), "{sources:?}");
    }

    #[test]
    fn decoys_tried_first_cannot_push_the_busiest_source_out_of_a_summary() {
        let r = Refusals::default();
        for n in 0..200 {
            r.admit("a", &refused(&format!("10.1.{}.{}:1", n / 250, n % 250 + 1), None));
        }
        for n in 0..500 {
            r.admit("a", &refused(&format!("127.66.66.67:{n}"), None));
        }
        // Addresses of one IPv6 /64 are one source.
        for n in 0..100 {
            r.admit("a", &refused(&format!("[2001:db8:0:1::{n:x}]:443"), None));
        }
        let s = &r.close_for_good()[0];
        assert_eq!(s.detail["sources"]["127.66.66.67"], 500, "{}", s.detail);
        assert_eq!(s.detail["sources"]["2001:db8:0:1::/64"], 100, "{}", s.detail);
    }

    #[test]
    fn tls_and_plaintext_refusals_are_summed_up_apart() {
        let r = Refusals::default();
        for n in 0..30 {
            let mut e = refused(&format!("10.0.0.1:{n}"), None);
            e.detail["tls"] = true.into();
            r.admit("a", &e);
        }
        for n in 0..30 {
            r.admit("a", &refused(&format!("10.0.0.1:{n}"), None));
        }
        let summaries = r.close_for_good();
        let by_tls: BTreeMap<bool, u64> = summaries
            .iter()
            .map(|s| (s.detail["tls"].as_bool().unwrap(), s.detail["refusals"].as_u64().unwrap()))
            .collect();
        assert_eq!(by_tls, BTreeMap::from([(false, 20), (true, 20)]));
    }

    #[test]
    fn once_the_router_is_stopping_each_refusal_is_recorded_on_its_own() {
        let r = Refusals::default();
        for _ in 0..30 {
            r.admit("a", &refused("10.0.0.1:1", None));
        }
        assert_eq!(r.close_for_good().len(), 1);
        assert!((0..30).all(|_| r.admit("a", &refused("10.0.0.1:1", None))));
        assert!(r.close_for_good().is_empty());
    }

    #[test]
    fn a_source_with_more_than_one_in_sixteen_is_named_among_fresh_decoys_and_no_count_is_overstated() {
        let r = Refusals::default();
        let mut truth: HashMap<String, u64> = HashMap::new();
        let mut send = |client: String| {
            if !r.admit("a", &refused(&format!("{client}:1"), None)) {
                *truth.entry(client).or_default() += 1;
            }
        };
        // Every 15th refusal from one source, the rest each from a new decoy.
        for n in 0..3000u32 {
            match n % 15 {
                0 => send("192.0.2.1".into()),
                _ => send(format!("10.{}.{}.{}", n >> 16, (n >> 8) & 255, n & 255)),
            }
        }
        let s = &r.close_for_good()[0];
        let sources = s.detail["sources"].as_object().unwrap();
        assert!(sources.contains_key("192.0.2.1"), "{sources:?}");
        for (source, surely) in sources {
            assert!(surely.as_u64().unwrap() <= truth[source], "{source}: {surely} > {}", truth[source]);
        }
        let named: u64 = sources.values().map(|v| v.as_u64().unwrap()).sum();
        let counted: u64 = truth.values().sum();
        assert_eq!(s.detail["refusals"], counted);
        assert_eq!(named + s.detail["other_sources"].as_u64().unwrap(), counted);
    }

    #[test]
    fn ipv4_clients_of_a_dual_stack_port_are_counted_by_their_ipv4_address_and_entries_apart() {
        let r = Refusals::default();
        for n in 0..20 {
            let mut e = refused(&format!("[::ffff:10.0.0.{}]:5", n % 2 + 1), None);
            e.detail["entry"] = "node-b".into();
            r.admit("a", &e);
            let mut e = refused("10.0.0.1:5", None);
            e.detail["entry"] = "node-c".into();
            r.admit("a", &e);
        }
        let summaries = r.close_for_good();
        assert_eq!(summaries.len(), 2, "{summaries:?}");
        let b = summaries.iter().find(|s| s.detail["entry"] == "node-b").expect("node-b's summary");
        assert_eq!(b.detail["sources"], serde_json::json!({"10.0.0.1": 5, "10.0.0.2": 5}));
    }
}
