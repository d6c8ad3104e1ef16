//! The summary: throughput, latency, outcomes, chaos and recovery, the registry's and the
//! containers' counts, capacity, the audit, the status tables and the shutdown, printed; and
//! the [`Report`] whose [`passed`](Report::passed) is the run's verdict.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use worker_registry::{
    DeadReason, DynRegistry, Status, StatusSnapshot, WorkerInfo, WorkerRegistry,
};

use super::audit::{Audited, Bodies, NotCompleted};
use super::client::Outcome;
use super::clients::Traffic;
use super::killer::Kill;
use super::processes::Overlap;
use super::reconcile::Resent;
use super::sampler::{Probe, Samples};
use super::settle::{Settled, SETTLE_CAP};
use super::shutdown::ShutDown;
use super::Sim;
use crate::containers::Audit;
use crate::server::{Killed, ShutdownReport};

/// Everything the phases found.
pub(super) struct Findings<'s> {
    pub(super) sim: &'s Sim,
    pub(super) traffic: Traffic,
    pub(super) killed: Option<Kill>,
    /// The registry's snapshot when the traffic ended.
    pub(super) at_peak: Arc<StatusSnapshot>,
    pub(super) resent: Resent,
    pub(super) settled: Settled,
    pub(super) audited: Audited,
    pub(super) counts: Counts,
    pub(super) samples: Samples,
    pub(super) probe: Probe,
    pub(super) shutdown: ShutDown,
    /// With real workers: what their commands' own records say.
    pub(super) overlap: Option<Overlap>,
}

/// The registry's and the containers' counts once the router settled, before shutdown.
pub(super) struct Counts {
    totals: Totals,
    /// The waiting room's size at the end, as the registry holds it: one live handle's
    /// snapshot, taken by a sweep that ran after the settle phase (not a sum of the replicas'
    /// gauges, which counts the registry once per replica, the killed one's frozen value included).
    room: usize,
    /// Released events re-dispatched, by every replica.
    redispatched: u64,
    ledger: Audit,
    /// Deliveries queued behind a full mailbox, in total; and still queued.
    overflowed: u64,
    overflow_queued: u64,
}

/// How long [`Counts::take`] waits for a sweep to publish a snapshot, in sweep intervals.
const FINAL_SWEEP_WAIT: u32 = 20;

impl Counts {
    /// Taken now: the live replicas' registry counters (and the killed one's, from when it was
    /// killed), the room's size from one live handle once its sweeper has swept again, and the
    /// container ledger.
    pub(super) async fn take(sim: &Sim, killed: Option<&Kill>) -> Self {
        let mut totals = Totals::default();
        let live = sim.live_apps();
        for a in &live {
            totals.add(&a.registry().stats());
        }
        if let Some((_, _, stats)) = killed {
            totals.add(stats);
        }
        let reader = live.first().unwrap_or_else(|| sim.app()).registry().clone();
        Self {
            totals,
            room: room_after_a_sweep(&reader).await,
            redispatched: sim
                .apps
                .iter()
                .map(|a| a.redispatcher().redispatched())
                .sum(),
            ledger: sim.app().containers().ledger().audit(),
            // One platform per process, shared by its replicas.
            overflowed: sim.app().containers().overflow_metrics().overflowed(),
            overflow_queued: sim.app().containers().overflow_metrics().queued(),
        }
    }
}

/// The room's size in the first snapshot `registry`'s sweeper publishes from now (its sweeper
/// hands over whatever that sweep promotes; sweeping here would take those deliveries from it),
/// or in the current one if none comes within [`FINAL_SWEEP_WAIT`] sweep intervals.
async fn room_after_a_sweep(registry: &DynRegistry) -> usize {
    let before = registry.status().version;
    let every = registry
        .config()
        .sweep_interval()
        .max(Duration::from_millis(1));
    for _ in 0..FINAL_SWEEP_WAIT * 4 {
        let now = registry.status();
        if now.version > before {
            return now.waiting;
        }
        tokio::time::sleep(every / 4).await;
    }
    registry.status().waiting
}

