//! The monitoring shipped in `deploy/monitoring/`: promtool accepts the rules and their unit
//! tests pass; every alert is tested firing, carries a severity and a runbook that exists;
//! the dashboard is well formed; and every metric that an alert, a recording rule or a
//! dashboard query names is one a running stack really exports. That stack is the demo's
//! policy in real Envoy, delivered as Istio delivers it (the listener by LDS, the filter by
//! ECDS), the real shim and Redis; it also shows the "configuration refused" signal move
//! on a refused filter configuration.
//!
//! PromQL is not parsed in full: a query's selectors are found by a small tokenizer (a
//! name not followed by `(`, or a `{...}` naming `__name__`), which its own test covers.

mod support;

use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use support::*;

const RULES: &str = "deploy/monitoring/alerts.yml";
const RULE_TESTS: &str = "deploy/monitoring/alerts_test.yml";
const DASHBOARD: &str = "deploy/monitoring/dashboard.json";
const README: &str = "deploy/monitoring/README.md";

fn read(relative: &str) -> String {
    fs::read_to_string(repo_root().join(relative)).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

fn promtool(args: &[&str]) -> (bool, String) {
    let output = Command::new("promtool")
        .args(args)
        .current_dir(repo_root())
        .output()
        .unwrap_or_else(|e| panic!("promtool: {e} (scripts/setup.sh installs it)"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

#[test]
fn promtool_accepts_the_rules() {
    let (ok, output) = promtool(&["check", "rules", RULES]);
    assert!(ok && output.contains("SUCCESS"), "{output}");
}

#[test]
fn the_alerts_unit_tests_pass() {
    let (ok, output) = promtool(&["test", "rules", RULE_TESTS]);
    assert!(ok && output.contains("SUCCESS"), "{output}");
}

/// Every rule of alerts.yml, alerting and recording.
fn rules() -> Vec<Value> {
    let file = yaml_file(&repo_root().join(RULES));
    file["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|group| group["rules"].as_array().unwrap().clone())
        .collect()
}

fn alerts() -> Vec<Value> {
    rules().into_iter().filter(|r| r["alert"].is_string()).collect()
}

#[test]
fn every_alert_is_tested_firing_and_says_what_to_do() {
    let tests = yaml_file(&repo_root().join(RULE_TESTS));
    let cases: Vec<&Value> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|test| test["alert_rule_test"].as_array().into_iter().flatten())
        .collect();
    let readme = read(README);
    let alerts = alerts();
    assert!(alerts.len() >= 10, "{} alerts", alerts.len());
    for alert in &alerts {
        let name = alert["alert"].as_str().unwrap();
        assert!(alert["for"].is_string(), "{name}: no `for`");
        let severity = alert["labels"]["severity"].as_str().unwrap_or("");
        assert!(
            ["critical", "warning"].contains(&severity),
            "{name}: severity {severity:?}"
        );
        assert!(alert["labels"]["component"].is_string(), "{name}: no component");
        for annotation in ["summary", "description", "runbook_url"] {
            assert!(
                alert["annotations"][annotation]
                    .as_str()
                    .is_some_and(|text| !text.is_empty()),
                "{name}: no {annotation}"
            );
        }
        // The runbook is a section of the README, named after the alert.
        assert_eq!(
            alert["annotations"]["runbook_url"],
            format!("{README}#{}", name.to_lowercase()),
            "{name}"
        );
        assert!(
            readme.contains(&format!("\n### {name}\n")),
            "{README} has no section `### {name}`"
        );
        let fires = cases.iter().any(|case| {
            case["alertname"] == name
                && case["exp_alerts"]
                    .as_array()
                    .is_some_and(|expected| !expected.is_empty())
        });
        assert!(fires, "{RULE_TESTS} never shows {name} firing");
    }
}

#[test]
fn every_recorded_series_is_tested() {
    let tests = yaml_file(&repo_root().join(RULE_TESTS));
    let tested: BTreeSet<&str> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|test| test["promql_expr_test"].as_array().into_iter().flatten())
        .filter_map(|case| case["expr"].as_str())
        .collect();
    for rule in rules() {
        if let Some(record) = rule["record"].as_str() {
            assert!(tested.contains(record), "{RULE_TESTS} does not test {record}");
        }
    }
}

#[test]
fn the_dashboard_is_well_formed() {
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).unwrap();
    assert_eq!(dashboard["uid"], "ratelimit-wasm");
    let mut ids = BTreeSet::new();
    let panels = dashboard_panels(&dashboard);
    assert!(panels.len() >= 15, "{} panels", panels.len());
    for panel in &panels {
        let title = panel["title"].as_str().unwrap();
        assert!(ids.insert(panel["id"].as_u64().unwrap()), "{title}: id taken");
        let position = &panel["gridPos"];
        let (x, w) = (position["x"].as_u64().unwrap(), position["w"].as_u64().unwrap());
        assert!(x + w <= 24, "{title}: wider than the grid");
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        assert!(panel["description"].is_string(), "{title}: no description");
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}: no query");
        let refs: BTreeSet<&str> = targets.iter().map(|t| t["refId"].as_str().unwrap()).collect();
        assert_eq!(refs.len(), targets.len(), "{title}: refIds repeat");
    }
    // Every variable a query uses is defined.
    let defined: BTreeSet<String> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect();
    for (place, query) in dashboard_queries(&dashboard) {
        for variable in variables_in(&query) {
            assert!(
                variable.starts_with("__") || defined.contains(&variable),
                "{place}: ${variable} is not a dashboard variable"
            );
        }
    }
}

/// Every panel, those inside rows included.
fn dashboard_panels(dashboard: &Value) -> Vec<Value> {
    let mut panels = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        panels.push(panel.clone());
        panels.extend(panel["panels"].as_array().into_iter().flatten().cloned());
    }
    panels
}

