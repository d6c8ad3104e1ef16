//! The lease holder's part of a sweep: the maintenance, in bounded steps (the functions
//! `wr_sweep_*` in `functions/sweep.sql`), each its own short transaction, so other calls interleave
//! with them: retention, releases left from before, versioning of rows other calls changed, the
//! deaths (each step handing its deliveries to this replica), then one transaction with the
//! in-flight gauge, the publish and this replica's collect (or, with a delivery stuck, the stuck
//! steps, then the publish, each in its own: a stuck step may kill a worker, which locks the
//! capacity row, and the publish never runs while that row is locked). Each kind of work goes on in steps of at most [`DEATH_STEP`] or
//! [`MAINTENANCE_STEP`] rows until a step finds less than it could take, or the sweep's bound
//! (the builder's `batch`, per kind) is reached.

use std::time::Duration;

use serde::Deserialize;

use super::delta::Collected;
use super::error::Failure;
use super::rows::{col, OutboxRow};
use super::PostgresRegistry;
use crate::api::error::RegistryError;
use crate::api::report::ReleasedEvent;

/// Workers one death step locks and judges. Small: the step holds the capacity row (which every
/// admit that creates a worker needs) while it kills its workers.
pub(crate) const DEATH_STEP: usize = 32;
/// Rows of each kind one step of the other maintenance releases, deletes or versions.
pub(crate) const MAINTENANCE_STEP: usize = 256;
/// Snapshot versions the purge log keeps: a replica further behind reads every worker row.
pub(crate) const PURGE_LOG_VERSIONS: i64 = 1_000;
/// The shortest maintenance lease. Short, so that a replica takes the maintenance over soon after
/// its holder died even with a tiny `sweep_interval` (a holder slower than its lease meanwhile
/// only shares the work: every step locks its rows `SKIP LOCKED` and re-checks them).
pub(crate) const MIN_LEASE_TTL: Duration = Duration::from_millis(100);

/// The lease's time to live for a sweep interval: three intervals, at least [`MIN_LEASE_TTL`].
pub(crate) fn lease_ttl(sweep_interval: Duration) -> Duration {
    sweep_interval.saturating_mul(3).max(MIN_LEASE_TTL)
}

const BEGIN: &str = "SELECT wr_sweep_begin($1, $2, $3, $4, $5, $6, $7, $8, $9)::text AS body";
const DEATHS: &str =
    "SELECT wr_sweep_deaths($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)::text AS body";
const RELEASE: &str = "SELECT wr_sweep_release($1, $2, $3, $4, $5)::text AS body";
const STUCK: &str = "SELECT wr_sweep_stuck($1, $2, $3, $4, $5, $6, $7)::text AS body";
const RETAIN: &str = "SELECT wr_sweep_retain($1, $2, $3, $4, $5, $6, $7)::text AS body";
const EXPIRE_RELEASED: &str = "SELECT wr_expire_released($1, $2, $3, $4)::text AS body";
/// The most unacknowledged outbox rows one sweep expires (the rest in the next sweeps).
pub(crate) const EXPIRE_RELEASED_BATCH: usize = 128;
const STAMP: &str = "SELECT wr_sweep_stamp($1, $2, $3) AS n";
const EXPIRE_WAITING: &str = "SELECT wr_sweep_expire_waiting($1, $2, $3, $4, $5)::text AS body";
const PROMOTE: &str = "SELECT wr_sweep_promote($1, $2, $3, 1)::text AS body";
const FINISH: &str = "SELECT wr_sweep_finish($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, \
                      $12, $13, $14, $15, $16, $17, $18)::text AS body";
const PUBLISH: &str = "SELECT wr_sweep_publish($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, \
                       $12, $13)::text AS body";

/// What `wr_sweep_begin` decided.
#[derive(Debug, Deserialize)]
pub(crate) struct Begun {
    pub(crate) swept: bool,
    pub(crate) now: i64,
    pub(crate) stall_ms: i64,
    pub(crate) brake: bool,
}

#[derive(Debug, Deserialize)]
struct DeathStep {
    scanned: usize,
    last_beat: i64,
    last_id: i64,
    died: Vec<(i64, String)>,
    suspected: Vec<i64>,
    held: bool,
    targets: Vec<(String, i64)>,
    /// The dead workers' deliveries, moved to the outbox and claimed for this replica.
    events: Vec<OutboxRow>,
    lost_lease: bool,
}

#[derive(Debug, Deserialize)]
struct ReleaseStep {
    count: u64,
    released: Vec<(String, i64, String)>,
    more: bool,
}

