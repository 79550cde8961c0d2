//! Replication between regions: per peer region, a loop that reads the peer's stream of
//! spending from where this region stopped, applies it as the peer's components of each
//! key here with the new position in the same call (apply.lua), and learns how far the
//! peer has applied this region's stream (its confirmation, which renews this region's
//! share). Every shim of a region runs it: apply.lua applies a page only from the
//! position it follows, so one shim wins each page and nothing is applied twice or
//! skipped, whichever shim dies when.

use crate::store::redis_store::RedisStore;
use crate::store::regions::Regions;
use crate::store::scripts::FunctionCall;
use crate::store::StoreError;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most entries read and applied in one pass: a region's shims together apply at most
/// this many of a peer's entries per round trip to it (12,500 a second at 40 ms one way).
pub const PAGE: usize = 1000;
/// Pause after a pass that found the peer's stream read to its end, in milliseconds.
pub const IDLE_MS: u64 = 10;
const IDLE: Duration = Duration::from_millis(IDLE_MS);
/// Pause after a pass that failed.
const AFTER_FAILURE: Duration = Duration::from_millis(100);
/// Starts one replication loop per peer, and the heartbeat that tells the peers this
/// region's shims are alive and whom they reach, on `local` (this region's Redis, a
/// connection of its own); they end when the returned handles are aborted.
pub fn spawn(local: Arc<RedisStore>, regions: Arc<Regions>) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks: Vec<_> = (0..regions.peers.len())
        .map(|peer| tokio::spawn(replicate(local.clone(), regions.clone(), peer)))
        .collect();
    tasks.push(tokio::spawn(heartbeat(local, regions)));
    tasks
}

/// Publishes, four times per cut-off, this region's names and the peers this shim
/// reaches, expiring after the cut-off: a region whose shims are all gone (its Redis
/// still answering) stops confirming, and its peers must see it as cut off.
async fn heartbeat(local: Arc<RedisStore>, regions: Arc<Regions>) {
    let cutoff = regions.cutoff();
    let expiry = u64::try_from(cutoff.as_millis()).unwrap_or(u64::MAX);
    loop {
        let publish = redis::cmd("SET")
            .arg(regions.alive_key())
            .arg(regions.alive_value())
            .arg("PX")
            .arg(expiry)
            .to_owned();
        if let Err(error) = local.command::<()>(&publish).await {
            tracing::debug!(%error, "cannot publish this region's liveness");
        }
        tokio::time::sleep(cutoff / 4).await;
    }
}

async fn replicate(local: Arc<RedisStore>, regions: Arc<Regions>, peer: usize) {
    let name = regions.peers[peer].name.clone();
    let mut failing: Option<String> = None;
    loop {
        let started = Instant::now();
        match pass(&local, &regions, peer).await {
            Ok(read) => {
                regions.passed(peer, started.elapsed());
                if failing.take().is_some() {
                    tracing::info!(peer = %name, "peer region answers again: replicating");
                }
                if read < PAGE {
                    tokio::time::sleep(IDLE).await;
                }
            }
            Err(error) => {
                regions.peers[peer].metrics.failed();
                let message = error.to_string();
                if failing.as_deref() != Some(message.as_str()) {
                    tracing::warn!(peer = %name, error = %message, "peer region out of reach: treated as cut off once silent past the cut-off");
                    failing = Some(message);
                }
                tokio::time::sleep(AFTER_FAILURE).await;
            }
        }
    }
}

