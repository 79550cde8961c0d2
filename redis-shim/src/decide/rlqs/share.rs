//! One Envoy's share of a rule's rate, as the token bucket Envoy's `rate_limit_quota`
//! filter applies itself, and how a rule's rate splits among the Envoys reporting it.
//!
//! Envoy 1.40 reads a token bucket as `tokens_per_fill / fill_interval` tokens a second,
//! refilled continuously up to `max_tokens`, with the interval in whole seconds (under a
//! second it divides by zero). It keeps its bucket when an assignment repeats
//! `max_tokens`, `tokens_per_fill` and the interval's nanos, whatever the interval's
//! seconds say. So a rule's interval is fixed (a whole multiple of its period, long enough
//! that its tokens split finely) and a re-balance changes `tokens_per_fill` and
//! `max_tokens` only; the interval's nanos repeat its seconds, so that a rule whose
//! interval changed (a config reload) is never taken for the old one.

/// A rule's rate: `limit` requests per `period_s` seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub limit: u64,
    pub period_s: u64,
}

/// At least this many tokens per fill interval for the whole rule, so that shares of it
/// among Envoys round finely (a rule of 5 a second: 60 tokens every 12 s).
pub const RESOLUTION: u64 = 60;

/// One Envoy's token bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    pub tokens_per_fill: u32,
    pub max_tokens: u32,
    pub fill_interval_s: u64,
}

impl Share {
    /// Tokens a second this share refills.
    pub fn rate(&self) -> f64 {
        f64::from(self.tokens_per_fill) / self.fill_interval_s as f64
    }

    /// The nanos of the interval Envoy is sent: its seconds again (under a second, so
    /// Envoy's whole seconds are unchanged), so that another interval is another bucket.
    pub fn interval_nanos(&self) -> i32 {
        (self.fill_interval_s % 1_000_000_000) as i32
    }
}

impl Rule {
    /// How many periods a fill interval spans: enough for [`RESOLUTION`] tokens.
    fn periods_per_fill(&self) -> u64 {
        RESOLUTION.div_ceil(self.limit.max(1))
    }

    pub fn fill_interval_s(&self) -> u64 {
        self.period_s.max(1) * self.periods_per_fill()
    }

    /// The rule's tokens per fill interval, all Envoys together.
    pub fn tokens_per_fill(&self) -> u64 {
        self.limit * self.periods_per_fill()
    }

    /// The token bucket for `tokens_per_fill` of this rule's fill interval. Its capacity
    /// is a second of its rate, or a quarter of what it refills in a period, whichever
    /// is more: bursts a period's pace allows, and never more than a quarter of the
    /// share parked in a full bucket beyond that.
    pub fn share(&self, tokens_per_fill: u64) -> Share {
        let interval = self.fill_interval_s();
        let per_second = tokens_per_fill.div_ceil(interval);
        let quarter_period = tokens_per_fill / self.periods_per_fill() / 4;
        let max_tokens = per_second.max(quarter_period).max(1);
        Share {
            tokens_per_fill: clamp_u32(tokens_per_fill.max(1)),
            max_tokens: clamp_u32(max_tokens),
            fill_interval_s: interval,
        }
    }

    /// The rule's tokens per fill interval split by `weights` (one per Envoy, in the
    /// caller's order): each Envoy gets at least one token, and the rest in proportion,
    /// rounded so that the shares add up to the rule's exactly (more only when there are
    /// more Envoys than tokens).
    pub fn split(&self, weights: &[f64]) -> Vec<Share> {
        let total = self.tokens_per_fill();
        let count = weights.len() as u64;
        let rest = total.saturating_sub(count);
        let weights: Vec<f64> = weights.iter().map(|w| w.max(0.0)).collect();
        let sum: f64 = weights.iter().sum();
        let exact: Vec<f64> = weights
            .iter()
            .map(|w| match sum > 0.0 {
                true => rest as f64 * w / sum,
                false => rest as f64 / count.max(1) as f64,
            })
            .collect();
        let mut tokens: Vec<u64> = exact.iter().map(|e| e.floor() as u64).collect();
        let mut left = rest.saturating_sub(tokens.iter().sum());
        // Largest remainders first; ties to the earlier Envoy, so the split is stable.
        let mut order: Vec<usize> = (0..exact.len()).collect();
        order.sort_by(|&a, &b| {
            let (fa, fb) = (exact[a] - exact[a].floor(), exact[b] - exact[b].floor());
            fb.total_cmp(&fa).then(a.cmp(&b))
        });
        for &i in order.iter().cycle().take(exact.len() * 2) {
            if left == 0 {
                break;
            }
            tokens[i] += 1;
            left -= 1;
        }
        tokens.into_iter().map(|t| self.share(t + 1)).collect()
    }
}

