//! Settling an admitted request at its real cost, known only from its response
//! (`cost_from_response`): the charges that wait for the response, the cost the response
//! reports (a header, a trailer, weighted numbers in a JSON or event-stream body read
//! by [`crate::response_body`], or weighted counts of the token usage Envoy publishes in
//! the stream's metadata) and the settlements sent to the shim when the stream ends.
//! Pure: the host layer hands in what it reads.
//!
//! The admission charged the rule's `cost`, the estimate. The settlement charges the
//! difference (the counter may go into debt) or gives it back. A response that reports
//! no usable value (the client went away first, the body was cut short or compressed,
//! the worker's budget for reading bodies was spent) is charged the rule's
//! `unreported_cost`, or what it did report if more, counted as `cost_unreported`.

use crate::config::{parse_cost, MAX_PATHS};
use crate::config::{CostField, CostFromResponse, CostSource, TokenUsageCost, UnreportedCost};
use crate::response_body::{body_format, BodyReader};
use crate::stats::{Count, Stat};
use crate::wire::{Settlement, MAX_LIMIT};
use std::cell::Cell;

/// One charge of an admitted request that its response settles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingSettlement {
    /// Index into `FilterConfig::rules`, which names the rule's stats.
    pub rule_index: usize,
    pub cost: CostFromResponse,
    /// The counter, the tokens charged and where; `actual` is filled in at the end.
    pub settlement: Settlement,
}

/// The bytes a worker may still lend to the readers of its response bodies: one budget
/// for all its responses, so that what clients make the upstream send never decides
/// the filter's memory.
#[derive(Debug)]
pub struct BodyBudget {
    left: Cell<usize>,
}

impl BodyBudget {
    pub fn new(bytes: usize) -> BodyBudget {
        BodyBudget {
            left: Cell::new(bytes),
        }
    }

    fn take(&self, bytes: usize) -> bool {
        let left = self.left.get();
        let enough = left >= bytes;
        if enough {
            self.left.set(left - bytes);
        }
        enough
    }

    fn give_back(&self, bytes: usize) {
        self.left.set(self.left.get().saturating_add(bytes));
    }

    pub fn left(&self) -> usize {
        self.left.get()
    }
}

/// What one response reports for its request's pending settlements.
#[derive(Debug, Default)]
pub struct ResponseCosts {
    pending: Vec<PendingSettlement>,
    /// A header's, trailer's or token usage's value, per pending charge.
    reported: Vec<Option<u64>>,
    /// What a token usage that is not whole did report, per pending charge.
    partial: Vec<u64>,
    body: Option<BodyReader>,
    /// The part of the worker's budget the body reader holds.
    reserved: usize,
    over_budget: bool,
}

/// The cost a header or trailer reports: the largest usable value when it is repeated
/// (or lists several), so that a second value never lowers the charge.
pub fn field_cost(values: &[String]) -> Option<u64> {
    values
        .iter()
        .flat_map(|value| value.split(','))
        .filter_map(parse_cost)
        .max()
}

impl ResponseCosts {
    pub fn new(pending: Vec<PendingSettlement>) -> ResponseCosts {
        ResponseCosts {
            reported: vec![None; pending.len()],
            partial: vec![0; pending.len()],
            pending,
            ..ResponseCosts::default()
        }
    }

    /// Whether anything waits for the response.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Reads the costs reported in the response headers (`values` gives every value of
    /// a header), and starts reading the body when a rule reads its cost there, if the
    /// body is one that can be read and `budget` holds the reader.
    pub fn read_headers(&mut self, values: impl Fn(&str) -> Vec<String>, budget: &BodyBudget) {
        let mut paths: Vec<Vec<String>> = Vec::new();
        for (pending, reported) in self.pending.iter().zip(&mut self.reported) {
            match &pending.cost.source {
                CostSource::Header(name) => *reported = field_cost(&values(name)),
                CostSource::Body(fields) => {
                    for field in fields {
                        if !paths.contains(&field.path) && paths.len() < MAX_PATHS {
                            paths.push(field.path.clone());
                        }
                    }
                }
                CostSource::Trailer(_) | CostSource::TokenUsage(_) => {}
            }
        }
        if paths.is_empty() {
            return;
        }
        let content_type = values("content-type");
        let encoding = values("content-encoding").join(",");
        let Ok(format) = body_format(content_type.first().map(String::as_str), Some(&encoding)) else {
            return;
        };
        let reader = BodyReader::new(format, paths);
        let footprint = reader.footprint();
        if budget.take(footprint) {
            self.reserved = footprint;
            self.body = Some(reader);
        } else {
            self.over_budget = true;
        }
    }

