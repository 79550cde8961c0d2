//! One Envoy's account of one limited bucket, without I/O: what was charged to Redis for
//! it, what it reported spending, and what to do after each report.
//!
//! A grant works like the filter's lease: tokens are charged to the counter first, then
//! handed to Envoy as a token bucket of that many tokens that does not refill. Envoy's
//! bucket can be read only through the reports, so the account keeps to what they prove:
//!
//! - **Every reported admission is paid for.** Reported admissions spend the grant first;
//!   what the grant does not cover (admitted before the first assignment, by the
//!   filter's `no_assignment_behavior`, or on a stream that never got a grant) is charged
//!   as debt. So the counter never holds fewer tokens than Envoy admitted.
//! - **A grant is replaced only once it is spent.** A new grant replaces the Envoy's
//!   bucket with a full new one ([`super::assignment::new_grant`]), and the old one's
//!   tokens are gone; a grant replaced while it still held tokens would strand them. While it holds tokens, each
//!   report extends it unchanged (Envoy then keeps its bucket). A report that shows it
//!   spent gets a new grant of twice the interval's demand (allowed and denied), at most
//!   `max_grant`; a bucket that spends its grant before its next report refuses until then.
//! - **Unspent tokens go back only when they cannot be spent.** When a stream ends, its
//!   grants are given back once their assignments have expired on the Envoy
//!   ([`RELEASE_MARGIN_MS`] after their time to live, counted from when they were sent).
//!   What the Envoy admitted after its stream ended is reported on its next stream and
//!   charged there as debt: stricter, never looser.
//! - **A grant does not outlive its window**: its time to live ends before the window it
//!   was charged to does (fixed window), and it is not extended past that.

/// How often Envoy reports: Envoy 1.40 reports every bucket every 5 s, whatever the
/// bucket's `reporting_interval` says.
pub const ENVOY_REPORT_INTERVAL_MS: u64 = 5_000;
/// How long an assignment lasts on the Envoy without a newer one, at most: two reports
/// and a bit, so that one late or lost report does not expire it.
pub const ASSIGNMENT_TTL_MS: u64 = 12_000;
/// How long after an assignment's time to live (from when it was sent) its Envoy can no
/// longer spend it: the way there and Envoy's timers.
pub const RELEASE_MARGIN_MS: u64 = 1_000;
/// A bucket that reports no demand this long is abandoned (Envoy forgets it).
pub const ABANDON_IDLE_MS: u64 = 60_000;

/// Tokens charged to Redis and handed to the Envoy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub tokens: u64,
    /// Reported admissions counted against it.
    pub used: u64,
    /// Where the tokens were charged (the check's `stamp`), to give them back.
    pub stamp: i64,
    /// Server time (ms) by which the tokens must be spent: the window's end.
    pub spend_by_ms: u64,
    /// Server time (ms) the assignment last sent expires, counted from its sending.
    pub expires_at_ms: u64,
}

impl Grant {
    pub fn left(&self) -> u64 {
        self.tokens.saturating_sub(self.used)
    }
}

/// What a report comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Reported admissions no grant covered, to charge now.
    pub debt: u64,
    pub next: Next,
}

/// The assignment to send after a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Send the current grant again with a fresh time to live of this many whole seconds.
    Extend { ttl_s: u64 },
    /// Ask Redis for a new grant of up to `size` tokens.
    Grant { size: u64 },
    /// The bucket has been idle long enough: tell Envoy to forget it.
    Abandon,
    /// Nothing: the window is about to end; the next report asks in the next one.
    Wait,
}

/// One bucket's account on one stream.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    pub grant: Option<Grant>,
    /// Server time (ms) of the last report with demand, or of the first report.
    last_demand_ms: u64,
}

impl Ledger {
    pub fn new(now_ms: u64) -> Ledger {
        Ledger {
            last_demand_ms: now_ms,
            ..Ledger::default()
        }
    }

    /// Counts a report of `allowed` and `denied` requests at `now_ms`.
    pub fn report(&mut self, allowed: u64, denied: u64, max_grant: u64, now_ms: u64) -> Outcome {
        let covered = self.grant.as_mut().map_or(0, |grant| {
            let covered = allowed.min(grant.left());
            grant.used += covered;
            covered
        });
        let debt = allowed - covered;
        let demand = allowed.saturating_add(denied);
        if demand > 0 {
            self.last_demand_ms = now_ms;
        } else if now_ms.saturating_sub(self.last_demand_ms) >= ABANDON_IDLE_MS {
            return Outcome {
                debt,
                next: Next::Abandon,
            };
        }
        let next = match &self.grant {
            Some(grant) if grant.left() > 0 && grant.spend_by_ms > now_ms => {
                match whole_seconds(grant.spend_by_ms, now_ms) {
                    0 => Next::Wait,
                    ttl_s => Next::Extend { ttl_s },
                }
            }
            _ => Next::Grant {
                size: demand.saturating_mul(2).clamp(1, max_grant),
            },
        };
        Outcome { debt, next }
    }

