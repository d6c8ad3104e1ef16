//! The one place where the registry gets its shared-memory primitives.
//!
//! Everything the registry shares between threads (atomics, `Arc`, the sharded maps, the published
//! snapshot cell and the sweep mutex) is imported from here and nowhere else. Normally these are
//! `std` atomics, [`dashmap::DashMap`] and [`arc_swap::ArcSwap`]. Under
//! `RUSTFLAGS="--cfg worker_registry_loom"` (which also pulls in the `loom` dependency) they become
//! loom types, so the models in `loom-tests/` explore every interleaving of the *real*
//! state-machine code rather than a copy of it:
//!
//! * atomics, `Arc` and `Mutex` are `loom::sync`'s;
//! * [`ShardMap`] gives every key a `loom::sync::Mutex` of its own (the layout DashMap has when a
//!   model's few keys hash to distinct shards): every key access locks that key's shard and
//!   iteration visits the keys one by one in hash order, like DashMap's per-shard `RwLock`s (never
//!   one big lock). Models therefore never need to know which keys share a shard;
//! * [`SnapshotCell`] is a `loom::sync::Mutex<Arc<T>>` in place of `ArcSwap<T>`.
//!
//! This file is the only one that knows about loom: no other source file mentions its cfg, and no
//! test-only code or bug injection lives in the shipped source. The loom models (and their
//! must-fail twins, which carry their bugs as patches) are in `loom-tests/`.
//!
//! The map API is closure-based (`get_with`, `update`, `for_each`, `retain`) so that no
//! implementation-specific guard type leaks into the registry code and both backends lock exactly the
//! key (shard) being touched for exactly the duration of the closure.

use std::borrow::Borrow;
use std::hash::Hash;

#[cfg(not(worker_registry_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
#[cfg(not(worker_registry_loom))]
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

#[cfg(worker_registry_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
#[cfg(worker_registry_loom)]
pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};

/// The hasher used for every map keyed by network input (targets, event ids) and worker ids.
///
/// `ahash::RandomState` is keyed with per-process random seeds, so an attacker who controls repository
/// names or delivery ids cannot precompute colliding keys (HashDoS). Under loom the seeds are fixed so
/// that every explored execution hashes identically (loom requires determinism).
pub(crate) type Hasher = ahash::RandomState;

/// A fresh hasher for one map.
pub(crate) fn hasher() -> Hasher {
    #[cfg(not(worker_registry_loom))]
    {
        ahash::RandomState::new()
    }
    #[cfg(worker_registry_loom)]
    {
        ahash::RandomState::with_seeds(1, 2, 3, 4)
    }
}

/// What an [`ShardMap::update`] closure wants done with the key's slot.
pub(crate) enum Op<V> {
    /// Leave the slot as it is.
    Keep,
    /// Put this value in the slot (inserting, or replacing what was there).
    Put(V),
    /// Empty the slot.
    Remove,
}

/// Locks the sweep mutex; a poisoned lock is still usable (the data it guards is scratch space).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    #[cfg(not(worker_registry_loom))]
    {
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    #[cfg(worker_registry_loom)]
    {
        m.lock().unwrap()
    }
}

/// Locks `m` if no one holds it; `None` if someone does (or, in std, if it is poisoned by a panic
/// elsewhere, which only means a sweep must be retried later).
pub(crate) fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    m.try_lock().ok()
}

// ---------------------------------------------------------------------------------------------
// std backend
// ---------------------------------------------------------------------------------------------

/// A concurrent map with per-shard locking (DashMap normally, loom mutex shards under loom).
#[cfg(not(worker_registry_loom))]
pub(crate) struct ShardMap<K, V> {
    inner: dashmap::DashMap<K, V, Hasher>,
}

#[cfg(not(worker_registry_loom))]
impl<K: Eq + Hash, V> ShardMap<K, V> {
    /// An empty map with `shards` shards (a power of two).
    pub(crate) fn new(shards: usize) -> Self {
        Self {
            inner: dashmap::DashMap::with_hasher_and_shard_amount(hasher(), shards),
        }
    }

