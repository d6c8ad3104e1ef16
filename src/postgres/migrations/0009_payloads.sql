-- worker-registry on PostgreSQL: payloads (what GitHub sent with a delivery), kept with the
-- delivery while it has work left, and the registry's byte count of them.
--
-- Applied once, after 0001-0008. Schema only: the functions are in `src/postgres/functions.sql`
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
INSERT INTO wr_payload_budget (registry) SELECT id FROM wr_registries ON CONFLICT DO NOTHING;

-- The snapshot's payload gauges.
ALTER TABLE wr_snapshots
    ADD COLUMN payloads bigint NOT NULL DEFAULT 0,
    ADD COLUMN payload_bytes bigint NOT NULL DEFAULT 0;

-- New signatures (functions.sql defines them again).
DROP FUNCTION IF EXISTS wr_admit(bigint, text, bigint, text, bigint, bigint, bigint, bigint,
                                 bigint, bigint);
