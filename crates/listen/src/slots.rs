//! The connection slots of one listener, and who gives one back when none is free.
//!
//! A slot is held from accept until the connection closes. A holder that is
//! not at work — a client that has not yet authenticated, an HTTP connection
//! with no request in flight — *yields*: when a newcomer finds every slot
//! taken, the yielding holder that has waited longest, from the address that
//! holds the most yielding slots, is told to give its slot up, and the
//! newcomer takes it. So a flood of idle or stalled connections never holds a
//! slot against anyone, whatever address it comes from (the owner's own
//! included): it can only push out its own oldest members. Only connections
//! at work (an authenticated session, a request being answered) keep a slot
//! for as long as they need it; the limits on those are their owners'.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

/// How long a newcomer waits for the holder it displaced to let go.
const HANDOVER: Duration = Duration::from_secs(1);

/// One listener's slots.
#[derive(Debug)]
pub struct Slots {
    free: Arc<Semaphore>,
    holders: Mutex<Holders>,
}

#[derive(Debug, Default)]
struct Holders {
    next: u64,
    by_id: HashMap<u64, Holder>,
}

#[derive(Debug)]
struct Holder {
    address: Option<IpAddr>,
    /// Requests at work on the connection; it yields while none is.
    working: usize,
    /// For good: an authenticated session never yields again.
    proven: bool,
    /// Since when it has yielded: its arrival, or the end of its last request.
    since: Instant,
    /// Dropped to tell the holder to give its slot up.
    give_up: Option<oneshot::Sender<()>>,
}

impl Holder {
    fn yields(&self) -> bool {
        !self.proven && self.working == 0 && self.give_up.is_some()
    }
}

impl Slots {
    /// A listener's `capacity` slots, all free.
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Slots { free: Arc::new(Semaphore::new(capacity)), holders: Mutex::default() })
    }

    fn holders(&self) -> std::sync::MutexGuard<'_, Holders> {
        self.holders.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for a new connection from `address` (None for a unix socket): a
    /// free one at once, else the one a yielding holder gives up (or one told
    /// to already). None when every slot is held by a connection at work.
    /// `arrived` is when the connection was accepted: of two yielding holders,
    /// the one that came first goes first, whatever order their slots were
    /// handed out in.
    pub async fn take(self: &Arc<Self>, address: Option<IpAddr>, arrived: Instant) -> Option<Slot> {
        if let Ok(permit) = self.free.clone().try_acquire_owned() {
            return Some(self.held(address, arrived, permit));
        }
        if !self.displace() && !self.releasing() {
            return None;
        }
        // The displaced holder lets go as soon as it runs; the semaphore is
        // first come, first served, so a newcomer that displaced someone is
        // not overtaken by one that comes later.
        let permit = tokio::time::timeout(HANDOVER, self.free.clone().acquire_owned()).await.ok()?.ok()?;
        Some(self.held(address, arrived, permit))
    }

    /// A slot for a new connection, waiting for one to free when every slot
    /// is held by a connection at work.
    pub async fn take_or_wait(self: &Arc<Self>, address: Option<IpAddr>, arrived: Instant) -> Slot {
        if let Some(slot) = self.take(address, arrived).await {
            return slot;
        }
        let permit = self.free.clone().acquire_owned().await.expect("the semaphore is never closed");
        self.held(address, arrived, permit)
    }

    fn held(
        self: &Arc<Self>,
        address: Option<IpAddr>,
        arrived: Instant,
        permit: OwnedSemaphorePermit,
    ) -> Slot {
        let (give_up, given_up) = oneshot::channel();
        let mut holders = self.holders();
        holders.next += 1;
        let id = holders.next;
        let holder = Holder { address, working: 0, proven: false, since: arrived, give_up: Some(give_up) };
        holders.by_id.insert(id, holder);
        Slot { slots: self.clone(), id, given_up, _permit: permit }
    }

    /// Tells the yielding holder that has waited longest, of the address with
    /// the most yielding holders, to give its slot up; false when none yields.
    fn displace(&self) -> bool {
        let mut holders = self.holders();
        let mut per_address: HashMap<Option<IpAddr>, (usize, Instant, u64)> = HashMap::new();
        for (&id, h) in holders.by_id.iter().filter(|(_, h)| h.yields()) {
            let entry = per_address.entry(h.address).or_insert((0, h.since, id));
            entry.0 += 1;
            if h.since < entry.1 {
                (entry.1, entry.2) = (h.since, id);
            }
        }
        // Most yielding holders first; of two alike, the one with the staler holder.
        let Some(&(_, _, victim)) = per_address.values().max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
        else {
            return false;
        };
        if let Some(h) = holders.by_id.get_mut(&victim) {
            drop(h.give_up.take());
        }
        true
    }

    /// Whether a holder already told to give its slot up has yet to let go
    /// (a newcomer that finds none yielding waits for that one).
    fn releasing(&self) -> bool {
        self.holders().by_id.values().any(|h| h.give_up.is_none())
    }

    /// How many slots are held (by holders still running).
    pub fn held_count(&self) -> usize {
        self.holders().by_id.len()
    }
}