    /// Runs `f` on the value for `key` under that shard's read lock.
    #[inline]
    pub(crate) fn get_with<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.inner.get(key).map(|r| f(r.value()))
    }

    /// Runs `f` on the value for `key` under that shard's write lock, if there is one. Unlike
    /// [`update`](Self::update) it takes the key by reference: it can change a value, never insert.
    #[inline]
    pub(crate) fn get_mut_with<Q, R>(&self, key: &Q, f: impl FnOnce(&mut V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.inner.get_mut(key).map(|mut r| f(r.value_mut()))
    }

    /// Runs `f` on the slot for `key` under that shard's write lock; `f` sees the current value
    /// (or `None`) and says what to do with the slot. This is the entry API: there is no window
    /// between looking and inserting.
    #[inline]
    pub(crate) fn update<R>(&self, key: K, f: impl FnOnce(Option<&mut V>) -> (Op<V>, R)) -> R {
        match self.inner.entry(key) {
            dashmap::Entry::Occupied(mut o) => {
                let (op, r) = f(Some(o.get_mut()));
                match op {
                    Op::Keep => {}
                    Op::Put(v) => {
                        o.insert(v);
                    }
                    Op::Remove => {
                        o.remove();
                    }
                }
                r
            }
            dashmap::Entry::Vacant(v) => {
                let (op, r) = f(None);
                if let Op::Put(value) = op {
                    v.insert(value);
                }
                r
            }
        }
    }

    /// Inserts `value`, returning the previous value.
    pub(crate) fn insert(&self, key: K, value: V) -> Option<V> {
        self.inner.insert(key, value)
    }

    /// Removes `key` if `pred` holds for its value (checked under the shard's write lock).
    pub(crate) fn remove_if<Q>(&self, key: &Q, pred: impl FnOnce(&V) -> bool) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.inner.remove_if(key, |_, v| pred(v)).map(|(_, v)| v)
    }

    /// Visits every entry, one shard (read-locked) at a time. `f` must not touch another map.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&K, &V)) {
        for r in self.inner.iter() {
            f(r.key(), r.value());
        }
    }

    /// Keeps the entries for which `f` returns true, one shard (write-locked) at a time.
    pub(crate) fn retain(&self, mut f: impl FnMut(&K, &mut V) -> bool) {
        self.inner.retain(|k, v| f(k, v));
    }

    /// Number of entries (sums the shards; approximate under concurrent change).
    pub(crate) fn len(&self) -> usize {
        self.inner.len()
    }
}

/// The published status snapshot: `ArcSwap` normally (readers never block, never wait for writers).
#[cfg(not(worker_registry_loom))]
pub(crate) struct SnapshotCell<T> {
    inner: arc_swap::ArcSwap<T>,
}

#[cfg(not(worker_registry_loom))]
impl<T> SnapshotCell<T> {
    pub(crate) fn new(value: T) -> Self {
        Self {
            inner: arc_swap::ArcSwap::from_pointee(value),
        }
    }

    /// The current value. Wait-free for readers: one hazard-slot read plus a reference-count bump.
    #[inline]
    pub(crate) fn load(&self) -> std::sync::Arc<T> {
        self.inner.load_full()
    }

    /// Runs `f` on the current value without touching its reference count: `ArcSwap::load`'s
    /// guard borrows a per-thread debt slot instead, so concurrent readers share no cache line.
    #[inline]
    pub(crate) fn with<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        f(&self.inner.load())
    }

    /// Publishes a new value; readers holding the old one keep it until they drop it.
    pub(crate) fn store(&self, value: std::sync::Arc<T>) {
        self.inner.store(value);
    }
}

// ---------------------------------------------------------------------------------------------
// loom backend
// ---------------------------------------------------------------------------------------------

