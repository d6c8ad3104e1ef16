//! The claims table: which (target, delivery) pairs are in flight or were completed recently,
//! laid out so that no call on it costs more than a few shard-local steps.
//!
//! The table is sharded by the pair's hash (computed from the hashes the target and the delivery
//! id carry since they were validated). Each shard, under its own mutex, holds:
//!
//! * an **index**, a `hashbrown::HashTable` of 4-byte locations (one probe finds a pair, in flight
//!   or retained);
//! * the **in-flight** claims in a dense slab (a `Vec` kept without holes: removing one moves
//!   the last into its place and relabels that one's index slot, so the slab is always exactly
//!   as long as the shard's in-flight claims and gives memory back after a burst, see
//!   [`Shard::take`]);
//! * the **retained** (completed) claims in a ring in completion order, so the oldest is always at
//!   the front: expiry pops fronts until it meets one still within its retention, and eviction
//!   pops the front of the shard whose front is oldest. Nothing walks the retained claims.
//!
//! A retained claim is 56 bytes: its target (a shared pointer), its delivery id (the 16 bytes of a
//! GitHub UUID, or the id's shared text otherwise), when it completed, who held it and since when.
//! It never has a payload: an in-flight claim's payload (a pointer in the slab entry) is taken out
//! by the completion that moves it to the ring.
//! Equality is exact: a probe compares the stored target and delivery id, never only the hash.
//!
//! Every shard publishes the completion time of its oldest retained claim (its mark in
//! `sync::Shards`, a hint read without the lock and checked under it; the marks are packed eight to
//! a cache line), so finding the globally oldest claim reads one word per shard, never a claim.

use std::collections::VecDeque;
use std::sync::Arc as StdArc;

use hashbrown::HashTable;

use super::record::WorkerRecord;
use crate::api::ids::{DeliveryId, Target, WorkerId};
use crate::api::payload::Payload;
use crate::sync::{Arc, AtomicUsize, Lock, LockGuard, Ordering, ShardRef, Shards};

/// A location in a shard: a slab slot (in flight) or, with this bit, a ring sequence number.
const RETAINED: u32 = 1 << 31;
const SEQ_MASK: u32 = RETAINED - 1;
/// `front` of a shard with no retained claim.
const EMPTY: u64 = u64::MAX;
/// In-flight slots a shard's slab keeps however few claims are in flight (so a shard that goes
/// from none to a few and back never reallocates).
const SLAB_KEEP: usize = 64;

