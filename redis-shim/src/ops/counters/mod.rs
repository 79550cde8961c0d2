//! `redis-shim counters show|reset`: one client's counters, for an operator on call ("why
//! is this client refused, how much has it left?", "unblock it now").
//!
//! The command reads the filter's plugin configuration and plans the request described
//! on its command line with the filter's own code (`ratelimit_rules::plan` over a
//! [`GivenRequest`]), so each rule's counter key is the key the filter sends, never a
//! reimplementation of it. It then asks a shim's admin endpoints ([`crate::ops::admin`]), over
//! HTTP with the admin token, for the counters' state (charging nothing) or to delete
//! them, and prints a table per rule, or JSON.

mod report;
mod rule_rows;

use super::admin::{
    ResetAnswer, ShowAnswer, VariantsAnswer, COUNTERS_RESET, COUNTERS_SHOW, COUNTERS_VARIANTS,
};
use clap::Subcommand;
use ratelimit_rules::attributes::GivenRequest;
use ratelimit_rules::config::FilterConfig;
use ratelimit_wire::{Check, CheckRequest, TOKEN_HEADER};
use report::{reset_notes, Report};
use rule_rows::{rule_rows, RuleState};
use std::path::PathBuf;
use std::time::Duration;

/// `redis-shim counters ...`.
#[derive(Subcommand, Debug)]
pub enum CountersCommand {
    /// Each rule's state for the request described (remaining, reset, retry-after),
    /// charging nothing.
    Show(CountersArgs),
    /// Deletes the request's counters: its next request meets full limits.
    Reset(CountersArgs),
}

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
            RuleState::Counted(planned) => Some(planned.check.clone()),
            _ => None,
        })
        .collect();
    let (results, deleted, variants, components) = if checks.is_empty() {
        (vec![], None, vec![], vec![])
    } else {
        let request = CheckRequest { checks };
        let variants: VariantsAnswer = call(args, COUNTERS_VARIANTS.path, &request)?;
        if reset {
            let answer: ResetAnswer = call(args, COUNTERS_RESET.path, &request)?;
            (answer.before, Some(answer.deleted), variants.variants, vec![])
        } else {
            let answer: ShowAnswer = call(args, COUNTERS_SHOW.path, &request)?;
            (answer.results, None, variants.variants, answer.components)
        }
    };
    let mut notes = reset_notes(&config, &rows, &results, reset);
    let counted = rows.iter().filter_map(|row| match &row.state {
        RuleState::Counted(_) => Some(row.name.as_str()),
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
    let report = Report {
        rows: &rows,
        results: &results,
        components: &components,
        deleted: deleted.as_deref(),
        notes: &notes,
        reset,
    };
    let output = if args.json { report.json() } else { report.table() };
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

#[cfg(test)]
mod tests {
    use super::report::window;
    use super::rule_rows::rule_rows;
    use super::*;
    use clap::Parser;
    use ratelimit_rules::attributes::RequestAttributes;

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
                RuleState::Counted(planned) => Some(window(&planned.check)),
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
                    RuleState::Counted(planned) => format!("{} {}", planned.check.key, planned.check.limit),
                    RuleState::Local => "local".into(),
                    RuleState::NotApplicable(why) => why.clone(),
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
