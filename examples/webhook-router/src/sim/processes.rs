//! `--simulate` on real processes: each worker a `webhook-worker` process started by the
//! `process` launcher, running an event command that records, in files of a directory of its
//! own, when it started, the digest of the body it read, a tick every 10 ms while it works, and
//! when it ended. A chaos crash is a `SIGKILL` of a real process group.
//!
//! [`SimWorkers::audit`] reads those files back: from the commands' own timestamps (not the
//! registry's view), the largest number of commands ever running on one pull request at the
//! same instant (a killed command counts until its last tick), which must be 1, and the
//! commands whose body was not the one sent.

use crate::launcher::Launcher;
use crate::protocol::ProtocolSettings;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The lease margins of a simulation (its registry declares a worker dead after 300 ms).
pub const SIM_MARGIN: Duration = Duration::from_millis(40);

/// The real workers of a simulation (see the [module documentation](self)).
#[derive(Debug)]
pub struct SimWorkers {
    dir: PathBuf,
    argv: Vec<String>,
}

/// What [`SimWorkers::audit`] found.
#[derive(Debug, Clone, Default)]
pub struct Overlap {
    /// Commands that started.
    pub commands: usize,
    /// Of those, commands that never recorded their end (killed).
    pub killed: usize,
    /// The most commands running on one pull request at the same instant.
    pub max_at_once: usize,
    /// Where that maximum was first seen, when above 1.
    pub worst: Option<String>,
    /// Commands whose body's digest was not the body sent for their delivery.
    pub wrong_body: usize,
}

impl SimWorkers {
    /// Workers running `worker` (the `webhook-worker` binary) whose command works `work` per
    /// event and which leave after `idle` without one; their records go to a fresh directory.
    pub fn new(worker: &Path, work: Duration, idle: Duration) -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!("webhook-router-sim-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let ticks = (work.as_millis() / 10).max(1);
        let d = dir.display();
        let command = format!(
            "f={d}/$$; echo \"$WEBHOOK_TARGET $WEBHOOK_DELIVERY $(date +%s%N)\" > $f.start; \
             sha256sum | cut -c1-64 > $f.digest; i=0; \
             while [ $i -lt {ticks} ]; do date +%s%N >> $f.tick; sleep 0.01; i=$((i+1)); done; \
             date +%s%N > $f.end"
        );
        let argv = vec![
            worker.display().to_string(),
            "--event-command".to_owned(),
            command,
            "--idle-exit".to_owned(),
            format!("{}ms", idle.as_millis().max(1)),
        ];
        Ok(Self { dir, argv })
    }

    /// The protocol settings of the simulation's routers.
    pub fn protocol(&self) -> ProtocolSettings {
        ProtocolSettings {
            key: None,
            kill_margin: SIM_MARGIN,
            timer_slack: SIM_MARGIN,
        }
    }

    /// A process launcher for one replica.
    #[cfg(target_os = "linux")]
    pub fn launcher(&self) -> Result<Arc<dyn Launcher>, String> {
        let l = crate::launcher::process::ProcessLauncher::builder(self.argv.clone())
            .stop_grace(Duration::from_secs(1))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Arc::new(l))
    }

    /// Not on this platform.
    #[cfg(not(target_os = "linux"))]
    pub fn launcher(&self) -> Result<Arc<dyn Launcher>, String> {
        Err("real workers run on Linux only: use --launcher task".into())
    }

    /// Reads the commands' records back; `bodies` maps a delivery id to the digest of the body
    /// sent with it.
    pub fn audit(&self, bodies: &HashMap<String, String>) -> Overlap {
        let mut runs: HashMap<String, Vec<(u128, u128)>> = HashMap::new();
        let mut out = Overlap::default();
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return out;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(pid) = name.strip_suffix(".start") else {
                continue;
            };
            let read = |ext: &str| {
                std::fs::read_to_string(self.dir.join(format!("{pid}.{ext}"))).unwrap_or_default()
            };
            let start = read("start");
            let mut f = start.split_whitespace();
            let (Some(target), Some(delivery), Some(Ok(began))) =
                (f.next(), f.next(), f.next().map(str::parse::<u128>))
            else {
                continue;
            };
            out.commands += 1;
            let last_tick = read("tick")
                .lines()
                .filter_map(|l| l.trim().parse::<u128>().ok())
                .max();
            let ended = match read("end").trim().parse::<u128>() {
                Ok(end) => end,
                Err(_) => {
                    out.killed += 1;
                    last_tick.unwrap_or(began)
                }
            };
            let digest = read("digest");
            let digest = digest.trim();
            // A command killed before it wrote its digest has none to compare.
            if !digest.is_empty() && bodies.get(delivery).is_some_and(|d| d != digest) {
                out.wrong_body += 1;
            }
            runs.entry(target.to_owned())
                .or_default()
                .push((began, ended.max(began)));
        }
        for (target, spans) in runs {
            let (most, at) = most_at_once(spans);
            if most > out.max_at_once {
                out.max_at_once = most;
                out.worst = (most > 1).then(|| format!("{target} at {at} ns"));
            }
        }
        out
    }

    /// Removes the records.
    pub fn clean(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The most spans open at one instant, and the first instant it was reached. A span ending at
/// the instant another starts does not overlap it.
fn most_at_once(spans: Vec<(u128, u128)>) -> (usize, u128) {
    // (instant, +1 start / -1 end), ends first at equal instants.
    let mut edges: Vec<(u128, i8)> = spans
        .into_iter()
        .flat_map(|(s, e)| [(s, 1), (e, -1)])
        .collect();
    edges.sort_unstable();
    let (mut open, mut most, mut at) = (0i64, 0i64, 0);
    for (t, d) in edges {
        open += i64::from(d);
        if open > most {
            (most, at) = (open, t);
        }
    }
    (usize::try_from(most).unwrap_or(0), at)
}

#[cfg(test)]
mod tests {
    use super::most_at_once;

    #[test]
    fn overlapping_spans_are_counted_and_touching_ones_are_not() {
        assert_eq!(most_at_once(vec![(0, 10), (10, 20), (20, 30)]).0, 1);
        assert_eq!(most_at_once(vec![(0, 10), (5, 20)]), (2, 5));
        assert_eq!(most_at_once(vec![(0, 100), (10, 20), (15, 30)]).0, 3);
        assert_eq!(most_at_once(Vec::new()).0, 0);
    }
}
