//! [`Maintenance`] for [`PostgresRegistry`]: the sweep (one call of `wr_sweep`, which does the
//! maintenance only on the replica holding the advisory lock, and on every replica claims its
//! share of the outbox and returns the snapshot if it is newer than the cached one) and the
//! acknowledgement of released events.

use std::time::{Duration, Instant};

use serde::Deserialize;

use super::error::{decode, Failure};
use super::rows::{self, col};
use super::snapshot::SnapshotRow;
use super::PostgresRegistry;
use crate::api::contract::Maintenance;
use crate::api::error::RegistryError;
use crate::api::ids::DeliveryId;
use crate::api::report::{Receipt, ReleaseReason, ReleasedEvent, SweepReport};

const SWEEP: &str = "SELECT wr_sweep($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, \
                     $14, $15, $16, $17)::text AS body";
const ACKNOWLEDGE: &str = "SELECT wr_acknowledge($1, $2) AS n";
const SNAPSHOT: &str = "SELECT wr_now($1) AS now_ms, (to_jsonb(s) - 'registry')::text AS body \
                        FROM wr_snapshots s WHERE s.registry = $1";

/// What `wr_sweep` returns.
#[derive(Debug, Deserialize)]
struct SweepOut {
    swept: bool,
    now: i64,
    died: Vec<(i64, String)>,
    suspected: Vec<i64>,
    brake_engaged: bool,
    released_targets: Vec<(String, i64)>,
    released_count: u64,
    expired: u64,
    evicted: u64,
    purged: u64,
    events: Vec<OutboxRow>,
    snapshot: Option<SnapshotRow>,
    /// The stall this sweep measured (ms; 0 for none).
    stall_ms: i64,
    /// Deliveries this sweep released as stuck.
    stuck_count: u64,
    /// Active workers this sweep drained because they held a stuck delivery.
    drained_stuck: Vec<i64>,
}

/// A claimed outbox row.
#[derive(Debug, Deserialize)]
struct OutboxRow {
    id: i64,
    repo: String,
    number: i64,
    delivery: String,
    holder: Option<i64>,
    reason: String,
    dead_reason: Option<String>,
}

impl OutboxRow {
    fn event(&self) -> Result<ReleasedEvent, Failure> {
        let reason = match self.reason.as_str() {
            "worker_died" => {
                ReleaseReason::WorkerDied(rows::dead_reason(self.dead_reason.as_deref())?)
            }
            "stuck" => ReleaseReason::Stuck,
            "unbound" => ReleaseReason::Unbound,
            other => return Err(decode(format!("release reason {other:?}"))),
        };
        let delivery = DeliveryId::new(&self.delivery)
            .map_err(|e| decode(format!("delivery {:?}: {e}", self.delivery)))?;
        Ok(ReleasedEvent::new(
            rows::target(&self.repo, self.number)?,
            delivery,
            self.holder.map(rows::worker_id).transpose()?,
            reason,
        )
        .with_receipt(Receipt::new(self.id.to_string())))
    }
}

fn parse<T: for<'de> Deserialize<'de>>(what: &str, text: &str) -> Result<T, Failure> {
    serde_json::from_str(text).map_err(|e| decode(format!("{what}: {e}")))
}

impl PostgresRegistry {
    /// Fetches the published snapshot into the cache (on connect).
    pub(super) async fn refresh_snapshot(&self) -> Result<(), RegistryError> {
        let limit = self.config_ref().max_workers();
        let (snapshot, now) = self
            .call(SNAPSHOT, &[&self.inner.id], |row| {
                let body: String = col(row, "body")?;
                let now: i64 = col(row, "now_ms")?;
                Ok((
                    parse::<SnapshotRow>("snapshot", &body)?.into_snapshot(limit)?,
                    now,
                ))
            })
            .await?;
        self.inner.snapshot.offer(snapshot, now);
        Ok(())
    }
}

