//! The real shim: in-process from its library (most tests), on Redis or on the store in
//! memory ([`Backend`]), or as the built binary where a test needs the process itself
//! (signals, memory, log output).

use super::http::get;
use super::ports::ClaimedPort;
use super::process::{scratch, wait_until, Process};
use super::redis::{shared_cluster, shared_redis};
use clap::Parser;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Redis timeout for shims in tests, unless a test passes its own `--redis-timeout-ms`.
/// The shipped default (50 ms) is sized for a production Redis next to the shim; on a
/// loaded two-core machine a burst of a thousand concurrent checks can queue behind one
/// another for longer, and a timeout there would turn an admission the test counts into
/// a 503. Tests of the timeout itself set theirs explicitly.
pub const TEST_REDIS_TIMEOUT_MS: &str = "10000";

/// Longest the shim may take to serve its first request, on a loaded machine.
const STARTUP: Duration = Duration::from_secs(20);

/// The binary cargo built for these tests (with their profile).
pub fn shim_path() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_redis-shim"))
}

/// Where a suite test's counters live: the shared standalone Redis, the shared 3-master
/// Redis Cluster, or the shim's own memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Standalone,
    Cluster,
    Memory,
}

impl Backend {
    /// A shim on this backend with `extra_args`, its keys under a prefix no other test
    /// of this binary uses.
    pub fn shim(self, extra_args: &[&str]) -> Shim {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let prefix = format!("t{}:", NEXT.fetch_add(1, Ordering::Relaxed));
        let mut args = vec!["--key-prefix", &prefix];
        args.extend(extra_args);
        match self {
            Backend::Standalone => Shim::start(&shared_redis().url(), &args),
            Backend::Cluster => {
                args.extend(["--redis-mode", "cluster"]);
                let shim = Shim::start(&shared_cluster().urls(), &args);
                wait_until("shim ready on the cluster", Duration::from_secs(20), || {
                    get(&shim.url("/readyz"), &[]).status == 200
                });
                shim
            }
            Backend::Memory => {
                let args = shim_args("127.0.0.1:0", "redis://unused", &args);
                Shim::serve(args, None, true)
            }
        }
    }

    /// The clock the backend decides by, ms since the Unix epoch: Redis's `TIME`, or this
    /// host's clock for the store in memory.
    pub fn time_ms(self) -> u64 {
        match self {
            Backend::Standalone => shared_redis().time_ms(),
            Backend::Cluster => shared_cluster().time_ms(),
            Backend::Memory => SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64,
        }
    }

    /// The keys `shim` wrote under its prefix, where Redis can count them.
    pub fn key_count(self, shim: &Shim) -> Option<usize> {
        let pattern = format!("{}*", shim.key_prefix());
        let count = |port: u16| {
            let keys = super::redis::redis_cli(port, &["KEYS", &pattern]).unwrap();
            keys.lines().filter(|line| !line.is_empty()).count()
        };
        match self {
            Backend::Standalone => Some(count(shared_redis().port)),
            Backend::Cluster => Some(shared_cluster().ports.iter().map(|&port| count(port)).sum()),
            Backend::Memory => None,
        }
    }

    /// One redis-cli command on the node holding `args`' key; `None` in memory.
    pub fn cli(self, args: &[&str]) -> Option<String> {
        match self {
            Backend::Standalone => Some(shared_redis().cli(args)),
            Backend::Cluster => Some(shared_cluster().cli(args)),
            Backend::Memory => None,
        }
    }

    /// Polls the backend's clock until it reaches `at_ms`.
    pub fn wait_for_time(self, at_ms: u64) {
        loop {
            let now = self.time_ms();
            if now >= at_ms {
                return;
            }
            std::thread::sleep(Duration::from_millis((at_ms - now).min(20)));
        }
    }
}

/// The shim's flags for `redis_url` and `extra_args`, with the tests' Redis timeout
/// unless `extra_args` sets one.
fn shim_args(listen: &str, redis_url: &str, extra_args: &[&str]) -> Vec<String> {
    let mut args = vec!["--listen", listen, "--redis-url", redis_url];
    if !extra_args.contains(&"--redis-timeout-ms") {
        args.extend(["--redis-timeout-ms", TEST_REDIS_TIMEOUT_MS]);
    }
    args.extend(extra_args);
    args.into_iter().map(String::from).collect()
}

