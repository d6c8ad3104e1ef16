//! The fixed bounds the library enforces on what it is given (not settings: those are
//! [`config`](crate::config)'s): the longest delivery id, repository owner and name, registry
//! name, and a [`Payload`](crate::Payload)'s metadata (with the content type a payload starts with). Input beyond them is refused with a typed error ([`DeliveryIdError`](crate::DeliveryIdError),
//! [`TargetError`](crate::TargetError), [`RegistryNameError`](crate::RegistryNameError)).
//!
//! # Examples
//!
//! ```
//! use worker_registry::limits::{MAX_DELIVERY_ID_LEN, MAX_OWNER_LEN};
//! use worker_registry::{DeliveryId, Target};
//!
//! assert!(DeliveryId::new(&"d".repeat(MAX_DELIVERY_ID_LEN + 1)).is_err());
//! assert!(Target::new(&format!("{}/repo", "o".repeat(MAX_OWNER_LEN + 1)), 1).is_err());
//! ```

pub use crate::api::connect::MAX_REGISTRY_NAME_LEN;
pub use crate::api::ids::{MAX_DELIVERY_ID_LEN, MAX_OWNER_LEN, MAX_REPO_NAME_LEN};
pub use crate::api::payload::{
    DEFAULT_CONTENT_TYPE, MAX_CONTENT_TYPE_LEN, MAX_EVENT_NAME_LEN, MAX_HEADER_NAME_LEN,
    MAX_HEADER_VALUE_LEN, MAX_PAYLOAD_HEADERS, MAX_PAYLOAD_META_LEN,
};