/// Counters summed over the replicas (each handle counts what it decided). The gauges are not
/// summed: every replica's is the one registry's.
#[derive(Default, Clone, Copy)]
struct Totals {
    admitted_new: u64,
    exited: u64,
    died: u64,
    heartbeats: u64,
    sweeps: u64,
    parked: u64,
    promoted: u64,
    waiting_expired: u64,
}

impl Totals {
    fn add(&mut self, s: &worker_registry::Stats) {
        self.admitted_new += s.admitted_new;
        self.exited += s.deaths_exited + s.deaths_deregistered;
        self.died += s.deaths_missed_heartbeats;
        self.heartbeats += s.heartbeats;
        self.sweeps += s.sweeps;
        self.parked += s.parked;
        self.promoted += s.promoted;
        self.waiting_expired += s.waiting_expired;
    }
}

/// Parked deliveries the counters account for (promoted, dropped or still waiting) beyond those
/// they saw parked.
fn uncounted_parkings(t: &Totals, room: usize) -> u64 {
    (t.promoted + t.waiting_expired + room as u64).saturating_sub(t.parked)
}

/// Prints the summary on stdout; the run's [`Report`].
pub(super) fn print(mut f: Findings<'_>) -> Report {
    let mut out = String::new();
    let _ = writeln!(out, "\n== webhook-router --simulate: summary ==");
    replicas(&mut out, &f);
    traffic(&mut out, &f);
    recovery(&mut out, &f);
    capacity(&mut out, &f);
    f.samples.max_live = f.samples.max_live.max(f.samples.max_snapshot as u64);
    let _ = writeln!(
        out,
        "audit      {} accepted deliveries redelivered once more: {} duplicate/completed, {} still in flight, {} lost",
        f.audited.accepted, f.audited.completed, f.audited.in_flight, f.audited.lost,
    );
    bodies(&mut out, &f.audited.bodies);
    overlap(&mut out, f.overlap.as_ref());
    settle(&mut out, &f);
    status_table(&mut out, "at the end of the traffic", &f.at_peak, 12, 4);
    status_table(&mut out, "final", &f.settled.status, usize::MAX, 4);
    shutdown(&mut out, &f.shutdown);
    print!("{out}");
    let crashes = f.sim.tally.crashes.load(Ordering::Relaxed);
    Report {
        accepted: f.audited.accepted,
        completed: f.audited.completed,
        in_flight: f.audited.in_flight,
        lost: f.audited.lost,
        outage_lost: 0,
        never_placed: f.resent.gave_up,
        unfinished: f.shutdown.unfinished.len(),
        containers: f.counts.ledger,
        samples: f.samples.taken,
        max_live: f.samples.max_live,
        capacity: f.sim.app().registry().config().max_workers() as u64,
        killed: f.killed.map(|(at, k, _)| (at, k)),
        died: f.counts.totals.died,
        parked: f.counts.totals.parked,
        promoted: f.counts.totals.promoted,
        waiting_expired: f.counts.totals.waiting_expired,
        waiting: f.counts.room,
        redispatched: f.counts.redispatched,
        crashes,
        settle_cut: f.settled.cut,
        not_completed: f.audited.not_completed,
        bodies: f.audited.bodies,
        overlap: f.overlap,
    }
}

/// What the real workers' commands recorded.
fn overlap(out: &mut String, o: Option<&Overlap>) {
    let Some(o) = o else {
        return;
    };
    let _ = writeln!(
        out,
        "processes  {} event commands ran in real webhook-worker processes ({} killed mid-run); at most {} at once on one pull request, by their own clocks{}; {} read a body other than the one sent",
        o.commands,
        o.killed,
        o.max_at_once,
        o.worst.as_ref().map_or(String::new(), |w| format!(" (TWO OR MORE: {w})")),
        o.wrong_body,
    );
}

