//! The reader of costs in response bodies (JSON and event streams) on arbitrary bytes,
//! as an upstream may send them: it never panics, what it finds does not depend on how
//! the body is cut into chunks, and its memory does not grow with the body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ratelimit_wasm::response_body::{BodyFormat, BodyReader};

fuzz_target!(|data: &[u8]| {
    let Some((&control, body)) = data.split_first() else {
        return;
    };
    let format = if control & 1 == 0 { BodyFormat::Json } else { BodyFormat::EventStream };
    let chunk = usize::from(control >> 1).max(1);
    let paths: Vec<Vec<String>> = ["usage.total_tokens", "0.n", "message.usage.input_tokens", "a"]
        .iter()
        .map(|path| path.split('.').map(str::to_string).collect())
        .collect();
    let mut whole = BodyReader::new(format, paths.clone());
    let mut cut = BodyReader::new(format, paths);
    let footprint = whole.footprint();
    whole.feed(body);
    for part in body.chunks(chunk) {
        cut.feed(part);
    }
    assert_eq!(whole.found(), cut.found());
    assert_eq!(whole.footprint(), footprint);
});