/// A concurrent map with per-key locking under loom: **every key gets a shard of its own**.
///
/// That is the layout DashMap has whenever a model's handful of keys hash to distinct shards
/// (almost always, with 64 shards), so a model never has to search for keys that do not share a
/// lock: two calls on different keys never serialise on a map lock, two calls on one key always
/// do. Keys sharing a real shard only ever serialise *more*, so the interleavings explored here
/// include theirs. Iteration visits the keys one at a time in hash order (the order of their
/// shards), taking each key's lock in turn, so a key inserted during an iteration is visited if it
/// sorts after the cursor, as a key inserted into a shard not yet visited is.
///
/// The key index itself sits behind a `std` mutex that loom does not see: its critical sections
/// contain no loom operation, so each is one indivisible step of every explored execution. Slots
/// are never unlinked (a removed key's slot holds `None`), so a slot looked up stays valid.
#[cfg(worker_registry_loom)]
pub(crate) struct ShardMap<K, V> {
    hasher: Hasher,
    #[allow(clippy::type_complexity)]
    index: std::sync::Mutex<std::collections::BTreeMap<(u64, u64), std::sync::Arc<Slot<K, V>>>>,
}

#[cfg(worker_registry_loom)]
struct Slot<K, V> {
    key: K,
    value: Mutex<Option<V>>,
}

#[cfg(worker_registry_loom)]
impl<K: Eq + Hash, V> ShardMap<K, V> {
    pub(crate) fn new(_shards: usize) -> Self {
        Self {
            hasher: hasher(),
            index: std::sync::Mutex::new(std::collections::BTreeMap::new()),
        }
    }

    /// The slot of `key`, if it was ever inserted.
    fn slot<Q>(&self, key: &Q) -> Option<std::sync::Arc<Slot<K, V>>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let h = self.hasher.hash_one(key);
        let index = self.index.lock().unwrap();
        index
            .range((h, 0)..=(h, u64::MAX))
            .find(|(_, s)| s.key.borrow() == key)
            .map(|(_, s)| s.clone())
    }

    /// The slot of `key`, created (empty) if it never existed.
    fn slot_or_create(&self, key: K) -> std::sync::Arc<Slot<K, V>> {
        let h = self.hasher.hash_one(&key);
        let mut index = self.index.lock().unwrap();
        if let Some((_, s)) = index
            .range((h, 0)..=(h, u64::MAX))
            .find(|(_, s)| s.key == key)
        {
            return s.clone();
        }
        let seq = index.range((h, 0)..=(h, u64::MAX)).count() as u64;
        let slot = std::sync::Arc::new(Slot {
            key,
            value: Mutex::new(None),
        });
        index.insert((h, seq), slot.clone());
        slot
    }

    pub(crate) fn get_with<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let slot = self.slot(key)?;
        let value = slot.value.lock().unwrap();
        value.as_ref().map(f)
    }

    pub(crate) fn get_mut_with<Q, R>(&self, key: &Q, f: impl FnOnce(&mut V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let slot = self.slot(key)?;
        let mut value = slot.value.lock().unwrap();
        value.as_mut().map(f)
    }

    pub(crate) fn update<R>(&self, key: K, f: impl FnOnce(Option<&mut V>) -> (Op<V>, R)) -> R {
        let slot = self.slot_or_create(key);
        let mut value = slot.value.lock().unwrap();
        let (op, r) = f(value.as_mut());
        match op {
            Op::Keep => {}
            Op::Put(v) => *value = Some(v),
            Op::Remove => *value = None,
        }
        r
    }

    pub(crate) fn insert(&self, key: K, value: V) -> Option<V> {
        let slot = self.slot_or_create(key);
        let mut guard = slot.value.lock().unwrap();
        guard.replace(value)
    }

    pub(crate) fn remove_if<Q>(&self, key: &Q, pred: impl FnOnce(&V) -> bool) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let slot = self.slot(key)?;
        let mut value = slot.value.lock().unwrap();
        if value.as_ref().is_some_and(pred) {
            value.take()
        } else {
            None
        }
    }

    /// The slot after `cursor` in hash order (the first one for `None`).
    fn next_slot(
        &self,
        cursor: Option<(u64, u64)>,
    ) -> Option<((u64, u64), std::sync::Arc<Slot<K, V>>)> {
        use std::ops::Bound::{Excluded, Unbounded};
        let index = self.index.lock().unwrap();
        let lower = cursor.map_or(Unbounded, Excluded);
        index
            .range((lower, Unbounded))
            .next()
            .map(|(pos, s)| (*pos, s.clone()))
    }

    pub(crate) fn for_each(&self, mut f: impl FnMut(&K, &V)) {
        let mut cursor = None;
        while let Some((pos, slot)) = self.next_slot(cursor) {
            cursor = Some(pos);
            if let Some(v) = slot.value.lock().unwrap().as_ref() {
                f(&slot.key, v);
            }
        }
    }

    pub(crate) fn retain(&self, mut f: impl FnMut(&K, &mut V) -> bool) {
        let mut cursor = None;
        while let Some((pos, slot)) = self.next_slot(cursor) {
            cursor = Some(pos);
            let mut value = slot.value.lock().unwrap();
            if let Some(v) = value.as_mut() {
                if !f(&slot.key, v) {
                    *value = None;
                }
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        let mut n = 0;
        self.for_each(|_, _| n += 1);
        n
    }
}

/// The published status snapshot: a loom mutex around a (std) `Arc` under loom. The snapshot's
/// reference count is not what the models check, so it stays a std `Arc` and `status()` returns
/// the same type in both builds.
#[cfg(worker_registry_loom)]
pub(crate) struct SnapshotCell<T> {
    inner: Mutex<std::sync::Arc<T>>,
}

#[cfg(worker_registry_loom)]
impl<T> SnapshotCell<T> {
    pub(crate) fn new(value: T) -> Self {
        Self {
            inner: Mutex::new(std::sync::Arc::new(value)),
        }
    }

    pub(crate) fn load(&self) -> std::sync::Arc<T> {
        self.inner.lock().unwrap().clone()
    }

    /// Clones the `Arc` under the lock, then runs `f` with no lock held.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        f(&self.load())
    }

    pub(crate) fn store(&self, value: std::sync::Arc<T>) {
        *self.inner.lock().unwrap() = value;
    }
}

