//! The router's own small store next to a shared registry: which replica runs each worker's
//! container (the address other replicas forward its events to, see [`crate::remote`]), and the
//! reconciler's lease and positions ([`crate::reconcile::shared`]). One per replica, opened once
//! ([`Store::open`]) and shared by both, with one set of error and timeout helpers. It lives
//! beside the library's data, never inside it, and reads none of it (what the simulator audits
//! comes from the library: [`WorkerRegistry::audit`](worker_registry::WorkerRegistry::audit)):
//!
//! | backend | owners |
//! |---|---|
//! | Redis | hash `{<name>}:webhook-router:owners`, worker id → `"<claim> <delivery> <base URL>"` (same hash tag: same Cluster slot as the registry) |
//! | PostgreSQL | table `webhook_router_owners (registry, worker, address, claim, delivery)`, created by the router |
//!
//! A worker's record is its *start claim*: written, if none exists, by the replica about to start
//! its container, before the start ([`Store::claim`]; the claim id tells that replica's attempt
//! from any other, and the delivery whose admission made it is kept beside it), and removed when the container ends, by the sweeping replica when the registry
//! declares the worker dead (its owner may be gone), or by a winner that finds the worker no
//! longer one to start (see [`crate::remote`] for its lifetime).

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio_postgres::NoTls;
use worker_registry::{RegistryError, WorkerId};

use crate::backend::{RegistryChoice, BACKEND_CALL_TIMEOUT, BACKEND_CONNECT_TIMEOUT};

/// Connections of the store's own PostgreSQL pool (a lookup is one indexed read).
const POSTGRES_POOL_SIZE: usize = 4;

/// Creates the owners table once, whichever replica gets there first.
const POSTGRES_SCHEMA: &str = "
    SELECT pg_advisory_xact_lock(hashtext('webhook_router_owners'));
    CREATE TABLE IF NOT EXISTS webhook_router_owners (
        registry   text NOT NULL,
        worker     bigint NOT NULL,
        address    text NOT NULL,
        claim      bigint NOT NULL DEFAULT 0,
        delivery   text NOT NULL DEFAULT '',
        created_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (registry, worker)
    );
    ALTER TABLE webhook_router_owners
        ADD COLUMN IF NOT EXISTS claim bigint NOT NULL DEFAULT 0,
        ADD COLUMN IF NOT EXISTS delivery text NOT NULL DEFAULT '';";

/// The store of a shared backend (cheap to clone).
#[derive(Clone)]
pub enum Store {
    /// On the registry's Redis server.
    Redis {
        /// Its own managed connection (reconnects by itself).
        conn: ConnectionManager,
        /// The owners hash.
        owners: String,
    },
    /// In the registry's PostgreSQL database.
    Postgres {
        /// Its own small pool.
        pool: Pool,
        /// The registry name.
        registry: String,
    },
}

/// A Redis error of the store, as the registry's error type (retryable).
pub(crate) fn redis_error(e: redis::RedisError) -> RegistryError {
    RegistryError::backend("redis", true, e)
}

/// A PostgreSQL error of the store, as the registry's error type (retryable).
pub(crate) fn pg_error(e: impl std::error::Error + Send + Sync + 'static) -> RegistryError {
    RegistryError::backend("postgres", true, e)
}

/// Creates the router's own tables (`sql`, which takes an advisory lock first, so replicas
/// starting together create them once), in one transaction.
pub(crate) async fn create_tables(pool: &Pool, sql: &str) -> Result<(), String> {
    let mut client = pool.get().await.map_err(|e| e.to_string())?;
    let tx = client.transaction().await.map_err(|e| e.to_string())?;
    tx.batch_execute(sql).await.map_err(|e| e.to_string())?;
    tx.commit().await.map_err(|e| e.to_string())
}

/// Runs `fut` within the backend call timeout.
pub(crate) async fn timed<T>(
    backend: &'static str,
    fut: impl std::future::Future<Output = Result<T, RegistryError>>,
) -> Result<T, RegistryError> {
    match tokio::time::timeout(BACKEND_CALL_TIMEOUT, fut).await {
        Ok(r) => r,
        Err(_) => Err(RegistryError::backend(
            backend,
            true,
            format!("no answer within {BACKEND_CALL_TIMEOUT:?}"),
        )),
    }
}

