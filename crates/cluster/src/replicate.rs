//! Goldens on many nodes: a node fetches a golden generation it lacks from a
//! node that holds it, over the node-to-node link, ahead of time (`airlock
//! golden replicate`) or when a fork placed here needs it. The files are
//! checked against the hashes the sending node recorded when it built the
//! generation ([`airlock_lifecycle::golden::replica`]); a transfer that does
//! not match is refused, its files removed, and tried again, from another
//! holder when there is one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use serde::{Deserialize, Serialize};

use crate::records::NodeRecord;
use crate::Cluster;
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_lifecycle::engine::GoldenWork;
use airlock_lifecycle::golden::replica::{Offer, Receiver};

/// Tries of one fetch before it is given up.
pub const TRIES: u32 = 3;
/// How long a sending node may stay silent in the middle of a transfer.
const SILENCE: Duration = Duration::from_secs(60);

/// What a fetch did, for `airlock golden replicate`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Fetched {
    /// The node that now holds the generation.
    pub node: String,
    /// The golden.
    pub golden: String,
    /// The generation.
    pub generation: i64,
    /// The node it came from (none when it was here already).
    pub from: Option<String>,
    /// Whether the node held it already (nothing was sent).
    pub already: bool,
    /// Bytes received.
    pub bytes: u64,
    /// Seconds the transfer took, hashing and placing included.
    pub seconds: f64,
    /// Megabytes (10^6 bytes) a second.
    pub mb_per_s: f64,
    /// Tries it took (a refused transfer is tried again).
    pub attempts: u32,
}

/// One fetch at a time per golden on a node: forks that need it wait for it.
#[derive(Default)]
pub(crate) struct Fetching(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl Fetching {
    fn of(&self, golden: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).entry(golden.to_owned()).or_default().clone()
    }
}

impl Cluster {
    /// Whether this node holds golden `name` (its generation `generation`, or any).
    pub fn holds(&self, name: &str, generation: Option<i64>) -> bool {
        match self.engine.store().golden(name) {
            Ok(g) => generation.is_none_or(|n| g.generations.iter().any(|m| m.generation == n)),
            Err(_) => false,
        }
    }

