//! Spill-over: a request that only rules with `on_exceeded: spill` refused is not
//! refused. It gets their headers and goes on, for Envoy to route it again (to the
//! fallback the route table sends that header to), checked against the rules that match
//! it then, the spilling rules aside; a second refusal is a refusal (one hop). Pure: the
//! dispatch layer sets the headers and plans again.

use crate::config::{OnExceeded, Rule};
use crate::wire::CheckResult;

/// The response header telling the client its request was spilled over, and by which
/// rules (comma-separated names).
pub const SPILLED_HEADER: &str = "x-ratelimit-spilled";

/// A request to spill over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spill {
    /// The request headers to set, one per name: the first rule (in configuration
    /// order) that names a header sets its value.
    pub request_headers: Vec<(String, String)>,
    /// The rules that spilled it, by their index in the configuration: the second check
    /// leaves them out, so the exhausted counters are not charged.
    pub rules: Vec<usize>,
    /// Their names, for [`SPILLED_HEADER`].
    pub names: Vec<String>,
}

impl Spill {
    /// The response header naming the rules.
    pub fn response_header(&self) -> (String, String) {
        (SPILLED_HEADER.to_string(), self.names.join(", "))
    }
}

/// The spill-over for a refused request, given each known check as (rule index, rule,
/// result): `None` unless every enforcing rule that refused it spills over.
pub fn spill_over<'a>(known: impl Iterator<Item = (usize, &'a Rule, CheckResult)>) -> Option<Spill> {
    let mut refusing: Vec<(usize, &Rule)> = known
        .filter(|(_, rule, result)| !rule.shadow && !result.allowed)
        .map(|(index, rule, _)| (index, rule))
        .collect();
    if refusing.is_empty() {
        return None;
    }
    refusing.sort_by_key(|(index, _)| *index);
    let mut spill = Spill {
        request_headers: Vec::new(),
        rules: Vec::new(),
        names: Vec::new(),
    };
    for (index, rule) in refusing {
        let OnExceeded::Spill(header) = &rule.on_exceeded else {
            return None;
        };
        if !spill.request_headers.iter().any(|(name, _)| *name == header.name) {
            spill
                .request_headers
                .push((header.name.clone(), header.value.clone()));
        }
        spill.rules.push(index);
        spill.names.push(rule.name.clone());
    }
    Some(spill)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SpillHeader;
    use crate::judged::fixtures::result;
    use crate::keys::KeyPart;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn spilling(name: &str, header: &str, value: &str) -> Rule {
        Rule {
            on_exceeded: OnExceeded::Spill(SpillHeader {
                name: header.into(),
                value: value.into(),
            }),
            ..Rule::for_tests(name, vec![KeyPart::ClientIp])
        }
    }

    #[test]
    fn a_request_refused_only_by_spilling_rules_spills_with_each_header_once() {
        let first = spilling("gpt", "x-pool", "small");
        let second = spilling("tenant", "x-pool", "other");
        let third = spilling("region", "x-region", "b");
        let passing = Rule::for_tests("ip", vec![KeyPart::ClientIp]);
        let refused = result(false, 5, 0, 1_000, 1_000);
        let known = [
            (3, &third, refused),
            (0, &first, refused),
            (1, &second, refused),
            (2, &passing, result(true, 5, 4, 1_000, 0)),
        ];
        let spill = spill_over(known.into_iter()).unwrap();
        assert_eq!(
            spill.request_headers,
            vec![("x-pool".into(), "small".into()), ("x-region".into(), "b".into())]
        );
        assert_eq!(spill.rules, vec![0, 1, 3]);
        assert_eq!(spill.response_header().1, "gpt, tenant, region");
    }

    #[test]
    fn a_refusing_rule_that_does_not_spill_refuses_and_an_admission_does_not_spill() {
        let spills = spilling("gpt", "x-pool", "small");
        let refuses = Rule::for_tests("ip", vec![KeyPart::ClientIp]);
        let shadow = Rule {
            shadow: true,
            ..Rule::for_tests("watch", vec![KeyPart::ClientIp])
        };
        let refused = result(false, 5, 0, 1_000, 1_000);
        assert_eq!(
            spill_over([(0, &spills, refused), (1, &refuses, refused)].into_iter()),
            None
        );
        assert_eq!(
            spill_over([(0, &spills, result(true, 5, 1, 1_000, 0)), (1, &shadow, refused)].into_iter()),
            None
        );
        assert!(spill_over([(0, &spills, refused), (1, &shadow, refused)].into_iter()).is_some());
    }
}
