//! A TCP proxy that delays every byte by a fixed one-way time in each direction: the
//! network hop of a production deployment (Envoy to the shim, the shim to Redis) on a
//! loopback-only machine whose kernel has no `netem` qdisc. `make bench` builds it with
//! plain `rustc` (standard library only) for bench/distance.py.
//!
//!     delay-proxy LISTEN UPSTREAM DELAY_MICROSECONDS
//!
//! Each direction of a connection is a reader thread, which stamps what it read with the
//! instant it may leave, and a writer thread, which sleeps until then: the delay is added
//! to every chunk without limiting bandwidth or reordering, as propagation delay is. The
//! writer threads ask the kernel for 1 ns timer slack, or a 250 µs sleep would end up to
//! 50 µs late. The tokio or asyncio timers a proxy would otherwise use tick in whole
//! milliseconds.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

extern "C" {
    fn prctl(option: i32, ...) -> i32;
}
const PR_SET_TIMERSLACK: i32 = 29;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: delay-proxy LISTEN UPSTREAM DELAY_MICROSECONDS");
        std::process::exit(2);
    }
    let delay = Duration::from_micros(args[3].parse().expect("DELAY_MICROSECONDS: a whole number"));
    let listener = TcpListener::bind(&args[1]).expect("LISTEN: cannot bind");
    let upstream = args[2].clone();
    for client in listener.incoming().flatten() {
        let upstream = upstream.clone();
        thread::spawn(move || {
            let Ok(server) = TcpStream::connect(&upstream) else { return };
            for stream in [&client, &server] {
                let _ = stream.set_nodelay(true);
            }
            relay(client.try_clone().unwrap(), server.try_clone().unwrap(), delay);
            relay(server, client, delay);
        });
    }
}

/// Copies `from` to `to`, each chunk `delay` after it was read; ends the write side of
/// `to` when `from` ends.
fn relay(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (send, receive) = mpsc::channel::<(Instant, Vec<u8>)>();
    thread::spawn(move || {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if send.send((Instant::now() + delay, buffer[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    });
    thread::spawn(move || {
        // SAFETY: prctl with PR_SET_TIMERSLACK takes one unsigned long and touches no memory.
        unsafe { prctl(PR_SET_TIMERSLACK, 1u64) };
        for (due, chunk) in receive {
            let now = Instant::now();
            if due > now {
                thread::sleep(due - now);
            }
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