    /// Fetches golden `name` from a node that holds it: its generation
    /// `generation`, or that node's current one. Nothing is sent when this
    /// node holds it already.
    pub async fn fetch_golden(&self, name: &str, generation: Option<i64>) -> Result<Fetched> {
        airlock_core::validate::name("golden", name)?;
        let me = self.settings.node.clone();
        let lock = self.fetching.of(name);
        let _one = lock.lock().await;
        let mut holders: Vec<NodeRecord> =
            self.up().await?.into_iter().filter(|n| n.name != me && n.holds(name, generation)).collect();
        // The least busy first.
        holders.sort_by_key(|n| (n.running, n.name.clone()));
        let wanted =
            generation.or_else(|| holders.first().and_then(|n| n.goldens.get(name)?.last().copied()));
        let here = |generation: i64| Fetched {
            node: me.clone(),
            golden: name.to_owned(),
            generation,
            from: None,
            already: true,
            bytes: 0,
            seconds: 0.0,
            mb_per_s: 0.0,
            attempts: 0,
        };
        match wanted {
            Some(n) if self.holds(name, Some(n)) => return Ok(here(n)),
            None if self.holds(name, None) => {
                let current = self.engine.store().golden(name)?.current_generation;
                return Ok(here(current));
            }
            None => {
                return Err(Error::new(
                    ErrorCode::GoldenNotFound,
                    format!("no node up holds golden {name:?}"),
                    "build it on one node (`airlock golden create`), then replicate it (`airlock golden replicate`)",
                ))
            }
            Some(_) => {}
        }
        let generation = wanted.expect("a generation was found");
        let _reserved = self.engine.reserve_golden(name, GoldenWork::Replicate)?;
        let started = Instant::now();
        let mut last = None;
        for attempt in 1..=TRIES {
            // Each try from the next holder, round again when there are fewer.
            let from = &holders[(attempt as usize - 1) % holders.len()];
            match self.receive(from, name, generation, attempt, started).await {
                Ok(fetched) => return Ok(fetched),
                Err(e)
                    if e.code == ErrorCode::ReplicationFailed || e.code == ErrorCode::ClusterUnavailable =>
                {
                    tracing::warn!(golden = name, generation, from = %from.name, attempt, error = %e.message, "a golden's transfer was refused; trying again");
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        let e = last.expect("a try failed");
        Err(Error::new(e.code, format!("{} ({TRIES} tries)", e.message), e.hint))
    }

    /// One try: the offer, then the files, each checked as it lands; the
    /// generation placed if every one was whole.
    async fn receive(
        &self,
        from: &NodeRecord,
        name: &str,
        generation: i64,
        attempt: u32,
        started: Instant,
    ) -> Result<Fetched> {
        let path = format!("/v1/goldens/{name}/replica?generation={generation}");
        let answer =
            self.peers.send(from, "GET", &path, None, bytes::Bytes::new(), Duration::from_secs(600)).await?;
        if answer.status != 200 {
            return Err(crate::peer_error(from, &answer));
        }
        let offer: Offer = serde_json::from_slice(&answer.body)
            .map_err(|e| Error::internal(format!("node {} offered what does not read: {e}", from.name)))?;
        if offer.manifest.name != name || offer.manifest.generation != generation {
            return Err(airlock_lifecycle::golden::replica::corrupt(
                name,
                "the offer is of another generation",
            ));
        }
        let bytes = offer.inventory.bytes();
        let engine = self.engine.clone();
        let mut receiver = tokio::task::spawn_blocking(move || Receiver::start(engine, offer))
            .await
            .map_err(|e| Error::internal(e.to_string()))??;
        let files = format!("/v1/goldens/{name}/replica/files?generation={generation}");
        let (status, mut body) = self.peers.open(from, &files, Duration::from_secs(30)).await?;
        if status != 200 {
            return Err(Error::new(
                ErrorCode::ClusterUnavailable,
                format!("node {} would not send golden {name:?}'s files (HTTP {status})", from.name),
                "see that node's daemon log",
            ));
        }
        // Writing and hashing run on a thread of their own, fed as the bytes come.
        let (feed, mut fed) = tokio::sync::mpsc::channel::<bytes::Bytes>(16);
        let writer = tokio::task::spawn_blocking(move || -> Result<Receiver> {
            while let Some(chunk) = fed.blocking_recv() {
                receiver.take(&chunk)?;
            }
            Ok(receiver)
        });
        let reading = async {
            loop {
                let frame = match tokio::time::timeout(SILENCE, body.frame()).await {
                    Err(_) => {
                        return Err(format!("node {} went silent for {}s", from.name, SILENCE.as_secs()))
                    }
                    Ok(None) => return Ok(()),
                    Ok(Some(Err(e))) => return Err(format!("the stream from node {} broke: {e}", from.name)),
                    Ok(Some(Ok(frame))) => frame,
                };
                if let Ok(data) = frame.into_data() {
                    if feed.send(data).await.is_err() {
                        // The writer stopped: it says why.
                        return Ok(());
                    }
                }
            }
        };
        let read = reading.await;
        drop(feed);
        let receiver = writer.await.map_err(|e| Error::internal(e.to_string()))??;
        if let Err(why) = read {
            return Err(airlock_lifecycle::golden::replica::corrupt(name, why));
        }
        let seconds = started.elapsed().as_secs_f64();
        let detail = serde_json::json!({
            "from": from.name, "attempts": attempt, "ms": (seconds * 1000.0).round() as u64,
        });
        tokio::task::spawn_blocking(move || receiver.finish(detail))
            .await
            .map_err(|e| Error::internal(e.to_string()))??;
        // Announced at once, so placement sees this node holds it.
        if let Err(e) = self.announce_now().await {
            tracing::warn!(error = %e, "could not announce a replicated golden");
        }
        Ok(Fetched {
            node: self.settings.node.clone(),
            golden: name.to_owned(),
            generation,
            from: Some(from.name.clone()),
            already: false,
            bytes,
            seconds,
            mb_per_s: bytes as f64 / 1e6 / seconds.max(1e-9),
            attempts: attempt,
        })
    }
}
