//! Settling an admitted request at its real cost, known only from its response
//! (`cost_from_response`): the charges that wait for the response, the cost the response
//! reports (a header, a trailer or a field of a JSON body) and the settlements sent to
//! the shim when the stream ends. Pure: the host layer hands in what it reads.
//!
//! The admission charged the rule's `cost`, the estimate. The settlement charges the
//! difference (the counter may go into debt) or gives it back; a response that reports
//! no usable value leaves the estimate charged, counted as `cost_unreported`.

use crate::config::CostSource;
use crate::stats::{Count, Stat};
use crate::wire::{Settlement, MAX_LIMIT};
use serde_json::Value;

/// One charge of an admitted request that its response settles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingSettlement {
    /// Index into `FilterConfig::rules`, which names the rule's stats.
    pub rule_index: usize,
    pub source: CostSource,
    /// The counter, the tokens charged and where; `actual` is filled in at the end.
    pub settlement: Settlement,
}

/// What one response reports for its request's pending settlements.
#[derive(Debug, Default)]
pub struct ResponseCosts {
    pending: Vec<PendingSettlement>,
    reported: Vec<Option<u64>>,
    body: Option<BodyCapture>,
}

/// The JSON body kept to read a cost from, up to its limit.
#[derive(Debug)]
struct BodyCapture {
    bytes: Vec<u8>,
    limit: usize,
    overflowed: bool,
}

/// A reported cost: a decimal integer, capped at the largest limit (a settlement's debt
/// is bounded again by the shim).
pub fn parse_cost(text: &str) -> Option<u64> {
    let digits = text.trim();
    if digits.is_empty() || digits.len() > 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(
        digits
            .parse::<u64>()
            .map_or(MAX_LIMIT, |cost| cost.min(MAX_LIMIT)),
    )
}

/// The cost at `path` in a JSON document: a non-negative integer (or a whole number
/// written as a float, or a string of digits).
pub fn json_cost(document: &Value, path: &[String]) -> Option<u64> {
    let value = path.iter().try_fold(document, |value, field| value.get(field))?;
    match value {
        Value::Number(number) => number.as_u64().map(|cost| cost.min(MAX_LIMIT)).or_else(|| {
            let float = number.as_f64()?;
            let whole = float.is_finite() && float >= 0.0 && float.fract() == 0.0;
            // `as` saturates: a float past u64 reads as the cap.
            whole.then(|| (float as u64).min(MAX_LIMIT))
        }),
        Value::String(text) => parse_cost(text),
        _ => None,
    }
}

/// Whether a response's `content-type` says JSON (`application/json`, or a `+json` type).
pub fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

impl ResponseCosts {
    pub fn new(pending: Vec<PendingSettlement>) -> ResponseCosts {
        ResponseCosts {
            reported: vec![None; pending.len()],
            pending,
            body: None,
        }
    }

    /// Whether anything waits for the response.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Reads the costs reported in the response headers (`header` looks one up), and
    /// starts keeping a JSON body when a rule reads its cost there.
    pub fn read_headers(&mut self, header: impl Fn(&str) -> Option<String>) {
        let mut body_limit = 0;
        for (pending, reported) in self.pending.iter().zip(&mut self.reported) {
            match &pending.source {
                CostSource::Header(name) => *reported = header(name).as_deref().and_then(parse_cost),
                CostSource::JsonField { max_body_bytes, .. } => body_limit = body_limit.max(*max_body_bytes),
                CostSource::Trailer(_) => {}
            }
        }
        if body_limit > 0 && header("content-type").as_deref().is_some_and(is_json) {
            self.body = Some(BodyCapture {
                bytes: Vec::new(),
                limit: body_limit,
                overflowed: false,
            });
        }
    }

    /// Reads the costs reported in the response trailers.
    pub fn read_trailers(&mut self, trailer: impl Fn(&str) -> Option<String>) {
        for (pending, reported) in self.pending.iter().zip(&mut self.reported) {
            if let CostSource::Trailer(name) = &pending.source {
                *reported = trailer(name).as_deref().and_then(parse_cost);
            }
        }
    }

