//! What `redis-shim counters` prints: one line per rule (a table, or JSON) with the
//! counter's state or what the reset did, and the notes on what a reset cannot undo.

use super::rule_rows::{RuleRow, RuleState};
use ratelimit_rules::config::{FilterConfig, DENY_RECHECK_MS};
use ratelimit_rules::plan::PlannedCheck;
use ratelimit_wire::{Check, CheckResult};
use serde_json::{json, Value};

const LOCAL_NOTE: &str = "local rule: no Redis counter (each Envoy keeps its own bucket)";

/// What the command found, ready to print.
pub struct Report<'a> {
    pub rows: &'a [RuleRow],
    /// One per counted rule, in order: its state (before the reset, for a reset).
    pub results: &'a [CheckResult],
    /// One per counted rule when any is replicated: each region's component.
    pub components: &'a [Vec<(String, u64)>],
    /// For a reset: whether each counted rule's key was there to delete.
    pub deleted: Option<&'a [bool]>,
    pub notes: &'a [String],
    pub reset: bool,
}

/// What a reset cannot undo from here, when it applies.
pub fn reset_notes(
    config: &FilterConfig,
    rows: &[RuleRow],
    before: &[CheckResult],
    reset: bool,
) -> Vec<String> {
    if !reset {
        return vec![];
    }
    let mut notes = vec![];
    let refused_for = before
        .iter()
        .map(|r| r.retry_after_ms)
        .max()
        .unwrap_or(0)
        .min(DENY_RECHECK_MS);
    if config.deny_cache && refused_for > 0 {
        notes.push(format!(
            "Envoys that already refused this client remember it (deny_cache): each keeps \
             refusing it locally for up to {} more, until it asks the shim again",
            duration(refused_for)
        ));
    }
    let leased = rows.iter().any(|row| match &row.state {
        RuleState::Counted(planned) => planned.rule.lease.is_some(),
        _ => false,
    });
    if leased {
        notes.push(
            "tokens already leased to Envoys stay theirs to spend until their lease ends; \
             what they give back unspent is credited to the new counter"
                .into(),
        );
    }
    notes
}

/// `ms` as a short duration: `250ms`, `12.5s`.
fn duration(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms}ms")
    } else {
        format!("{:.1}s", ms as f64 / 1000.0)
    }
}

