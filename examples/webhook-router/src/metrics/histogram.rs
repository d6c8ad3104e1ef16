//! A latency histogram that an observation updates with two relaxed atomic additions, no lock
//! (prometheus-client's `Histogram` takes a lock per observation, on the webhook path on every
//! delivery), and its families exported as Prometheus histograms by a collector.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

/// The bucket bounds of the router's histograms: 10 µs (an in-memory registry call) to 10 s
/// (GitHub gives up on a delivery after 10 s; a shared backend's call times out after 2 s).
pub const BUCKETS: &[Duration] = &[
    Duration::from_micros(10),
    Duration::from_micros(25),
    Duration::from_micros(50),
    Duration::from_micros(100),
    Duration::from_micros(250),
    Duration::from_micros(500),
    Duration::from_millis(1),
    Duration::from_micros(2_500),
    Duration::from_millis(5),
    Duration::from_millis(10),
    Duration::from_millis(25),
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_micros(2_500_000),
    Duration::from_secs(5),
    Duration::from_secs(10),
];

/// One histogram: a count per bucket (the last one past every bound) and the sum in nanoseconds.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [Duration],
    counts: Box<[AtomicU64]>,
    sum_nanos: AtomicU64,
}

impl Histogram {
    /// An empty histogram with these (increasing) bucket bounds.
    pub fn new(bounds: &'static [Duration]) -> Self {
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_nanos: AtomicU64::new(0),
        }
    }

    /// Counts one observation.
    pub fn observe(&self, d: Duration) {
        let i = self.bounds.partition_point(|b| *b < d);
        // Relaxed: statistics; a scrape that sees one bucket's addition before the sum's is off by
        // one observation for one scrape.
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        // Relaxed: statistics.
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// The sum, the count and each bucket's own count (prometheus-client adds them up).
    fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let mut count = 0;
        let buckets = self
            .counts
            .iter()
            .enumerate()
            .map(|(i, c)| {
                // Relaxed: statistics.
                let n = c.load(Ordering::Relaxed);
                count += n;
                // The last bucket is +Inf (prometheus-client 0.26 writes f64::INFINITY as `+Inf`).
                let bound = self
                    .bounds
                    .get(i)
                    .map_or(f64::INFINITY, Duration::as_secs_f64);
                (bound, n)
            })
            .collect();
        // Relaxed: statistics.
        let sum = Duration::from_nanos(self.sum_nanos.load(Ordering::Relaxed)).as_secs_f64();
        (sum, count, buckets)
    }
}

/// A series' label pairs.
pub type Labels = Vec<(&'static str, &'static str)>;

/// A histogram family with a fixed set of label values, each series made up front (so every
/// series is exported from the first scrape, at zero, and an observation is an index).
#[derive(Debug)]
pub struct Family {
    name: &'static str,
    help: &'static str,
    series: Vec<(Labels, Arc<Histogram>)>,
}

impl Family {
    /// A family named `name` (without `_seconds`, which the unit adds).
    pub fn new(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            help,
            series: Vec::new(),
        }
    }

    /// The histogram of the `i`th series added.
    pub fn get(&self, i: usize) -> Option<&Histogram> {
        self.series.get(i).map(|(_, h)| &**h)
    }

    /// Adds the series with `labels`; its histogram, to observe into.
    pub fn series(&mut self, labels: Labels, bounds: &'static [Duration]) -> Arc<Histogram> {
        let h = Arc::new(Histogram::new(bounds));
        self.series.push((labels, h.clone()));
        h
    }
}

/// The collector that exports histogram families at scrape time.
#[derive(Debug)]
pub struct Histograms(pub Vec<Arc<Family>>);

impl Collector for Histograms {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in &self.0 {
            let mut metric = encoder.encode_descriptor(
                family.name,
                family.help,
                Some(&Unit::Seconds),
                MetricType::Histogram,
            )?;
            for (labels, h) in &family.series {
                let (sum, count, buckets) = h.snapshot();
                metric
                    .encode_family(labels)?
                    .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_their_bucket_and_add_up() {
        const BOUNDS: &[Duration] = &[Duration::from_millis(1), Duration::from_millis(10)];
        let h = Histogram::new(BOUNDS);
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(1));
        h.observe(Duration::from_millis(5));
        h.observe(Duration::from_secs(3));
        let (sum, count, buckets) = h.snapshot();
        assert_eq!(count, 4);
        assert_eq!(buckets, vec![(0.001, 2), (0.01, 1), (f64::INFINITY, 1)]);
        assert!((sum - 3.0065).abs() < 1e-9, "{sum}");
    }
}