/// (where, PromQL) of every dashboard query: panel targets and variable queries (the
/// metric of `label_values(METRIC, LABEL)`).
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut queries = Vec::new();
    for panel in dashboard_panels(dashboard) {
        for target in panel["targets"].as_array().into_iter().flatten() {
            queries.push((
                format!(
                    "dashboard panel {:?} query {}",
                    panel["title"].as_str().unwrap(),
                    target["refId"].as_str().unwrap()
                ),
                target["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        let Some(query) = variable["query"]["query"].as_str() else {
            continue;
        };
        let inner = query
            .strip_prefix("label_values(")
            .and_then(|rest| rest.rsplit_once(','))
            .map(|(metric, _label)| metric.trim().to_string())
            .unwrap_or_else(|| panic!("variable query {query:?}: only label_values(METRIC, LABEL)"));
        queries.push((
            format!("dashboard variable ${}", variable["name"].as_str().unwrap()),
            inner,
        ));
    }
    queries
}

/// Grafana variables (`$name`, `${name}`) in a query.
fn variables_in(query: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = query;
    while let Some(at) = rest.find('$') {
        rest = &rest[at + 1..];
        let braced = rest.strip_prefix('{');
        let text = braced.unwrap_or(rest);
        let name: String = text
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() && !name.chars().all(|c| c.is_ascii_digit()) {
            found.push(name);
        }
    }
    found
}

// ---- Which metrics a query names ----

/// How a selector names its metric.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Name {
    Exact(String),
    /// A `__name__=~"..."` matcher: a fully anchored regular expression.
    Pattern(String),
}

/// A series selector: its metric, and its label matchers of the form `label="literal"`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Selector {
    name: Name,
    labels: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Str(String),
    /// A number or a duration.
    Number,
    /// A Grafana variable.
    Variable,
    Punct(String),
}

fn tokens(query: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = query.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '"' || c == '\'' || c == '`' {
            let mut value = String::new();
            i += 1;
            while i < chars.len() && chars[i] != c {
                if chars[i] == '\\' && c != '`' && i + 1 < chars.len() {
                    i += 1;
                }
                value.push(chars[i]);
                i += 1;
            }
            if i == chars.len() {
                return Err(format!("unterminated string in {query:?}"));
            }
            i += 1;
            out.push(Token::Str(value));
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            out.push(Token::Ident(chars[start..i].iter().collect()));
        } else if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
            out.push(Token::Number);
        } else if c == '$' {
            i += 1;
            if chars.get(i) == Some(&'{') {
                while i < chars.len() && chars[i] != '}' {
                    i += 1;
                }
                i += 1;
            } else {
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
            }
            out.push(Token::Variable);
        } else {
            let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
            let op = if ["=~", "!~", "!=", "==", "<=", ">="].contains(&two.as_str()) {
                two
            } else {
                c.to_string()
            };
            i += op.chars().count();
            out.push(Token::Punct(op));
        }
    }
    Ok(out)
}

