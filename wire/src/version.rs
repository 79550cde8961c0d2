//! Which releases of the filter and the shim talk to each other, and how each says its
//! own: the filter sends its version in the [`VERSION_HEADER`] request header, the shim
//! its own in the same response header. A header, not a body field, because a shim of
//! 0.1.0 (the last release without one) refuses unknown body fields but ignores headers.
//!
//! The rule: a shim serves filters of its own minor version, the one before and the one
//! after (same major). Within that window a newer filter may send check fields the shim
//! does not know; the shim answers each such check as not supported (see
//! [`crate::tolerant`]) and the filter decides that check by its rule's failure mode.
//! A request without the header comes from a 0.1 filter ([`WireVersion::UNSTATED`]).

use std::fmt;

/// Header carrying the sender's release version (`MAJOR.MINOR.PATCH`), both ways.
pub const VERSION_HEADER: &str = "x-ratelimit-wire";

/// This release's version: the workspace's, shared by the filter, the shim and the wire.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// A release's version as far as the wire cares: its major and minor numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct WireVersion {
    pub major: u64,
    pub minor: u64,
}

impl WireVersion {
    /// What a peer that states no version runs: 0.1, the last release that did not.
    pub const UNSTATED: WireVersion = WireVersion { major: 0, minor: 1 };

    /// This release's.
    pub fn ours() -> WireVersion {
        WireVersion::parse(VERSION).unwrap_or(WireVersion::UNSTATED)
    }

    /// `MAJOR.MINOR` or `MAJOR.MINOR.PATCH` (a pre-release or build suffix of the patch
    /// is ignored); `None` for anything else.
    pub fn parse(text: &str) -> Option<WireVersion> {
        let mut parts = text.trim().splitn(3, '.');
        let number = |part: Option<&str>| {
            part.filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))?
                .parse()
                .ok()
        };
        let major = number(parts.next())?;
        let minor = number(parts.next())?;
        if let Some(patch) = parts.next() {
            let digits = patch.split(['-', '+']).next().unwrap_or("");
            number(Some(digits))?;
        }
        Some(WireVersion { major, minor })
    }

    /// Whether a shim of version `self` serves a filter of version `filter` (and so a
    /// filter of `filter` may use a shim of `self`): same major, minors at most one apart.
    pub fn serves(self, filter: WireVersion) -> bool {
        self.major == filter.major && self.minor.abs_diff(filter.minor) <= 1
    }
}

impl fmt::Display for WireVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn v(major: u64, minor: u64) -> WireVersion {
        WireVersion { major, minor }
    }

    #[test]
    fn versions_parse_strictly() {
        assert_eq!(WireVersion::parse("0.2.0"), Some(v(0, 2)));
        assert_eq!(WireVersion::parse("1.12"), Some(v(1, 12)));
        assert_eq!(WireVersion::parse("0.3.1-rc.1"), Some(v(0, 3)));
        for bad in ["", "0", "a.b", "0.x.1", "0..1", "-1.2", "0.2.x", " . "] {
            assert_eq!(WireVersion::parse(bad), None, "{bad:?}");
        }
        assert_eq!(WireVersion::ours(), WireVersion::parse(VERSION).unwrap());
    }

    #[test]
    fn a_shim_serves_one_minor_either_side() {
        let shim = v(0, 2);
        assert!(shim.serves(v(0, 1)));
        assert!(shim.serves(v(0, 2)));
        assert!(shim.serves(v(0, 3)));
        assert!(!shim.serves(v(0, 4)));
        assert!(!shim.serves(v(0, 0)));
        assert!(!shim.serves(v(1, 2)));
        assert!(v(0, 2).serves(WireVersion::UNSTATED));
        assert!(!v(0, 3).serves(WireVersion::UNSTATED));
    }
}
