//! The contract: the traits every backend implements (documented there, once), the types they
//! return (each with a public constructor, so a backend outside this crate or a test fake can build
//! them), identities and errors. Nothing here knows how any backend stores its state.

pub(crate) mod connect;
pub(crate) mod contract;
pub(crate) mod dynamic;
pub(crate) mod error;
pub(crate) mod events;
pub(crate) mod ext;
pub(crate) mod ids;
pub(crate) mod outcome;
pub(crate) mod payload;
pub(crate) mod report;
pub(crate) mod snapshot;
pub(crate) mod stats;
pub(crate) mod status;
pub(crate) mod waiting;