/// The hash of a (target, delivery) pair, from the two keyed hashes the ids carry.
#[inline]
pub(crate) fn pair_hash(target: &Target, delivery_hash: u64) -> u64 {
    let h = (target.key_hash() ^ delivery_hash.rotate_left(32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^ (h >> 29)
}

/// A delivery id as the table keeps it.
#[derive(Clone)]
pub(crate) enum DeliveryKey {
    /// A canonical UUID (GitHub's ids): its 16 bytes.
    Uuid([u8; 16]),
    /// Anything else: the id's text, shared with the `DeliveryId` it came from.
    Text(StdArc<str>),
}

impl DeliveryKey {
    pub(crate) fn of(d: &DeliveryId) -> Self {
        match d.uuid() {
            Some(bytes) => Self::Uuid(*bytes),
            None => Self::Text(d.shared_text().clone()),
        }
    }

    /// Exact equality with a delivery id.
    #[inline]
    fn matches(&self, d: &DeliveryId) -> bool {
        match (self, d.uuid()) {
            (Self::Uuid(a), Some(b)) => a == b,
            (Self::Text(a), None) => Self::text_matches(a, d),
            _ => false,
        }
    }

    /// A non-UUID id's text comparison, out of line (GitHub's ids are UUIDs).
    #[inline(never)]
    fn text_matches(a: &str, d: &DeliveryId) -> bool {
        a == d.as_str()
    }

    /// The delivery id again (allocates its text: for reports, not for hot paths).
    pub(crate) fn to_id(&self) -> DeliveryId {
        match self {
            Self::Uuid(bytes) => DeliveryId::from_uuid(*bytes),
            Self::Text(text) => DeliveryId::from_validated(text.clone()),
        }
    }
}

/// A claim in flight.
pub(crate) struct InFlight {
    /// What GitHub sent with the delivery, if it was admitted with it: one pointer here; its bytes
    /// are counted in the registry's payload budget while it is held.
    pub(crate) payload: Option<Payload>,
    /// The pair's hash (see [`pair_hash`]), kept so nothing has to hash the pair again.
    pub(crate) hash: u64,
    pub(crate) target: Target,
    pub(crate) delivery: DeliveryKey,
    /// The worker handling it; `None` for a bare claim not yet bound to one.
    pub(crate) holder: Option<Arc<WorkerRecord>>,
    pub(crate) claimed_at: u64,
    /// Released by a sweep because it stayed in flight longer than `max_in_flight`; kept (as a
    /// tombstone) so that the stuck worker's late completion is refused as released.
    pub(crate) stuck: bool,
}

/// A completed claim, retained so that a late redelivery is recognised.
pub(crate) struct Retained {
    /// The pair's hash, kept so that popping it from the ring needs no hashing and no look at
    /// the target.
    hash: u64,
    pub(crate) target: Target,
    pub(crate) delivery: DeliveryKey,
    pub(crate) completed_at: u64,
    /// The worker that held it (raw id, 0 for none: ids start at 1).
    holder: u64,
    /// `completed_at - claimed_at`, saturating (display only: `AlreadyClaimed::since`).
    in_flight_for: u32,
    /// Replaced by a newer claim of the same pair while it waited in the ring: not a claim any more.
    dead: bool,
}

impl Retained {
    pub(crate) fn holder(&self) -> Option<WorkerId> {
        (self.holder != 0).then(|| WorkerId::new(self.holder))
    }

    pub(crate) fn claimed_at(&self) -> u64 {
        self.completed_at - u64::from(self.in_flight_for)
    }
}

/// What a probe found.
pub(crate) enum Found<'a> {
    InFlight(&'a mut InFlight),
    Retained(&'a Retained),
}

/// What a probe found, to read (see [`Shard::lookup`]).
#[derive(Clone, Copy)]
pub(crate) enum Hit<'a> {
    InFlight(&'a InFlight),
    Retained(&'a Retained),
}

/// One shard's claims. Every method runs under the shard's mutex.
pub(crate) struct Shard {
    index: HashTable<u32>,
    /// In-flight claims (stuck tombstones included), dense: `slab[i]` is indexed as location `i`.
    slab: Vec<InFlight>,
    ring: VecDeque<Retained>,
    /// The sequence number of `ring[0]`.
    head_seq: u32,
    /// Live retained claims in the ring (tombstones excluded).
    retained: usize,
    /// In-flight claims that are not stuck tombstones.
    in_flight: usize,
    /// The ring's front may have changed since the shard's mark was last published.
    front_moved: bool,
    /// Deliveries refused as duplicates of a claim in this shard (statistics): a plain count
    /// under the shard's lock, on a cache line the call has already written.
    duplicates: u64,
}

/// A location found by [`Shard::find`], valid until the shard changes.
#[derive(Clone, Copy)]
pub(crate) struct Loc(u32);

impl Shard {
    fn new() -> Self {
        Self {
            index: HashTable::new(),
            slab: Vec::new(),
            ring: VecDeque::new(),
            head_seq: 0,
            retained: 0,
            in_flight: 0,
            front_moved: false,
            duplicates: 0,
        }
    }

    /// Counts one delivery refused as a duplicate of a claim here.
    #[inline]
    pub(crate) fn count_duplicate(&mut self) {
        self.duplicates = self.duplicates.wrapping_add(1);
    }

    fn ring_pos(&self, seq: u32) -> usize {
        (seq.wrapping_sub(self.head_seq) & SEQ_MASK) as usize
    }

    /// The hash of the entry at `loc` (to rebuild the index as it grows).
    fn hash_at(slab: &[InFlight], ring: &VecDeque<Retained>, head: u32, loc: u32) -> u64 {
        if loc & RETAINED == 0 {
            slab[loc as usize].hash
        } else {
            ring[(loc.wrapping_sub(head) & SEQ_MASK) as usize].hash
        }
    }

    /// Where the claim of this pair is, if there is one. Out of line, with a small comparison
    /// (a retained claim's is out of line again), so that the comparison is inlined into
    /// hashbrown's probe loop: inlined into a caller's larger frame it was not.
    #[inline(never)]
    pub(crate) fn find(&self, hash: u64, target: &Target, delivery: &DeliveryId) -> Option<Loc> {
        self.index
            .find(hash, |&loc| {
                if loc & RETAINED == 0 {
                    self.slab
                        .get(loc as usize)
                        .is_some_and(|e| e.delivery.matches(delivery) && e.target == *target)
                } else {
                    self.retained_hit(loc, target, delivery).is_some()
                }
            })
            .map(|&loc| Loc(loc))
    }

    /// As [`find`](Self::find), also handing out the claim the probe compared (so the caller
    /// reads it without locating it again), and inlined into the caller: the duplicate path
    /// locks, probes and answers in one frame. The probe's comparison is [`find`](Self::find)'s.
    #[inline(always)]
    pub(crate) fn lookup(
        &self,
        hash: u64,
        target: &Target,
        delivery: &DeliveryId,
    ) -> Option<(Loc, Hit<'_>)> {
        let mut hit = None;
        self.index.find(hash, |&loc| {
            let found = if loc & RETAINED == 0 {
                self.slab
                    .get(loc as usize)
                    .filter(|e| e.delivery.matches(delivery) && e.target == *target)
                    .map(Hit::InFlight)
            } else {
                self.retained_hit(loc, target, delivery).map(Hit::Retained)
            };
            hit = found.map(|h| (Loc(loc), h));
            hit.is_some()
        });
        hit
    }

    /// The retained claim at `loc`, if it is a live claim of this pair (out of line: the
    /// in-flight comparison is the one inlined into the probe loop).
    #[inline(never)]
    fn retained_hit(&self, loc: u32, target: &Target, delivery: &DeliveryId) -> Option<&Retained> {
        self.ring
            .get(self.ring_pos(loc))
            .filter(|e| !e.dead && e.delivery.matches(delivery) && e.target == *target)
    }

    /// The claim at `loc`, to read.
    #[inline]
    pub(crate) fn hit(&self, loc: Loc) -> Hit<'_> {
        if loc.0 & RETAINED == 0 {
            Hit::InFlight(&self.slab[loc.0 as usize])
        } else {
            Hit::Retained(&self.ring[self.ring_pos(loc.0)])
        }
    }

    /// The claim at `loc`.
    #[inline]
    pub(crate) fn get(&mut self, loc: Loc) -> Found<'_> {
        if loc.0 & RETAINED == 0 {
            Found::InFlight(&mut self.slab[loc.0 as usize])
        } else {
            let pos = self.ring_pos(loc.0);
            Found::Retained(&self.ring[pos])
        }
    }

    /// Records `claim` as the pair's in-flight claim, replacing whatever `loc` held (a released
    /// in-flight claim, handed back, or a retained one past its retention: the caller adjusts the
    /// counts).
    pub(crate) fn put(&mut self, hash: u64, loc: Option<Loc>, claim: InFlight) -> PutOutcome {
        match loc {
            Some(Loc(slot)) if slot & RETAINED == 0 => {
                let old = std::mem::replace(&mut self.slab[slot as usize], claim);
                if old.stuck {
                    self.in_flight += 1;
                }
                PutOutcome::Replaced {
                    holder: old.holder,
                    payload: old.payload,
                }
            }
            Some(Loc(seq)) => {
                // The retained claim stays in the ring, dead, until it reaches the front.
                let pos = self.ring_pos(seq);
                self.ring[pos].dead = true;
                self.retained -= 1;
                let slot = self.alloc(claim);
                if let Ok(mut e) = self.index.find_entry(hash, |&l| l == seq) {
                    *e.get_mut() = slot;
                }
                self.in_flight += 1;
                self.drop_dead_fronts();
                PutOutcome::ReplacedRetained
            }
            None => {
                let slot = self.alloc(claim);
                let (slab, ring, head) = (&self.slab, &self.ring, self.head_seq);
                self.index
                    .insert_unique(hash, slot, |&l| Self::hash_at(slab, ring, head, l));
                self.in_flight += 1;
                PutOutcome::Inserted
            }
        }
    }

    fn alloc(&mut self, claim: InFlight) -> u32 {
        self.slab.push(claim);
        (self.slab.len() - 1) as u32
    }

    /// Takes the in-flight claim at `slot` out of the slab, whose index slot the caller has
    /// already removed or relabelled: the last claim moves into its place (one index probe
    /// relabels it), so the slab never has holes. When a burst of in-flight claims has drained
    /// (a quarter of the slab's capacity in use), the slab gives half its capacity back: a
    /// reallocation of what is left, at most once per halving, as its growth was.
    fn take(&mut self, slot: u32) -> InFlight {
        let e = self.slab.swap_remove(slot as usize);
        if let Some(moved) = self.slab.get(slot as usize) {
            let from = self.slab.len() as u32;
            if let Ok(mut entry) = self.index.find_entry(moved.hash, |&l| l == from) {
                *entry.get_mut() = slot;
            }
        }
        let cap = self.slab.capacity();
        if cap > SLAB_KEEP && self.slab.len() < cap / 4 {
            self.slab.shrink_to(cap / 2);
        }
        e
    }

    /// Removes the in-flight claim at `loc` (released, or a tombstone no longer needed).
    pub(crate) fn remove(&mut self, hash: u64, loc: Loc) -> Option<InFlight> {
        debug_assert_eq!(loc.0 & RETAINED, 0);
        if loc.0 as usize >= self.slab.len() {
            return None;
        }
        if let Ok(entry) = self.index.find_entry(hash, |&l| l == loc.0) {
            entry.remove();
        }
        let e = self.take(loc.0);
        if !e.stuck {
            self.in_flight -= 1;
        }
        Some(e)
    }

    /// Marks the in-flight claim at `loc` released as stuck (it stays, to refuse its completion).
    pub(crate) fn mark_stuck(&mut self, loc: Loc) {
        if let Some(e) = self.slab.get_mut(loc.0 as usize) {
            if !e.stuck {
                e.stuck = true;
                self.in_flight -= 1;
            }
        }
    }

    /// Completes the in-flight claim at `loc` at `now`: it moves to the back of the ring, without
    /// its payload, which is handed back (for the caller to free outside the lock).
    pub(crate) fn complete(&mut self, hash: u64, loc: Loc, now: u64) -> Option<Payload> {
        if loc.0 as usize >= self.slab.len() {
            return None;
        }
        let seq = self.head_seq.wrapping_add(self.ring.len() as u32) & SEQ_MASK;
        // Relabel its index slot first: `take` then relabels the claim it moves into `loc`.
        if let Ok(mut entry) = self.index.find_entry(hash, |&l| l == loc.0) {
            *entry.get_mut() = RETAINED | seq;
        }
        let mut e = self.take(loc.0);
        self.in_flight -= 1;
        let payload = e.payload.take();
        if self.ring.len() == self.ring.capacity() {
            // Grow by a quarter, not double: the ring of a shard at the retained bound is most of
            // the table's memory.
            self.ring.reserve_exact((self.ring.len() / 4).max(16));
        }
        self.front_moved |= self.ring.is_empty();
        self.ring.push_back(Retained {
            hash,
            holder: e.holder.as_ref().map_or(0, |h| h.id.get()),
            in_flight_for: u32::try_from(now.saturating_sub(e.claimed_at)).unwrap_or(u32::MAX),
            completed_at: now,
            target: e.target,
            delivery: e.delivery,
            dead: false,
        });
        self.retained += 1;
        payload
    }

    /// The completion time of the oldest retained claim.
    fn front_time(&self) -> u64 {
        self.ring.front().map_or(EMPTY, |e| e.completed_at)
    }

    /// Pops dead entries off the front, so the front is always a live claim.
    fn drop_dead_fronts(&mut self) {
        while self.ring.front().is_some_and(|e| e.dead) {
            self.ring.pop_front();
            self.head_seq = self.head_seq.wrapping_add(1) & SEQ_MASK;
            self.front_moved = true;
        }
    }

    /// Pops the oldest retained claim if `pred` holds for it.
    pub(crate) fn pop_front_if(
        &mut self,
        pred: impl FnOnce(&Retained) -> bool,
    ) -> Option<Retained> {
        self.drop_dead_fronts();
        if !self.ring.front().is_some_and(pred) {
            return None;
        }
        let e = self.ring.pop_front()?;
        self.front_moved = true;
        let seq = self.head_seq;
        self.head_seq = self.head_seq.wrapping_add(1) & SEQ_MASK;
        if let Ok(entry) = self.index.find_entry(e.hash, |&l| l == RETAINED | seq) {
            entry.remove();
        }
        self.retained -= 1;
        self.drop_dead_fronts();
        Some(e)
    }

    /// Visits every in-flight claim; `f` decides what becomes of it.
    pub(crate) fn sweep_in_flight(&mut self, mut f: impl FnMut(&mut InFlight) -> Verdict) {
        let mut slot = 0;
        while let Some(e) = self.slab.get_mut(slot) {
            match f(e) {
                Verdict::Keep => slot += 1,
                Verdict::Stuck => {
                    self.mark_stuck(Loc(slot as u32));
                    slot += 1;
                }
                Verdict::Remove => {
                    // The last claim moves into `slot`: visit it there next.
                    let hash = e.hash;
                    self.remove(hash, Loc(slot as u32));
                }
            }
        }
    }

    /// Gives memory back after a shrink: the ring and the index keep at most a quarter of slack.
    fn trim(&mut self) {
        let len = self.ring.len();
        if self.ring.capacity() > 2 * len + 64 {
            self.ring.shrink_to(len + len / 4);
        }
        if self.slab.capacity() > 2 * self.slab.len() + SLAB_KEEP {
            self.slab.shrink_to(self.slab.len() + self.slab.len() / 4);
        }
        let (slab, ring, head) = (&self.slab, &self.ring, self.head_seq);
        self.index
            .shrink_to(self.index.len(), |&l| Self::hash_at(slab, ring, head, l));
    }
}

/// What [`Shard::put`] replaced.
pub(crate) enum PutOutcome {
    Inserted,
    /// A released in-flight claim: its holder and its payload, if it had one.
    Replaced {
        holder: Option<Arc<WorkerRecord>>,
        payload: Option<Payload>,
    },
    ReplacedRetained,
}

/// What a sweep decides about one in-flight claim.
pub(crate) enum Verdict {
    Keep,
    /// Released as stuck: keep it as a tombstone.
    Stuck,
    /// Released (reported) or no longer needed: remove it.
    Remove,
}

/// A locked shard; when it is dropped it publishes the completion time of the shard's oldest
/// retained claim as the shard's mark (`EMPTY` if none): a hint for eviction's choice of shard
/// (any answer is correct: eviction pops whatever front it finds under the lock).
pub(crate) struct Locked<'a> {
    shards: &'a Shards<Lock<Shard>>,
    shard: &'a ShardRef<'a, Lock<Shard>>,
    /// Released after `drop` has published the mark (fields drop after `Drop::drop`).
    guard: LockGuard<'a, Shard>,
}

impl<'a> Locked<'a> {
    #[inline]
    fn new(shards: &'a Shards<Lock<Shard>>, shard: &'a ShardRef<'a, Lock<Shard>>) -> Self {
        Self {
            shards,
            shard,
            guard: shard.lock(),
        }
    }
}

impl std::ops::Deref for Locked<'_> {
    type Target = Shard;
    fn deref(&self) -> &Shard {
        &self.guard
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Shard {
        &mut self.guard
    }
}

impl Locked<'_> {
    /// Publishes the shard's oldest completion time as its mark (out of line: most calls do not
    /// move the front).
    #[inline(never)]
    fn publish_front(&mut self) {
        self.guard.front_moved = false;
        let front = self.guard.front_time();
        self.shards.set_mark(self.shard, front);
    }
}

