//! What the replicas of a router share about reconciling: a lease (one replica reconciles at a
//! time), per hook the position it reconciled up to (a restart resumes there), and per hook the
//! GUIDs it is chasing (`shared/chased.rs`: redelivered, not yet known to the registry). Beside
//! the registry's data, in the router's own [`Store`]:
//!
//! | backend | lease | positions |
//! |---|---|---|
//! | Redis | string `{<name>}:webhook-router:reconcile:lease`, the holder, `PX` ttl, set by one script | hash `{<name>}:webhook-router:reconcile:positions`, hook → attempt id, written by a script only while the writer holds the lease |
//! | PostgreSQL | row `(registry, 'lease')` of `webhook_router_reconcile`: holder, `lease_until` on the server's clock | rows `(registry, 'position:<hook>')`, written only while the writer holds the lease |
//! | in memory | this process (one replica) | this process (a restart starts again from the horizon) |
//!
//! Every step is one command or one statement: a lease is taken or renewed (expired, or already
//! this holder's) atomically on the server's clock, never a replica's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::Pool;
use redis::aio::ConnectionManager;
use tokio::time::Instant;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;
use worker_registry::RegistryError;

use crate::backend::RegistryChoice;
use crate::store::{create_tables, pg_error, redis_error, timed, Store};

mod chased;

pub use chased::Chased;

/// GUIDs chased per hook at most: a failed GUID beyond it is not redelivered, and the hook's
/// position stays before it, until the chase shrinks (the registry comes to know GUIDs, or they
/// fall out of the horizon).
pub const MAX_CHASED: usize = 10_000;

/// Takes the lease if it is free, expired or ours, and sets its expiry: 1 if held after.
const REDIS_LEASE: &str = "local cur = redis.call('GET', KEYS[1]) \
    if cur == false or cur == ARGV[1] then \
      redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end \
    return 0";
/// Gives the lease up if ARGV[1] holds it.
const REDIS_RELEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
    return redis.call('DEL', KEYS[1]) end return 0";
/// Writes a position while ARGV[1] holds the lease: 1 if written.
const REDIS_POSITION: &str = "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end \
    redis.call('HSET', KEYS[2], ARGV[2], ARGV[3]) return 1";

const POSTGRES_SCHEMA: &str = "
    SELECT pg_advisory_xact_lock(hashtext('webhook_router_reconcile'));
    CREATE TABLE IF NOT EXISTS webhook_router_reconcile (
        registry    text NOT NULL,
        name        text NOT NULL,
        holder      text,
        lease_until timestamptz,
        position    bigint,
        PRIMARY KEY (registry, name)
    );
    CREATE TABLE IF NOT EXISTS webhook_router_reconcile_chase (
        registry text NOT NULL,
        hook     text NOT NULL,
        guid     text NOT NULL,
        record   text NOT NULL,
        due      timestamptz NOT NULL,
        given_up boolean NOT NULL DEFAULT false,
        PRIMARY KEY (registry, hook, guid)
    );
    CREATE INDEX IF NOT EXISTS webhook_router_reconcile_chase_due
        ON webhook_router_reconcile_chase (registry, hook, due);";
const POSTGRES_LEASE: &str = "
    INSERT INTO webhook_router_reconcile (registry, name, holder, lease_until)
    VALUES ($1, 'lease', $2, clock_timestamp() + $3::float8 * interval '1 millisecond')
    ON CONFLICT (registry, name) DO UPDATE
       SET holder = EXCLUDED.holder, lease_until = EXCLUDED.lease_until
     WHERE webhook_router_reconcile.holder = EXCLUDED.holder
        OR webhook_router_reconcile.lease_until < clock_timestamp()
    RETURNING 1";
const POSTGRES_RELEASE: &str = "
    UPDATE webhook_router_reconcile SET holder = NULL, lease_until = NULL
     WHERE registry = $1 AND name = 'lease' AND holder = $2";
const POSTGRES_POSITION: &str = "
    INSERT INTO webhook_router_reconcile (registry, name, position)
    SELECT $1, $3, $4 WHERE EXISTS (
        SELECT 1 FROM webhook_router_reconcile
         WHERE registry = $1 AND name = 'lease' AND holder = $2
           AND lease_until >= clock_timestamp())
    ON CONFLICT (registry, name) DO UPDATE SET position = EXCLUDED.position
    RETURNING 1";
const POSTGRES_POSITION_READ: &str =
    "SELECT position FROM webhook_router_reconcile WHERE registry = $1 AND name = $2";

/// The in-process state: the lease (holder, expiry), the positions, and per hook the chased
/// GUIDs with when each is due.
#[derive(Default)]
pub struct Local {
    lease: Option<(String, Instant)>,
    positions: HashMap<String, u64>,
    chase: HashMap<String, HashMap<String, (Chased, Instant)>>,
}

