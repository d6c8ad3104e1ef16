-- worker-registry on PostgreSQL: the functions every file uses (the registry's time, its row,
-- a target's text, the retained-claims counter), and what holds for all of them.
--
-- The functions are split by concern like the Redis backend's Lua library, one file each under
-- `functions/`: base, workers (register, heartbeat, deaths, drain), claims (claim, admission,
-- completion), payloads, waiting (the waiting room), sweep (the maintenance steps), snapshot
-- (versioned snapshot and events), outbox (released deliveries handed out and acknowledged).
-- Not migrations: `migrate.rs` applies all of them, in that fixed order (`FUNCTION_FILES`),
-- after the versioned migrations (which hold the schema) whenever their checksum differs from
-- the one recorded in wr_functions, in the same transaction and under the same advisory lock.
-- Every definition is CREATE OR REPLACE; a change of a function's signature drops the old one in
-- a new migration first.
--
-- Each contract call is one statement, `SELECT * FROM wr_<op>(...)`, run in autocommit: one
-- round trip, one transaction, the decision taken under the locks it needs. Refusals that belong
-- to the state machine are returned as an outcome code, never raised. A conflict that a retry
-- resolves (two admits of one new delivery racing) is raised as serialization_failure (40001),
-- which the client retries a bounded number of times, as it does deadlocks (40P01).
--
-- Lock order, the same in every function: claim -> target -> capacity row -> worker (a death:
-- worker -> capacity row -> claims -> their payload rows) -> retained-counter stripe -> payload
-- rows -> the payload-budget row (wr_payload_budget). The sweep's steps take their
-- workers first but with SKIP LOCKED (they never wait for a worker row), and the multi-worker
-- operations (drain_all) lock all their workers in one statement before anything else.
--
-- Every write to a worker row sets `dirty`: the sweep versions dirty rows (wr_sweep_stamp, in
-- snapshot.sql) so that replicas read only the rows changed since their snapshot.

-- The registry's time: the server clock in ms since the epoch, plus the test offset. (PL/pgSQL,
-- not SQL, so that its query is planned once per connection rather than on every call.)
CREATE OR REPLACE FUNCTION wr_now(p_reg bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN floor(date_part('epoch', clock_timestamp()) * 1000)::bigint
           + (SELECT r.test_offset_ms FROM wr_registries r WHERE r.id = p_reg);
END
$$;

CREATE OR REPLACE FUNCTION wr_open(p_name text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    INSERT INTO wr_registries (name) VALUES (p_name) ON CONFLICT (name) DO NOTHING;
    SELECT id INTO v_id FROM wr_registries WHERE name = p_name;
    INSERT INTO wr_capacity (registry) VALUES (v_id) ON CONFLICT DO NOTHING;
    INSERT INTO wr_snapshots (registry) VALUES (v_id) ON CONFLICT DO NOTHING;
    INSERT INTO wr_stalls (registry) VALUES (v_id) ON CONFLICT DO NOTHING;
    INSERT INTO wr_retained (registry, stripe)
    SELECT v_id, s FROM generate_series(-1, 15) AS s ON CONFLICT DO NOTHING;
    INSERT INTO wr_leases (registry) VALUES (v_id) ON CONFLICT DO NOTHING;
    INSERT INTO wr_room (registry) VALUES (v_id) ON CONFLICT DO NOTHING;
    INSERT INTO wr_payload_budget (registry) VALUES (v_id) ON CONFLICT DO NOTHING;
    RETURN v_id;
END
$$;

CREATE OR REPLACE FUNCTION wr_target_text(p_repo text, p_number bigint) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_repo IS NULL THEN '-' ELSE p_repo || '#' || p_number END
$$;

-- Moves the retained-claims counter by p_delta, on a stripe (0-15) picked at random. (The stripe
-- is picked into a variable first: random() in the WHERE clause would be drawn once per row.)
CREATE OR REPLACE FUNCTION wr_retained_add(p_reg bigint, p_delta bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_stripe smallint := floor(random() * 16)::smallint;
BEGIN
    UPDATE wr_retained SET n = n + p_delta WHERE registry = p_reg AND stripe = v_stripe;
END
$$;