impl Drop for Locked<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        // Only when the front moved: reading the front (the shard's oldest claim, rarely in
        // cache) on every unlock would cost a cache miss per call. Still under the lock: the
        // guard is a field, released once this returns.
        if self.guard.front_moved {
            self.publish_front();
        }
    }
}

/// The whole table.
pub(crate) struct ClaimTable {
    shards: Shards<Lock<Shard>>,
    /// Live retained claims in every shard; gates eviction.
    retained: AtomicUsize,
}

impl ClaimTable {
    pub(crate) fn new(shards: usize) -> Self {
        Self {
            shards: Shards::new(shards, || Lock::new(Shard::new()), EMPTY),
            retained: AtomicUsize::new(0),
        }
    }

    /// Runs `f` on the shard of a pair with this hash, under its lock.
    #[inline]
    pub(crate) fn with<R>(&self, hash: u64, f: impl FnOnce(&mut Locked<'_>) -> R) -> R {
        let shard = self.shards.of(hash);
        let mut locked = Locked::new(&self.shards, &shard);
        f(&mut locked)
    }

    /// The shard of a pair with this hash (lock it with [`lock`](Self::lock)): for a caller that
    /// wants the lock, the probe and the answer in its own frame, without a closure.
    #[inline(always)]
    pub(crate) fn shard(&self, hash: u64) -> ShardRef<'_, Lock<Shard>> {
        self.shards.of(hash)
    }

