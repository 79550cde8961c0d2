//! The few Redis data types and commands the algorithms use, in memory: numbers (GET,
//! SET with PX), hashes of numbers (HMGET, HSET), sorted sets (ZADD NX, ZCOUNT, ZRANGE,
//! ZRANGEBYSCORE with LIMIT, ZREM, ZREMRANGEBYSCORE), DEL and expiries (PEXPIRE,
//! PEXPIREAT), each with Redis's semantics where the algorithms can tell: a key of the
//! wrong type fails the command with Redis's WRONGTYPE, an emptied hash or set is gone, a
//! key is gone once its expiry (ms) is past, SET drops an expiry, HSET and ZADD keep it.
//!
//! Every value the scripts store is a whole number below 2^53 (`scripts/common.lua`), so
//! an `f64` holds what Redis holds as text exactly.

use std::collections::HashMap;

/// Redis's answer to a command on a key of another type.
pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

/// A failed command: Redis's error message.
pub type CommandError = String;

/// One key's value.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Number(f64),
    Hash(HashMap<&'static str, f64>),
    /// Members in Redis's order: by score, then by member.
    Sorted(Vec<(f64, String)>),
}

#[derive(Debug)]
struct Entry {
    value: Value,
    /// When the key expires, ms since the Unix epoch.
    expires_at_ms: Option<f64>,
}

/// Every key, as one Redis database holds them. Commands take the instant of the call
/// they belong to (a script sees one time throughout, as in Redis).
#[derive(Debug, Default)]
pub struct Keyspace {
    entries: HashMap<String, Entry>,
}

impl Keyspace {
    /// The live entry of `key` at `now_ms`; an expired one is removed.
    fn live(&mut self, key: &str, now_ms: f64) -> Option<&mut Entry> {
        let expired = self
            .entries
            .get(key)
            .is_some_and(|entry| entry.expires_at_ms.is_some_and(|at| now_ms > at));
        if expired {
            self.entries.remove(key);
        }
        self.entries.get_mut(key)
    }

    /// GET, read as a number.
    pub fn get(&mut self, key: &str, now_ms: f64) -> Result<Option<f64>, CommandError> {
        match self.live(key, now_ms).map(|entry| &entry.value) {
            None => Ok(None),
            Some(Value::Number(number)) => Ok(Some(*number)),
            Some(_) => Err(WRONGTYPE.into()),
        }
    }

    /// SET key value PX ttl_ms: replaces whatever the key held, and its expiry.
    pub fn set_px(&mut self, key: &str, value: f64, ttl_ms: f64, now_ms: f64) {
        let entry = Entry {
            value: Value::Number(value),
            expires_at_ms: Some(now_ms + ttl_ms),
        };
        self.entries.insert(key.to_string(), entry);
    }

    /// DEL: whether the key was there.
    pub fn del(&mut self, key: &str, now_ms: f64) -> bool {
        self.live(key, now_ms).is_some() && self.entries.remove(key).is_some()
    }

    /// HMGET, read as numbers.
    pub fn hmget<const N: usize>(
        &mut self,
        key: &str,
        fields: [&str; N],
        now_ms: f64,
    ) -> Result<[Option<f64>; N], CommandError> {
        match self.live(key, now_ms).map(|entry| &entry.value) {
            None => Ok([None; N]),
            Some(Value::Hash(hash)) => Ok(fields.map(|field| hash.get(field).copied())),
            Some(_) => Err(WRONGTYPE.into()),
        }
    }

