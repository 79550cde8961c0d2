//! What the shim runs with: [`ShimConfig`], and the checks that refuse a configuration
//! the shim cannot run safely with before anything is served.

use crate::decide::rls::loading::ConfigFiles;
use crate::decide::rls::settings::Settings;
use crate::store::redis_connection::RedisConfig;
use crate::store::regions::RegionFlags;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Longest key prefix accepted.
pub const MAX_PREFIX_LEN: usize = 64;

/// Everything the shim needs to run.
#[derive(Debug, Clone)]
pub struct ShimConfig {
    pub redis: RedisConfig,
    /// Prefix of every key the shim writes.
    pub key_prefix: String,
    /// Shared token callers must send in `x-ratelimit-token`, if set.
    pub token: Option<String>,
    /// The token the admin endpoints (`/v1/admin/...`) require, if not `token`. With
    /// neither set they are refused: they read and reset any client's counters.
    pub admin_token: Option<String>,
    /// Whether `/metrics` and `/readyz` require the token too (`/healthz` never does).
    pub token_for_operators: bool,
    /// Most requests with a body (checks, admin calls) answered at once; more are
    /// answered 503 at once.
    pub max_in_flight: usize,
    /// Most connections open at once (see `connection_cap.rs` beside this file).
    pub max_connections: usize,
    /// Longest wait for a connection's first request (its headers included).
    pub header_timeout: Duration,
    /// Longest wait for a request's body (a check's or an admin call's).
    pub body_timeout: Duration,
    /// Longest the shim waits for checks in flight after the shutdown signal.
    pub shutdown_timeout: Duration,
    /// Envoy's rate-limit service too, when set (`crate::decide::rls`).
    pub rls: Option<RlsOptions>,
    /// This shim's region and its peers, when it serves several (docs/REGIONS.md), as
    /// flagged: [`ShimConfig::validate`] parses them.
    pub regions: RegionFlags,
}

/// Where the rate-limit service listens and its configuration (a file or a directory).
#[derive(Debug, Clone)]
pub struct RlsOptions {
    pub listen: SocketAddr,
    pub config_path: PathBuf,
    /// The Wasm filter's plugin configuration, for limits sharing its rules' counters.
    pub filter_config_path: Option<PathBuf>,
    /// A domain in several files is merged (`--rls-merge-domains`).
    pub merge_domains: bool,
    /// The service-wide switches (`--rls-shadow-mode`, ...).
    pub settings: Settings,
}

impl RlsOptions {
    /// The files the service's configuration is read from.
    pub fn files(&self) -> ConfigFiles {
        ConfigFiles {
            config_path: self.config_path.clone(),
            filter_config_path: self.filter_config_path.clone(),
            merge_domains: self.merge_domains,
        }
    }
}

impl ShimConfig {
    /// The Redis keys of the counters the filter names `keys`: each under the prefix.
    pub fn redis_keys<'a>(&self, keys: impl IntoIterator<Item = &'a str>) -> Vec<String> {
        keys.into_iter()
            .map(|key| format!("{}{key}", self.key_prefix))
            .collect()
    }

    /// Refuses a configuration the shim cannot run safely with.
    pub fn validate(&self) -> Result<(), String> {
        let prefix = &self.key_prefix;
        if prefix.len() > MAX_PREFIX_LEN || !prefix.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "key prefix: at most {MAX_PREFIX_LEN} printable ASCII characters"
            ));
        }
        // A brace in the prefix would become every key's cluster hash tag, putting all
        // clients in one slot.
        if prefix.contains(['{', '}']) {
            return Err("key prefix: must not contain '{' or '}'".into());
        }
        if self.redis.urls.is_empty() {
            return Err("redis url: at least one is required".into());
        }
        if !self.redis.cluster && self.redis.urls.len() > 1 {
            return Err(
                "redis url: a standalone Redis takes exactly one (use cluster mode for several)".into(),
            );
        }
        if let Some(regions) = self.regions.parse()? {
            if self.redis.cluster && !regions.peers.is_empty() {
                return Err("--peer-region: regions run on a standalone Redis in each region (docs/REGIONS.md: a Redis Cluster is not yet served)".into());
            }
        }
        if self.redis.timeout.is_zero() {
            return Err("redis timeout: must be positive".into());
        }
        if self.max_in_flight == 0 {
            return Err("max in flight: must be positive".into());
        }
        if self.max_connections == 0 {
            return Err("max connections: must be positive".into());
        }
        if self.header_timeout.is_zero() || self.body_timeout.is_zero() {
            return Err("header and body timeouts: must be positive".into());
        }
        if self.token.as_deref() == Some("") || self.admin_token.as_deref() == Some("") {
            return Err("token: must not be empty when set".into());
        }
        Ok(())
    }
}

/// A valid configuration for unit tests: no token, small bounds, short timeouts.
#[cfg(test)]
pub(crate) fn test_config() -> ShimConfig {
    ShimConfig {
        redis: RedisConfig {
            urls: vec!["redis://127.0.0.1:6379".into()],
            cluster: false,
            timeout: Duration::from_millis(50),
            max_pending: 10,
        },
        key_prefix: "rl:".into(),
        token: None,
        admin_token: None,
        token_for_operators: false,
        max_in_flight: 10,
        max_connections: 10,
        header_timeout: Duration::from_secs(1),
        body_timeout: Duration::from_secs(1),
        shutdown_timeout: Duration::from_secs(1),
        rls: None,
        regions: RegionFlags::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configuration_is_validated() {
        assert!(test_config().validate().is_ok());
        let cases: Vec<(ShimConfig, &str)> = vec![
            (
                ShimConfig {
                    key_prefix: "rl{x}:".into(),
                    ..test_config()
                },
                "'{'",
            ),
            (
                ShimConfig {
                    key_prefix: "a b".into(),
                    ..test_config()
                },
                "printable",
            ),
            (
                ShimConfig {
                    max_in_flight: 0,
                    ..test_config()
                },
                "in flight",
            ),
            (
                ShimConfig {
                    max_connections: 0,
                    ..test_config()
                },
                "connections",
            ),
            (
                ShimConfig {
                    body_timeout: Duration::ZERO,
                    ..test_config()
                },
                "timeouts",
            ),
            (
                ShimConfig {
                    token: Some(String::new()),
                    ..test_config()
                },
                "token",
            ),
            (
                ShimConfig {
                    admin_token: Some(String::new()),
                    ..test_config()
                },
                "token",
            ),
        ];
        for (config, expected) in cases {
            let err = config.validate().unwrap_err();
            assert!(err.contains(expected), "{err} should mention {expected}");
        }
        let mut two_urls = test_config();
        two_urls.redis.urls.push("redis://127.0.0.1:6380".into());
        assert!(two_urls.validate().unwrap_err().contains("standalone"));
        two_urls.redis.cluster = true;
        assert!(two_urls.validate().is_ok());
    }
}
