//! Which master of a Redis Cluster holds which slot, as the shim last read it (`CLUSTER
//! SLOTS`), so that the requests bound for one master are decided in one call
//! (check_node.lua), whatever slots their keys lie in: with many clients, a batch's
//! requests fall in as many slots, and one call per slot cost Redis its fixed price per
//! call for each of them.
//!
//! The map is a guess, never trusted for correctness: Redis checks each key a script
//! touches, and a request with a key whose slot has moved fails before it writes
//! anything (check_node.lua); the shim then decides that request slot by slot, and reads
//! the map again. It is read on first use, then again every [`REFRESH_EVERY`] or after
//! such a failure, in a task of its own; until it is there, calls go per slot (a reading
//! that fails is tried again after [`RETRY_AFTER`]).

use redis::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;
use std::time::{Duration, Instant};

/// Slots of a Redis Cluster.
pub const SLOTS: usize = 16384;

/// How old a map may grow before it is read again (a slot that moved is also noticed by
/// the first request that meets it).
pub const REFRESH_EVERY: Duration = Duration::from_secs(10);

/// How soon after a reading a request that met a moved slot may have the map read again.
const STALE_AFTER: Duration = Duration::from_millis(100);

/// How soon a reading that found no map (Redis unreachable, say) is tried again: one
/// attempt, and one warning, per interval however many requests arrive.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// What a key's slot is, as Redis computes it (the hash tag's, when the key has one).
pub fn slot_of(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = bytes
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let close = bytes[open + 1..].iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &bytes[open + 1..open + 1 + close])
        })
        .unwrap_or(bytes);
    crc16::State::<crc16::XMODEM>::calculate(hashed) % SLOTS as u16
}

/// The map as last read, and when it was last read or tried.
#[derive(Default)]
struct Loaded {
    /// For each slot, the lowest slot its master holds, which names that master and
    /// routes a call to it.
    master_of: Option<Box<[u16]>>,
    read_at: Option<Instant>,
}

/// The slots' masters as last read, and whether to read them again.
#[derive(Default)]
pub struct NodeMap {
    loaded: RwLock<Loaded>,
    reading: AtomicBool,
    stale: AtomicBool,
}

impl NodeMap {
    /// The master holding every one of `keys`' slots, named by its lowest slot; `None`
    /// when they lie on several masters, or no map has been read yet.
    pub fn master_of(&self, keys: &[String]) -> Option<u16> {
        let loaded = self
            .loaded
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let master_of = loaded.master_of.as_ref()?;
        let mut slots = keys.iter().map(|key| master_of[slot_of(key) as usize]);
        let first = slots.next()?;
        slots.all(|master| master == first).then_some(first)
    }

    /// Whether the map should be read now; true for one caller at a time, who must
    /// then call [`Self::read`] with what it read (or an error).
    pub fn claim_reading(&self) -> bool {
        let loaded = self
            .loaded
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let wait = if loaded.master_of.is_none() {
            RETRY_AFTER
        } else if self.stale.load(Ordering::Relaxed) {
            STALE_AFTER
        } else {
            REFRESH_EVERY
        };
        let due = loaded.read_at.is_none_or(|at| at.elapsed() >= wait);
        due && !self.reading.swap(true, Ordering::AcqRel)
    }

    /// The end of a reading claimed with [`Self::claim_reading`]: `CLUSTER SLOTS`'
    /// reply, or why it could not be had (an older map is kept and read again after
    /// [`REFRESH_EVERY`]; without one, the next attempt is after [`RETRY_AFTER`]).
    pub fn read(&self, reply: Result<Value, String>) {
        self.stale.store(false, Ordering::Relaxed);
        let parsed = reply.and_then(|reply| parse_cluster_slots(&reply));
        {
            let mut loaded = self
                .loaded
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            loaded.read_at = Some(Instant::now());
            match parsed {
                Ok(master_of) => loaded.master_of = Some(master_of),
                Err(error) => {
                    tracing::warn!(%error, "cannot read the cluster's slots: calls go slot by slot")
                }
            }
        }
        self.reading.store(false, Ordering::Release);
    }

    /// A request met a key whose slot was not where the map said: read it again.
    pub fn mark_stale(&self) {
        self.stale.store(true, Ordering::Relaxed);
    }
}

/// Whether a request failed in check_node.lua because a key's slot is not on the node
/// it was sent to (moved, or moving): Redis's words for a script touching such a key.
pub fn moved_away(error: &str) -> bool {
    error.contains("Script attempted to access a non local key")
        || error.contains("Script attempted to access keys that do not hash to the same slot")
}

