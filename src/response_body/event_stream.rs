//! Reading costs from a `text/event-stream` response (server-sent events, the way
//! language-model APIs stream): each event's `data` is a JSON document scanned as it
//! passes, and a path takes its value from the last event that holds it. OpenAI's final
//! chunk carries `usage` (`stream_options.include_usage`); Anthropic's first event
//! carries the input tokens and its last the output tokens. Events that are not JSON
//! (`[DONE]`) or lack a path change nothing. Nothing of a line is kept but the first
//! bytes of its field name.

use super::json_scan::JsonScan;

/// Where the reader is within a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// Reading the field name; `len` bytes of it so far, all matching "data".
    Field { len: usize },
    /// After "data:", before the optional space.
    DataStart,
    /// In a data line's value: fed to the scanner.
    Data,
    /// In a line that is not data (another field, a comment): skipped.
    Skip,
}

const DATA: &[u8] = b"data";

#[derive(Debug)]
pub struct EventStream {
    scanner: JsonScan,
    line: Line,
    /// The previous byte ended a line with CR (a following LF belongs to it).
    after_cr: bool,
    /// The event being read has had a data line already (the next is joined by LF).
    has_data: bool,
    last: Vec<Option<u64>>,
}

impl EventStream {
    pub fn new(scanner: JsonScan) -> EventStream {
        EventStream {
            last: vec![None; scanner.found().len()],
            scanner,
            line: Line::Field { len: 0 },
            after_cr: false,
            has_data: false,
        }
    }

    pub fn footprint(&self) -> usize {
        std::mem::size_of::<Self>() - std::mem::size_of::<JsonScan>()
            + self.scanner.footprint()
            + self.last.capacity() * std::mem::size_of::<Option<u64>>()
    }

    pub fn paths(&self) -> &[Vec<String>] {
        self.scanner.paths()
    }

    /// The value of each path in the last complete event that held it.
    pub fn found(&self) -> &[Option<u64>] {
        &self.last
    }

    pub fn feed(&mut self, bytes: &[u8]) {
        let mut start = 0;
        for (at, &byte) in bytes.iter().enumerate() {
            let after_cr = std::mem::replace(&mut self.after_cr, byte == b'\r');
            if byte == b'\n' && after_cr {
                start = at + 1;
                continue;
            }
            if byte == b'\r' || byte == b'\n' {
                if self.line == Line::Data {
                    self.scanner.feed(bytes.get(start..at).unwrap_or_default());
                }
                self.end_line();
                start = at + 1;
                continue;
            }
            self.line = match self.line {
                Line::Field { len } if len < DATA.len() && DATA.get(len) == Some(&byte) => {
                    Line::Field { len: len + 1 }
                }
                Line::Field { len } if len == DATA.len() && byte == b':' => Line::DataStart,
                Line::Field { .. } => Line::Skip,
                Line::DataStart => {
                    self.start_data();
                    start = if byte == b' ' { at + 1 } else { at };
                    Line::Data
                }
                line => line,
            };
        }
        if self.line == Line::Data {
            self.scanner.feed(bytes.get(start..).unwrap_or_default());
        }
    }

    fn start_data(&mut self) {
        if self.has_data {
            self.scanner.feed(b"\n");
        }
        self.has_data = true;
    }

    fn end_line(&mut self) {
        match self.line {
            // An empty line dispatches the event.
            Line::Field { len: 0 } => self.end_event(),
            // "data" alone is a data line with an empty value.
            Line::Field { len } if len == DATA.len() => self.start_data(),
            Line::DataStart => self.start_data(),
            _ => {}
        }
        self.line = Line::Field { len: 0 };
    }

    fn end_event(&mut self) {
        if self.has_data {
            for (last, found) in self.last.iter_mut().zip(self.scanner.found()) {
                if found.is_some() {
                    *last = *found;
                }
            }
        }
        self.scanner.reset();
        self.has_data = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn read(stream: &str, paths: &[&str]) -> Vec<Option<u64>> {
        let paths: Vec<Vec<String>> = paths
            .iter()
            .map(|path| path.split('.').map(str::to_string).collect())
            .collect();
        let mut results = Vec::new();
        for chunk in [1, 2, 3, 7, 64, stream.len().max(1)] {
            let mut events = EventStream::new(JsonScan::new(paths.clone()));
            for part in stream.as_bytes().chunks(chunk) {
                events.feed(part);
            }
            results.push(events.found().to_vec());
        }
        assert!(results.windows(2).all(|pair| pair[0] == pair[1]), "{results:?}");
        results.swap_remove(0)
    }

    #[test]
    fn openai_usage_comes_from_the_final_chunk() {
        let stream = "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n\
                      data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":12,\"total_tokens\":21}}\n\n\
                      data: [DONE]\n\n";
        assert_eq!(
            read(stream, &["usage.prompt_tokens", "usage.completion_tokens"]),
            [Some(9), Some(12)]
        );
    }

    #[test]
    fn anthropic_input_comes_first_and_output_last() {
        let stream = "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\r\n\r\n\
                      event: ping\r\ndata: {\"type\": \"ping\"}\r\n\r\n\
                      event: message_delta\r\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\r\n\r\n\
                      event: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n";
        assert_eq!(
            read(stream, &["message.usage.input_tokens", "usage.output_tokens"]),
            [Some(25), Some(15)]
        );
    }

    #[test]
    fn data_lines_join_comments_and_other_fields_are_skipped_and_an_unfinished_event_counts_not() {
        let stream = ": keep-alive\n\
                      id: 7\n\
                      data: {\"usage\":\n\
                      data:{\"total\": 5}}\n\
                      dataz: {\"usage\": {\"total\": 6}}\n\
                      \n\
                      data: {\"usage\": {\"total\": 8}}\n";
        assert_eq!(read(stream, &["usage.total"]), [Some(5)]);
        assert_eq!(
            read("data: {\"n\": 1}\r\rdata: {\"n\": 2}\r\r", &["n"]),
            [Some(2)]
        );
    }

    #[test]
    fn a_long_event_costs_no_memory() {
        let mut events = EventStream::new(JsonScan::new(vec![vec!["n".to_string()]]));
        let before = events.footprint();
        events.feed(b"data: {\"text\": \"");
        for _ in 0..10_000 {
            events.feed(&[b'x'; 100]);
        }
        events.feed(b"\", \"n\": 3}\n\n");
        assert_eq!(events.found(), [Some(3)]);
        assert_eq!(events.footprint(), before);
    }
}
