//! Data-loss detection on PostgreSQL (see `crate::remote::loss`): the registry's incarnation is
//! `wr_registries.epoch` (random, set when the row is created), the id counter
//! `wr_capacity.next_worker_id`, the published version `wr_snapshots.version`. A failover to an
//! asynchronous standby that had not received the latest commits, or a restore of an older copy,
//! leaves the incarnation as it was and the counter or the version below what a handle saw; a
//! registry deleted and created again has a new incarnation. The first handle that finds a rewind
//! changes the incarnation (compare-and-set), so that every other handle finds it too, even once
//! the counter and the version have caught up. Every sweep of every handle reads
//! the three (one statement, three primary-key lookups) before it refreshes its snapshot.

use super::delta;
use super::rows::col;
use super::PostgresRegistry;
use crate::api::error::RegistryError;
use crate::api::events::Event;
use crate::remote::{agreement, loss};

/// Moves the incarnation on from `$2` to `$3` unless another handle did already; the current one.
const NEW_EPOCH: &str = "WITH moved AS (UPDATE wr_registries SET epoch = $3 \
                                          WHERE id = $1 AND epoch = $2 RETURNING epoch) \
    SELECT coalesce((SELECT epoch FROM moved), \
                    (SELECT epoch FROM wr_registries WHERE id = $1), '') AS epoch";

const IDENTITY: &str = "SELECT \
    coalesce((SELECT epoch FROM wr_registries WHERE id = $1), '') AS incarnation, \
    coalesce((SELECT next_worker_id - 1 FROM wr_capacity WHERE registry = $1), 0) AS last_id, \
    coalesce((SELECT version FROM wr_snapshots WHERE registry = $1), 0) AS version";

/// Stores the deciding settings `$2` with registry `$1` unless some are stored; the stored ones.
/// The update always takes the row (a `WHERE config IS NULL` would skip a row a concurrent first
/// connect just set, and a read beside it sees the statement's snapshot, from before that
/// commit): after waiting for the other's lock it sees the row as committed, and `RETURNING`
/// gives the settings that won.
const AGREE: &str = "WITH stored AS (UPDATE wr_registries \
                                      SET config = coalesce(config, to_jsonb($2::text)) \
                                      WHERE id = $1 RETURNING config) \
    SELECT (SELECT config FROM stored) #>> '{}' AS config";

/// What the database says of the registry's identity now.
pub(crate) struct Identity {
    pub(crate) incarnation: String,
    pub(crate) last_id: u64,
    pub(crate) version: u64,
}

impl PostgresRegistry {
    /// Stores this handle's deciding settings with the registry unless some are stored already
    /// (`wr_registries.config`), and refuses a configuration that differs from them with
    /// [`RegistryError::ConfigDisagrees`] (see `crate::remote::agreement`).
    pub(crate) async fn agree(&self) -> Result<(), RegistryError> {
        let ours = agreement::settings(&self.inner.settings.config);
        let encoded = agreement::encode(&ours);
        let stored: Option<String> = self
            .call(AGREE, &[&self.inner.id, &encoded], |row| col(row, "config"))
            .await?;
        match agreement::disagreement(stored.as_deref().unwrap_or(""), &ours) {
            None => Ok(()),
            Some((setting, stored, configured)) => Err(RegistryError::ConfigDisagrees {
                setting,
                stored,
                configured,
            }),
        }
    }

    /// The registry's incarnation, id counter and published version, read now.
    pub(crate) async fn identity(&self) -> Result<Identity, RegistryError> {
        self.call(IDENTITY, &[&self.inner.id], |row| {
            Ok(Identity {
                incarnation: col(row, "incarnation")?,
                last_id: u64::try_from(col::<i64>(row, "last_id")?).unwrap_or(0),
                version: u64::try_from(col::<i64>(row, "version")?).unwrap_or(0),
            })
        })
        .await
    }

    /// Compares the database's registry with what this handle saw (before a sweep refreshes
    /// the snapshot); on a loss, logs it, counts it, publishes [`Event::DataLost`] to this
    /// handle's subscribers naming the workers its snapshot listed alive that the database no
    /// longer knows, and starts its copy of the snapshot over.
    pub(crate) async fn check_loss(&self) -> Result<(), RegistryError> {
        let inner = &*self.inner;
        let before = inner.snapshot.load();
        if let Some(max) = before.workers.iter().map(|w| w.id).max() {
            inner.loss.saw(max);
        }
        let now = self.identity().await?;
        let Some(found) =
            inner
                .loss
                .observe(&now.incarnation, now.last_id, before.version, now.version)
        else {
            return Ok(());
        };
        if found.is_rewind() {
            let fresh = format!("{}-{}", inner.replica, now.last_id);
            let epoch: String = self
                .call(NEW_EPOCH, &[&inner.id, &now.incarnation, &fresh], |row| {
                    col(row, "epoch")
                })
                .await?;
            inner.loss.begin(&epoch, now.last_id);
        }
        let lost = loss::lost_workers(self, &before).await?;
        loss::log("postgres", self.name(), &inner.replica, &found, &lost);
        inner.snapshot.reset(delta::empty_snapshot(
            before.capacity.limit,
            before.payloads.budget,
        ));
        inner.events.send(|| Event::DataLost { lost });
        Ok(())
    }
}
