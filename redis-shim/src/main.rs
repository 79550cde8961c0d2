//! `redis-shim` binary: flags and environment ([`redis_shim::cli`]) into a shim config,
//! logging set up, then [`run`] until SIGTERM or Ctrl-C; or, with the `counters`
//! command, an operator's client of a running shim ([`redis_shim::counters`]).

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

use clap::Parser;
use redis_shim::cli::{Args, Command, LogFormat};
use redis_shim::run;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args = Args::parse();
    if let Some(Command::Counters(command)) = &args.command {
        std::process::exit(redis_shim::counters::run(command));
    }
    serve(args)
}

#[tokio::main]
async fn serve(args: Args) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()));
    match args.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().flatten_event(true).init(),
    }
    if let Err(refused) = args.check_exposure() {
        tracing::error!("{refused}");
        return Err(refused.into());
    }
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let redacted: Vec<String> = args.redis_url.iter().map(|url| redact(url)).collect();
    tracing::info!(
        listen = %listener.local_addr()?,
        redis = ?redacted,
        mode = ?args.redis_mode,
        "redis-shim listening"
    );
    let config = args.shim_config();
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