/// The bodies the completed deliveries' workers ran on, against those sent.
fn bodies(out: &mut String, b: &Bodies) {
    let _ = writeln!(
        out,
        "bodies     {} completed (pull request, delivery) pairs ran on the body sent ({} of them after a release or promotion), {} on other or no bytes; {} handled without a worker",
        b.matched,
        b.handed_on,
        b.mismatched.len(),
        b.unrun,
    );
    for m in b.mismatched.iter().take(20) {
        let _ = writeln!(out, "  wrong body: {m}");
    }
}

/// Whether the settle phase settled or was cut at its cap, and every accepted delivery the audit
/// did not find completed, with what the server holds for it.
fn settle(out: &mut String, f: &Findings<'_>) {
    let _ = writeln!(
        out,
        "settle     {}",
        match &f.settled.cut {
            None => "settled: nothing left unfinished, nothing kept to re-dispatch".to_owned(),
            Some(left) => format!(
                "NOT settled within its {:.0} s cap: {} unfinished claims or unacknowledged released deliveries on the server, {} kept to re-dispatch",
                SETTLE_CAP.as_secs_f64(),
                match left {
                    Ok(n) => n.to_string(),
                    Err(e) => format!("(unread: {e})"),
                },
                f.settled.pending,
            ),
        }
    );
    for n in &f.audited.not_completed {
        let _ = writeln!(
            out,
            "  {} {} ({}): answered {}; the registry holds {}",
            if n.lost { "lost     " } else { "in flight" },
            n.delivery,
            n.event,
            n.answer,
            n.registry,
        );
    }
}

/// The replicas, and the one killed.
fn replicas(out: &mut String, f: &Findings<'_>) {
    let (plan, replicas) = (&f.sim.plan, f.sim.replicas());
    if replicas < 2 {
        return;
    }
    let _ = writeln!(
        out,
        "replicas   {replicas} routers on {} (registry {:?}), one process, one container platform; each delivery and its redeliveries sent to different replicas",
        plan.registry, plan.registry_name,
    );
    match &f.killed {
        Some((at, k, _)) => {
            let _ = writeln!(
                out,
                "killed     replica {replicas} at {:.2} s: its HTTP server, sweeper and {} running containers stopped abruptly, nothing acknowledged ({} deferred released events dropped)",
                at.as_secs_f64(),
                k.containers,
                k.pending,
            );
        }
        None => {
            let _ = writeln!(out, "killed     none (the traffic ended first)");
        }
    }
}

/// Throughput, latency and how the deliveries were answered.
fn traffic(out: &mut String, f: &Findings<'_>) {
    let (sim, plan, tally) = (f.sim, &f.sim.plan, &f.sim.tally);
    // Relaxed: read after the clients are joined.
    let sent = tally.sent.load(Ordering::Relaxed);
    let sent_ones = &sim.deliveries[..sent.min(sim.deliveries.len())];
    let redeliveries = sent_ones.iter().filter(|d| d.redelivery).count();
    let with_target = sent_ones
        .iter()
        .filter(|d| d.has_target && !d.redelivery)
        .count();
    let (hist, took) = (&f.traffic.latency, f.traffic.took);
    let ms = |us: u64| us as f64 / 1000.0;
    let _ = writeln!(
        out,
        "traffic    {sent} deliveries in {:.2} s = {:.0} req/s ({} clients, {}); {redeliveries} redeliveries ({:.1}%), {with_target} distinct PR deliveries",
        took.as_secs_f64(),
        sent as f64 / took.as_secs_f64().max(1e-9),
        plan.clients,
        if plan.rate == 0 { "unpaced".to_owned() } else { format!("paced at {}/s", plan.rate) },
        100.0 * redeliveries as f64 / sent.max(1) as f64,
    );
    let _ = writeln!(
        out,
        "latency    p50 {:.2} ms  p90 {:.2} ms  p99 {:.2} ms  max {:.2} ms  (client-observed POST /webhook over loopback, {} samples)",
        ms(hist.value_at_quantile(0.50)),
        ms(hist.value_at_quantile(0.90)),
        ms(hist.value_at_quantile(0.99)),
        ms(hist.max()),
        hist.len(),
    );
    let _ = writeln!(
        out,
        "outcomes   202 assigned {} (new worker {}, existing worker {}) | 200 duplicate {} | 202 ignored {} | 202 waiting {} | 503 capacity {} | 503 draining {} | 503 waiting room full {} | 503 overflow full {} | 503 unavailable {} | 4xx {} | failed {}",
        tally.get(Outcome::AssignedNew) + tally.get(Outcome::AssignedExisting),
        tally.get(Outcome::AssignedNew),
        tally.get(Outcome::AssignedExisting),
        tally.get(Outcome::Duplicate),
        tally.get(Outcome::Ignored),
        tally.get(Outcome::Waiting),
        tally.get(Outcome::Capacity),
        tally.get(Outcome::Draining),
        tally.get(Outcome::RoomFull),
        tally.get(Outcome::OverflowFull),
        tally.get(Outcome::Unavailable),
        tally.get(Outcome::Refused),
        tally.get(Outcome::Failed),
    );
}

