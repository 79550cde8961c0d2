//! A real HTTP/1.1 upstream for Envoy to route to, whose behaviour each request chooses
//! with the `x-upstream` header: answer at once (no header), `hold` until the test
//! releases the request's `x-hold` name, `delay-<ms>`, `reset` (half a response, then
//! the connection closes), `reset-early` (the connection closes before any response),
//! `never` (no answer until Envoy gives up on it). An answer reports what the request
//! cost, as a language-model API does, when the request's `x-report` says where: `header`
//! (`x-usage-tokens`; `header-twice` sends it twice, 1 first), `trailer` (`x-usage-tokens` after a chunked body), `json`
//! (`usage.total_tokens` in a JSON body), `stall` (the header, then a body that never
//! ends until Envoy gives up on it), `stall-json` (most of a JSON body, never its usage),
//! `big-json` (1 MiB of text before the usage), `openai-stream` (OpenAI's chat completion
//! chunks as server-sent events, the usage in the final one) or `anthropic-stream`
//! (Anthropic's message events: input tokens first, output tokens last), the count being
//! its `x-tokens` (the output; `x-prompt-tokens` the input, 1 unless given). Like a real
//! API it compresses when the request accepts gzip (`content-encoding: gzip`) and
//! answers a `range` with 206 and that part of the body. A thread per connection on
//! 127.0.0.1; [`Upstream::in_flight`] counts the requests received and not yet answered,
//! so tests wait on it rather than sleep.

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
    prompt_tokens: String,
    accept_encoding: String,
    range: String,
}

/// Reads one request head, and skips its body (by its content-length); `None` once the
/// peer closed.
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
            let body_length: usize = header("content-length").parse().unwrap_or(0);
            while buffer.len() < body_length {
                let mut chunk = [0u8; 4096];
                match stream.read(&mut chunk) {
                    Ok(0) | Err(_) => return None,
                    Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                }
            }
            buffer.drain(..body_length);
            return Some(Head {
                behaviour: header("x-upstream"),
                hold: header("x-hold"),
                report: header("x-report"),
                tokens: header("x-tokens"),
                prompt_tokens: header("x-prompt-tokens"),
                accept_encoding: header("accept-encoding"),
                range: header("range"),
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
    let prompt: u64 = head.prompt_tokens.parse().unwrap_or(1);
    let response = match head.report.as_str() {
        "header" => format!("HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-usage-tokens: {tokens}\r\n\r\nok"),
        "header-twice" => format!(
            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-usage-tokens: 1\r\nx-usage-tokens: {tokens}\r\n\r\nok"
        ),
        "json" => {
            let body = format!(
                r#"{{"id":"chat-1","choices":[{{"index":0,"n":{tokens}}}],"usage":{{"prompt_tokens":{prompt},"completion_tokens":{},"total_tokens":{tokens}}}}}"#,
                tokens.parse::<u64>().unwrap_or(0).saturating_sub(prompt)
            );
            return write_body(stream, head, "application/json", body.as_bytes());
        }
        "big-json" => {
            let padding = "x".repeat(1 << 20);
            let body = format!(r#"{{"id":"chat-1","text":"{padding}","usage":{{"total_tokens":{tokens}}}}}"#);
            return write_body(stream, head, "application/json", body.as_bytes());
        }
        "openai-stream" => {
            let chunk = |rest: &str| {
                format!(
                    r#"data: {{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",{rest}}}"#
                ) + "\n\n"
            };
            let mut body = String::new();
            for word in ["Hello", " there", "!"] {
                body += &chunk(&format!(
                    r#""choices":[{{"index":0,"delta":{{"content":"{word}"}},"finish_reason":null}}],"usage":null"#
                ));
            }
            body += &chunk(r#""choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null"#);
            body += &chunk(&format!(
                r#""choices":[],"usage":{{"prompt_tokens":{prompt},"completion_tokens":{tokens},"total_tokens":{}}}"#,
                prompt + tokens.parse::<u64>().unwrap_or(0)
            ));
            body += "data: [DONE]\n\n";
            return write_body(stream, head, "text/event-stream", body.as_bytes());
        }
        "anthropic-stream" => {
            let body = format!(
                "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"id\":\"msg_1\",\"usage\":{{\"input_tokens\":{prompt},\"output_tokens\":1}}}}}}\n\n\
                 event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"Hi\"}}}}\n\n\
                 event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"end_turn\"}},\"usage\":{{\"output_tokens\":{tokens}}}}}\n\n\
                 event: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n"
            );
            return write_body(stream, head, "text/event-stream", body.as_bytes());
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
        "stall-json" => {
            let part = r#"{"id":"chat-1","choices":[{"message":{"content":"most of the answer"#;
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{part}\r\n",
                part.len()
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

/// Writes a body as a real API would for this request: compressed when it accepts gzip
/// (the bytes stand for a gzip stream; no reader here inflates them), and only the
/// part a `range` asks for, with 206.
fn write_body(stream: &mut TcpStream, head: &Head, content_type: &str, body: &[u8]) -> bool {
    let mut extra = String::new();
    let mut status = "200 OK";
    let mut body = body.to_vec();
    if let Some(end) = head
        .range
        .strip_prefix("bytes=0-")
        .and_then(|end| end.parse::<usize>().ok())
    {
        body.truncate(end + 1);
        status = "206 Partial Content";
    }
    if head.accept_encoding.contains("gzip") {
        extra += "content-encoding: gzip\r\n";
        body = [
            &[0x1f, 0x8b, 0x08, 0x00][..],
            &body.iter().rev().copied().collect::<Vec<_>>(),
        ]
        .concat();
    }
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n{extra}\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).is_ok() && stream.write_all(&body).is_ok()
}
