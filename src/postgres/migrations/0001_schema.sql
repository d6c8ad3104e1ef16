-- worker-registry on PostgreSQL: the tables.
--
-- Every row belongs to one registry (wr_registries.id): several registries (pools, test runs)
-- share the tables without seeing each other. Times are integer milliseconds on the server's
-- clock since the Unix epoch, plus the registry's test offset (see wr_now in 0002). No foreign
-- keys on the hot tables: a foreign-key check would share-lock the registry row on every insert.

-- One row per registry: its name, and its settings.
CREATE TABLE wr_registries (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name           text NOT NULL UNIQUE,
    -- Test-only: milliseconds added to the server clock. Only a `testkit` build can set it.
    test_offset_ms bigint NOT NULL DEFAULT 0,
    created_at     timestamptz NOT NULL DEFAULT now()
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
    PRIMARY KEY (registry, id),
    CHECK ((repo IS NULL) = (number IS NULL)),
    CHECK ((status = 'dead') = (dead_reason IS NOT NULL))
);
-- The sweep's range queries: live workers silent for too long, drains past their deadline,
-- dead workers past their retention.
CREATE INDEX wr_workers_silent ON wr_workers (registry, last_beat_ms) WHERE status <> 'dead';
CREATE INDEX wr_workers_draining ON wr_workers (registry, drain_deadline_ms) WHERE status = 'draining';
CREATE INDEX wr_workers_dead ON wr_workers (registry, died_at_ms) WHERE status = 'dead';

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
CREATE INDEX wr_claims_released ON wr_claims (registry) WHERE release_reason IS NOT NULL;

-- The outbox of released deliveries, for re-dispatch. A sweep claims rows (claimed_by, the
-- replica; claimed_at_ms) with FOR UPDATE SKIP LOCKED; acknowledge deletes them; a row claimed
-- longer than release_ack_timeout ago is offered again, so a replica that dies loses nothing.
CREATE TABLE wr_released (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    registry       bigint NOT NULL,
    repo           text NOT NULL,
    number         bigint NOT NULL,
    delivery       text NOT NULL,
    holder         bigint,
    reason         text NOT NULL CHECK (reason IN ('worker_died', 'stuck', 'unbound')),
    dead_reason    text,
    released_at_ms bigint NOT NULL,
    claimed_by     text,
    claimed_at_ms  bigint
);
CREATE INDEX wr_released_registry ON wr_released (registry, id);

-- The status snapshot the sweeping replica publishes: one row per registry, replaced whole by
-- each sweep with a new version; every replica caches it and refreshes it when the version moved.
CREATE TABLE wr_snapshots (
    registry      bigint PRIMARY KEY REFERENCES wr_registries (id) ON DELETE CASCADE,
    version       bigint NOT NULL DEFAULT 0,
    taken_at_ms   bigint NOT NULL DEFAULT 0,
    brake_engaged boolean NOT NULL DEFAULT false,
    in_flight     bigint NOT NULL DEFAULT 0,
    retained      bigint NOT NULL DEFAULT 0,
    workers       jsonb NOT NULL DEFAULT '[]'
);