/// The chaos, and how the router recovered from it.
fn recovery(out: &mut String, f: &Findings<'_>) {
    let (tally, totals) = (&f.sim.tally, &f.counts.totals);
    let _ = writeln!(
        out,
        "chaos      {} containers crashed (POST /debug/workers/{{id}}/crash), {} drained (POST /workers/{{id}}/drain)",
        tally.crashes.load(Ordering::Relaxed),
        tally.drains.load(Ordering::Relaxed),
    );
    let _ = writeln!(
        out,
        "recovery   {} workers declared dead by the sweep, {} released events re-dispatched; {} 503s and cut-off requests resent by the simulated reconciler, {} given up",
        totals.died, f.counts.redispatched, f.resent.retried, f.resent.gave_up,
    );
    let _ = writeln!(
        out,
        "registry   {} workers created, {} exited cleanly, {} died of missed heartbeats; {} heartbeats; {} sweeps; settled in {:.2} s",
        totals.admitted_new,
        totals.exited,
        totals.died,
        totals.heartbeats,
        totals.sweeps,
        f.settled.took.as_secs_f64(),
    );
    let _ = writeln!(
        out,
        "waiting    {} deliveries parked in the waiting room, {} promoted onto a worker, {} dropped after max_wait (the replicas' counters); at most {} waiting at once (snapshots sampled), {} still waiting (the registry's snapshot after a final sweep){}",
        totals.parked,
        totals.promoted,
        totals.waiting_expired,
        f.samples.max_waiting,
        f.counts.room,
        match uncounted_parkings(totals, f.counts.room) {
            0 => String::new(),
            n => format!(
                "; {n} more promoted, dropped or waiting than parked: parkings no live replica counted ({})",
                if f.killed.is_some() {
                    "the killed replica's calls cut off by the kill, or replies lost"
                } else {
                    "replies lost"
                }
            ),
        },
    );
    let _ = writeln!(
        out,
        "overflow   {} deliveries queued in order behind a worker's full mailbox (--overflow {}), {} still queued",
        f.counts.overflowed,
        f.sim.app().options().overflow,
        f.counts.overflow_queued,
    );
}

/// What became of start claims, if anything but a plain win: lost to a racing path (handed over),
/// given up (the worker gone meanwhile), or won and then refused by the platform (a bug).
fn starts(ledger: &Audit) -> String {
    let mut parts = Vec::new();
    if ledger.lost_claims > 0 {
        parts.push(format!(
            "{} start claims lost to a racing path, their events handed over",
            ledger.lost_claims
        ));
    }
    if ledger.abandoned_claims > 0 {
        parts.push(format!(
            "{} won for a worker gone meanwhile",
            ledger.abandoned_claims
        ));
    }
    if ledger.refused > 0 {
        parts.push(format!(
            "{} starts refused after a won claim (a bug)",
            ledger.refused
        ));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join(", "))
    }
}