/// Keywords that take a parenthesised list of label names.
const LABEL_LIST_KEYWORDS: [&str; 6] = ["by", "without", "on", "ignoring", "group_left", "group_right"];
/// Other words that are not metric names.
const KEYWORDS: [&str; 8] = ["bool", "offset", "and", "or", "unless", "atan2", "inf", "nan"];

/// Every series selector in a PromQL query.
fn selectors(query: &str) -> Result<Vec<Selector>, String> {
    let tokens = tokens(query)?;
    let punct = |i: usize, p: &str| matches!(tokens.get(i), Some(Token::Punct(q)) if q == p);
    for (open, close) in [("(", ")"), ("{", "}"), ("[", "]")] {
        let count = |p: &str| (0..tokens.len()).filter(|i| punct(*i, p)).count();
        if count(open) != count(close) {
            return Err(format!("unbalanced {open}{close} in {query:?}"));
        }
    }
    let skip_group = |mut i: usize, open: &str, close: &str| -> Result<usize, String> {
        let mut depth = 0;
        loop {
            match tokens.get(i) {
                Some(Token::Punct(p)) if p == open => depth += 1,
                Some(Token::Punct(p)) if p == close => {
                    depth -= 1;
                    if depth == 0 {
                        return Ok(i + 1);
                    }
                }
                None => return Err(format!("unbalanced {open}{close} in {query:?}")),
                _ => {}
            }
            i += 1;
        }
    };
    let mut found = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            Token::Ident(word) if LABEL_LIST_KEYWORDS.contains(&word.to_lowercase().as_str()) => {
                i = if punct(i + 1, "(") {
                    skip_group(i + 1, "(", ")")?
                } else {
                    i + 1
                };
            }
            Token::Ident(word) if KEYWORDS.contains(&word.to_lowercase().as_str()) => i += 1,
            // A function, or an aggregation (`sum(...)`, `sum by (...) (...)`).
            Token::Ident(_)
                if punct(i + 1, "(")
                    || matches!(tokens.get(i + 1), Some(Token::Ident(next))
                        if ["by", "without"].contains(&next.to_lowercase().as_str())) =>
            {
                i += 1
            }
            Token::Ident(word) => {
                let mut selector = Selector {
                    name: Name::Exact(word.clone()),
                    labels: Vec::new(),
                };
                i += 1;
                if punct(i, "{") {
                    let end = skip_group(i, "{", "}")?;
                    matchers(&tokens[i + 1..end - 1], &mut selector, query)?;
                    i = end;
                }
                found.push(selector);
            }
            Token::Punct(p) if p == "{" => {
                let end = skip_group(i, "{", "}")?;
                let mut selector = Selector {
                    name: Name::Exact(String::new()),
                    labels: Vec::new(),
                };
                matchers(&tokens[i + 1..end - 1], &mut selector, query)?;
                if selector.name == Name::Exact(String::new()) {
                    return Err(format!("a selector without a metric name in {query:?}"));
                }
                found.push(selector);
                i = end;
            }
            Token::Punct(p) if p == "[" => i = skip_group(i, "[", "]")?,
            _ => i += 1,
        }
    }
    Ok(found)
}

/// Reads `label op "value", ...` into `selector`.
fn matchers(tokens: &[Token], selector: &mut Selector, query: &str) -> Result<(), String> {
    for matcher in tokens.split(|t| *t == Token::Punct(",".into())) {
        let [Token::Ident(label), Token::Punct(op), Token::Str(value)] = matcher else {
            if matcher.is_empty() {
                continue;
            }
            return Err(format!("cannot read the matcher {matcher:?} in {query:?}"));
        };
        match (label.as_str(), op.as_str()) {
            ("__name__", "=") => selector.name = Name::Exact(value.clone()),
            ("__name__", "=~") => selector.name = Name::Pattern(value.clone()),
            // Narrows a name pattern: names it leaves out need not exist.
            ("__name__", _) => {}
            (_, "=") if !value.contains('$') => selector.labels.push((label.clone(), value.clone())),
            _ => {}
        }
    }
    Ok(())
}

