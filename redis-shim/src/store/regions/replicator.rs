//! Replication between regions: per peer region, a loop that reads the peer's stream of
//! spending from where this region stopped, applies it as the peer's components of each
//! key here with the new position in the same call (apply.lua), and learns how far the
//! peer has applied this region's stream (its confirmation, which renews this region's
//! share). Every shim of a region runs it: apply.lua applies a page only from the
//! position it follows, so one shim wins each page and nothing is applied twice or
//! skipped, whichever shim dies when.

use crate::store::redis_store::RedisStore;
use crate::store::regions::{parse_stream_id, Regions};
use crate::store::scripts::FunctionCall;
use crate::store::StoreError;
use redis::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most entries read and applied in one pass.
pub const PAGE: usize = 256;
/// Pause after a pass that found the peer's stream read to its end, in milliseconds.
pub const IDLE_MS: u64 = 10;
const IDLE: Duration = Duration::from_millis(IDLE_MS);
/// Pause after a pass that failed.
const AFTER_FAILURE: Duration = Duration::from_millis(100);
/// How often the peer's stream is checked for entries trimmed before this region read
/// them.
const GAP_CHECK: Duration = Duration::from_secs(1);

/// Starts one replication loop per peer, on `local` (this region's Redis, a connection
/// of its own); they end when the returned handles are aborted.
pub fn spawn(local: Arc<RedisStore>, regions: Arc<Regions>) -> Vec<tokio::task::JoinHandle<()>> {
    (0..regions.peers.len())
        .map(|peer| tokio::spawn(replicate(local.clone(), regions.clone(), peer)))
        .collect()
}

async fn replicate(local: Arc<RedisStore>, regions: Arc<Regions>, peer: usize) {
    let name = regions.peers[peer].name.clone();
    let mut failing: Option<String> = None;
    let mut gap_checked = Instant::now();
    let mut gap_reported = (0, 0);
    loop {
        let started = Instant::now();
        match pass(&local, &regions, peer).await {
            Ok(read) => {
                regions.passed(peer, started.elapsed());
                if failing.take().is_some() {
                    tracing::info!(peer = %name, "peer region answers again: replicating");
                }
                if gap_checked.elapsed() >= GAP_CHECK {
                    gap_checked = Instant::now();
                    check_gap(&local, &regions, peer, &mut gap_reported).await;
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
        .cmd("XRANGE")
        .arg(regions.stream_key())
        .arg(from)
        .arg("+")
        .arg("COUNT")
        .arg(PAGE);
    let (acked, entries): (Option<String>, Vec<(String, Vec<String>)>) = this.store.pipeline(&reads).await?;
    if let Some((last, _)) = entries.last() {
        let parsed: Vec<Entry> = entries
            .iter()
            .filter_map(|(_, fields)| Entry::parse(fields, regions.prefix()))
            .collect();
        let mut call = FunctionCall::new(&local.library().apply);
        call.key(&position_key)
            .arg(this.name.as_str())
            .arg(position.as_str())
            .arg(last.as_str());
        for entry in &parsed {
            call.key(entry.key)
                .arg(entry.window)
                .arg(entry.count)
                .arg(entry.before)
                .arg(entry.expires)
                .arg(entry.period);
        }
        let added: i64 = local.call_function(&call).await?;
        if let Ok(added) = u64::try_from(added) {
            this.metrics.applied(parsed.len() as u64, added);
        }
    }
    regions.answered(peer, acked);
    let backlog = if entries.len() == PAGE { PAGE as u64 } else { 0 };
    this.metrics.passed(regions.started, backlog);
    Ok(entries.len())
}

/// One entry of a peer's stream, as replicated.lua wrote it.
struct Entry<'a> {
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
            key,
            window: number("w")?,
            count: number("c")?,
            before: number("p")?,
            expires: number("x")?,
            period: number("P").unwrap_or(0),
        })
    }
}

/// Counts and logs, once per trimmed position, entries the peer trimmed from its stream
/// before this region applied them: spending this region will not learn of (later
/// entries of the same keys carry their whole component again).
async fn check_gap(local: &RedisStore, regions: &Regions, peer: usize, reported: &mut (u64, u64)) {
    let this = &regions.peers[peer];
    let info: Result<HashMap<String, Value>, StoreError> = this
        .store
        .command(redis::cmd("XINFO").arg("STREAM").arg(regions.stream_key()))
        .await;
    let Ok(info) = info else { return };
    let Some(Value::BulkString(deleted)) = info.get("max-deleted-entry-id") else {
        return;
    };
    let deleted = parse_stream_id(&String::from_utf8_lossy(deleted));
    let position: Result<Option<String>, StoreError> = local
        .command(redis::cmd("GET").arg(regions.position_key(&this.name)))
        .await;
    let Ok(position) = position else { return };
    let position = parse_stream_id(position.as_deref().unwrap_or("0-0"));
    if deleted > position && deleted != *reported {
        *reported = deleted;
        this.metrics.gap();
        tracing::error!(
            peer = %this.name,
            "the peer trimmed entries of its stream this region had not applied (a partition longer than twice the longest window): that spending is not counted here"
        );
    }
}
