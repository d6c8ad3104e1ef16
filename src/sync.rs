//! The one place where the registry gets its shared-memory primitives.
//!
//! Everything the registry shares between threads (atomics, `Arc`, the sharded maps and shards,
//! the published snapshot cell, the sweep mutex and the channel that announces new workers) is
//! imported from here and nowhere else. Normally these are
//! `std` atomics, [`dashmap::DashMap`] and [`arc_swap::ArcSwap`]. Under
//! `RUSTFLAGS="--cfg worker_registry_loom"` (which also pulls in the `loom` dependency) they become
//! loom types, so the models in `loom-tests/` explore every interleaving of the *real*
//! state-machine code rather than a copy of it:
//!
//! * atomics, `Arc`, `Mutex` and [`Lock`] (the non-poisoning mutex of the claims shards) are
//!   `loom::sync`'s;
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
pub(crate) use std::sync::mpsc::{channel, Receiver, Sender};
#[cfg(not(worker_registry_loom))]
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

#[cfg(worker_registry_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
#[cfg(worker_registry_loom)]
pub(crate) use loom::sync::mpsc::{channel, Receiver, Sender};
#[cfg(worker_registry_loom)]
pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};

/// Pads a value to a cache line of its own (an atomic that many threads write, so that it shares
/// its line with nothing else). Layout only: under loom it wraps loom's atomics the same way.
pub(crate) use crossbeam_utils::CachePadded;

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

/// The keyed hash of a network-supplied key (a target, a delivery id), computed once when the key
/// is validated and stored with it. One `ahash::RandomState` per process, seeded randomly on first
/// use (fixed under loom): maps that use the stored hash keep their HashDoS resistance, since an
/// attacker cannot predict it.
#[inline]
pub(crate) fn key_hash<T: Hash + ?Sized>(value: &T) -> u64 {
    static KEYS: std::sync::OnceLock<Hasher> = std::sync::OnceLock::new();
    KEYS.get_or_init(hasher).hash_one(value)
}

/// A fixed set of shards, each a `T` on its own cache line, picked by a key's stored hash, plus
/// one `u64` **mark** per shard, all marks packed together (eight to a cache line) so that finding
/// the shard with the smallest mark reads a few cache lines, not one per shard. A mark is a hint
/// (say, the age of the oldest thing in the shard) written by whoever holds the shard's lock and
/// read by anyone without it; nothing may depend on it being current.
///
/// Under loom every distinct hash gets a shard of its own, created on first use (as with
/// [`ShardMap`]), so keys never share a shard lock in a model.
#[cfg(not(worker_registry_loom))]
pub(crate) struct Shards<T> {
    shards: Box<[crossbeam_utils::CachePadded<T>]>,
    marks: Box<[std::sync::atomic::AtomicU64]>,
    mask: u64,
}

/// A shard of a [`Shards`] and its place among them.
#[cfg(not(worker_registry_loom))]
pub(crate) struct ShardRef<'a, T> {
    shard: &'a T,
    index: usize,
}

#[cfg(not(worker_registry_loom))]
impl<T> std::ops::Deref for ShardRef<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        self.shard
    }
}

#[cfg(not(worker_registry_loom))]
impl<T> Shards<T> {
    /// Which bits of a stored key hash pick a shard: above the bits hashbrown uses to place an
    /// entry in a shard's table, below the seven it keeps as the entry's tag, so within one shard
    /// neither loses any spread.
    const SHIFT: u32 = 40;

    /// `n` shards (a power of two), each made by `make`, every mark `mark`.
    pub(crate) fn new(n: usize, make: fn() -> T, mark: u64) -> Self {
        Self {
            shards: (0..n)
                .map(|_| crossbeam_utils::CachePadded::new(make()))
                .collect(),
            marks: (0..n)
                .map(|_| std::sync::atomic::AtomicU64::new(mark))
                .collect(),
            mask: n as u64 - 1,
        }
    }

