//! The contract: the traits every backend implements (their semantics written there, once), the
//! types they answer with (each with a public constructor, so a backend outside this crate or a
//! test fake can build them), identities and errors. Nothing here knows how a backend stores its
//! state; the design behind it is in `docs::design`.
//!
//! | file | holds |
//! |---|---|
//! | `contract.rs` | [`WorkerRegistry`](crate::WorkerRegistry) (the minimal set), [`Maintenance`](crate::Maintenance), `Subscribe` |
//! | `ext.rs` | [`WorkerRegistryExt`](crate::WorkerRegistryExt): `admit`, `complete`, `complete_by`, `drain`, composed once |
//! | `methods.rs` | the contract's one method list, and `sync_contract!`: a synchronous core lifted into the contract |
//! | `dynamic.rs` | [`DynRegistry`](crate::DynRegistry) and `DynBackend`, generated from that list |
//! | `outcome.rs` | what the decisions answer: [`Admission`](crate::Admission), [`AssignOutcome`](crate::AssignOutcome), [`ClaimOutcome`](crate::ClaimOutcome), ... |
//! | `payload.rs` | [`Payload`](crate::Payload): what GitHub sent, carried with the claim |
//! | `report.rs`, `waiting.rs` | what a sweep answers: [`SweepReport`](crate::SweepReport), [`ReleasedEvent`](crate::ReleasedEvent), [`ExpiredWaiting`](crate::ExpiredWaiting) |
//! | `snapshot.rs`, `status.rs`, `stats.rs` | the reads: [`StatusSnapshot`](crate::StatusSnapshot), [`Status`](crate::Status), [`Stats`](crate::Stats) |
//! | `events.rs` | lifecycle [`Event`](crate::Event)s and their fan-out |
//! | `ids/` | [`WorkerId`](crate::WorkerId), [`Target`](crate::Target), [`DeliveryId`](crate::DeliveryId), [`FencingToken`](crate::FencingToken), validated once |
//! | `error.rs`, `connect.rs` | [`RegistryError`](crate::RegistryError), [`ConnectError`](crate::ConnectError) |

pub(crate) mod connect;
pub(crate) mod contract;
pub(crate) mod dynamic;
pub(crate) mod error;
pub(crate) mod events;
pub(crate) mod ext;
pub(crate) mod ids;
pub(crate) mod methods;
pub(crate) mod outcome;
pub(crate) mod payload;
pub(crate) mod report;
pub(crate) mod snapshot;
pub(crate) mod stats;
pub(crate) mod status;
pub(crate) mod waiting;
