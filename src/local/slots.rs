//! The slot table in Envoy shared data: a fixed number of slots, created once at
//! start-up, each holding one (rule, key) counter's local state as a fixed-size record.
//!
//! A counter hashes to one slot; a slot holding another counter's state is taken over
//! (keeping its buckets, so colliding counters share them), so a flood of distinct keys
//! can neither grow memory nor refill anyone's bucket. Every write is a compare-and-swap
//! against the version read, retried on conflict, so two workers never spend one token
//! twice. (The host cannot guard the first insert of a key with CAS; creating every slot
//! at start-up, before traffic, is what makes every later write a CAS.)

use super::bucket::Bucket;
use super::in_flight::InFlight;

/// Encoded size of a slot.
pub const RECORD_LEN: usize = 17 * 8;
const MAX_ATTEMPTS: usize = 16;

/// Access to the slot table.
pub trait SlotStore {
    /// The slot's bytes and CAS version; `None` when the slot does not exist.
    fn load(&self, slot: u32) -> Option<(Vec<u8>, u32)>;
    /// Writes the slot if its version is still `cas` (unconditionally when `None`);
    /// `Ok(false)` on a version mismatch.
    fn store(&self, slot: u32, bytes: &[u8], cas: Option<u32>) -> Result<bool, SlotError>;
}

/// The table failed or stayed contended; callers treat it as "no local state".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotError {
    Host,
    Contended,
}

/// Everything this Envoy remembers about one (rule, key) counter.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SlotRecord {
    /// Which counter owns the slot; 0 is an empty slot.
    pub fingerprint: u64,
    pub bucket: Bucket,
    pub fallback: Bucket,
    /// Until when this Envoy refuses the counter without asking the shim: the refusal's
    /// retry time, at most [`DENY_RECHECK_MS`](super::DENY_RECHECK_MS) after it was learned.
    pub deny_until_ms: u64,
    pub deny_cost: u64,
    /// When the refused request may be retried, as the shim reported it.
    pub deny_retry_at_ms: u64,
    /// When the refused counter is full again, as the shim reported it.
    pub deny_reset_at_ms: u64,
    pub lease_tokens: u64,
    pub lease_expires_ms: u64,
    /// Where the shim charged the lease's tokens, to give back what is left.
    pub lease_stamp: i64,
    /// The worker whose lease acquisition for this counter is in flight, until
    /// `acquiring_until_ms`: one acquisition per counter per Envoy at a time.
    pub acquirer: u64,
    pub acquiring_until_ms: u64,
    /// A local concurrency limit's requests in flight.
    pub in_flight: InFlight,
}

impl SlotRecord {
    pub fn encode(&self) -> [u8; RECORD_LEN] {
        let words = [
            self.fingerprint,
            self.bucket.tokens.to_bits(),
            self.bucket.updated_ms,
            self.fallback.tokens.to_bits(),
            self.fallback.updated_ms,
            self.deny_until_ms,
            self.deny_cost,
            self.deny_retry_at_ms,
            self.deny_reset_at_ms,
            self.lease_tokens,
            self.lease_expires_ms,
            self.lease_stamp as u64,
            self.acquirer,
            self.acquiring_until_ms,
            self.in_flight.count,
            self.in_flight.generation,
            self.in_flight.taken_ms,
        ];
        let mut bytes = [0u8; RECORD_LEN];
        for (chunk, word) in bytes.chunks_exact_mut(8).zip(words) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        bytes
    }

    /// Decodes a slot; anything malformed reads as an empty slot.
    pub fn decode(bytes: &[u8]) -> SlotRecord {
        if bytes.len() != RECORD_LEN {
            return SlotRecord::default();
        }
        let mut words = [0u64; RECORD_LEN / 8];
        for (word, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
            let mut le = [0u8; 8];
            le.copy_from_slice(chunk);
            *word = u64::from_le_bytes(le);
        }
        let [fingerprint, tokens, updated_ms, fallback_tokens, fallback_updated_ms, deny_until_ms, deny_cost, deny_retry_at_ms, deny_reset_at_ms, lease_tokens, lease_expires_ms, lease_stamp, acquirer, acquiring_until_ms, in_flight_count, in_flight_generation, in_flight_taken_ms] =
            words;
        SlotRecord {
            fingerprint,
            bucket: Bucket {
                tokens: f64::from_bits(tokens),
                updated_ms,
            },
            fallback: Bucket {
                tokens: f64::from_bits(fallback_tokens),
                updated_ms: fallback_updated_ms,
            },
            deny_until_ms,
            deny_cost,
            deny_retry_at_ms,
            deny_reset_at_ms,
            lease_tokens,
            lease_expires_ms,
            lease_stamp: lease_stamp as i64,
            acquirer,
            acquiring_until_ms,
            in_flight: InFlight {
                count: in_flight_count,
                generation: in_flight_generation,
                taken_ms: in_flight_taken_ms,
            },
        }
    }
}

/// FNV-1a of the counter key, never 0 (0 marks an empty slot).
pub fn fingerprint(counter_key: &str) -> u64 {
    let hash = counter_key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    hash | 1
}

pub fn slot_of(fingerprint: u64, slots: u32) -> u32 {
    ((fingerprint >> 17) % u64::from(slots.max(1))) as u32
}

/// Creates every slot that does not exist yet. Run at start-up, before traffic.
pub fn create_slots(store: &impl SlotStore, slots: u32) -> Result<(), SlotError> {
    let empty = SlotRecord::default().encode();
    for slot in 0..slots {
        if store.load(slot).is_none() {
            store.store(slot, &empty, None)?;
        }
    }
    Ok(())
}

/// Reads the counter's record (fresh when the slot belongs to another counter), lets
/// `apply` change it, and writes it back with CAS, retrying on conflict. `apply` returns
/// its result and whether to write.
pub fn update<R>(
    store: &impl SlotStore,
    slots: u32,
    fingerprint: u64,
    mut apply: impl FnMut(&mut SlotRecord) -> (R, bool),
) -> Result<R, SlotError> {
    let slot = slot_of(fingerprint, slots);
    for _ in 0..MAX_ATTEMPTS {
        let (bytes, cas) = match store.load(slot) {
            Some((bytes, cas)) => (bytes, Some(cas)),
            None => (Vec::new(), None),
        };
        let mut record = SlotRecord::decode(&bytes);
        if record.fingerprint != fingerprint {
            // Another counter's slot. Its buckets are kept: counters sharing a slot share
            // their local buckets, so a flood of keys (or a key crafted to collide with a
            // victim's) fails towards refusing instead of starting from a full bucket.
            // Its deny entry and lease belong to its own global counter and are dropped.
            // Requests in flight are kept too: they are still in flight, and their
            // releases must find them.
            record = SlotRecord {
                fingerprint,
                bucket: record.bucket,
                fallback: record.fallback,
                in_flight: record.in_flight,
                ..SlotRecord::default()
            };
        }
        let (result, write) = apply(&mut record);
        if !write || store.store(slot, &record.encode(), cas)? {
            return Ok(result);
        }
    }
    Err(SlotError::Contended)
}
