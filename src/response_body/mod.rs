//! Reading the numbers a response body reports (`cost_from_response` with `json_field`
//! or `json_fields`) as the body streams past: a JSON document ([`json_scan`]) or an
//! event stream of JSON events ([`event_stream`]). Nothing of the body is kept and no
//! byte is held back; a reader's memory is fixed by its paths.

pub mod event_stream;
pub mod json_scan;
mod scalar_cost;

use event_stream::EventStream;
use json_scan::JsonScan;

/// How a response body is laid out, from its headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFormat {
    Json,
    EventStream,
}

/// Why a body that should report a cost cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unreadable {
    /// Neither JSON nor an event stream.
    ContentType,
    /// Compressed (the filter asked for `identity`; the upstream did not comply).
    Encoded,
}

/// The body's format from its `content-type` and `content-encoding`.
pub fn body_format(
    content_type: Option<&str>,
    content_encoding: Option<&str>,
) -> Result<BodyFormat, Unreadable> {
    let encoded = content_encoding.is_some_and(|encoding| {
        encoding
            .split(',')
            .map(str::trim)
            .any(|coding| !coding.is_empty() && !coding.eq_ignore_ascii_case("identity"))
    });
    if encoded {
        return Err(Unreadable::Encoded);
    }
    let essence = content_type
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    if essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json")) {
        Ok(BodyFormat::Json)
    } else if essence == "text/event-stream" {
        Ok(BodyFormat::EventStream)
    } else {
        Err(Unreadable::ContentType)
    }
}

#[derive(Debug)]
pub enum BodyReader {
    Json(JsonScan),
    Events(EventStream),
}

impl BodyReader {
    /// A reader of `paths` (at most [`json_scan::MAX_PATHS`]) in a body of `format`.
    pub fn new(format: BodyFormat, paths: Vec<Vec<String>>) -> BodyReader {
        let scanner = JsonScan::new(paths);
        match format {
            BodyFormat::Json => BodyReader::Json(scanner),
            BodyFormat::EventStream => BodyReader::Events(EventStream::new(scanner)),
        }
    }

    pub fn feed(&mut self, bytes: &[u8]) {
        match self {
            BodyReader::Json(scanner) => scanner.feed(bytes),
            BodyReader::Events(events) => events.feed(bytes),
        }
    }

    pub fn paths(&self) -> &[Vec<String>] {
        match self {
            BodyReader::Json(scanner) => scanner.paths(),
            BodyReader::Events(events) => events.paths(),
        }
    }

    /// The value found at each path (in the order given to [`BodyReader::new`]).
    pub fn found(&self) -> &[Option<u64>] {
        match self {
            BodyReader::Json(scanner) => scanner.found(),
            BodyReader::Events(events) => events.found(),
        }
    }

    /// Bytes the reader holds: what its worker budgets for it.
    pub fn footprint(&self) -> usize {
        match self {
            BodyReader::Json(scanner) => scanner.footprint(),
            BodyReader::Events(events) => events.footprint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn the_format_comes_from_the_content_type_and_a_compressed_body_is_unreadable() {
        assert_eq!(
            body_format(Some("application/json; charset=utf-8"), None),
            Ok(BodyFormat::Json)
        );
        assert_eq!(
            body_format(Some("Application/Problem+JSON"), Some("identity")),
            Ok(BodyFormat::Json)
        );
        assert_eq!(
            body_format(Some("text/event-stream"), None),
            Ok(BodyFormat::EventStream)
        );
        assert_eq!(
            body_format(Some("application/json"), Some("gzip")),
            Err(Unreadable::Encoded)
        );
        assert_eq!(
            body_format(Some("text/event-stream"), Some("identity, br")),
            Err(Unreadable::Encoded)
        );
        for other in [Some("text/plain"), Some("text/json+xml"), None] {
            assert_eq!(
                body_format(other, None),
                Err(Unreadable::ContentType),
                "{other:?}"
            );
        }
    }
}
