//! The contract's methods, listed once (`contract_methods!`), and what is generated from the list
//! besides the dyn surface of `dynamic.rs`: `sync_contract!`, which lifts a synchronous core (the
//! in-memory backend's [`Direct`](crate::memory::Direct), the testkit's model) into
//! [`WorkerRegistry`](crate::WorkerRegistry) with already-completed futures.
//!
//! A contract method is written in the trait (its semantics), its line here, each backend and the
//! model, and nowhere else: the dyn surface and the two synchronous lifts follow from the line.

use super::error::RegistryError;

/// The contract's methods, listed once: per trait, the methods that return a future (`async`,
/// their arguments' borrows written with the lifetime `$lt`), those that answer at once with an
/// owned value (`sync`) and those that answer with a borrow of the registry (`borrowed`). Hands
/// the list to `$then!`, after `[$head]` (what the caller passed after the lifetime, for the
/// generator to read), with `$lt` as the lifetime of every borrow: `'a` where the boxed future
/// must name it, `'_` where the contract's elided form is wanted. `Subscribe`'s one method, behind
/// the `tokio` feature, is written out beside each use.
macro_rules! contract_methods {
    ($then:path, $lt:lifetime $(, $($head:tt)*)?) => {
        $then! {
            [$($($head)*)?]
            WorkerRegistry {
                async {
                    admit_with(
                        target: &$lt Target, delivery: &$lt DeliveryId, payload: Option<&$lt Payload>
                    ) -> Result<Admission, RegistryError>;
                    payload(target: &$lt Target, delivery: &$lt DeliveryId)
                        -> Result<Option<Payload>, RegistryError>;
                    claim(target: &$lt Target, delivery: &$lt DeliveryId)
                        -> Result<ClaimOutcome, RegistryError>;
                    release(target: &$lt Target, delivery: &$lt DeliveryId)
                        -> Result<(), RegistryError>;
                    complete_as(
                        holder: Option<WorkerId>, target: &$lt Target, delivery: &$lt DeliveryId
                    ) -> Result<(), RegistryError>;
                    assign(target: &$lt Target) -> Result<AssignOutcome, RegistryError>;
                    heartbeat(worker: WorkerId) -> Result<HeartbeatAck, RegistryError>;
                    loop_started(worker: WorkerId) -> Result<Status, RegistryError>;
                    loop_finished(worker: WorkerId) -> Result<Status, RegistryError>;
                    register() -> Result<WorkerId, RegistryError>;
                    deregister(worker: WorkerId) -> Result<DeadReason, RegistryError>;
                    drain_within(worker: WorkerId, deadline: Duration)
                        -> Result<Status, RegistryError>;
                    drain_all_within(deadline: Duration) -> Result<DrainAll, RegistryError>;
                    worker(worker: WorkerId) -> Result<Option<WorkerInfo>, RegistryError>;
                    audit() -> Result<Audit, RegistryError>;
                }
                sync {
                    status() -> Arc<StatusSnapshot>;
                    stats() -> Stats;
                }
                borrowed {
                    config() -> &RegistryConfig;
                }
            }
            Maintenance {
                async {
                    sweep() -> Result<SweepReport, RegistryError>;
                    acknowledge(released: &$lt [ReleasedEvent]) -> Result<(), RegistryError>;
                    wake() -> ();
                }
                sync {}
                borrowed {}
            }
        }
    };
}
pub(crate) use contract_methods;

/// `impl WorkerRegistry for $ty` from a synchronous core: `sync_contract!([generics] Type, core:
/// a, borrowed: b)` answers each `async` and `sync` method of the list with `self.a()`'s method of
/// the same name and arguments (the future already completed, the answer converted by
/// [`IntoAnswer`]), and each `borrowed` one with `self.b()`'s (where `a` is a lock guard, `b` is
/// what outlives it). The caller imports the types the list names.
///
/// [`Maintenance`](crate::Maintenance) is written by each caller: its `wake` is a real wait on
/// the in-memory backend.
macro_rules! sync_contract {
    ([$($generics:tt)*] $ty:ty, core: $core:ident, borrowed: $borrowed:ident) => {
        $crate::api::methods::contract_methods!(
            $crate::api::methods::lift_sync, '_, [$($generics)*] $ty, $core, $borrowed
        );
    };
}
pub(crate) use sync_contract;

/// The body of [`sync_contract!`], given the list.
macro_rules! lift_sync {
    (
        [[$($generics:tt)*] $ty:ty, $core:ident, $borrowed:ident]
        WorkerRegistry {
            async { $( $call:ident ( $($arg:ident : $argty:ty),* ) -> $out:ty; )* }
            sync { $( $read:ident () -> $answer:ty; )* }
            borrowed { $( $lend:ident () -> $lent:ty; )* }
        }
        $($other_traits:tt)*
    ) => {
        impl<$($generics)*> $crate::WorkerRegistry for $ty {
            $(
                fn $call(
                    &self,
                    $($arg: $argty),*
                ) -> impl ::std::future::Future<Output = $out> + Send {
                    let answer: $out = $crate::api::methods::IntoAnswer::into_answer(
                        self.$core().$call($($arg),*),
                    );
                    ::std::future::ready(answer)
                }
            )*
            $(
                fn $read(&self) -> $answer {
                    self.$core().$read()
                }
            )*
            $(
                fn $lend(&self) -> $lent {
                    self.$borrowed().$lend()
                }
            )*
        }
    };
}
pub(crate) use lift_sync;

/// What a synchronous core's answer becomes as the contract's `Result<T, RegistryError>`: a
/// fallible answer is itself, an infallible one is `Ok`, and a backend may add its own (the
/// in-memory `register` answers a [`WorkerHandle`](crate::memory::WorkerHandle), the contract
/// its id).
pub(crate) trait IntoAnswer<T> {
    /// The contract's answer.
    fn into_answer(self) -> Result<T, RegistryError>;
}

impl<T> IntoAnswer<T> for T {
    fn into_answer(self) -> Result<T, RegistryError> {
        Ok(self)
    }
}

impl<T> IntoAnswer<T> for Result<T, RegistryError> {
    fn into_answer(self) -> Result<T, RegistryError> {
        self
    }
}
