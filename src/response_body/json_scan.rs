//! Finding numbers at given paths in a JSON document as it streams past, keeping nothing
//! of it: the scanner's memory is fixed by the paths (a frame per path segment, the
//! longest segment of a key, a short number), whatever the document's size or nesting.
//!
//! A path is a list of segments: an object's field, or, written in decimal, an array's
//! index (`choices.0.usage.total_tokens`). A value counts when it is a non-negative
//! integer, a whole number written as a float, or a string of digits; the last value at
//! a path wins. The scanner checks the document's structure along the paths (inside a
//! container no path goes through, it follows only strings and nesting): at the first
//! byte that cannot be JSON it stops, keeping what it found before. Keys are compared
//! as written (an escaped key does not match).

use super::scalar_cost::{is_number_byte, number_cost, text_cost, MAX_VALUE_TEXT};
pub use crate::config::MAX_PATHS;

/// A container on the way to a path: which paths still match its location.
#[derive(Debug, Clone, Copy)]
struct Frame {
    array: bool,
    /// The index of the array element being read.
    index: u64,
    /// Bit i: path i's first `depth` segments match this container's location.
    live: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Value,
    /// After `{`: a key or `}`.
    FirstKey,
    /// After `,` in an object.
    Key,
    Colon,
    /// After a value in a container: `,` or the container's end.
    Separator,
    /// The root value ended: anything after it is ignored.
    Done,
    /// Not JSON: nothing more is read.
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    None,
    Key { escaped: bool },
    Text { escaped: bool },
    Number,
    Literal,
}

#[derive(Debug)]
pub struct JsonScan {
    paths: Vec<Vec<String>>,
    /// Live containers from the root down; containers no path goes through are only
    /// counted, in `dead_depth`.
    stack: Vec<Frame>,
    dead_depth: u64,
    /// Inside a dead container: whether a string is open, and after a backslash.
    dead_string: Option<bool>,
    expect: Expect,
    token: Token,
    /// The key being read, or the last one read, up to the longest segment plus one.
    key: Vec<u8>,
    key_cap: usize,
    /// Paths whose value is the scalar being read, and its text.
    targets: u16,
    text: Vec<u8>,
    found: Vec<Option<u64>>,
}

impl JsonScan {
    /// A scanner for `paths` (at most [`MAX_PATHS`], each non-empty).
    pub fn new(paths: Vec<Vec<String>>) -> JsonScan {
        let key_cap = paths.iter().flatten().map(String::len).max().unwrap_or(0) + 1;
        let depth = paths.iter().map(Vec::len).max().unwrap_or(0);
        JsonScan {
            found: vec![None; paths.len()],
            paths,
            stack: Vec::with_capacity(depth),
            dead_depth: 0,
            dead_string: None,
            expect: Expect::Value,
            token: Token::None,
            key: Vec::with_capacity(key_cap),
            key_cap,
            targets: 0,
            text: Vec::with_capacity(MAX_VALUE_TEXT),
        }
    }

    /// Bytes this scanner holds, its paths included: what a worker budgets for it.
    pub fn footprint(&self) -> usize {
        let paths: usize = self
            .paths
            .iter()
            .map(|path| {
                std::mem::size_of::<Vec<String>>()
                    + path
                        .iter()
                        .map(|segment| std::mem::size_of::<String>() + segment.capacity())
                        .sum::<usize>()
            })
            .sum();
        std::mem::size_of::<Self>()
            + paths
            + self.stack.capacity() * std::mem::size_of::<Frame>()
            + self.key.capacity()
            + self.text.capacity()
            + self.found.capacity() * std::mem::size_of::<Option<u64>>()
    }

    pub fn paths(&self) -> &[Vec<String>] {
        &self.paths
    }

    /// The value found at each path so far (in the order of `paths`).
    pub fn found(&self) -> &[Option<u64>] {
        &self.found
    }

