//! `response.headers`: the header dialects a listener's responses carry, by name, and the
//! combinations refused because two dialects would write one header in two forms.

use super::ConfigError;
use serde::Deserialize;

/// A header dialect: one way of telling clients their limit, which some client libraries
/// read. A filter instance sends the dialects its `response.headers` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HeaderDialect {
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset` as a Unix time (GitHub's form).
    XRateLimit,
    /// The same, `X-RateLimit-Reset` in seconds from now.
    XRateLimitSeconds,
    /// Envoy's rate-limit filter's `DRAFT_VERSION_03`: `X-RateLimit-Limit: 10, 10;w=60;
    /// name="rule"`, `-Remaining`, `-Reset` in seconds from now.
    EnvoyDraft03,
    /// draft-ietf-httpapi-ratelimit-headers-06: `RateLimit-Limit`, `-Remaining`, `-Reset`
    /// (seconds) and `RateLimit-Policy: 10;w=60` (express-rate-limit's `draft-6`).
    Draft6,
    /// draft-07: `RateLimit: limit=10, remaining=5, reset=30` and `RateLimit-Policy`.
    Draft7,
    /// draft-10: `RateLimit-Policy: "rule";q=10;w=60`, `RateLimit: "rule";r=5;t=30`, `t`
    /// the seconds until the counter is full again.
    Draft10,
    /// draft-11: -10's fields, `r` the available quota and `t` the effective window (no
    /// more than `r` may be used within it).
    Draft11,
    /// `Retry-After-Ms` on refusals: the wait in milliseconds (OpenAI's clients read it).
    RetryAfterMs,
}

pub const RETRY_AFTER_HEADER: &str = "retry-after";
pub const RETRY_AFTER_MS_HEADER: &str = "retry-after-ms";
pub const POLICY_HEADER: &str = "ratelimit-policy";
pub const RATELIMIT_HEADER: &str = "ratelimit";
const DRAFT6_LIMIT_HEADER: &str = "ratelimit-limit";
const DRAFT6_REMAINING_HEADER: &str = "ratelimit-remaining";
const DRAFT6_RESET_HEADER: &str = "ratelimit-reset";

/// How one dialect writes one header: two dialects may share a header only in the same
/// form (draft-6 and draft-7 write one `RateLimit-Policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    Limit,
    Remaining,
    UnixTime,
    Seconds,
    Milliseconds,
    EnvoyQuotaPolicy,
    LegacyPolicy,
    CombinedDraft7,
    StructuredPolicy,
    StructuredDraft10,
    StructuredDraft11,
}

/// The headers a dialect writes, by lower-case name, and in which form; `x_names` are the
/// configured names of the `X-RateLimit-*` headers (limit, remaining, reset).
fn headers_of(dialect: HeaderDialect, x_names: [&str; 3]) -> Vec<(String, Form)> {
    let [limit, remaining, reset] = x_names;
    let named = |pairs: &[(&str, Form)]| pairs.iter().map(|(n, f)| (n.to_string(), *f)).collect();
    match dialect {
        HeaderDialect::XRateLimit => named(&[
            (limit, Form::Limit),
            (remaining, Form::Remaining),
            (reset, Form::UnixTime),
        ]),
        HeaderDialect::XRateLimitSeconds => named(&[
            (limit, Form::Limit),
            (remaining, Form::Remaining),
            (reset, Form::Seconds),
        ]),
        HeaderDialect::EnvoyDraft03 => named(&[
            (limit, Form::EnvoyQuotaPolicy),
            (remaining, Form::Remaining),
            (reset, Form::Seconds),
        ]),
        HeaderDialect::Draft6 => named(&[
            (DRAFT6_LIMIT_HEADER, Form::Limit),
            (DRAFT6_REMAINING_HEADER, Form::Remaining),
            (DRAFT6_RESET_HEADER, Form::Seconds),
            (POLICY_HEADER, Form::LegacyPolicy),
        ]),
        HeaderDialect::Draft7 => named(&[
            (RATELIMIT_HEADER, Form::CombinedDraft7),
            (POLICY_HEADER, Form::LegacyPolicy),
        ]),
        HeaderDialect::Draft10 => named(&[
            (RATELIMIT_HEADER, Form::StructuredDraft10),
            (POLICY_HEADER, Form::StructuredPolicy),
        ]),
        HeaderDialect::Draft11 => named(&[
            (RATELIMIT_HEADER, Form::StructuredDraft11),
            (POLICY_HEADER, Form::StructuredPolicy),
        ]),
        HeaderDialect::RetryAfterMs => named(&[(RETRY_AFTER_MS_HEADER, Form::Milliseconds)]),
    }
}

