//! The router's own limits that several layers check (the CLI validates them, the platform
//! clamps to them).

/// Events a worker may have queued in its mailbox (its overflow comes behind it).
pub const DEFAULT_MAILBOX: usize = 64;
/// The largest `--mailbox`: a worker with more queued events than this is better replaced by a
/// 503 and GitHub's (or the reconciler's) retry.
pub const MAX_MAILBOX: usize = 65_536;
/// Events a worker may have queued behind its full mailbox, in arrival order, before the router
/// answers 503 for its target (`--overflow`).
pub const DEFAULT_OVERFLOW: usize = 256;
/// The largest `--overflow` (0 turns the overflow off: a full mailbox answers 503).
pub const MAX_OVERFLOW: usize = 65_536;
