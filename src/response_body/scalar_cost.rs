//! How a scalar found at a cost's path reads as a cost: a non-negative integer, a whole
//! number written as a float, or a string of digits, capped at the largest limit; and
//! how much of one the scanner keeps.

use crate::config::parse_cost;
use crate::wire::MAX_LIMIT;

/// Longest number or digit string read as a value (longer reads as no value).
pub(super) const MAX_VALUE_TEXT: usize = 32;

pub(super) fn is_number_byte(byte: u8) -> bool {
    byte.is_ascii_digit() || matches!(byte, b'-' | b'+' | b'.' | b'e' | b'E')
}

/// A JSON number as a cost: a non-negative integer or whole float, capped at the
/// largest limit.
pub(super) fn number_cost(text: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(text).ok()?;
    if let Some(cost) = parse_cost(text) {
        return Some(cost);
    }
    let float: f64 = text.parse().ok()?;
    let whole = float.is_finite() && float >= 0.0 && float.fract() == 0.0;
    // `as` saturates: a float past u64 reads as the cap.
    whole.then(|| (float as u64).min(MAX_LIMIT))
}

/// A JSON string's contents as a cost: digits only.
pub(super) fn text_cost(text: &[u8]) -> Option<u64> {
    std::str::from_utf8(text).ok().and_then(parse_cost)
}
