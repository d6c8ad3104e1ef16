-- worker-registry on PostgreSQL: the schema (tables, indexes, sequences, constraints).
--
-- The baseline: the schema as the old history (migrations 0001-0009, before 0.2.0) left it, in
-- one file; `the_baseline_is_the_old_history_without_its_functions` in `tests/postgres.rs`
-- compares the two with `pg_dump --schema-only`. No function is defined here: they live in
-- `functions/*.sql`, applied after the migrations whenever they change. A database the old
-- history brought to 0009 is recorded as at this baseline; an older one is refused (`migrate.rs`,
-- and `docs::postgres`, "Migrations").
--
-- Every row belongs to one registry (wr_registries.id): several registries (pools, test runs)
-- share the tables without seeing each other. Times are integer milliseconds on the server's
-- clock since the Unix epoch, plus the registry's test offset (see wr_now in
-- `functions/base.sql`). No foreign keys on the hot tables: a foreign-key check would share-lock
-- the registry row on every insert.

-- One row per registry: its name, and its settings.
CREATE TABLE wr_registries (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name           text NOT NULL UNIQUE,
    -- Test-only: milliseconds added to the server clock. Only a `testkit` build can set it.
    test_offset_ms bigint NOT NULL DEFAULT 0,
    created_at     timestamptz NOT NULL DEFAULT now(),
    -- The limits that decide, as the first replica to open the registry set them (a JSON object
    -- of integers, see `src/remote/agreement.rs`); NULL until then.
    config         jsonb,
    -- The registry's incarnation: a value chosen when its row is created, and changed by the
    -- first handle that finds the data rewound (a failover to a standby that lagged, a restore),
    -- so that every other handle finds the loss too (see `src/postgres/loss.rs`).
    epoch          text NOT NULL DEFAULT md5(random()::text),
    -- Whether a handle that polls `wr_events` (behind a transaction pooler) has opened it.
    poll_events    boolean NOT NULL DEFAULT false
);

-- The capacity counter: live (non-dead) workers, and the next worker id. A new worker reserves
-- its slot and its id with one conditional UPDATE of this row (`live < max_workers`); a death
-- gives the slot back. Both in the transaction that creates or kills the worker.
CREATE TABLE wr_capacity (
    registry       bigint PRIMARY KEY REFERENCES wr_registries (id) ON DELETE CASCADE,
    live           integer NOT NULL DEFAULT 0 CHECK (live >= 0),
    next_worker_id bigint NOT NULL DEFAULT 1
);

-- Workers, live and dead (dead ones until dead_retention has passed).
CREATE TABLE wr_workers (
    registry          bigint NOT NULL,
    id                bigint NOT NULL,
    -- The target (repository, PR/issue number) of a spawned worker; NULL for a registered one.
    repo              text,
    number            bigint,
    status            text NOT NULL DEFAULT 'active'
                      CHECK (status IN ('active', 'draining', 'dead')),
    dead_reason       text CHECK (dead_reason IN
                      ('missed_heartbeats', 'exited', 'deregistered', 'drain_timed_out')),
    busy              boolean NOT NULL,
    -- Marked by the mass-staleness brake instead of being declared dead; cleared by a heartbeat.
    suspect           boolean NOT NULL DEFAULT false,
    suspect_since_ms  bigint,
    -- Whether it has heartbeated at all (before that it also gets the start-up grace).
    beaten            boolean NOT NULL DEFAULT false,
    -- Its last heartbeat, or its creation before the first one.
    last_beat_ms      bigint NOT NULL,
    started_ms        bigint NOT NULL,
    died_at_ms        bigint,
    drain_deadline_ms bigint,
    -- Assignments received: the low bits of its fencing token.
    assignments       bigint NOT NULL,
    -- Versioned worker rows: every write to a worker sets `dirty`; the sweep gives dirty rows
    -- the next snapshot version (and clears `dirty`) before it publishes that version, so a
    -- replica at version k reads only the rows versioned after k.
    version           bigint NOT NULL DEFAULT 0,
    dirty             boolean NOT NULL DEFAULT true,
    PRIMARY KEY (registry, id),
    CHECK ((repo IS NULL) = (number IS NULL)),
    CHECK ((status = 'dead') = (dead_reason IS NOT NULL))
);
-- The sweep's range queries: live workers silent for too long, drains past their deadline,
-- dead workers past their retention.
CREATE INDEX wr_workers_silent ON wr_workers (registry, last_beat_ms) WHERE status <> 'dead';
CREATE INDEX wr_workers_draining ON wr_workers (registry, drain_deadline_ms) WHERE status = 'draining';
CREATE INDEX wr_workers_dead ON wr_workers (registry, died_at_ms) WHERE status = 'dead';
CREATE INDEX wr_workers_version ON wr_workers (registry, version);
CREATE INDEX wr_workers_dirty ON wr_workers (registry, id) WHERE dirty;