/// Containers per worker and per delivery, and the live count against the capacity.
fn capacity(out: &mut String, f: &Findings<'_>) {
    let ledger = &f.counts.ledger;
    let _ = writeln!(
        out,
        "containers {} started for {} worker ids: at most {} per worker id{}; at most {} per delivery, {} deliveries started more than 1 + their releases; at most {} container tasks at once (an exiting one ends just after the registry frees its slot)",
        ledger.started,
        ledger.workers,
        ledger.max_per_worker,
        starts(ledger),
        ledger.max_per_delivery,
        ledger.unexplained.len(),
        ledger.max_running,
    );
    let limit = f.sim.app().registry().config().max_workers() as u64;
    let _ = writeln!(
        out,
        "capacity   {} samples of {} ({} failed): at most {} live of {limit}; snapshots: at most {}",
        f.samples.taken,
        f.probe.describe(),
        f.samples.failed,
        f.samples.max_live,
        f.samples.max_snapshot,
    );
}

/// How the replicas shut down.
fn shutdown(out: &mut String, s: &ShutDown) {
    let sum = |f: fn(&ShutdownReport) -> u64| s.reports.iter().map(f).sum::<u64>();
    let _ = writeln!(
        out,
        "shutdown   in {:.0} ms{}: {} busy workers drained, {} idle ones exited at once; {} deliveries completed meanwhile; {} workers stopped at the deadline; {} accepted deliveries not completed{}",
        s.took.as_secs_f64() * 1000.0,
        if s.reports.len() > 1 { format!(" ({} replicas)", s.reports.len()) } else { String::new() },
        sum(|r| r.drained.draining as u64),
        sum(|r| r.drained.exited as u64),
        sum(|r| r.completed),
        sum(|r| r.stopped_at_deadline as u64),
        s.unfinished.len(),
        if s.unfinished.is_empty() {
            String::new()
        } else {
            format!(" ({})", s.unfinished.join(" "))
        },
    );
}

/// What a simulation found (the summary prints it all).
#[derive(Debug, Clone)]
pub struct Report {
    /// Accepted deliveries (answered 202 or 200 duplicate at least once).
    pub accepted: usize,
    /// Of those, completed when audited.
    pub completed: usize,
    /// Of those, still in flight when audited (not lost, not done).
    pub in_flight: usize,
    /// Of those, neither completed nor in flight: lost.
    pub lost: usize,
    /// Deliveries of the outage phase the router did not know once the reconciler had stopped
    /// chasing (a redelivery by hand was not a duplicate); 1 if the phase could not run.
    pub outage_lost: usize,
    /// Deliveries refused (503) or cut off that the simulated reconciler's resends never placed
    /// (it stops at a cap only a hang reaches).
    pub never_placed: usize,
    /// Accepted deliveries the shutdown reported not completed.
    pub unfinished: usize,
    /// Container starts.
    pub containers: Audit,
    /// Samples of the registry's live count.
    pub samples: u64,
    /// The most live workers any sample saw (the snapshots' included).
    pub max_live: u64,
    /// The registry's capacity.
    pub capacity: u64,
    /// When a replica was killed, and what that stopped.
    pub killed: Option<(Duration, Killed)>,
    /// Workers declared dead by the sweeps.
    pub died: u64,
    /// Deliveries parked in the waiting room, by the replicas' counters (a replica killed
    /// mid-call may have parked some it never counted).
    pub parked: u64,
    /// Parked deliveries promoted onto a worker, by the replicas' counters.
    pub promoted: u64,
    /// Parked deliveries dropped after `max_wait`, by the replicas' counters.
    pub waiting_expired: u64,
    /// Deliveries still waiting at the end: the registry's snapshot after a final sweep.
    pub waiting: usize,
    /// Released events re-dispatched.
    pub redispatched: u64,
    /// Containers crashed by the chaos.
    pub crashes: u64,
    /// `Some` if the settle phase ended at its cap ([`SETTLE_CAP`]) rather than settled: what the
    /// server still held unfinished then
    /// ([`Audit::unfinished`](worker_registry::Audit::unfinished); 0 in memory), or why it could not
    /// be read.
    pub settle_cut: Option<Result<u64, String>>,
    /// The accepted deliveries the audit did not find completed, each explained.
    pub not_completed: Vec<NotCompleted>,
    /// The bodies the completed deliveries' workers ran on, against those sent.
    pub bodies: Bodies,
    /// With real workers: their commands' overlap per pull request and bodies.
    pub overlap: Option<Overlap>,
}

