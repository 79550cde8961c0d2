//! Ports for servers that cannot be told to pick their own.
//!
//! The shim binds port 0 in-process and Envoy binds port 0 and reports what it got, so
//! neither needs this. Redis cannot (`--port 0` turns TCP off), and a server restarted on
//! its old port must get that port back. A [`ClaimedPort`] is taken below the kernel's
//! ephemeral range, so no outgoing connection is ever given it, and claimed with a lock
//! file shared by every test process on the machine, so no other test takes it while it
//! is held (even while its server is down). A process outside the tests may still hold
//! it: starting a server on a claimed port retries on a bind failure (see `redis.rs`).

use std::fs::{self, File, OpenOptions};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// The lowest port handed out: above the ports demos and well-known services use.
const LOWEST: u16 = 20_000;

pub struct ClaimedPort {
    pub port: u16,
    // Held open: the lock lasts as long as the file stays open, and ends with the
    // process however it ends.
    _lock: File,
}

fn claims_dir() -> PathBuf {
    let dir = std::env::temp_dir().join("ratelimit-wasm-test-ports");
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// The first port of the kernel's ephemeral range (32768 by default on Linux).
fn ephemeral_start() -> u16 {
    fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// Claims a port no test process holds and nothing listens on right now.
pub fn claim_port() -> ClaimedPort {
    let end = ephemeral_start();
    assert!(
        end > LOWEST + 1_000,
        "ephemeral ports start at {end}: no room below"
    );
    let span = u32::from(end - LOWEST);
    // Start somewhere different in each process, to make contention rare.
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let start = (nanos ^ std::process::id().wrapping_mul(2_654_435_761)) % span;
    let dir = claims_dir();
    for step in 0..span {
        let port = LOWEST + ((start + step) % span) as u16;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(port.to_string()))
            .unwrap();
        if lock.try_lock().is_err() {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return ClaimedPort { port, _lock: lock };
        }
    }
    panic!("no free port between {LOWEST} and {end}");
}

/// A port where every connection is refused, for as long as the test process lives: a
/// socket bound to it but not listening holds the port, so nothing else can listen there
/// (a port merely found free could be taken by another process the next moment).
pub fn refusing_port() -> u16 {
    static HELD: OnceLock<tokio::net::TcpSocket> = OnceLock::new();
    let socket = HELD.get_or_init(|| {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        socket
    });
    socket.local_addr().unwrap().port()
}
