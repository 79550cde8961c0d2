//! The tests' HTTP client: replies whatever their status, bursts released together,
//! keep-alive load, raw bytes.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Barrier};
use std::time::Duration;

/// An HTTP response, whatever its status.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// A header's value as a number, failing the test when absent or not a number.
    pub fn number(&self, name: &str) -> u64 {
        let value = self
            .header(name)
            .unwrap_or_else(|| panic!("no {name} header in {self:?}"));
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}: {value:?} is not a number"))
    }
}

/// An HTTP client that keeps its connections alive between requests. Its timeout bounds
/// a hang; every wait inside the products under test is shorter.
pub fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new().timeout(Duration::from_secs(30)).build()
}

fn into_reply(result: Result<ureq::Response, ureq::Error>) -> Reply {
    let response = match result {
        Ok(response) | Err(ureq::Error::Status(_, response)) => response,
        Err(ureq::Error::Transport(e)) => {
            return Reply {
                status: 0,
                headers: vec![],
                body: e.to_string(),
            }
        }
    };
    let status = response.status();
    let headers = response
        .headers_names()
        .into_iter()
        .filter_map(|name| response.header(&name).map(|v| (name.clone(), v.to_string())))
        .collect();
    let mut body = String::new();
    let _ = response.into_reader().take(1 << 20).read_to_string(&mut body);
    Reply {
        status,
        headers,
        body,
    }
}

/// GET with headers; a transport failure is status 0.
pub fn get(url: &str, headers: &[(&str, &str)]) -> Reply {
    get_with(&agent(), url, headers)
}

/// GET with headers and a given agent (reusing its connections).
pub fn get_with(agent: &ureq::Agent, url: &str, headers: &[(&str, &str)]) -> Reply {
    let mut request = agent.get(url);
    for (name, value) in headers {
        request = request.set(name, value);
    }
    into_reply(request.call())
}

/// POST a JSON body with headers; a transport failure is status 0.
pub fn post(url: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let mut request = agent().post(url).set("content-type", "application/json");
    for (name, value) in headers {
        request = request.set(name, value);
    }
    into_reply(request.send_string(body))
}

/// POST with a given agent (reusing its connections); a transport failure is status 0.
pub fn post_with(agent: &ureq::Agent, url: &str, body: &str) -> Reply {
    into_reply(
        agent
            .post(url)
            .set("content-type", "application/json")
            .send_string(body),
    )
}

/// Sends `count` requests at once (released together by a barrier) and returns them.
pub fn concurrently<F>(count: usize, send: F) -> Vec<Reply>
where
    F: Fn(usize) -> Reply + Send + Sync + 'static,
{
    let send = Arc::new(send);
    let barrier = Arc::new(Barrier::new(count));
    let handles: Vec<_> = (0..count)
        .map(|i| {
            let (send, barrier) = (send.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                send(i)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Runs `threads` threads, each with its own keep-alive connection, each sending
/// `per_thread` requests built by `body(thread, i)`; returns every reply.
pub fn load<F>(url: &str, threads: usize, per_thread: usize, body: F) -> Vec<Reply>
where
    F: Fn(usize, usize) -> String + Send + Sync + 'static,
{
    let body = Arc::new(body);
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (body, barrier, url) = (body.clone(), barrier.clone(), url.to_string());
            std::thread::spawn(move || {
                let agent = agent();
                barrier.wait();
                (0..per_thread)
                    .map(|i| post_with(&agent, &url, &body(t, i)))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
}

pub fn count_status(replies: &[Reply], status: u16) -> usize {
    replies.iter().filter(|r| r.status == status).count()
}

/// Writes raw bytes to a port and returns what comes back (for malformed-request tests).
pub fn raw_exchange(port: u16, bytes: &[u8]) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    stream.write_all(bytes).unwrap();
    let mut out = String::new();
    let _ = stream.read_to_string(&mut out);
    out
}

/// Whether the peer has closed the connection (a short read timeout means it is open).
pub fn is_closed(stream: &mut TcpStream) -> bool {
    stream.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let mut buffer = [0u8; 1024];
    match stream.read(&mut buffer) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !(e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut),
    }
}