fn db_id(worker: WorkerId) -> i64 {
    i64::try_from(worker.get()).unwrap_or(i64::MAX)
}

/// A claim id as PostgreSQL's `bigint` holds it (ids are kept below 2^62, see
/// [`crate::remote`]).
fn db_claim(claim: u64) -> i64 {
    i64::try_from(claim).unwrap_or(i64::MAX)
}

/// Writes a worker's owner record unless one exists; answers the record that holds.
/// `KEYS[1]` the owners hash, `ARGV[1]` the worker id, `ARGV[2]` the record.
const REDIS_CLAIM: &str = "
    if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then return ARGV[2] end
    return redis.call('HGET', KEYS[1], ARGV[1])";

/// A worker's owner record: the replica that claimed its start, under which claim, and for the
/// admission of which delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRecord {
    /// Where the replica is reached (`--advertise-url`).
    pub address: String,
    /// The claim's id, unique to the claiming attempt.
    pub claim: u64,
    /// The delivery whose admission made the claim (the winner hands that one to the container).
    pub delivery: String,
}

impl OwnerRecord {
    /// Reads a record as the Redis hash holds it, `"<claim> <delivery> <address>"` (neither a
    /// delivery id nor an address has a space). A bare address, as a router before start claims
    /// wrote it, reads as claim 0 for no delivery.
    fn parse(held: &str) -> Self {
        let mut parts = held.splitn(3, ' ');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(claim), Some(delivery), Some(address)) => Self {
                address: address.to_owned(),
                claim: claim.parse().unwrap_or(0),
                delivery: delivery.to_owned(),
            },
            _ => Self {
                address: held.to_owned(),
                claim: 0,
                delivery: String::new(),
            },
        }
    }
}

