//! Long-form documentation of the router, as doc-only modules (the library's `docs` pattern):
//! each page is a Markdown file beside this one (`src/docs/*.md`), readable on GitHub and on
//! docs.rs alike. Nothing here is code.
//!
//! | page | what it covers |
//! |---|---|
//! | [`worker_protocol`] | the worker protocol over HTTP, the credential, the self-fencing lease, and every path by which a pull request passes to a successor |

#[doc = include_str!("docs/worker_protocol.md")]
pub mod worker_protocol {}