-- Sticky assignment: which worker a target was last placed on. Locked (FOR UPDATE) by every
-- assignment of the target, so two assignments of one target never both create a worker. A row
-- whose worker is dead is a vacancy; the sweep deletes such rows in batches.
CREATE TABLE wr_targets (
    registry bigint NOT NULL,
    repo     text NOT NULL,
    number   bigint NOT NULL,
    worker   bigint,
    PRIMARY KEY (registry, repo, number)
);

-- Claims: a (target, delivery) pair being handled or handled recently.
--   in flight: completed_at_ms and release_reason NULL (a bare claim, holder NULL, is released
--              once it is older than the heartbeat timeout);
--   completed: completed_at_ms set; remembered for claim_retention, at most max_retained_claims;
--   released: release_reason set, when its worker died; the next sweep moves it to wr_released.
CREATE TABLE wr_claims (
    registry        bigint NOT NULL,
    repo            text NOT NULL,
    number          bigint NOT NULL,
    delivery        text NOT NULL,
    holder          bigint,
    claimed_at_ms   bigint NOT NULL,
    completed_at_ms bigint,
    release_reason  text CHECK (release_reason IN ('worker_died', 'stuck', 'unbound')),
    dead_reason     text,
    PRIMARY KEY (registry, repo, number, delivery)
);
-- In-flight claims by holder (released when the holder dies), by age (bare claims past the
-- timeout; claims in flight longer than max_in_flight), completed ones by age (retention and
-- eviction), released ones (moved to the outbox).
CREATE INDEX wr_claims_holder ON wr_claims (registry, holder) WHERE completed_at_ms IS NULL;
CREATE INDEX wr_claims_in_flight ON wr_claims (registry, claimed_at_ms)
    WHERE completed_at_ms IS NULL AND release_reason IS NULL;
CREATE INDEX wr_claims_completed ON wr_claims (registry, completed_at_ms)
    WHERE completed_at_ms IS NOT NULL;
-- A claim released as stuck stays in wr_claims (release_reason 'stuck') as a tombstone, so that
-- the stuck worker's late completion is refused as released; its row went to the outbox when it
-- was released. When its holder dies, wr_kill sets its dead_reason and the next sweep deletes it.
-- So the sweep's move of released claims to the outbox leaves tombstones out, through its index.
CREATE INDEX wr_claims_released ON wr_claims (registry)
    WHERE release_reason IN ('worker_died', 'unbound');
CREATE INDEX wr_claims_stuck_gone ON wr_claims (registry)
    WHERE release_reason = 'stuck' AND dead_reason IS NOT NULL;