    /// Reads the costs reported in the response trailers.
    pub fn read_trailers(&mut self, values: impl Fn(&str) -> Vec<String>) {
        for (pending, reported) in self.pending.iter().zip(&mut self.reported) {
            if let CostSource::Trailer(name) = &pending.cost.source {
                *reported = field_cost(&values(name));
            }
        }
    }

    /// Whether a rule reads the token usage Envoy publishes: the host reads it (with
    /// [`ResponseCosts::read_token_usage`]) once the stream has ended.
    pub fn reads_token_usage(&self) -> bool {
        self.pending
            .iter()
            .any(|pending| matches!(pending.cost.source, CostSource::TokenUsage(_)))
    }

    /// Reads the token usage Envoy published for the stream. `metadata(namespace, path)`
    /// gives a value of the stream's typed metadata as Envoy's Wasm host serialises it:
    /// a count in 8 bytes, little-endian (anything else is no count).
    pub fn read_token_usage(&mut self, metadata: impl Fn(&str, &[&str]) -> Option<Vec<u8>>) {
        let pending = self.pending.iter();
        for ((pending, reported), partial) in pending.zip(&mut self.reported).zip(&mut self.partial) {
            if let CostSource::TokenUsage(usage) = &pending.cost.source {
                (*reported, *partial) = token_usage_cost(usage, &metadata);
            }
        }
    }

    /// Whether the body is being read: the host reads each chunk only then.
    pub fn wants_body(&self) -> bool {
        self.body.is_some()
    }

    /// Reads a chunk of the response body; nothing of it is kept.
    pub fn add_body(&mut self, chunk: &[u8]) {
        if let Some(body) = self.body.as_mut() {
            body.feed(chunk);
        }
    }

    /// The stream ended (complete or not): each pending charge settled at the reported
    /// cost, or at the rule's charge for an unreported one; the reader's bytes go back to
    /// `budget`. The settlements to send (none where the cost equals the estimate) and
    /// the stats to count.
    pub fn finish(self, budget: &BodyBudget) -> (Vec<Settlement>, Vec<Count>) {
        budget.give_back(self.reserved);
        let mut settlements = Vec::new();
        let mut counts = Vec::new();
        let reported = self.reported.into_iter().zip(self.partial);
        for (pending, (reported, partial)) in self.pending.into_iter().zip(reported) {
            let (reported, partial) = match &pending.cost.source {
                CostSource::Body(fields) => body_cost(self.body.as_ref(), fields),
                _ => (reported, partial),
            };
            let actual = match reported {
                Some(actual) => {
                    counts.push(Count {
                        rule_index: pending.rule_index,
                        stat: Stat::CostSettled,
                    });
                    actual
                }
                None => {
                    counts.push(Count {
                        rule_index: pending.rule_index,
                        stat: Stat::CostUnreported,
                    });
                    if self.over_budget && matches!(pending.cost.source, CostSource::Body(_)) {
                        counts.push(Count {
                            rule_index: pending.rule_index,
                            stat: Stat::CostOverBudget,
                        });
                    }
                    let charge = match pending.cost.unreported {
                        UnreportedCost::Estimate => pending.settlement.charged,
                        UnreportedCost::Tokens(tokens) => tokens,
                    };
                    charge.max(partial)
                }
            };
            if actual != pending.settlement.charged {
                settlements.push(Settlement {
                    actual,
                    ..pending.settlement
                });
            }
        }
        (settlements, counts)
    }
}

/// A body's reported cost: the weighted sum when every field was found, and the sum of
/// those found either way (an unreported response is charged at least that).
fn body_cost(body: Option<&BodyReader>, fields: &[CostField]) -> (Option<u64>, u64) {
    let Some(body) = body else {
        return (None, 0);
    };
    weighted_cost(fields, |field| {
        body.paths()
            .iter()
            .position(|path| *path == field.path)
            .and_then(|index| body.found().get(index).copied().flatten())
    })
}

/// `TokenUsage.extraction_status` of a record whose counts may be stale or short
/// (`PARTIAL`): what it reports is charged at least, as for a body cut short.
const EXTRACTION_PARTIAL: u64 = 2;