    /// Starts a new document with the same paths (an event stream's next event).
    pub fn reset(&mut self) {
        self.stack.clear();
        self.dead_depth = 0;
        self.dead_string = None;
        self.expect = Expect::Value;
        self.token = Token::None;
        self.key.clear();
        self.targets = 0;
        self.text.clear();
        self.found.iter_mut().for_each(|value| *value = None);
    }

    pub fn feed(&mut self, bytes: &[u8]) {
        let mut at = 0;
        while let Some(&byte) = bytes.get(at) {
            if matches!(self.expect, Expect::Done | Expect::Failed) {
                return;
            }
            // The text of a string no path reads (most of a body) is passed over whole.
            let unread_string = match (self.dead_depth, self.dead_string, self.token) {
                (0, _, Token::Text { escaped: false }) => self.targets == 0,
                (_, Some(false), _) => self.dead_depth > 0,
                _ => false,
            };
            if unread_string && byte != b'"' && byte != b'\\' {
                let rest = bytes.get(at..).unwrap_or_default();
                at += rest
                    .iter()
                    .position(|b| *b == b'"' || *b == b'\\')
                    .unwrap_or(rest.len());
                continue;
            }
            if self.dead_depth > 0 {
                self.skip_dead(byte);
            } else {
                self.step(byte);
            }
            at += 1;
        }
    }

    /// Inside containers no path goes through: only strings and nesting matter.
    fn skip_dead(&mut self, byte: u8) {
        match (self.dead_string, byte) {
            (Some(true), _) => self.dead_string = Some(false),
            (Some(false), b'\\') => self.dead_string = Some(true),
            (Some(false), b'"') => self.dead_string = None,
            (Some(false), _) => {}
            (None, b'"') => self.dead_string = Some(false),
            (None, b'{' | b'[') => self.dead_depth += 1,
            (None, b'}' | b']') => {
                self.dead_depth -= 1;
                if self.dead_depth == 0 {
                    self.value_ended();
                }
            }
            (None, _) => {}
        }
    }

    fn step(&mut self, byte: u8) {
        match self.token {
            Token::Key { escaped } => return self.key_byte(byte, escaped),
            Token::Text { escaped } => return self.text_byte(byte, escaped),
            Token::Number if is_number_byte(byte) => return self.keep_text(byte),
            Token::Literal if byte.is_ascii_lowercase() => return,
            Token::Number => {
                self.token = Token::None;
                let value = number_cost(&self.text);
                self.settle_scalar(value);
            }
            Token::Literal => {
                self.token = Token::None;
                self.settle_scalar(None);
            }
            Token::None => {}
        }
        if byte.is_ascii_whitespace() {
            return;
        }
        match (self.expect, byte) {
            (Expect::Value, _) => self.start_value(byte),
            (Expect::FirstKey | Expect::Key, b'"') => {
                self.key.clear();
                self.token = Token::Key { escaped: false };
            }
            (Expect::FirstKey, b'}') => self.close(false),
            (Expect::Colon, b':') => self.expect = Expect::Value,
            (Expect::Separator, b',') => match self.stack.last_mut() {
                Some(frame) if frame.array => {
                    frame.index += 1;
                    self.expect = Expect::Value;
                }
                Some(_) => self.expect = Expect::Key,
                None => self.expect = Expect::Failed,
            },
            (Expect::Separator, b'}') => self.close(false),
            (Expect::Separator, b']') => self.close(true),
            _ => self.expect = Expect::Failed,
        }
    }

    fn start_value(&mut self, byte: u8) {
        // An empty array closes where a value was expected.
        if byte == b']'
            && self
                .stack
                .last()
                .is_some_and(|frame| frame.array && frame.index == 0)
        {
            return self.close(true);
        }
        let (leaves, through) = self.matching_here();
        match byte {
            b'{' | b'[' => {
                if through == 0 {
                    self.dead_depth = 1;
                } else {
                    self.stack.push(Frame {
                        array: byte == b'[',
                        index: 0,
                        live: through,
                    });
                    self.expect = if byte == b'[' {
                        Expect::Value
                    } else {
                        Expect::FirstKey
                    };
                }
            }
            b'"' => self.start_scalar(Token::Text { escaped: false }, leaves, None),
            b'-' | b'0'..=b'9' => self.start_scalar(Token::Number, leaves, Some(byte)),
            b't' | b'f' | b'n' => self.start_scalar(Token::Literal, leaves, None),
            _ => self.expect = Expect::Failed,
        }
    }