-- The outbox of released deliveries, for re-dispatch. A sweep claims rows (claimed_by, the
-- replica; claimed_at_ms) with FOR UPDATE SKIP LOCKED; acknowledge deletes them; a row claimed
-- longer than release_ack_timeout ago is offered again, so a replica that dies loses nothing.
-- A delivery promoted from the waiting room is handed over through it too, with its assignment
-- (assign_seq, assign_new).
CREATE TABLE wr_released (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    registry       bigint NOT NULL,
    repo           text NOT NULL,
    number         bigint NOT NULL,
    delivery       text NOT NULL,
    holder         bigint,
    reason         text NOT NULL
                   CHECK (reason IN ('worker_died', 'stuck', 'unbound', 'promoted')),
    dead_reason    text,
    released_at_ms bigint NOT NULL,
    claimed_by     text,
    claimed_at_ms  bigint,
    assign_seq     bigint,
    assign_new     boolean
);
CREATE INDEX wr_released_registry ON wr_released (registry, id);
-- Whether a worker's start is a promoted event's (a duplicate on it is then not "unstarted").
CREATE INDEX wr_released_promoted ON wr_released (registry, holder) WHERE reason = 'promoted';

-- The status snapshot the sweeping replica publishes: one row per registry with the gauges and
-- the version (the workers are the versioned rows of wr_workers). A replica further behind than
-- the purge log reaches (its version below purge_floor) reloads the worker rows whole.
CREATE TABLE wr_snapshots (
    registry      bigint PRIMARY KEY REFERENCES wr_registries (id) ON DELETE CASCADE,
    version       bigint NOT NULL DEFAULT 0,
    taken_at_ms   bigint NOT NULL DEFAULT 0,
    brake_engaged boolean NOT NULL DEFAULT false,
    in_flight     bigint NOT NULL DEFAULT 0,
    retained      bigint NOT NULL DEFAULT 0,
    purge_floor   bigint NOT NULL DEFAULT 0,
    waiting       bigint NOT NULL DEFAULT 0,
    payloads      bigint NOT NULL DEFAULT 0,
    payload_bytes bigint NOT NULL DEFAULT 0
);

-- The purge log: a dead worker's row deleted past dead_retention, under the version that
-- publishes it, so replicas drop it from their cached snapshot. Trimmed by the sweep.
CREATE TABLE wr_purged (
    registry bigint NOT NULL,
    version  bigint NOT NULL,
    id       bigint NOT NULL,
    PRIMARY KEY (registry, version, id)
);

-- The maintenance lease: one row per registry naming the replica that sweeps and until when
-- (registry time, ms). A sweep takes it when it is free, lapsed, or its own (renewing it); every
-- other replica's sweep only collects its share of the outbox and the snapshot.
CREATE TABLE wr_leases (
    registry      bigint PRIMARY KEY REFERENCES wr_registries (id) ON DELETE CASCADE,
    holder        text,
    expires_at_ms bigint NOT NULL DEFAULT 0
);

-- The stall rule's memory, one row per registry, written only by the lease holder's sweep: when
-- the last sweep (of any replica) ran, and the stalls measured so far that can still matter,
-- oldest first, disjoint and increasing ([starts_ms[i], ends_ms[i]]), at most 64 of them (as
-- MAX_STALLS in memory: the oldest is dropped first).
CREATE TABLE wr_stalls (
    registry      bigint PRIMARY KEY REFERENCES wr_registries (id) ON DELETE CASCADE,
    last_sweep_ms bigint,
    starts_ms     bigint[] NOT NULL DEFAULT '{}',
    ends_ms       bigint[] NOT NULL DEFAULT '{}',
    CHECK (cardinality(starts_ms) = cardinality(ends_ms) AND cardinality(starts_ms) <= 64)
);

