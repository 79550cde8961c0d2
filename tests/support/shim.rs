//! The real shim: in-process from its library (most tests), or as the built binary where
//! a test needs the process itself (signals, memory, log output).

use super::http::get;
use super::ports::ClaimedPort;
use super::process::{built, scratch, wait_until, Process};
use clap::Parser;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// Redis timeout for shims in tests, unless a test passes its own `--redis-timeout-ms`.
/// The shipped default (50 ms) is sized for a production Redis next to the shim; on a
/// loaded two-core machine a burst of a thousand concurrent checks can queue behind one
/// another for longer, and a timeout there would turn an admission the test counts into
/// a 503. Tests of the timeout itself set theirs explicitly.
pub const TEST_REDIS_TIMEOUT_MS: &str = "10000";

/// Longest the shim may take to serve its first request, on a loaded machine.
const STARTUP: Duration = Duration::from_secs(20);

pub fn shim_path() -> PathBuf {
    built("target/shim/redis-shim")
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
    runtime: Option<tokio::runtime::Runtime>,
}

impl Shim {
    /// Starts the shim on a port the kernel picks, with the shim's own flags.
    pub fn start(redis_url: &str, extra_args: &[&str]) -> Shim {
        Shim::serve(shim_args("127.0.0.1:0", redis_url, extra_args), None)
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
        Shim::serve(shim_args(&listen, redis_url, extra_args), Some(claim))
    }

    fn serve(args: Vec<String>, claim: Option<ClaimedPort>) -> Shim {
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
        let served = runtime.spawn(redis_shim::run(
            listener,
            parsed.shim_config(),
            std::future::pending(),
        ));
        let shim = Shim {
            port,
            args,
            claim,
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
        *self = Shim::serve(std::mem::take(&mut self.args), claim);
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
