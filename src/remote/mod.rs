//! What the networked backends (Redis, PostgreSQL) share: the snapshot cache that applies what
//! changed since a handle's version ([`snapshot`]), and data-loss detection ([`loss`]).

#![cfg_attr(not(feature = "redis"), allow(dead_code))]

pub(crate) mod loss;
pub(crate) mod snapshot;
