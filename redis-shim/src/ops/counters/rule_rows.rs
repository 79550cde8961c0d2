//! What each rule of the filter's configuration makes of the request an operator
//! described: counted by the shim (and under which key), local to each Envoy, or not
//! applicable, and why. Planned with the filter's own code, so a counted rule's key is
//! the key the filter sends.

use ratelimit_rules::attributes::{GivenRequest, RequestAttributes};
use ratelimit_rules::config::{FilterConfig, Rule, Scope};
use ratelimit_rules::keys::{part_value, KeyPart};
use ratelimit_rules::plan::{plan, tier_for, PlannedCheck};

/// What one rule makes of the request described.
pub enum RuleState {
    /// Counted by the shim, in `check.key`.
    Counted(Box<PlannedCheck>),
    /// A per-Envoy bucket: nothing in Redis.
    Local,
    /// The rule does not apply to the request: why.
    NotApplicable(String),
}

/// One rule of the configuration, as the command reports it.
pub struct RuleRow {
    pub name: String,
    /// The tier that sets the client's limit, if one does.
    pub tier: Option<String>,
    pub state: RuleState,
}

fn describe(part: &KeyPart) -> String {
    match part {
        KeyPart::Header(name) => format!("header {name} (--header {name}=...)"),
        KeyPart::ClientIp => "client IP (--client-ip)".into(),
        KeyPart::JwtClaim(claim) => format!("claim {claim} (--claim {claim}=...)"),
        KeyPart::Path => "path".into(),
        KeyPart::Method => "method".into(),
        KeyPart::Constant(_) => "constant".into(),
        KeyPart::ApiKey(sources) => format!(
            "API key ({}: --header NAME=...)",
            ratelimit_rules::keys::describe_sources(sources)
        ),
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

/// The rules (only those named in `only`, if any) and what each makes of `request`.
pub fn rule_rows(config: &FilterConfig, request: &GivenRequest, only: &[String]) -> Vec<RuleRow> {
    let planned = plan(config, request);
    let hops = config.xff_num_trusted_hops;
    config
        .rules
        .iter()
        .enumerate()
        .filter(|(_, rule)| only.is_empty() || only.contains(&rule.name))
        .map(|(index, rule)| {
            let state = match planned.iter().find(|p| p.rule_index == index) {
                Some(_) if rule.scope == Scope::Local => RuleState::Local,
                Some(check) => RuleState::Counted(Box::new(check.clone())),
                None => RuleState::NotApplicable(why_not(rule, request, hops)),
            };
            RuleRow {
                name: rule.name.clone(),
                tier: tier_for(rule, request, hops).map(|tier| tier.name.clone()),
                state,
            }
        })
        .collect()
}