    /// HSET with every pair given.
    pub fn hset(
        &mut self,
        key: &str,
        pairs: &[(&'static str, f64)],
        now_ms: f64,
    ) -> Result<(), CommandError> {
        if self.live(key, now_ms).is_none() {
            let entry = Entry {
                value: Value::Hash(HashMap::new()),
                expires_at_ms: None,
            };
            self.entries.insert(key.to_string(), entry);
        }
        match self.entries.get_mut(key).map(|entry| &mut entry.value) {
            Some(Value::Hash(hash)) => {
                hash.extend(pairs.iter().copied());
                Ok(())
            }
            _ => Err(WRONGTYPE.into()),
        }
    }

    /// PEXPIREAT: an instant not after now deletes the key.
    pub fn pexpireat(&mut self, key: &str, at_ms: f64, now_ms: f64) {
        if at_ms <= now_ms {
            self.entries.remove(key);
        } else if let Some(entry) = self.live(key, now_ms) {
            entry.expires_at_ms = Some(at_ms);
        }
    }

    /// PEXPIRE.
    pub fn pexpire(&mut self, key: &str, ttl_ms: f64, now_ms: f64) {
        self.pexpireat(key, now_ms + ttl_ms, now_ms);
    }

    /// The sorted set of `key` (empty when absent), or WRONGTYPE.
    fn sorted(&mut self, key: &str, now_ms: f64) -> Result<&[(f64, String)], CommandError> {
        match self.live(key, now_ms).map(|entry| &entry.value) {
            None => Ok(&[]),
            Some(Value::Sorted(members)) => Ok(members),
            Some(_) => Err(WRONGTYPE.into()),
        }
    }

    /// Applies `change` to the sorted set of `key`, created empty when absent; an emptied
    /// set is removed, as Redis removes it.
    fn change_sorted<T>(
        &mut self,
        key: &str,
        now_ms: f64,
        change: impl FnOnce(&mut Vec<(f64, String)>) -> T,
    ) -> Result<T, CommandError> {
        if self.live(key, now_ms).is_none() {
            let entry = Entry {
                value: Value::Sorted(Vec::new()),
                expires_at_ms: None,
            };
            self.entries.insert(key.to_string(), entry);
        }
        let Some(Value::Sorted(members)) = self.entries.get_mut(key).map(|entry| &mut entry.value) else {
            return Err(WRONGTYPE.into());
        };
        let answer = change(members);
        if members.is_empty() {
            self.entries.remove(key);
        }
        Ok(answer)
    }

    /// ZCOUNT key (floor +inf: members scored strictly above `floor`.
    pub fn zcount_above(&mut self, key: &str, floor: f64, now_ms: f64) -> Result<usize, CommandError> {
        Ok(self
            .sorted(key, now_ms)?
            .iter()
            .filter(|(score, _)| *score > floor)
            .count())
    }

    /// ZREMRANGEBYSCORE key -inf at_most: removes members scored at most `at_most`.
    pub fn zremrange_up_to(&mut self, key: &str, at_most: f64, now_ms: f64) -> Result<(), CommandError> {
        self.change_sorted(key, now_ms, |members| {
            members.retain(|(score, _)| *score > at_most)
        })
    }

    /// ZADD key NX score member: whether it was added (not already a member).
    pub fn zadd_nx(
        &mut self,
        key: &str,
        score: f64,
        member: &str,
        now_ms: f64,
    ) -> Result<bool, CommandError> {
        self.change_sorted(key, now_ms, |members| {
            if members.iter().any(|(_, m)| m == member) {
                return false;
            }
            let at = members.partition_point(|(s, m)| (*s, m.as_str()) < (score, member));
            members.insert(at, (score, member.to_string()));
            true
        })
    }

    /// ZRANGE key -1 -1 WITHSCORES: the score of the last member.
    pub fn zlast_score(&mut self, key: &str, now_ms: f64) -> Result<Option<f64>, CommandError> {
        Ok(self.sorted(key, now_ms)?.last().map(|(score, _)| *score))
    }

    /// ZRANGEBYSCORE key (floor +inf WITHSCORES LIMIT offset 1: the score of the member at
    /// `offset` among those scored above `floor` (none for a negative offset).
    pub fn zscore_above_at(
        &mut self,
        key: &str,
        floor: f64,
        offset: i64,
        now_ms: f64,
    ) -> Result<Option<f64>, CommandError> {
        let Ok(offset) = usize::try_from(offset) else {
            return Ok(None);
        };
        Ok(self
            .sorted(key, now_ms)?
            .iter()
            .filter(|(score, _)| *score > floor)
            .nth(offset)
            .map(|(score, _)| *score))
    }

    /// ZRANGEBYSCORE key score score LIMIT 0 count, then ZREM of each member found.
    pub fn zrem_scored(
        &mut self,
        key: &str,
        score: f64,
        count: usize,
        now_ms: f64,
    ) -> Result<(), CommandError> {
        self.change_sorted(key, now_ms, |members| {
            let mut left = count;
            members.retain(|(s, _)| {
                let remove = *s == score && left > 0;
                left -= usize::from(remove);
                !remove
            });
        })
    }

    /// ZREM key member.
    pub fn zrem(&mut self, key: &str, member: &str, now_ms: f64) -> Result<(), CommandError> {
        self.change_sorted(key, now_ms, |members| members.retain(|(_, m)| m != member))
    }

    /// Live keys matching `pattern` (Redis's glob: `*`, `?`, `\` escaping), at most
    /// `limit`.
    pub fn scan(&mut self, pattern: &str, limit: usize, now_ms: f64) -> Vec<String> {
        self.entries
            .retain(|_, entry| entry.expires_at_ms.is_none_or(|at| now_ms <= at));
        let pattern: Vec<char> = pattern.chars().collect();
        let mut found: Vec<String> = self
            .entries
            .keys()
            .filter(|key| glob_matches(&pattern, &key.chars().collect::<Vec<_>>()))
            .cloned()
            .collect();
        found.sort();
        found.truncate(limit);
        found
    }

    /// Drops every expired key, so that keys no client uses any more cost no memory.
    pub fn sweep(&mut self, now_ms: f64) {
        self.entries
            .retain(|_, entry| entry.expires_at_ms.is_none_or(|at| now_ms <= at));
    }

    /// The number of keys held, expired or not.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

/// Whether `text` matches the glob `pattern` (`*` any run, `?` one character, `\` the
/// next character literally); character classes are not used by the shim.
fn glob_matches(pattern: &[char], text: &[char]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some(('*', rest)) => (0..=text.len()).any(|skip| glob_matches(rest, &text[skip..])),
        Some(('?', rest)) => !text.is_empty() && glob_matches(rest, &text[1..]),
        Some(('\\', rest)) if !rest.is_empty() => {
            text.first() == rest.first() && glob_matches(&rest[1..], &text[1..])
        }
        Some((c, rest)) => text.first() == Some(c) && glob_matches(rest, &text[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_scan_reads_them() {
        let matches =
            |p: &str, t: &str| glob_matches(&p.chars().collect::<Vec<_>>(), &t.chars().collect::<Vec<_>>());
        assert!(matches("rl:rule/*:{ab}", "rl:rule/tb60000:{ab}"));
        assert!(!matches("rl:rule/*:{ab}", "rl:rule/tb60000:{ac}"));
        assert!(matches("t\\[1\\]\\*:q/*", "t[1]*:q/x"));
        assert!(!matches("t\\[1\\]\\*:q/*", "t1:q/x"));
        assert!(matches("a?c", "abc") && !matches("a?c", "ac"));
    }

    #[test]
    fn a_key_is_gone_after_its_expiry_and_its_type_is_kept_until_then() {
        let mut keys = Keyspace::default();
        keys.set_px("k", 5.0, 10.0, 1000.0);
        assert_eq!(keys.get("k", 1010.0), Ok(Some(5.0)), "alive at its expiry");
        assert_eq!(keys.hmget("k", ["w"], 1005.0), Err(WRONGTYPE.to_string()));
        assert_eq!(keys.get("k", 1011.0), Ok(None));
        assert_eq!(keys.len(), 0);
    }

    #[test]
    fn a_sorted_set_keeps_redis_order_and_disappears_when_emptied() {
        let mut keys = Keyspace::default();
        assert_eq!(keys.zadd_nx("z", 2.0, "b", 0.0), Ok(true));
        assert_eq!(keys.zadd_nx("z", 1.0, "c", 0.0), Ok(true));
        assert_eq!(keys.zadd_nx("z", 2.0, "a", 0.0), Ok(true));
        assert_eq!(keys.zadd_nx("z", 9.0, "a", 0.0), Ok(false));
        assert_eq!(keys.zscore_above_at("z", 1.0, 1, 0.0), Ok(Some(2.0)));
        assert_eq!(keys.zscore_above_at("z", 1.0, -1, 0.0), Ok(None));
        assert_eq!(keys.zcount_above("z", 1.0, 0.0), Ok(2));
        keys.zrem_scored("z", 2.0, 1, 0.0).unwrap();
        assert_eq!(keys.zcount_above("z", 1.0, 0.0), Ok(1));
        keys.zremrange_up_to("z", 2.0, 0.0).unwrap();
        assert_eq!(keys.len(), 0);
    }
}