#[derive(Debug, Deserialize)]
struct StuckStep {
    count: usize,
    released: Vec<(String, i64, String)>,
    in_flight: Option<i64>,
    drained: Vec<i64>,
    died: Vec<(i64, String)>,
    targets: Vec<(String, i64)>,
}

#[derive(Debug, Deserialize)]
struct Published {
    stamped: usize,
}

/// What `wr_sweep_finish` answers: nothing done if a delivery is stuck (`stuck_due`), else
/// the rest.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Finished {
    StuckDue {
        #[allow(dead_code)]
        stuck_due: bool,
    },
    Done(Box<Done>),
}

/// What `wr_sweep_finish` did when no delivery was stuck.
#[derive(Debug, Deserialize)]
struct Done {
    stuck: StuckStep,
    published: Published,
    collected: Collected,
}

/// What `wr_expire_released` deleted: (repo, number, delivery) per row.
#[derive(Debug, Deserialize)]
struct ExpireStep {
    expired: Vec<(String, i64, String)>,
}

/// What `wr_sweep_expire_waiting` dropped: (repo, number, delivery, parked at, owner) per row.
#[derive(Debug, Deserialize)]
struct ExpireWaitingStep {
    expired: Vec<(String, i64, String, i64, String)>,
    more: bool,
}

/// What one `wr_sweep_promote` step did.
#[derive(Debug, Deserialize)]
struct PromoteStep {
    promoted: u64,
    more: bool,
}

#[derive(Debug, Deserialize)]
struct RetainStep {
    expired: u64,
    evicted: u64,
    purged: u64,
    retained: Option<i64>,
}

/// What the maintenance did, summed over its steps.
#[derive(Debug, Default)]
pub(crate) struct Maintained {
    /// Deaths: the silent ones by id, then the overdue drains by id, then the stuck workers
    /// that exited (the order one sweep used to report them in).
    pub(crate) died: Vec<(i64, String)>,
    pub(crate) suspected: Vec<i64>,
    pub(crate) held: bool,
    /// Targets that lost their worker.
    pub(crate) dead_targets: Vec<(String, i64)>,
    /// Deliveries released into the outbox (worker died, unbound, stuck).
    released: Vec<(String, i64, String)>,
    pub(crate) released_count: u64,
    pub(crate) stuck_count: u64,
    pub(crate) drained_stuck: Vec<i64>,
    pub(crate) expired: u64,
    pub(crate) evicted: u64,
    pub(crate) purged: u64,
    /// Outbox rows never acknowledged, deleted after `claim_retention` from their release.
    pub(crate) released_expired: u64,
    in_flight: Option<i64>,
    retained: Option<i64>,
    /// Transactions the maintenance ran (begin and publish included).
    pub(crate) steps: usize,
    /// The deliveries of this sweep's deaths, already claimed for this replica.
    pub(crate) events: Vec<ReleasedEvent>,
    /// Whether a version was published (and the TargetReleased events sent).
    published: bool,
    /// The registry's time, when the last step collected this replica's outbox share and
    /// applied the snapshot's changes already (their events are in `events`).
    pub(crate) collected: Option<i64>,
    /// Deliveries dropped from the waiting room past `max_wait`: (repo, number, delivery,
    /// parked at).
    pub(crate) expired_waiting: Vec<(String, i64, String, i64)>,
    /// Deliveries the catch-up promotion placed (handed over by the collect).
    pub(crate) promoted: u64,
}