/// The token usage's cost, as [`body_cost`]'s: none reported unless every field was
/// published and the record is whole.
fn token_usage_cost(
    usage: &TokenUsageCost,
    metadata: &impl Fn(&str, &[&str]) -> Option<Vec<u8>>,
) -> (Option<u64>, u64) {
    let count = |path: &[&str]| {
        let bytes: [u8; 8] = metadata(&usage.namespace, path)?.try_into().ok()?;
        Some(u64::from_le_bytes(bytes))
    };
    let (cost, sum) = weighted_cost(&usage.fields, |field| {
        let path: Vec<&str> = field.path.iter().map(String::as_str).collect();
        count(&path).map(|value| value.min(MAX_LIMIT))
    });
    let partial = count(&["extraction_status"]) == Some(EXTRACTION_PARTIAL);
    (cost.filter(|_| !partial), sum)
}

/// The weighted sum of `fields` when `value` gives every one of them, and of those it
/// gives either way.
fn weighted_cost(fields: &[CostField], value: impl Fn(&CostField) -> Option<u64>) -> (Option<u64>, u64) {
    let mut sum = 0u64;
    let mut complete = true;
    for field in fields {
        match value(field) {
            Some(value) => sum = sum.saturating_add(value.saturating_mul(field.weight)),
            None => complete = false,
        }
    }
    let sum = sum.min(MAX_LIMIT);
    (complete.then_some(sum), sum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Algorithm;
    // On wasm32 the same tests run under wasm-bindgen-test (Node).
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const BUDGET: usize = 1 << 20;

    fn pending(rule_index: usize, source: CostSource, charged: u64) -> PendingSettlement {
        pending_with(rule_index, source, UnreportedCost::Estimate, charged)
    }

    fn pending_with(
        rule_index: usize,
        source: CostSource,
        unreported: UnreportedCost,
        charged: u64,
    ) -> PendingSettlement {
        PendingSettlement {
            rule_index,
            cost: CostFromResponse { source, unreported },
            settlement: Settlement {
                key: format!("r{rule_index}:{{k}}"),
                algorithm: Algorithm::TokenBucket,
                limit: 1000,
                period_ms: 60_000,
                charged,
                actual: charged,
                stamp: 0,
                calendar: None,
            },
        }
    }

    fn body(fields: &[(&str, u64)]) -> CostSource {
        CostSource::Body(
            fields
                .iter()
                .map(|(path, weight)| CostField {
                    path: path.split('.').map(str::to_string).collect(),
                    weight: *weight,
                })
                .collect(),
        )
    }

    fn headers<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Vec<String> + 'a {
        move |name| {
            pairs
                .iter()
                .filter(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
                .collect()
        }
    }

    fn stats(counts: &[Count]) -> Vec<(usize, &'static str)> {
        counts.iter().map(|c| (c.rule_index, c.stat.name())).collect()
    }

    fn actuals(settlements: &[Settlement]) -> Vec<(&str, u64, u64)> {
        settlements
            .iter()
            .map(|s| (s.key.as_str(), s.charged, s.actual))
            .collect()
    }

    #[test]
    fn a_reported_cost_is_a_decimal_integer_capped_at_the_largest_limit() {
        assert_eq!(parse_cost("250"), Some(250));
        assert_eq!(parse_cost(" 7 "), Some(7));
        assert_eq!(parse_cost("0"), Some(0));
        assert_eq!(parse_cost("99999999999999999999"), Some(MAX_LIMIT));
        for bad in ["", "-3", "1.5", "12a", "1e3", "+4", "123456789012345678901"] {
            assert_eq!(parse_cost(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_repeated_header_counts_its_largest_value() {
        let values = |list: &[&str]| list.iter().map(|v| v.to_string()).collect::<Vec<_>>();
        assert_eq!(field_cost(&values(&["100", "900"])), Some(900));
        assert_eq!(field_cost(&values(&["900", "100"])), Some(900));
        assert_eq!(field_cost(&values(&["100, 900"])), Some(900));
        assert_eq!(field_cost(&values(&["lots", "40"])), Some(40));
        assert_eq!(field_cost(&values(&["lots"])), None);
        assert_eq!(field_cost(&[]), None);
    }

    #[test]
    fn each_charge_settles_at_what_its_source_reports() {
        let budget = BodyBudget::new(BUDGET);
        let mut costs = ResponseCosts::new(vec![
            pending(0, CostSource::Header("x-usage-tokens".into()), 100),
            pending(1, CostSource::Trailer("x-usage-tokens".into()), 100),
            pending(2, body(&[("usage.total_tokens", 1)]), 100),
            pending(3, CostSource::Header("x-other".into()), 100),
            pending(
                4,
                body(&[("usage.prompt_tokens", 1), ("usage.completion_tokens", 4)]),
                100,
            ),
        ]);
        costs.read_headers(
            headers(&[
                ("x-usage-tokens", "250"),
                ("x-other", "100"),
                ("content-type", "application/json"),
            ]),
            &budget,
        );
        assert!(costs.wants_body());
        assert!(budget.left() < BUDGET, "the reader holds part of the budget");
        costs.add_body(br#"{"usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_"#);
        costs.add_body(br#"tokens": 30}}"#);
        costs.read_trailers(headers(&[("x-usage-tokens", "180")]));
        let (settlements, counts) = costs.finish(&budget);
        assert_eq!(budget.left(), BUDGET, "given back at the end");
        assert_eq!(
            actuals(&settlements),
            [
                ("r0:{k}", 100, 250),
                ("r1:{k}", 100, 180),
                ("r2:{k}", 100, 30),
                ("r4:{k}", 100, 30)
            ],
            "a cost equal to the estimate needs no settlement"
        );
        assert!(counts.iter().all(|c| c.stat == Stat::CostSettled), "{counts:?}");
    }

    #[test]
    fn an_event_stream_settles_at_its_last_usage() {
        let budget = BodyBudget::new(BUDGET);
        let mut costs = ResponseCosts::new(vec![pending(
            0,
            body(&[("message.usage.input_tokens", 1), ("usage.output_tokens", 5)]),
            100,
        )]);
        costs.read_headers(headers(&[("content-type", "text/event-stream")]), &budget);
        costs.add_body(b"event: message_start\ndata: {\"message\": {\"usage\": {\"input_tokens\": 20}}}\n\n");
        costs.add_body(b"event: message_delta\ndata: {\"usage\": {\"output_tokens\": 3}}\n\n");
        costs.add_body(b"event: message_delta\ndata: {\"usage\": {\"output_tokens\": 40}}\n\n");
        let (settlements, _) = costs.finish(&budget);
        assert_eq!(actuals(&settlements), [("r0:{k}", 100, 220)]);
    }

    #[test]
    fn token_usage_settles_from_envoys_metadata_and_a_partial_record_charges_at_least_the_unreported_cost() {
        let usage = |fields: &[(&str, u64)]| {
            let CostSource::Body(fields) = body(fields) else {
                unreachable!()
            };
            CostSource::TokenUsage(TokenUsageCost {
                namespace: "envoy.ai.token_usage".into(),
                fields,
            })
        };
        let settle = |published: &[(&str, u64)]| {
            let mut costs = ResponseCosts::new(vec![
                pending(0, usage(&[("input_tokens", 1), ("output_tokens", 4)]), 100),
                pending_with(
                    1,
                    usage(&[("input_tokens", 1), ("input_token_details.cached_tokens", 1)]),
                    UnreportedCost::Tokens(500),
                    100,
                ),
            ]);
            assert!(costs.reads_token_usage());
            costs.read_token_usage(|namespace, path| {
                assert_eq!(namespace, "envoy.ai.token_usage");
                let path = path.join(".");
                published
                    .iter()
                    .find(|(name, _)| *name == path)
                    .map(|(_, value)| value.to_le_bytes().to_vec())
            });
            let (settlements, counts) = costs.finish(&BodyBudget::new(BUDGET));
            let actuals: Vec<_> = actuals(&settlements)
                .into_iter()
                .map(|(key, charged, actual)| (key.to_owned(), charged, actual))
                .collect();
            (actuals, stats(&counts))
        };
        assert_eq!(
            settle(&[
                ("input_tokens", 30),
                ("output_tokens", 10),
                ("input_token_details.cached_tokens", 5)
            ]),
            (
                vec![("r0:{k}".to_owned(), 100, 70), ("r1:{k}".to_owned(), 100, 35)],
                vec![(0, "cost_settled"), (1, "cost_settled")]
            )
        );
        // No cached_tokens: rule 1 is unreported; PARTIAL (2): both are, charged at least
        // what the record holds.
        assert_eq!(
            settle(&[("input_tokens", 30), ("output_tokens", 10)]),
            (
                vec![("r0:{k}".to_owned(), 100, 70), ("r1:{k}".to_owned(), 100, 500)],
                vec![(0, "cost_settled"), (1, "cost_unreported")]
            )
        );
        assert_eq!(
            settle(&[
                ("input_tokens", 900),
                ("output_tokens", 10),
                ("extraction_status", 2)
            ]),
            (
                vec![("r0:{k}".to_owned(), 100, 940), ("r1:{k}".to_owned(), 100, 900)],
                vec![(0, "cost_unreported"), (1, "cost_unreported")]
            )
        );
        assert_eq!(
            settle(&[]),
            (
                vec![("r1:{k}".to_owned(), 100, 500)],
                vec![(0, "cost_unreported"), (1, "cost_unreported")]
            )
        );
    }

    #[test]
    fn an_unreported_cost_is_charged_the_rules_charge_or_what_was_reported_if_more() {
        let budget = BodyBudget::new(BUDGET);
        let sources = || {
            vec![
                pending(0, CostSource::Header("x-usage-tokens".into()), 5),
                pending_with(
                    1,
                    CostSource::Trailer("x-usage-tokens".into()),
                    UnreportedCost::Tokens(4000),
                    5,
                ),
                pending_with(
                    2,
                    body(&[("usage.total_tokens", 1)]),
                    UnreportedCost::Tokens(4000),
                    5,
                ),
                pending_with(
                    3,
                    body(&[("message.usage.input_tokens", 1), ("usage.output_tokens", 5)]),
                    UnreportedCost::Estimate,
                    5,
                ),
            ]
        };
        // Nothing reported: garbage, a stream cut off before its usage.
        let mut costs = ResponseCosts::new(sources());
        costs.read_headers(
            headers(&[("x-usage-tokens", "lots"), ("content-type", "text/event-stream")]),
            &budget,
        );
        costs.add_body(b"data: {\"message\": {\"usage\": {\"input_tokens\": 30}}}\n\n");
        costs.add_body(b"data: {\"usage\": {\"total_tok");
        let (settlements, counts) = costs.finish(&budget);
        assert_eq!(
            actuals(&settlements),
            [("r1:{k}", 5, 4000), ("r2:{k}", 5, 4000), ("r3:{k}", 5, 30)],
            "the estimate stays for rule 0; rule 3 pays the input it reported"
        );
        assert!(
            counts.iter().all(|c| c.stat == Stat::CostUnreported),
            "{counts:?}"
        );
    }

    #[test]
    fn a_compressed_or_unknown_body_is_not_read() {
        let budget = BodyBudget::new(BUDGET);
        for response in [
            [("content-type", "application/json"), ("content-encoding", "gzip")],
            [("content-type", "text/plain"), ("x", "")],
        ] {
            let mut costs = ResponseCosts::new(vec![pending_with(
                0,
                body(&[("usage.total_tokens", 1)]),
                UnreportedCost::Tokens(700),
                5,
            )]);
            costs.read_headers(headers(&response), &budget);
            assert!(!costs.wants_body(), "{response:?}");
            let (settlements, counts) = costs.finish(&budget);
            assert_eq!(actuals(&settlements), [("r0:{k}", 5, 700)]);
            assert_eq!(stats(&counts), [(0, "cost_unreported")]);
        }
    }

    #[test]
    fn past_the_workers_budget_a_body_is_not_read_and_is_counted() {
        let json = [("content-type", "application/json")];
        let source = || vec![pending(0, body(&[("n", 1)]), 5)];
        let mut first = ResponseCosts::new(source());
        let budget = BodyBudget::new(BUDGET);
        first.read_headers(headers(&json), &budget);
        let footprint = BUDGET - budget.left();
        let budget = BodyBudget::new(footprint);
        let mut first = ResponseCosts::new(source());
        first.read_headers(headers(&json), &budget);
        assert!(first.wants_body());
        let mut second = ResponseCosts::new(source());
        second.read_headers(headers(&json), &budget);
        assert!(!second.wants_body(), "the budget holds one reader");
        second.add_body(br#"{"n": 9}"#);
        let (_, counts) = second.finish(&budget);
        assert_eq!(stats(&counts), [(0, "cost_unreported"), (0, "cost_over_budget")]);
        first.add_body(br#"{"n": 9}"#);
        let (settlements, _) = first.finish(&budget);
        assert_eq!(actuals(&settlements), [("r0:{k}", 5, 9)]);
        let mut third = ResponseCosts::new(source());
        third.read_headers(headers(&json), &budget);
        assert!(third.wants_body(), "the first reader gave its share back");
    }
}