    /// Records a grant Redis made at `now_ms`: `tokens` charged where `stamp` says, to be
    /// spent within `window_ms` (0: no window). Returns the assignment's time to live in
    /// whole seconds; 0: too close to the window's end to hand out, and the tokens must go
    /// back at once (nothing is recorded).
    pub fn granted(&mut self, tokens: u64, stamp: i64, window_ms: u64, now_ms: u64) -> u64 {
        let spend_by_ms = match window_ms {
            0 => u64::MAX,
            window => now_ms.saturating_add(window),
        };
        let ttl_s = whole_seconds(spend_by_ms, now_ms);
        if ttl_s == 0 {
            return 0;
        }
        self.grant = Some(Grant {
            tokens,
            used: 0,
            stamp,
            spend_by_ms,
            expires_at_ms: now_ms + ttl_s * 1000,
        });
        ttl_s
    }

    /// Records that the current grant was sent again with `ttl_s` at `now_ms`.
    pub fn extended(&mut self, ttl_s: u64, now_ms: u64) {
        if let Some(grant) = &mut self.grant {
            grant.expires_at_ms = now_ms + ttl_s * 1000;
        }
    }

    /// What goes back to Redis once the stream has ended: the grant's unspent tokens and
    /// their stamp, and the server time from which the Envoy can no longer spend them.
    pub fn release(&self) -> Option<(u64, i64, u64)> {
        let grant = self.grant.as_ref()?;
        (grant.left() > 0).then(|| (grant.left(), grant.stamp, grant.expires_at_ms + RELEASE_MARGIN_MS))
    }
}

/// Whole seconds of [`ASSIGNMENT_TTL_MS`] before `until_ms` (Envoy reads only the
/// seconds of a time to live).
fn whole_seconds(until_ms: u64, now_ms: u64) -> u64 {
    until_ms.saturating_sub(now_ms).min(ASSIGNMENT_TTL_MS) / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: u64 = 10;

    #[test]
    fn the_first_report_asks_for_twice_its_demand_and_admissions_before_any_grant_are_debt() {
        let mut ledger = Ledger::new(0);
        let outcome = ledger.report(3, 1, MAX, 0);
        assert_eq!(
            outcome,
            Outcome {
                debt: 3,
                next: Next::Grant { size: 8 }
            }
        );
        assert_eq!(ledger.report(0, 50, MAX, 0).next, Next::Grant { size: MAX });
        assert_eq!(ledger.report(0, 0, MAX, 1).next, Next::Grant { size: 1 });
    }

    #[test]
    fn a_grant_with_tokens_left_is_extended_and_a_spent_one_replaced() {
        let mut ledger = Ledger::new(0);
        assert_eq!(ledger.granted(6, 42, 0, 0), 12);
        let outcome = ledger.report(4, 0, MAX, 1_000);
        assert_eq!(
            outcome,
            Outcome {
                debt: 0,
                next: Next::Extend { ttl_s: 12 }
            }
        );
        ledger.extended(12, 1_000);
        // Two left, three reported: the third was admitted by something else, and is debt.
        let outcome = ledger.report(3, 2, MAX, 2_000);
        assert_eq!(
            outcome,
            Outcome {
                debt: 1,
                next: Next::Grant { size: MAX }
            }
        );
        assert_eq!(ledger.grant.as_ref().unwrap().left(), 0);
        ledger.granted(6, 43, 0, 2_000);
        let grant = ledger.grant.as_ref().unwrap();
        assert_eq!((grant.tokens, grant.used), (6, 0));
    }

    #[test]
    fn a_grant_never_outlives_its_window() {
        let mut ledger = Ledger::new(0);
        // 3.5 s left in the window: a time to live of 3 s.
        assert_eq!(ledger.granted(5, 1, 3_500, 0), 3);
        assert_eq!(ledger.report(1, 0, MAX, 2_000).next, Next::Extend { ttl_s: 1 });
        assert_eq!(ledger.report(1, 0, MAX, 2_600).next, Next::Wait);
        // The window over, what was left of it is no use: a grant in the next one.
        assert_eq!(ledger.report(0, 1, MAX, 3_500).next, Next::Grant { size: 2 });
        // Under a second left at the grant: nothing can be handed out.
        let mut late = Ledger::new(0);
        assert_eq!(late.granted(5, 1, 900, 0), 0);
        assert_eq!(late.grant, None);
    }

    #[test]
    fn unspent_tokens_go_back_after_the_assignment_has_expired_on_the_envoy() {
        let mut ledger = Ledger::new(0);
        assert_eq!(ledger.release(), None);
        ledger.granted(8, 7, 0, 10_000);
        ledger.report(3, 0, MAX, 11_000);
        ledger.extended(5, 11_000);
        assert_eq!(ledger.release(), Some((5, 7, 16_000 + RELEASE_MARGIN_MS)));
        ledger.report(5, 0, MAX, 12_000);
        assert_eq!(ledger.release(), None);
    }

    #[test]
    fn an_idle_bucket_is_abandoned() {
        let mut ledger = Ledger::new(0);
        ledger.report(1, 0, MAX, 1_000);
        assert_ne!(
            ledger.report(0, 0, MAX, 1_000 + ABANDON_IDLE_MS - 1).next,
            Next::Abandon
        );
        assert_eq!(
            ledger.report(0, 0, MAX, 1_000 + ABANDON_IDLE_MS).next,
            Next::Abandon
        );
    }
}
