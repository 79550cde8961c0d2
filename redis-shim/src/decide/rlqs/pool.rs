//! The Envoys sharing one rule's counter over RLQS, without I/O: who reports it, what each
//! demands, each one's [`Share`], and who must be sent a new one after a report.
//!
//! - **A member counts until its assignment has expired on its Envoy**: every assignment
//!   sent lasts [`ASSIGNMENT_TTL_MS`] there, so a member that stops reporting (its stream
//!   ended) keeps its share until then and [`RELEASE_MARGIN_MS`] more; only then do the
//!   others get it. Stricter, never looser.
//! - **A joining Envoy re-balances everyone at once**: its first report gets its share,
//!   and every other member a lowered one, pushed to it now (not at its next report).
//!   Its demand is unknown until a report covers a whole interval, and counts as the
//!   others' mean until then: an equal share.
//! - **Demand re-balances the shares**, the rate split in proportion to what each member
//!   was asked (allowed and denied, a second, over its last report), plus a floor of a
//!   quarter of the mean so an idle member can still start. Shares are replaced only when
//!   one moves by more than an eighth ([`super::share::worth_replacing`]).

use super::share::{worth_replacing, Rule, Share};
use std::collections::BTreeMap;

/// How often Envoy reports: Envoy 1.40 reports every bucket every 5 s, whatever the
/// bucket's `reporting_interval` says.
pub const ENVOY_REPORT_INTERVAL_MS: u64 = 5_000;
/// How long an assignment lasts on the Envoy without a newer one: two reports and a bit,
/// so that one late report, or a stream re-opened at the next one, does not expire it.
pub const ASSIGNMENT_TTL_MS: u64 = 12_000;
/// How long after an assignment's time to live (from when it was sent) its Envoy can no
/// longer spend it: the way there and Envoy's timers.
pub const RELEASE_MARGIN_MS: u64 = 1_000;

#[derive(Debug, Clone)]
struct Member {
    /// Requests a second asked of the bucket over the member's last report; None until a
    /// report covers a whole interval.
    demand: Option<f64>,
    share: Option<Share>,
    /// Server time (ms) until which the Envoy may spend the last assignment it was sent.
    spends_until_ms: u64,
}

/// The members of one counter, by stream.
#[derive(Debug, Clone)]
pub struct Pool {
    rule: Rule,
    members: BTreeMap<u64, Member>,
}

