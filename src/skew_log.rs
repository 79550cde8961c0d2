//! What a worker says about version skew between this filter and the shims it calls,
//! and says once: each shim version it meets that is not its own (from the shim's
//! `x-ratelimit-wire` response header), each rule and field a shim did not honour, each
//! kind of return or settlement a shim did not apply. Counting is per request (the
//! `shim_unsupported` stat); logging per request would flood the log during an upgrade.
//! Pure: the host logs the lines it returns.

use crate::wire::{WireVersion, VERSION, VERSION_HEADER};
use std::collections::HashSet;

/// Most distinct lines one worker logs; past that, skew goes on being counted only.
const MOST_LINES: usize = 64;

/// A line to log, and whether it is a warning (else information).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkewLine {
    pub warning: bool,
    pub text: String,
}

/// What one worker has already said.
#[derive(Debug, Default)]
pub struct SkewLog {
    said: HashSet<String>,
}

impl SkewLog {
    /// A shim answered, stating `stated` (`None`: no header, a 0.1 shim).
    pub fn shim_answered(&mut self, stated: Option<&str>) -> Option<SkewLine> {
        if stated == Some(VERSION) {
            return None;
        }
        let shim = stated.and_then(WireVersion::parse);
        let named = match stated {
            Some(text) => format!("shim {text}"),
            None => format!("a shim stating no {VERSION_HEADER} (0.1 or older)"),
        };
        let served = shim.or(stated.is_none().then_some(WireVersion::UNSTATED));
        let (warning, verdict) = match served {
            Some(shim) if shim.serves(WireVersion::ours()) => (
                false,
                "within one minor version: checks it cannot honour fall to their rules' failure modes (stat shim_unsupported)",
            ),
            _ => (
                true,
                "more than one minor version apart, unsupported: upgrade the shims first (docs/OPERATIONS.md, Upgrading)",
            ),
        };
        self.say(warning, format!("filter {VERSION} is calling {named}: {verdict}"))
    }

    /// A shim did not decide `rule`'s check: it does not know `field`.
    pub fn unsupported(&mut self, rule: &str, field: &str) -> Option<SkewLine> {
        self.say(
            true,
            format!(
                "rule {rule}: the shim does not support {field} (an older shim): this rule's failure mode decides its requests until the shim is upgraded"
            ),
        )
    }

    /// A shim did not apply a return or a settlement (`settlements[I]: FIELD`).
    pub fn not_applied(&mut self, what: &str) -> Option<SkewLine> {
        let kind = what.split('[').next().unwrap_or(what);
        let field = what.split(": ").nth(1).unwrap_or(what);
        self.say(
            true,
            format!("the shim does not support {field} in {kind} (an older shim): not applied, counted in adjustments_lost"),
        )
    }

    fn say(&mut self, warning: bool, text: String) -> Option<SkewLine> {
        (self.said.len() < MOST_LINES && self.said.insert(text.clone())).then_some(SkewLine { warning, text })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn each_thing_is_said_once() {
        let mut log = SkewLog::default();
        assert_eq!(log.shim_answered(Some(VERSION)), None);
        let old = log.shim_answered(None).unwrap();
        assert!(!old.warning && old.text.contains("0.1 or older"), "{old:?}");
        assert_eq!(log.shim_answered(None), None);
        let far = log.shim_answered(Some("7.0.0")).unwrap();
        assert!(far.warning && far.text.contains("shim 7.0.0"), "{far:?}");
        let garbage = log.shim_answered(Some("soon")).unwrap();
        assert!(garbage.warning, "{garbage:?}");
        let field = log.unsupported("per-key", "priority").unwrap();
        assert!(field.text.contains("rule per-key") && field.text.contains("priority"));
        assert_eq!(log.unsupported("per-key", "priority"), None);
        assert!(log.unsupported("per-ip", "priority").is_some());
        let skipped = log.not_applied("settlements[3]: epoch").unwrap();
        assert!(skipped.text.contains("epoch in settlements"), "{skipped:?}");
        assert_eq!(log.not_applied("settlements[0]: epoch"), None);
    }

    #[test]
    fn a_flood_of_names_is_bounded() {
        let mut log = SkewLog::default();
        let said = (0..1_000)
            .filter(|i| log.unsupported("r", &format!("f{i}")).is_some())
            .count();
        assert_eq!(said, MOST_LINES);
    }
}
