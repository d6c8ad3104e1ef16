//! [`DynRegistry`]: any backend behind one type, chosen at run time (from a URL in the
//! configuration, say), as object_store's `DynObjectStore`.
//!
//! [`WorkerRegistry`] and [`Maintenance`] return `impl Future`, which keeps a statically typed
//! backend free of allocation (the in-memory one answers with already-completed futures) but makes
//! them unusable as `dyn` traits. [`DynBackend`] is their object-safe mirror, with boxed futures,
//! implemented for every backend; [`DynRegistry`] wraps an `Arc<dyn DynBackend>` and implements the
//! contract traits again, so code generic over them (the admin API, the `Sweeper`, a router) takes
//! either a concrete backend or a `DynRegistry`. The price is an allocation per call (the boxed
//! future, which borrows its arguments as the contract's own futures do).
//!
//! All three are generated from the one list of the contract's methods, `contract_methods!` in
//! `methods.rs`: a method added to the contract traits without its line there leaves
//! `DynRegistry`'s impl incomplete, so the compiler asks for it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::contract::{Maintenance, WorkerRegistry};
use super::error::RegistryError;
use super::ids::{DeliveryId, Target, WorkerId};
use super::methods::contract_methods;
use super::outcome::{Admission, AssignOutcome, ClaimOutcome, DrainAll, HeartbeatAck};
use super::payload::Payload;
use super::report::{ReleasedEvent, SweepReport};
use super::snapshot::{StatusSnapshot, WorkerInfo};
use super::stats::{Audit, Stats};
use super::status::{DeadReason, Status};
use crate::config::RegistryConfig;

/// A boxed, sendable future (what [`DynBackend`]'s methods return).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// From the list: [`DynBackend`] (each method the contract method of the same name, its future
/// boxed) and its impl for every [`Backend`].
macro_rules! dyn_backend {
    ([] $(
        $contract:ident {
            async { $( $call:ident ( $($arg:ident : $ty:ty),* ) -> $out:ty; )* }
            sync { $( $read:ident () -> $answer:ty; )* }
            borrowed { $( $lend:ident () -> $lent:ty; )* }
        }
    )*) => {
        /// The object-safe form of [`WorkerRegistry`] + [`Maintenance`] (+ [`Subscribe`] with the
        /// `tokio` feature), implemented for every type that implements them. Each method is the
        /// contract method of the same name, boxed; see there for the semantics. Use it through
        /// [`DynRegistry`], which also has the conveniences of
        /// [`WorkerRegistryExt`](crate::WorkerRegistryExt).
        ///
        /// # Examples
        ///
        /// ```
        /// use std::sync::Arc;
        /// use worker_registry::dynamic::DynBackend;
        /// use worker_registry::InMemoryRegistry;
        ///
        /// let backend: Arc<dyn DynBackend> = Arc::new(InMemoryRegistry::default());
        /// assert_eq!(backend.status().version, 0);
        /// ```
        ///
        /// [`Subscribe`]: crate::Subscribe
        pub trait DynBackend: Send + Sync + 'static {
            $($(
                #[doc = concat!("See [`", stringify!($contract), "::", stringify!($call), "`].")]
                fn $call<'a>(&'a self, $($arg: $ty),*) -> BoxFuture<'a, $out>;
            )*
            $(
                #[doc = concat!("See [`", stringify!($contract), "::", stringify!($read), "`].")]
                fn $read(&self) -> $answer;
            )*
            $(
                #[doc = concat!("See [`", stringify!($contract), "::", stringify!($lend), "`].")]
                fn $lend(&self) -> $lent;
            )*)*
            /// See [`Subscribe::subscribe`](crate::Subscribe::subscribe).
            #[cfg(feature = "tokio")]
            fn subscribe(&self) -> crate::Subscription;
        }

        impl<T: Backend> DynBackend for T {
            $($(
                fn $call<'a>(&'a self, $($arg: $ty),*) -> BoxFuture<'a, $out> {
                    Box::pin(<T as $contract>::$call(self, $($arg),*))
                }
            )*
            $(
                fn $read(&self) -> $answer {
                    <T as $contract>::$read(self)
                }
            )*
            $(
                fn $lend(&self) -> $lent {
                    <T as $contract>::$lend(self)
                }
            )*)*
            #[cfg(feature = "tokio")]
            fn subscribe(&self) -> crate::Subscription {
                crate::Subscribe::subscribe(self)
            }
        }
    };
}