/// A connection's slot, held until it drops.
#[derive(Debug)]
pub struct Slot {
    slots: Arc<Slots>,
    id: u64,
    given_up: oneshot::Receiver<()>,
    _permit: OwnedSemaphorePermit,
}

impl Slot {
    /// A handle that marks what the connection does (it can be cloned into
    /// the code serving it, while the slot waits in [`Slot::given_up`]).
    pub fn marker(&self) -> Marker {
        Marker { slots: self.slots.clone(), id: self.id }
    }

    /// Resolves when the connection is told to give its slot up (a newcomer
    /// found none free and this one had yielded longest). Never, once proven.
    pub async fn given_up(&mut self) {
        let _ = (&mut self.given_up).await;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.holders().by_id.remove(&self.id);
    }
}

/// Marks what one connection does: proven, or a request at work.
#[derive(Debug, Clone)]
pub struct Marker {
    slots: Arc<Slots>,
    id: u64,
}

impl Marker {
    /// Marks the connection as proven (its client authenticated): it keeps its
    /// slot until it closes.
    pub fn prove(&self) {
        if let Some(h) = self.slots.holders().by_id.get_mut(&self.id) {
            h.proven = true;
        }
    }

    /// The connection is at work until the returned guard drops.
    pub fn begin(&self) -> Working {
        if let Some(h) = self.slots.holders().by_id.get_mut(&self.id) {
            h.working += 1;
        }
        Working { marker: self.clone() }
    }
}

/// A request at work; its connection yields again when the last one drops.
#[derive(Debug)]
pub struct Working {
    marker: Marker,
}

impl Drop for Working {
    fn drop(&mut self) {
        if let Some(h) = self.marker.slots.holders().by_id.get_mut(&self.marker.id) {
            h.working = h.working.saturating_sub(1);
            if h.working == 0 {
                h.since = Instant::now();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([127, 0, 0, last]))
    }

    #[tokio::test(start_paused = true)]
    async fn a_newcomer_displaces_the_stalest_yielding_holder_of_the_busiest_address() {
        let slots = Slots::new(4);
        let mut a1 = slots.take(at(1), Instant::now()).await.unwrap();
        tokio::time::advance(Duration::from_millis(1)).await;
        let mut b1 = slots.take(at(2), Instant::now()).await.unwrap();
        tokio::time::advance(Duration::from_millis(1)).await;
        let mut b2 = slots.take(at(2), Instant::now()).await.unwrap();
        let proven = slots.take(at(2), Instant::now()).await.unwrap();
        proven.marker().prove();
        // Full: the newcomer's slot comes from address 2's oldest, b1.
        let newcomer = tokio::spawn({
            let slots = slots.clone();
            async move { slots.take(at(1), Instant::now()).await.map(|s| s.id) }
        });
        tokio::time::timeout(Duration::from_millis(10), b1.given_up()).await.expect("b1 gives up");
        drop(b1);
        assert!(newcomer.await.unwrap().is_some());
        // Neither a1 nor b2 was asked.
        assert!(tokio::time::timeout(Duration::from_millis(10), a1.given_up()).await.is_err());
        assert!(tokio::time::timeout(Duration::from_millis(10), b2.given_up()).await.is_err());
        drop(proven);
    }

    #[tokio::test(start_paused = true)]
    async fn holders_at_work_or_proven_are_never_displaced() {
        let slots = Slots::new(2);
        let proven = slots.take(at(1), Instant::now()).await.unwrap();
        proven.marker().prove();
        let busy = slots.take(at(1), Instant::now()).await.unwrap();
        let working = busy.marker().begin();
        assert!(slots.take(at(1), Instant::now()).await.is_none(), "nobody yields");
        drop(working);
        // Idle again, so it yields.
        let mut busy = busy;
        let newcomer = tokio::spawn({
            let slots = slots.clone();
            async move { slots.take(at(3), Instant::now()).await }
        });
        tokio::time::timeout(Duration::from_millis(10), busy.given_up()).await.expect("told to give up");
        drop(busy);
        let newcomer = newcomer.await.unwrap().expect("the newcomer has a slot");
        assert_eq!(slots.held_count(), 2);
        drop(newcomer);
    }

    #[tokio::test(start_paused = true)]
    async fn a_holder_that_does_not_let_go_leaves_the_newcomer_without_a_slot() {
        let slots = Slots::new(1);
        let _stuck = slots.take(None, Instant::now()).await.unwrap();
        assert!(slots.take(None, Instant::now()).await.is_none());
    }
}