    /// Locks `shard` (from [`shard`](Self::shard)).
    #[inline(always)]
    pub(crate) fn lock<'a>(&'a self, shard: &'a ShardRef<'a, Lock<Shard>>) -> Locked<'a> {
        Locked::new(&self.shards, shard)
    }

    /// Runs `f` on every shard in turn, each under its lock.
    pub(crate) fn each(&self, mut f: impl FnMut(&mut Locked<'_>)) {
        self.shards.for_each(|shard| {
            let mut locked = Locked::new(&self.shards, &shard);
            f(&mut locked);
        });
    }

    /// Live retained claims now.
    pub(crate) fn retained(&self) -> usize {
        // Acquire: pairs with the AcqRel updates; a gauge no older than the last change seen.
        self.retained.load(Ordering::Acquire)
    }

    /// Adds `n` retained claims (a completion) and returns the new total. AcqRel: the total
    /// decides eviction, so every change is one read-modify-write in one modification order.
    pub(crate) fn add_retained(&self, n: usize) -> usize {
        self.retained.fetch_add(n, Ordering::AcqRel) + n
    }

    /// Removes `n` retained claims (expired, evicted, replaced). AcqRel: see `add_retained`.
    pub(crate) fn sub_retained(&self, n: usize) {
        if n > 0 {
            self.retained.fetch_sub(n, Ordering::AcqRel);
        }
    }

    /// Evicts the oldest retained claim: the front of the shard whose mark (oldest completion) is
    /// smallest, checked under that shard's lock. Returns whether one was evicted; a few retries
    /// cover a front that moved in between.
    pub(crate) fn evict_oldest(&self) -> bool {
        for _ in 0..8 {
            let Some(shard) = self.shards.min_mark() else {
                return false;
            };
            let mut locked = Locked::new(&self.shards, &shard);
            if locked.pop_front_if(|_| true).is_some() {
                drop(locked);
                self.sub_retained(1);
                return true;
            }
        }
        false
    }

    /// Pops every retained claim completed longer than `retention_ms` before `now`, shard by
    /// shard (each stops at its first claim still within retention), and trims what shrank.
    pub(crate) fn expire(&self, now: u64, retention_ms: u64) -> usize {
        let mut expired = 0;
        self.each(|shard| {
            let before = expired;
            while shard
                .pop_front_if(|e| now.saturating_sub(e.completed_at) > retention_ms)
                .is_some()
            {
                expired += 1;
            }
            if expired > before {
                shard.trim();
            }
        });
        self.sub_retained(expired);
        expired
    }

    /// Deliveries refused as duplicates, over every shard (each read under its lock).
    pub(crate) fn duplicates(&self) -> u64 {
        let mut n = 0u64;
        self.each(|s| n = n.wrapping_add(s.duplicates));
        n
    }

    /// In-flight claims (not stuck) by their holder: (alive or none, dead: released by the death
    /// and not yet swept), over every shard. Visits every in-flight claim, each shard under its
    /// lock in turn (an audit's read, not a hot path's).
    pub(crate) fn by_holder(&self) -> (usize, usize) {
        let (mut in_flight, mut released) = (0, 0);
        self.each(|s| {
            for claim in s.slab.iter().filter(|c| !c.stuck) {
                match &claim.holder {
                    Some(h) if h.state.load().is_dead() => released += 1,
                    _ => in_flight += 1,
                }
            }
        });
        (in_flight, released)
    }

    /// In-flight claims (not stuck) and entries of any kind, over every shard.
    pub(crate) fn counts(&self) -> (usize, usize) {
        let (mut in_flight, mut entries) = (0, 0);
        self.each(|s| {
            in_flight += s.in_flight;
            entries += s.slab.len() + s.retained;
        });
        (in_flight, entries)
    }
}
