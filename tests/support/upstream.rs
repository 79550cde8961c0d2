//! A real HTTP/1.1 upstream for Envoy to route to, whose behaviour each request chooses
//! with the `x-upstream` header: answer at once (no header), `hold` until the test
//! releases the request's `x-hold` name, `delay-<ms>`, `reset` (half a response, then
//! the connection closes), `reset-early` (the connection closes before any response),
//! `never` (no answer until Envoy gives up on it). An answer reports what the request
//! cost, as a language-model API does, when the request's `x-report` says where: `header`
//! (`x-usage-tokens`), `trailer` (`x-usage-tokens` after a chunked body), `json`
//! (`usage.total_tokens` in a JSON body) or `stall` (the header, then a body that never
//! ends until Envoy gives up on it), the count being its `x-tokens`. A thread per
//! connection on 127.0.0.1; [`Upstream::in_flight`] counts the requests received and not
//! yet answered, so tests wait on it rather than sleep.

use std::collections::HashSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// How often a waiting request looks whether Envoy closed its connection.
const POLL: Duration = Duration::from_millis(20);

#[derive(Default)]
struct Shared {
    /// Names released by the test, and every name received (for `wait_received`).
    released: Mutex<HashSet<String>>,
    received: Mutex<HashSet<String>>,
    changed: Condvar,
    in_flight: AtomicI64,
    stopped: AtomicBool,
}

pub struct Upstream {
    pub port: u16,
    shared: Arc<Shared>,
}

impl Upstream {
    pub fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared::default());
        let accepting = shared.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if accepting.stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let shared = accepting.clone();
                std::thread::spawn(move || serve(stream, &shared));
            }
        });
        Upstream { port, shared }
    }

    /// Requests received and not answered yet (held, delayed or never answered).
    pub fn in_flight(&self) -> i64 {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    /// Lets the held requests named `name` answer.
    pub fn release(&self, name: &str) {
        self.shared.released.lock().unwrap().insert(name.to_string());
        self.shared.changed.notify_all();
    }

    /// Whether a held request named `name` has arrived.
    pub fn received(&self, name: &str) -> bool {
        self.shared.received.lock().unwrap().contains(name)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::Relaxed);
        // Unblocks the accept loop so that it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        self.shared.changed.notify_all();
    }
}

/// One request's head: the header values the upstream acts on.
struct Head {
    behaviour: String,
    hold: String,
    report: String,
    tokens: String,
}

/// Reads one request head (the tests send no bodies); `None` once the peer closed.
fn read_head(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<Head> {
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let text = String::from_utf8_lossy(&buffer[..end]).to_string();
            buffer.drain(..end + 4);
            let header = |name: &str| {
                text.lines()
                    .skip(1)
                    .filter_map(|line| line.split_once(':'))
                    .find(|(n, _)| n.trim().eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.trim().to_string())
                    .unwrap_or_default()
            };
            return Some(Head {
                behaviour: header("x-upstream"),
                hold: header("x-hold"),
                report: header("x-report"),
                tokens: header("x-tokens"),
            });
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Whether the peer has closed the connection (or it failed).
fn peer_closed(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return true;
    }
    let mut byte = [0u8; 1];
    let closed = match stream.peek(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(error) => error.kind() != ErrorKind::WouldBlock,
    };
    let _ = stream.set_nonblocking(false);
    closed
}

fn serve(mut stream: TcpStream, shared: &Shared) {
    let mut buffer = Vec::new();
    while let Some(head) = read_head(&mut stream, &mut buffer) {
        shared.in_flight.fetch_add(1, Ordering::SeqCst);
        let keep_going = answer(&mut stream, shared, &head);
        shared.in_flight.fetch_sub(1, Ordering::SeqCst);
        if !keep_going {
            return;
        }
    }
}

/// Waits until `done` or until the peer closes; true when `done`.
fn wait(stream: &TcpStream, shared: &Shared, done: impl Fn() -> bool) -> bool {
    loop {
        if done() {
            return true;
        }
        if peer_closed(stream) || shared.stopped.load(Ordering::Relaxed) {
            return false;
        }
        // A release missed between the look and the wait costs one poll at most.
        let released = shared.released.lock().unwrap();
        drop(shared.changed.wait_timeout(released, POLL).unwrap());
    }
}

/// Answers one request as its head asks; false when the connection is done.
fn answer(stream: &mut TcpStream, shared: &Shared, head: &Head) -> bool {
    let behaviour = head.behaviour.as_str();
    if behaviour == "hold" {
        shared.received.lock().unwrap().insert(head.hold.clone());
        let name = head.hold.clone();
        let released = || shared.released.lock().unwrap().contains(&name);
        if !wait(stream, shared, released) {
            return false;
        }
    } else if let Some(ms) = behaviour.strip_prefix("delay-") {
        let until = std::time::Instant::now() + Duration::from_millis(ms.parse().unwrap_or(0));
        if !wait(stream, shared, || std::time::Instant::now() >= until) {
            return false;
        }
    } else if behaviour == "never" {
        wait(stream, shared, || false);
        return false;
    } else if behaviour == "reset-early" {
        let _ = stream.shutdown(std::net::Shutdown::Both);
        return false;
    } else if behaviour == "reset" {
        // Headers promising a body that never comes whole.
        let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\npartial");
        let _ = stream.shutdown(std::net::Shutdown::Both);
        return false;
    }
    let tokens = &head.tokens;
    let response = match head.report.as_str() {
        "header" => format!("HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-usage-tokens: {tokens}\r\n\r\nok"),
        "json" => {
            let body = format!(r#"{{"id":"chat-1","usage":{{"prompt_tokens":1,"total_tokens":{tokens}}}}}"#);
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
        }
        "trailer" => format!(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-usage-tokens\r\n\r\n\
             5\r\nhello\r\n0\r\nx-usage-tokens: {tokens}\r\n\r\n"
        ),
        "stall" => {
            let head = format!(
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nx-usage-tokens: {tokens}\r\n\r\n5\r\nhello\r\n"
            );
            if stream.write_all(head.as_bytes()).is_ok() {
                wait(stream, shared, || false);
            }
            return false;
        }
        _ => {
            let body = "upstream ok";
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
        }
    };
    stream.write_all(response.as_bytes()).is_ok()
}
