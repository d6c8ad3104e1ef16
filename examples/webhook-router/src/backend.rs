//! Which registry backend the router runs on: `--registry` (`WEBHOOK_ROUTER_REGISTRY`), parsed
//! into a [`RegistryChoice`] and opened as a [`DynRegistry`], so the rest of the router never
//! knows which backend it has.
//!
//! | `--registry` | backend |
//! |---|---|
//! | `memory` (default) | [`InMemoryRegistry`] on the [`SystemClock`]: one router process; everything is lost when it stops |
//! | `redis://host:port/db` | [`RedisRegistry`]: shared by every replica that opens the same `--registry-name` on the server |
//! | `postgres://user@host/db` | [`PostgresRegistry`]: the same, in PostgreSQL (migrations applied on start) |
//!
//! A shared backend also holds the router's own small [`Store`](crate::store::Store) (which
//! replica runs each worker's container), next to the registry.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use worker_registry::postgres::PostgresRegistry;
use worker_registry::redis::RedisRegistry;
use worker_registry::{Clock, DynRegistry, InMemoryRegistry, RegistryConfig, SystemClock};

/// The registry name replicas share unless `--registry-name` says otherwise.
pub const DEFAULT_REGISTRY_NAME: &str = "webhook-router";
/// The longest registry name (the Redis backend's limit, applied to both shared backends).
pub const MAX_REGISTRY_NAME_LEN: usize = worker_registry::limits::MAX_REGISTRY_NAME_LEN;
/// How long one call to a shared backend may wait for its answer before the router answers 503
/// (well under GitHub's 10 s delivery timeout).
pub const BACKEND_CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long connecting to a shared backend may take.
pub const BACKEND_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Connections in each replica's PostgreSQL pool.
pub const POSTGRES_POOL_SIZE: usize = 16;

/// The backend named by `--registry`.
#[derive(Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RegistryChoice {
    /// The in-memory registry of this process.
    #[default]
    Memory,
    /// A Redis server (`redis://` or `rediss://` URL).
    Redis(String),
    /// A PostgreSQL database (`postgres://` or `postgresql://` URL).
    Postgres(String),
}

impl fmt::Debug for RegistryChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URL may carry a password: show it as Display does.
        write!(f, "RegistryChoice({self})")
    }
}

/// A `--registry` value that names no backend this router has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownBackend(String);

impl fmt::Display for UnknownBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "--registry {:?}: not a backend this router has (known: memory, redis://host:port/db, postgres://user@host/db)",
            self.0
        )
    }
}

impl std::error::Error for UnknownBackend {}

/// `scheme://[user[:password]@]rest` with the password replaced by `***`.
fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            let hidden = if userinfo.contains(':') || user.is_empty() {
                format!("{user}:***")
            } else {
                user.to_owned()
            };
            format!("{scheme}://{hidden}@{host}{path}")
        }
        None => url.to_owned(),
    }
}

impl FromStr for RegistryChoice {
    type Err = UnknownBackend;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("memory") || s.eq_ignore_ascii_case("memory://") {
            return Ok(Self::Memory);
        }
        let scheme = s.split_once("://").map(|(scheme, _)| scheme);
        match scheme.map(str::to_ascii_lowercase).as_deref() {
            Some("redis" | "rediss") if s.len() > "redis://".len() => {
                return Ok(Self::Redis(s.to_owned()))
            }
            Some("postgres" | "postgresql") if s.len() > "postgres://".len() => {
                return Ok(Self::Postgres(s.to_owned()))
            }
            _ => {}
        }
        // Credentials in a URL stay out of the error message.
        Err(UnknownBackend(match scheme {
            Some(scheme) => format!("{scheme}://..."),
            None => s.to_owned(),
        }))
    }
}

impl fmt::Display for RegistryChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Memory => f.write_str("memory"),
            Self::Redis(url) | Self::Postgres(url) => f.write_str(&redacted(url)),
        }
    }
}

