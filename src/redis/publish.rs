//! The snapshot, published and fetched in bounded steps that cost what changed.
//!
//! Every script that writes a worker's hash adds its id to `{n}:dirty`. After its maintenance
//! steps the lease holder runs `publish` steps (at most [`PUBLISH_STEP`] workers each) that move
//! dirty workers' lines into `{n}:snap` and the change log `{n}:changes`, the last one adding the
//! version's header; the version moves once per sweep of the lease holder (the contract's
//! reference, the in-memory registry, publishes one per sweep: the header's time and the ages in
//! it change every sweep), and a sweep where no worker changed appends only the header, a few
//! dozen bytes.
//!
//! Every handle (at connect and after each sweep) asks `changes` for the entries after its
//! version, [`CHANGES_PAGE`] at a time, and applies each complete version to its cached copy
//! ([`crate::remote::snapshot`]). A handle the log no longer reaches (it keeps
//! [`CHANGE_LOG_VERSIONS`] versions), or a new one, rebuilds from `{n}:snap` in pages of
//! [`SNAP_PAGE`] (`HSCAN`: every line present throughout is returned, at most a few twice), then
//! applies the changes after the version it started from: lines fresher than that version are
//! re-applied by the changes that wrote them, so the result is exactly the latest version.

use std::time::Duration;

use super::codec::{self, bad, Fields, Reply};
use super::scripts::SCRIPTS;
use super::RedisRegistry;
use crate::api::error::RegistryError;
use crate::api::snapshot::ClaimCounts;
use crate::remote::snapshot::Change;

/// Workers one publish step moves into the change log.
pub(crate) const PUBLISH_STEP: usize = 64;

/// Versions the change log keeps (a handle further behind rebuilds).
pub(crate) const CHANGE_LOG_VERSIONS: usize = 1_000;

/// Change-log entries one `changes` call returns (each holds at most [`PUBLISH_STEP`] lines, so
/// one answer stays around a hundred kilobytes).
pub(crate) const CHANGES_PAGE: usize = 4;

/// Worker lines one rebuild page asks for (`HSCAN ... COUNT`).
pub(crate) const SNAP_PAGE: usize = 256;

/// The most calls one refresh makes before it gives up (the log moving faster than this handle
/// reads it): the copy stays at the last complete version it reached.
const MAX_REFRESH_CALLS: usize = 100_000;

/// A version's header: `version now brake in_flight retained`.
struct Head {
    version: u64,
    now: u64,
    brake: bool,
    claims: ClaimCounts,
}

fn head(text: &str) -> Result<Head, RegistryError> {
    let f: Vec<&str> = text.split('\t').collect();
    let num = |s: &str, what: &str| {
        s.parse::<u64>()
            .map_err(|_| bad(format!("snapshot header {what}: {s:?}")))
    };
    let [version, now, brake, in_flight, retained] = f[..] else {
        return Err(bad(format!("snapshot header with {} fields", f.len())));
    };
    let claims = ClaimCounts {
        in_flight: num(in_flight, "in flight")? as usize,
        retained: num(retained, "retained")? as usize,
    };
    Ok(Head {
        version: num(version, "version")?,
        now: num(now, "time")?,
        brake: brake == "1",
        claims,
    })
}

impl RedisRegistry {
    /// Publishes this sweep's version (lease holder): publish steps until `dirty` is empty.
    pub(crate) async fn publish(
        &self,
        at: u64,
        engaged: bool,
        in_flight_adj: u64,
    ) -> Result<(), RegistryError> {
        loop {
            let mut inv = self.prepare(&SCRIPTS.publish);
            inv.arg(at)
                .arg(u8::from(engaged))
                .arg(in_flight_adj)
                .arg(self.inner.snapshot.version())
                .arg(PUBLISH_STEP)
                .arg(CHANGE_LOG_VERSIONS);
            let v = self.invoke(&inv).await?;
            if Fields::of(&v)?.int("done")? == 1 {
                return Ok(());
            }
        }
    }

