//! The PostgreSQL server of the tests and benchmarks: the workspace's `test-servers` crate (shared
//! with the reference router's tests), under the name the test files use.

#[allow(unused_imports)] // each test binary uses its own part of it
pub use test_servers::postgres::*;
