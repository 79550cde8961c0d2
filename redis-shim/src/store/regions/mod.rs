//! Several regions (docs/REGIONS.md): this shim's region and its peers, each peer's
//! Redis reached with the cross-region timeout, and what this shim knows of each peer's
//! link (the position of this region's stream it has applied, when it last answered).
//! A key's home region is chosen here; [`router`] sends a request's checks where their
//! rung says; [`replicator`] applies each peer's spending to this region's Redis and
//! learns what the peer has confirmed of ours.

pub mod replicator;
pub mod router;

use crate::metrics::regions::PeerMetrics;
use crate::metrics::Metrics;
use crate::store::redis_connection::RedisConfig;
use crate::store::redis_store::RedisStore;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the flags say about regions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionsConfig {
    /// This shim's region.
    pub own: String,
    /// Every other region: its name and its Redis URL.
    pub peers: Vec<(String, String)>,
    /// Longest a call to a peer's Redis may take (a home check, a replication read).
    pub peer_timeout: Duration,
    /// A peer silent this long is treated as cut off.
    pub cutoff: Duration,
}

/// The regions' flags as given: [`RegionFlags::parse`] checks them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegionFlags {
    /// `--region`.
    pub region: Option<String>,
    /// Each `--peer-region`, `NAME=REDIS_URL`.
    pub peers: Vec<String>,
    pub peer_timeout_ms: u64,
    pub cutoff_ms: u64,
}

impl RegionFlags {
    /// The regions the flags name: none without --region; a malformed --peer-region, or
    /// one named like this region or like another, is refused naming the flag.
    pub fn parse(&self) -> Result<Option<RegionsConfig>, String> {
        let Some(own) = &self.region else {
            return Ok(None);
        };
        if let Some(invalid) = invalid_region_name(own) {
            return Err(format!("--region {invalid}"));
        }
        let mut peers: Vec<(String, String)> = Vec::new();
        for peer in &self.peers {
            let Some((name, url)) = peer.split_once('=') else {
                return Err(format!("--peer-region {peer:?}: expected NAME=REDIS_URL"));
            };
            if let Some(invalid) = invalid_region_name(name) {
                return Err(format!("--peer-region {invalid}"));
            }
            if name == own {
                return Err(format!("--peer-region {name}: named like this region (--region)"));
            }
            if peers.iter().any(|(known, _)| known == name) {
                return Err(format!("--peer-region {name}: given twice"));
            }
            if let Err(e) = redis::IntoConnectionInfo::into_connection_info(url) {
                return Err(format!("--peer-region {name}: {url:?} is not a Redis URL: {e}"));
            }
            peers.push((name.to_string(), url.to_string()));
        }
        if self.peer_timeout_ms == 0 || self.cutoff_ms == 0 {
            return Err("--peer-timeout-ms and --peer-cutoff-ms: must be at least 1".into());
        }
        Ok(Some(RegionsConfig {
            own: own.clone(),
            peers,
            peer_timeout: Duration::from_millis(self.peer_timeout_ms),
            cutoff: Duration::from_millis(self.cutoff_ms),
        }))
    }
}

/// The longest region name: it is part of field and key names.
pub const MAX_REGION_NAME: usize = 32;

/// Why `name` cannot name a region, or `None`.
pub fn invalid_region_name(name: &str) -> Option<String> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
    (name.is_empty() || name.len() > MAX_REGION_NAME || !name.bytes().all(allowed))
        .then(|| format!("{name:?}: a region's name is 1 to {MAX_REGION_NAME} letters, digits, '-' or '_'"))
}

/// A peer region, as this shim knows it.
pub struct Peer {
    pub name: String,
    /// Its Redis, reached with the peer timeout.
    pub store: RedisStore,
    link: Mutex<Link>,
    pub metrics: PeerMetrics,
    /// How long the last replication pass with it took, in milliseconds.
    pass_ms: AtomicU64,
}

#[derive(Default)]
struct Link {
    /// The position of this region's stream the peer has applied.
    acked: Option<String>,
    /// When the peer last answered a whole replication pass with its shims alive.
    answered: Option<Instant>,
    /// The peers the peer's shims last said they reach.
    reach: Vec<String>,
}

