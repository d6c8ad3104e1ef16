//! Loom models of the worker registry's races.
//!
//! The models live in `tests/`, one file per race, and drive the registry's real code through its
//! `src/sync.rs` shim: under `RUSTFLAGS="--cfg worker_registry_loom"` the registry's atomics,
//! `Arc`, sharded maps (one loom mutex per key) and snapshot cell are loom's, so loom explores
//! every interleaving of the real state machine (exhaustively; one three-racer model up to 3
//! preemptions), including the stale values its acquire loads may legally return. Time comes from
//! a `ManualClock` that each model sets before its threads start.
//!
//! Every model has a must-fail twin: a patch in `twins/` that puts one deliberate bug into a
//! scratch copy of the registry, on which loom must find a violation of exactly the invariant the
//! model checks (`twins/run` applies each patch and runs its models). The shipped source carries
//! no bug injection. A model that cannot fail is not a model.
//!
//! Without the cfg this crate and its tests compile to nothing, so `cargo test --all-features`
//! stays fast. Run the models, then their twins, with:
//!
//! ```text
//! RUSTFLAGS="--cfg worker_registry_loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p loom-tests --release
//! loom-tests/twins/run
//! ```

#[cfg(worker_registry_loom)]
mod harness;
#[cfg(worker_registry_loom)]
pub use harness::*;
