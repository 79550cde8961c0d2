//! `redis-shim` binary: flags and environment ([`redis_shim::cli`]) into a shim config,
//! logging set up, then [`run`] until SIGTERM or Ctrl-C; or, with the `counters`
//! command, an operator's client of a running shim ([`redis_shim::ops::counters`]).

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

use clap::Parser;
use redis_shim::cli::{Args, Command, LogFormat};
use redis_shim::decide::rls::loading;
use redis_shim::run;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args = Args::parse();
    if let Some(Command::Counters(command)) = &args.command {
        std::process::exit(redis_shim::ops::counters::run(command));
    }
    serve(args)
}

#[tokio::main]
async fn serve(args: Args) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // RUST_LOG as targets and levels ("info", "redis_shim=debug,warn"), without the
    // regular expressions of tracing's EnvFilter, which the shim's build would carry.
    let rust_log = std::env::var("RUST_LOG").ok().filter(|value| !value.is_empty());
    let parsed = rust_log.as_deref().map(str::parse::<Targets>);
    let filter = match &parsed {
        Some(Ok(targets)) => targets.clone(),
        _ => Targets::new().with_default(tracing::Level::INFO),
    };
    let logs = tracing_subscriber::fmt().with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()));
    match args.log_format {
        LogFormat::Text => logs.finish().with(filter).init(),
        LogFormat::Json => logs.json().flatten_event(true).finish().with(filter).init(),
    }
    if let Some(Err(refused)) = parsed {
        tracing::warn!(
            "RUST_LOG={:?}: {refused}; logging at info",
            rust_log.unwrap_or_default()
        );
    }
    if let Err(refused) = args.check_exposure() {
        tracing::error!("{refused}");
        return Err(refused.into());
    }
    let config = args.shim_config();
    // Every error of --rls-config, before anything listens (the gRPC listener loads it
    // again when it binds, and keeps it current from then on).
    if let Some(refused) = config
        .rls
        .as_ref()
        .and_then(|rls| loading::check(&rls.files()).err())
    {
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
