//! Several regions on one machine, each a process group of its own: a Redis and the
//! shim's binary per region, and between regions the links a shim reads its peers'
//! Redis through, each a `bench/delay_proxy.rs` process adding a one-way delay. A link
//! is cut by killing its proxy (live connections reset, new ones refused) and healed by
//! starting it again on its port.

use super::*;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// The delay proxy, built once per test process with plain `rustc`.
pub fn delay_proxy_binary() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = scratch("delay-proxy");
            let binary = dir.join("delay-proxy");
            let status = Command::new("rustc")
                .args(["--edition", "2021", "-O", "-o"])
                .arg(&binary)
                .arg(repo_root().join("bench/delay_proxy.rs"))
                .status()
                .expect("rustc runs");
            assert!(status.success(), "bench/delay_proxy.rs does not build");
            binary
        })
        .clone()
}

/// One direction's link to a region's Redis: a delay proxy on a port of its own.
pub struct Link {
    pub claim: ClaimedPort,
    upstream: u16,
    delay_us: u64,
    process: Option<Process>,
}

impl Link {
    pub fn start(upstream: u16, delay_us: u64) -> Link {
        let mut link = Link {
            claim: claim_port(),
            upstream,
            delay_us,
            process: None,
        };
        link.heal();
        link
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.claim.port)
    }

    /// Kills the proxy: its connections reset, new ones are refused.
    pub fn cut(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }

    /// Starts the proxy on its port, once it accepts.
    pub fn heal(&mut self) {
        let port = self.claim.port;
        let mut process = Process::spawn(
            Command::new(delay_proxy_binary())
                .arg(format!("127.0.0.1:{port}"))
                .arg(format!("127.0.0.1:{}", self.upstream))
                .arg(self.delay_us.to_string()),
            scratch("link").join("proxy.log"),
        );
        process.tie_to_test_process();
        wait_until("a delay proxy", Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        self.process = Some(process);
    }
}

/// One region: its Redis, its shim, and the links through which its shim reads each
/// other region's Redis (by that region's index).
pub struct Region {
    pub name: String,
    pub redis: Redis,
    pub shim: Option<ShimProcess>,
    pub links: Vec<(usize, Link)>,
}

/// Regions named a, b, c, ... whose links delay each byte by `delay_us` one way.
pub struct Regions {
    pub regions: Vec<Region>,
    pub extra_args: Vec<String>,
}

pub const NAMES: [&str; 5] = ["a", "b", "c", "d", "e"];

/// Every region's shim takes this admin token (`counters show` reads a state without
/// charging it).
pub const ADMIN_TOKEN: &str = "regions-admin";

impl Regions {
    pub fn start(count: usize, delay_us: u64, extra_args: &[&str]) -> Regions {
        let redises: Vec<Redis> = (0..count).map(|_| Redis::start()).collect();
        let ports: Vec<u16> = redises
            .iter()
            .map(|redis| redis.url().rsplit(':').next().unwrap().parse().unwrap())
            .collect();
        let regions = redises
            .into_iter()
            .enumerate()
            .map(|(index, redis)| Region {
                name: NAMES[index].to_string(),
                redis,
                shim: None,
                links: (0..count)
                    .filter(|&peer| peer != index)
                    .map(|peer| (peer, Link::start(ports[peer], delay_us)))
                    .collect(),
            })
            .collect();
        let mut regions = Regions {
            regions,
            extra_args: extra_args.iter().map(|arg| arg.to_string()).collect(),
        };
        for index in 0..count {
            regions.start_shim(index);
        }
        regions
    }

    /// Starts region `index`'s shim (again).
    pub fn start_shim(&mut self, index: usize) {
        let region = &self.regions[index];
        let mut args: Vec<String> = vec!["--region".into(), region.name.clone()];
        for (peer, link) in &region.links {
            args.push("--peer-region".into());
            args.push(format!("{}={}", NAMES[*peer], link.url()));
        }
        args.extend(["--admin-token".to_string(), ADMIN_TOKEN.to_string()]);
        args.extend(self.extra_args.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let shim = ShimProcess::start(&region.redis.url(), &args);
        self.regions[index].shim = Some(shim);
    }

    /// Kills region `index`'s shim with SIGKILL.
    pub fn kill_shim(&mut self, index: usize) {
        if let Some(mut shim) = self.regions[index].shim.take() {
            shim.process.signal("KILL");
            let _ = shim.process.wait_exit(Duration::from_secs(10));
        }
    }

    /// The state of `check` at region `index`, charging nothing (the admin endpoint
    /// `redis-shim counters show` calls): its answer.
    pub fn show(&self, index: usize, check: &serde_json::Value) -> serde_json::Value {
        let url = self
            .check_url(index)
            .replace("/v1/check", "/v1/admin/counters/show");
        let body = serde_json::json!({ "checks": [check] }).to_string();
        let reply = post(&url, &[("x-ratelimit-token", ADMIN_TOKEN)], &body);
        assert_eq!(reply.status, 200, "{reply:?}");
        serde_json::from_str(&reply.body).unwrap()
    }

    pub fn check_url(&self, index: usize) -> String {
        self.regions[index]
            .shim
            .as_ref()
            .expect("the region's shim runs")
            .url("/v1/check")
    }

    /// Cuts every link to and from region `index`.
    pub fn cut_off(&mut self, index: usize) {
        self.each_link_of(index, Link::cut);
    }

    pub fn heal(&mut self, index: usize) {
        self.each_link_of(index, Link::heal);
    }

    /// Cuts the links between regions `one` and `other` only, both ways.
    pub fn cut_between(&mut self, one: usize, other: usize) {
        self.each_link(
            |at, peer| (at, peer) == (one, other) || (at, peer) == (other, one),
            Link::cut,
        );
    }

    pub fn heal_between(&mut self, one: usize, other: usize) {
        self.each_link(
            |at, peer| (at, peer) == (one, other) || (at, peer) == (other, one),
            Link::heal,
        );
    }

    fn each_link_of(&mut self, index: usize, act: impl FnMut(&mut Link)) {
        self.each_link(|at, peer| at == index || peer == index, act);
    }

    fn each_link(&mut self, chosen: impl Fn(usize, usize) -> bool, mut act: impl FnMut(&mut Link)) {
        for (at, region) in self.regions.iter_mut().enumerate() {
            for (peer, link) in &mut region.links {
                if chosen(at, *peer) {
                    act(link);
                }
            }
        }
    }

    pub fn len(&self) -> usize {
        self.regions.len()
    }
}