    /// Brings this handle's snapshot up to the latest published version.
    pub(crate) async fn refresh_snapshot(&self) -> Result<(), RegistryError> {
        let _one = self.inner.refresh.lock().await;
        let cache = &self.inner.snapshot;
        let mut after = String::new();
        let (mut lines, mut removals): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
        for _ in 0..MAX_REFRESH_CALLS {
            let mut inv = self.prepare(&SCRIPTS.changes);
            inv.arg(cache.version()).arg(&after).arg(CHANGES_PAGE);
            let v = self.invoke(&inv).await?;
            let f = Fields::of(&v)?;
            let now = f.uint("now")?;
            match &*f.text("kind")? {
                "same" => return Ok(()),
                "behind" => {
                    let text = f.text("head")?;
                    if text.is_empty() || head(&text)?.version <= cache.version() {
                        return Ok(());
                    }
                    self.rebuild(&text, now).await?;
                    after.clear();
                    lines.clear();
                    removals.clear();
                }
                "delta" => {
                    let mut entries = f.array("entries")?;
                    let n = entries.remaining();
                    while entries.remaining() > 0 {
                        let mut entry = entries.array()?;
                        after = entry.text()?.into_owned();
                        let mut fields = entry.array()?;
                        while fields.remaining() > 0 {
                            let name = fields.text()?;
                            let value = fields.text()?;
                            match &*name {
                                "u" => lines.extend(
                                    value
                                        .split('\n')
                                        .filter(|l| !l.is_empty())
                                        .map(str::to_owned),
                                ),
                                "r" => removals.extend(
                                    value
                                        .split(',')
                                        .filter(|r| !r.is_empty())
                                        .map(str::to_owned),
                                ),
                                "h" => {
                                    let h = head(&value)?;
                                    let change = Change {
                                        version: h.version,
                                        taken_at: codec::wall(h.now),
                                        taken_at_monotonic: Duration::from_millis(h.now),
                                        brake_engaged: h.brake,
                                        claims: h.claims,
                                        waiting: None,
                                        upserts: lines
                                            .drain(..)
                                            .map(|l| codec::decode_worker(&l, h.now))
                                            .collect::<Result<_, _>>()?,
                                        removals: removals
                                            .drain(..)
                                            .map(|r| codec::worker_id(&r))
                                            .collect::<Result<_, _>>()?,
                                    };
                                    let s = cache.advance(change, Duration::from_millis(now));
                                    self.observe_snapshot(&s);
                                }
                                other => return Err(bad(format!("change-log field {other:?}"))),
                            }
                        }
                    }
                    if n < CHANGES_PAGE {
                        return Ok(());
                    }
                }
                other => return Err(bad(format!("changes answer {other:?}"))),
            }
        }
        Ok(())
    }

    /// Replaces this handle's snapshot with the published lines (paged), under header `text`.
    async fn rebuild(&self, text: &str, now: u64) -> Result<(), RegistryError> {
        let mut body = String::from(text);
        let mut cursor = "0".to_owned();
        let mut seen = std::collections::HashSet::new();
        loop {
            let mut inv = self.prepare(&SCRIPTS.snap_page);
            inv.arg(&cursor).arg(SNAP_PAGE);
            let v = self.invoke(&inv).await?;
            let mut r = Reply::of(&v)?;
            cursor = r.text()?.into_owned();
            let mut pairs = r.array()?;
            while pairs.remaining() > 0 {
                let id = pairs.text()?.into_owned();
                let line = pairs.text()?;
                if seen.insert(id) {
                    body.push('\n');
                    body.push_str(&line);
                }
            }
            if cursor == "0" {
                break;
            }
        }
        let snapshot = codec::decode_snapshot(&body, self.inner.config.max_workers())?;
        self.inner
            .snapshot
            .offer(snapshot, Duration::from_millis(now));
        let s = self.inner.snapshot.load();
        self.observe_snapshot(&s);
        Ok(())
    }

    /// Records the gauges a newly cached snapshot carries.
    fn observe_snapshot(&self, s: &crate::StatusSnapshot) {
        let at = crate::clock::millis(s.taken_at_monotonic);
        let c = &self.inner.counters;
        c.observe_live(at, s.capacity.used as u64);
        c.observe_retained(at, s.claims.retained as u64);
    }
}