-- The retained-claims counter: the number of completed claims kept, moved in the transaction
-- that changes the set of completed claims (never a count over the claims), and summed by the
-- sweep to publish the gauge and to decide how many to evict over max_retained_claims:
--   +1  wr_complete, a claim in flight becomes completed;
--   -1  wr_admit / wr_claim replacing a completed claim past its retention (a redelivery);
--   -n  wr_sweep, the claims it expires and evicts.
-- Nothing else adds or removes a completed claim: release deletes only claims not completed,
-- wr_kill and the stuck rule mark only claims not completed, and the sweep's moves to the outbox
-- and deletion of stuck tombstones take only released claims (never completed ones). No function
-- deletes a registry; if one is deleted, its counter rows go with it (ON DELETE CASCADE).
--
-- Striped, so that completions do not serialise on one row: each hot call adds to one of 16
-- stripes picked at random (stripes 0-15); the sweep, under its advisory lock, writes its own
-- stripe (-1) and reads the sum of the 17 rows. A stripe may be negative; the sum never is. A
-- stripe row is the last lock a call takes (after claim, target, capacity row, worker) and each
-- call takes one, so it adds no lock-order cycle.
CREATE TABLE wr_retained (
    registry bigint NOT NULL REFERENCES wr_registries (id) ON DELETE CASCADE,
    stripe   smallint NOT NULL CHECK (stripe BETWEEN -1 AND 15),
    n        bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (registry, stripe)
);

