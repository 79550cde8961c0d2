//! `redis-shim counters show|reset`: one client's counters, for an operator on call ("why
//! is this client refused, how much has it left?", "unblock it now").
//!
//! The command reads the filter's plugin configuration and plans the request described
//! on its command line with the filter's own code (`ratelimit_rules::plan` over a
//! [`GivenRequest`]), so each rule's counter key is the key the filter sends, never a
//! reimplementation of it. It then asks a shim's admin endpoints ([`crate::admin`]), over
//! HTTP with the admin token, for the counters' state (charging nothing) or to delete
//! them, and prints a table per rule, or JSON.

use crate::admin::{ResetAnswer, ShowAnswer, VariantsAnswer, RESET_PATH, SHOW_PATH, VARIANTS_PATH};
use crate::cli::CountersCommand;
use ratelimit_rules::attributes::{GivenRequest, RequestAttributes};
use ratelimit_rules::config::{FilterConfig, Rule, Scope, DENY_RECHECK_MS};
use ratelimit_rules::keys::{part_value, KeyPart};
use ratelimit_rules::plan::{plan, tier_for, PlannedCheck};
use ratelimit_wire::{Check, CheckRequest, CheckResult, TOKEN_HEADER};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

/// The request to look up, and the shim to ask.
#[derive(clap::Args, Debug, Clone)]
pub struct CountersArgs {
    /// The filter's plugin configuration: the JSON document Envoy is given.
    #[arg(long)]
    pub config: PathBuf,
    /// Only this rule (repeat for several); every rule by default.
    #[arg(long = "rule", value_name = "NAME")]
    pub rules: Vec<String>,
    /// A request header, NAME=VALUE (repeat for several).
    #[arg(long = "header", value_name = "NAME=VALUE", value_parser = name_value)]
    pub headers: Vec<(String, String)>,
    /// The client's IP, as Envoy sees the peer (with trusted X-Forwarded-For hops, give
    /// the header with --header).
    #[arg(long)]
    pub client_ip: Option<String>,
    /// The request path.
    #[arg(long, default_value = "/")]
    pub path: String,
    /// The request method.
    #[arg(long, default_value = "GET")]
    pub method: String,
    /// A verified JWT claim, NAME=VALUE (repeat for several).
    #[arg(long = "claim", value_name = "NAME=VALUE", value_parser = name_value)]
    pub claims: Vec<(String, String)>,
    /// The shim's base URL.
    #[arg(long, env = "RLSHIM_URL", default_value = "http://127.0.0.1:8400")]
    pub shim: String,
    /// The shim's admin token: its --admin-token, or its --token.
    #[arg(long, env = "RLSHIM_ADMIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// One JSON document on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
}

fn name_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_string(), value.to_string())),
        _ => Err(format!("{text:?} is not NAME=VALUE")),
    }
}

/// Runs a `counters` command; the process's exit code.
pub fn run(command: &CountersCommand) -> i32 {
    let (args, reset) = match command {
        CountersCommand::Show(args) => (args, false),
        CountersCommand::Reset(args) => (args, true),
    };
    match execute(args, reset) {
        Ok((output, None)) => {
            println!("{output}");
            0
        }
        // The table, then why the reset did not unblock the client.
        Ok((output, Some(problem))) => {
            println!("{output}");
            eprintln!("redis-shim counters: {problem}");
            3
        }
        Err(e) => {
            eprintln!("redis-shim counters: {e}");
            1
        }
    }
}

/// What one rule makes of the request described.
enum State {
    /// Counted by the shim, in `check.key`.
    Counted(Box<PlannedCheck>),
    /// A per-Envoy bucket: nothing in Redis.
    Local,
    /// The rule does not apply to the request: why.
    NotApplicable(String),
}

struct RuleRow {
    name: String,
    /// The tier that sets the client's limit, if one does.
    tier: Option<String>,
    state: State,
}

