//! Real Redis servers, standalone or a three-master cluster, on claimed loopback ports:
//! started for one test, or shared by every test of a test binary (each test's shim
//! keeping its keys apart under a prefix of its own).

use super::ports::{claim_port, ClaimedPort};
use super::process::{scratch, wait_until, Process};
use std::process::Command;
use std::sync::OnceLock;
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

/// The function and script calls (FCALL, EVALSHA, EVAL) counted in the text of `INFO
/// commandstats`.
fn scripts_in_commandstats(info: &str) -> u64 {
    info.lines()
        .filter(|line| {
            ["cmdstat_fcall:", "cmdstat_evalsha:", "cmdstat_eval:"]
                .iter()
                .any(|name| line.starts_with(name))
        })
        .filter_map(|line| {
            line.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
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

    /// Functions and scripts this Redis has run (FCALL, EVALSHA and EVAL calls).
    pub fn scripts_run(&self) -> u64 {
        scripts_in_commandstats(&self.cli(&["INFO", "commandstats"]))
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

    /// Runs one command on the node that owns `key` (redis-cli follows redirections).
    pub fn cli(&self, key_hint: &[&str]) -> String {
        let output = Command::new("redis-cli")
            .args(["-c", "-p", &self.ports[0].to_string()])
            .args(key_hint)
            .output()
            .unwrap();
        assert!(output.status.success(), "redis-cli -c {key_hint:?} failed");
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    }

    /// The cluster's slot of a key, as Redis computes it.
    pub fn slot(&self, key: &str) -> u16 {
        self.cli(&["CLUSTER", "KEYSLOT", key]).parse().unwrap()
    }

    /// Moves `slot`, which must hold no key, from the master at `ports[from]` to the one
    /// at `ports[to]`, as a resharding would.
    pub fn move_empty_slot(&self, slot: u16, from: usize, to: usize) {
        let id = |i: usize| redis_cli(self.ports[i], &["CLUSTER", "MYID"]).unwrap();
        let (from_id, to_id, slot) = (id(from), id(to), slot.to_string());
        let set = |i: usize, args: &[&str]| {
            let mut command = vec!["CLUSTER", "SETSLOT", &slot];
            command.extend(args);
            assert_eq!(
                redis_cli(self.ports[i], &command).as_deref(),
                Some("OK"),
                "{command:?}"
            );
        };
        set(to, &["IMPORTING", &from_id]);
        set(from, &["MIGRATING", &to_id]);
        set(to, &["NODE", &to_id]);
        set(from, &["NODE", &to_id]);
        for other in (0..self.ports.len()).filter(|&i| i != from && i != to) {
            set(other, &["NODE", &to_id]);
        }
    }

    /// Functions and scripts run (FCALL, EVALSHA and EVAL calls) over every master.
    pub fn scripts_run(&self) -> u64 {
        self.ports
            .iter()
            .map(|&port| {
                scripts_in_commandstats(&redis_cli(port, &["INFO", "commandstats"]).unwrap_or_default())
            })
            .sum()
    }

    /// Number of keys over every master.
    pub fn key_count(&self) -> u64 {
        self.ports
            .iter()
            .map(|&port| redis_cli(port, &["DBSIZE"]).unwrap().parse::<u64>().unwrap())
            .sum()
    }

    /// The cluster's clock (its first master's), ms since the Unix epoch.
    pub fn time_ms(&self) -> u64 {
        let time = redis_cli(self.ports[0], &["TIME"]).unwrap();
        let mut parts = time.lines().map(|l| l.trim().parse::<u64>().unwrap());
        let (seconds, micros) = (parts.next().unwrap(), parts.next().unwrap());
        seconds * 1000 + micros / 1000
    }

    /// The seed URLs, comma-separated, as `--redis-url` takes them.
    pub fn urls(&self) -> String {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn nodes(&self) -> &[Process] {
        &self.nodes
    }

    /// Stops every node.
    pub fn stop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
    }
}

/// The standalone Redis this test binary's tests share, started on first use, stopped
/// when the test process ends.
pub fn shared_redis() -> &'static Redis {
    static SHARED: OnceLock<Redis> = OnceLock::new();
    SHARED.get_or_init(|| {
        let mut redis = Redis::start();
        redis.process.tie_to_test_process();
        redis
    })
}

/// The Redis Cluster this test binary's tests share, as [`shared_redis`].
pub fn shared_cluster() -> &'static RedisCluster {
    static SHARED: OnceLock<RedisCluster> = OnceLock::new();
    SHARED.get_or_init(|| {
        let mut cluster = RedisCluster::start();
        for node in &mut cluster.nodes {
            node.tie_to_test_process();
        }
        cluster
    })
}