    fn start_scalar(&mut self, token: Token, targets: u16, first: Option<u8>) {
        self.token = token;
        self.targets = targets;
        self.text.clear();
        if let Some(byte) = first {
            self.keep_text(byte);
        }
    }

    /// The paths that end at the value about to start, and those that go on through it.
    fn matching_here(&self) -> (u16, u16) {
        let Some(frame) = self.stack.last() else {
            // The root: every path goes through it (none is empty).
            return (0, all_paths(self.paths.len()));
        };
        let depth = self.stack.len() - 1;
        let (mut leaves, mut through) = (0u16, 0u16);
        for (bit, path) in self.paths.iter().enumerate() {
            if frame.live & (1 << bit) == 0 {
                continue;
            }
            let Some(segment) = path.get(depth) else {
                continue;
            };
            let matches = if frame.array {
                segment.parse::<u64>().ok() == Some(frame.index)
            } else {
                self.key.len() < self.key_cap && self.key == segment.as_bytes()
            };
            if matches {
                if path.len() == depth + 1 {
                    leaves |= 1 << bit;
                } else {
                    through |= 1 << bit;
                }
            }
        }
        (leaves, through)
    }

    fn key_byte(&mut self, byte: u8, escaped: bool) {
        match (escaped, byte) {
            (false, b'"') => {
                self.token = Token::None;
                self.expect = Expect::Colon;
                return;
            }
            // An escaped key is kept past its cap: it matches no segment.
            (false, b'\\') => {
                self.token = Token::Key { escaped: true };
                self.key.resize(self.key_cap, 0);
                return;
            }
            _ => self.token = Token::Key { escaped: false },
        }
        if self.key.len() < self.key_cap {
            self.key.push(byte);
        }
    }

    fn text_byte(&mut self, byte: u8, escaped: bool) {
        match (escaped, byte) {
            (false, b'"') => {
                self.token = Token::None;
                let value = text_cost(&self.text);
                self.settle_scalar(value);
            }
            (false, b'\\') => {
                self.token = Token::Text { escaped: true };
                // Digits need no escapes: an escaped string is no cost.
                self.targets = 0;
            }
            _ => {
                self.token = Token::Text { escaped: false };
                self.keep_text(byte);
            }
        }
    }

    fn keep_text(&mut self, byte: u8) {
        if self.targets == 0 {
            return;
        }
        if self.text.len() < MAX_VALUE_TEXT {
            self.text.push(byte);
        } else {
            self.targets = 0;
        }
    }

    fn settle_scalar(&mut self, value: Option<u64>) {
        for (bit, found) in self.found.iter_mut().enumerate() {
            if self.targets & (1 << bit) != 0 {
                if let Some(value) = value {
                    *found = Some(value);
                }
            }
        }
        self.targets = 0;
        self.value_ended();
    }

    fn close(&mut self, array: bool) {
        match self.stack.pop() {
            Some(frame) if frame.array == array => self.value_ended(),
            _ => self.expect = Expect::Failed,
        }
    }

    fn value_ended(&mut self) {
        self.expect = if self.stack.is_empty() {
            Expect::Done
        } else {
            Expect::Separator
        };
    }
}

