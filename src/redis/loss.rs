//! Data-loss detection on Redis (see `crate::remote::loss`): the registry's incarnation is
//! `{n}:epoch`, a value set once (`SET NX`) by the first handle or listener that finds none, so a
//! server that lost the registry's data (a restart without persistence, `FLUSHALL`, a failover to
//! a replica that never had it) has none or a new one; the id counter is `{n}:next_worker_id`, and
//! `{n}:snapshot_version` must not be below the version a handle has cached. Every sweep of every
//! handle reads the three in one pipeline (one round trip, three O(1) commands) before it
//! refreshes its snapshot.

use ::redis::aio::ConnectionManager;

use super::error;
use super::keys::Keys;
use super::RedisRegistry;
use crate::api::contract::WorkerRegistry;
use crate::api::error::RegistryError;
use crate::api::events::Event;
use crate::api::snapshot::StatusSnapshot;

/// What the server says of the registry's identity now.
pub(crate) struct Identity {
    pub(crate) incarnation: String,
    pub(crate) last_id: u64,
    pub(crate) version: u64,
}

/// Reads the registry's incarnation (setting `fresh` if there is none), its id counter and its
/// published snapshot version.
pub(crate) async fn identity(
    conn: &mut ConnectionManager,
    keys: &Keys,
    fresh: &str,
) -> Result<Identity, RegistryError> {
    let epoch = format!("{}epoch", keys.prefix);
    let (incarnation, last_id, version): (String, Option<u64>, Option<u64>) = ::redis::pipe()
        .cmd("SET")
        .arg(&epoch)
        .arg(fresh)
        .arg("NX")
        .ignore()
        .cmd("GET")
        .arg(&epoch)
        .cmd("GET")
        .arg(format!("{}next_worker_id", keys.prefix))
        .cmd("GET")
        .arg(format!("{}snapshot_version", keys.prefix))
        .query_async(conn)
        .await
        .map_err(error::backend)?;
    Ok(Identity {
        incarnation,
        last_id: last_id.unwrap_or(0),
        version: version.unwrap_or(0),
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
        let now = identity(&mut conn, &inner.keys, &inner.replica).await?;
        let Some(loss) =
            inner
                .loss
                .observe(&now.incarnation, now.last_id, before.version, now.version)
        else {
            return Ok(());
        };
        let mut lost = Vec::new();
        for w in before.workers.iter().filter(|w| w.status.is_alive()) {
            if self.worker(w.id).await?.is_none() {
                lost.push(w.id);
            }
        }
        tracing::error!(
            registry = %self.name(),
            replica = %inner.replica,
            lost = lost.len(),
            "{loss}: the workers created in what was lost no longer exist; stop their containers"
        );
        inner.snapshot.reset(StatusSnapshot::empty(
            inner.config.max_workers(),
            std::time::SystemTime::now(),
        ));
        inner.events.resubscribe();
        inner.events.sender.send(|| Event::DataLost { lost });
        Ok(())
    }
}
