//! The GUIDs the reconciler is chasing, per hook, next to the lease and the positions: a GUID it
//! redelivered that the registry did not know yet, with what it needs to check and redeliver it
//! again without GitHub's log ([`Chased`]) and when it is next due, on the server's clock.
//!
//! | backend | records | due | active |
//! |---|---|---|---|
//! | Redis | hash `{<name>}:webhook-router:reconcile:chase:<hook>`, GUID → JSON | sorted set `...:chase-due:<hook>`, GUID → due (ms, `TIME`) | sorted set `...:chase-active:<hook>`, GUID → first failure |
//! | PostgreSQL | rows of `webhook_router_reconcile_chase (registry, hook, guid)`: `record` (JSON), `due` (`clock_timestamp()`), `given_up` | index on `(registry, hook, due)` | `NOT given_up` |
//! | in memory | this process (a restart forgets them, as it does the positions) | tokio's clock | |
//!
//! Writes (a record scheduled, a record removed) are fenced by the lease, like the positions: one
//! script or one statement each, which writes only while the writer holds the lease. A read of
//! the due records takes at most `limit` of them, oldest due first.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tokio_postgres::types::ToSql;
use worker_registry::RegistryError;

use super::{pg_rows, poisoned, redis_run, unexpected_key, Shared};
use crate::store::Store;

/// One chased GUID.
///
/// # Examples
///
/// ```
/// use webhook_router::reconcile::shared::Chased;
///
/// let c = Chased {
///     guid: "72d3162e-cc78-11e3-81ab-4c9367dc0958".into(),
///     attempt: 12,
///     key: "72d3162e-cc78-11e3-81ab-4c9367dc0958@hook-7".into(),
///     targets: vec!["o/r#1".into()],
///     failed_at: 1_700_000_000,
///     redeliveries: 1,
///     given_up: false,
/// };
/// let json = serde_json::to_string(&c).unwrap();
/// assert_eq!(serde_json::from_str::<Chased>(&json).unwrap(), c);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chased {
    /// The event's GUID.
    pub guid: String,
    /// The attempt GitHub is asked to redeliver (any attempt of a GUID sends it again).
    pub attempt: u64,
    /// The claim key the router admits it under (the GUID with its hook's identity).
    pub key: String,
    /// The pull requests it names (`owner/repo#number`).
    pub targets: Vec<String>,
    /// When GitHub first logged it failed, in seconds since the Unix epoch (GitHub's clock): the
    /// chase ends when that falls out of the horizon.
    pub failed_at: u64,
    /// Redeliveries asked for so far.
    pub redeliveries: u32,
    /// Given up on: kept, not chased, until GitHub's log has dropped it, so that a late failed
    /// attempt of it does not start a new chase.
    #[serde(default)]
    pub given_up: bool,
}

/// Records a chased GUID: ARGV holder, guid, record, due in ms from now, active (1/0), first
/// failure. 1 if written (the writer holds the lease).
const REDIS_CHASE: &str = "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end \
    local t = redis.call('TIME') \
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
    redis.call('HSET', KEYS[2], ARGV[2], ARGV[3]) \
    redis.call('ZADD', KEYS[3], now + tonumber(ARGV[4]), ARGV[2]) \
    if ARGV[5] == '1' then redis.call('ZADD', KEYS[4], tonumber(ARGV[6]), ARGV[2]) \
    else redis.call('ZREM', KEYS[4], ARGV[2]) end \
    return 1";
/// Removes a chased GUID: ARGV holder, guid. 1 if the writer holds the lease.
const REDIS_FORGET: &str = "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end \
    redis.call('HDEL', KEYS[2], ARGV[2]) redis.call('ZREM', KEYS[3], ARGV[2]) \
    redis.call('ZREM', KEYS[4], ARGV[2]) return 1";
