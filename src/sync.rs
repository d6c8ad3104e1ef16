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
//! * [`ShardMap`] is a handful of `loom::sync::Mutex<HashMap>` shards: every key access locks one
//!   shard and iteration visits shard by shard, like DashMap's per-shard `RwLock`s (never one big lock);
//! * [`SnapshotCell`] is a `loom::sync::Mutex<Arc<T>>` in place of `ArcSwap<T>`.
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

#[cfg(worker_registry_loom)]
const LOOM_SHARDS: usize = 2;

/// A concurrent map with per-shard locking (DashMap normally, loom mutex shards under loom).
#[cfg(worker_registry_loom)]
pub(crate) struct ShardMap<K, V> {
    hasher: Hasher,
    shards: Vec<Mutex<std::collections::HashMap<K, V, Hasher>>>,
}

#[cfg(worker_registry_loom)]
impl<K: Eq + Hash, V> ShardMap<K, V> {
    pub(crate) fn new(_shards: usize) -> Self {
        Self {
            hasher: hasher(),
            shards: (0..LOOM_SHARDS)
                .map(|_| Mutex::new(std::collections::HashMap::with_hasher(hasher())))
                .collect(),
        }
    }

    fn shard<Q: Hash + ?Sized>(&self, key: &Q) -> &Mutex<std::collections::HashMap<K, V, Hasher>> {
        &self.shards[self.shard_of(key)]
    }

    /// Which shard `key` lives in (the loom models pick keys in distinct shards so that calls on
    /// them really run concurrently instead of queueing on one shard lock).
    pub(crate) fn shard_of<Q: Hash + ?Sized>(&self, key: &Q) -> usize {
        (self.hasher.hash_one(key) as usize) % LOOM_SHARDS
    }

    pub(crate) fn get_with<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let shard = self.shard(key).lock().unwrap();
        shard.get(key).map(f)
    }

    pub(crate) fn get_mut_with<Q, R>(&self, key: &Q, f: impl FnOnce(&mut V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut shard = self.shard(key).lock().unwrap();
        shard.get_mut(key).map(f)
    }

    pub(crate) fn update<R>(&self, key: K, f: impl FnOnce(Option<&mut V>) -> (Op<V>, R)) -> R {
        let mut shard = self.shard(&key).lock().unwrap();
        let (op, r) = f(shard.get_mut(&key));
        match op {
            Op::Keep => {}
            Op::Put(v) => {
                shard.insert(key, v);
            }
            Op::Remove => {
                shard.remove(&key);
            }
        }
        r
    }

    pub(crate) fn insert(&self, key: K, value: V) -> Option<V> {
        self.shard(&key).lock().unwrap().insert(key, value)
    }

    pub(crate) fn remove_if<Q>(&self, key: &Q, pred: impl FnOnce(&V) -> bool) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut shard = self.shard(key).lock().unwrap();
        if shard.get(key).is_some_and(pred) {
            shard.remove(key)
        } else {
            None
        }
    }

    pub(crate) fn for_each(&self, mut f: impl FnMut(&K, &V)) {
        for s in &self.shards {
            for (k, v) in s.lock().unwrap().iter() {
                f(k, v);
            }
        }
    }

    pub(crate) fn retain(&self, mut f: impl FnMut(&K, &mut V) -> bool) {
        for s in &self.shards {
            s.lock().unwrap().retain(|k, v| f(k, v));
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().unwrap().len()).sum()
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