/// Whether a name matches a `__name__` pattern, which may use only literal characters
/// and the wildcards `.*` and `.+` (what alerts.yml needs).
fn name_matches(pattern: &str, name: &str) -> Result<bool, String> {
    #[derive(Clone, Copy)]
    enum Part {
        Char(char),
        Any { at_least_one: bool },
    }
    let mut parts = Vec::new();
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '.' if chars.peek() == Some(&'*') || chars.peek() == Some(&'+') => {
                let at_least_one = chars.next() == Some('+');
                parts.push(Part::Any { at_least_one });
            }
            '\\' => parts.push(Part::Char(chars.next().ok_or("a trailing \\")?)),
            c if "^$.|?*+()[]{}".contains(c) => {
                return Err(format!(
                    "{pattern:?}: only literal characters, .* and .+ are understood here"
                ))
            }
            c => parts.push(Part::Char(c)),
        }
    }
    fn matches(parts: &[Part], name: &[char]) -> bool {
        match parts.split_first() {
            None => name.is_empty(),
            Some((Part::Char(c), rest)) => name.first() == Some(c) && matches(rest, &name[1..]),
            Some((Part::Any { at_least_one }, rest)) => {
                let first = usize::from(*at_least_one);
                (first..=name.len()).any(|skip| matches(rest, &name[skip..]))
            }
        }
    }
    let name: Vec<char> = name.chars().collect();
    Ok(matches(&parts, &name))
}

#[test]
fn selectors_are_found_in_the_queries_shapes_used_here() {
    let exact = |name: &str, labels: &[(&str, &str)]| Selector {
        name: Name::Exact(name.into()),
        labels: labels
            .iter()
            .map(|(l, v)| (l.to_string(), v.to_string()))
            .collect(),
    };
    let pattern = |p: &str| Selector {
        name: Name::Pattern(p.into()),
        labels: vec![],
    };
    let cases: Vec<(&str, Vec<Selector>)> = vec![
        ("up", vec![exact("up", &[])]),
        (
            r#"sum by (job, instance) (rate(rlshim_requests_total{outcome="redis_error"}[5m])) / sum by (job, instance) (rate(rlshim_requests_total[5m])) > 0.01"#,
            vec![
                exact("rlshim_requests_total", &[("outcome", "redis_error")]),
                exact("rlshim_requests_total", &[]),
            ],
        ),
        (
            r#"label_replace({__name__=~"ratelimit_.+_denied", __name__!~"ratelimit_.+_shadow_denied"}, "rule", "$1", "__name__", "ratelimit_(.+)_denied")"#,
            vec![pattern("ratelimit_.+_denied")],
        ),
        (
            "histogram_quantile(0.99, sum by (le) (rate(ratelimit_shim_call_us_bucket[$__rate_interval])))",
            vec![exact("ratelimit_shim_call_us_bucket", &[])],
        ),
        (
            r#"sum by (rule) (rate(ratelimit:denied{rule=~"$rule"}[5m])) / on (rule) group_left sum without (instance) (ratelimit:allowed offset 1h) * 2 > bool 1e3"#,
            vec![exact("ratelimit:denied", &[]), exact("ratelimit:allowed", &[])],
        ),
        (
            r#"max_over_time(rlshim_in_flight{job="shim", instance="${instance}"}[5m:30s]) and envoy_server_live{}"#,
            vec![
                exact("rlshim_in_flight", &[("job", "shim")]),
                exact("envoy_server_live", &[]),
            ],
        ),
        (
            r#"{__name__="envoy_server_live", instance='a\'b'}"#,
            vec![exact("envoy_server_live", &[("instance", "a'b")])],
        ),
    ];
    for (query, expected) in cases {
        assert_eq!(selectors(query).unwrap(), expected, "{query}");
    }
    for broken in ["sum(rate(x[5m])", r#"{job="x"}"#, r#"x{job=~}"#, r#"x{job="a}"#] {
        assert!(selectors(broken).is_err(), "{broken} should not be read");
    }

    assert!(name_matches("ratelimit_.+_allowed", "ratelimit_per_ip_allowed").unwrap());
    assert!(!name_matches("ratelimit_.+_allowed", "ratelimit__allowed").unwrap());
    assert!(!name_matches("ratelimit_.+_allowed", "ratelimit_per_ip_allowed_total").unwrap());
    assert!(name_matches("envoy_wasm_.*ratelimit_x", "envoy_wasm_ratelimit_x").unwrap());
    assert!(name_matches("envoy_wasm_.*ratelimit_x", "envoy_wasm_istio_system_ratelimit_x").unwrap());
    assert!(name_matches(r"a\.b", "a.b").unwrap());
    assert!(name_matches("a|b", "a").is_err());
    assert_eq!(
        variables_in("x[$__rate_interval] $rule ${datasource} $1"),
        ["__rate_interval", "rule", "datasource"]
    );
}