/// Each slot's master, named by its lowest slot, from `CLUSTER SLOTS`' reply: per range
/// `[start, end, [master's host, port, ...], replicas...]`. Slots no range covers are
/// their own (a call there fails, and goes slot by slot).
fn parse_cluster_slots(reply: &Value) -> Result<Box<[u16]>, String> {
    let Value::Array(ranges) = reply else {
        return Err(format!("CLUSTER SLOTS answered {reply:?}"));
    };
    let mut ranges: Vec<(u16, u16, String)> = ranges
        .iter()
        .map(|range| {
            let malformed = || format!("CLUSTER SLOTS: unreadable range {range:?}");
            let Value::Array(fields) = range else {
                return Err(malformed());
            };
            let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                return Err(malformed());
            };
            let address = match (master.first(), master.get(1)) {
                (Some(Value::BulkString(host)), Some(Value::Int(port))) => {
                    format!("{}:{port}", String::from_utf8_lossy(host))
                }
                _ => return Err(malformed()),
            };
            let slot = |n: i64| u16::try_from(n).ok().filter(|&s| (s as usize) < SLOTS);
            match (slot(*start), slot(*end)) {
                (Some(start), Some(end)) if start <= end => Ok((start, end, address)),
                _ => Err(malformed()),
            }
        })
        .collect::<Result<_, _>>()?;
    ranges.sort_by_key(|&(start, _, _)| start);
    let mut master_of: Box<[u16]> = (0..SLOTS as u16).collect();
    let mut lowest: Vec<(&str, u16)> = Vec::new();
    for (start, end, address) in &ranges {
        let name = match lowest.iter().find(|(known, _)| known == address) {
            Some(&(_, name)) => name,
            None => {
                lowest.push((address, *start));
                *start
            }
        };
        master_of[*start as usize..=*end as usize].fill(name);
    }
    Ok(master_of)
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::cluster_routing::{Route, Slot, SlotAddr};

    fn range(start: i64, end: i64, port: i64) -> Value {
        let node = |port: i64| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            node(port),
            node(port + 1),
        ])
    }

    #[test]
    fn slots_are_the_client_librarys() {
        for key in [
            "",
            "foo",
            "bar",
            "{user}:a",
            "a{user}b",
            "{}x",
            "a{}b{c}",
            "{a",
            "rl:x:{9f3a}",
        ] {
            assert_eq!(
                Route::new(slot_of(key), SlotAddr::Master),
                Route::with_slot(Slot::for_key(key), SlotAddr::Master),
                "{key}"
            );
        }
    }

    #[test]
    fn each_master_is_named_by_its_lowest_slot_over_all_its_ranges() {
        let reply = Value::Array(vec![
            range(10000, 16383, 7002),
            range(0, 4999, 7000),
            range(5001, 9999, 7001),
            range(5000, 5000, 7000),
        ]);
        let master_of = parse_cluster_slots(&reply).unwrap();
        assert_eq!(
            (
                master_of[0],
                master_of[4999],
                master_of[5000],
                master_of[5001],
                master_of[16383]
            ),
            (0, 0, 0, 5001, 10000)
        );
        let map = NodeMap::default();
        assert!(
            map.claim_reading() && !map.claim_reading(),
            "one reader at a time"
        );
        map.read(Ok(reply));
        let keys = |slots: &[u16]| -> Vec<String> {
            slots
                .iter()
                .map(|&slot| {
                    (0..)
                        .map(|i| format!("k{i}"))
                        .find(|k| slot_of(k) == slot)
                        .unwrap()
                })
                .collect()
        };
        assert_eq!(map.master_of(&keys(&[1, 4000, 5000])), Some(0));
        assert_eq!(map.master_of(&keys(&[1, 6000])), None);
        assert!(!map.claim_reading(), "just read");
        map.mark_stale();
        assert!(!map.claim_reading(), "stale, but read less than STALE_AFTER ago");
        std::thread::sleep(STALE_AFTER);
        assert!(map.claim_reading(), "stale");
    }

    #[test]
    fn a_reading_that_found_no_map_is_tried_again_once_per_interval() {
        let map = NodeMap::default();
        assert!(map.claim_reading());
        map.read(Err("connection refused".into()));
        assert!(
            !map.claim_reading(),
            "not before RETRY_AFTER, however many requests"
        );
        map.mark_stale();
        assert!(!map.claim_reading(), "nor when a request marks it stale");
        assert_eq!(map.master_of(&["k".to_string()]), None);
    }

    #[test]
    fn an_unreadable_reply_keeps_the_old_map_and_slots_nobody_holds_are_their_own() {
        let map = NodeMap::default();
        assert!(map.claim_reading());
        map.read(Ok(Value::Array(vec![range(0, 99, 7000)])));
        map.read(Ok(Value::Array(vec![Value::Int(3)])));
        let key = (0..).map(|i| format!("k{i}")).find(|k| slot_of(k) < 100).unwrap();
        assert_eq!(map.master_of(&[key]), Some(0), "the old map");
        let far = (0..)
            .map(|i| format!("k{i}"))
            .find(|k| slot_of(k) >= 100)
            .unwrap();
        assert_eq!(map.master_of(std::slice::from_ref(&far)), Some(slot_of(&far)));
        assert!(moved_away(
            "ERR Script attempted to access a non local key in a cluster node script: foo"
        ));
        assert!(!moved_away(
            "WRONGTYPE Operation against a key holding the wrong kind of value"
        ));
    }
}
