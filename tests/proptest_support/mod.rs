//! Shared by the property-test files: one proptest configuration for all of them.

use proptest::test_runner::{Config as ProptestConfig, RngSeed};

/// Deterministic by default (a fixed seed and case count, sized for debug CI); a longer or
/// different hunt sets `PROPTEST_CASES` and `PROPTEST_RNG_SEED`.
pub fn proptest_config(default_cases: u32) -> ProptestConfig {
    fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
        std::env::var(name).ok().and_then(|s| s.parse().ok())
    }
    ProptestConfig {
        cases: env("PROPTEST_CASES").unwrap_or(default_cases),
        rng_seed: RngSeed::Fixed(env("PROPTEST_RNG_SEED").unwrap_or(0x5EED)),
        max_shrink_iters: 20_000,
        ..ProptestConfig::default()
    }
}
