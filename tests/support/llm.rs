//! A real upstream that reports what each request cost, as a language-model API does:
//! the request's `x-tokens` header says how many tokens to report and `x-report` where
//! (`header`: an `x-usage-tokens` response header; `trailer`: an `x-usage-tokens`
//! trailer after a chunked body; `json`: `usage.total_tokens` in a JSON body; `stall`:
//! the header, then a body that never ends until the test drops it; `none`: nothing).
//! HTTP/1.1 on 127.0.0.1, a thread per connection.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

pub struct LlmUpstream {
    pub port: u16,
}

impl LlmUpstream {
    pub fn start() -> LlmUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                thread::spawn(move || serve(stream));
            }
        });
        LlmUpstream { port }
    }
}

/// Answers requests on one connection until the peer closes it.
fn serve(stream: TcpStream) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut head = Vec::new();
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if line == "\r\n" => break,
                Ok(_) => head.push(line.trim_end().to_string()),
            }
        }
        let header = |name: &str| {
            head.iter().skip(1).find_map(|line| {
                let (n, v) = line.split_once(':')?;
                n.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_string())
            })
        };
        let length: usize = header("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let tokens = header("x-tokens").unwrap_or_else(|| "0".into());
        let answer = match header("x-report").as_deref().unwrap_or("header") {
            "header" => format!("HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-usage-tokens: {tokens}\r\n\r\nok"),
            "json" => {
                let body =
                    format!(r#"{{"id":"chat-1","usage":{{"prompt_tokens":1,"total_tokens":{tokens}}}}}"#);
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
                if writer.write_all(head.as_bytes()).is_err() {
                    return;
                }
                // Until Envoy gives up on the stream (the client went away).
                let _ = writer.set_read_timeout(Some(Duration::from_secs(30)));
                let _ = reader.read(&mut [0; 1]);
                return;
            }
            _ => "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_string(),
        };
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}