impl Report {
    /// Whether the audit passed: nothing lost or left unfinished, no worker with two containers
    /// and no delivery that started more than its releases explain, capacity never exceeded, and
    /// (on a registry that keeps payloads) every completed delivery run on the body sent.
    pub fn passed(&self) -> bool {
        self.lost == 0
            && self.outage_lost == 0
            && self.never_placed == 0
            && self.unfinished == 0
            && self.containers.max_per_worker <= 1
            && self.containers.refused == 0
            && self.containers.unexplained.is_empty()
            && self.max_live <= self.capacity
            && self.bodies.mismatched.is_empty()
            && self
                .overlap
                .as_ref()
                .is_none_or(|o| o.max_at_once <= 1 && o.wrong_body == 0)
    }
}

/// The final status table: every live worker and the most recent dead ones.
fn status_table(
    out: &mut String,
    when: &str,
    s: &StatusSnapshot,
    show_live: usize,
    show_dead: usize,
) {
    let died_of = |r: DeadReason| {
        s.workers
            .iter()
            .filter(|w| w.status == Status::Dead(r))
            .count()
    };
    let _ = writeln!(
        out,
        "status     {when}, snapshot #{}: {} active, {} draining, {} dead ({} exited, {} missed heartbeats); capacity {}/{}; claims {} in flight, {} retained; {} waiting",
        s.version,
        s.counts.active,
        s.counts.draining,
        s.counts.dead,
        died_of(DeadReason::Exited) + died_of(DeadReason::Deregistered),
        died_of(DeadReason::MissedHeartbeats),
        s.capacity.used,
        s.capacity.limit,
        s.claims.in_flight,
        s.claims.retained,
        s.waiting,
    );
    let mut live: Vec<&WorkerInfo> = s.workers.iter().filter(|w| w.status.is_alive()).collect();
    let mut dead: Vec<&WorkerInfo> = s.workers.iter().filter(|w| !w.status.is_alive()).collect();
    live.sort_by_key(|w| w.id);
    dead.sort_by_key(|w| std::cmp::Reverse(w.id));
    let _ = writeln!(
        out,
        "  {:>14}  {:<26} {:<26} {:<8} {:>10}  {:>20} {:>6}",
        "id", "target", "status", "activity", "last beat", "token", "events"
    );
    for w in live
        .iter()
        .take(show_live)
        .chain(dead.iter().take(show_dead))
    {
        let status = match w.status {
            Status::Dead(reason) => format!("dead ({reason})"),
            other => other.as_str().to_owned(),
        };
        let _ = writeln!(
            out,
            "  {:>14}  {:<26} {:<26} {:<8} {:>7} ms  {:>20} {:>6}",
            w.id.get(),
            w.target
                .as_ref()
                .map_or("-".to_owned(), ToString::to_string),
            status,
            w.activity.as_str(),
            w.heartbeat_age.as_millis(),
            w.token.get(),
            w.token.seq(),
        );
    }
    let hidden_live = live.len().saturating_sub(show_live);
    let hidden_dead = dead.len().saturating_sub(show_dead);
    if hidden_live + hidden_dead > 0 {
        let _ = writeln!(
            out,
            "  ... and {hidden_live} more live, {hidden_dead} more dead workers"
        );
    }
}