// ---------------------------------------------------------------------------------------------
// Statistics counters
// ---------------------------------------------------------------------------------------------

/// A monotonically increasing statistics counter, striped over cache lines so that router threads
/// bumping it never contend on one line.
///
/// Statistics only: no control flow reads these, so under loom they stay plain `std` atomics and add
/// no states to the models.
pub(crate) struct Counter {
    stripes: [crossbeam_utils::CachePadded<std::sync::atomic::AtomicU64>; STRIPES],
}

const STRIPES: usize = 8;

impl Counter {
    pub(crate) fn new() -> Self {
        Self {
            stripes: std::array::from_fn(|_| Default::default()),
        }
    }

    /// Adds `n`. Relaxed: a pure count, read only as a total; nothing is published through it.
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        self.stripes[stripe()].fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Adds one.
    #[inline]
    pub(crate) fn inc(&self) {
        self.add(1);
    }

    /// The total over all stripes. Relaxed: totals are monotone and approximate while writers run.
    pub(crate) fn get(&self) -> u64 {
        self.stripes
            .iter()
            .map(|s| s.load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    }
}

/// This thread's stripe: threads are numbered round-robin on first use.
#[inline]
fn stripe() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicUsize as StdAtomicUsize, Ordering as StdOrdering};
    static NEXT: StdAtomicUsize = StdAtomicUsize::new(0);
    std::thread_local! {
        static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    STRIPE
        .try_with(|s| {
            let mut v = s.get();
            if v == usize::MAX {
                // Relaxed: only spreads threads over stripes; any value is correct.
                v = NEXT.fetch_add(1, StdOrdering::Relaxed) % STRIPES;
                s.set(v);
            }
            v
        })
        .unwrap_or(0)
}