fn all_paths(count: usize) -> u16 {
    if count >= MAX_PATHS {
        u16::MAX
    } else {
        (1u16 << count) - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::MAX_LIMIT;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn paths(list: &[&str]) -> Vec<Vec<String>> {
        list.iter()
            .map(|path| path.split('.').map(str::to_string).collect())
            .collect()
    }

    /// The values at `wanted` in `document`, fed in chunks of every size from 1 byte.
    fn scan(document: &str, wanted: &[&str]) -> Vec<Option<u64>> {
        let mut results = Vec::new();
        for chunk in 1..=document.len().max(1) {
            let mut scanner = JsonScan::new(paths(wanted));
            for part in document.as_bytes().chunks(chunk) {
                scanner.feed(part);
            }
            results.push(scanner.found().to_vec());
        }
        assert!(
            results.windows(2).all(|pair| pair[0] == pair[1]),
            "{document}: {results:?}"
        );
        results.swap_remove(0)
    }

    #[test]
    fn numbers_are_found_at_their_paths_however_the_document_is_cut() {
        let document = r#"{"id": "x", "usage": {"prompt_tokens": 9, "completion_tokens": 12.0,
            "total_tokens": "21", "neg": -1, "half": 0.5, "big": 1e300, "list": [1]}}"#;
        assert_eq!(
            scan(
                document,
                &[
                    "usage.prompt_tokens",
                    "usage.completion_tokens",
                    "usage.total_tokens"
                ]
            ),
            [Some(9), Some(12), Some(21)]
        );
        for missing in [
            "usage.neg",
            "usage.half",
            "usage.list",
            "usage",
            "usage.none",
            "id.x",
        ] {
            assert_eq!(scan(document, &[missing]), [None], "{missing}");
        }
        assert_eq!(scan(document, &["usage.big"]), [Some(MAX_LIMIT)]);
    }

    #[test]
    fn only_the_fields_on_the_path_count_however_deep_the_rest_nests() {
        let document = r#"{"choices": [{"usage": {"total_tokens": 1}, "n": 2}, {"n": 3,
            "deep": [[[{"usage": {"total_tokens": 7}}]]]}], "x\"usage": {"total_tokens": 5},
            "text": "{\"usage\": {\"total_tokens\": 6}}", "usage": {"total_tokens": 42}}"#;
        assert_eq!(scan(document, &["usage.total_tokens"]), [Some(42)]);
        assert_eq!(
            scan(document, &["choices.0.n", "choices.1.n"]),
            [Some(2), Some(3)]
        );
        assert_eq!(scan(document, &["choices.2.n", "choices.x.n"]), [None, None]);
        assert_eq!(
            scan(r#"[[], [5, {"a": 6}]]"#, &["1.0", "1.1.a", "0.0"]),
            [Some(5), Some(6), None]
        );
    }

    #[test]
    fn the_last_value_at_a_path_wins_and_other_values_do_not_erase_it() {
        assert_eq!(
            scan(r#"{"n": 1, "n": 2, "n": null, "n": "x"}"#, &["n"]),
            [Some(2)]
        );
    }

    #[test]
    fn a_document_that_is_not_json_keeps_only_what_came_before_the_fault() {
        assert_eq!(scan("[DONE]", &["usage.total_tokens"]), [None]);
        assert_eq!(scan(r#"{"n": 4, ]"n": 5}"#, &["n"]), [Some(4)]);
        assert_eq!(scan(r#"{"n": 4} {"n": 5}"#, &["n"]), [Some(4)], "one document");
        assert_eq!(scan(r#"{"a": {"n": 1], "m": 2}}"#, &["a.m"]), [None]);
        // A number cut off by the end of the stream was never whole.
        assert_eq!(scan(r#"{"n": 90"#, &["n"]), [None]);
    }

    #[test]
    fn memory_is_fixed_by_the_paths_not_by_the_document() {
        let mut scanner = JsonScan::new(paths(&["usage.total_tokens"]));
        let before = scanner.footprint();
        scanner.feed(b"{\"pad\": [");
        for _ in 0..10_000 {
            scanner.feed(b"[[{\"a\": \"a long string that is not kept\"}]],");
        }
        scanner.feed(format!("0], \"{}\": 1, ", "k".repeat(100_000)).as_bytes());
        scanner.feed(br#""usage": {"total_tokens": 77}}"#);
        assert_eq!(scanner.found(), [Some(77)]);
        assert_eq!(scanner.footprint(), before);
        scanner.reset();
        assert_eq!(scanner.found(), [None]);
    }
}