    /// The shard for a key with this stored hash.
    #[inline]
    pub(crate) fn of(&self, hash: u64) -> ShardRef<'_, T> {
        let index = ((hash >> Self::SHIFT) & self.mask) as usize;
        ShardRef {
            shard: &*self.shards[index],
            index,
        }
    }

    /// Visits every shard, in order.
    pub(crate) fn for_each(&self, mut f: impl FnMut(ShardRef<'_, T>)) {
        for (index, shard) in self.shards.iter().enumerate() {
            f(ShardRef {
                shard: &**shard,
                index,
            });
        }
    }

    /// Sets a shard's mark. Relaxed: a hint (see the type's documentation).
    #[inline]
    pub(crate) fn set_mark(&self, shard: &ShardRef<'_, T>, mark: u64) {
        let m = &self.marks[shard.index];
        if m.load(std::sync::atomic::Ordering::Relaxed) != mark {
            m.store(mark, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The shard with the smallest mark (the first of equals), unless every mark is `u64::MAX`.
    /// Relaxed loads: hints.
    #[inline]
    pub(crate) fn min_mark(&self) -> Option<ShardRef<'_, T>> {
        let mut best = (u64::MAX, 0usize);
        for (i, m) in self.marks.iter().enumerate() {
            let v = m.load(std::sync::atomic::Ordering::Relaxed);
            if v < best.0 {
                best = (v, i);
            }
        }
        (best.0 != u64::MAX).then(|| ShardRef {
            shard: &*self.shards[best.1],
            index: best.1,
        })
    }
}

#[cfg(worker_registry_loom)]
pub(crate) struct Shards<T> {
    make: fn() -> T,
    mark: u64,
    /// A `std` mutex loom does not see: its critical sections contain no loom operation.
    #[allow(clippy::type_complexity)]
    shards: std::sync::Mutex<
        std::collections::BTreeMap<u64, std::sync::Arc<(T, std::sync::atomic::AtomicU64)>>,
    >,
}

#[cfg(worker_registry_loom)]
pub(crate) struct ShardRef<'a, T> {
    shard: std::sync::Arc<(T, std::sync::atomic::AtomicU64)>,
    _shards: std::marker::PhantomData<&'a T>,
}

#[cfg(worker_registry_loom)]
impl<T> std::ops::Deref for ShardRef<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.shard.0
    }
}

#[cfg(worker_registry_loom)]
impl<T> Shards<T> {
    pub(crate) fn new(_n: usize, make: fn() -> T, mark: u64) -> Self {
        Self {
            make,
            mark,
            shards: std::sync::Mutex::new(std::collections::BTreeMap::new()),
        }
    }

    fn wrap<'a>(shard: std::sync::Arc<(T, std::sync::atomic::AtomicU64)>) -> ShardRef<'a, T> {
        ShardRef {
            shard,
            _shards: std::marker::PhantomData,
        }
    }

