//! The router's own small store next to a shared registry: which replica runs each worker's
//! container (the address other replicas forward its events to, see [`crate::remote`]), and, for
//! the simulator's audit, a direct read of the registry's live-worker count.
//!
//! It lives beside the library's data, never inside it:
//!
//! | backend | owners | live count (read only) |
//! |---|---|---|
//! | Redis | hash `{<name>}:webhook-router:owners`, worker id → `"<claim> <delivery> <base URL>"` (same hash tag: same Cluster slot as the registry) | `ZCARD {<name>}:live` |
//! | PostgreSQL | table `webhook_router_owners (registry, worker, address, claim, delivery)`, created by the router | `wr_capacity.live` of the registry |
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
        /// The registry's live-worker set.
        live: String,
    },
    /// In the registry's PostgreSQL database.
    Postgres {
        /// Its own small pool.
        pool: Pool,
        /// The registry name.
        registry: String,
    },
}

fn redis_error(e: redis::RedisError) -> RegistryError {
    RegistryError::backend("redis", true, e)
}

fn pg_error(e: impl std::error::Error + Send + Sync + 'static) -> RegistryError {
    RegistryError::backend("postgres", true, e)
}

/// Runs `fut` within the backend call timeout.
async fn timed<T>(
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
                    live: format!("{{{name}}}:live"),
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
                let mut client = pool.get().await.map_err(|e| e.to_string())?;
                let tx = client.transaction().await.map_err(|e| e.to_string())?;
                tx.batch_execute(POSTGRES_SCHEMA)
                    .await
                    .map_err(|e| e.to_string())?;
                tx.commit().await.map_err(|e| e.to_string())?;
                drop(client);
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

    /// Accepted work the server still holds unfinished (an audit read of the library's documented
    /// layout, for the simulator's settle phase): claims not completed (in flight, bare, or
    /// released and not yet moved) plus released deliveries not yet acknowledged (re-dispatched).
    /// A released delivery stays counted from its release until the acknowledgement that follows
    /// its re-admission, so 0 means every accepted delivery is completed. Proportional to that
    /// unfinished work (a test-time read, not a router call).
    ///
    /// | backend | read |
    /// |---|---|
    /// | Redis | `ZCARD {n}:flight` + `ZCARD {n}:unbound` + `ZCARD {n}:released_due` + `XLEN {n}:released` + `ZCARD {n}:worder` (parked) |
    /// | PostgreSQL | `wr_claims` rows with `completed_at_ms IS NULL` + `wr_released` rows + `wr_waiting` rows (parked) |
    pub async fn unfinished(&self) -> Result<u64, RegistryError> {
        timed(self.backend(), async {
            match self {
                Self::Redis { conn, live, .. } => {
                    let mut conn = conn.clone();
                    // `live` is `{<name>}:live`: the registry's other keys share its prefix.
                    let prefix = live.strip_suffix("live").unwrap_or(live);
                    // A claim in flight is in `flight`, a bare one in `unbound`; a released one
                    // waits in `released_due` until a sweep moves it into the `released` stream,
                    // whose entry stays until `acknowledge` deletes it (a stuck claim goes from
                    // `flight` straight into the stream). See `src/redis/scripts/lib_base.lua`.
                    // Parked deliveries wait in `worder` (the waiting room) until promoted.
                    let (flight, unbound, due, released, parked): (u64, u64, u64, u64, u64) =
                        redis::pipe()
                            .cmd("ZCARD")
                            .arg(format!("{prefix}flight"))
                            .cmd("ZCARD")
                            .arg(format!("{prefix}unbound"))
                            .cmd("ZCARD")
                            .arg(format!("{prefix}released_due"))
                            .cmd("XLEN")
                            .arg(format!("{prefix}released"))
                            .cmd("ZCARD")
                            .arg(format!("{prefix}worder"))
                            .query_async(&mut conn)
                            .await
                            .map_err(redis_error)?;
                    Ok(flight + unbound + due + released + parked)
                }
                Self::Postgres { pool, registry } => {
                    let client = pool.get().await.map_err(pg_error)?;
                    let stmt = client
                        .prepare_cached(
                            "SELECT (SELECT count(*) FROM wr_claims c \
                                      WHERE c.registry = r.id AND c.completed_at_ms IS NULL) \
                                  + (SELECT count(*) FROM wr_released o WHERE o.registry = r.id) \
                                  + (SELECT count(*) FROM wr_waiting q WHERE q.registry = r.id) \
                               FROM wr_registries r WHERE r.name = $1",
                        )
                        .await
                        .map_err(pg_error)?;
                    let row = client
                        .query_opt(&stmt, &[registry])
                        .await
                        .map_err(pg_error)?;
                    Ok(row.map_or(0, |r| u64::try_from(r.get::<_, i64>(0)).unwrap_or(0)))
                }
            }
        })
        .await
    }

    /// What the server holds for `delivery` (an audit read of the library's documented layout, for
    /// the simulator to explain a delivery it found lost): on PostgreSQL its `wr_claims` rows (with
    /// the holder's status), `wr_released` outbox rows (claimed by which replica, when) and
    /// `wr_waiting` rows (parked), and the server's clock, as JSON text; `None` on Redis (not read).
    pub async fn delivery_state(&self, delivery: &str) -> Result<Option<String>, RegistryError> {
        timed(self.backend(), async {
            match self {
                Self::Redis { .. } => Ok(None),
                Self::Postgres { pool, registry } => {
                    let client = pool.get().await.map_err(pg_error)?;
                    let stmt = client
                        .prepare_cached(
                            "SELECT jsonb_build_object(\
                               'now_ms', wr_now(r.id), \
                               'claims', (SELECT coalesce(jsonb_agg(to_jsonb(c) - 'registry' \
                                   || jsonb_build_object('holder_status', w.status, \
                                        'holder_dead_reason', w.dead_reason)), '[]') \
                                 FROM wr_claims c LEFT JOIN wr_workers w \
                                   ON w.registry = c.registry AND w.id = c.holder \
                                WHERE c.registry = r.id AND c.delivery = $2), \
                               'outbox', (SELECT coalesce(jsonb_agg(to_jsonb(o) - 'registry'), '[]') \
                                 FROM wr_released o WHERE o.registry = r.id AND o.delivery = $2), \
                               'waiting', (SELECT coalesce(jsonb_agg(to_jsonb(q) - 'registry'), '[]') \
                                 FROM wr_waiting q WHERE q.registry = r.id AND q.delivery = $2)\
                             )::text FROM wr_registries r WHERE r.name = $1",
                        )
                        .await
                        .map_err(pg_error)?;
                    let row = client
                        .query_opt(&stmt, &[registry, &delivery])
                        .await
                        .map_err(pg_error)?;
                    Ok(row.map(|r| r.get::<_, String>(0)))
                }
            }
        })
        .await
    }

    /// The registry's live-worker count as the server holds it now (an audit read of the
    /// library's documented layout: `ZCARD {name}:live`, or `wr_capacity.live`).
    pub async fn live_workers(&self) -> Result<u64, RegistryError> {
        timed(self.backend(), async {
            match self {
                Self::Redis { conn, live, .. } => {
                    let mut conn = conn.clone();
                    redis::cmd("ZCARD")
                        .arg(live)
                        .query_async::<u64>(&mut conn)
                        .await
                        .map_err(redis_error)
                }
                Self::Postgres { pool, registry } => {
                    let client = pool.get().await.map_err(pg_error)?;
                    let stmt = client
                        .prepare_cached(
                            "SELECT c.live FROM wr_capacity c JOIN wr_registries r ON r.id = c.registry \
                             WHERE r.name = $1",
                        )
                        .await
                        .map_err(pg_error)?;
                    let row = client
                        .query_opt(&stmt, &[registry])
                        .await
                        .map_err(pg_error)?;
                    Ok(row.map_or(0, |r| u64::try_from(r.get::<_, i32>(0)).unwrap_or(0)))
                }
            }
        })
        .await
    }
}