-- Lifecycle events for handles that cannot LISTEN.
-- Behind a pooler in transaction mode without a direct `listen_url`, a handle cannot hold the
-- session LISTEN needs; it polls this log instead (`src/postgres/poll.rs`). wr_notify writes a
-- row per event, beside the NOTIFY, only for a registry a polling handle has opened
-- (`poll_events`, set by that handle's connect and left set). `at_ms` is the server's clock (no
-- test offset): a poller re-reads the rows of the last few seconds, so that one whose transaction
-- committed after a later sequence number was read is not missed. The lease holder's sweep trims
-- the log in bounded steps.
CREATE TABLE wr_events (
    registry bigint NOT NULL REFERENCES wr_registries (id) ON DELETE CASCADE,
    seq      bigserial,
    at_ms    bigint NOT NULL,
    payload  text NOT NULL,
    PRIMARY KEY (registry, seq)
);
CREATE INDEX wr_events_at ON wr_events (registry, at_ms);

-- The waiting room (the design is in `docs::postgres`, "The waiting room").
-- Parked deliveries, one row each, in arrival order (`seq`). `place` says where the delivery's
-- target waits: 'queued' for capacity (in its owner's queue), 'blocked' behind its draining
-- worker `blocker`, 'ready' once that worker died (first in line, in the order of the deaths:
-- `turn`). Every row of one target has the same place. At most max_waiting rows per registry
-- (wr_room.waiting), max_waiting_per_owner per owner (wr_owner_waiting.waiting).
CREATE TABLE wr_waiting (
    registry     bigint NOT NULL,
    seq          bigint GENERATED ALWAYS AS IDENTITY,
    repo         text NOT NULL,
    number       bigint NOT NULL,
    delivery     text NOT NULL,
    -- The repository owner the delivery counts against (the part of repo before the slash).
    owner        text NOT NULL,
    parked_at_ms bigint NOT NULL,
    place        text NOT NULL CHECK (place IN ('queued', 'blocked', 'ready')),
    blocker      bigint,
    turn         bigint,
    PRIMARY KEY (registry, seq),
    CHECK ((place = 'blocked') = (blocker IS NOT NULL))
);
-- A redelivery of a parked pair (a duplicate, 'waiting').
CREATE UNIQUE INDEX wr_waiting_pair ON wr_waiting (registry, repo, number, delivery);
-- A target's deliveries in order (promotion takes them all, parking joins them).
CREATE INDEX wr_waiting_target ON wr_waiting (registry, repo, number, seq);
-- Promotion: the successors of dead draining workers first, then each owner's queue.
CREATE INDEX wr_waiting_ready ON wr_waiting (registry, turn, seq) WHERE place = 'ready';
CREATE INDEX wr_waiting_queued ON wr_waiting (registry, owner, seq) WHERE place = 'queued';
-- A death moves the targets behind its worker to 'ready'.
CREATE INDEX wr_waiting_blocked ON wr_waiting (registry, blocker) WHERE place = 'blocked';
-- Whether any target waits for capacity (arrivals do not overtake it).
CREATE INDEX wr_waiting_contenders ON wr_waiting (registry) WHERE place <> 'blocked';
-- Expiry past max_wait, oldest first.
CREATE INDEX wr_waiting_parked ON wr_waiting (registry, parked_at_ms, seq);

-- The room's count and the settings a call that frees a slot promotes with (a death by
-- loop_finished or deregister takes no configuration): written by every handle's connect.
CREATE TABLE wr_room (
    registry    bigint PRIMARY KEY REFERENCES wr_registries (id) ON DELETE CASCADE,
    waiting     integer NOT NULL DEFAULT 0 CHECK (waiting >= 0),
    max_workers bigint NOT NULL DEFAULT 0,
    owner_cap   bigint NOT NULL DEFAULT 0,
    retention   bigint NOT NULL DEFAULT 0,
    unbound     bigint NOT NULL DEFAULT 0
);

-- Per owner with deliveries waiting: how many, and its turn in the round-robin (the owner
-- with the lowest turn among those with a queued target is served next; serving it moves its
-- turn to the back). Deleted when its last delivery leaves.
CREATE TABLE wr_owner_waiting (
    registry bigint NOT NULL,
    owner    text NOT NULL,
    waiting  integer NOT NULL CHECK (waiting >= 0),
    turn     bigint NOT NULL,
    PRIMARY KEY (registry, owner)
);
CREATE INDEX wr_owner_waiting_turn ON wr_owner_waiting (registry, turn);

-- Per owner, its live workers, while max_workers_per_owner is on: taken with one conditional
-- update by the call that creates a worker (after the capacity row, in that transaction),
-- given back by its death. Deleted when it reaches 0.
CREATE TABLE wr_owner_live (
    registry bigint NOT NULL,
    owner    text NOT NULL,
    live     integer NOT NULL CHECK (live >= 0),
    PRIMARY KEY (registry, owner)
);

-- Turns (round-robin positions, the order of deaths): a sequence, never rolled back, never
-- locked.
CREATE SEQUENCE wr_turns;

-- Payloads: what GitHub sent with a delivery, kept with the delivery while it has work left
-- (the design is in `docs::postgres`, "Payloads").
-- One row per pair with a payload: the claim in flight, the parked delivery, or (released: its
-- claim was released by a death or the stuck rule) the copy its outbox row hands out, until that
-- row is acknowledged or expires, or the pair is admitted again. Keyed like the claims, so that
-- a claim, its parking and its release all find it by the same key and nothing is copied when
-- the delivery moves (the body, TOASTed, is never rewritten by an update of `released`).
-- `headers` holds the extra headers as name, value, name, value; `size` is `Payload::size`.
CREATE TABLE wr_payloads (
    registry     bigint NOT NULL,
    repo         text NOT NULL,
    number       bigint NOT NULL,
    delivery     text NOT NULL,
    event        text NOT NULL,
    action       text,
    content_type text NOT NULL,
    headers      text[] NOT NULL DEFAULT '{}',
    body         bytea NOT NULL,
    size         bigint NOT NULL CHECK (size >= 0),
    released     boolean NOT NULL DEFAULT false,
    PRIMARY KEY (registry, repo, number, delivery)
);

-- The registry's payloads held and their bytes: one row, written by every call that stores or
-- deletes a payload, last in its transaction (a conditional update keeps `bytes` within the
-- budget the call passes).
CREATE TABLE wr_payload_budget (
    registry bigint PRIMARY KEY REFERENCES wr_registries (id) ON DELETE CASCADE,
    held     bigint NOT NULL DEFAULT 0 CHECK (held >= 0),
    bytes    bigint NOT NULL DEFAULT 0 CHECK (bytes >= 0)
);
