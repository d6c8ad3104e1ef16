-- worker-registry on PostgreSQL: the maintenance lease, versioned worker rows, the purge log.
--
-- Applied once, after 0001-0004. Schema only: the functions that use it are in
-- `src/postgres/functions.sql`, applied after the migrations whenever that file changes.
--
-- The maintenance lease: one row per registry naming the replica that sweeps and until when
-- (registry time, ms). A sweep takes it when it is free, lapsed, or its own (renewing it); every
-- other replica's sweep only collects its share of the outbox and the snapshot.
CREATE TABLE wr_leases (
    registry      bigint PRIMARY KEY REFERENCES wr_registries (id) ON DELETE CASCADE,
    holder        text,
    expires_at_ms bigint NOT NULL DEFAULT 0
);
INSERT INTO wr_leases (registry) SELECT id FROM wr_registries ON CONFLICT DO NOTHING;

-- Versioned worker rows: every write to a worker sets `dirty`; the sweep gives dirty rows the
-- next snapshot version (and clears `dirty`) before it publishes that version, so a replica at
-- version k reads only the rows versioned after k. (Adding columns with constant defaults
-- rewrites nothing. Existing rows start dirty: the first sweep versions them.)
ALTER TABLE wr_workers
    ADD COLUMN version bigint NOT NULL DEFAULT 0,
    ADD COLUMN dirty boolean NOT NULL DEFAULT true;
CREATE INDEX wr_workers_version ON wr_workers (registry, version);
CREATE INDEX wr_workers_dirty ON wr_workers (registry, id) WHERE dirty;

-- The purge log: a dead worker's row deleted past dead_retention, under the version that
-- publishes it, so replicas drop it from their cached snapshot. Trimmed by the sweep; a replica
-- further behind than the log reaches (its version below wr_snapshots.purge_floor) reloads the
-- worker rows whole.
CREATE TABLE wr_purged (
    registry bigint NOT NULL,
    version  bigint NOT NULL,
    id       bigint NOT NULL,
    PRIMARY KEY (registry, version, id)
);

-- The snapshot row keeps the gauges and the version; the workers are the versioned rows now,
-- no longer a jsonb copy of all of them rewritten by every sweep.
ALTER TABLE wr_snapshots
    DROP COLUMN workers,
    ADD COLUMN purge_floor bigint NOT NULL DEFAULT 0;

-- The one-statement sweep is replaced by the steps in functions.sql.
DROP FUNCTION wr_sweep(bigint, text, bigint, bigint, bigint, bigint, bigint, bigint, bigint,
                       double precision, bigint, bigint, integer, bigint, bigint, bigint, bigint);