    pub(crate) fn of(&self, hash: u64) -> ShardRef<'_, T> {
        let mut shards = self.shards.lock().unwrap();
        let shard = shards
            .entry(hash)
            .or_insert_with(|| {
                std::sync::Arc::new(((self.make)(), std::sync::atomic::AtomicU64::new(self.mark)))
            })
            .clone();
        Self::wrap(shard)
    }

    /// Visits every shard that exists, in hash order; one created meanwhile is visited if it sorts
    /// after the cursor.
    pub(crate) fn for_each(&self, mut f: impl FnMut(ShardRef<'_, T>)) {
        use std::ops::Bound::{Excluded, Unbounded};
        let mut cursor: Option<u64> = None;
        loop {
            let next = {
                let shards = self.shards.lock().unwrap();
                let lower = cursor.map_or(Unbounded, Excluded);
                shards
                    .range((lower, Unbounded))
                    .next()
                    .map(|(h, s)| (*h, s.clone()))
            };
            let Some((h, shard)) = next else { break };
            cursor = Some(h);
            f(Self::wrap(shard));
        }
    }

    /// Marks are `std` atomics under loom too: hints decide nothing, so they add no states.
    pub(crate) fn set_mark(&self, shard: &ShardRef<'_, T>, mark: u64) {
        shard
            .shard
            .1
            .store(mark, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn min_mark(&self) -> Option<ShardRef<'_, T>> {
        let shards = self.shards.lock().unwrap();
        shards
            .values()
            .filter(|s| s.1.load(std::sync::atomic::Ordering::Relaxed) != u64::MAX)
            .min_by_key(|s| s.1.load(std::sync::atomic::Ordering::Relaxed))
            .cloned()
            .map(Self::wrap)
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

/// A mutex for data that stays consistent whatever a panicking holder left half done (every
/// field it guards is valid on its own, as the claims shards' are), so it does not poison:
/// `parking_lot`'s, whose lock and unlock are one inlined compare-and-swap each and which has no
/// poison flag to check or set (`std`'s checks `thread::panicking` at both ends). Under loom it is
/// `loom::sync::Mutex`, so the models explore every interleaving around it.
#[cfg(not(worker_registry_loom))]
pub(crate) struct Lock<T> {
    inner: parking_lot::Mutex<T>,
}

/// The guard of a [`Lock`]: the lock is held until it is dropped.
#[cfg(not(worker_registry_loom))]
pub(crate) type LockGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

#[cfg(not(worker_registry_loom))]
impl<T> Lock<T> {
    pub(crate) fn new(value: T) -> Self {
        Self {
            inner: parking_lot::Mutex::new(value),
        }
    }

    /// Locks it, waiting if another thread holds it. The lock's acquire (and the unlock's
    /// release) order everything done under it, as any mutex does.
    #[inline]
    pub(crate) fn lock(&self) -> LockGuard<'_, T> {
        self.inner.lock()
    }
}

#[cfg(worker_registry_loom)]
pub(crate) struct Lock<T> {
    inner: loom::sync::Mutex<T>,
}

#[cfg(worker_registry_loom)]
pub(crate) type LockGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

#[cfg(worker_registry_loom)]
impl<T> Lock<T> {
    pub(crate) fn new(value: T) -> Self {
        Self {
            inner: loom::sync::Mutex::new(value),
        }
    }

    /// Locks it; a model that panics under it has already failed, so poisoning is not handled.
    pub(crate) fn lock(&self) -> LockGuard<'_, T> {
        self.inner.lock().unwrap()
    }
}

/// A wake-up from a synchronous call (an exit that promoted waiting deliveries) to an async
/// waiter (the sweeper, which hands them over). One pending wake-up is kept when nobody waits, so
/// a wake-up during a sweep is not lost. A no-op without tokio, and under loom (the models call
/// `sweep` themselves).
pub(crate) struct Wake {
    #[cfg(all(feature = "tokio", not(worker_registry_loom)))]
    notify: tokio::sync::Notify,
}

impl Wake {
    pub(crate) fn new() -> Self {
        Self {
            #[cfg(all(feature = "tokio", not(worker_registry_loom)))]
            notify: tokio::sync::Notify::new(),
        }
    }

    /// Wakes the waiter, or the next one to wait.
    pub(crate) fn notify(&self) {
        #[cfg(all(feature = "tokio", not(worker_registry_loom)))]
        self.notify.notify_one();
    }

    /// Resolves at the next wake-up (never without tokio, or under loom).
    #[cfg(feature = "tokio")]
    pub(crate) async fn wait(&self) {
        #[cfg(not(worker_registry_loom))]
        self.notify.notified().await;
        #[cfg(worker_registry_loom)]
        std::future::pending::<()>().await;
    }
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

    /// Publishes a new value and returns the one it replaced; readers holding the old one keep it
    /// until they drop it (its reference count says whether any still does).
    pub(crate) fn swap(&self, value: std::sync::Arc<T>) -> std::sync::Arc<T> {
        self.inner.swap(value)
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

    pub(crate) fn swap(&self, value: std::sync::Arc<T>) -> std::sync::Arc<T> {
        std::mem::replace(&mut *self.inner.lock().unwrap(), value)
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

/// A statistics gauge that goes up and down (how many of something are held now), one word.
///
/// Statistics only, as [`Counter`]: no control flow reads it, so under loom it stays a plain
/// `std` atomic and adds no states to the models.
pub(crate) struct Gauge(std::sync::atomic::AtomicUsize);

impl Gauge {
    pub(crate) fn new() -> Self {
        Self(std::sync::atomic::AtomicUsize::new(0))
    }

    /// One more. Relaxed: a pure count; nothing is published through it.
    #[inline]
    pub(crate) fn inc(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// One fewer (never below zero). Relaxed: as `inc`.
    #[inline]
    pub(crate) fn dec(&self) {
        let _ = self.0.fetch_update(
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
            |n| n.checked_sub(1),
        );
    }

    /// The value now. Relaxed: exact once writers are quiet.
    pub(crate) fn get(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
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