/// At most ARGV[1] records due now (server time), oldest due first.
const REDIS_DUE: &str = "local t = redis.call('TIME') \
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
    local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1])) \
    local out = {} \
    for _, g in ipairs(ids) do \
      local r = redis.call('HGET', KEYS[1], g) \
      if r then out[#out + 1] = r end \
    end \
    return out";

const POSTGRES_CHASE: &str = "
    INSERT INTO webhook_router_reconcile_chase (registry, hook, guid, record, due, given_up)
    SELECT $1, $3, $4, $5, clock_timestamp() + $6::float8 * interval '1 millisecond', $7
     WHERE EXISTS (
        SELECT 1 FROM webhook_router_reconcile
         WHERE registry = $1 AND name = 'lease' AND holder = $2
           AND lease_until >= clock_timestamp())
    ON CONFLICT (registry, hook, guid) DO UPDATE
       SET record = EXCLUDED.record, due = EXCLUDED.due, given_up = EXCLUDED.given_up
    RETURNING 1";
const POSTGRES_FORGET: &str = "
    WITH held AS (
        SELECT 1 FROM webhook_router_reconcile
         WHERE registry = $1 AND name = 'lease' AND holder = $2
           AND lease_until >= clock_timestamp()),
    gone AS (
        DELETE FROM webhook_router_reconcile_chase
         WHERE registry = $1 AND hook = $3 AND guid = $4 AND EXISTS (SELECT 1 FROM held)
        RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM held), (SELECT count(*) FROM gone)";
const POSTGRES_DUE: &str = "
    SELECT record FROM webhook_router_reconcile_chase
     WHERE registry = $1 AND hook = $2 AND due <= clock_timestamp()
     ORDER BY due LIMIT $3";
const POSTGRES_ONE: &str = "
    SELECT record FROM webhook_router_reconcile_chase
     WHERE registry = $1 AND hook = $2 AND guid = $3";
const POSTGRES_ACTIVE: &str = "
    SELECT guid FROM webhook_router_reconcile_chase
     WHERE registry = $1 AND hook = $2 AND NOT given_up
     ORDER BY guid LIMIT $3";
const POSTGRES_COUNT: &str = "
    SELECT count(*) FROM (
        SELECT 1 FROM webhook_router_reconcile_chase
         WHERE registry = $1 AND hook = $2 AND NOT given_up LIMIT $3) c";

/// The chase's keys on Redis for `hook`: the records, the due set, the active set.
struct Keys {
    lease: String,
    records: String,
    due: String,
    active: String,
}

impl Keys {
    /// `EVAL script 4 lease records due active`, its arguments to follow.
    fn eval(&self, script: &str) -> redis::Cmd {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(script)
            .arg(4)
            .arg(&[&self.lease, &self.records, &self.due, &self.active]);
        cmd
    }
}

fn redis_keys(store: &Store, hook: &str) -> Result<Keys, RegistryError> {
    let prefix = super::redis_prefix(store).ok_or_else(unexpected_key)?;
    Ok(Keys {
        lease: format!("{prefix}reconcile:lease"),
        records: format!("{prefix}reconcile:chase:{hook}"),
        due: format!("{prefix}reconcile:chase-due:{hook}"),
        active: format!("{prefix}reconcile:chase-active:{hook}"),
    })
}

fn decode(json: &str) -> Result<Chased, RegistryError> {
    serde_json::from_str(json).map_err(|e| RegistryError::backend("reconcile", false, e))
}

fn encode(c: &Chased) -> String {
    serde_json::to_string(c).unwrap_or_default()
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Shared {
    /// Records `chased` for `hook`, due again `after` from now (on the server's clock), if
    /// `holder` holds the lease: whether it was written.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use webhook_router::reconcile::shared::{Chased, Shared};
    ///
    /// let s = Shared::default();
    /// let c = Chased {
    ///     guid: "g".into(), attempt: 1, key: "g".into(), targets: vec!["o/r#1".into()],
    ///     failed_at: 0, redeliveries: 1, given_up: false,
    /// };
    /// s.lease("a", Duration::from_secs(60)).await.unwrap();
    /// assert_eq!(s.chase("b", "app", &c, Duration::ZERO).await, Ok(false), "b does not hold the lease");
    /// assert_eq!(s.chase("a", "app", &c, Duration::from_secs(60)).await, Ok(true));
    /// assert!(s.due("app", 10).await.unwrap().is_empty(), "due in a minute");
    /// # }
    /// ```
    pub async fn chase(
        &self,
        holder: &str,
        hook: &str,
        chased: &Chased,
        after: Duration,
    ) -> Result<bool, RegistryError> {
        match self {
            Self::Memory(local) => {
                let mut l = local.lock().map_err(|_| poisoned())?;
                if !l.holds(holder) {
                    return Ok(false);
                }
                let due = Instant::now() + after;
                l.chase
                    .entry(hook.to_owned())
                    .or_default()
                    .insert(chased.guid.clone(), (chased.clone(), due));
                Ok(true)
            }
            Self::Store(store @ Store::Redis { conn, .. }) => {
                let k = redis_keys(store, hook)?;
                let mut cmd = k.eval(REDIS_CHASE);
                cmd.arg(holder)
                    .arg(&chased.guid)
                    .arg(encode(chased))
                    .arg(millis(after))
                    .arg(if chased.given_up { "0" } else { "1" })
                    .arg(chased.failed_at);
                Ok(redis_run::<i64>(conn, &cmd).await? == 1)
            }
            Self::Store(Store::Postgres { pool, registry }) => {
                let (record, after) = (encode(chased), millis(after) as f64);
                let params: [&(dyn ToSql + Sync); 7] = [
                    registry,
                    &holder,
                    &hook,
                    &chased.guid,
                    &record,
                    &after,
                    &chased.given_up,
                ];
                Ok(!pg_rows(pool, POSTGRES_CHASE, &params).await?.is_empty())
            }
        }
    }

    /// Stops chasing `guid` of `hook` (the registry knows it, or its tombstone expired), if
    /// `holder` holds the lease: whether `holder` held it.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use webhook_router::reconcile::shared::{Chased, Shared};
    ///
    /// let s = Shared::default();
    /// let c = Chased {
    ///     guid: "g".into(), attempt: 1, key: "g".into(), targets: vec!["o/r#1".into()],
    ///     failed_at: 0, redeliveries: 1, given_up: false,
    /// };
    /// s.lease("a", Duration::from_secs(60)).await.unwrap();
    /// s.chase("a", "app", &c, Duration::ZERO).await.unwrap();
    /// assert_eq!(s.forget("a", "app", "g").await, Ok(true));
    /// assert_eq!(s.chased("app", "g").await, Ok(None));
    /// # }
    /// ```
    pub async fn forget(
        &self,
        holder: &str,
        hook: &str,
        guid: &str,
    ) -> Result<bool, RegistryError> {
        match self {
            Self::Memory(local) => {
                let mut l = local.lock().map_err(|_| poisoned())?;
                if !l.holds(holder) {
                    return Ok(false);
                }
                if let Some(m) = l.chase.get_mut(hook) {
                    m.remove(guid);
                }
                Ok(true)
            }
            Self::Store(store @ Store::Redis { conn, .. }) => {
                let k = redis_keys(store, hook)?;
                let mut cmd = k.eval(REDIS_FORGET);
                cmd.arg(holder).arg(guid);
                Ok(redis_run::<i64>(conn, &cmd).await? == 1)
            }
            Self::Store(Store::Postgres { pool, registry }) => {
                let rows =
                    pg_rows(pool, POSTGRES_FORGET, &[registry, &holder, &hook, &guid]).await?;
                Ok(rows.first().is_some_and(|r| r.get::<_, bool>(0)))
            }
        }
    }

    /// At most `limit` of `hook`'s chased GUIDs that are due now, oldest due first (given-up ones
    /// included, when their tombstone expires).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use webhook_router::reconcile::shared::{Chased, Shared};
    ///
    /// let s = Shared::default();
    /// let c = Chased {
    ///     guid: "g".into(), attempt: 1, key: "g".into(), targets: vec!["o/r#1".into()],
    ///     failed_at: 0, redeliveries: 1, given_up: false,
    /// };
    /// assert_eq!(s.chase("a", "app", &c, Duration::ZERO).await, Ok(false), "not the holder");
    /// s.lease("a", Duration::from_secs(60)).await.unwrap();
    /// assert_eq!(s.chase("a", "app", &c, Duration::ZERO).await, Ok(true));
    /// assert_eq!(s.due("app", 10).await.unwrap(), [c.clone()]);
    /// assert_eq!(s.chased("app", "g").await.unwrap(), Some(c.clone()));
    /// assert_eq!(s.chasing("app", 10).await.unwrap(), (1, vec!["g".to_owned()]));
    /// // Due again in an hour: not due now, still chased.
    /// assert_eq!(s.chase("a", "app", &c, Duration::from_secs(3600)).await, Ok(true));
    /// assert!(s.due("app", 10).await.unwrap().is_empty());
    /// assert_eq!(s.forget("a", "app", "g").await, Ok(true));
    /// assert_eq!(s.chasing("app", 10).await.unwrap(), (0, vec![]));
    /// # }
    /// ```
    pub async fn due(&self, hook: &str, limit: usize) -> Result<Vec<Chased>, RegistryError> {
        match self {
            Self::Memory(local) => {
                let l = local.lock().map_err(|_| poisoned())?;
                let now = Instant::now();
                let mut due: Vec<(Instant, &Chased)> = l
                    .chase
                    .get(hook)
                    .into_iter()
                    .flatten()
                    .filter(|(_, (_, at))| *at <= now)
                    .map(|(_, (c, at))| (*at, c))
                    .collect();
                due.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.guid.cmp(&b.1.guid)));
                Ok(due
                    .into_iter()
                    .take(limit)
                    .map(|(_, c)| c.clone())
                    .collect())
            }
            Self::Store(store @ Store::Redis { conn, .. }) => {
                let k = redis_keys(store, hook)?;
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(REDIS_DUE)
                    .arg(2)
                    .arg(&k.records)
                    .arg(&k.due)
                    .arg(limit);
                let records: Vec<String> = redis_run(conn, &cmd).await?;
                records.iter().map(|r| decode(r)).collect()
            }
            Self::Store(Store::Postgres { pool, registry }) => {
                let limit = i64::try_from(limit).unwrap_or(i64::MAX);
                let rows = pg_rows(pool, POSTGRES_DUE, &[registry, &hook, &limit]).await?;
                rows.iter().map(|r| decode(r.get::<_, &str>(0))).collect()
            }
        }
    }

    /// `guid`'s record for `hook`, if it is chased (or was given up on and is still kept).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use webhook_router::reconcile::shared::{Chased, Shared};
    ///
    /// let s = Shared::default();
    /// let c = Chased {
    ///     guid: "g".into(), attempt: 1, key: "g".into(), targets: vec!["o/r#1".into()],
    ///     failed_at: 0, redeliveries: 1, given_up: false,
    /// };
    /// s.lease("a", Duration::from_secs(60)).await.unwrap();
    /// assert_eq!(s.chased("app", "g").await, Ok(None));
    /// s.chase("a", "app", &c, Duration::from_secs(60)).await.unwrap();
    /// assert_eq!(s.chased("app", "g").await, Ok(Some(c)));
    /// # }
    /// ```
    pub async fn chased(&self, hook: &str, guid: &str) -> Result<Option<Chased>, RegistryError> {
        match self {
            Self::Memory(local) => Ok(local
                .lock()
                .map_err(|_| poisoned())?
                .chase
                .get(hook)
                .and_then(|m| m.get(guid))
                .map(|(c, _)| c.clone())),
            Self::Store(store @ Store::Redis { conn, .. }) => {
                let k = redis_keys(store, hook)?;
                let mut cmd = redis::cmd("HGET");
                cmd.arg(&k.records).arg(guid);
                let record: Option<String> = redis_run(conn, &cmd).await?;
                record.as_deref().map(decode).transpose()
            }
            Self::Store(Store::Postgres { pool, registry }) => {
                let rows = pg_rows(pool, POSTGRES_ONE, &[registry, &hook, &guid]).await?;
                rows.first()
                    .map(|r| decode(r.get::<_, &str>(0)))
                    .transpose()
            }
        }
    }

    /// How many GUIDs of `hook` are chased (given-up ones not counted; on PostgreSQL counted up
    /// to [`MAX_CHASED`](super::MAX_CHASED) + 1), and up to `show` of them (on Redis the oldest
    /// failures first, elsewhere by GUID).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use webhook_router::reconcile::shared::{Chased, Shared};
    ///
    /// let s = Shared::default();
    /// let c = Chased {
    ///     guid: "g".into(), attempt: 1, key: "g".into(), targets: vec!["o/r#1".into()],
    ///     failed_at: 0, redeliveries: 1, given_up: false,
    /// };
    /// s.lease("a", Duration::from_secs(60)).await.unwrap();
    /// s.chase("a", "app", &c, Duration::from_secs(60)).await.unwrap();
    /// assert_eq!(s.chasing("app", 10).await.unwrap(), (1, vec!["g".to_owned()]));
    /// assert_eq!(s.chasing("app", 0).await.unwrap(), (1, vec![]), "counted, none shown");
    /// # }
    /// ```
    pub async fn chasing(
        &self,
        hook: &str,
        show: usize,
    ) -> Result<(u64, Vec<String>), RegistryError> {
        match self {
            Self::Memory(local) => {
                let l = local.lock().map_err(|_| poisoned())?;
                let mut active: Vec<&String> = l
                    .chase
                    .get(hook)
                    .into_iter()
                    .flatten()
                    .filter(|(_, (c, _))| !c.given_up)
                    .map(|(g, _)| g)
                    .collect();
                active.sort();
                let shown = active.iter().take(show).map(|g| (*g).clone()).collect();
                Ok((active.len() as u64, shown))
            }
            Self::Store(store @ Store::Redis { conn, .. }) => {
                let k = redis_keys(store, hook)?;
                let mut zcard = redis::cmd("ZCARD");
                zcard.arg(&k.active);
                let count: u64 = redis_run(conn, &zcard).await?;
                let Some(last) = show.checked_sub(1) else {
                    return Ok((count, Vec::new()));
                };
                let mut zrange = redis::cmd("ZRANGE");
                zrange.arg(&k.active).arg(0).arg(last);
                Ok((count, redis_run(conn, &zrange).await?))
            }
            Self::Store(Store::Postgres { pool, registry }) => {
                let bound = i64::try_from(super::MAX_CHASED + 1).unwrap_or(i64::MAX);
                let counted = pg_rows(pool, POSTGRES_COUNT, &[registry, &hook, &bound]).await?;
                let n: i64 = counted.first().map_or(0, |r| r.get(0));
                let show = i64::try_from(show).unwrap_or(i64::MAX);
                let rows = pg_rows(pool, POSTGRES_ACTIVE, &[registry, &hook, &show]).await?;
                Ok((
                    u64::try_from(n).unwrap_or(0),
                    rows.iter().map(|r| r.get::<_, String>(0)).collect(),
                ))
            }
        }
    }
}