impl Local {
    /// Whether `holder` holds an unexpired lease.
    fn holds(&self, holder: &str) -> bool {
        self.lease
            .as_ref()
            .is_some_and(|(h, until)| h == holder && *until >= Instant::now())
    }
}

/// The shared reconciling state (cheap to clone).
#[derive(Clone)]
pub enum Shared {
    /// In this process (the in-memory registry; or replicas of one process in tests).
    Memory(Arc<Mutex<Local>>),
    /// In the router's store next to a shared registry.
    Store(Store),
}

impl Default for Shared {
    fn default() -> Self {
        Self::Memory(Arc::default())
    }
}

/// Runs `cmd` on Redis within the call timeout.
async fn redis_run<T: redis::FromRedisValue>(
    conn: &ConnectionManager,
    cmd: &redis::Cmd,
) -> Result<T, RegistryError> {
    let mut conn = conn.clone();
    timed("redis", async {
        cmd.query_async(&mut conn).await.map_err(redis_error)
    })
    .await
}

/// Runs `sql` (prepared once per connection) with `params` on PostgreSQL within the call
/// timeout: its rows.
async fn pg_rows(
    pool: &Pool,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>, RegistryError> {
    timed("postgres", async {
        let client = pool.get().await.map_err(pg_error)?;
        let stmt = client.prepare_cached(sql).await.map_err(pg_error)?;
        client.query(&stmt, params).await.map_err(pg_error)
    })
    .await
}

fn poisoned() -> RegistryError {
    RegistryError::backend("memory", false, "poisoned")
}

fn unexpected_key() -> RegistryError {
    RegistryError::backend("redis", false, "unexpected key")
}

/// `{<name>}:webhook-router:`, the prefix of the router's keys on Redis.
fn redis_prefix(store: &Store) -> Option<&str> {
    match store {
        // `owners` is `{<name>}:webhook-router:owners`.
        Store::Redis { owners, .. } => owners.strip_suffix("owners"),
        Store::Postgres { .. } => None,
    }
}

fn redis_keys(store: &Store) -> Option<(String, String)> {
    let prefix = redis_prefix(store)?;
    Some((
        format!("{prefix}reconcile:lease"),
        format!("{prefix}reconcile:positions"),
    ))
}

impl Shared {
    /// The state beside the replica's `store` (its PostgreSQL tables created if need be): the
    /// one [`Store`] of the replica, shared with the container owners' records; in this process
    /// without one (the in-memory registry).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use webhook_router::reconcile::shared::Shared;
    ///
    /// let s = Shared::beside(None).await.unwrap();
    /// assert!(matches!(s, Shared::Memory(_)));
    /// # }
    /// ```
    pub async fn beside(store: Option<&Store>) -> Result<Self, String> {
        let Some(store) = store else {
            return Ok(Self::default());
        };
        if let Store::Postgres { pool, .. } = store {
            create_tables(pool, POSTGRES_SCHEMA).await?;
        }
        Ok(Self::Store(store.clone()))
    }

    /// The state for the registry `name` on `choice`, beside a [`Store`] of its own (a test's
    /// replica; a router's replica uses its one store, [`beside`](Self::beside)).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use webhook_router::backend::RegistryChoice;
    /// use webhook_router::reconcile::shared::Shared;
    ///
    /// let s = Shared::open(&RegistryChoice::Memory, "r").await.unwrap();
    /// assert!(matches!(s, Shared::Memory(_)));
    /// # }
    /// ```
    pub async fn open(choice: &RegistryChoice, name: &str) -> Result<Self, String> {
        Self::beside(Store::open(choice, name).await?.as_ref()).await
    }

    /// Takes or renews the lease for `holder` for `ttl`: whether `holder` holds it now.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use webhook_router::reconcile::shared::Shared;
    ///
    /// let s = Shared::default();
    /// assert_eq!(s.lease("a", Duration::from_secs(60)).await, Ok(true));
    /// assert_eq!(s.lease("b", Duration::from_secs(60)).await, Ok(false));
    /// assert_eq!(s.lease("a", Duration::from_secs(60)).await, Ok(true));
    /// # }
    /// ```
    pub async fn lease(&self, holder: &str, ttl: Duration) -> Result<bool, RegistryError> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        match self {
            Self::Memory(local) => {
                let mut l = local.lock().map_err(|_| poisoned())?;
                let now = Instant::now();
                let free = match &l.lease {
                    None => true,
                    Some((h, until)) => h == holder || *until < now,
                };
                if free {
                    l.lease = Some((holder.to_owned(), now + ttl));
                }
                Ok(free)
            }
            Self::Store(store @ Store::Redis { conn, .. }) => {
                let (lease, _) = redis_keys(store).ok_or_else(unexpected_key)?;
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(REDIS_LEASE)
                    .arg(1)
                    .arg(&lease)
                    .arg(holder)
                    .arg(ttl_ms);
                Ok(redis_run::<i64>(conn, &cmd).await? == 1)
            }
            Self::Store(Store::Postgres { pool, registry }) => {
                let ttl = i64::try_from(ttl_ms).unwrap_or(i64::MAX) as f64;
                let rows = pg_rows(pool, POSTGRES_LEASE, &[registry, &holder, &ttl]).await?;
                Ok(!rows.is_empty())
            }
        }
    }

    /// Gives the lease up if `holder` holds it (a replica shutting down), so that another, or
    /// this one restarted, takes it at once rather than after its expiry.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use webhook_router::reconcile::shared::Shared;
    ///
    /// let s = Shared::default();
    /// s.lease("a", Duration::from_secs(60)).await.unwrap();
    /// s.release("b").await.unwrap();
    /// assert_eq!(s.lease("b", Duration::from_secs(60)).await, Ok(false), "not b's to give up");
    /// s.release("a").await.unwrap();
    /// assert_eq!(s.lease("b", Duration::from_secs(60)).await, Ok(true));
    /// # }
    /// ```
    pub async fn release(&self, holder: &str) -> Result<(), RegistryError> {
        match self {
            Self::Memory(local) => {
                let mut l = local.lock().map_err(|_| poisoned())?;
                if l.lease.as_ref().is_some_and(|(h, _)| h == holder) {
                    l.lease = None;
                }
                Ok(())
            }
            Self::Store(store @ Store::Redis { conn, .. }) => {
                let (lease, _) = redis_keys(store).ok_or_else(unexpected_key)?;
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(REDIS_RELEASE).arg(1).arg(&lease).arg(holder);
                redis_run::<i64>(conn, &cmd).await.map(drop)
            }
            Self::Store(Store::Postgres { pool, registry }) => {
                pg_rows(pool, POSTGRES_RELEASE, &[registry, &holder])
                    .await
                    .map(drop)
            }
        }
    }

    /// The attempt id `hook`'s log was reconciled up to, if any.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use webhook_router::reconcile::shared::Shared;
    ///
    /// let s = Shared::default();
    /// assert_eq!(s.position("app").await, Ok(None), "never reconciled");
    /// s.lease("a", Duration::from_secs(60)).await.unwrap();
    /// s.set_position("a", "app", 7).await.unwrap();
    /// assert_eq!(s.position("app").await, Ok(Some(7)));
    /// # }
    /// ```
    pub async fn position(&self, hook: &str) -> Result<Option<u64>, RegistryError> {
        match self {
            Self::Memory(local) => Ok(local
                .lock()
                .map_err(|_| poisoned())?
                .positions
                .get(hook)
                .copied()),
            Self::Store(store @ Store::Redis { conn, .. }) => {
                let (_, positions) = redis_keys(store).ok_or_else(unexpected_key)?;
                let mut cmd = redis::cmd("HGET");
                cmd.arg(&positions).arg(hook);
                redis_run(conn, &cmd).await
            }
            Self::Store(Store::Postgres { pool, registry }) => {
                let name = format!("position:{hook}");
                let rows = pg_rows(pool, POSTGRES_POSITION_READ, &[registry, &name]).await?;
                Ok(rows
                    .first()
                    .and_then(|r| r.get::<_, Option<i64>>(0))
                    .and_then(|p| u64::try_from(p).ok()))
            }
        }
    }

    /// Records that `hook`'s log is reconciled up to attempt `id`, if `holder` still holds the
    /// lease: whether it was written.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use webhook_router::reconcile::shared::Shared;
    ///
    /// let s = Shared::default();
    /// assert_eq!(s.set_position("a", "app", 7).await, Ok(false), "not the holder");
    /// s.lease("a", Duration::from_secs(60)).await.unwrap();
    /// assert_eq!(s.set_position("a", "app", 7).await, Ok(true));
    /// assert_eq!(s.position("app").await, Ok(Some(7)));
    /// # }
    /// ```
    pub async fn set_position(
        &self,
        holder: &str,
        hook: &str,
        id: u64,
    ) -> Result<bool, RegistryError> {
        match self {
            Self::Memory(local) => {
                let mut l = local.lock().map_err(|_| poisoned())?;
                let held = l.holds(holder);
                if held {
                    l.positions.insert(hook.to_owned(), id);
                }
                Ok(held)
            }
            Self::Store(store @ Store::Redis { conn, .. }) => {
                let (lease, positions) = redis_keys(store).ok_or_else(unexpected_key)?;
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(REDIS_POSITION)
                    .arg(2)
                    .arg(&lease)
                    .arg(&positions)
                    .arg(holder)
                    .arg(hook)
                    .arg(id);
                Ok(redis_run::<i64>(conn, &cmd).await? == 1)
            }
            Self::Store(Store::Postgres { pool, registry }) => {
                let id = i64::try_from(id).unwrap_or(i64::MAX);
                let name = format!("position:{hook}");
                let rows =
                    pg_rows(pool, POSTGRES_POSITION, &[registry, &holder, &name, &id]).await?;
                Ok(!rows.is_empty())
            }
        }
    }
}
