//! The server: [`run`], which serves the routes ([`crate::routes`]) on a bound listener until a
//! shutdown future completes, so tests serve the real shim on a port they picked, and
//! Envoy's gRPC services ([`crate::transport::grpc::listener`]) on theirs, each connection alike.
//!
//! Connections are served here rather than by `axum::serve`, which sets no timer (so no
//! header-read timeout) and accepts without limit: each accepted connection first passes
//! the connection cap (`transport/connection_cap.rs`), then is served over HTTP/1.1 or HTTP/2
//! cleartext (detected from its first bytes) with the header-read timeout, and is closed
//! if its first request does not start within that timeout either (which covers a
//! client that sends nothing, or stalls in the HTTP/2 preface, where hyper has no timer).

use crate::metrics::{ConnectionClose, Metrics};
use crate::routes;
use crate::store::any_store::AnyStore;
use crate::store::memory::MemoryStore;
use crate::store::redis_store::RedisStore;
use crate::store::regions::{replicator, Regions};
use crate::transport::config::ShimConfig;
use crate::transport::connection_cap::{ConnectionCap, ConnectionGuard};
use crate::transport::shim::Shim;
use axum::Router;
use hyper::body::Incoming;
use hyper::service::Service as _;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Largest read buffer of an HTTP/1 connection, which bounds the headers a client can
/// make the shim hold (hyper's default is 400 KiB a connection). Bodies stream through
/// it in pieces, so it does not limit them.
const MAX_READ_BUFFER_BYTES: usize = 32 * 1024;

/// Serves the shim on `listener` (and Envoy's gRPC services on their own, with
/// `--grpc-listen`) until `shutdown` completes, then finishes the checks in flight (for
/// at most the shutdown timeout) and returns.
pub async fn run(
    listener: TcpListener,
    config: ShimConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    config.validate()?;
    let metrics = Arc::new(Metrics::default());
    let store = RedisStore::connect(&config.redis, metrics.clone())?;
    let regions = match config.regions.parse()? {
        Some(regions) if !regions.peers.is_empty() => Some(Arc::new(Regions::connect(
            &regions,
            &config.redis,
            &config.key_prefix,
        )?)),
        Some(_) => {
            tracing::info!("--region without --peer-region: every check counts in this region alone");
            None
        }
        None => None,
    };
    let mut shim = Shim::new(AnyStore::Redis(store), config, metrics.clone());
    let mut replicating = Vec::new();
    if let Some(regions) = regions {
        // The replication's own connection to this region's Redis, so that its pages
        // never queue behind the checks.
        let local = Arc::new(RedisStore::connect(&shim.config.redis, metrics)?);
        replicating = replicator::spawn(local, regions.clone());
        tracing::info!(region = %regions.own, peers = regions.peers.len(), "serving several regions");
        shim = shim.with_regions(regions);
    }
    let served = serve(listener, shim, shutdown).await;
    for task in replicating {
        task.abort();
    }
    served
}

/// [`run`] with the counters in this process's memory ([`MemoryStore`]) instead of Redis
/// (`config.redis` unused): for tests and development only, which is why the binary
/// offers no flag for it. Every count is this process's and is lost with it.
pub async fn run_in_memory(
    listener: TcpListener,
    config: ShimConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    config.validate()?;
    if config
        .regions
        .parse()?
        .is_some_and(|regions| !regions.peers.is_empty())
    {
        return Err("--peer-region: regions replicate through Redis, not the store in memory".into());
    }
    let metrics = Arc::new(Metrics::default());
    let store = AnyStore::Memory(MemoryStore::new());
    serve(listener, Shim::new(store, config, metrics), shutdown).await
}

