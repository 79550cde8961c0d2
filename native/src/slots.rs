//! The local layer's slot table for the whole Envoy process, standing in for proxy-wasm
//! shared data: one entry per slot (its bytes and a version for compare-and-swap),
//! behind one mutex, held only for one load or one store. Envoy's workers are threads
//! of this process, so every worker sees the same local buckets, deny cache, leases and
//! in-flight counts, as every Wasm VM of an Envoy sees the same shared data. The table
//! holds at most `local_slots` entries of a fixed size, the bound the Wasm filter has.

use ratelimit_wasm::local::{SlotError, SlotStore};
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Slot number to (bytes, version).
type Table = HashMap<u32, (Vec<u8>, u32)>;

fn table() -> MutexGuard<'static, Table> {
    static TABLE: OnceLock<Mutex<Table>> = OnceLock::new();
    let table = TABLE.get_or_init(|| Mutex::new(HashMap::new()));
    // A panic while holding the lock cannot leave a half-written entry (each store
    // replaces a whole one): the table stays usable.
    table.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The process-wide slot table.
pub struct ProcessSlots;

impl SlotStore for ProcessSlots {
    fn load(&self, slot: u32) -> Option<(Vec<u8>, u32)> {
        table().get(&slot).cloned()
    }

    fn store(&self, slot: u32, bytes: &[u8], cas: Option<u32>) -> Result<bool, SlotError> {
        let mut table = table();
        let current = table.get(&slot).map(|(_, version)| *version);
        if let Some(expected) = cas {
            if current.unwrap_or(0) != expected {
                return Ok(false);
            }
        }
        let version = current.unwrap_or(0).wrapping_add(1).max(1);
        table.insert(slot, (bytes.to_vec(), version));
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_with_a_stale_version_is_refused() {
        let slots = ProcessSlots;
        assert_eq!(slots.store(900_001, b"a", None), Ok(true));
        let (_, version) = slots.load(900_001).unwrap();
        assert_eq!(slots.store(900_001, b"b", Some(version)), Ok(true));
        assert_eq!(slots.store(900_001, b"c", Some(version)), Ok(false));
        assert_eq!(slots.load(900_001).unwrap().0, b"b".to_vec());
    }

    #[test]
    fn concurrent_compare_and_swap_loses_no_increment() {
        ProcessSlots.store(900_002, &[0], None).unwrap();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    for _ in 0..500 {
                        loop {
                            let (bytes, version) = ProcessSlots.load(900_002).unwrap();
                            let next = [bytes[0].wrapping_add(1)];
                            if ProcessSlots.store(900_002, &next, Some(version)) == Ok(true) {
                                break;
                            }
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        // 2,000 increments of one byte.
        assert_eq!(ProcessSlots.load(900_002).unwrap().0, vec![(2000 % 256) as u8]);
    }
}
