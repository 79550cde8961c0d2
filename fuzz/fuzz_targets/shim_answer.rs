//! The filter's reading of the shim's answer: any status and body give one answer per
//! request asked, or a failure, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ratelimit_wasm::shim_call::read_batch_answer;

fuzz_target!(|data: &[u8]| {
    let Some((&expected, body)) = data.split_first() else {
        return;
    };
    let expected = usize::from(expected % 40);
    for status in [Some("200"), Some("504"), None] {
        if let Ok(answers) = read_batch_answer(status, body, expected) {
            assert_eq!(answers.each.len(), expected);
        }
    }
});