/// Whether `target` differs enough from `current` to replace it: by more than an eighth
/// of its tokens (one token at least). A replaced bucket starts as full as the old one
/// was, in proportion; re-balancing on every small change in demand would only churn.
pub fn worth_replacing(current: &Share, target: &Share) -> bool {
    let (now, then) = (current.tokens_per_fill, target.tokens_per_fill);
    current.fill_interval_s != target.fill_interval_s || now.abs_diff(then) > (now / 8).max(1)
}

fn clamp_u32(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIVE_A_SECOND: Rule = Rule {
        limit: 5,
        period_s: 1,
    };
    const HUNDRED_A_MINUTE: Rule = Rule {
        limit: 100,
        period_s: 60,
    };

    #[test]
    fn a_per_second_rule_is_served_in_whole_seconds_at_its_rate() {
        assert_eq!(FIVE_A_SECOND.fill_interval_s(), 12);
        let [alone] = FIVE_A_SECOND.split(&[1.0])[..] else {
            panic!()
        };
        assert_eq!((alone.tokens_per_fill, alone.max_tokens), (60, 5));
        assert_eq!(alone.rate(), 5.0);
        let halves = FIVE_A_SECOND.split(&[1.0, 1.0]);
        assert_eq!(halves.iter().map(Share::rate).sum::<f64>(), 5.0);
        assert_eq!((halves[0].tokens_per_fill, halves[0].max_tokens), (30, 3));
        assert_eq!(alone.interval_nanos(), 12);
    }

    #[test]
    fn a_per_minute_rule_keeps_its_period_and_bursts_a_quarter() {
        let halves = HUNDRED_A_MINUTE.split(&[1.0, 1.0]);
        assert_eq!(halves[0].fill_interval_s, 60);
        assert_eq!((halves[0].tokens_per_fill, halves[0].max_tokens), (50, 12));
        let day = Rule {
            limit: 40,
            period_s: 86_400,
        };
        assert_eq!(day.split(&[1.0])[0].max_tokens, 10);
    }

    #[test]
    fn shares_follow_demand_add_up_exactly_and_never_drop_to_zero() {
        let shares = FIVE_A_SECOND.split(&[3.0, 1.0, 0.0]);
        let tokens: Vec<u32> = shares.iter().map(|s| s.tokens_per_fill).collect();
        assert_eq!(tokens.iter().sum::<u32>(), 60);
        assert!(
            tokens[0] > tokens[1] && tokens[1] > tokens[2] && tokens[2] >= 1,
            "{tokens:?}"
        );
        let odd: Vec<u32> = Rule {
            limit: 61,
            period_s: 1,
        }
        .split(&[1.0, 1.0])
        .iter()
        .map(|s| s.tokens_per_fill)
        .collect();
        assert_eq!(odd, [31, 30]);
        // More Envoys than tokens: one each, and the rule is over by the difference.
        let one_an_hour = Rule {
            limit: 1,
            period_s: 3_600,
        };
        assert_eq!(one_an_hour.split(&vec![1.0; 70]).len(), 70);
        assert!(one_an_hour
            .split(&vec![0.0; 70])
            .iter()
            .all(|s| s.tokens_per_fill == 1));
    }

    #[test]
    fn small_changes_keep_the_bucket() {
        let share = |t| FIVE_A_SECOND.share(t);
        assert!(!worth_replacing(&share(30), &share(31)));
        assert!(!worth_replacing(&share(30), &share(27)));
        assert!(worth_replacing(&share(30), &share(26)));
        assert!(worth_replacing(&share(2), &share(4)));
        assert!(worth_replacing(&share(30), &HUNDRED_A_MINUTE.share(30)));
    }
}