/// Serves `shim` as [`run`] describes.
async fn serve(
    listener: TcpListener,
    shim: Shim,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let shim = Arc::new(shim);
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let mut listeners = vec![(listener, routes::router(shim.clone()))];
    if let Some(options) = &shim.config.rls {
        listeners
            .push(crate::transport::grpc::listener::prepare(options, shim.clone(), stopping.clone()).await?);
    }

    let mut builder = auto::Builder::new(TokioExecutor::new());
    // No header-read timer on HTTP/1: hyper's also runs while a kept-alive connection
    // waits for its next request, so it would close Envoy's idle connections to the shim
    // and race the requests Envoy sends on them. A connection must start its first request
    // within the header timeout (below); only a caller that passed the token keeps one open.
    builder.http1().max_buf_size(MAX_READ_BUFFER_BYTES);
    // Pings on HTTP/2: a peer that vanished without closing (a host gone, a partition)
    // is found out, and with it a quota stream whose shares pass to the others only when it ends.
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5));
    let served = Served {
        builder: Arc::new(builder),
        // One cap for both listeners: together they hold at most --max-connections.
        connection_cap: ConnectionCap::new(shim.config.max_connections, shim.metrics.clone()),
        graceful: Arc::new(GracefulShutdown::new()),
        shim: shim.clone(),
    };
    let loops: Vec<_> = listeners
        .into_iter()
        .map(|(listener, app)| tokio::spawn(accept(listener, app, served.clone(), stopping.clone())))
        .collect();

    shutdown.await;
    let _ = stop.send(true);
    for accepting in loops {
        let _ = accepting.await;
    }
    shim.draining.store(true, Ordering::SeqCst);
    tracing::info!("shutdown requested: finishing the checks in flight");
    let grace = shim.config.shutdown_timeout;
    let Ok(graceful) = Arc::try_unwrap(served.graceful) else {
        // Unreachable: the accept loops, which held the other handles, have ended.
        tracing::warn!("shutdown: the connections in flight could not be waited for");
        return Ok(());
    };
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(grace) => tracing::warn!(timeout = ?grace, "shutdown timeout: abandoning the checks still in flight"),
    }
    Ok(())
}

/// What every accepted connection is served with.
#[derive(Clone)]
struct Served {
    builder: Arc<auto::Builder<TokioExecutor>>,
    connection_cap: Arc<ConnectionCap>,
    graceful: Arc<GracefulShutdown>,
    shim: Arc<Shim>,
}

/// Accepts connections on `listener` and serves `app` on each, until `stopping` turns true.
async fn accept(listener: TcpListener, app: Router, served: Served, mut stopping: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopping.wait_for(|stopped| *stopped) => break,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(error) => {
                // Out of file descriptors, most likely: wait for some to close rather
                // than spin on a listener that stays readable.
                tracing::warn!(%error, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(guard) = served.connection_cap.admit() else {
            drop(stream);
            continue;
        };
        tokio::spawn(serve_connection(
            stream,
            guard,
            &served.builder,
            &served.graceful,
            app.clone(),
            served.shim.clone(),
        ));
    }
}

/// One connection, served until it closes, is evicted by the cap, or sends no first
/// request within the header timeout. Returns the future its task runs.
fn serve_connection(
    stream: TcpStream,
    guard: ConnectionGuard,
    builder: &auto::Builder<TokioExecutor>,
    graceful: &GracefulShutdown,
    app: Router,
    shim: Arc<Shim>,
) -> impl Future<Output = ()> + Send + 'static {
    // Checks are small request/response exchanges: send each answer at once.
    let _ = stream.set_nodelay(true);
    let guard = Arc::new(guard);
    let router = TowerToHyperService::new(app);
    let requests = guard.clone();
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let in_progress = requests.request();
        let answer = router.call(request);
        async move {
            let answered = answer.await;
            drop(in_progress);
            answered
        }
    });
    let connection = builder
        .serve_connection(TokioIo::new(stream), service)
        .into_owned();
    let watched = graceful.watch(connection);
    let header_timeout = shim.config.header_timeout;
    async move {
        let mut watched = std::pin::pin!(watched);
        let first_request = tokio::time::sleep(header_timeout);
        let mut first_request = std::pin::pin!(first_request);
        let mut awaiting_first = true;
        loop {
            tokio::select! {
                served = &mut watched => {
                    if let Err(error) = served {
                        let timed_out = error
                            .downcast_ref::<hyper::Error>()
                            .is_some_and(hyper::Error::is_timeout);
                        if timed_out {
                            shim.metrics.connection_closed(ConnectionClose::HeaderTimeout);
                        }
                        tracing::debug!(%error, "connection ended with an error");
                    }
                    break;
                }
                () = guard.state.evicted() => break,
                () = &mut first_request, if awaiting_first => {
                    if guard.state.served() {
                        awaiting_first = false;
                    } else {
                        shim.metrics.connection_closed(ConnectionClose::HeaderTimeout);
                        tracing::debug!(timeout = ?header_timeout, "no request within the header timeout: closing the connection");
                        break;
                    }
                }
            }
        }
        // The connection and its service (holding the guard's other clone) are dropped
        // here; the last clone unregisters the connection from the cap.
    }
}
