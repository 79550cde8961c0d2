//! `redis-shim` binary: flags and environment into a [`ShimConfig`], then [`run`] until
//! SIGTERM or Ctrl-C.

use clap::Parser;
use redis_shim::{run, ShimConfig};
use std::net::SocketAddr;
use std::time::Duration;

/// Runs ratelimit-wasm's checks as atomic Lua scripts in Redis.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Address to listen on. Loopback by default: expose it deliberately.
    #[arg(long, env = "RLSHIM_LISTEN", default_value = "127.0.0.1:8400")]
    listen: SocketAddr,
    /// Redis URL (redis://, rediss:// for TLS; user:password@ for AUTH).
    #[arg(long, env = "RLSHIM_REDIS_URL", default_value = "redis://127.0.0.1:8401")]
    redis_url: String,
    /// Timeout of each Redis operation, in milliseconds.
    #[arg(long, env = "RLSHIM_REDIS_TIMEOUT_MS", default_value_t = 50)]
    redis_timeout_ms: u64,
    /// Prefix of every Redis key the shim writes.
    #[arg(long, env = "RLSHIM_KEY_PREFIX", default_value = "rl:")]
    key_prefix: String,
    /// Shared token that callers must send in x-ratelimit-token.
    #[arg(long, env = "RLSHIM_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    tracing::info!(listen = %listener.local_addr()?, redis = %redact(&args.redis_url), "redis-shim listening");
    let config = ShimConfig {
        redis_url: args.redis_url,
        redis_timeout: Duration::from_millis(args.redis_timeout_ms),
        key_prefix: args.key_prefix,
        token: args.token,
    };
    run(listener, config, shutdown_signal()).await?;
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