fn parse<T: for<'de> Deserialize<'de>>(
    what: &str,
    row: &tokio_postgres::Row,
) -> Result<T, Failure> {
    let body: String = col(row, "body")?;
    serde_json::from_str(&body).map_err(|e| super::error::decode(format!("{what}: {e}")))
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

impl Maintained {
    fn took_stuck(&mut self, s: StuckStep) {
        self.stuck_count += s.count as u64;
        self.released.extend(s.released);
        self.drained_stuck.extend(s.drained);
        self.died.extend(s.died);
        self.dead_targets.extend(s.targets);
        if s.in_flight.is_some() {
            self.in_flight = s.in_flight;
        }
    }

    /// The released deliveries and the dead targets, as the publish takes them (none once a
    /// version of this sweep was published: its events went out with it).
    #[allow(clippy::type_complexity)]
    fn publishable(&self) -> (Vec<&str>, Vec<i64>, Vec<&str>, Vec<&str>, Vec<i64>) {
        if self.published {
            return Default::default();
        }
        let (mut r, mut n, mut d) = (Vec::new(), Vec::new(), Vec::new());
        for (repo, number, delivery) in &self.released {
            r.push(repo.as_str());
            n.push(*number);
            d.push(delivery.as_str());
        }
        let (dr, dn) = self
            .dead_targets
            .iter()
            .map(|(repo, number)| (repo.as_str(), *number))
            .unzip();
        (r, n, d, dr, dn)
    }
}

impl PostgresRegistry {
    /// Takes or renews the maintenance lease; for the holder, the stall rule and the brake.
    pub(crate) async fn sweep_begin(&self) -> Result<Begun, RegistryError> {
        let inner = &*self.inner;
        let p = &inner.params;
        self.call(
            BEGIN,
            &[
                &inner.id,
                &inner.replica,
                &p.lease_ttl,
                &p.sweep_interval,
                &p.stall_horizon,
                &p.timeout,
                &p.grace,
                &p.brake_fraction,
                &p.brake_min,
            ],
            |row| parse("sweep begin", row),
        )
        .await
    }

    /// The maintenance of the lease holder, at the sweep's instant `begun.now`.
    pub(crate) async fn maintain(&self, begun: &Begun) -> Result<Maintained, RegistryError> {
        let mut m = Maintained {
            steps: 1,
            ..Maintained::default()
        };
        // Retention and the releases left from before (bare claims past the timeout, deaths by
        // other calls) first, so that this sweep's deaths, whose deliveries the death steps
        // hand to this replica, come as close as they can to the sweep's answer.
        // The rows other calls changed since the last sweep are versioned first too; the
        // publish versions what this sweep's deaths and drains changed (one step of it, more
        // steps and a second version only if that was not all).
        self.retention(begun.now, &mut m).await?;
        self.expire_released(begun.now, &mut m).await?;
        self.releases(begun.now, &mut m).await?;
        self.stamp(&mut m).await?;
        if !self.deaths(begun, &mut m).await? {
            self.publish(begun, &mut m).await?;
            return Ok(m);
        }
        // The waiting room after the deaths (whose slots it may take), before the collect that
        // hands its promotions over.
        self.waiting_room(begun.now, &mut m).await?;
        // One round trip after the last death step: a stuck step, the publish, the collect.
        let (more_stuck, more_rows) = self.finish(begun, &mut m).await?;
        if more_stuck || more_rows {
            // Not all of it: the rest in steps, a second version (the collect is redone).
            m.collected = None;
            if more_stuck {
                self.stuck(begun.now, &mut m).await?;
            }
            self.stamp(&mut m).await?;
            self.publish(begun, &mut m).await?;
        }
        Ok(m)
    }

    /// The death steps, silent workers then overdue drains; false if the lease was lost.
    async fn deaths(&self, begun: &Begun, m: &mut Maintained) -> Result<bool, RegistryError> {
        let inner = &*self.inner;
        let p = &inner.params;
        let (mut silent, mut overdue) = (Vec::new(), Vec::new());
        for phase in ["silent", "overdue"] {
            let (mut after_beat, mut after_id) = (i64::MIN, 0i64);
            let mut left = p.batch_rows;
            while left > 0 {
                let step = DEATH_STEP.min(left);
                let s: DeathStep = self
                    .call(
                        DEATHS,
                        &[
                            &inner.id,
                            &inner.replica,
                            &begun.now,
                            &phase,
                            &begun.brake,
                            &after_beat,
                            &after_id,
                            &count(step),
                            &p.timeout,
                            &p.grace,
                            &p.suspect_grace,
                        ],
                        |row| parse("sweep deaths", row),
                    )
                    .await?;
                m.steps += 1;
                if s.lost_lease {
                    return Ok(false);
                }
                for d in s.died {
                    if d.1 == "missed_heartbeats" {
                        silent.push(d);
                    } else {
                        overdue.push(d);
                    }
                }
                for e in &s.events {
                    m.released
                        .push((e.repo.clone(), e.number, e.delivery.clone()));
                    m.events.push(e.event().map_err(Failure::into_registry)?);
                }
                m.released_count += s.events.len() as u64;
                m.suspected.extend(s.suspected);
                m.held |= s.held;
                m.dead_targets.extend(s.targets);
                (after_beat, after_id) = (s.last_beat, s.last_id);
                left -= s.scanned.min(left);
                if s.scanned < step {
                    break;
                }
            }
        }
        silent.sort_by_key(|d| d.0);
        overdue.sort_by_key(|d| d.0);
        m.suspected.sort_unstable();
        m.died = silent;
        m.died.extend(overdue);
        Ok(true)
    }

    /// The waiting room's steps, when it is on: expiry past `max_wait` (steps of
    /// [`MAINTENANCE_STEP`]), then the catch-up promotion, one target per transaction (each
    /// takes its target's row first, as an admit does), until nothing fits or the sweep's bound
    /// is reached.
    async fn waiting_room(&self, now: i64, m: &mut Maintained) -> Result<(), RegistryError> {
        let inner = &*self.inner;
        let p = &inner.params;
        if p.max_waiting == 0 {
            return Ok(());
        }
        let mut left = p.batch_rows;
        while left > 0 {
            let step = MAINTENANCE_STEP.min(left);
            let s: ExpireWaitingStep = self
                .call(
                    EXPIRE_WAITING,
                    &[&inner.id, &inner.replica, &now, &p.max_wait, &count(step)],
                    |row| parse("sweep expire waiting", row),
                )
                .await?;
            m.steps += 1;
            m.expired_waiting.extend(
                s.expired
                    .into_iter()
                    .map(|(repo, number, delivery, at, _)| (repo, number, delivery, at)),
            );
            left -= step;
            if !s.more {
                break;
            }
        }
        let mut left = p.batch_rows;
        while left > 0 {
            let s: PromoteStep = self
                .call(PROMOTE, &[&inner.id, &inner.replica, &now], |row| {
                    parse("sweep promote", row)
                })
                .await?;
            m.steps += 1;
            m.promoted += s.promoted;
            left -= 1;
            if !s.more {
                break;
            }
        }
        Ok(())
    }

    /// The release steps: bare claims past the timeout, dead workers' claims to the outbox.
    async fn releases(&self, now: i64, m: &mut Maintained) -> Result<(), RegistryError> {
        let inner = &*self.inner;
        let p = &inner.params;
        let mut left = p.batch_rows;
        while left > 0 {
            let step = MAINTENANCE_STEP.min(left);
            let s: ReleaseStep = self
                .call(
                    RELEASE,
                    &[&inner.id, &inner.replica, &now, &p.timeout, &count(step)],
                    |row| parse("sweep release", row),
                )
                .await?;
            m.steps += 1;
            m.released_count += s.count;
            m.released.extend(s.released);
            left -= step;
            if !s.more {
                break;
            }
        }
        Ok(())
    }

    /// The stuck-delivery steps, and the in-flight gauge.
    async fn stuck(&self, now: i64, m: &mut Maintained) -> Result<(), RegistryError> {
        let inner = &*self.inner;
        let p = &inner.params;
        let mut left = p.batch_rows;
        while left > 0 {
            let step = MAINTENANCE_STEP.min(left);
            let s: StuckStep = self
                .call(
                    STUCK,
                    &[
                        &inner.id,
                        &inner.replica,
                        &now,
                        &p.timeout,
                        &p.max_in_flight,
                        &p.drain_deadline,
                        &count(step),
                    ],
                    |row| parse("sweep stuck", row),
                )
                .await?;
            m.steps += 1;
            let full = s.count >= step;
            m.took_stuck(s);
            left -= step;
            if !full {
                break;
            }
        }
        Ok(())
    }

    /// The retention steps: expiry, eviction, purge.
    /// One bounded step deleting outbox rows nobody acknowledged within `claim_retention` of
    /// their release (at most [`EXPIRE_RELEASED_BATCH`]; the next sweep continues), each logged.
    async fn expire_released(&self, now: i64, m: &mut Maintained) -> Result<(), RegistryError> {
        let inner = &*self.inner;
        let p = &inner.params;
        let s: ExpireStep = self
            .call(
                EXPIRE_RELEASED,
                &[&inner.id, &now, &p.retention, &count(EXPIRE_RELEASED_BATCH)],
                |row| parse("expire released", row),
            )
            .await?;
        m.steps += 1;
        for (repo, number, delivery) in &s.expired {
            tracing::warn!(
                target_repo = %repo,
                target_number = number,
                delivery = %delivery,
                "released delivery never acknowledged within claim_retention; expired"
            );
        }
        m.released_expired += s.expired.len() as u64;
        Ok(())
    }

    async fn retention(&self, now: i64, m: &mut Maintained) -> Result<(), RegistryError> {
        let inner = &*self.inner;
        let p = &inner.params;
        let mut left = p.batch_rows;
        while left > 0 {
            let step = MAINTENANCE_STEP.min(left);
            let s: RetainStep = self
                .call(
                    RETAIN,
                    &[
                        &inner.id,
                        &inner.replica,
                        &now,
                        &p.retention,
                        &p.max_retained,
                        &p.dead_retention,
                        &count(step),
                    ],
                    |row| parse("sweep retention", row),
                )
                .await?;
            m.steps += 1;
            m.expired += s.expired;
            m.evicted += s.evicted;
            m.purged += s.purged;
            if s.retained.is_some() {
                m.retained = s.retained;
            }
            left -= step;
            let full = |n: u64| n >= step as u64;
            if !(full(s.expired) || full(s.evicted) || full(s.purged)) {
                break;
            }
        }
        Ok(())
    }

    /// The versioning steps: the worker rows changed since the last snapshot.
    async fn stamp(&self, m: &mut Maintained) -> Result<(), RegistryError> {
        let inner = &*self.inner;
        // Bounded like the rest, by the rows a sweep may touch of one kind; rows changed again
        // meanwhile are versioned by the next sweep.
        let mut left = inner.params.batch_rows.max(MAINTENANCE_STEP);
        while left > 0 {
            let step = MAINTENANCE_STEP.min(left);
            let n: i32 = self
                .call(STAMP, &[&inner.id, &inner.replica, &count(step)], |row| {
                    col(row, "n")
                })
                .await?;
            m.steps += 1;
            left -= step;
            if usize::try_from(n).unwrap_or(0) < step {
                break;
            }
        }
        Ok(())
    }

    /// The in-flight gauge, the publish and the collect, in one transaction; whether stuck
    /// deliveries or changed rows were left for more steps (with a stuck delivery it does
    /// nothing: the stuck steps may lock the capacity row, so they and then the publish run in
    /// transactions of their own).
    async fn finish(
        &self,
        begun: &Begun,
        m: &mut Maintained,
    ) -> Result<(bool, bool), RegistryError> {
        let inner = &*self.inner;
        let p = &inner.params;
        let brake = m.held || !m.suspected.is_empty();
        let known = i64::try_from(inner.snapshot.version()).unwrap_or(i64::MAX);
        let f: Finished = {
            let (rel_repo, rel_number, rel_delivery, dead_repo, dead_number) = m.publishable();
            self.call(
                FINISH,
                &[
                    &inner.id,
                    &inner.replica,
                    &begun.now,
                    &brake,
                    &m.retained,
                    &p.timeout,
                    &p.max_in_flight,
                    &p.drain_deadline,
                    &PURGE_LOG_VERSIONS,
                    &count(MAINTENANCE_STEP),
                    &p.ack_timeout,
                    &p.batch,
                    &known,
                    &rel_repo,
                    &rel_number,
                    &rel_delivery,
                    &dead_repo,
                    &dead_number,
                ],
                |row| parse("sweep finish", row),
            )
            .await?
        };
        m.steps += 1;
        let (stuck, published, collected) = match f {
            // The stuck steps run in their own transactions, then the publish in its own.
            Finished::StuckDue { .. } => return Ok((true, false)),
            Finished::Done(done) => {
                let Done {
                    stuck,
                    published,
                    collected,
                } = *done;
                (stuck, published, collected)
            }
        };
        let more_stuck = stuck.count >= MAINTENANCE_STEP;
        m.took_stuck(stuck);
        m.published = true;
        let (now, events) = self.take_collected(collected)?;
        m.events.extend(events);
        m.collected = Some(now);
        Ok((more_stuck, published.stamped >= MAINTENANCE_STEP))
    }

    /// The new snapshot version (with a last versioning step) and the TargetReleased events
    /// (sent once: a second publish of the sweep sends none); how many rows it versioned.
    async fn publish(&self, begun: &Begun, m: &mut Maintained) -> Result<usize, RegistryError> {
        let inner = &*self.inner;
        let brake = m.held || !m.suspected.is_empty();
        let (rel_repo, rel_number, rel_delivery, dead_repo, dead_number) = m.publishable();
        let out: Published = self
            .call(
                PUBLISH,
                &[
                    &inner.id,
                    &inner.replica,
                    &begun.now,
                    &brake,
                    &m.in_flight,
                    &m.retained,
                    &PURGE_LOG_VERSIONS,
                    &count(MAINTENANCE_STEP),
                    &rel_repo,
                    &rel_number,
                    &rel_delivery,
                    &dead_repo,
                    &dead_number,
                ],
                |row| parse("sweep publish", row),
            )
            .await?;
        m.steps += 1;
        m.published = true;
        Ok(out.stamped)
    }
}
