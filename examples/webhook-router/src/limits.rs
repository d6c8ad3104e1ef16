//! The router's own limits that several layers check (the CLI validates them, the platform
//! clamps to them).

/// Events a worker may have queued before the router answers 503 for its target.
pub const DEFAULT_MAILBOX: usize = 64;
/// The largest `--mailbox`: a worker with more queued events than this is better replaced by a
/// 503 and GitHub's (or the reconciler's) retry.
pub const MAX_MAILBOX: usize = 65_536;