impl Maintenance for PostgresRegistry {
    async fn sweep(&self) -> Result<SweepReport, RegistryError> {
        let started = Instant::now();
        let inner = &*self.inner;
        let p = &inner.params;
        let known = i64::try_from(inner.snapshot.version()).unwrap_or(i64::MAX);
        let limit = self.config_ref().max_workers();
        let (out, snapshot, released) = self
            .call(
                SWEEP,
                &[
                    &inner.id,
                    &inner.replica,
                    &known,
                    &p.timeout,
                    &p.grace,
                    &p.retention,
                    &p.max_retained,
                    &p.dead_retention,
                    &p.suspect_grace,
                    &p.brake_fraction,
                    &p.brake_min,
                    &p.ack_timeout,
                    &p.batch,
                    &p.sweep_interval,
                    &p.max_in_flight,
                    &p.drain_deadline,
                    &p.stall_horizon,
                ],
                |row| {
                    let body: String = col(row, "body")?;
                    let mut out: SweepOut = parse("sweep report", &body)?;
                    let snapshot = out
                        .snapshot
                        .take()
                        .map(|s| s.into_snapshot(limit))
                        .transpose()?;
                    let released = out
                        .events
                        .iter()
                        .map(OutboxRow::event)
                        .collect::<Result<Vec<_>, _>>()?;
                    Ok((out, snapshot, released))
                },
            )
            .await?;

        let mut report = SweepReport {
            swept: out.swept,
            at: rows::since_epoch(out.now),
            brake_engaged: out.brake_engaged,
            released,
            expired_claims: out.expired as usize,
            evicted_claims: out.evicted as usize,
            purged_workers: out.purged as usize,
            stall_credited: Duration::from_millis(u64::try_from(out.stall_ms).unwrap_or(0)),
            ..SweepReport::default()
        };
        for (id, reason) in &out.died {
            let id = rows::worker_id(*id).map_err(Failure::into_registry)?;
            let reason = rows::dead_reason(Some(reason)).map_err(Failure::into_registry)?;
            report.died.push((id, reason));
        }
        for id in &out.suspected {
            report
                .suspected
                .push(rows::worker_id(*id).map_err(Failure::into_registry)?);
        }
        for id in &out.drained_stuck {
            report
                .drained_stuck
                .push(rows::worker_id(*id).map_err(Failure::into_registry)?);
        }
        for (repo, number) in &out.released_targets {
            report
                .released_targets
                .push(rows::target(repo, *number).map_err(Failure::into_registry)?);
        }
        if let Some(s) = snapshot {
            inner.snapshot.offer(s, out.now);
        }
        report.version = inner.snapshot.version();
        report.took = started.elapsed();

        if out.swept {
            let c = &inner.counters;
            c.sweeps.inc();
            for (_, reason) in &report.died {
                c.death(*reason).inc();
            }
            c.suspected.add(report.suspected.len() as u64);
            if report.brake_engaged {
                c.brake_engaged.inc();
            }
            c.claims_released.add(out.released_count);
            c.claims_stuck.add(out.stuck_count);
            c.claims_expired.add(out.expired);
            c.claims_evicted.add(out.evicted);
            c.workers_purged.add(out.purged);
            c.observe_sweep(report.took);
            self.settle().await;
        }
        Ok(report)
    }

    async fn acknowledge(&self, released: &[ReleasedEvent]) -> Result<(), RegistryError> {
        // Events without a receipt of ours (none, or not a row id) were not handed out by this
        // backend: nothing to acknowledge.
        let ids: Vec<i64> = released
            .iter()
            .filter_map(|e| e.receipt()?.as_str().parse().ok())
            .collect();
        if ids.is_empty() {
            return Ok(());
        }
        self.call(ACKNOWLEDGE, &[&self.inner.id, &ids], |row| {
            col::<i32>(row, "n")
        })
        .await
        .map(|_| ())
    }
}