/// Where a key's count lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Home {
    Here,
    Peer(usize),
}

/// This shim's region and its peers.
pub struct Regions {
    pub own: String,
    /// Every region's name, sorted, this one's included.
    names: Vec<String>,
    /// The same, space-separated, as check_regions.lua takes them, and comma-separated, as
    /// the shims publish them ([`Self::alive_value`]).
    names_arg: String,
    names_published: String,
    /// This region's stream of spending, in its own Redis.
    stream_key: String,
    /// This region's place in `names`.
    rank: usize,
    pub peers: Vec<Peer>,
    cutoff: Duration,
    prefix: String,
    pub started: Instant,
}

impl Regions {
    /// The regions of `config`, each peer's Redis connecting lazily (a peer down at start
    /// is a partition from the first second, not a failure to start).
    pub fn connect(config: &RegionsConfig, local: &RedisConfig, prefix: &str) -> Result<Regions, String> {
        let mut names: Vec<String> = config.peers.iter().map(|(name, _)| name.clone()).collect();
        names.push(config.own.clone());
        names.sort();
        let peers = config
            .peers
            .iter()
            .map(|(name, url)| {
                let redis = RedisConfig {
                    urls: vec![url.clone()],
                    cluster: false,
                    timeout: config.peer_timeout,
                    max_pending: local.max_pending,
                };
                // Its own metrics, unrendered: cross-region calls would skew the shim's
                // Redis latency (the regions' own metrics are per peer).
                let store = RedisStore::connect(&redis, Arc::new(Metrics::default()))
                    .map_err(|e| format!("--peer-region {name}: {e}"))?;
                Ok(Peer {
                    name: name.clone(),
                    store,
                    link: Mutex::default(),
                    metrics: PeerMetrics::default(),
                    pass_ms: AtomicU64::new(0),
                })
            })
            .collect::<Result<Vec<Peer>, String>>()?;
        Ok(Regions {
            rank: names.iter().position(|name| *name == config.own).unwrap_or(0),
            own: config.own.clone(),
            names_arg: names.join(" "),
            names_published: names.join(","),
            stream_key: format!("{prefix}regions:stream"),
            names,
            peers,
            cutoff: config.cutoff,
            prefix: prefix.to_string(),
            started: Instant::now(),
        })
    }

    /// The key's home: the region whose hash with the key is highest (rendezvous
    /// hashing over the sorted names), so a region added or removed moves only the keys
    /// it takes or held.
    pub fn home_of(&self, key: &str) -> Home {
        let best = self
            .names
            .iter()
            .max_by_key(|name| (home_hash(key, name), std::cmp::Reverse(name.as_str())))
            .map(String::as_str);
        match self
            .peers
            .iter()
            .position(|peer| Some(peer.name.as_str()) == best)
        {
            Some(index) => Home::Peer(index),
            None => Home::Here,
        }
    }

    /// This region's stream of spending, in its own Redis.
    pub fn stream_key(&self) -> &str {
        &self.stream_key
    }

