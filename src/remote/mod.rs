//! What the networked backends (Redis, PostgreSQL) share: the snapshot cache that applies what
//! changed since a handle's version ([`snapshot`]), data-loss detection ([`loss`]), the
//! configuration every handle of a registry must agree on ([`agreement`]), and the per-handle
//! statistics ([`counters`]).

#![cfg_attr(not(feature = "redis"), allow(dead_code))]

pub(crate) mod agreement;
pub(crate) mod counters;
pub(crate) mod loss;
pub(crate) mod snapshot;
pub(crate) mod vocab;
