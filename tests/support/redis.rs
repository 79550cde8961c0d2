//! Real Redis servers, standalone or a three-master cluster, on claimed loopback ports.

use super::ports::{claim_port, ClaimedPort};
use super::process::{scratch, wait_until, Process};
use std::process::Command;
use std::time::{Duration, Instant};

/// Longest a Redis server may take to answer PING after it starts, on a loaded machine.
const STARTUP: Duration = Duration::from_secs(20);

/// One redis-cli command against a port; `None` when it fails.
pub fn redis_cli(port: u16, args: &[&str]) -> Option<String> {
    let output = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// Starts `redis-server` with `args` on `port` and waits until `ping` answers PONG.
/// `None` when the port was taken (by a process outside the tests): the caller retries.
fn spawn_redis(port: u16, args: &[String], ping: &[&str]) -> Option<Process> {
    let dir = scratch("redis");
    let mut process = Process::spawn(
        Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(args)
            .current_dir(&dir),
        dir.join("redis.log"),
    );
    let deadline = Instant::now() + STARTUP;
    loop {
        if redis_cli(port, ping).as_deref() == Some("PONG") {
            return Some(process);
        }
        if process.exited() {
            let log = process.log_text();
            assert!(
                log.contains("Address already in use"),
                "redis-server exited:\n{log}"
            );
            return None;
        }
        assert!(
            Instant::now() < deadline,
            "redis on {port} not ready after {STARTUP:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub struct Redis {
    pub port: u16,
    claim: ClaimedPort,
    args: Vec<String>,
    ping: Vec<String>,
    process: Process,
}

impl Redis {
    pub fn start() -> Redis {
        Redis::start_with(&[], None)
    }

    /// Starts Redis with extra `redis-server` arguments (e.g. `--requirepass`); `cli_auth`
    /// is the password readiness checks use.
    pub fn start_with(extra_args: &[&str], cli_auth: Option<&str>) -> Redis {
        let args: Vec<String> = extra_args.iter().map(|a| a.to_string()).collect();
        let mut ping = vec!["--no-auth-warning".to_string()];
        if let Some(password) = cli_auth {
            ping.extend(["-a".to_string(), password.to_string()]);
        }
        ping.push("PING".to_string());
        let ping_args: Vec<&str> = ping.iter().map(String::as_str).collect();
        for _ in 0..20 {
            let claim = claim_port();
            if let Some(process) = spawn_redis(claim.port, &args, &ping_args) {
                return Redis {
                    port: claim.port,
                    claim,
                    args,
                    ping,
                    process,
                };
            }
        }
        panic!("redis-server found every claimed port taken");
    }

    /// Starts the stopped server again on the same port (still claimed, so no other test
    /// took it), with the same arguments and an empty dataset.
    pub fn restart(&mut self) {
        self.process.kill();
        let ping: Vec<&str> = self.ping.iter().map(String::as_str).collect();
        let deadline = Instant::now() + STARTUP;
        loop {
            if let Some(process) = spawn_redis(self.claim.port, &self.args, &ping) {
                self.process = process;
                return;
            }
            assert!(
                Instant::now() < deadline,
                "port {} stayed taken by another process",
                self.port
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn try_cli(&self, args: &[&str]) -> Option<String> {
        redis_cli(self.port, args)
    }

    /// Runs one redis-cli command and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        self.try_cli(args)
            .unwrap_or_else(|| panic!("redis-cli {args:?} failed"))
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn stop(&mut self) {
        self.process.kill();
    }

    pub fn process(&self) -> &Process {
        &self.process
    }

    /// Redis's clock in milliseconds since the Unix epoch, the clock the scripts use.
    pub fn time_ms(&self) -> u64 {
        let time = self.cli(&["TIME"]);
        let mut parts = time.lines().map(|l| l.trim().parse::<u64>().unwrap());
        let (seconds, micros) = (parts.next().unwrap(), parts.next().unwrap());
        seconds * 1000 + micros / 1000
    }
}

/// Polls Redis's clock until it reaches `at_ms` (no fixed sleep longer than the poll).
pub fn wait_for_redis_time(redis: &Redis, at_ms: u64) {
    loop {
        let now = redis.time_ms();
        if now >= at_ms {
            return;
        }
        std::thread::sleep(Duration::from_millis((at_ms - now).min(20)));
    }
}

/// A Redis Cluster of three masters (no replicas) on loopback ports.
pub struct RedisCluster {
    pub ports: Vec<u16>,
    nodes: Vec<Process>,
    _claims: Vec<ClaimedPort>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let mut claims = Vec::new();
        let mut nodes = Vec::new();
        let mut ports = Vec::new();
        while nodes.len() < 3 {
            // The cluster bus needs a port of its own; claimed too, instead of Redis's
            // default of port + 10000, which would fall in the ephemeral range.
            let (port, bus) = (claim_port(), claim_port());
            let dir = scratch("cluster-node");
            let args = [
                "--cluster-enabled".to_string(),
                "yes".to_string(),
                "--cluster-port".to_string(),
                bus.port.to_string(),
                "--cluster-config-file".to_string(),
                dir.join("nodes.conf").display().to_string(),
            ];
            if let Some(node) = spawn_redis(port.port, &args, &["PING"]) {
                ports.push(port.port);
                nodes.push(node);
                claims.extend([port, bus]);
            }
        }
        let cluster = RedisCluster {
            ports,
            nodes,
            _claims: claims,
        };
        let addresses: Vec<String> = cluster.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let output = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        for &port in &cluster.ports {
            wait_until("cluster_state:ok", Duration::from_secs(30), || {
                redis_cli(port, &["CLUSTER", "INFO"]).is_some_and(|info| info.contains("cluster_state:ok"))
            });
        }
        cluster
    }

    /// The seed URLs, comma-separated, as `--redis-url` takes them.
    pub fn urls(&self) -> String {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}
