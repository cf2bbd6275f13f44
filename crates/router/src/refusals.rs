//! Refused logins on record, within a budget. A client needs only a sandbox's
//! (or grant's) name to be refused (names show in `ps`, and an agent knows its
//! own), and each refusal was one record in the audit log: a loop of wrong
//! passwords grew the log without bound and held the store's lock that every
//! accepted connection waits on.
//!
//! Now, in each window of [`WINDOW`], a name's first [`PER_NAME`] refusals
//! (and no more than [`IN_ALL`] among all names) are recorded one by one; the
//! rest are counted, and when the window closes each name with a count gets one
//! `connection_refused` record that says how many it stands for
//! (`detail.refusals`) and since when (`detail.first_at`). Every refusal is
//! still on record, and the log grows by at most `IN_ALL` records and one per
//! name in a window, however fast the refusals come.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use airlock_core::clock::Timestamp;
use airlock_core::events::NewEvent;

/// How long a window runs before what it counted is recorded.
pub const WINDOW: Duration = Duration::from_secs(10);

/// Refusals of one name recorded one by one in a window.
pub const PER_NAME: u32 = 10;

/// Refusals recorded one by one in a window, among all names.
pub const IN_ALL: u32 = 100;

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
    per_name: HashMap<String, Tally>,
}

#[derive(Default)]
struct Tally {
    recorded: u32,
    counted: u64,
    first_counted_at: Option<Timestamp>,
    /// The last counted refusal's record, the summary's model.
    last: Option<NewEvent>,
}

impl Refusals {
    /// Whether the refusal of `name` that `event` records is written now;
    /// false if it is counted instead, for the window's summary.
    pub fn admit(&self, name: &str, event: &NewEvent) -> bool {
        let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        ledger.opened.get_or_insert_with(Instant::now);
        let all = ledger.recorded;
        let tally = ledger.per_name.entry(name.to_owned()).or_default();
        if tally.recorded < PER_NAME && all < IN_ALL {
            tally.recorded += 1;
            ledger.recorded += 1;
            return true;
        }
        tally.counted += 1;
        tally.first_counted_at.get_or_insert_with(Timestamp::now);
        tally.last = Some(event.clone());
        false
    }

    /// Closes the window if it has run [`WINDOW`] by `now` (or whatever its
    /// age if `force`, as the router stops): the summaries to record, one per
    /// name with refusals counted.
    pub fn close(&self, now: Instant, force: bool) -> Vec<NewEvent> {
        let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        match ledger.opened {
            Some(opened) if force || now.duration_since(opened) >= WINDOW => {}
            _ => return Vec::new(),
        }
        let closed = std::mem::take(&mut *ledger);
        closed.per_name.into_values().filter_map(Tally::summary).collect()
    }
}

impl Tally {
    fn summary(self) -> Option<NewEvent> {
        let mut event = self.last?;
        if !event.detail.is_object() {
            event.detail = serde_json::json!({});
        }
        // One attempt's steps say nothing of many.
        event.detail.as_object_mut().expect("an object").remove("phases");
        event.detail["refusals"] = self.counted.into();
        event.detail["first_at"] = self.first_counted_at.unwrap_or_else(Timestamp::now).to_rfc3339().into();
        Some(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_core::events::EventKind;

    fn refused(client: &str) -> NewEvent {
        NewEvent {
            kind: EventKind::ConnectionRefused,
            sandbox: Some("sb".into()),
            detail: serde_json::json!({"client": client, "phases": {"startup_ms": 1.0}}),
            ..Default::default()
        }
    }

    #[test]
    fn a_names_refusals_past_its_budget_are_counted_and_summed_up_when_the_window_closes() {
        let r = Refusals::default();
        let admitted = (0..25).filter(|n| r.admit("a", &refused(&format!("c{n}")))).count();
        assert_eq!(admitted, PER_NAME as usize);
        // Another name has a budget of its own.
        assert!(r.admit("b", &refused("x")));
        assert!(r.close(Instant::now(), false).is_empty(), "the window closed early");
        let summaries = r.close(Instant::now() + WINDOW, false);
        assert_eq!(summaries.len(), 1, "{summaries:?}");
        let s = &summaries[0];
        assert_eq!(s.kind, EventKind::ConnectionRefused);
        assert_eq!(s.detail["refusals"], 15);
        assert_eq!(s.detail["client"], "c24");
        assert!(s.detail.get("phases").is_none() && s.detail["first_at"].is_string(), "{}", s.detail);
        // A new window, a new budget; nothing left to sum up.
        assert!(r.admit("a", &refused("c")));
        assert!(r.close(Instant::now(), true).is_empty());
    }

    #[test]
    fn all_names_together_are_held_to_the_routers_budget() {
        let r = Refusals::default();
        let admitted = (0..IN_ALL * 2).filter(|n| r.admit(&format!("n{n}"), &refused("c"))).count();
        assert_eq!(admitted, IN_ALL as usize);
        let summaries = r.close(Instant::now(), true);
        assert_eq!(summaries.len(), IN_ALL as usize);
        assert!(summaries.iter().all(|s| s.detail["refusals"] == 1));
    }
}