/// A period as the configuration writes it: `1m`, `10s`, `250ms`.
fn period(ms: u64) -> String {
    for (unit, size) in [("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)] {
        if ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// The window a check counts over: its period, or its calendar (`month (UTC+05:30)`),
/// whose period is only the unit's longest window.
pub fn window(check: &Check) -> String {
    match check.calendar {
        Some(calendar) => calendar.to_string(),
        None => period(check.period_ms),
    }
}

/// The notes of a counted rule shown: refused, tier, cost, shadow.
fn counted_notes(planned: &PlannedCheck, tier: Option<&str>, shown: Option<&CheckResult>) -> String {
    let mut notes = vec![];
    if shown.is_some_and(|r| !r.allowed) {
        notes.push("refused".to_string());
    }
    if let Some(tier) = tier {
        notes.push(format!("tier {tier}"));
    }
    if planned.check.cost != 1 {
        notes.push(format!("cost {}", planned.check.cost));
    }
    if planned.check.shadow {
        notes.push("shadow: never refuses".into());
    }
    notes.join(", ")
}

impl Report<'_> {
    /// The report as an aligned table, then the notes.
    pub fn table(&self) -> String {
        let mut lines: Vec<Vec<String>> = vec![if self.reset {
            ["RULE", "KEY", "RESULT", "NOTE"].map(String::from).to_vec()
        } else {
            [
                "RULE",
                "KEY",
                "LIMIT",
                "REMAINING",
                "RESET",
                "RETRY-AFTER",
                "NOTE",
            ]
            .map(String::from)
            .to_vec()
        }];
        let mut counted = 0;
        for row in self.rows {
            let dash = || "-".to_string();
            let line = match &row.state {
                RuleState::Counted(planned) => {
                    let result = self.results.get(counted);
                    let was_deleted = self.deleted.and_then(|d| d.get(counted)).copied();
                    counted += 1;
                    let mut note =
                        counted_notes(planned, row.tier.as_deref(), result.filter(|_| !self.reset));
                    if let Some(parts) = self.components.get(counted - 1).filter(|parts| !parts.is_empty()) {
                        let parts: Vec<String> =
                            parts.iter().map(|(region, n)| format!("{region} {n}")).collect();
                        let shown = format!("regions: {}", parts.join(", "));
                        note = if note.is_empty() {
                            shown
                        } else {
                            format!("{note}, {shown}")
                        };
                    }
                    let key = planned.check.key.clone();
                    if self.reset {
                        let outcome = match (was_deleted, result) {
                            (Some(true), Some(before)) => {
                                format!("deleted (had {} of {} left)", before.remaining, before.limit)
                            }
                            _ => "nothing to delete (at its full limit)".to_string(),
                        };
                        vec![row.name.clone(), key, outcome, note]
                    } else {
                        let limit = format!("{}/{}", planned.check.limit, window(&planned.check));
                        match result {
                            Some(r) => vec![
                                row.name.clone(),
                                key,
                                limit,
                                r.remaining.to_string(),
                                if r.reset_ms == 0 {
                                    dash()
                                } else {
                                    duration(r.reset_ms)
                                },
                                if r.allowed {
                                    dash()
                                } else {
                                    duration(r.retry_after_ms)
                                },
                                note,
                            ],
                            None => vec![row.name.clone(), key, limit, dash(), dash(), dash(), note],
                        }
                    }
                }
                RuleState::Local | RuleState::NotApplicable(_) => {
                    let note = match &row.state {
                        RuleState::NotApplicable(why) => why.clone(),
                        _ => LOCAL_NOTE.to_string(),
                    };
                    let blanks = if self.reset { 2 } else { 5 };
                    let mut line = vec![row.name.clone()];
                    line.extend((0..blanks).map(|_| dash()));
                    line.push(note);
                    line
                }
            };
            lines.push(line);
        }
        let columns = lines.first().map_or(0, Vec::len);
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                lines
                    .iter()
                    .map(|l| l.get(c).map_or(0, String::len))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out: Vec<String> = lines
            .iter()
            .map(|line| {
                line.iter()
                    .zip(&widths)
                    .map(|(cell, width)| format!("{cell:<width$}"))
                    .collect::<Vec<_>>()
                    .join("  ")
                    .trim_end()
                    .to_string()
            })
            .collect();
        out.extend(self.notes.iter().map(|note| format!("note: {note}")));
        out.join("\n")
    }

    /// The report as one JSON document.
    pub fn json(&self) -> String {
        let mut counted = 0;
        let rules: Vec<Value> = self
            .rows
            .iter()
            .map(|row| match &row.state {
                RuleState::Counted(planned) => {
                    let check = &planned.check;
                    let mut value = json!({
                        "rule": row.name,
                        "status": "counted",
                        "key": check.key,
                        "algorithm": check.algorithm.as_str(),
                        "limit": check.limit,
                        "period_ms": check.period_ms,
                        "calendar": check.calendar,
                        "cost": check.cost,
                        "shadow": check.shadow,
                        "tier": row.tier,
                    });
                    if let Some(result) = self.results.get(counted) {
                        value["allowed"] = json!(result.allowed);
                        value["remaining"] = json!(result.remaining);
                        value["reset_ms"] = json!(result.reset_ms);
                        value["retry_after_ms"] = json!(result.retry_after_ms);
                    }
                    if let Some(parts) = self.components.get(counted).filter(|parts| !parts.is_empty()) {
                        value["regions"] = json!(parts
                            .iter()
                            .cloned()
                            .collect::<std::collections::BTreeMap<_, _>>());
                    }
                    if let Some(was_deleted) = self.deleted.and_then(|d| d.get(counted)) {
                        value["deleted"] = json!(was_deleted);
                    }
                    counted += 1;
                    value
                }
                RuleState::Local => json!({ "rule": row.name, "status": "local", "note": LOCAL_NOTE }),
                RuleState::NotApplicable(why) => {
                    json!({ "rule": row.name, "status": "not_applicable", "note": why })
                }
            })
            .collect();
        let action = if self.reset { "reset" } else { "show" };
        json!({ "action": action, "rules": rules, "notes": self.notes }).to_string()
    }
}