impl Pool {
    pub fn new(rule: Rule) -> Pool {
        Pool {
            rule,
            members: BTreeMap::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn has(&self, stream: u64) -> bool {
        self.members.contains_key(&stream)
    }

    /// A report of `stream`'s Envoy at `now_ms`, with its demand when known, under `rule`
    /// (the config's now). Returns the reporter's share, and the other members' new ones
    /// when the pool was re-balanced (none when the shares hold). Each member given a
    /// share counts as sent it (its assignment lasts from now).
    pub fn report(
        &mut self,
        stream: u64,
        demand: Option<f64>,
        rule: Rule,
        now_ms: u64,
    ) -> (Share, Vec<(u64, Share)>) {
        let mut changed = self.expire(now_ms) > 0 || rule != self.rule;
        self.rule = rule;
        let member = self.members.entry(stream).or_insert_with(|| {
            changed = true;
            Member {
                demand: None,
                share: None,
                spends_until_ms: 0,
            }
        });
        if demand.is_some() {
            member.demand = demand;
        }
        let targets = self.rule.split(&self.weights());
        changed = changed
            || self
                .members
                .values()
                .zip(&targets)
                .any(|(m, target)| m.share.is_none_or(|current| worth_replacing(&current, target)));
        let until = now_ms + ASSIGNMENT_TTL_MS;
        let mut own = None;
        let mut others = Vec::new();
        for ((id, m), target) in self.members.iter_mut().zip(targets) {
            if changed {
                m.share = Some(target);
            }
            if *id == stream {
                own = Some(m.share.unwrap_or(target));
                m.spends_until_ms = until;
            } else if changed {
                others.push((*id, target));
                m.spends_until_ms = until;
            }
        }
        // The reporter is a member (inserted above), so `own` is always set.
        (own.unwrap_or_else(|| self.rule.share(1)), others)
    }

    /// `stream`'s Envoy forgot the bucket (abandoned): its share goes to the others at
    /// once. Returns their new assignments.
    pub fn leave(&mut self, stream: u64, now_ms: u64) -> Vec<(u64, Share)> {
        if self.members.remove(&stream).is_none() {
            return Vec::new();
        }
        self.expire(now_ms);
        self.rebalance(now_ms)
    }

    /// Drops members whose last assignment can no longer be spent; when any went, the
    /// others' new assignments.
    pub fn prune(&mut self, now_ms: u64) -> Vec<(u64, Share)> {
        match self.expire(now_ms) {
            0 => Vec::new(),
            _ => self.rebalance(now_ms),
        }
    }

    fn rebalance(&mut self, now_ms: u64) -> Vec<(u64, Share)> {
        let targets = self.rule.split(&self.weights());
        let mut send = Vec::new();
        for ((id, m), target) in self.members.iter_mut().zip(targets) {
            m.share = Some(target);
            m.spends_until_ms = now_ms + ASSIGNMENT_TTL_MS;
            send.push((*id, target));
        }
        send
    }

    fn expire(&mut self, now_ms: u64) -> usize {
        let before = self.members.len();
        self.members
            .retain(|_, m| m.share.is_none() || m.spends_until_ms + RELEASE_MARGIN_MS > now_ms);
        before - self.members.len()
    }

    /// Each member's weight, in stream order.
    fn weights(&self) -> Vec<f64> {
        let known: Vec<f64> = self.members.values().filter_map(|m| m.demand).collect();
        let mean = match known.is_empty() {
            true => 1.0,
            false => known.iter().sum::<f64>() / known.len() as f64,
        };
        let demands: Vec<f64> = self.members.values().map(|m| m.demand.unwrap_or(mean)).collect();
        let floor = demands.iter().sum::<f64>() / demands.len().max(1) as f64 / 4.0;
        match floor > 0.0 {
            true => demands.iter().map(|d| d + floor).collect(),
            false => vec![1.0; demands.len()],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: Rule = Rule {
        limit: 5,
        period_s: 1,
    };

    fn tokens(send: &[(u64, Share)]) -> Vec<(u64, u32)> {
        send.iter().map(|(id, s)| (*id, s.tokens_per_fill)).collect()
    }

    /// A report's shares as (stream, tokens), the reporter's first.
    fn report(pool: &mut Pool, stream: u64, demand: Option<f64>, rule: Rule, at: u64) -> Vec<(u64, u32)> {
        let (own, others) = pool.report(stream, demand, rule, at);
        let mut all = vec![(stream, own)];
        all.extend(others);
        tokens(&all)
    }

    #[test]
    fn the_first_report_gets_the_whole_rate_and_a_second_envoy_halves_it_at_once() {
        let mut pool = Pool::new(RULE);
        assert_eq!(report(&mut pool, 7, None, RULE, 0), [(7, 60)]);
        // The second Envoy's first report: its share, and the first one's lowered, pushed.
        assert_eq!(report(&mut pool, 3, None, RULE, 1_000), [(3, 30), (7, 30)]);
        // Equal demand: the shares hold, and a report brings back only the reporter's.
        assert_eq!(report(&mut pool, 7, Some(10.0), RULE, 5_000), [(7, 30)]);
        assert_eq!(report(&mut pool, 3, Some(9.0), RULE, 6_000), [(3, 30)]);
        assert_eq!(pool.len(), 2);
    }

    #[test]
    fn demand_moves_the_shares() {
        let mut pool = Pool::new(RULE);
        report(&mut pool, 1, None, RULE, 0);
        report(&mut pool, 2, None, RULE, 0);
        report(&mut pool, 1, Some(12.0), RULE, 5_000);
        let split = report(&mut pool, 2, Some(0.0), RULE, 5_000);
        assert_eq!(split.len(), 2, "{split:?}");
        let (busy, idle) = (split[1].1, split[0].1);
        assert_eq!(busy + idle, 60);
        assert!(busy >= 45 && idle >= 1, "{split:?}");
    }

    #[test]
    fn a_silent_member_keeps_its_share_until_its_assignment_expires_then_the_others_get_it() {
        let mut pool = Pool::new(RULE);
        report(&mut pool, 1, None, RULE, 0);
        report(&mut pool, 2, None, RULE, 0);
        // Member 2 stops reporting; 1 reports on, and still gets half.
        for at in [5_000, 10_000] {
            assert_eq!(report(&mut pool, 1, Some(5.0), RULE, at), [(1, 30)]);
        }
        assert!(pool.prune(ASSIGNMENT_TTL_MS + RELEASE_MARGIN_MS - 1).is_empty());
        assert_eq!(
            tokens(&pool.prune(ASSIGNMENT_TTL_MS + RELEASE_MARGIN_MS)),
            [(1, 60)]
        );
        assert_eq!(tokens(&pool.leave(1, 20_000)), []);
        assert!(pool.is_empty());
    }

    #[test]
    fn an_abandoning_member_s_share_goes_at_once_and_a_new_rule_re_balances() {
        let mut pool = Pool::new(RULE);
        report(&mut pool, 1, None, RULE, 0);
        report(&mut pool, 2, None, RULE, 0);
        assert_eq!(tokens(&pool.leave(2, 1_000)), [(1, 60)]);
        let faster = Rule {
            limit: 10,
            period_s: 1,
        };
        let (own, _) = pool.report(1, Some(1.0), faster, 2_000);
        assert_eq!((own.tokens_per_fill, own.fill_interval_s), (60, 6));
    }
}
