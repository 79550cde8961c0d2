//! Reading a check request's body within bounds of size and time. The handlers call it
//! only after the caller's token is checked, so a caller without it never makes the
//! shim buffer a byte of its body; a body is refused as soon as it exceeds the limit,
//! and one that stops arriving is cut at the body timeout (a client trickling bytes
//! cannot hold its connection and permit for longer).
//!
//! A declared `Content-Length` over the limit is not refused before reading: answering
//! at once and closing with the body still queued makes the kernel reset the connection,
//! and the caller would see a transport error instead of the 413. Reading up to the
//! limit costs no more than an accepted body.

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap};
use futures_util::StreamExt;
use std::time::Duration;

/// Why a body was not read.
#[derive(Debug)]
pub enum BodyError {
    /// Declared or sent over the limit (413).
    TooLarge,
    /// Not complete within the body timeout (408).
    TimedOut,
    /// The connection failed while it was read (400).
    Unreadable(String),
}

/// The whole body, at most `limit` bytes, within `timeout`.
pub async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes, BodyError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    let capacity = declared.map_or(0, |length| usize::try_from(length).unwrap_or(limit).min(limit));
    let read = async move {
        let mut stream = body.into_data_stream();
        let mut buffer = Vec::with_capacity(capacity);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| BodyError::Unreadable(e.to_string()))?;
            if buffer.len() + chunk.len() > limit {
                return Err(BodyError::TooLarge);
            }
            buffer.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(buffer))
    };
    tokio::time::timeout(timeout, read)
        .await
        .unwrap_or(Err(BodyError::TimedOut))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn limits_are_enforced() {
        let second = Duration::from_secs(1);
        let ok = read_body(&HeaderMap::new(), Body::from("abc"), 3, second).await;
        assert_eq!(ok.unwrap(), "abc");
        let long = read_body(&HeaderMap::new(), Body::from("abcd"), 3, second).await;
        assert!(matches!(long, Err(BodyError::TooLarge)));
        let mut declared = HeaderMap::new();
        declared.insert(header::CONTENT_LENGTH, "1000".parse().unwrap());
        // A declared length only sizes the buffer.
        let sized = read_body(&declared, Body::from("a"), 3, second).await;
        assert_eq!(sized.unwrap(), "a");
        let stalled = Body::from_stream(futures_util::stream::pending::<Result<Bytes, std::io::Error>>());
        let slow = read_body(&HeaderMap::new(), stalled, 3, Duration::from_millis(20)).await;
        assert!(matches!(slow, Err(BodyError::TimedOut)));
    }
}
