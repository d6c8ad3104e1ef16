//! Data-loss detection on Redis (see `crate::remote::loss`): the registry's incarnation is
//! `{n}:epoch`, a value set by the first handle or listener that finds none, so a server that lost
//! the registry's data (a restart without persistence, `FLUSHALL`, a failover to a replica that
//! never had it) has none or a new one; the id counter is `{n}:next_worker_id`, and
//! `{n}:snapshot_version` must not be below the version a handle has cached. Every sweep of every
//! handle reads the three (`identity.lua`: one script, three O(1) reads) before it refreshes its
//! snapshot. The first handle that finds the data rewound (same epoch, a counter or version below
//! what it saw: a failover to a replica that lagged) moves the epoch on, so that every other
//! handle finds the loss too.

use super::link::Link;

use super::error;
use super::keys::Keys;
use super::scripts::SCRIPTS;
use super::RedisRegistry;
use crate::api::error::RegistryError;
use crate::api::events::Event;
use crate::api::snapshot::StatusSnapshot;
use crate::remote::loss;

/// What the server says of the registry's identity now.
pub(crate) struct Identity {
    pub(crate) incarnation: String,
    pub(crate) last_id: u64,
    pub(crate) version: u64,
}

/// Reads the registry's incarnation (setting `fresh` if there is none, or if it is still `from`),
/// its id counter and its published snapshot version: one script, three O(1) reads.
pub(crate) async fn identity(
    conn: &mut Link,
    keys: &Keys,
    replica: &str,
    fresh: &str,
    from: &str,
    forget_after_ms: u64,
) -> Result<Identity, RegistryError> {
    let (incarnation, last_id, version): (String, u64, u64) = SCRIPTS
        .identity
        .key(&keys.clock)
        .arg(&keys.prefix)
        .arg(replica)
        .arg(fresh)
        .arg(from)
        .arg(forget_after_ms)
        .invoke_async(conn)
        .await
        .map_err(error::backend)?;
    Ok(Identity {
        incarnation,
        last_id,
        version,
    })
}

impl RedisRegistry {
    /// Compares the server's registry with what this handle saw (before a sweep refreshes the
    /// snapshot); on a loss, logs it, counts it, publishes [`Event::DataLost`] to this handle's
    /// subscribers naming the workers its snapshot listed alive that the server no longer knows,
    /// starts its copy of the snapshot over and has its listener subscribe again (the event
    /// numbering started over).
    pub(crate) async fn check_loss(&self) -> Result<(), RegistryError> {
        let inner = &*self.inner;
        let before = inner.snapshot.load();
        if let Some(max) = before.workers.iter().map(|w| w.id).max() {
            inner.loss.saw(max);
        }
        let mut conn = inner.conn.clone();
        let forget = inner.limits.forget_consumer_ms;
        let now = identity(
            &mut conn,
            &inner.keys,
            &inner.replica,
            &inner.replica,
            "",
            forget,
        )
        .await?;
        let Some(found) =
            inner
                .loss
                .observe(&now.incarnation, now.last_id, before.version, now.version)
        else {
            return Ok(());
        };
        if found.is_rewind() {
            // The epoch is unchanged: move it on, so that every other handle finds the loss too
            // (once the counter and the version have caught up, they could not).
            let fresh = format!("{}-{}", inner.replica, now.last_id);
            let moved = identity(
                &mut conn,
                &inner.keys,
                &inner.replica,
                &fresh,
                &now.incarnation,
                forget,
            )
            .await?;
            inner.loss.begin(&moved.incarnation, moved.last_id);
        }
        let lost = loss::lost_workers(self, &before).await?;
        loss::log("redis", self.name(), &inner.replica, &found, &lost);
        inner.snapshot.reset(StatusSnapshot::empty(
            inner.config.max_workers(),
            std::time::SystemTime::now(),
        ));
        inner.events.resubscribe();
        inner.events.sender.send(|| Event::DataLost { lost });
        Ok(())
    }
}

impl RedisRegistry {
    /// With [`wait_on_create`](super::RedisRegistryBuilder::wait_on_create): waits until that many
    /// replicas acknowledged this handle's writes, after a call that created `worker`.
    pub(crate) async fn wait_created(&self, worker: crate::api::ids::WorkerId) {
        let Some((replicas, timeout)) = self.inner.settings.wait_on_create else {
            return;
        };
        let mut conn = self.inner.conn.clone();
        let acked: Result<u64, _> = ::redis::cmd("WAIT")
            .arg(replicas)
            .arg(crate::clock::millis(timeout))
            .query_async(&mut conn)
            .await;
        match acked {
            Ok(n) if n >= replicas as u64 => {}
            Ok(n) => tracing::warn!(
                %worker, acknowledged = n, wanted = replicas,
                "worker created, but fewer replicas than wanted have it: a failover now may lose it"
            ),
            Err(e) => tracing::warn!(%worker, "WAIT after creating a worker failed: {e}"),
        }
    }
}
