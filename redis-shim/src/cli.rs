//! The shim's command line: flags and environment variables into a [`ShimConfig`], and
//! the `counters` command ([`crate::ops::counters`]) that talks to a running shim.
//!
//! In the library, not the binary, so tests start the shim in-process with exactly the
//! flags an operator would pass.

use crate::decide::rls::settings::Settings;
use crate::ops::counters::CountersCommand;
use crate::store::redis_connection::RedisConfig;
use crate::store::regions::RegionFlags;
use crate::transport::config::{RlsOptions, ShimConfig};
use clap::{Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Runs ratelimit-wasm's checks as atomic Lua scripts in Redis.
///
/// Every flag can also be set by the environment variable shown with it. Without a
/// command, the shim serves.
#[derive(Parser, Debug)]
#[command(name = "redis-shim", version, about)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Address to listen on (HTTP/1.1 and HTTP/2 cleartext). Loopback by default:
    /// expose it deliberately.
    #[arg(long, env = "RLSHIM_LISTEN", default_value = "127.0.0.1:8400")]
    pub listen: SocketAddr,
    /// Redis URL: redis:// or rediss:// (TLS), with user:password@ for AUTH. In cluster
    /// mode, the seed nodes, comma-separated.
    #[arg(
        long,
        env = "RLSHIM_REDIS_URL",
        default_value = "redis://127.0.0.1:8401",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub redis_url: Vec<String>,
    /// A standalone Redis, or a Redis Cluster.
    #[arg(long, env = "RLSHIM_REDIS_MODE", value_enum, default_value_t = RedisMode::Standalone)]
    pub redis_mode: RedisMode,
    /// Timeout of each Redis operation, in milliseconds.
    #[arg(long, env = "RLSHIM_REDIS_TIMEOUT_MS", default_value_t = 50)]
    pub redis_timeout_ms: u64,
    /// Prefix of every Redis key the shim writes (no braces).
    #[arg(long, env = "RLSHIM_KEY_PREFIX", default_value = "rl:")]
    pub key_prefix: String,
    /// Shared token that callers must send in x-ratelimit-token. Checked before any of
    /// a request's body is read: a caller without it is answered 401 at once.
    #[arg(long, env = "RLSHIM_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Token the admin endpoints (/v1/admin/counters/..., used by `redis-shim counters`)
    /// require, sent in x-ratelimit-token; --token when not set. With neither, the admin
    /// endpoints are refused.
    #[arg(long, env = "RLSHIM_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Require the token on GET /metrics and /readyz too (a Prometheus scrape then sends
    /// it as the x-ratelimit-token header). /healthz stays open for liveness probes.
    #[arg(long, env = "RLSHIM_TOKEN_FOR_OPERATORS")]
    pub token_for_operators: bool,
    /// Serve without --token on an address other than loopback (any caller that reaches
    /// the port is then accepted). Without it, the shim refuses to start that way.
    #[arg(long, env = "RLSHIM_ALLOW_NO_TOKEN")]
    pub allow_no_token: bool,
    /// Most check requests (admin calls included) answered at once; more are answered
    /// 503 immediately.
    #[arg(long, env = "RLSHIM_MAX_IN_FLIGHT", default_value_t = 1024)]
    pub max_in_flight: usize,
    /// Most connections open at once. Past it, a new connection closes the oldest one
    /// that has not yet sent a request (or, if every one has, is itself closed at once).
    /// Keep it well under the open-file limit (ulimit -n), which Redis connections share.
    #[arg(long, env = "RLSHIM_MAX_CONNECTIONS", default_value_t = 512)]
    pub max_connections: usize,
    /// Longest wait for a connection's first request (its headers included), in
    /// milliseconds, HTTP/1.1 and HTTP/2; the connection is then closed. A connection that
    /// has made a request (past the token) is not timed while idle.
    #[arg(long, env = "RLSHIM_HEADER_TIMEOUT_MS", default_value_t = 5_000)]
    pub header_timeout_ms: u64,
    /// Longest wait for a request's whole body (a check's or an admin call's), in
    /// milliseconds; past it, the request is answered 408 and its connection closed.
    #[arg(long, env = "RLSHIM_BODY_TIMEOUT_MS", default_value_t = 5_000)]
    pub body_timeout_ms: u64,
    /// After SIGTERM, longest wait for the checks in flight, in milliseconds.
    #[arg(long, env = "RLSHIM_SHUTDOWN_TIMEOUT_MS", default_value_t = 10_000)]
    pub shutdown_timeout_ms: u64,
    /// Also serve Envoy's rate-limit service (gRPC, `envoy.service.ratelimit.v3`, for
    /// `envoy.filters.http.ratelimit`) on this address, with --rls-config. Same token,
    /// in-flight bound and exposure rule as --listen (docs/RLS.md).
    #[arg(long, env = "RLSHIM_GRPC_LISTEN", requires = "rls_config")]
    pub grpc_listen: Option<SocketAddr>,
    /// The rate-limit service's limits, in envoyproxy/ratelimit's YAML format: a file, or a
    /// directory whose .yaml/.yml files are all loaded. Anything unsupported is refused at
    /// start, naming the field.
    #[arg(long, env = "RLSHIM_RLS_CONFIG", requires = "grpc_listen")]
    pub rls_config: Option<PathBuf>,
    /// The Wasm filter's plugin configuration (the JSON Envoy gives it), for limits of
    /// --rls-config that share a filter rule's counter (`filter_rule`, docs/RLS.md).
    #[arg(long, env = "RLSHIM_RLS_FILTER_CONFIG", requires = "rls_config")]
    pub rls_filter_config: Option<PathBuf>,
    /// Merge a domain configured in several --rls-config files, as envoyproxy/ratelimit's
    /// MERGE_DOMAIN_CONFIG does (a descriptor in two of them is still refused). Without
    /// it, a domain in a second file is refused.
    #[arg(long, env = "RLSHIM_RLS_MERGE_DOMAINS", requires = "rls_config")]
    pub rls_merge_domains: bool,
    /// Answer every ShouldRateLimit OK overall, as envoyproxy/ratelimit's SHADOW_MODE:
    /// descriptors are counted and keep their own codes; what would have refused counts
    /// as shadow_over_limit.
    #[arg(long, env = "RLSHIM_RLS_SHADOW_MODE", requires = "rls_config")]
    pub rls_shadow_mode: bool,
    /// Every descriptor in quota mode, as envoyproxy/ratelimit's QUOTA_MODE: a request is
    /// refused only when all its descriptors are over their limits.
    #[arg(long, env = "RLSHIM_RLS_QUOTA_MODE", requires = "rls_config")]
    pub rls_quota_mode: bool,
    /// Return the request and the passed limits' `metadata` as the answer's dynamic
    /// metadata, as envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA.
    #[arg(long, env = "RLSHIM_RLS_RESPONSE_METADATA", requires = "rls_config")]
    pub rls_response_metadata: bool,
    /// Count as envoyproxy/ratelimit does: every descriptor charged on its own, whatever
    /// the others answer, and one refused spends the rest of its window. Without it, a
    /// refused request charges nothing (docs/RLS.md, "Deviations").
    #[arg(long, env = "RLSHIM_RLS_UPSTREAM_COUNTING", requires = "rls_config")]
    pub rls_upstream_counting: bool,
    /// This shim's region, when it serves several (docs/REGIONS.md). Every shim of a
    /// region shares the region's Redis (--redis-url).
    #[arg(long, env = "RLSHIM_REGION")]
    pub region: Option<String>,
    /// Another region and its Redis, as NAME=REDIS_URL; once per other region. Checks
    /// marked `home` or `replicated` use them (docs/REGIONS.md). In the environment,
    /// several are separated by `;`.
    #[arg(
        long = "peer-region",
        value_name = "NAME=REDIS_URL",
        env = "RLSHIM_PEER_REGIONS",
        value_delimiter = ';',
        requires = "region",
        hide_env_values = true
    )]
    pub peer_regions: Vec<String>,
    /// Timeout of each operation on a peer region's Redis, in milliseconds: a home
    /// check's round trip across regions, a replication read.
    #[arg(long, env = "RLSHIM_PEER_TIMEOUT_MS", default_value_t = 500)]
    pub peer_timeout_ms: u64,
    /// A peer region silent this long (milliseconds) is treated as cut off: the regions
    /// still in reach of each other, when a majority, stop waiting for its confirmation.
    #[arg(long, env = "RLSHIM_PEER_CUTOFF_MS", default_value_t = 1_000)]
    pub peer_cutoff_ms: u64,
    /// Log lines as human-readable text or as JSON objects. Levels: RUST_LOG.
    #[arg(long, env = "RLSHIM_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Show or reset one client's counters on a running shim, keyed from the filter's
    /// plugin configuration exactly as the filter keys them.
    #[command(subcommand)]
    Counters(CountersCommand),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RedisMode {
    Standalone,
    Cluster,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

impl Args {
    /// Refuses to serve callers beyond this host without a token unless told to: an
    /// exposed shim without one can be driven by anyone who reaches it.
    pub fn check_exposure(&self) -> Result<(), String> {
        for listen in std::iter::once(self.listen).chain(self.grpc_listen) {
            if self.token.is_none() && !listen.ip().is_loopback() && !self.allow_no_token {
                return Err(format!(
                    "listening on {listen} without a token: set --token (RLSHIM_TOKEN), or pass \
                     --allow-no-token (RLSHIM_ALLOW_NO_TOKEN=true) to accept any caller"
                ));
            }
        }
        Ok(())
    }

    /// What [`crate::run`] needs; the listen address and log format stay with the caller.
    pub fn shim_config(&self) -> ShimConfig {
        ShimConfig {
            regions: RegionFlags {
                region: self.region.clone(),
                peers: self.peer_regions.clone(),
                peer_timeout_ms: self.peer_timeout_ms,
                cutoff_ms: self.peer_cutoff_ms,
            },
            redis: RedisConfig {
                urls: self.redis_url.clone(),
                cluster: self.redis_mode == RedisMode::Cluster,
                timeout: Duration::from_millis(self.redis_timeout_ms),
                // Each check in flight awaits at most one Redis command at a time.
                max_pending: self.max_in_flight,
            },
            key_prefix: self.key_prefix.clone(),
            token: self.token.clone(),
            admin_token: self.admin_token.clone(),
            token_for_operators: self.token_for_operators,
            max_in_flight: self.max_in_flight,
            max_connections: self.max_connections,
            header_timeout: Duration::from_millis(self.header_timeout_ms),
            body_timeout: Duration::from_millis(self.body_timeout_ms),
            shutdown_timeout: Duration::from_millis(self.shutdown_timeout_ms),
            rls: self
                .grpc_listen
                .zip(self.rls_config.clone())
                .map(|(listen, config_path)| RlsOptions {
                    listen,
                    config_path,
                    filter_config_path: self.rls_filter_config.clone(),
                    merge_domains: self.rls_merge_domains,
                    settings: Settings {
                        shadow_mode: self.rls_shadow_mode,
                        quota_mode: self.rls_quota_mode,
                        response_metadata: self.rls_response_metadata,
                        upstream_counting: self.rls_upstream_counting,
                    },
                }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(flags: &[&str]) -> Args {
        Args::try_parse_from(std::iter::once("redis-shim").chain(flags.iter().copied())).unwrap()
    }

    #[test]
    fn an_exposed_shim_needs_a_token_or_an_explicit_opt_out() {
        assert!(args(&[]).check_exposure().is_ok(), "loopback by default");
        let exposed = ["--listen", "0.0.0.0:8400"];
        let refused = args(&exposed).check_exposure().unwrap_err();
        assert!(refused.contains("--token"), "{refused}");
        assert!(args(&[&exposed[..], &["--token", "t"]].concat())
            .check_exposure()
            .is_ok());
        assert!(args(&[&exposed[..], &["--allow-no-token"]].concat())
            .check_exposure()
            .is_ok());
        let grpc_exposed = ["--grpc-listen", "0.0.0.0:8081", "--rls-config", "rls.yaml"];
        let refused = args(&grpc_exposed).check_exposure().unwrap_err();
        assert!(refused.contains("0.0.0.0:8081"), "{refused}");
        assert!(args(&[&grpc_exposed[..], &["--token", "t"]].concat())
            .check_exposure()
            .is_ok());
    }

    #[test]
    fn the_rate_limit_service_needs_both_its_address_and_its_configuration() {
        let parse =
            |flags: &[&str]| Args::try_parse_from(std::iter::once("redis-shim").chain(flags.iter().copied()));
        assert!(parse(&["--grpc-listen", "127.0.0.1:8081"]).is_err());
        assert!(parse(&["--rls-config", "rls.yaml"]).is_err());
        let both = args(&["--grpc-listen", "127.0.0.1:8081", "--rls-config", "rls.yaml"]);
        let rls = both.shim_config().rls.unwrap();
        assert_eq!(rls.listen.port(), 8081);
        assert_eq!(rls.filter_config_path, None);
        assert!(args(&[]).shim_config().rls.is_none());
        assert!(parse(&["--rls-filter-config", "plugin.json"]).is_err());
        let sharing = args(&[
            "--grpc-listen",
            "127.0.0.1:8081",
            "--rls-config",
            "rls.yaml",
            "--rls-filter-config",
            "plugin.json",
        ]);
        let path = sharing.shim_config().rls.unwrap().filter_config_path;
        assert_eq!(path, Some(PathBuf::from("plugin.json")));
    }

    #[test]
    fn peer_regions_are_named_once_each_and_never_like_this_one() {
        assert_eq!(args(&[]).shim_config().regions.parse().unwrap(), None);
        let three = args(&[
            "--region",
            "eu",
            "--peer-region",
            "us=redis://127.0.0.1:7001",
            "--peer-region",
            "ap=redis://127.0.0.1:7002",
        ]);
        let regions = three.shim_config().regions.parse().unwrap().unwrap();
        assert_eq!(regions.peers.len(), 2);
        assert_eq!(regions.peer_timeout, Duration::from_millis(500));
        for (peer, named) in [
            ("us", "NAME=REDIS_URL"),
            ("eu=redis://127.0.0.1:7001", "named like this region"),
            ("us=not a url", "not a Redis URL"),
            ("u s=redis://127.0.0.1:7001", "a region's name"),
        ] {
            let err = args(&["--region", "eu", "--peer-region", peer])
                .shim_config()
                .regions
                .parse()
                .unwrap_err();
            assert!(
                err.starts_with("--peer-region") && err.contains(named),
                "{peer}: {err}"
            );
        }
        let twice = args(&[
            "--region",
            "eu",
            "--peer-region",
            "us=redis://127.0.0.1:7001",
            "--peer-region",
            "us=redis://127.0.0.1:7002",
        ]);
        assert!(twice
            .shim_config()
            .regions
            .parse()
            .unwrap_err()
            .contains("given twice"));
        let parse =
            |flags: &[&str]| Args::try_parse_from(std::iter::once("redis-shim").chain(flags.iter().copied()));
        assert!(
            parse(&["--peer-region", "us=redis://127.0.0.1:7001"]).is_err(),
            "needs --region"
        );
    }
}
