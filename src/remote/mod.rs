//! What the networked backends (Redis, PostgreSQL) share: today the snapshot cache that applies
//! what changed since a handle's version ([`snapshot`]).

#![cfg_attr(not(feature = "redis"), allow(dead_code))]

pub(crate) mod snapshot;
