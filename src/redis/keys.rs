//! The key layout of one registry: every key starts with `{<name>}:`, so that all of them share
//! one hash tag (one Cluster slot) and a script may touch any of them.
//!
//! The scripts build most keys themselves from the prefix (see `scripts/lib_base.lua`, which lists
//! them all); this module holds the few keys the Rust side names (the name's rule is
//! `crate::api::connect`).

pub(crate) use crate::api::connect::validate_name;

/// The keys of one registry that the Rust side names.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    /// `{name}:`, the prefix of every key (ARGV[1] of every script).
    pub(crate) prefix: String,
    /// The test time offset (set by `advance_time_for_tests`; read only by a `testkit` build and
    /// this module's tests).
    #[cfg_attr(not(feature = "testkit"), allow(dead_code))]
    pub(crate) offset: String,
    /// KEYS[1] of every function call: the test time offset for a handle that reads it (a
    /// build with the `testkit` feature, unless built with
    /// [`without_test_offset`](super::RedisRegistryBuilder::without_test_offset); every function
    /// that reads the clock adds it), else the bare prefix, which names no key, so that a handle
    /// that cannot see an offset pays no `GET` for it on every call (`scripts/lib_base.lua`).
    /// Either way it carries the registry's hash tag, so a Cluster routes the call to the
    /// registry's slot.
    pub(crate) clock: String,
    /// The pub/sub channel of lifecycle events.
    pub(crate) events: String,
    /// The counter replica ids come from.
    pub(crate) next_replica_id: String,
    /// The maintenance lease.
    pub(crate) lease: String,
    /// The live workers (walked with `ZSCAN` by `drain_all_within`).
    pub(crate) live: String,
}

impl Keys {
    /// The keys of registry `name` (already validated), for a handle whose calls read the test
    /// offset (`test_offset`) or not.
    pub(crate) fn new(name: &str, test_offset: bool) -> Self {
        let prefix = format!("{{{name}}}:");
        let key = |suffix: &str| format!("{prefix}{suffix}");
        Self {
            offset: key("test_offset_ms"),
            clock: if test_offset {
                key("test_offset_ms")
            } else {
                prefix.clone()
            },
            events: key("events"),
            next_replica_id: key("next_replica_id"),
            lease: key("sweep_lease"),
            live: key("live"),
            prefix,
        }
    }

    /// The key of a claim on `member` (`<target>:<delivery>`).
    pub(crate) fn claim(&self, member: &str) -> String {
        format!("{}c:{member}", self.prefix)
    }

    /// Every key of the registry matches this pattern (for `SCAN` in tests and tools).
    pub(crate) fn pattern(&self) -> String {
        // `{` and `}` are not glob metacharacters; names contain none of `*?[]\`.
        format!("{}*", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_hash_tag() {
        let k = Keys::new("pool-a", true);
        assert_eq!(k.prefix, "{pool-a}:");
        assert_eq!(k.offset, "{pool-a}:test_offset_ms");
        assert_eq!(k.claim("o/r#1:d"), "{pool-a}:c:o/r#1:d");
        assert_eq!(k.clock, k.offset, "a handle that reads the offset names it");
        let bare = Keys::new("pool-a", false);
        assert_eq!(bare.clock, bare.prefix, "one that does not names no key");
        assert_eq!(bare.offset, k.offset, "and can still set it");
        for key in [
            &k.offset,
            &k.clock,
            &k.events,
            &k.next_replica_id,
            &k.lease,
            &k.live,
        ] {
            assert!(key.starts_with("{pool-a}:"), "{key}");
        }
    }
}