    /// Where a region keeps its position in `peer`'s stream (in its own Redis).
    pub fn position_key(&self, peer: &str) -> String {
        format!("{}regions:applied:{peer}", self.prefix)
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn names_arg(&self) -> &str {
        &self.names_arg
    }

    /// How many regions there are, this one's included.
    pub fn count(&self) -> usize {
        self.names.len()
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    fn link(&self, peer: usize) -> std::sync::MutexGuard<'_, Link> {
        self.peers[peer]
            .link
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether `peer` answered within the cut-off.
    pub fn reachable(&self, peer: usize) -> bool {
        self.link(peer)
            .answered
            .is_some_and(|at| at.elapsed() <= self.cutoff)
    }

    /// When this region's share, spent now, is expected to renew: the peers apply and
    /// confirm within about two passes (one reads our entries, one brings back their
    /// confirmation). With a peer counted on out of reach, the cut-off.
    pub fn renew_ms(&self) -> u64 {
        let cutoff = u64::try_from(self.cutoff.as_millis()).unwrap_or(u64::MAX);
        let slowest = self
            .peers
            .iter()
            .map(|peer| peer.pass_ms.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0);
        (2 * slowest + 2 * replicator::IDLE_MS).clamp(1, cutoff)
    }

    /// Notes how long a pass with `peer` took.
    pub fn passed(&self, peer: usize, took: Duration) {
        let ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
        self.peers[peer].pass_ms.store(ms, Ordering::Relaxed);
    }

    /// Notes a whole pass with `peer` whose shims are alive: it has applied our stream up
    /// to `acked` (nothing, when it holds no position: its Redis lost it), and reaches the
    /// regions named in `reach`.
    pub fn answered(&self, peer: usize, acked: Option<String>, reach: Vec<String>) {
        let mut link = self.link(peer);
        link.answered = Some(Instant::now());
        link.acked = acked;
        link.reach = reach;
    }

    /// The peers this region counts on to confirm its spending. When it and the peers in
    /// its reach are a majority of the regions, those peers, and every peer out of its
    /// reach that one of them still reaches (a link cut between two regions, not a
    /// region cut off: neither end may carry on without the other, or each would spend
    /// the limit); otherwise every peer (a region cut off from the majority spends no
    /// more than its share).
    pub fn counted(&self) -> Vec<usize> {
        let reachable: Vec<usize> = (0..self.peers.len()).filter(|&p| self.reachable(p)).collect();
        if 2 * (reachable.len() + 1) <= self.names.len() {
            return (0..self.peers.len()).collect();
        }
        let reported: Vec<Vec<String>> = reachable.iter().map(|&p| self.link(p).reach.clone()).collect();
        (0..self.peers.len())
            .filter(|&p| {
                reachable.contains(&p) || reported.iter().any(|reach| reach.contains(&self.peers[p].name))
            })
            .collect()
    }

    /// The position of this region's stream that every peer it counts on ([`Self::counted`])
    /// has applied; `"0-0"` when one of them has confirmed nothing.
    pub fn confirmed(&self) -> String {
        let mut lowest: Option<(u64, u64, String)> = None;
        for peer in self.counted() {
            let acked = self.link(peer).acked.clone().unwrap_or_else(|| "0-0".into());
            let id = parse_stream_id(&acked);
            if lowest.as_ref().is_none_or(|(ms, seq, _)| id < (*ms, *seq)) {
                lowest = Some((id.0, id.1, acked));
            }
        }
        // Every peer out of reach and dropped: all this region spent is confirmed.
        lowest.map_or_else(|| "18446744073709551615-0".into(), |(_, _, id)| id)
    }

    /// What this region's shims publish, for their peers, in this region's Redis: the
    /// regions they know, and those they reach.
    pub fn alive_value(&self) -> String {
        let reach: Vec<&str> = (0..self.peers.len())
            .filter(|&p| self.reachable(p))
            .map(|p| self.peers[p].name.as_str())
            .collect();
        format!("{} {}", self.names_published, reach.join(","))
    }

    /// Where a region's shims publish [`Self::alive_value`], expiring unless renewed.
    pub fn alive_key(&self) -> String {
        format!("{}regions:alive", self.prefix)
    }

    /// The regions a peer's published value says it knows and reaches; `None` when it
    /// names other regions than this shim does (a peer configured with another set).
    pub fn read_alive(&self, value: &str) -> Option<Vec<String>> {
        let (names, reach) = value.split_once(' ').unwrap_or((value, ""));
        (names == self.names_published).then(|| {
            reach
                .split(',')
                .filter(|name| !name.is_empty())
                .map(str::to_string)
                .collect()
        })
    }

    pub fn cutoff(&self) -> Duration {
        self.cutoff
    }

    /// The regions' metrics, in the text exposition format.
    pub fn render(&self, out: &mut String) {
        if self.peers.is_empty() {
            return;
        }
        out.push_str("# TYPE rlshim_region_peer_reachable gauge\n");
        for (index, peer) in self.peers.iter().enumerate() {
            let _ = writeln!(
                out,
                "rlshim_region_peer_reachable{{peer=\"{}\"}} {}",
                peer.name,
                u8::from(self.reachable(index))
            );
        }
        let peers: Vec<(&str, &PeerMetrics)> = self
            .peers
            .iter()
            .map(|peer| (peer.name.as_str(), &peer.metrics))
            .collect();
        crate::metrics::regions::render(&peers, self.started, out);
    }
}

/// A stream position's two numbers; `(0, 0)` for what is not one.
pub fn parse_stream_id(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

/// FNV-1a over the key, a zero byte and the region's name, then MurmurHash3's finalizer
/// (FNV alone barely mixes its last bytes, and names differing in their last letter
/// would rank alike for most keys): stable across versions and machines, which a home
/// must be.
fn home_hash(key: &str, region: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.bytes().chain([0]).chain(region.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^ (hash >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regions(own: &str, peers: &[&str]) -> Regions {
        let config = RegionsConfig {
            own: own.into(),
            peers: peers
                .iter()
                .map(|name| (name.to_string(), "redis://127.0.0.1:1".to_string()))
                .collect(),
            peer_timeout: Duration::from_millis(500),
            cutoff: Duration::from_millis(1000),
        };
        let local = RedisConfig {
            urls: vec!["redis://127.0.0.1:1".into()],
            cluster: false,
            timeout: Duration::from_millis(50),
            max_pending: 16,
        };
        Regions::connect(&config, &local, "rl:").unwrap()
    }

    fn home_name(regions: &Regions, key: &str) -> String {
        match regions.home_of(key) {
            Home::Here => regions.own.clone(),
            Home::Peer(index) => regions.peers[index].name.clone(),
        }
    }

    #[tokio::test]
    async fn every_region_agrees_on_a_key_home_and_homes_spread() {
        let a = regions("a", &["b", "c"]);
        let b = regions("b", &["c", "a"]);
        let c = regions("c", &["a", "b"]);
        let mut counts = std::collections::HashMap::new();
        for i in 0..300 {
            // Keys alike but for a counter, as one rule's keys for many clients are.
            let key = format!("home{i}:{{4242-{i}}}");
            let home = home_name(&a, &key);
            assert_eq!(home, home_name(&b, &key), "{key}");
            assert_eq!(home, home_name(&c, &key), "{key}");
            *counts.entry(home).or_insert(0) += 1;
        }
        for region in ["a", "b", "c"] {
            assert!(counts[region] > 70, "{counts:?}");
        }
        // The hash itself is fixed: a home must not move between versions.
        assert_eq!(home_hash("per-user:{abc}", "a"), 0x7fb8_ae19_f191_29d9);
    }

    #[tokio::test]
    async fn a_region_cut_off_from_the_majority_counts_on_every_peer() {
        let a = regions("a", &["b", "c"]);
        assert_eq!(a.confirmed(), "0-0", "nothing confirmed yet");
        a.answered(0, Some("5-0".into()), vec![]);
        // b answered, c never did, nor does b reach it: a and b are two of three, so c is
        // not waited for.
        assert_eq!(a.confirmed(), "5-0");
        // b reaches c: only the link between a and c is cut, and a waits for c.
        a.answered(0, Some("5-0".into()), vec!["a".into(), "c".into()]);
        assert_eq!(a.counted(), vec![0, 1]);
        assert_eq!(a.confirmed(), "0-0");
        let two = regions("x", &["y"]);
        assert_eq!(two.confirmed(), "0-0", "of two regions, one alone is no majority");
    }

    #[tokio::test]
    async fn a_peer_knowing_other_regions_is_not_read_as_alive() {
        let a = regions("a", &["b", "c"]);
        a.answered(0, Some("1-0".into()), vec![]);
        assert_eq!(a.alive_value(), "a,b,c b");
        assert_eq!(
            a.read_alive("a,b,c a,c"),
            Some(vec!["a".to_string(), "c".to_string()])
        );
        assert_eq!(a.read_alive("a,b,c "), Some(vec![]));
        assert_eq!(a.read_alive("a,b a"), None);
    }

    #[test]
    fn region_names_are_plain() {
        assert!(invalid_region_name("eu-west_1").is_none());
        for bad in ["", "a b", "a:b", "{x}", &"x".repeat(33)] {
            assert!(invalid_region_name(bad).is_some(), "{bad:?}");
        }
    }
}
