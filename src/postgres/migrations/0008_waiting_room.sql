-- worker-registry on PostgreSQL: the waiting room and the per-owner cap on live workers.
--
-- Applied once, after 0001-0007. Schema only: the functions are in `src/postgres/functions.sql`
-- (the design is in `docs::postgres`, "The waiting room").

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

-- A promoted delivery is handed over through the outbox, with its assignment.
ALTER TABLE wr_released DROP CONSTRAINT wr_released_reason_check;
ALTER TABLE wr_released
    ADD CONSTRAINT wr_released_reason_check
        CHECK (reason IN ('worker_died', 'stuck', 'unbound', 'promoted')),
    ADD COLUMN assign_seq bigint,
    ADD COLUMN assign_new boolean;
-- Whether a worker's start is a promoted event's (a duplicate on it is then not "unstarted").
CREATE INDEX wr_released_promoted ON wr_released (registry, holder) WHERE reason = 'promoted';

-- The snapshot's waiting gauge.
ALTER TABLE wr_snapshots ADD COLUMN waiting bigint NOT NULL DEFAULT 0;

INSERT INTO wr_room (registry) SELECT id FROM wr_registries ON CONFLICT DO NOTHING;

-- New signatures (functions.sql defines them again; on a new database the migrations run
-- before it, so some do not exist yet).
DROP FUNCTION IF EXISTS wr_admit(bigint, text, bigint, text, bigint, bigint, bigint);
DROP FUNCTION IF EXISTS wr_place(bigint, text, bigint, bigint, bigint);
DROP FUNCTION IF EXISTS wr_create_worker(bigint, text, bigint, bigint, bigint);