/// One dialect's name or a list of them.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum RawHeaders {
    One(String),
    Many(Vec<String>),
}

impl Default for RawHeaders {
    fn default() -> Self {
        RawHeaders::One("x-ratelimit".into())
    }
}

const DIALECTS: [(&str, HeaderDialect); 8] = [
    ("x-ratelimit", HeaderDialect::XRateLimit),
    ("x-ratelimit-seconds", HeaderDialect::XRateLimitSeconds),
    ("envoy-draft-03", HeaderDialect::EnvoyDraft03),
    ("draft-6", HeaderDialect::Draft6),
    ("draft-7", HeaderDialect::Draft7),
    ("draft-10", HeaderDialect::Draft10),
    ("draft-11", HeaderDialect::Draft11),
    ("retry-after-ms", HeaderDialect::RetryAfterMs),
];

/// Names of several dialects (or none), with what to warn of when one is used: the ones
/// kept from before dialects could be listed say what they mean now.
const ALIASES: [(&str, &[HeaderDialect], Option<&str>); 3] = [
    ("ietf-draft", &[HeaderDialect::Draft10], Some("\"draft-10\"")),
    (
        "both",
        &[HeaderDialect::XRateLimit, HeaderDialect::Draft10],
        Some("[\"x-ratelimit\", \"draft-10\"]; ratelimit-header-parser (npm) and ratelimit-headers (PyPI) read no numbers from it, see docs/CONFIG.md for a combination they read"),
    ),
    ("none", &[], None),
];

/// The dialects `raw` names, in its order, each once; `x_names` are the configured
/// `X-RateLimit-*` header names. Refuses an unknown name and two dialects writing one
/// header differently (say `draft-7` and `draft-10`, both a `RateLimit` field).
pub(super) fn compile(
    raw: RawHeaders,
    x_names: [&str; 3],
    warnings: &mut Vec<String>,
) -> Result<Vec<HeaderDialect>, ConfigError> {
    let names = match raw {
        RawHeaders::One(name) => vec![name],
        RawHeaders::Many(names) => names,
    };
    let mut dialects: Vec<HeaderDialect> = Vec::new();
    for name in &names {
        let named = if let Some((_, dialect)) = DIALECTS.iter().find(|(n, _)| n == name) {
            vec![*dialect]
        } else if let Some((_, meant, warning)) = ALIASES.iter().find(|(n, _, _)| n == name) {
            if let Some(now) = warning {
                warnings.push(format!("response.headers: {name:?} is {now}"));
            }
            meant.to_vec()
        } else {
            let known: Vec<&str> = DIALECTS.iter().map(|(n, _)| *n).chain(["none"]).collect();
            return Err(ConfigError::new(
                "response.headers",
                format!(
                    "unknown dialect {name:?}: one of {}, or a list of them",
                    known.join(", ")
                ),
            ));
        };
        for dialect in named {
            if !dialects.contains(&dialect) {
                dialects.push(dialect);
            }
        }
    }
    let mut written: Vec<(String, Form, HeaderDialect)> = Vec::new();
    for &dialect in &dialects {
        for (header, form) in headers_of(dialect, x_names) {
            if let Some((_, _, other)) = written.iter().find(|(h, f, _)| *h == header && *f != form) {
                return Err(ConfigError::new(
                    "response.headers",
                    format!(
                        "{} and {} both write {header} in different forms: choose one",
                        name_of(*other),
                        name_of(dialect)
                    ),
                ));
            }
            written.push((header, form, dialect));
        }
    }
    Ok(dialects)
}

/// Every header `dialects` write and its form, once each, in order: what a response
/// gets, worked out once when the configuration loads.
pub fn written_headers(dialects: &[HeaderDialect], x_names: [&str; 3]) -> Vec<(String, Form)> {
    let mut written: Vec<(String, Form)> = Vec::new();
    for &dialect in dialects {
        for (header, form) in headers_of(dialect, x_names) {
            if !written.iter().any(|(name, _)| *name == header) {
                written.push((header, form));
            }
        }
    }
    written
}

fn name_of(dialect: HeaderDialect) -> &'static str {
    DIALECTS
        .iter()
        .find(|(_, d)| *d == dialect)
        .map_or("?", |(name, _)| name)
}

/// Whether a dialect announces windows in whole seconds (`w=60`), so that a period not a
/// whole number of seconds would be announced wrong.
pub(super) fn announces_windows(dialects: &[HeaderDialect]) -> bool {
    dialects.iter().any(|d| {
        matches!(
            d,
            HeaderDialect::EnvoyDraft03
                | HeaderDialect::Draft6
                | HeaderDialect::Draft7
                | HeaderDialect::Draft10
                | HeaderDialect::Draft11
        )
    })
}
