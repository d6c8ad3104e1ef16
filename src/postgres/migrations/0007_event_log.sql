-- worker-registry on PostgreSQL: lifecycle events for handles that cannot LISTEN.
--
-- Applied once, after 0001-0006. Schema only: the functions are in `src/postgres/functions.sql`.
--
-- Behind a pooler in transaction mode without a direct `listen_url`, a handle cannot hold the
-- session LISTEN needs; it polls this log instead (`src/postgres/poll.rs`). wr_notify writes a
-- row per event, beside the NOTIFY, only for a registry a polling handle has opened
-- (`poll_events`, set by that handle's connect and left set). `at_ms` is the server's clock (no
-- test offset): a poller re-reads the rows of the last few seconds, so that one whose transaction
-- committed after a later sequence number was read is not missed. The lease holder's sweep trims
-- the log in bounded steps.
ALTER TABLE wr_registries ADD COLUMN poll_events boolean NOT NULL DEFAULT false;

CREATE TABLE wr_events (
    registry bigint NOT NULL REFERENCES wr_registries (id) ON DELETE CASCADE,
    seq      bigserial,
    at_ms    bigint NOT NULL,
    payload  text NOT NULL,
    PRIMARY KEY (registry, seq)
);
CREATE INDEX wr_events_at ON wr_events (registry, at_ms);
