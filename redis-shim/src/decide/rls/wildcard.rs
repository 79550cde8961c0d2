//! Wildcard values (`value: foo*`, `/api/*/action`, `svc*ep*rpc`), matched as
//! envoyproxy/ratelimit matches them: each `*` stands for any run of characters (none
//! included), anywhere in the value and as often as it appears. A pattern is matched
//! against the entry's `key_value` (the same string the exact match looks up), only when
//! no child holds that exact `key_value`; the first pattern of the level, in the
//! configuration's order, that matches wins, before the value-less `key`.

/// One wildcard descriptor of a level: its `key_value` with the `*`s, split at them once
/// when loaded so that matching allocates nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct Wildcard {
    /// The child's `key_value`, as the level's children are keyed.
    pub final_key: String,
    parts: Vec<String>,
}

impl Wildcard {
    /// The wildcard for the child keyed `final_key` (which holds at least one `*`).
    pub fn new(final_key: &str) -> Wildcard {
        Wildcard {
            final_key: final_key.to_string(),
            parts: final_key.split('*').map(str::to_string).collect(),
        }
    }

    /// Whether `key_value` (an entry's `key_value`) matches: it starts with the first
    /// literal part, ends with the last, and holds the ones between in order, without
    /// overlapping.
    pub fn matches(&self, key_value: &str) -> bool {
        let parts = &self.parts;
        let (first, last) = (&parts[0], &parts[parts.len() - 1]);
        if parts.len() == 1 {
            return first == key_value;
        }
        let fixed: usize = parts.iter().map(String::len).sum();
        if key_value.len() < fixed
            || !key_value.starts_with(first.as_str())
            || !key_value.ends_with(last.as_str())
        {
            return false;
        }
        let mut rest = &key_value[first.len()..key_value.len() - last.len()];
        for part in &parts[1..parts.len() - 1] {
            match rest.find(part.as_str()) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        true
    }

    /// The pattern's value part (`files/*` of `key_files/*`): what a `share_threshold`
    /// descriptor counts every matching value under.
    pub fn value_of(&self, key: &str) -> &str {
        self.final_key
            .strip_prefix(key)
            .and_then(|rest| rest.strip_prefix('_'))
            .unwrap_or(&self.final_key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(pattern: &str, key_value: &str) -> bool {
        Wildcard::new(pattern).matches(key_value)
    }

    #[test]
    fn a_trailing_star_is_a_prefix() {
        assert!(matches("wild_foo*", "wild_foo"));
        assert!(matches("wild_foo*", "wild_foobar"));
        assert!(!matches("wild_foo*", "wild_fo"));
        assert!(!matches("wild_foo*", "wild_bfoo"));
        assert!(matches("any_*", "any_"), "an empty value matches a lone star");
    }

    #[test]
    fn middle_and_several_stars_keep_their_order() {
        assert!(matches("path_/api/*/action", "path_/api/123/action"));
        assert!(!matches("path_/api/*/action", "path_/api/123/other"));
        assert!(matches("midWild_bar*b", "midWild_barb"), "the star may be empty");
        assert!(
            !matches("midWild_bar*b", "midWild_bar"),
            "prefix and suffix may not overlap"
        );
        assert!(matches("m_foo*bar*baz", "m_foo1bar2baz"));
        assert!(matches("m_foo*bar*baz", "m_foobarbaz"));
        assert!(!matches("m_foo*bar*baz", "m_foobazbar"), "out of order");
        assert!(!matches("m_foo*bar*baz", "m_foobaz"), "a middle part is missing");
        assert!(matches(
            "r_/api/*/resource/*/action",
            "r_/api/v1/resource/9/action"
        ));
    }

    #[test]
    fn the_value_part_is_what_shares_a_counter() {
        assert_eq!(Wildcard::new("files_files/*").value_of("files"), "files/*");
        assert_eq!(Wildcard::new("k_*").value_of("k"), "*");
    }
}