/// The shim served in this process by `redis_shim::run`, on its own runtime.
pub struct Shim {
    pub port: u16,
    args: Vec<String>,
    claim: Option<ClaimedPort>,
    in_memory: bool,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Shim {
    /// Starts the shim on a port the kernel picks, with the shim's own flags.
    pub fn start(redis_url: &str, extra_args: &[&str]) -> Shim {
        Shim::serve(shim_args("127.0.0.1:0", redis_url, extra_args), None, false)
    }

    /// The shim serving Envoy's gRPC services on a claimed port (returned with it), with
    /// `limits` (envoyproxy/ratelimit's YAML) as its `--rls-config` and `extra_args`.
    pub fn start_grpc(redis_url: &str, limits: &str, extra_args: &[&str]) -> (Shim, ClaimedPort) {
        let grpc = super::ports::claim_port();
        let config = scratch("grpc-shim").join("limits.yaml");
        std::fs::write(&config, limits).unwrap();
        let listen = format!("127.0.0.1:{}", grpc.port);
        let mut args = vec!["--grpc-listen", &listen, "--rls-config", config.to_str().unwrap()];
        args.extend(extra_args);
        (Shim::start(redis_url, &args), grpc)
    }

    /// Why the shim refuses to start with `args` (its flags after the program name): the
    /// error `redis_shim::run` returns. Bounded: a configuration that loads would be
    /// served until the end of time, and fails the test instead.
    pub fn refusal(args: &[&str]) -> String {
        let parsed =
            redis_shim::cli::Args::try_parse_from(std::iter::once("redis-shim").chain(args.iter().copied()))
                .unwrap_or_else(|e| panic!("shim flags {args:?}: {e}"));
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime
            .block_on(async {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                tokio::time::timeout(
                    Duration::from_secs(30),
                    redis_shim::run(listener, parsed.shim_config(), std::future::pending()),
                )
                .await
            })
            .expect("refused at start, not served")
            .unwrap_err()
            .to_string()
    }

    /// As [`Shim::start`], on a claimed port, so that [`Shim::restart`] can have it back.
    pub fn start_restartable(redis_url: &str, extra_args: &[&str]) -> Shim {
        let claim = super::ports::claim_port();
        let listen = format!("127.0.0.1:{}", claim.port);
        Shim::serve(shim_args(&listen, redis_url, extra_args), Some(claim), false)
    }

    fn serve(args: Vec<String>, claim: Option<ClaimedPort>, in_memory: bool) -> Shim {
        let parsed = redis_shim::cli::Args::try_parse_from(
            std::iter::once("redis-shim".to_string()).chain(args.iter().cloned()),
        )
        .unwrap_or_else(|e| panic!("shim flags {args:?}: {e}"));
        // Two workers, as the binary has on these two-core machines.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(parsed.listen))
            .unwrap_or_else(|e| panic!("shim cannot listen on {}: {e}", parsed.listen));
        let port = listener.local_addr().unwrap().port();
        let config = parsed.shim_config();
        let served = if in_memory {
            runtime.spawn(redis_shim::run_in_memory(
                listener,
                config,
                std::future::pending(),
            ))
        } else {
            runtime.spawn(redis_shim::run(listener, config, std::future::pending()))
        };
        let shim = Shim {
            port,
            args,
            claim,
            in_memory,
            runtime: Some(runtime),
        };
        wait_until("shim", STARTUP, || {
            assert!(!served.is_finished(), "the shim stopped at once: {:?}", shim.args);
            get(&shim.url("/healthz"), &[]).status == 200
        });
        shim
    }

    /// Stops serving at once, as a killed process would: the listener and every
    /// connection close, checks in flight are dropped.
    pub fn kill(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(Duration::from_secs(5));
        }
    }

    /// Kills the shim if it runs, then serves again on the same port with the same flags.
    pub fn restart(&mut self) {
        self.kill();
        assert!(self.claim.is_some(), "only a restartable shim keeps its port");
        let claim = self.claim.take();
        *self = Shim::serve(std::mem::take(&mut self.args), claim, self.in_memory);
    }
}

impl Shim {
    /// The prefix of every key this shim writes.
    pub fn key_prefix(&self) -> &str {
        let flag = self.args.iter().position(|arg| arg == "--key-prefix");
        flag.map_or("rl:", |at| &self.args[at + 1])
    }
}

impl ShimEndpoint for Shim {
    fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for Shim {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The built `redis-shim` binary, listening on a port it picks and reports in its log.
pub struct ShimProcess {
    pub port: u16,
    pub process: Process,
}

impl ShimProcess {
    pub fn start(redis_url: &str, extra_args: &[&str]) -> ShimProcess {
        ShimProcess::start_binary(&shim_path(), redis_url, extra_args)
    }

    /// As [`ShimProcess::start`], from another build of the shim (another release's).
    pub fn start_binary(binary: &std::path::Path, redis_url: &str, extra_args: &[&str]) -> ShimProcess {
        let dir = scratch("shim");
        let mut process = Process::spawn(
            Command::new(binary).args(shim_args("127.0.0.1:0", redis_url, extra_args)),
            dir.join("shim.log"),
        );
        let mut port = None;
        wait_until("the shim's listening line", STARTUP, || {
            assert!(!process.exited(), "the shim exited:\n{}", process.log_text());
            port = listening_port(&process.log_text());
            port.is_some()
        });
        ShimProcess {
            port: port.unwrap(),
            process,
        }
    }
}

impl ShimEndpoint for ShimProcess {
    fn port(&self) -> u16 {
        self.port
    }
}

/// A served shim, in-process or not.
pub trait ShimEndpoint {
    fn port(&self) -> u16;

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port(), path)
    }
}

/// The port in the shim's "redis-shim listening" line (text or JSON logs).
fn listening_port(log: &str) -> Option<u16> {
    let line = log.lines().find(|line| line.contains("redis-shim listening"))?;
    let field = ["listen=", "\"listen\":\""]
        .iter()
        .find_map(|name| Some(line.find(name)? + name.len()))?;
    let address = line.get(field..)?.strip_prefix("127.0.0.1:")?;
    let digits: String = address.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}