impl Store {
    /// Opens the store of `choice` for the registry `name`; `None` for the in-memory backend,
    /// which has no other replicas.
    pub async fn open(choice: &RegistryChoice, name: &str) -> Result<Option<Self>, String> {
        match choice {
            RegistryChoice::Memory => Ok(None),
            RegistryChoice::Redis(url) => {
                let client = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(BACKEND_CONNECT_TIMEOUT))
                    .set_response_timeout(Some(BACKEND_CALL_TIMEOUT))
                    .set_number_of_retries(1);
                let conn = ConnectionManager::new_with_config(client, config)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(Some(Self::Redis {
                    conn,
                    owners: format!("{{{name}}}:webhook-router:owners"),
                }))
            }
            RegistryChoice::Postgres(url) => {
                let mut pg: tokio_postgres::Config = url.parse().map_err(|e| format!("{e}"))?;
                if pg.get_connect_timeout().is_none() {
                    pg.connect_timeout(BACKEND_CONNECT_TIMEOUT);
                }
                if pg.get_application_name().is_none() {
                    pg.application_name("webhook-router");
                }
                let manager = Manager::from_config(
                    pg,
                    NoTls,
                    ManagerConfig {
                        recycling_method: RecyclingMethod::Fast,
                    },
                );
                let pool = Pool::builder(manager)
                    .max_size(POSTGRES_POOL_SIZE)
                    .runtime(Runtime::Tokio1)
                    .wait_timeout(Some(BACKEND_CALL_TIMEOUT))
                    .create_timeout(Some(BACKEND_CONNECT_TIMEOUT))
                    .recycle_timeout(Some(BACKEND_CONNECT_TIMEOUT))
                    .build()
                    .map_err(|e| e.to_string())?;
                create_tables(&pool, POSTGRES_SCHEMA).await?;
                Ok(Some(Self::Postgres {
                    pool,
                    registry: name.to_owned(),
                }))
            }
        }
    }

    fn backend(&self) -> &'static str {
        match self {
            Self::Redis { .. } => "redis",
            Self::Postgres { .. } => "postgres",
        }
    }

    /// Claims the start of `worker`'s container for the replica reachable at `address`, as its
    /// claim `claim`, made for the admission of `delivery`: writes that owner record unless one
    /// exists, in one atomic step on the server, and returns the record that holds (the one
    /// written, or the one found). The claim is this one's if the record carries its `claim`.
    ///
    /// | backend | step |
    /// |---|---|
    /// | Redis | `EVAL`: `HSETNX owners <worker> "<claim> <delivery> <address>"`, then `HGET` of the field |
    /// | PostgreSQL | `INSERT ... ON CONFLICT (registry, worker) DO UPDATE` (a no-op update) `RETURNING address, claim, delivery` |
    pub async fn claim(
        &self,
        worker: WorkerId,
        address: &str,
        claim: u64,
        delivery: &str,
    ) -> Result<OwnerRecord, RegistryError> {
        timed(self.backend(), async {
            match self {
                Self::Redis { conn, owners, .. } => {
                    let mut conn = conn.clone();
                    let held: String = redis::cmd("EVAL")
                        .arg(REDIS_CLAIM)
                        .arg(1)
                        .arg(owners)
                        .arg(worker.get())
                        .arg(format!("{claim} {delivery} {address}"))
                        .query_async(&mut conn)
                        .await
                        .map_err(redis_error)?;
                    Ok(OwnerRecord::parse(&held))
                }
                Self::Postgres { pool, registry } => {
                    let client = pool.get().await.map_err(pg_error)?;
                    // The no-op update makes the row's current values the answer when it exists,
                    // in the same statement (a `DO NOTHING` answers nothing then).
                    let stmt = client
                        .prepare_cached(
                            "INSERT INTO webhook_router_owners \
                               (registry, worker, address, claim, delivery) \
                             VALUES ($1, $2, $3, $4, $5) \
                             ON CONFLICT (registry, worker) DO UPDATE \
                               SET claim = webhook_router_owners.claim \
                             RETURNING address, claim, delivery",
                        )
                        .await
                        .map_err(pg_error)?;
                    let row = client
                        .query_one(
                            &stmt,
                            &[
                                registry,
                                &db_id(worker),
                                &address,
                                &db_claim(claim),
                                &delivery,
                            ],
                        )
                        .await
                        .map_err(pg_error)?;
                    Ok(OwnerRecord {
                        address: row.get(0),
                        claim: u64::try_from(row.get::<_, i64>(1)).unwrap_or(0),
                        delivery: row.get(2),
                    })
                }
            }
        })
        .await
    }

    /// The address of the replica that runs (or is starting) `worker`'s container, if one claimed
    /// it.
    pub async fn owner(&self, worker: WorkerId) -> Result<Option<String>, RegistryError> {
        timed(self.backend(), async {
            match self {
                Self::Redis { conn, owners, .. } => {
                    let mut conn = conn.clone();
                    let held = redis::cmd("HGET")
                        .arg(owners)
                        .arg(worker.get())
                        .query_async::<Option<String>>(&mut conn)
                        .await
                        .map_err(redis_error)?;
                    Ok(held.map(|h| OwnerRecord::parse(&h).address))
                }
                Self::Postgres { pool, registry } => {
                    let client = pool.get().await.map_err(pg_error)?;
                    let stmt = client
                        .prepare_cached(
                            "SELECT address FROM webhook_router_owners WHERE registry = $1 AND worker = $2",
                        )
                        .await
                        .map_err(pg_error)?;
                    let row = client
                        .query_opt(&stmt, &[registry, &db_id(worker)])
                        .await
                        .map_err(pg_error)?;
                    Ok(row.map(|r| r.get::<_, String>(0)))
                }
            }
        })
        .await
    }

    /// Forgets the records of `workers` (their containers are gone).
    pub async fn forget(&self, workers: &[WorkerId]) -> Result<(), RegistryError> {
        if workers.is_empty() {
            return Ok(());
        }
        timed(self.backend(), async {
            match self {
                Self::Redis { conn, owners, .. } => {
                    let mut conn = conn.clone();
                    let mut cmd = redis::cmd("HDEL");
                    cmd.arg(owners);
                    for w in workers {
                        cmd.arg(w.get());
                    }
                    cmd.query_async::<i64>(&mut conn)
                        .await
                        .map_err(redis_error)?;
                }
                Self::Postgres { pool, registry } => {
                    let ids: Vec<i64> = workers.iter().map(|w| db_id(*w)).collect();
                    let client = pool.get().await.map_err(pg_error)?;
                    let stmt = client
                        .prepare_cached(
                            "DELETE FROM webhook_router_owners WHERE registry = $1 AND worker = ANY($2)",
                        )
                        .await
                        .map_err(pg_error)?;
                    client
                        .execute(&stmt, &[registry, &ids])
                        .await
                        .map_err(pg_error)?;
                }
            }
            Ok(())
        })
        .await
    }
}