/// The request the command line describes.
pub fn given_request(args: &CountersArgs) -> GivenRequest {
    let mut headers = vec![
        (":path".to_string(), args.path.clone()),
        (":method".to_string(), args.method.to_ascii_uppercase()),
    ];
    headers.extend(args.headers.iter().cloned());
    GivenRequest {
        headers,
        source_address: args.client_ip.clone(),
        claims: args.claims.clone(),
    }
}

fn describe(part: &KeyPart) -> String {
    match part {
        KeyPart::Header(name) => format!("header {name} (--header {name}=...)"),
        KeyPart::ClientIp => "client IP (--client-ip)".into(),
        KeyPart::JwtClaim(claim) => format!("claim {claim} (--claim {claim}=...)"),
        KeyPart::Path => "path".into(),
        KeyPart::Method => "method".into(),
        KeyPart::Constant(_) => "constant".into(),
    }
}

/// Why the filter would not check `rule` for this request.
fn why_not(rule: &Rule, request: &impl RequestAttributes, hops: u32) -> String {
    if !rule.matcher.matches(request) {
        return "does not apply: its match does not select this request".into();
    }
    match rule
        .key
        .iter()
        .find(|part| part_value(part, request, hops).is_none())
    {
        Some(part) => format!("does not apply: the request has no {}", describe(part)),
        None => "does not apply".into(),
    }
}

fn rule_rows(config: &FilterConfig, request: &GivenRequest, only: &[String]) -> Vec<RuleRow> {
    let planned = plan(config, request);
    let hops = config.xff_num_trusted_hops;
    config
        .rules
        .iter()
        .enumerate()
        .filter(|(_, rule)| only.is_empty() || only.contains(&rule.name))
        .map(|(index, rule)| {
            let state = match planned.iter().find(|p| p.rule_index == index) {
                Some(_) if rule.scope == Scope::Local => State::Local,
                Some(check) => State::Counted(Box::new(check.clone())),
                None => State::NotApplicable(why_not(rule, request, hops)),
            };
            RuleRow {
                name: rule.name.clone(),
                tier: tier_for(rule, request, hops).map(|tier| tier.name.clone()),
                state,
            }
        })
        .collect()
}

const LOCAL_NOTE: &str = "local rule: no Redis counter (each Envoy keeps its own bucket)";

/// The output, and for a reset that found nothing to delete where the client is counted
/// under another variant of the rule, what went wrong.
fn execute(args: &CountersArgs, reset: bool) -> Result<(String, Option<String>), String> {
    let file = args.config.display();
    let text = std::fs::read(&args.config).map_err(|e| format!("{file}: {e}"))?;
    let config = FilterConfig::from_json(&text).map_err(|e| format!("{file}: {e}"))?;
    if let Some(unknown) = args
        .rules
        .iter()
        .find(|name| !config.rules.iter().any(|rule| &rule.name == *name))
    {
        return Err(format!("{file} has no rule named {unknown:?}"));
    }
    let rows = rule_rows(&config, &given_request(args), &args.rules);
    let checks: Vec<Check> = rows
        .iter()
        .filter_map(|row| match &row.state {
            State::Counted(planned) => Some(planned.check.clone()),
            _ => None,
        })
        .collect();
    let (results, deleted, variants) = if checks.is_empty() {
        (vec![], None, vec![])
    } else {
        let request = CheckRequest { checks };
        let variants: VariantsAnswer = call(args, VARIANTS_PATH, &request)?;
        if reset {
            let answer: ResetAnswer = call(args, RESET_PATH, &request)?;
            (answer.before, Some(answer.deleted), variants.variants)
        } else {
            let answer: ShowAnswer = call(args, SHOW_PATH, &request)?;
            (answer.results, None, variants.variants)
        }
    };
    let mut notes = reset_notes(&config, &rows, &results, reset);
    let counted = rows.iter().filter_map(|row| match &row.state {
        State::Counted(_) => Some(row.name.as_str()),
        _ => None,
    });
    let mut stranded = Vec::new();
    for (index, (rule, others)) in counted.zip(&variants).enumerate() {
        if others.is_empty() {
            continue;
        }
        notes.push(format!(
            "{rule}: this client also has counters under other variants of the rule (another \
             algorithm, period or calendar than this configuration's, so another configuration \
             counts in them), which this command does not touch: {}",
            others.join(", ")
        ));
        if deleted.as_deref().and_then(|d| d.get(index)) == Some(&false) {
            stranded.push(rule);
        }
    }
    let problem = (!stranded.is_empty()).then(|| {
        format!(
            "nothing to delete under {} as this configuration counts it, but the client is \
             counted under another variant (see the notes): reset with the configuration the \
             Envoys run, or delete those keys (with the shim's key prefix) in Redis",
            stranded.join(", ")
        )
    });
    let output = if args.json {
        render_json(&rows, &results, deleted.as_deref(), &notes, reset)
    } else {
        render_table(&rows, &results, deleted.as_deref(), &notes, reset)
    };
    Ok((output, problem))
}