/// A `--registry-name` both shared backends accept: letters, digits and `- _ . :`, at most
/// [`MAX_REGISTRY_NAME_LEN`] bytes.
pub fn validate_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_REGISTRY_NAME_LEN {
        return Err(format!(
            "--registry-name {name:?}: 1 to {MAX_REGISTRY_NAME_LEN} bytes"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "-_.:".contains(*c)))
    {
        return Err(format!(
            "--registry-name {name:?}: {c:?} is not allowed (letters, digits and - _ . :)"
        ));
    }
    Ok(())
}

impl RegistryChoice {
    /// The backend's kind: `memory`, `redis` or `postgres` (a metric label).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Redis(_) => "redis",
            Self::Postgres(_) => "postgres",
        }
    }

    /// Whether several router replicas share this backend (every backend but memory).
    pub fn is_shared(&self) -> bool {
        !matches!(self, Self::Memory)
    }

    /// The resolution of the clock the backend decides liveness on (the heartbeat timeout must be
    /// well above it): the process's clock for memory, the server's milliseconds otherwise.
    pub fn clock_resolution(&self) -> Duration {
        match self {
            Self::Memory => SystemClock::new().resolution(),
            Self::Redis(_) | Self::Postgres(_) => Duration::from_millis(1),
        }
    }

    /// Opens the backend with `config`; replicas that open a shared backend under the same `name`
    /// share one registry (the in-memory one ignores it).
    pub async fn open(&self, config: RegistryConfig, name: &str) -> Result<DynRegistry, String> {
        match self {
            Self::Memory => Ok(DynRegistry::new(InMemoryRegistry::new(config))),
            Self::Redis(url) => RedisRegistry::builder(url.as_str())
                .name(name)
                .config(config)
                .connect_timeout(BACKEND_CONNECT_TIMEOUT)
                .response_timeout(BACKEND_CALL_TIMEOUT)
                .connect()
                .await
                .map(DynRegistry::new)
                .map_err(|e| e.to_string()),
            Self::Postgres(url) => PostgresRegistry::builder(url.as_str())
                .name(name)
                .config(config)
                .pool_size(POSTGRES_POOL_SIZE)
                .connect_timeout(BACKEND_CONNECT_TIMEOUT)
                .call_timeout(BACKEND_CALL_TIMEOUT)
                .connect()
                .await
                .map(DynRegistry::new)
                .map_err(|e| e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_backend_and_refuses_the_rest_without_echoing_credentials() {
        assert_eq!("memory".parse(), Ok(RegistryChoice::Memory));
        assert_eq!("Memory".parse(), Ok(RegistryChoice::Memory));
        assert_eq!("memory://".parse(), Ok(RegistryChoice::Memory));
        let r: RegistryChoice = "redis://user:secret@host:6379/0".parse().unwrap();
        assert!(matches!(r, RegistryChoice::Redis(_)));
        assert_eq!(r.to_string(), "redis://user:***@host:6379/0");
        assert!(!format!("{r:?}").contains("secret"));
        let p: RegistryChoice = "postgresql://router:pw@db/registry".parse().unwrap();
        assert!(matches!(p, RegistryChoice::Postgres(_)));
        assert_eq!(p.to_string(), "postgresql://router:***@db/registry");
        assert_eq!(
            "redis://:pw@h/1"
                .parse::<RegistryChoice>()
                .unwrap()
                .to_string(),
            "redis://:***@h/1"
        );
        assert_eq!(
            "postgres://router@db/x"
                .parse::<RegistryChoice>()
                .unwrap()
                .to_string(),
            "postgres://router@db/x"
        );
        let e = "etcd://user:secret@host/0"
            .parse::<RegistryChoice>()
            .unwrap_err();
        assert!(!e.to_string().contains("secret"), "{e}");
        assert!(e.to_string().contains("etcd://"), "{e}");
        for bad in ["", "mem", "redis://", "postgres://"] {
            assert!(bad.parse::<RegistryChoice>().is_err(), "{bad}");
        }
    }

    #[test]
    fn registry_names_are_checked() {
        assert!(validate_name(DEFAULT_REGISTRY_NAME).is_ok());
        assert!(validate_name("pool-a.eu:1_x").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name("a b").is_err());
        assert!(validate_name("{x}").is_err());
        assert!(validate_name(&"a".repeat(MAX_REGISTRY_NAME_LEN + 1)).is_err());
    }
}