/// One pass: what the peer has applied of ours, then up to a page of its entries,
/// applied here. The number of entries read.
async fn pass(local: &RedisStore, regions: &Regions, peer: usize) -> Result<usize, StoreError> {
    let this = &regions.peers[peer];
    let position_key = regions.position_key(&this.name);
    let position: Option<String> = local.command(redis::cmd("GET").arg(&position_key)).await?;
    let position = position.unwrap_or_else(|| "0-0".into());
    // The peer's confirmation is read before its stream, in one round trip: what it says
    // it has applied of ours is then never newer than what we read of its own spending.
    let from = if position == "0-0" {
        "-".to_string()
    } else {
        format!("({position}")
    };
    let mut reads = redis::pipe();
    reads
        .cmd("GET")
        .arg(regions.position_key(&regions.own))
        .cmd("GET")
        .arg(regions.alive_key())
        .cmd("XRANGE")
        .arg(regions.stream_key())
        .arg(from)
        .arg("+")
        .arg("COUNT")
        .arg(PAGE);
    type Reads = (Option<String>, Option<String>, Vec<(String, Vec<String>)>);
    let (acked, alive, entries): Reads = this.store.pipeline(&reads).await?;
    if let Some((last, _)) = entries.last() {
        let parsed: Vec<Entry> = entries
            .iter()
            .filter_map(|(_, fields)| Entry::parse(fields, regions.prefix()))
            .collect();
        if parsed.len() < entries.len() {
            tracing::warn!(
                peer = %this.name,
                unread = entries.len() - parsed.len(),
                "entries of the peer's stream this shim cannot read (another version, or keys outside --key-prefix): skipped"
            );
        }
        let sequence = |entry: Option<&Entry>| entry.map_or(0, |entry| entry.sequence);
        let seq_key = format!("{position_key}:seq");
        let mut call = FunctionCall::new(&local.library().apply);
        call.key(&position_key)
            .key(&seq_key)
            .arg(this.name.as_str())
            .arg(position.as_str())
            .arg(last.as_str())
            .arg(sequence(parsed.first()))
            .arg(sequence(parsed.last()));
        for entry in &parsed {
            call.key(entry.key)
                .arg(entry.window)
                .arg(entry.count)
                .arg(entry.before)
                .arg(entry.expires)
                .arg(entry.period);
        }
        let (added, missed, skipped): (i64, u64, u64) = local.call_function(&call).await?;
        if let Ok(added) = u64::try_from(added) {
            this.metrics.applied(parsed.len() as u64, added);
            if missed > 0 {
                this.metrics.gap(missed);
                tracing::error!(
                    peer = %this.name,
                    missed,
                    "the peer trimmed entries of its stream before this region applied them (cut off for longer than twice the longest window): that spending is not counted here"
                );
            }
            if skipped > 0 {
                tracing::warn!(peer = %this.name, skipped, "entries whose key here is not a replicated counter: skipped");
            }
        }
    }
    match alive.as_deref().map(|value| regions.read_alive(value)) {
        Some(Some(reach)) => regions.answered(peer, acked, reach),
        // Its shims are gone (its Redis answers, but nobody applies our spending there).
        None => {}
        Some(None) => tracing::error!(
            peer = %this.name,
            "the peer region names another set of regions than --region and --peer-region here: its shares and homes differ, so it is not counted as in reach"
        ),
    }
    let backlog = if entries.len() == PAGE { PAGE as u64 } else { 0 };
    this.metrics.passed(regions.started, backlog);
    Ok(entries.len())
}

/// One entry of a peer's stream, as replicated.lua wrote it.
struct Entry<'a> {
    /// Its number in the peer's stream.
    sequence: u64,
    key: &'a str,
    window: i64,
    count: i64,
    before: i64,
    expires: i64,
    period: i64,
}

impl<'a> Entry<'a> {
    /// The entry of `fields` (name, value, ...), or `None` for one that is not ours (a
    /// key outside this shim's prefix is never written).
    fn parse(fields: &'a [String], prefix: &str) -> Option<Entry<'a>> {
        let field = |name: &str| {
            fields
                .chunks_exact(2)
                .find(|pair| pair[0] == name)
                .map(|pair| pair[1].as_str())
        };
        let number = |name: &str| field(name).and_then(|value| value.parse::<i64>().ok());
        let key = field("k").filter(|key| key.starts_with(prefix))?;
        Some(Entry {
            sequence: field("s").and_then(|value| value.parse().ok())?,
            key,
            window: number("w")?,
            count: number("c")?,
            before: number("p")?,
            expires: number("x")?,
            period: number("P").unwrap_or(0),
        })
    }
}
