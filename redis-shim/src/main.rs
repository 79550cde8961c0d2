//! `redis-shim` binary: flags and environment into a [`ShimConfig`], then [`run`] until
//! SIGTERM or Ctrl-C.

use clap::{Parser, ValueEnum};
use redis_shim::store::RedisConfig;
use redis_shim::{run, ShimConfig};
use std::net::SocketAddr;
use std::time::Duration;

/// Runs ratelimit-wasm's checks as atomic Lua scripts in Redis.
///
/// Every flag can also be set by the environment variable shown with it.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Address to listen on (HTTP/1.1 and HTTP/2 cleartext). Loopback by default:
    /// expose it deliberately.
    #[arg(long, env = "RLSHIM_LISTEN", default_value = "127.0.0.1:8400")]
    listen: SocketAddr,
    /// Redis URL: redis:// or rediss:// (TLS), with user:password@ for AUTH. In cluster
    /// mode, the seed nodes, comma-separated.
    #[arg(
        long,
        env = "RLSHIM_REDIS_URL",
        default_value = "redis://127.0.0.1:8401",
        value_delimiter = ',',
        hide_env_values = true
    )]
    redis_url: Vec<String>,
    /// A standalone Redis, or a Redis Cluster.
    #[arg(long, env = "RLSHIM_REDIS_MODE", value_enum, default_value_t = RedisMode::Standalone)]
    redis_mode: RedisMode,
    /// Timeout of each Redis operation, in milliseconds.
    #[arg(long, env = "RLSHIM_REDIS_TIMEOUT_MS", default_value_t = 50)]
    redis_timeout_ms: u64,
    /// Prefix of every Redis key the shim writes (no braces).
    #[arg(long, env = "RLSHIM_KEY_PREFIX", default_value = "rl:")]
    key_prefix: String,
    /// Shared token that callers must send in x-ratelimit-token.
    #[arg(long, env = "RLSHIM_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Most check requests decided at once; more are answered 503 immediately.
    #[arg(long, env = "RLSHIM_MAX_IN_FLIGHT", default_value_t = 1024)]
    max_in_flight: usize,
    /// After SIGTERM, longest wait for the checks in flight, in milliseconds.
    #[arg(long, env = "RLSHIM_SHUTDOWN_TIMEOUT_MS", default_value_t = 10_000)]
    shutdown_timeout_ms: u64,
    /// Log lines as human-readable text or as JSON objects. Levels: RUST_LOG.
    #[arg(long, env = "RLSHIM_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum RedisMode {
    Standalone,
    Cluster,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()));
    match args.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().flatten_event(true).init(),
    }
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let redacted: Vec<String> = args.redis_url.iter().map(|url| redact(url)).collect();
    tracing::info!(
        listen = %listener.local_addr()?,
        redis = ?redacted,
        mode = ?args.redis_mode,
        "redis-shim listening"
    );
    let config = ShimConfig {
        redis: RedisConfig {
            urls: args.redis_url,
            cluster: args.redis_mode == RedisMode::Cluster,
            timeout: Duration::from_millis(args.redis_timeout_ms),
            // Each check in flight awaits at most one Redis command at a time.
            max_pending: args.max_in_flight,
        },
        key_prefix: args.key_prefix,
        token: args.token,
        max_in_flight: args.max_in_flight,
        shutdown_timeout: Duration::from_millis(args.shutdown_timeout_ms),
    };
    if let Err(e) = run(listener, config, shutdown_signal()).await {
        tracing::error!(error = %e, "redis-shim failed");
        return Err(e);
    }
    tracing::info!("redis-shim stopped");
    Ok(())
}

/// The URL without its password, for logs.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://***{}", &url[..scheme_end], &url[at..])
        }
        _ => url.to_string(),
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(term) => term,
            Err(_) => return ctrl_c.await.unwrap_or(()),
        };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await.unwrap_or(());
}