/// POSTs `body` to the shim's admin endpoint `path` and reads its JSON answer.
fn call<T: serde::de::DeserializeOwned>(
    args: &CountersArgs,
    path: &str,
    body: &CheckRequest,
) -> Result<T, String> {
    let Some(token) = &args.token else {
        return Err("the admin endpoints need the shim's token: --token or RLSHIM_ADMIN_TOKEN".into());
    };
    let url = format!("{}{path}", args.shim.trim_end_matches('/'));
    let body = serde_json::to_string(body).map_err(|e| e.to_string())?;
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(10)).build();
    let reply = agent
        .post(&url)
        .set("content-type", "application/json")
        .set(TOKEN_HEADER, token)
        .send_string(&body);
    let text = match reply {
        Ok(response) => response.into_string().map_err(|e| format!("{url}: {e}"))?,
        Err(ureq::Error::Status(status, response)) => {
            let text = response.into_string().unwrap_or_default();
            return Err(format!("{url} answered {status}: {text}"));
        }
        Err(e) => return Err(format!("{url}: {e}")),
    };
    serde_json::from_str(&text).map_err(|e| format!("{url}: unexpected answer {text:?}: {e}"))
}

/// What a reset cannot undo from here, when it applies.
fn reset_notes(config: &FilterConfig, rows: &[RuleRow], before: &[CheckResult], reset: bool) -> Vec<String> {
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
        State::Counted(planned) => planned.rule.lease.is_some(),
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
fn window(check: &Check) -> String {
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

fn render_table(
    rows: &[RuleRow],
    results: &[CheckResult],
    deleted: Option<&[bool]>,
    notes: &[String],
    reset: bool,
) -> String {
    let mut lines: Vec<Vec<String>> = vec![if reset {
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
    for row in rows {
        let dash = || "-".to_string();
        let line = match &row.state {
            State::Counted(planned) => {
                let result = results.get(counted);
                let was_deleted = deleted.and_then(|d| d.get(counted)).copied();
                counted += 1;
                let note = counted_notes(planned, row.tier.as_deref(), result.filter(|_| !reset));
                let key = planned.check.key.clone();
                if reset {
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
            State::Local | State::NotApplicable(_) => {
                let note = match &row.state {
                    State::NotApplicable(why) => why.clone(),
                    _ => LOCAL_NOTE.to_string(),
                };
                let blanks = if reset { 2 } else { 5 };
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
    out.extend(notes.iter().map(|note| format!("note: {note}")));
    out.join("\n")
}

fn render_json(
    rows: &[RuleRow],
    results: &[CheckResult],
    deleted: Option<&[bool]>,
    notes: &[String],
    reset: bool,
) -> String {
    let mut counted = 0;
    let rules: Vec<Value> = rows
        .iter()
        .map(|row| match &row.state {
            State::Counted(planned) => {
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
                if let Some(result) = results.get(counted) {
                    value["allowed"] = json!(result.allowed);
                    value["remaining"] = json!(result.remaining);
                    value["reset_ms"] = json!(result.reset_ms);
                    value["retry_after_ms"] = json!(result.retry_after_ms);
                }
                if let Some(was_deleted) = deleted.and_then(|d| d.get(counted)) {
                    value["deleted"] = json!(was_deleted);
                }
                counted += 1;
                value
            }
            State::Local => json!({ "rule": row.name, "status": "local", "note": LOCAL_NOTE }),
            State::NotApplicable(why) => {
                json!({ "rule": row.name, "status": "not_applicable", "note": why })
            }
        })
        .collect();
    let action = if reset { "reset" } else { "show" };
    json!({ "action": action, "rules": rules, "notes": notes }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    const CONFIG: &str = r#"{
        "shim_cluster": "shim",
        "rules": [
            {"name": "per-key", "key": [{"header": "x-api-key"}], "limit": 10, "period": "1m",
             "tiers": [{"name": "vip", "when": {"header": "x-api-key", "prefix": "vip:"}, "limit": 100}]},
            {"name": "per-envoy", "scope": "local", "key": ["client_ip"], "limit": 5, "period": "1s"},
            {"name": "search", "match": {"path_prefix": "/search"}, "key": ["client_ip"], "limit": 3, "period": "1m"},
            {"name": "per-user", "key": [{"jwt_claim": "sub"}], "limit": 3, "period": "1m"}
        ]
    }"#;

    fn args(flags: &[&str]) -> CountersArgs {
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: CountersArgs,
        }
        Wrapper::try_parse_from(["counters", "--config", "unused"].iter().chain(flags))
            .unwrap()
            .args
    }

    #[test]
    fn a_calendar_rule_shows_its_calendar_not_its_longest_period() {
        let config = FilterConfig::from_json(
            br#"{"shim_cluster": "shim", "rules": [
                {"name": "monthly", "key": ["client_ip"], "limit": 9, "calendar": "month", "utc_offset": "+05:30"},
                {"name": "minute", "key": ["client_ip"], "limit": 9, "period": "1m"}]}"#,
        )
        .unwrap();
        let given = given_request(&args(&["--client-ip", "192.0.2.1"]));
        let windows: Vec<String> = rule_rows(&config, &given, &[])
            .iter()
            .filter_map(|row| match &row.state {
                State::Counted(planned) => Some(window(&planned.check)),
                _ => None,
            })
            .collect();
        assert_eq!(windows, ["month (UTC+05:30)", "1m"]);
    }

    #[test]
    fn each_rule_is_counted_local_or_explained() {
        let config = FilterConfig::from_json(CONFIG.as_bytes()).unwrap();
        let given = given_request(&args(&[
            "--header",
            "X-Api-Key=vip:1",
            "--client-ip",
            "192.0.2.1",
        ]));
        let rows = rule_rows(&config, &given, &[]);
        let summary: Vec<(&str, String)> = rows
            .iter()
            .map(|row| {
                let state = match &row.state {
                    State::Counted(planned) => format!("{} {}", planned.check.key, planned.check.limit),
                    State::Local => "local".into(),
                    State::NotApplicable(why) => why.clone(),
                };
                (row.name.as_str(), state)
            })
            .collect();
        assert!(summary[0].1.starts_with("per-key/tb60000:{") && summary[0].1.ends_with(" 100"));
        assert_eq!(rows[0].tier.as_deref(), Some("vip"));
        assert_eq!(summary[1].1, "local");
        assert!(summary[2].1.contains("match"), "{summary:?}");
        assert!(summary[3].1.contains("claim sub"), "{summary:?}");
        // Only the rules asked for.
        let only = rule_rows(&config, &given, &["per-user".to_string()]);
        assert_eq!(only.len(), 1);
        // A claim names its value case and all, as a verified JWT would.
        let claimed = given_request(&args(&["--claim", "Sub=Alice"]));
        assert_eq!(claimed.jwt_claim("Sub").as_deref(), Some("Alice"));
        assert!(name_value("no-equals").is_err());
    }
}