// ---- Against a running stack ----

/// Series of a Prometheus text exposition: name -> the label sets it has.
type Scrape = BTreeMap<String, Vec<BTreeMap<String, String>>>;

fn parse_exposition(text: &str, into: &mut Scrape) {
    for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
        let mut labels = BTreeMap::new();
        if line[name_end..].starts_with('{') {
            let body = &line[name_end + 1..line.rfind('}').unwrap()];
            let mut rest = body;
            while let Some(eq) = rest.find("=\"") {
                let label = rest[..eq].trim_start_matches(',').trim().to_string();
                let mut value = String::new();
                let mut chars = rest[eq + 2..].char_indices();
                let mut end = 0;
                while let Some((at, c)) = chars.next() {
                    match c {
                        '\\' => value.push(chars.next().map_or('\\', |(_, c)| c)),
                        '"' => {
                            end = eq + 2 + at + 1;
                            break;
                        }
                        c => value.push(c),
                    }
                }
                labels.insert(label, value);
                rest = &rest[end..];
            }
        }
        into.entry(name.to_string()).or_default().push(labels);
    }
}

fn value_of(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

/// The filter's plugin settings (Envoy's `PluginConfig`) from envoy.yaml, loading the
/// built module.
fn demo_plugin() -> Value {
    let demo = yaml_file(&repo_root().join("envoy.yaml"));
    let filter = &demo["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        ["http_filters"][0]["typed_config"];
    assert_eq!(
        filter["@type"],
        "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
    );
    let mut plugin = filter.clone();
    plugin["config"]["vm_config"]["code"]["local"]["filename"] = json!(wasm_path());
    plugin
}

/// Writes `value` to `path` as Envoy's file-based xDS wants it: a whole new file, moved in.
fn write_resources(path: &Path, resources: Value) {
    let staging = path.with_extension("staging");
    fs::write(
        &staging,
        serde_json::to_vec(&json!({ "resources": [resources] })).unwrap(),
    )
    .unwrap();
    fs::rename(&staging, path).unwrap();
}

fn ecds_resource(plugin: &Value) -> Value {
    json!({
        "@type": "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
        "name": "ratelimit",
        "typed_config": plugin
    })
}

#[test]
fn every_query_names_metrics_a_running_stack_exports() {
    let redis = Redis::start();
    let mut shim = Shim::start(&redis.url(), &[]);

    // The demo's bootstrap and policy, the listener by LDS and the filter by ECDS.
    let dir = scratch("monitoring");
    let (lds, ecds) = (dir.join("lds.json"), dir.join("ecds.json"));
    let file_source = |path: &Path| json!({ "path_config_source": { "path": path, "watched_directory": { "path": &dir } } });
    // Without the deny cache the shim itself refuses the 4th search below, so that its
    // `denied` series exists: with it, this Envoy refuses alone, knowing that the 3rd
    // took the last token.
    let mut plugin = demo_plugin();
    let value = plugin["config"]["configuration"]["value"].as_str().unwrap();
    let mut policy: Value = serde_json::from_str(value).unwrap();
    policy["deny_cache"] = json!(false);
    plugin["config"]["configuration"]["value"] = json!(policy.to_string());
    write_resources(&ecds, ecds_resource(&plugin));
    let mut bootstrap = envoy_config(shim.port, &json!({}));
    let mut listener = bootstrap["static_resources"]["listeners"][0].take();
    listener["@type"] = json!("type.googleapis.com/envoy.config.listener.v3.Listener");
    listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"][0] = json!({
        "name": "ratelimit",
        "config_discovery": {
            "config_source": file_source(&ecds),
            "type_urls": ["type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"]
        }
    });
    write_resources(&lds, listener);
    bootstrap["static_resources"]["listeners"] = json!([]);
    bootstrap["node"] = json!({ "id": "monitoring", "cluster": "monitoring" });
    bootstrap["dynamic_resources"] = json!({ "lds_config": file_source(&lds) });
    let envoy = Envoy::start_bootstrap(&bootstrap);

    // Allowed and refused: the demo's search rule admits 3 a minute.
    let search: Vec<u16> = (0..4).map(|_| get(&envoy.url("/search"), &[]).status).collect();
    assert_eq!(search, [200, 200, 200, 429], "{}", envoy.process.log_text());

    // A configuration the filter refuses is refused whole; the previous one goes on.
    let mut refused = plugin.clone();
    let config = refused["config"]["configuration"]["value"].as_str().unwrap();
    let mut policy: Value = serde_json::from_str(config).unwrap();
    policy["rules"][2]["limit"] = json!(0);
    refused["config"]["configuration"]["value"] = json!(policy.to_string());
    write_resources(&ecds, ecds_resource(&refused));
    let admin = |path: &str| get(&format!("http://127.0.0.1:{}{path}", envoy.admin_port), &[]).body;
    let config_fail = "envoy_extension_config_discovery_http_filter_ratelimit_config_fail{}";
    wait_until(
        "the refused configuration counted",
        Duration::from_secs(30),
        || value_of(&admin("/stats/prometheus"), config_fail) >= 1.0,
    );
    assert!(
        envoy.process.log_text().contains("rules[2].limit"),
        "{}",
        envoy.process.log_text()
    );
    assert_eq!(get(&envoy.url("/search"), &[]).status, 429);

    let mut scrape = Scrape::new();
    let shim_text = get(&shim.url("/metrics"), &[]).body;
    assert!(
        value_of(
            &shim_text,
            "rlshim_requests_total{endpoint=\"check\",outcome=\"denied\"}"
        ) >= 1.0
    );
    parse_exposition(&shim_text, &mut scrape);
    // A shim of several regions adds its replication's series, a peer's even while it
    // is out of reach (here, a port nothing listens on).
    let unreachable = claim_port();
    let peer = format!("b=redis://127.0.0.1:{}", unreachable.port);
    let regional = Shim::start(&redis.url(), &["--region", "a", "--peer-region", &peer]);
    parse_exposition(&get(&regional.url("/metrics"), &[]).body, &mut scrape);

    // A check failing to a dead shim: the demo fails open.
    shim.kill();
    let reply = get(&envoy.url("/"), &[("x-api-key", "monitoring")]);
    assert_eq!(reply.status, 200, "{reply:?}");
    let envoy_text = admin("/stats/prometheus");
    assert!(value_of(&envoy_text, "ratelimit_per_api_key_failed_open{}") >= 1.0);
    assert!(value_of(&envoy_text, "ratelimit_search_denied{}") >= 1.0);
    parse_exposition(&envoy_text, &mut scrape);

    // What the queries may name: exported series, and the series alerts.yml records.
    let recorded: BTreeSet<String> = rules()
        .iter()
        .filter_map(|rule| rule["record"].as_str().map(str::to_string))
        .collect();
    let mut queries: Vec<(String, String)> = rules()
        .iter()
        .map(|rule| {
            let name = rule["alert"].as_str().or(rule["record"].as_str()).unwrap();
            (
                format!("{RULES} {name}"),
                rule["expr"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).unwrap();
    queries.extend(dashboard_queries(&dashboard));

    let mut unknown = Vec::new();
    let mut named = 0;
    for (place, query) in &queries {
        let found = selectors(query).unwrap_or_else(|e| panic!("{place}: {e}"));
        assert!(!found.is_empty(), "{place}: no metric in {query:?}");
        for selector in found {
            named += 1;
            match &selector.name {
                Name::Exact(name) if recorded.contains(name) => {}
                Name::Exact(name) => match scrape.get(name) {
                    None => unknown.push(format!("{place}: {name} is not exported")),
                    Some(series) => {
                        for (label, value) in &selector.labels {
                            if !series.iter().any(|s| s.get(label) == Some(value)) {
                                unknown.push(format!("{place}: no {name} has {label}=\"{value}\""));
                            }
                        }
                    }
                },
                Name::Pattern(pattern) => {
                    let mut any = false;
                    for name in scrape.keys().chain(&recorded) {
                        any |= name_matches(pattern, name).unwrap_or_else(|e| panic!("{place}: {e}"));
                    }
                    if !any {
                        unknown.push(format!("{place}: no exported metric matches {pattern:?}"));
                    }
                }
            }
        }
    }
    assert!(named > 50, "only {named} selectors found");
    assert!(unknown.is_empty(), "{}", unknown.join("\n"));
}
