//! The conformance suite (`worker_registry::testkit`) against the in-memory backend and against
//! the sequential reference model: every case, once for each.

#![cfg(feature = "testkit")]

mod memory {
    worker_registry::conformance_suite!(worker_registry::testkit::MemoryFixture::new());
}

mod reference {
    worker_registry::conformance_suite!(worker_registry::testkit::ReferenceFixture::new());
}
