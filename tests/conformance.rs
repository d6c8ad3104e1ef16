//! The conformance suite (`worker_registry::testkit`) against the in-memory backend, against the
//! sequential reference model, and against the in-memory backend on a clock that moves by itself:
//! every case, once for each.

#![cfg(feature = "testkit")]

mod memory {
    worker_registry::conformance_suite!(worker_registry::testkit::MemoryFixture::new());
}

mod reference {
    worker_registry::conformance_suite!(worker_registry::testkit::ReferenceFixture::new());
}

/// The in-memory backend on a clock that also moves by itself: every read of it is a fixed step
/// later than the one before, as if each call took that long on a server's clock. It shows the
/// suite keeps its promise to networked backends: no case depends on time standing still between
/// calls, and every "not yet" check leaves a margin. (Measured: the suite passes with steps up to
/// 200 ms per read, and the first case fails at 400 ms; a real server's call takes well under a
/// millisecond of its clock.)
mod drifting {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    use worker_registry::testkit::Fixture;
    use worker_registry::{Clock, InMemoryRegistry, ManualClock, RegistryConfig};

    const STEP: Duration = Duration::from_millis(10);

    #[derive(Clone, Default)]
    pub struct DriftClock {
        manual: ManualClock,
        reads: Arc<AtomicU64>,
    }

    impl Clock for DriftClock {
        fn now(&self) -> Duration {
            // Relaxed: a counter; each read only needs a distinct, increasing count.
            let reads = self.reads.fetch_add(1, Ordering::Relaxed) + 1;
            self.manual.now() + STEP * u32::try_from(reads).unwrap_or(u32::MAX)
        }
        fn wall(&self) -> SystemTime {
            // Relaxed: as above; display only.
            let reads = self.reads.load(Ordering::Relaxed);
            self.manual.wall() + STEP * u32::try_from(reads).unwrap_or(u32::MAX)
        }
    }

    pub struct DriftFixture;

    impl Fixture for DriftFixture {
        type Registry = InMemoryRegistry<DriftClock>;
        async fn registry(&self, config: RegistryConfig) -> Self::Registry {
            InMemoryRegistry::with_clock(config, DriftClock::default())
        }
        async fn replica(&self, of: &Self::Registry) -> Self::Registry {
            of.clone()
        }
        async fn advance(&self, of: &Self::Registry, by: Duration) {
            of.direct().clock().manual.advance(by);
        }
    }

    worker_registry::conformance_suite!(DriftFixture);
}

/// Every case function is run by the macro and listed in the module documentation, and nothing
/// else is (the compiler already refuses a macro line that names no function; this catches a case
/// written but never run, or documented but gone).
#[test]
fn every_case_is_run_and_documented() {
    use std::collections::BTreeSet;
    use std::fs;
    use std::path::Path;

    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/testkit");
    let mut written = BTreeSet::new();
    for entry in fs::read_dir(root.join("cases")).unwrap() {
        let path = entry.unwrap().path();
        let group = path.file_stem().unwrap().to_str().unwrap().to_owned();
        if group == "mod" {
            continue;
        }
        for line in fs::read_to_string(&path).unwrap().lines() {
            if let Some(rest) = line.strip_prefix("pub async fn ") {
                let name = rest.split(['<', '(']).next().unwrap();
                written.insert(format!("{group}::{name}"));
            }
        }
    }

    let macro_src = fs::read_to_string(root.join("suite.rs")).unwrap();
    let list = &macro_src[macro_src.find("__conformance_cases! {").unwrap()..];
    let list = &list[..list.find("\n        }\n    };").unwrap()];
    let (mut run, mut group) = (BTreeSet::new(), String::new());
    for line in list.lines().skip(1).map(str::trim) {
        if let Some(g) = line.strip_suffix(" {") {
            group = g.to_owned();
        } else if let Some(case) = line.strip_suffix(',') {
            run.insert(format!("{group}::{case}"));
        }
    }

    let docs = fs::read_to_string(root.join("mod.rs")).unwrap();
    let (mut listed, mut group) = (BTreeSet::new(), String::new());
    for line in docs.lines() {
        if let Some(rest) = line.strip_prefix("//! * [`") {
            group = rest.split('`').next().unwrap().to_owned();
        } else if let Some(rest) = line.strip_prefix("//!   - `") {
            listed.insert(format!("{group}::{}", rest.trim_end_matches('`')));
        }
    }

    assert!(written.len() > 50, "found the cases: {written:?}");
    assert_eq!(run, written, "the macro runs exactly the cases written");
    assert_eq!(
        listed, written,
        "src/testkit/mod.rs lists exactly the cases written"
    );
}