/// From the list: the contract traits for [`DynRegistry`], each method its backend's.
macro_rules! dyn_registry {
    ([] $(
        $contract:ident {
            async { $( $call:ident ( $($arg:ident : $ty:ty),* ) -> $out:ty; )* }
            sync { $( $read:ident () -> $answer:ty; )* }
            borrowed { $( $lend:ident () -> $lent:ty; )* }
        }
    )*) => {$(
        impl $contract for DynRegistry {
            $(
                fn $call(&self, $($arg: $ty),*) -> impl Future<Output = $out> + Send {
                    async move { self.0.$call($($arg),*).await }
                }
            )*
            $(
                fn $read(&self) -> $answer {
                    self.0.$read()
                }
            )*
            $(
                fn $lend(&self) -> $lent {
                    self.0.$lend()
                }
            )*
        }
    )*};
}

contract_methods!(dyn_backend, 'a);
contract_methods!(dyn_registry, '_);

/// What [`DynBackend`] is implemented for: every type that implements the contract traits.
#[cfg(feature = "tokio")]
pub trait Backend: WorkerRegistry + Maintenance + crate::Subscribe + 'static {}
#[cfg(feature = "tokio")]
impl<T: WorkerRegistry + Maintenance + crate::Subscribe + 'static> Backend for T {}

/// What [`DynBackend`] is implemented for: every type that implements the contract traits.
#[cfg(not(feature = "tokio"))]
pub trait Backend: WorkerRegistry + Maintenance + 'static {}
#[cfg(not(feature = "tokio"))]
impl<T: WorkerRegistry + Maintenance + 'static> Backend for T {}

/// A registry whose backend was chosen at run time: an `Arc<dyn DynBackend>` that implements the
/// contract traits itself. Cloning shares the backend.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use worker_registry::{Admission, DeliveryId, DynRegistry, InMemoryRegistry, Target, WorkerRegistryExt};
///
/// let registry = DynRegistry::new(InMemoryRegistry::default()); // or a networked backend
/// let (t, d) = (Target::new("o/r", 1).unwrap(), DeliveryId::new("d").unwrap());
/// assert!(matches!(registry.admit(&t, &d).await, Ok(Admission::Assigned(_))));
/// # }
/// ```
#[derive(Clone)]
pub struct DynRegistry(Arc<dyn DynBackend>);

impl DynRegistry {
    /// Wraps a backend.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{DynRegistry, InMemoryRegistry, WorkerRegistry};
    ///
    /// let registry = DynRegistry::new(InMemoryRegistry::default());
    /// assert_eq!(registry.stats().admitted_new, 0);
    /// ```
    pub fn new(backend: impl Backend) -> Self {
        Self(Arc::new(backend))
    }

    /// Wraps a backend that is already shared.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use worker_registry::dynamic::DynBackend;
    /// use worker_registry::{DynRegistry, InMemoryRegistry};
    ///
    /// let shared: Arc<dyn DynBackend> = Arc::new(InMemoryRegistry::default());
    /// let registry = DynRegistry::from_arc(shared);
    /// ```
    pub fn from_arc(backend: Arc<dyn DynBackend>) -> Self {
        Self(backend)
    }

    /// The backend.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{DynRegistry, InMemoryRegistry};
    ///
    /// let registry = DynRegistry::new(InMemoryRegistry::default());
    /// assert_eq!(registry.backend().status().version, 0);
    /// ```
    pub fn backend(&self) -> &Arc<dyn DynBackend> {
        &self.0
    }
}

impl fmt::Debug for DynRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynRegistry")
            .field("max_workers", &self.0.config().max_workers())
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "tokio")]
impl crate::Subscribe for DynRegistry {
    fn subscribe(&self) -> crate::Subscription {
        self.0.subscribe()
    }
}