    /// Whether the body is being kept: the host reads each chunk only then.
    pub fn wants_body(&self) -> bool {
        self.body.as_ref().is_some_and(|body| !body.overflowed)
    }

    /// Keeps a chunk of the response body; a body past its limit is dropped whole (its
    /// cost is then unreported), so memory stays bounded per request.
    pub fn add_body(&mut self, chunk: &[u8]) {
        let Some(body) = self.body.as_mut() else {
            return;
        };
        if body.overflowed {
            return;
        }
        if body.bytes.len() + chunk.len() > body.limit {
            body.overflowed = true;
            body.bytes = Vec::new();
            return;
        }
        body.bytes.extend_from_slice(chunk);
    }

    /// The stream ended (complete or not): each pending charge settled at the reported
    /// cost, or left at the estimate when none was reported. The settlements to send
    /// (none where the cost equals the estimate) and the stats to count.
    pub fn finish(mut self) -> (Vec<Settlement>, Vec<Count>) {
        let body = self
            .body
            .take()
            .filter(|body| !body.overflowed && !body.bytes.is_empty());
        let body_len = body.as_ref().map_or(0, |body| body.bytes.len());
        let document: Option<Value> = body.and_then(|body| serde_json::from_slice(&body.bytes).ok());
        let mut settlements = Vec::new();
        let mut counts = Vec::new();
        for (pending, reported) in self.pending.into_iter().zip(self.reported) {
            let reported = match (&pending.source, &document) {
                (CostSource::JsonField { path, max_body_bytes }, Some(document))
                    if body_len <= *max_body_bytes =>
                {
                    json_cost(document, path)
                }
                _ => reported,
            };
            let stat = match reported {
                Some(actual) => {
                    if actual != pending.settlement.charged {
                        settlements.push(Settlement {
                            actual,
                            ..pending.settlement
                        });
                    }
                    Stat::CostSettled
                }
                None => Stat::CostUnreported,
            };
            counts.push(Count {
                rule_index: pending.rule_index,
                stat,
            });
        }
        (settlements, counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Algorithm;
    // On wasm32 the same tests run under wasm-bindgen-test (Node).
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn pending(rule_index: usize, source: CostSource, charged: u64) -> PendingSettlement {
        PendingSettlement {
            rule_index,
            source,
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

    fn json_source(path: &str, max_body_bytes: usize) -> CostSource {
        CostSource::JsonField {
            path: path.split('.').map(str::to_string).collect(),
            max_body_bytes,
        }
    }

    fn headers<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string())
    }

    fn stats(counts: &[Count]) -> Vec<(usize, &'static str)> {
        counts.iter().map(|c| (c.rule_index, c.stat.name())).collect()
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
    fn a_json_cost_is_found_by_its_path() {
        let document: Value = serde_json::from_str(
            r#"{"usage": {"total_tokens": 42, "float": 12.0, "text": "9", "neg": -1, "half": 0.5, "list": [1]}}"#,
        )
        .unwrap();
        let at = |path: &str| {
            json_cost(
                &document,
                &path.split('.').map(str::to_string).collect::<Vec<_>>(),
            )
        };
        assert_eq!(at("usage.total_tokens"), Some(42));
        assert_eq!(at("usage.float"), Some(12));
        assert_eq!(at("usage.text"), Some(9));
        for missing in [
            "usage.neg",
            "usage.half",
            "usage.list",
            "usage",
            "usage.none",
            "nothing.here",
        ] {
            assert_eq!(at(missing), None, "{missing}");
        }
        assert!(is_json("application/json; charset=utf-8"));
        assert!(is_json("Application/Problem+JSON"));
        assert!(!is_json("text/event-stream"));
        assert!(!is_json("text/json+xml"));
    }

    #[test]
    fn each_charge_settles_at_what_its_source_reports() {
        let mut costs = ResponseCosts::new(vec![
            pending(0, CostSource::Header("x-usage-tokens".into()), 100),
            pending(1, CostSource::Trailer("x-usage-tokens".into()), 100),
            pending(2, json_source("usage.total_tokens", 1024), 100),
            pending(3, CostSource::Header("x-other".into()), 100),
        ]);
        costs.read_headers(headers(&[
            ("x-usage-tokens", "250"),
            ("x-other", "100"),
            ("content-type", "application/json"),
        ]));
        assert!(costs.wants_body());
        costs.add_body(br#"{"usage": {"total_"#);
        costs.add_body(br#"tokens": 30}}"#);
        costs.read_trailers(headers(&[("x-usage-tokens", "180")]));
        let (settlements, counts) = costs.finish();
        assert_eq!(
            settlements
                .iter()
                .map(|s| (s.key.as_str(), s.charged, s.actual))
                .collect::<Vec<_>>(),
            [("r0:{k}", 100, 250), ("r1:{k}", 100, 180), ("r2:{k}", 100, 30)],
            "a cost equal to the estimate needs no settlement"
        );
        assert_eq!(
            stats(&counts),
            [
                (0, "cost_settled"),
                (1, "cost_settled"),
                (2, "cost_settled"),
                (3, "cost_settled")
            ]
        );
    }

    #[test]
    fn a_response_without_a_usable_value_keeps_the_estimate() {
        let sources = || {
            vec![
                pending(0, CostSource::Header("x-usage-tokens".into()), 5),
                pending(1, CostSource::Trailer("x-usage-tokens".into()), 5),
                pending(2, json_source("usage.total_tokens", 16), 5),
            ]
        };
        // Nothing reported: no header, no trailer, not JSON.
        let mut costs = ResponseCosts::new(sources());
        costs.read_headers(headers(&[("content-type", "text/plain")]));
        assert!(!costs.wants_body());
        let (settlements, counts) = costs.finish();
        assert!(settlements.is_empty());
        assert_eq!(
            stats(&counts),
            [
                (0, "cost_unreported"),
                (1, "cost_unreported"),
                (2, "cost_unreported")
            ]
        );
        // Garbage values, a body past its limit (dropped: memory stays bounded).
        let mut costs = ResponseCosts::new(sources());
        costs.read_headers(headers(&[
            ("x-usage-tokens", "lots"),
            ("content-type", "application/json"),
        ]));
        costs.add_body(br#"{"usage": {"total_tokens": 3}, "padding": "xxxx"}"#);
        assert!(!costs.wants_body(), "past 16 bytes the body is no longer kept");
        costs.read_trailers(headers(&[("x-usage-tokens", "-1")]));
        let (settlements, counts) = costs.finish();
        assert!(settlements.is_empty());
        assert!(counts.iter().all(|c| c.stat == Stat::CostUnreported));
        // A body cut short (the client went away mid-response) is not JSON.
        let mut costs = ResponseCosts::new(vec![pending(0, json_source("usage.total_tokens", 1024), 5)]);
        costs.read_headers(headers(&[("content-type", "application/json")]));
        costs.add_body(br#"{"usage": {"total_tok"#);
        let (settlements, counts) = costs.finish();
        assert!(settlements.is_empty());
        assert_eq!(stats(&counts), [(0, "cost_unreported")]);
    }

    #[test]
    fn the_body_limit_is_each_rules_own() {
        let mut costs = ResponseCosts::new(vec![
            pending(0, json_source("n", 8), 5),
            pending(1, json_source("n", 64), 5),
        ]);
        costs.read_headers(headers(&[("content-type", "application/json")]));
        costs.add_body(br#"{"n": 12, "pad": 1}"#);
        let (settlements, counts) = costs.finish();
        assert_eq!(settlements.len(), 1);
        assert_eq!(settlements[0].key, "r1:{k}");
        assert_eq!(stats(&counts), [(0, "cost_unreported"), (1, "cost_settled")]);
    }
}
