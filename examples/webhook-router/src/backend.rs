//! Which registry backend the router runs on: `--registry` (`WEBHOOK_ROUTER_REGISTRY`), parsed
//! into a [`RegistryChoice`] and opened as a [`DynRegistry`], so the rest of the router never
//! knows which backend it has.
//!
//! | `--registry` | backend |
//! |---|---|
//! | `memory` (default) | [`InMemoryRegistry`] on the [`SystemClock`]: one router process; everything is lost when it stops |
//!
//! A networked backend shared by several replicas is one more variant here and one more arm in
//! [`RegistryChoice::open`].

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use worker_registry::{Clock, DynRegistry, InMemoryRegistry, RegistryConfig, SystemClock};

/// The backend named by `--registry`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RegistryChoice {
    /// The in-memory registry of this process.
    #[default]
    Memory,
}

/// A `--registry` value that names no backend this router has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownBackend(String);

impl fmt::Display for UnknownBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "--registry {:?}: not a backend this router has (known: memory)",
            self.0
        )
    }
}

impl std::error::Error for UnknownBackend {}

impl FromStr for RegistryChoice {
    type Err = UnknownBackend;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("memory") || s.eq_ignore_ascii_case("memory://") {
            return Ok(Self::Memory);
        }
        let scheme = s.split_once("://").map_or(s, |(scheme, _)| scheme);
        // Credentials in a URL stay out of the error message.
        Err(UnknownBackend(if s.contains("://") {
            format!("{scheme}://...")
        } else {
            s.to_owned()
        }))
    }
}

impl fmt::Display for RegistryChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Memory => f.write_str("memory"),
        }
    }
}

impl RegistryChoice {
    /// The resolution of the clock the backend decides liveness on (the heartbeat timeout must be
    /// well above it).
    pub fn clock_resolution(&self) -> Duration {
        match self {
            Self::Memory => SystemClock::new().resolution(),
        }
    }

    /// Opens the backend with `config`.
    pub async fn open(&self, config: RegistryConfig) -> Result<DynRegistry, String> {
        match self {
            Self::Memory => Ok(DynRegistry::new(InMemoryRegistry::new(config))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_memory_and_refuses_the_rest_without_echoing_credentials() {
        assert_eq!("memory".parse(), Ok(RegistryChoice::Memory));
        assert_eq!("Memory".parse(), Ok(RegistryChoice::Memory));
        assert_eq!("memory://".parse(), Ok(RegistryChoice::Memory));
        let e = "redis://user:secret@host/0"
            .parse::<RegistryChoice>()
            .unwrap_err();
        assert!(!e.to_string().contains("secret"), "{e}");
        assert!(e.to_string().contains("redis://"), "{e}");
        assert!("".parse::<RegistryChoice>().is_err());
        assert!("mem".parse::<RegistryChoice>().is_err());
    }
}
