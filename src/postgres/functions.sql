-- worker-registry on PostgreSQL: the current functions, all of them, in one file.
--
-- Not a migration: `migrate.rs` applies this file after the versioned migrations (which hold the
-- schema) whenever its checksum differs from the one recorded in wr_functions, in the same
-- transaction and under the same advisory lock. Every definition is CREATE OR REPLACE; a change
-- of a function's signature drops the old one in a new migration first. (Migrations 0002-0004
-- also define functions, as they were when applied; this file replaces them all.)
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
-- Every write to a worker row sets `dirty`: the sweep versions dirty rows (wr_sweep_stamp) so
-- that replicas read only the rows changed since their snapshot (wr_snapshot_since).

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

-- Lifecycle events: NOTIFY on the registry's channel, delivered to every listener at commit, in
-- commit order. The payload is space-separated (no field contains a space):
--   created <worker> <target|->          draining <worker> <target|->
--   suspect <worker> <target|->          died <worker> <target|-> <reason>
--   stuck <worker> <target> <delivery>   released <target> <delivery>...
--   promoted <worker> <target> <delivery>
--   waiting_expired <target> <delivery> <limit ms>
-- where <target> is repo#number.
-- For a registry a polling handle opened (wr_registries.poll_events, migration 0007), each
-- event is also a row of wr_events, on the server's clock.
CREATE OR REPLACE FUNCTION wr_notify(p_reg bigint, p_payload text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('wr_events_' || p_reg, p_payload);
    IF (SELECT r.poll_events FROM wr_registries r WHERE r.id = p_reg) THEN
        INSERT INTO wr_events (registry, at_ms, payload)
        VALUES (p_reg, floor(date_part('epoch', clock_timestamp()) * 1000)::bigint, p_payload);
    END IF;
END
$$;

-- What a polling handle has not seen of the event log: the rows after p_after, and those written
-- in the last p_window ms of the server's clock (a transaction that took a sequence number and
-- committed after a later one was read), in sequence order; and the server's clock.
CREATE OR REPLACE FUNCTION wr_events_since(p_reg bigint, p_after bigint, p_window bigint)
RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_now bigint := floor(date_part('epoch', clock_timestamp()) * 1000)::bigint;
BEGIN
    RETURN jsonb_build_object(
        'now', v_now,
        'events', (SELECT coalesce(jsonb_agg(jsonb_build_array(e.seq, e.at_ms, e.payload)
                                             ORDER BY e.seq), '[]')
                     FROM wr_events e
                    WHERE e.registry = p_reg
                      AND (e.seq > p_after OR e.at_ms >= v_now - p_window)));
END
$$;

CREATE OR REPLACE FUNCTION wr_target_text(p_repo text, p_number bigint) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_repo IS NULL THEN '-' ELSE p_repo || '#' || p_number END
$$;

-- Where a claim stands at p_now: in_flight, completed, released or expired.
CREATE OR REPLACE FUNCTION wr_standing(
    p_completed bigint, p_release text, p_holder bigint, p_claimed bigint,
    p_now bigint, p_retention bigint, p_unbound bigint
) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_completed IS NOT NULL THEN
            CASE WHEN p_now - p_completed > p_retention THEN 'expired' ELSE 'completed' END
        WHEN p_release IS NOT NULL THEN 'released'
        WHEN p_holder IS NULL AND p_now - p_claimed > p_unbound THEN 'released'
        ELSE 'in_flight'
    END
$$;

-- A worker's death: its capacity slot given back, then the rest (wr_mark_dead, wr_release_dead).
-- The caller holds the worker's row lock already (wr_lock_live, wr_drain_all, the stuck step),
-- so the order is worker, capacity row, claims.
CREATE OR REPLACE FUNCTION wr_kill(
    p_reg bigint, p_id bigint, p_reason text, p_now bigint, p_keep_busy boolean
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    m record;
BEGIN
    UPDATE wr_capacity SET live = live - 1 WHERE registry = p_reg;
    SELECT * INTO m FROM wr_mark_dead(p_reg, ARRAY[p_id], ARRAY[p_reason], ARRAY[p_keep_busy], p_now);
    PERFORM wr_release_dead(p_reg, ARRAY[p_id], ARRAY[p_reason], m.o_repo);
    -- The freed slot goes to the waiting room at once (one target; nothing when nothing waits),
    -- never waiting for a lock: this transaction holds the capacity row already, so a target
    -- an admit holds is left to the sweep's catch-up.
    PERFORM wr_promote(p_reg, p_now, true, 1);
END
$$;

-- Deaths, the first half: the status of each worker in p_ids (its reason in p_reasons; busy kept
-- where p_keep_busy says) in one statement, and their 'died' events in the order of p_ids.
-- Takes no lock beyond the worker rows, which the caller holds already: a death step runs it
-- before it takes the capacity row, so that row is held for the second half only. Returns the
-- targets of the workers that had one, in the order of p_ids.
CREATE OR REPLACE FUNCTION wr_mark_dead(
    p_reg bigint, p_ids bigint[], p_reasons text[], p_keep_busy boolean[], p_now bigint,
    OUT o_repo text[], OUT o_number bigint[]
)
LANGUAGE plpgsql AS $$
DECLARE
    v_events text[];
    v_event text;
BEGIN
    WITH dead AS (
        UPDATE wr_workers w
           SET status = 'dead', dead_reason = u.reason, died_at_ms = p_now, suspect = false,
               busy = w.busy AND u.keep, dirty = true
          FROM unnest(p_ids, p_reasons, p_keep_busy) WITH ORDINALITY AS u (id, reason, keep, ord)
         WHERE w.registry = p_reg AND w.id = u.id
        RETURNING u.ord, w.id, w.repo, w.number, u.reason
    )
    SELECT array_agg('died ' || id || ' ' || wr_target_text(repo, number) || ' ' || reason
                     ORDER BY ord),
           coalesce(array_agg(repo ORDER BY ord) FILTER (WHERE repo IS NOT NULL), '{}'),
           coalesce(array_agg(number ORDER BY ord) FILTER (WHERE repo IS NOT NULL), '{}')
      INTO v_events, o_repo, o_number
      FROM dead;
    FOREACH v_event IN ARRAY coalesce(v_events, '{}') LOOP
        PERFORM wr_notify(p_reg, v_event);
    END LOOP;
END
$$;

-- Deaths, the second half, under the capacity row (every caller holds it): the release of the
-- workers' in-flight claims (the stuck tombstones they held are marked, dead_reason, for the
-- next sweep to delete; one statement on wr_claims_holder), their owners' live-worker slots
-- (p_repos: their targets' repositories), and the targets parked behind them.
CREATE OR REPLACE FUNCTION wr_release_dead(
    p_reg bigint, p_ids bigint[], p_reasons text[], p_repos text[]
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    -- Their payloads stay where they are (keyed by the pair), marked as the released copy the
    -- outbox row hands out: one index probe each, the body not rewritten.
    WITH released AS (
        UPDATE wr_claims k SET release_reason = coalesce(k.release_reason, 'worker_died'),
                               dead_reason = u.reason
          FROM unnest(p_ids, p_reasons) AS u (id, reason)
         WHERE k.registry = p_reg AND k.holder = u.id AND k.completed_at_ms IS NULL
           AND (k.release_reason IS NULL OR k.release_reason = 'stuck')
        RETURNING k.repo, k.number, k.delivery
    )
    UPDATE wr_payloads p SET released = true
      FROM released r
     WHERE p.registry = p_reg AND p.repo = r.repo AND p.number = r.number
       AND p.delivery = r.delivery AND NOT p.released;
    -- The owners' live-worker slots (rows only while max_workers_per_owner is on), one each,
    -- never below 0: under the capacity row every writer of wr_owner_live holds, so these rows
    -- never deadlock.
    IF cardinality(p_repos) > 0 THEN
        UPDATE wr_owner_live l SET live = greatest(l.live - gone.n, 0)
          FROM (SELECT wr_owner(r) AS owner, count(*) AS n
                  FROM unnest(p_repos) AS r GROUP BY 1) AS gone
         WHERE l.registry = p_reg AND l.owner = gone.owner AND l.live > 0;
        DELETE FROM wr_owner_live
         WHERE registry = p_reg AND live = 0
           AND owner IN (SELECT wr_owner(r) FROM unnest(p_repos) AS r);
    END IF;
    -- The targets parked behind them (if they drained) are first in line now, in the order of
    -- the deaths (one index probe each; the rows of one target).
    FOREACH v_id IN ARRAY p_ids LOOP
        UPDATE wr_waiting SET place = 'ready', blocker = NULL, turn = nextval('wr_turns')
         WHERE registry = p_reg AND blocker = v_id AND place = 'blocked';
    END LOOP;
END
$$;

-- Reserves a capacity slot and an id and creates a worker; NULL if max_workers are alive (or the
-- ids are exhausted: o_exhausted; or, with p_owner_cap above 0, the target's owner has that many
-- live workers: o_owner_full). The owner's row (wr_owner_live) is taken after the capacity row,
-- as a death gives both back.
CREATE OR REPLACE FUNCTION wr_create_worker(
    p_reg bigint, p_repo text, p_number bigint, p_now bigint, p_max bigint, p_owner_cap bigint,
    OUT o_id bigint, OUT o_exhausted boolean, OUT o_owner_full boolean
)
LANGUAGE plpgsql AS $$
BEGIN
    o_exhausted := false;
    o_owner_full := false;
    -- Ids count milliseconds from 2026-01-01 (1767225600000 ms since the Unix epoch), as the
    -- in-memory backend's do: the id is past both the last one handed out and the registry's
    -- clock, so an id handed out before the counter was lost or rewound (a failover to an
    -- asynchronous standby, a restore) is not handed out again, as long as ids were not handed
    -- out faster than one per millisecond on average and the server's clock did not step back.
    UPDATE wr_capacity
       SET live = live + 1,
           next_worker_id = GREATEST(next_worker_id, p_now - 1767225600000) + 1
     WHERE registry = p_reg AND live < p_max
    RETURNING next_worker_id - 1 INTO o_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- WorkerId::MAX (2^44 - 1): the id is spent, the slot given back.
    IF o_id > 17592186044415 THEN
        UPDATE wr_capacity SET live = live - 1 WHERE registry = p_reg;
        o_id := NULL;
        o_exhausted := true;
        RETURN;
    END IF;
    IF p_owner_cap > 0 AND p_repo IS NOT NULL THEN
        -- One conditional upsert: the cap holds for creations racing on any handle.
        INSERT INTO wr_owner_live AS l (registry, owner, live)
        VALUES (p_reg, wr_owner(p_repo), 1)
        ON CONFLICT (registry, owner) DO UPDATE SET live = l.live + 1
         WHERE l.live < p_owner_cap;
        IF NOT FOUND THEN
            UPDATE wr_capacity SET live = live - 1 WHERE registry = p_reg;
            o_id := NULL;
            o_owner_full := true;
            RETURN;
        END IF;
    END IF;
    INSERT INTO wr_workers (registry, id, repo, number, busy, last_beat_ms, started_ms, assignments)
    VALUES (p_reg, o_id, p_repo, p_number, p_repo IS NOT NULL, p_now, p_now,
            CASE WHEN p_repo IS NULL THEN 0 ELSE 1 END);
    PERFORM wr_notify(p_reg, 'created ' || o_id || ' ' || wr_target_text(p_repo, p_number));
END
$$;

-- Places a target: its worker while that one is active (busy, one more assignment), 'draining'
-- while it drains, otherwise a new worker if capacity allows, else 'capacity' ('owner_full' if
-- its owner is at p_owner_cap). With p_yield (the waiting room is on), a new worker is not made
-- while any target waits for capacity ('yielded': arrivals do not overtake the waiting; one
-- probe of wr_waiting_contenders, on this branch only). Holds the target's row lock from the
-- first statement to the end of the transaction.
CREATE OR REPLACE FUNCTION wr_place(
    p_reg bigint, p_repo text, p_number bigint, p_now bigint, p_max bigint,
    p_owner_cap bigint, p_yield boolean,
    OUT o_outcome text, OUT o_worker bigint, OUT o_seq bigint, OUT o_new boolean
)
LANGUAGE plpgsql AS $$
DECLARE
    v_worker bigint;
    v_found boolean := false;
    v_status text;
    v_exhausted boolean;
    v_owner_full boolean;
BEGIN
    o_new := false;
    -- Lock the target's row, creating it if it does not exist. An insert that conflicts with a
    -- concurrent one waits for it; the loop then locks the row that transaction left.
    FOR i IN 1..10 LOOP
        SELECT t.worker INTO v_worker FROM wr_targets t
         WHERE t.registry = p_reg AND t.repo = p_repo AND t.number = p_number
        FOR UPDATE;
        IF FOUND THEN
            v_found := true;
            EXIT;
        END IF;
        INSERT INTO wr_targets (registry, repo, number, worker)
        VALUES (p_reg, p_repo, p_number, NULL) ON CONFLICT DO NOTHING;
        IF FOUND THEN
            v_worker := NULL;
            v_found := true;
            EXIT;
        END IF;
    END LOOP;
    IF NOT v_found THEN
        RAISE EXCEPTION 'target % kept changing', p_repo || '#' || p_number
            USING ERRCODE = 'serialization_failure';
    END IF;

    IF v_worker IS NOT NULL THEN
        UPDATE wr_workers SET busy = true, assignments = assignments + 1, dirty = true
         WHERE registry = p_reg AND id = v_worker AND status = 'active'
        RETURNING id, assignments INTO o_worker, o_seq;
        IF FOUND THEN
            o_outcome := 'assigned';
            RETURN;
        END IF;
        SELECT status INTO v_status FROM wr_workers WHERE registry = p_reg AND id = v_worker;
        IF v_status = 'draining' THEN
            o_outcome := 'draining';
            o_worker := v_worker;
            RETURN;
        END IF;
    END IF;

    -- No worker, or a dead one: a new worker, if capacity allows (and nothing waits for it).
    IF p_yield AND EXISTS (SELECT 1 FROM wr_waiting
                            WHERE registry = p_reg AND place <> 'blocked') THEN
        DELETE FROM wr_targets WHERE registry = p_reg AND repo = p_repo AND number = p_number;
        o_outcome := 'yielded';
        o_worker := NULL;
        RETURN;
    END IF;
    SELECT c.o_id, c.o_exhausted, c.o_owner_full INTO o_worker, v_exhausted, v_owner_full
      FROM wr_create_worker(p_reg, p_repo, p_number, p_now, p_max, p_owner_cap) c;
    IF o_worker IS NULL THEN
        DELETE FROM wr_targets WHERE registry = p_reg AND repo = p_repo AND number = p_number;
        o_outcome := CASE WHEN v_owner_full THEN 'owner_full' ELSE 'capacity' END;
        RETURN;
    END IF;
    UPDATE wr_targets SET worker = o_worker
     WHERE registry = p_reg AND repo = p_repo AND number = p_number;
    o_outcome := 'assigned';
    o_seq := 1;
    o_new := true;
END
$$;

-- assign: wr_place on the registry's time (the per-owner cap as the room row says; no
-- parking: an assignment carries no delivery).
CREATE OR REPLACE FUNCTION wr_assign(
    p_reg bigint, p_repo text, p_number bigint, p_max bigint,
    OUT o_outcome text, OUT o_worker bigint, OUT o_seq bigint, OUT o_new boolean
)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT p.o_outcome, p.o_worker, p.o_seq, p.o_new INTO o_outcome, o_worker, o_seq, o_new
      FROM wr_place(p_reg, p_repo, p_number, wr_now(p_reg), p_max,
                    coalesce((SELECT m.owner_cap FROM wr_room m WHERE m.registry = p_reg), 0),
                    false) p;
END
$$;

-- Whether a duplicate's claim (in state p_state, held by p_holder) is in flight on a live worker
-- that has never heartbeated: the reply that told a router to start it may have been lost.
CREATE OR REPLACE FUNCTION wr_unstarted(p_reg bigint, p_holder bigint, p_state text)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF p_state <> 'in_flight' OR p_holder IS NULL THEN
        RETURN false;
    END IF;
    IF NOT coalesce((SELECT NOT w.beaten AND w.status <> 'dead' FROM wr_workers w
                      WHERE w.registry = p_reg AND w.id = p_holder), false) THEN
        RETURN false;
    END IF;
    -- A promoted worker's start is the promoted event's (its taker starts it, or it is offered
    -- again): a duplicate says nothing about it. (Only for a worker that never heartbeated.)
    RETURN NOT EXISTS (SELECT 1 FROM wr_released o
                        WHERE o.registry = p_reg AND o.holder = p_holder
                          AND o.reason = 'promoted');
END
$$;

-- admit: the duplicate check, the placement and the claim, in one transaction.
--   'duplicate' with the holder, since, state and o_unstarted of the claim that blocks the pair
--              (state 'waiting', no holder, since its parking: the pair is parked);
--   'assigned' with the worker, token sequence and whether it is new;
--   'waiting' with o_position and why it was refused (o_reason: 'capacity', 'owner_full' or
--             'draining' with o_worker), when the waiting room is on (p_max_waiting > 0);
--   'capacity' / 'owner_full' / 'draining' (no claim left behind);
--   'payload_budget' with o_held, the bytes held as the check read them (nothing placed).
-- With the room off and no owner cap, the work is what it was before the room existed, plus one
-- probe of wr_payloads by the pair on the way to a new claim (a released copy is freed).
-- A payload (p_body not NULL, its metadata in p_event .. p_headers, its Payload::size p_size)
-- is checked against p_budget after the duplicate checks (a parked pair's too) and before the
-- placement, crediting the released copy of the same pair, and stored with the claim or the
-- parked delivery (wr_payload_put).
CREATE OR REPLACE FUNCTION wr_admit(
    p_reg bigint, p_repo text, p_number bigint, p_delivery text,
    p_max bigint, p_retention bigint, p_unbound bigint,
    p_owner_cap bigint, p_max_waiting bigint, p_per_owner bigint,
    p_event text, p_action text, p_ctype text, p_headers text[], p_body bytea, p_size bigint,
    p_budget bigint,
    OUT o_outcome text, OUT o_worker bigint, OUT o_seq bigint, OUT o_new boolean,
    OUT o_since bigint, OUT o_state text, OUT o_unstarted boolean,
    OUT o_position bigint, OUT o_reason text, OUT o_held bigint
)
LANGUAGE plpgsql AS $$
DECLARE
    v_now bigint;
    c record;
    v_put boolean;
    v_park record;
BEGIN
    -- A redelivery (the common case of a repeated pair) is this one statement: the registry's
    -- time (wr_now, inlined) and one primary-key lookup of the claim, no lock, no write.
    SELECT floor(date_part('epoch', clock_timestamp()) * 1000)::bigint + r.test_offset_ms
               AS now_ms,
           k.holder, k.claimed_at_ms, k.completed_at_ms, k.release_reason
      INTO c
      FROM wr_registries r
      LEFT JOIN wr_claims k
        ON k.registry = r.id AND k.repo = p_repo AND k.number = p_number
       AND k.delivery = p_delivery
     WHERE r.id = p_reg;
    v_now := c.now_ms;
    IF c.claimed_at_ms IS NOT NULL THEN
        o_state := wr_standing(c.completed_at_ms, c.release_reason, c.holder, c.claimed_at_ms,
                               v_now, p_retention, p_unbound);
        IF o_state IN ('in_flight', 'completed') THEN
            o_outcome := 'duplicate';
            o_worker := c.holder;
            o_since := c.claimed_at_ms;
            o_unstarted := wr_unstarted(p_reg, c.holder, o_state);
            RETURN;
        END IF;
        o_state := NULL;
    END IF;
    IF p_body IS NOT NULL THEN
        -- A parked pair is a duplicate whatever the budget says (as wr_park would answer).
        o_since := wr_parked_since(p_reg, p_repo, p_number, p_delivery);
        IF o_since IS NOT NULL THEN
            o_outcome := 'duplicate';
            o_state := 'waiting';
            o_unstarted := false;
            RETURN;
        END IF;
        -- The budget, read without a lock (wr_payload_put re-checks it under the row's lock).
        SELECT b.bytes INTO o_held FROM wr_payload_budget b WHERE b.registry = p_reg;
        IF coalesce(o_held, 0) + p_size
           - coalesce((SELECT y.size FROM wr_payloads y
                        WHERE y.registry = p_reg AND y.repo = p_repo AND y.number = p_number
                          AND y.delivery = p_delivery), 0) > p_budget THEN
            o_outcome := 'payload_budget';
            o_held := coalesce(o_held, 0);
            RETURN;
        END IF;
    END IF;

    SELECT p.o_outcome, p.o_worker, p.o_seq, p.o_new INTO o_outcome, o_worker, o_seq, o_new
      FROM wr_place(p_reg, p_repo, p_number, v_now, p_max, p_owner_cap, p_max_waiting > 0) p;
    IF o_outcome <> 'assigned' AND p_max_waiting > 0 THEN
        -- The refusal branch with the room on: parked, a waiting duplicate, or (the room full)
        -- the refusal; refused only because others wait for capacity, placed after all if
        -- capacity allows (as in memory).
        SELECT * INTO v_park FROM wr_park(p_reg, p_repo, p_number, p_delivery, v_now,
                                     CASE WHEN o_outcome = 'draining' THEN o_worker END,
                                     p_max_waiting, p_per_owner);
        IF v_park.o_outcome = 'waiting' THEN
            o_reason := CASE WHEN o_outcome = 'yielded' THEN 'capacity' ELSE o_outcome END;
            o_outcome := 'waiting';
            o_position := v_park.o_position;
            o_seq := NULL;
            PERFORM wr_payload_put(p_reg, p_repo, p_number, p_delivery, p_event, p_action,
                                   p_ctype, p_headers, p_body, p_size, p_budget);
            RETURN;
        ELSIF v_park.o_outcome = 'duplicate' THEN
            o_outcome := 'duplicate';
            o_worker := NULL;
            o_seq := NULL;
            o_since := v_park.o_since;
            o_state := 'waiting';
            o_unstarted := false;
            RETURN;
        ELSIF o_outcome = 'yielded' THEN
            SELECT p.o_outcome, p.o_worker, p.o_seq, p.o_new
              INTO o_outcome, o_worker, o_seq, o_new
              FROM wr_place(p_reg, p_repo, p_number, v_now, p_max, p_owner_cap, false) p;
        END IF;
    END IF;
    IF o_outcome <> 'assigned' THEN
        RETURN;
    END IF;

    -- The claim: new, or replacing the released or expired one read above (wr_replace_claim
    -- locks it, and takes a completed one off the retained count). A claim in the way (the same
    -- pair admitted concurrently and committed first, or one that appeared since the read)
    -- means: undo everything and retry, which then answers 'duplicate' or replaces it.
    IF c.claimed_at_ms IS NULL THEN
        INSERT INTO wr_claims (registry, repo, number, delivery, holder, claimed_at_ms)
        VALUES (p_reg, p_repo, p_number, p_delivery, o_worker, v_now)
        ON CONFLICT DO NOTHING;
        v_put := FOUND;
    ELSE
        v_put := wr_replace_claim(p_reg, p_repo, p_number, p_delivery, o_worker, v_now,
                                  p_retention, p_unbound);
    END IF;
    IF NOT v_put THEN
        RAISE EXCEPTION 'delivery % on % was admitted concurrently', p_delivery,
            p_repo || '#' || p_number USING ERRCODE = 'serialization_failure';
    END IF;
    PERFORM wr_payload_put(p_reg, p_repo, p_number, p_delivery, p_event, p_action, p_ctype,
                           p_headers, p_body, p_size, p_budget);
END
$$;

-- ---------------------------------------------------------------------------------------------
-- Payloads (migration 0009; the design in `docs::postgres`, "Payloads"): one wr_payloads row per
-- pair with work left, and the registry's count in wr_payload_budget, which every call that
-- stores or deletes one writes as the last lock of its transaction (after the payload row).
-- ---------------------------------------------------------------------------------------------

-- Stores the payload admitted with a pair (p_body NULL: none; a released copy the pair still
-- had is deleted), in the transaction that claimed or parked it, and moves the count. The
-- budget is a conditional update: past p_budget (a concurrent admit took the room since this
-- one's check), serialization_failure undoes the admission and its retry is refused at the check.
CREATE OR REPLACE FUNCTION wr_payload_put(
    p_reg bigint, p_repo text, p_number bigint, p_delivery text, p_event text, p_action text,
    p_ctype text, p_headers text[], p_body bytea, p_size bigint, p_budget bigint
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_old bigint;
BEGIN
    IF p_body IS NULL THEN
        DELETE FROM wr_payloads
         WHERE registry = p_reg AND repo = p_repo AND number = p_number
           AND delivery = p_delivery
        RETURNING size INTO v_old;
        IF FOUND THEN
            UPDATE wr_payload_budget SET held = held - 1, bytes = bytes - v_old
             WHERE registry = p_reg;
        END IF;
        RETURN;
    END IF;
    SELECT size INTO v_old FROM wr_payloads
     WHERE registry = p_reg AND repo = p_repo AND number = p_number AND delivery = p_delivery
    FOR UPDATE;
    INSERT INTO wr_payloads AS y (registry, repo, number, delivery, event, action, content_type,
                                  headers, body, size, released)
    VALUES (p_reg, p_repo, p_number, p_delivery, p_event, p_action, p_ctype, p_headers, p_body,
            p_size, false)
    ON CONFLICT (registry, repo, number, delivery) DO UPDATE
       SET event = excluded.event, action = excluded.action,
           content_type = excluded.content_type, headers = excluded.headers,
           body = excluded.body, size = excluded.size, released = false;
    UPDATE wr_payload_budget
       SET held = held + CASE WHEN v_old IS NULL THEN 1 ELSE 0 END,
           bytes = bytes + p_size - coalesce(v_old, 0)
     WHERE registry = p_reg AND bytes + p_size - coalesce(v_old, 0) <= p_budget;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the payload budget was taken concurrently'
            USING ERRCODE = 'serialization_failure';
    END IF;
END
$$;

-- Deletes the payloads of the given pairs (only released copies if p_released_only) and moves
-- the count. One index probe per pair.
CREATE OR REPLACE FUNCTION wr_payload_drop(
    p_reg bigint, p_repo text[], p_number bigint[], p_delivery text[], p_released_only boolean
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_n bigint;
    v_bytes bigint;
BEGIN
    WITH gone AS (
        DELETE FROM wr_payloads y
         USING unnest(p_repo, p_number, p_delivery) AS u (repo, number, delivery)
         WHERE y.registry = p_reg AND y.repo = u.repo AND y.number = u.number
           AND y.delivery = u.delivery AND (y.released OR NOT p_released_only)
        RETURNING y.size
    )
    SELECT count(*), coalesce(sum(size), 0) INTO v_n, v_bytes FROM gone;
    IF v_n > 0 THEN
        UPDATE wr_payload_budget SET held = held - v_n, bytes = bytes - v_bytes
         WHERE registry = p_reg;
    END IF;
END
$$;

-- A pair's payload as the outbox hands it out (jsonb, the body in base64), or NULL.
CREATE OR REPLACE FUNCTION wr_payload_json(p_reg bigint, p_repo text, p_number bigint,
                                           p_delivery text) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('event', y.event, 'action', y.action,
                              'content_type', y.content_type, 'headers', to_jsonb(y.headers),
                              'body', translate(encode(y.body, 'base64'), E'\n', ''))
      FROM wr_payloads y
     WHERE y.registry = p_reg AND y.repo = p_repo AND y.number = p_number
       AND y.delivery = p_delivery
$$;

-- payload: the pair's payload (in flight, parked, or the released copy), one primary-key read.
CREATE OR REPLACE FUNCTION wr_payload(p_reg bigint, p_repo text, p_number bigint,
                                      p_delivery text,
                                      OUT o_event text, OUT o_action text, OUT o_ctype text,
                                      OUT o_headers text[], OUT o_body bytea)
LANGUAGE sql STABLE AS $$
    SELECT y.event, y.action, y.content_type, y.headers, y.body
      FROM wr_payloads y
     WHERE y.registry = p_reg AND y.repo = p_repo AND y.number = p_number
       AND y.delivery = p_delivery
$$;

-- ---------------------------------------------------------------------------------------------
-- The waiting room (migration 0008; the design in `docs::postgres`). Lock order, the same as
-- the rest: target -> capacity row -> owner's live row -> waiting rows -> claims / outbox ->
-- owner's waiting row -> room row. A death (worker -> capacity row -> ...) promotes into the
-- slot it freed, taking the target's row and any other worker's row with SKIP LOCKED only, so
-- it never waits for an admit that waits for the capacity row it holds; what it skips the
-- sweep's catch-up promotes, each step its own transaction.
-- ---------------------------------------------------------------------------------------------

-- The repository owner a target counts against: the part of the repository before the slash.
CREATE OR REPLACE FUNCTION wr_owner(p_repo text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN strpos(p_repo, '/') > 0 THEN split_part(p_repo, '/', 1) ELSE p_repo END
$$;

-- The room's settings, as this handle's configuration says (every connect writes them: the
-- call that frees a slot promotes with them).
CREATE OR REPLACE FUNCTION wr_room_open(
    p_reg bigint, p_max bigint, p_owner_cap bigint, p_retention bigint, p_unbound bigint
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO wr_room AS m (registry, max_workers, owner_cap, retention, unbound)
    VALUES (p_reg, p_max, p_owner_cap, p_retention, p_unbound)
    ON CONFLICT (registry) DO UPDATE
       SET max_workers = excluded.max_workers, owner_cap = excluded.owner_cap,
           retention = excluded.retention, unbound = excluded.unbound
     WHERE (m.max_workers, m.owner_cap, m.retention, m.unbound)
           IS DISTINCT FROM (excluded.max_workers, excluded.owner_cap, excluded.retention,
                             excluded.unbound);
END
$$;

-- When the pair was parked, if it waits in the room (one probe of wr_waiting_pair), else NULL.
CREATE OR REPLACE FUNCTION wr_parked_since(p_reg bigint, p_repo text, p_number bigint,
                                           p_delivery text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT w.parked_at_ms FROM wr_waiting w
     WHERE w.registry = p_reg AND w.repo = p_repo AND w.number = p_number
       AND w.delivery = p_delivery
$$;

-- Parks a refused delivery (the caller holds its target's row): 'waiting' with its position
-- (the deliveries waiting, itself included), 'duplicate' (the pair waits already, since
-- o_since), or 'full' (the room, or the owner's share of it). It joins its target's queue if the
-- target waits already; else it waits behind p_blocker (the target's draining worker, share-
-- locked so that its death, which moves the rows behind it, is not missed; dead already: first
-- in line), else for capacity in its owner's queue (its owner goes to the back of the
-- round-robin if it had no target queued). Both bounds are conditional updates of one row each.
CREATE OR REPLACE FUNCTION wr_park(
    p_reg bigint, p_repo text, p_number bigint, p_delivery text, p_now bigint,
    p_blocker bigint, p_max_waiting bigint, p_per_owner bigint,
    OUT o_outcome text, OUT o_position bigint, OUT o_since bigint
)
LANGUAGE plpgsql AS $$
DECLARE
    v_owner text := wr_owner(p_repo);
    v_place text;
    v_blocker bigint;
    v_turn bigint;
    v_status text;
    v_first boolean;
BEGIN
    SELECT parked_at_ms INTO o_since FROM wr_waiting
     WHERE registry = p_reg AND repo = p_repo AND number = p_number AND delivery = p_delivery;
    IF FOUND THEN
        o_outcome := 'duplicate';
        RETURN;
    END IF;
    SELECT place, blocker, turn INTO v_place, v_blocker, v_turn FROM wr_waiting
     WHERE registry = p_reg AND repo = p_repo AND number = p_number ORDER BY seq LIMIT 1;
    IF NOT FOUND THEN
        IF p_blocker IS NOT NULL THEN
            SELECT status INTO v_status FROM wr_workers
             WHERE registry = p_reg AND id = p_blocker FOR SHARE;
            IF v_status IS DISTINCT FROM 'dead' THEN
                v_place := 'blocked';
                v_blocker := p_blocker;
            ELSE
                v_place := 'ready';
                v_turn := nextval('wr_turns');
            END IF;
        ELSE
            v_place := 'queued';
        END IF;
    END IF;
    v_first := v_place = 'queued' AND NOT EXISTS (
        SELECT 1 FROM wr_waiting
         WHERE registry = p_reg AND owner = v_owner AND place = 'queued');
    INSERT INTO wr_owner_waiting AS o (registry, owner, waiting, turn)
    VALUES (p_reg, v_owner, 1, nextval('wr_turns'))
    ON CONFLICT (registry, owner) DO UPDATE
       SET waiting = o.waiting + 1,
           turn = CASE WHEN v_first THEN excluded.turn ELSE o.turn END
     WHERE o.waiting < p_per_owner;
    IF NOT FOUND THEN
        o_outcome := 'full';
        RETURN;
    END IF;
    UPDATE wr_room SET waiting = waiting + 1
     WHERE registry = p_reg AND waiting < p_max_waiting
    RETURNING waiting INTO o_position;
    IF NOT FOUND THEN
        PERFORM wr_owner_unpark(p_reg, v_owner, 1);
        o_outcome := 'full';
        RETURN;
    END IF;
    INSERT INTO wr_waiting (registry, repo, number, delivery, owner, parked_at_ms, place,
                            blocker, turn)
    VALUES (p_reg, p_repo, p_number, p_delivery, v_owner, p_now, v_place, v_blocker, v_turn);
    IF v_place <> 'blocked' THEN
        -- The placement's refusal deleted the target's row: a waiting target keeps one, which
        -- its promotion locks without waiting.
        INSERT INTO wr_targets (registry, repo, number, worker)
        VALUES (p_reg, p_repo, p_number, NULL) ON CONFLICT DO NOTHING;
    END IF;
    o_outcome := 'waiting';
END
$$;

-- p_n of the owner's waiting deliveries left (promoted, expired, or not parked after all).
CREATE OR REPLACE FUNCTION wr_owner_unpark(p_reg bigint, p_owner text, p_n integer)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE wr_owner_waiting SET waiting = greatest(waiting - p_n, 0)
     WHERE registry = p_reg AND owner = p_owner;
    DELETE FROM wr_owner_waiting WHERE registry = p_reg AND owner = p_owner AND waiting = 0;
END
$$;

-- Marks a waiting target as waiting behind its draining worker p_worker (found by a promotion
-- that was refused 'draining'); false if that worker's row is locked and p_nowait (the caller
-- leaves the target to the sweep). Dead by now: first in line instead.
CREATE OR REPLACE FUNCTION wr_block(
    p_reg bigint, p_repo text, p_number bigint, p_worker bigint, p_nowait boolean
) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_status text;
BEGIN
    IF p_nowait THEN
        SELECT status INTO v_status FROM wr_workers
         WHERE registry = p_reg AND id = p_worker FOR SHARE SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN false;
        END IF;
    ELSE
        SELECT status INTO v_status FROM wr_workers
         WHERE registry = p_reg AND id = p_worker FOR SHARE;
    END IF;
    IF v_status IS DISTINCT FROM 'dead' THEN
        UPDATE wr_waiting SET place = 'blocked', blocker = p_worker, turn = NULL
         WHERE registry = p_reg AND repo = p_repo AND number = p_number;
    ELSE
        UPDATE wr_waiting SET place = 'ready', blocker = NULL, turn = nextval('wr_turns')
         WHERE registry = p_reg AND repo = p_repo AND number = p_number;
    END IF;
    RETURN true;
END
$$;

-- Promotion: at most p_targets waiting targets placed, each with all of its waiting deliveries
-- in arrival order, onto one worker: first the targets whose draining worker died (in the order
-- of the deaths), then one target per owner in turn (the owner with the lowest turn among those
-- with a target queued and below the per-owner cap; serving it moves its turn to the back), each
-- owner's targets in arrival order. Stops when capacity is full, when nothing fits, or (with
-- p_nowait, inside a call that holds the capacity row) at a target or worker row another
-- transaction holds. Each promoted delivery is claimed on its worker, announced ('promoted'),
-- and put in the outbox (reason 'promoted', with its assignment) for one sweep caller to take,
-- acknowledged like a released event and offered again after release_ack_timeout. A target
-- that turns out to drain waits behind its worker. Bounded: p_targets targets, each with at
-- most max_waiting_per_owner deliveries; the candidate queries read the room's indexes, at
-- most one row per owner waiting.
CREATE OR REPLACE FUNCTION wr_promote(p_reg bigint, p_now bigint, p_nowait boolean,
                                      p_targets integer)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    m wr_room%ROWTYPE;
    v_repo text;
    v_number bigint;
    v_place text;
    v_owner text;
    v_done integer := 0;
    v_promoted integer := 0;
    v_left integer;
    v_stop text := 'none';
    v_live bigint;
    v_put boolean;
    v_state text;
    q record;
    p record;
    k wr_claims%ROWTYPE;
BEGIN
    SELECT * INTO m FROM wr_room WHERE registry = p_reg;
    IF NOT FOUND OR m.waiting = 0 THEN
        RETURN jsonb_build_object('promoted', 0, 'more', false);
    END IF;
    WHILE v_done < p_targets LOOP
        SELECT live INTO v_live FROM wr_capacity WHERE registry = p_reg;
        IF v_live >= m.max_workers THEN
            v_stop := 'full';
            EXIT;
        END IF;
        v_repo := NULL;
        SELECT w.repo, w.number, w.place, w.owner INTO v_repo, v_number, v_place, v_owner
          FROM wr_waiting w
         WHERE w.registry = p_reg AND w.place = 'ready'
           AND (m.owner_cap = 0 OR coalesce((SELECT l.live FROM wr_owner_live l
                                              WHERE l.registry = p_reg AND l.owner = w.owner),
                                             0) < m.owner_cap)
         ORDER BY w.turn, w.seq LIMIT 1;
        IF v_repo IS NULL THEN
            SELECT c.repo, c.number, c.place, o.owner INTO v_repo, v_number, v_place, v_owner
              FROM wr_owner_waiting o
             CROSS JOIN LATERAL (
                SELECT w.repo, w.number, w.place FROM wr_waiting w
                 WHERE w.registry = p_reg AND w.owner = o.owner AND w.place = 'queued'
                 ORDER BY w.seq LIMIT 1) c
             WHERE o.registry = p_reg
               AND (m.owner_cap = 0 OR coalesce((SELECT l.live FROM wr_owner_live l
                                                  WHERE l.registry = p_reg
                                                    AND l.owner = o.owner), 0) < m.owner_cap)
             ORDER BY o.turn LIMIT 1;
        END IF;
        IF v_repo IS NULL THEN
            v_stop := 'none';
            EXIT;
        END IF;
        -- The target's row first, as an admit takes it; without waiting if this transaction
        -- holds the capacity row (an admit holding the target may be waiting for it).
        IF p_nowait THEN
            PERFORM 1 FROM wr_targets
             WHERE registry = p_reg AND repo = v_repo AND number = v_number
               FOR UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                v_stop := 'busy';
                EXIT;
            END IF;
        END IF;
        v_left := 0;
        FOR q IN SELECT w.seq, w.delivery FROM wr_waiting w
                  WHERE w.registry = p_reg AND w.repo = v_repo AND w.number = v_number
                  ORDER BY w.seq FOR UPDATE SKIP LOCKED LOOP
            -- A pair claimed meanwhile (a bare claim) is left to that claim.
            SELECT * INTO k FROM wr_claims
             WHERE registry = p_reg AND repo = v_repo AND number = v_number
               AND delivery = q.delivery;
            v_state := CASE WHEN FOUND THEN
                           wr_standing(k.completed_at_ms, k.release_reason, k.holder,
                                       k.claimed_at_ms, p_now, m.retention, m.unbound)
                       END;
            IF v_state IN ('in_flight', 'completed') THEN
                DELETE FROM wr_waiting WHERE registry = p_reg AND seq = q.seq;
                v_left := v_left + 1;
                CONTINUE;
            END IF;
            SELECT * INTO p FROM wr_place(p_reg, v_repo, v_number, p_now, m.max_workers,
                                          m.owner_cap, false);
            IF p.o_outcome = 'draining' THEN
                IF NOT wr_block(p_reg, v_repo, v_number, p.o_worker, p_nowait) THEN
                    v_stop := 'busy';
                END IF;
                EXIT;
            ELSIF p.o_outcome <> 'assigned' THEN
                -- Full after all (an owner at its cap, a slot taken meanwhile): the target
                -- keeps waiting, and its row.
                INSERT INTO wr_targets (registry, repo, number, worker)
                VALUES (p_reg, v_repo, v_number, NULL) ON CONFLICT DO NOTHING;
                v_stop := 'full';
                EXIT;
            END IF;
            IF v_state IS NULL THEN
                INSERT INTO wr_claims (registry, repo, number, delivery, holder, claimed_at_ms)
                VALUES (p_reg, v_repo, v_number, q.delivery, p.o_worker, p_now)
                ON CONFLICT DO NOTHING;
                v_put := FOUND;
            ELSE
                v_put := wr_replace_claim(p_reg, v_repo, v_number, q.delivery, p.o_worker,
                                          p_now, m.retention, m.unbound);
            END IF;
            DELETE FROM wr_waiting WHERE registry = p_reg AND seq = q.seq;
            v_left := v_left + 1;
            IF v_put THEN
                INSERT INTO wr_released (registry, repo, number, delivery, holder, reason,
                                         released_at_ms, assign_seq, assign_new)
                VALUES (p_reg, v_repo, v_number, q.delivery, p.o_worker, 'promoted', p_now,
                        p.o_seq, p.o_new);
                PERFORM wr_notify(p_reg, 'promoted ' || p.o_worker || ' '
                                         || wr_target_text(v_repo, v_number) || ' '
                                         || q.delivery);
                v_promoted := v_promoted + 1;
            END IF;
        END LOOP;
        IF v_left > 0 THEN
            IF v_place = 'queued' THEN
                -- Served: to the back of the round-robin.
                UPDATE wr_owner_waiting SET turn = nextval('wr_turns')
                 WHERE registry = p_reg AND owner = v_owner;
            END IF;
            PERFORM wr_owner_unpark(p_reg, v_owner, v_left);
            UPDATE wr_room SET waiting = greatest(waiting - v_left, 0) WHERE registry = p_reg;
            m.waiting := m.waiting - v_left;
        END IF;
        v_done := v_done + 1;
        IF v_stop <> 'none' OR m.waiting <= 0 THEN
            EXIT;
        END IF;
    END LOOP;
    RETURN jsonb_build_object('promoted', v_promoted,
                              'more', v_stop = 'none' AND v_done >= p_targets);
END
$$;

-- One step of expiry (the lease holder's): at most p_step deliveries parked at or before
-- p_now - p_max_wait, oldest first, SKIP LOCKED (a row a promotion holds is its), dropped,
-- announced ('waiting_expired <target> <delivery> <limit ms>'), the owners' and the room's
-- counts moved (owners in name order), and the rows of targets left with nothing waiting and
-- no worker deleted. Returns them, and whether the step was full.
CREATE OR REPLACE FUNCTION wr_sweep_expire_waiting(
    p_reg bigint, p_replica text, p_now bigint, p_max_wait bigint, p_step integer
) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_rows jsonb;
    v_n integer;
    r record;
BEGIN
    IF NOT wr_holds_lease(p_reg, p_replica) THEN
        RETURN jsonb_build_object('expired', '[]'::jsonb, 'more', false);
    END IF;
    WITH gone AS (
        DELETE FROM wr_waiting
         WHERE (registry, seq) IN (
            SELECT registry, seq FROM wr_waiting
             WHERE registry = p_reg AND parked_at_ms <= p_now - p_max_wait
             ORDER BY parked_at_ms, seq LIMIT p_step FOR UPDATE SKIP LOCKED)
        RETURNING seq, repo, number, delivery, owner, parked_at_ms)
    SELECT coalesce(jsonb_agg(jsonb_build_array(repo, number, delivery, parked_at_ms, owner)
                              ORDER BY seq), '[]'), count(*)
      INTO v_rows, v_n FROM gone;
    IF v_n = 0 THEN
        RETURN jsonb_build_object('expired', v_rows, 'more', false);
    END IF;
    FOR r IN SELECT x->>4 AS owner, count(*)::integer AS n
               FROM jsonb_array_elements(v_rows) x GROUP BY 1 ORDER BY (x->>4) COLLATE "C" LOOP
        PERFORM wr_owner_unpark(p_reg, r.owner, r.n);
    END LOOP;
    UPDATE wr_room SET waiting = greatest(waiting - v_n, 0) WHERE registry = p_reg;
    -- Their payloads go with them.
    PERFORM wr_payload_drop(p_reg, array_agg(x->>0), array_agg((x->>1)::bigint),
                            array_agg(x->>2), false)
       FROM jsonb_array_elements(v_rows) x;
    FOR r IN SELECT x->>0 AS repo, (x->>1)::bigint AS number, x->>2 AS delivery
               FROM jsonb_array_elements(v_rows) x LOOP
        PERFORM wr_notify(p_reg, 'waiting_expired ' || wr_target_text(r.repo, r.number) || ' '
                                 || r.delivery || ' ' || p_max_wait);
    END LOOP;
    DELETE FROM wr_targets
     WHERE (registry, repo, number) IN (
        SELECT t.registry, t.repo, t.number FROM wr_targets t
          JOIN (SELECT DISTINCT x->>0 AS repo, (x->>1)::bigint AS number
                  FROM jsonb_array_elements(v_rows) x) u
            ON t.registry = p_reg AND t.repo = u.repo AND t.number = u.number
         WHERE t.worker IS NULL
           AND NOT EXISTS (SELECT 1 FROM wr_waiting q
                            WHERE q.registry = p_reg AND q.repo = t.repo
                              AND q.number = t.number)
           FOR UPDATE OF t SKIP LOCKED);
    RETURN jsonb_build_object('expired', v_rows, 'more', v_n >= p_step);
END
$$;

-- One step of the catch-up promotion (the lease holder's): wr_promote of at most p_targets
-- targets, in a transaction of its own that takes the target's row first (waiting for it, as
-- an admit would).
CREATE OR REPLACE FUNCTION wr_sweep_promote(
    p_reg bigint, p_replica text, p_now bigint, p_targets integer
) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT wr_holds_lease(p_reg, p_replica) THEN
        RETURN jsonb_build_object('promoted', 0, 'more', false);
    END IF;
    RETURN wr_promote(p_reg, p_now, false, p_targets);
END
$$;

-- claim: a bare claim (no worker), unless the pair is claimed or parked: 'claimed', or
-- 'duplicate' as admit answers it (a parked pair: state 'waiting', no holder, since its parking,
-- and the parked delivery left as it is; one index probe of wr_waiting_pair, only on the way to
-- a new claim).
CREATE OR REPLACE FUNCTION wr_claim(
    p_reg bigint, p_repo text, p_number bigint, p_delivery text,
    p_retention bigint, p_unbound bigint,
    OUT o_outcome text, OUT o_worker bigint, OUT o_since bigint, OUT o_state text,
    OUT o_unstarted boolean
)
LANGUAGE plpgsql AS $$
DECLARE
    v_now bigint := wr_now(p_reg);
    c wr_claims%ROWTYPE;
BEGIN
    FOR i IN 1..10 LOOP
        SELECT * INTO c FROM wr_claims
         WHERE registry = p_reg AND repo = p_repo AND number = p_number AND delivery = p_delivery;
        IF FOUND THEN
            o_state := wr_standing(c.completed_at_ms, c.release_reason, c.holder,
                                   c.claimed_at_ms, v_now, p_retention, p_unbound);
            IF o_state IN ('in_flight', 'completed') THEN
                o_outcome := 'duplicate';
                o_worker := c.holder;
                o_since := c.claimed_at_ms;
                o_unstarted := wr_unstarted(p_reg, c.holder, o_state);
                RETURN;
            END IF;
            o_state := NULL;
        END IF;
        -- Parked (admit's duplicate check, in admit's order: the claim, then the room).
        o_since := wr_parked_since(p_reg, p_repo, p_number, p_delivery);
        IF o_since IS NOT NULL THEN
            o_outcome := 'duplicate';
            o_state := 'waiting';
            o_unstarted := false;
            RETURN;
        END IF;
        IF c.claimed_at_ms IS NOT NULL THEN
            -- Released or expired: replaced (a completed one leaves the retained count).
            IF wr_replace_claim(p_reg, p_repo, p_number, p_delivery, NULL, v_now,
                                p_retention, p_unbound) THEN
                o_outcome := 'claimed';
                RETURN;
            END IF;
        ELSE
            INSERT INTO wr_claims (registry, repo, number, delivery, holder, claimed_at_ms)
            VALUES (p_reg, p_repo, p_number, p_delivery, NULL, v_now)
            ON CONFLICT DO NOTHING;
            IF FOUND THEN
                o_outcome := 'claimed';
                RETURN;
            END IF;
        END IF;
        -- Claimed concurrently (and committed): read it again.
    END LOOP;
    RAISE EXCEPTION 'claim % on % kept changing', p_delivery, p_repo || '#' || p_number
        USING ERRCODE = 'serialization_failure';
END
$$;

-- release: removes a claim that is not completed. 'ok', 'unknown' or 'completed'.
-- A completed claim whose retention ended is forgotten, as for claim and complete: 'unknown'
-- (the sweep deletes and counts it).
CREATE OR REPLACE FUNCTION wr_release(
    p_reg bigint, p_repo text, p_number bigint, p_delivery text, p_retention bigint
)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_done bigint;
BEGIN
    DELETE FROM wr_claims
     WHERE registry = p_reg AND repo = p_repo AND number = p_number AND delivery = p_delivery
       AND completed_at_ms IS NULL;
    IF FOUND THEN
        PERFORM wr_payload_drop(p_reg, ARRAY[p_repo], ARRAY[p_number], ARRAY[p_delivery],
                                false);
        RETURN 'ok';
    END IF;
    SELECT completed_at_ms INTO v_done FROM wr_claims
     WHERE registry = p_reg AND repo = p_repo AND number = p_number AND delivery = p_delivery;
    IF NOT FOUND OR wr_now(p_reg) - v_done > p_retention THEN
        RETURN 'unknown';
    END IF;
    RETURN 'completed';
END
$$;

-- complete / complete_by (p_by NOT NULL: only that holder may complete).
--   'completed' (now), 'already' (idempotent), 'unknown', 'not_holder' (o_holder),
--   'released' (o_holder, o_reason, o_dead_reason).
CREATE OR REPLACE FUNCTION wr_complete(
    p_reg bigint, p_repo text, p_number bigint, p_delivery text, p_by bigint,
    p_retention bigint, p_unbound bigint,
    OUT o_outcome text, OUT o_holder bigint, OUT o_reason text, OUT o_dead_reason text
)
LANGUAGE plpgsql AS $$
DECLARE
    v_now bigint := wr_now(p_reg);
    c wr_claims%ROWTYPE;
BEGIN
    SELECT * INTO c FROM wr_claims
     WHERE registry = p_reg AND repo = p_repo AND number = p_number AND delivery = p_delivery
    FOR UPDATE;
    IF NOT FOUND THEN
        o_outcome := 'unknown';
        RETURN;
    END IF;
    o_holder := c.holder;
    IF p_by IS NOT NULL AND c.holder IS DISTINCT FROM p_by THEN
        o_outcome := 'not_holder';
        RETURN;
    END IF;
    CASE wr_standing(c.completed_at_ms, c.release_reason, c.holder, c.claimed_at_ms,
                     v_now, p_retention, p_unbound)
        WHEN 'completed' THEN
            o_outcome := 'already';
        WHEN 'in_flight' THEN
            UPDATE wr_claims SET completed_at_ms = v_now
             WHERE registry = p_reg AND repo = p_repo AND number = p_number
               AND delivery = p_delivery;
            PERFORM wr_retained_add(p_reg, 1);
            -- The work is done: the payload goes (a retained claim keeps ids only).
            PERFORM wr_payload_drop(p_reg, ARRAY[p_repo], ARRAY[p_number], ARRAY[p_delivery],
                                    false);
            o_outcome := 'completed';
        WHEN 'released' THEN
            o_outcome := 'released';
            o_reason := coalesce(c.release_reason, 'unbound');
            o_dead_reason := c.dead_reason;
        ELSE
            o_outcome := 'unknown';
    END CASE;
END
$$;

-- heartbeat: 'active' / 'draining', or 'refused_dead' (o_reason) / 'unknown'.
CREATE OR REPLACE FUNCTION wr_heartbeat(p_reg bigint, p_id bigint, OUT o_outcome text, OUT o_reason text)
LANGUAGE plpgsql AS $$
BEGIN
    -- The registry's time is wr_now's expression, inlined (this is a hot path).
    UPDATE wr_workers
       SET last_beat_ms = greatest(last_beat_ms,
               (SELECT floor(date_part('epoch', clock_timestamp()) * 1000)::bigint + r.test_offset_ms
                  FROM wr_registries r WHERE r.id = p_reg)),
           beaten = true, suspect = false, dirty = true
     WHERE registry = p_reg AND id = p_id AND status <> 'dead'
    RETURNING status INTO o_outcome;
    IF FOUND THEN
        RETURN;
    END IF;
    SELECT 'refused_dead', w.dead_reason INTO o_outcome, o_reason
      FROM wr_workers w WHERE w.registry = p_reg AND w.id = p_id;
    IF NOT FOUND THEN
        o_outcome := 'unknown';
    END IF;
END
$$;

-- Locks a worker for a transition: its row, or 'unknown' / 'refused_dead' (o_reason) in
-- o_refused.
CREATE OR REPLACE FUNCTION wr_lock_live(p_reg bigint, p_id bigint, OUT w wr_workers, OUT o_refused text,
                             OUT o_reason text)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT * INTO w FROM wr_workers WHERE registry = p_reg AND id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        o_refused := 'unknown';
    ELSIF w.status = 'dead' THEN
        o_refused := 'refused_dead';
        o_reason := w.dead_reason;
    END IF;
END
$$;

-- loop_started: busy. The status, or 'refused_dead' (o_reason) / 'unknown'.
CREATE OR REPLACE FUNCTION wr_loop_started(p_reg bigint, p_id bigint, OUT o_outcome text, OUT o_reason text)
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE wr_workers SET busy = true, dirty = true
     WHERE registry = p_reg AND id = p_id AND status <> 'dead'
    RETURNING status INTO o_outcome;
    IF FOUND THEN
        RETURN;
    END IF;
    SELECT 'refused_dead', w.dead_reason INTO o_outcome, o_reason
      FROM wr_workers w WHERE w.registry = p_reg AND w.id = p_id;
    IF NOT FOUND THEN
        o_outcome := 'unknown';
    END IF;
END
$$;

-- loop_finished: an active worker becomes idle ('active'); a draining one exits ('dead',
-- 'exited'). Refused: 'refused_dead' (o_reason) / 'unknown'.
CREATE OR REPLACE FUNCTION wr_loop_finished(p_reg bigint, p_id bigint, OUT o_outcome text, OUT o_reason text)
LANGUAGE plpgsql AS $$
DECLARE
    l record;
BEGIN
    SELECT * INTO l FROM wr_lock_live(p_reg, p_id);
    IF l.o_refused IS NOT NULL THEN
        o_outcome := l.o_refused;
        o_reason := l.o_reason;
        RETURN;
    END IF;
    IF (l.w).status = 'active' THEN
        UPDATE wr_workers SET busy = false, dirty = true WHERE registry = p_reg AND id = p_id;
        o_outcome := 'active';
    ELSE
        PERFORM wr_kill(p_reg, p_id, 'exited', wr_now(p_reg), false);
        o_outcome := 'dead';
        o_reason := 'exited';
    END IF;
END
$$;

-- Drains a live worker whose row the caller has locked: 'draining' (busy, or already draining;
-- the earlier deadline kept) or 'exited' (it was idle).
CREATE OR REPLACE FUNCTION wr_drain_locked(p_reg bigint, w wr_workers, p_deadline bigint, p_now bigint)
RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    IF w.status = 'draining' OR w.busy THEN
        UPDATE wr_workers
           SET status = 'draining', drain_deadline_ms = least(drain_deadline_ms, p_now + p_deadline),
               dirty = true
         WHERE registry = p_reg AND id = w.id;
        IF w.status = 'active' THEN
            PERFORM wr_notify(p_reg, 'draining ' || w.id || ' ' || wr_target_text(w.repo, w.number));
        END IF;
        RETURN 'draining';
    END IF;
    PERFORM wr_kill(p_reg, w.id, 'exited', p_now, false);
    RETURN 'exited';
END
$$;

-- drain_within: 'draining' / 'exited', or 'refused_dead' (o_reason) / 'unknown'.
CREATE OR REPLACE FUNCTION wr_drain(p_reg bigint, p_id bigint, p_deadline bigint,
                         OUT o_outcome text, OUT o_reason text)
LANGUAGE plpgsql AS $$
DECLARE
    l record;
BEGIN
    SELECT * INTO l FROM wr_lock_live(p_reg, p_id);
    IF l.o_refused IS NOT NULL THEN
        o_outcome := l.o_refused;
        o_reason := l.o_reason;
        RETURN;
    END IF;
    o_outcome := wr_drain_locked(p_reg, l.w, p_deadline, wr_now(p_reg));
END
$$;

-- drain_all_within: every live worker, locked in one statement (by id) before any is changed.
CREATE OR REPLACE FUNCTION wr_drain_all(p_reg bigint, p_deadline bigint,
                             OUT o_draining integer, OUT o_exited integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_now bigint := wr_now(p_reg);
    v_ids bigint[];
    w wr_workers%ROWTYPE;
BEGIN
    o_draining := 0;
    o_exited := 0;
    SELECT coalesce(array_agg(id ORDER BY id), '{}') INTO v_ids FROM (
        SELECT id FROM wr_workers WHERE registry = p_reg AND status <> 'dead'
         ORDER BY id FOR UPDATE) locked;
    FOR w IN SELECT * FROM wr_workers WHERE registry = p_reg AND id = ANY (v_ids)
              AND status <> 'dead' ORDER BY id LOOP
        IF wr_drain_locked(p_reg, w, p_deadline, v_now) = 'draining' THEN
            o_draining := o_draining + 1;
        ELSE
            o_exited := o_exited + 1;
        END IF;
    END LOOP;
END
$$;

-- register: a worker with no target. Its id, or 'capacity' / 'exhausted' in o_refused.
CREATE OR REPLACE FUNCTION wr_register(p_reg bigint, p_max bigint, OUT o_id bigint, OUT o_refused text)
LANGUAGE plpgsql AS $$
DECLARE
    v_exhausted boolean;
BEGIN
    SELECT c.o_id, c.o_exhausted INTO o_id, v_exhausted
      FROM wr_create_worker(p_reg, NULL, NULL, wr_now(p_reg), p_max, 0) c;
    IF o_id IS NULL THEN
        o_refused := CASE WHEN v_exhausted THEN 'exhausted' ELSE 'capacity' END;
    END IF;
END
$$;

-- deregister: the death reason ('deregistered' if it was active, 'exited' if draining), or
-- 'refused_dead' (o_reason) / 'unknown' in o_refused.
CREATE OR REPLACE FUNCTION wr_deregister(p_reg bigint, p_id bigint, OUT o_reason text, OUT o_refused text)
LANGUAGE plpgsql AS $$
DECLARE
    l record;
BEGIN
    SELECT * INTO l FROM wr_lock_live(p_reg, p_id);
    IF l.o_refused IS NOT NULL THEN
        o_refused := l.o_refused;
        o_reason := l.o_reason;
        RETURN;
    END IF;
    o_reason := CASE WHEN (l.w).status = 'draining' THEN 'exited' ELSE 'deregistered' END;
    PERFORM wr_kill(p_reg, p_id, o_reason, wr_now(p_reg), false);
END
$$;

-- ---------------------------------------------------------------------------------------------
-- The sweep, in bounded steps. The client (`src/postgres/maintain.rs`) calls these one after
-- another, each one statement in autocommit, so each step is its own short transaction and
-- other calls interleave between them; no step does work proportional to the registry:
--   wr_sweep_begin     the maintenance lease (take, renew, or skip), the stall rule, the brake;
--   wr_sweep_retain    one step of retention, eviction and purge;
--   wr_sweep_release   one step of releases: bare claims past the timeout, claims of workers
--                      that died in other calls into the outbox, stuck tombstones whose holder
--                      died;
--   wr_sweep_deaths    one step of liveness: at most p_step candidates locked, judged, killed,
--                      their deliveries moved to the outbox and claimed for the caller;
--   wr_sweep_stuck     one step of stuck deliveries (and the in-flight gauge when done);
--   wr_sweep_stamp     one step of versioning the worker rows changed since the last snapshot;
--   wr_sweep_publish   the new snapshot version and the TargetReleased events;
--   wr_sweep_finish    (after the last death step) a stuck step, the publish and the holder's
--                      collect, in one transaction;
--   wr_sweep_collect   (every replica) its share of the outbox;
--   wr_snapshot_since  (every replica) the worker rows changed since its version.
-- Only the lease holder does the maintenance steps; each re-checks the lease (one row) first, so
-- a replica whose lease was taken over stops at its next step.
-- ---------------------------------------------------------------------------------------------

-- Whether p_replica holds the registry's maintenance lease.
CREATE OR REPLACE FUNCTION wr_holds_lease(p_reg bigint, p_replica text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM wr_leases WHERE registry = p_reg AND holder = p_replica)
$$;

-- The lease and what the sweep decides once: taken (free, lapsed on the registry's time, or
-- ours already, then renewed) or not ('swept' false: the caller skips to collecting). The
-- holder then runs the stall rule (memory's StallWatch::begin: measure, record, forget) and
-- decides the brake: whether more than p_brake_fraction of the live workers are stale now. The
-- count stops at the first worker over that fraction (a read of the silent-workers index, no
-- lock).
CREATE OR REPLACE FUNCTION wr_sweep_begin(
    p_reg bigint, p_replica text, p_lease_ttl bigint, p_interval bigint, p_horizon bigint,
    p_timeout bigint, p_grace bigint, p_brake_fraction double precision, p_brake_min bigint
) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_now bigint := wr_now(p_reg);
    v_last bigint;
    v_starts bigint[] := '{}';
    v_ends bigint[] := '{}';
    v_stall_start bigint;
    v_stall_len bigint := 0;
    v_keep integer;
    v_later bigint;
    v_live integer;
    v_cut bigint;
    v_stale bigint := 0;
    v_brake boolean := false;
BEGIN
    UPDATE wr_leases SET holder = p_replica, expires_at_ms = v_now + p_lease_ttl
     WHERE registry = p_reg
       AND (holder IS NULL OR holder = p_replica OR expires_at_ms <= v_now);
    IF NOT FOUND THEN
        INSERT INTO wr_leases (registry, holder, expires_at_ms)
        VALUES (p_reg, p_replica, v_now + p_lease_ttl) ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN
            RETURN jsonb_build_object('swept', false, 'now', v_now, 'stall_ms', 0,
                                      'brake', false);
        END IF;
    END IF;

    SELECT s.last_sweep_ms, s.starts_ms, s.ends_ms INTO v_last, v_starts, v_ends
      FROM wr_stalls s WHERE s.registry = p_reg FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO wr_stalls (registry) VALUES (p_reg) ON CONFLICT DO NOTHING;
        v_starts := '{}';
        v_ends := '{}';
    END IF;
    IF v_last IS NOT NULL THEN
        IF v_now - v_last > 2 * p_interval THEN
            v_stall_start := v_last + p_interval;
            v_stall_len := v_now - v_stall_start;
            IF cardinality(v_starts) >= 64 THEN
                v_starts := v_starts[2:cardinality(v_starts)];
                v_ends := v_ends[2:cardinality(v_ends)];
            END IF;
            v_starts := v_starts || v_stall_start;
            v_ends := v_ends || v_now;
        END IF;
        -- Forget the stalls nothing still judged can be based before: the first kept is the
        -- oldest that ended at most p_horizon of running time ago.
        v_keep := cardinality(v_starts) + 1;
        v_later := 0;
        FOR i IN REVERSE cardinality(v_starts)..1 LOOP
            IF v_now - v_ends[i] - v_later <= p_horizon THEN
                v_keep := i;
            END IF;
            v_later := v_later + (v_ends[i] - v_starts[i]);
        END LOOP;
        v_starts := v_starts[v_keep:cardinality(v_starts)];
        v_ends := v_ends[v_keep:cardinality(v_ends)];
    END IF;
    UPDATE wr_stalls
       SET last_sweep_ms = greatest(coalesce(last_sweep_ms, v_now), v_now),
           starts_ms = v_starts, ends_ms = v_ends
     WHERE registry = p_reg;
    IF v_stall_len > 0 THEN
        -- A draining worker could not report its loop's end while the registry did not run: a
        -- deadline still ahead when the stall began moves out by its length. (Only in the sweep
        -- that measures a stall; proportional to the draining workers, skipping busy rows.)
        UPDATE wr_workers SET drain_deadline_ms = drain_deadline_ms + v_stall_len, dirty = true
         WHERE registry = p_reg AND status = 'draining'
           AND drain_deadline_ms > v_stall_start;
    END IF;

    v_cut := wr_run_cutoff(v_starts, v_ends, v_now, p_timeout);
    SELECT live INTO v_live FROM wr_capacity WHERE registry = p_reg;
    IF v_live >= p_brake_min THEN
        SELECT count(*) INTO v_stale FROM (
            SELECT 1 FROM wr_workers w
             WHERE w.registry = p_reg AND w.status <> 'dead' AND w.last_beat_ms < v_cut
               AND NOT (w.status = 'draining' AND w.drain_deadline_ms < v_now)
               AND wr_ran(v_starts, v_ends, w.last_beat_ms, v_now)
                   > p_timeout + (CASE WHEN w.beaten THEN 0 ELSE p_grace END)
             LIMIT floor(p_brake_fraction * v_live)::bigint + 1) s;
        v_brake := v_stale > p_brake_fraction * v_live;
    END IF;
    RETURN jsonb_build_object('swept', true, 'now', v_now, 'stall_ms', v_stall_len,
                              'brake', v_brake);
END
$$;

-- One step of liveness, at the sweep's instant p_now. Phase 'silent': live workers silent past
-- the cut-off, in (last_beat_ms, id) order after the cursor (p_after_beat, p_after_id); phase
-- 'overdue': draining workers past their deadline. At most p_step rows, locked FOR UPDATE SKIP
-- LOCKED (a row busy with a heartbeat is judged by the next sweep), judged as memory judges
-- them, then: the suspicions, the deaths' worker rows and events (wr_mark_dead, one statement for
-- the step), the capacity slots given back in one update, the rest of the deaths
-- (wr_release_dead), the dead workers' target rows dropped (SKIP LOCKED: a row an admit holds is
-- that admit's to replace). Lock order: workers, capacity row, claims (as wr_kill); the capacity
-- row is held only for the second half of this step's deaths, from its update to the commit.
CREATE OR REPLACE FUNCTION wr_sweep_deaths(
    p_reg bigint, p_replica text, p_now bigint, p_phase text, p_brake boolean,
    p_after_beat bigint, p_after_id bigint, p_step integer,
    p_timeout bigint, p_grace bigint, p_suspect_grace bigint
) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_starts bigint[];
    v_ends bigint[];
    v_cut bigint;
    w wr_workers%ROWTYPE;
    v_kill bigint[] := '{}';
    v_over bigint[] := '{}';
    v_susp bigint[] := '{}';
    v_held boolean := false;
    v_scanned integer := 0;
    v_last_beat bigint := p_after_beat;
    v_last_id bigint := p_after_id;
    v_died jsonb := '[]';
    v_repo text[] := '{}';
    v_number bigint[] := '{}';
    v_id bigint;
    v_n integer;
    v_dead bigint[];
    v_reasons text[];
    v_events jsonb;
BEGIN
    IF NOT wr_holds_lease(p_reg, p_replica) THEN
        RETURN jsonb_build_object('scanned', 0, 'last_beat', v_last_beat, 'last_id', v_last_id,
                                  'died', v_died, 'suspected', '[]'::jsonb, 'held', false,
                                  'targets', '[]'::jsonb, 'events', '[]'::jsonb,
                                  'lost_lease', true);
    END IF;
    SELECT s.starts_ms, s.ends_ms INTO v_starts, v_ends FROM wr_stalls s WHERE s.registry = p_reg;
    v_starts := coalesce(v_starts, '{}');
    v_ends := coalesce(v_ends, '{}');
    v_cut := wr_run_cutoff(v_starts, v_ends, p_now, p_timeout);

    IF p_phase = 'silent' THEN
        FOR w IN SELECT * FROM wr_workers
                  WHERE registry = p_reg AND status <> 'dead' AND last_beat_ms < v_cut
                    AND (last_beat_ms, id) > (p_after_beat, p_after_id)
                  ORDER BY last_beat_ms, id LIMIT p_step FOR UPDATE SKIP LOCKED LOOP
            v_scanned := v_scanned + 1;
            v_last_beat := w.last_beat_ms;
            v_last_id := w.id;
            IF w.status = 'draining' AND w.drain_deadline_ms < p_now THEN
                v_over := v_over || w.id;
            ELSIF wr_ran(v_starts, v_ends, w.last_beat_ms, p_now)
                  > p_timeout + (CASE WHEN w.beaten THEN 0 ELSE p_grace END) THEN
                -- Stale. A worker already suspect is judged by its own suspect grace only.
                IF w.suspect AND w.suspect_since_ms IS NOT NULL
                   AND wr_ran(v_starts, v_ends, w.suspect_since_ms, p_now) < p_suspect_grace THEN
                    v_held := true;
                ELSIF p_brake AND NOT w.suspect THEN
                    v_susp := v_susp || w.id;
                ELSE
                    v_kill := v_kill || w.id;
                END IF;
            END IF;
        END LOOP;
    ELSE
        -- Drains past their deadline die whatever the brake says; they leave this range as
        -- they die, so no cursor is needed.
        FOR w IN SELECT * FROM wr_workers
                  WHERE registry = p_reg AND status = 'draining' AND drain_deadline_ms < p_now
                  ORDER BY drain_deadline_ms, id LIMIT p_step FOR UPDATE SKIP LOCKED LOOP
            v_scanned := v_scanned + 1;
            v_over := v_over || w.id;
        END LOOP;
    END IF;

    FOREACH v_id IN ARRAY v_susp LOOP
        UPDATE wr_workers SET suspect = true, suspect_since_ms = p_now, dirty = true
         WHERE registry = p_reg AND id = v_id
        RETURNING * INTO w;
        PERFORM wr_notify(p_reg, 'suspect ' || v_id || ' ' || wr_target_text(w.repo, w.number));
    END LOOP;
    v_dead := v_kill || v_over;
    v_n := cardinality(v_dead);
    IF v_n > 0 THEN
        v_reasons := array_fill('missed_heartbeats'::text, ARRAY[cardinality(v_kill)])
                     || array_fill('drain_timed_out'::text, ARRAY[cardinality(v_over)]);
        -- The worker rows (locked above) and the events first, then the capacity row, held
        -- from here to the commit: for the claims, the owners' slots, the targets and the
        -- outbox move only.
        SELECT m.o_repo, m.o_number INTO v_repo, v_number
          FROM wr_mark_dead(p_reg, v_dead, v_reasons,
                            array_fill(true, ARRAY[cardinality(v_kill)])
                            || array_fill(false, ARRAY[cardinality(v_over)]), p_now) m;
        UPDATE wr_capacity SET live = live - v_n WHERE registry = p_reg;
        PERFORM wr_release_dead(p_reg, v_dead, v_reasons, v_repo);
        SELECT coalesce(jsonb_agg(jsonb_build_array(d, r) ORDER BY i), '[]') INTO v_died
          FROM unnest(v_dead, v_reasons) WITH ORDINALITY AS u (d, r, i);
    END IF;
    PERFORM wr_drop_targets(p_reg, v_repo, v_number);

    -- The dead workers' deliveries move to the outbox in the transaction that released them,
    -- claimed for this replica, which hands them out with this sweep's answer: no other call sees
    -- them released and not yet handed out. (Their rows are this step's already: wr_release_dead
    -- marked them; stuck tombstones stay for the release step.)
    WITH moved AS (
        DELETE FROM wr_claims
         WHERE registry = p_reg AND holder = ANY (v_kill || v_over)
           AND completed_at_ms IS NULL AND release_reason = 'worker_died'
        RETURNING repo, number, delivery, holder, release_reason, dead_reason
    ), outbox AS (
        INSERT INTO wr_released (registry, repo, number, delivery, holder, reason,
                                 dead_reason, released_at_ms, claimed_by, claimed_at_ms)
        SELECT p_reg, repo, number, delivery, holder, release_reason, dead_reason, p_now,
               p_replica, p_now
          FROM moved
        RETURNING id, repo, number, delivery, holder, reason, dead_reason
    )
    SELECT coalesce(jsonb_agg(to_jsonb(outbox)
                              || jsonb_build_object('payload',
                                     wr_payload_json(p_reg, outbox.repo, outbox.number,
                                                     outbox.delivery))
                              ORDER BY outbox.id), '[]') INTO v_events
      FROM outbox;

    RETURN jsonb_build_object(
        'scanned', v_scanned, 'last_beat', v_last_beat, 'last_id', v_last_id,
        'died', v_died, 'suspected', to_jsonb(v_susp), 'held', v_held,
        'targets', (SELECT coalesce(jsonb_agg(jsonb_build_array(a, b)), '[]')
                      FROM unnest(v_repo, v_number) AS u (a, b)),
        'events', v_events, 'lost_lease', false);
END
$$;

-- Drops the target rows of the given targets whose worker is dead (or gone), skipping rows an
-- admit holds (it replaces their worker itself). Never waits.
CREATE OR REPLACE FUNCTION wr_drop_targets(p_reg bigint, p_repo text[], p_number bigint[])
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF cardinality(p_repo) = 0 THEN
        RETURN;
    END IF;
    DELETE FROM wr_targets
     WHERE (registry, repo, number) IN (
        SELECT t.registry, t.repo, t.number
          FROM wr_targets t
          JOIN unnest(p_repo, p_number) AS u (repo, number)
            ON t.registry = p_reg AND t.repo = u.repo AND t.number = u.number
         WHERE NOT EXISTS (
            SELECT 1 FROM wr_workers x
             WHERE x.registry = t.registry AND x.id = t.worker AND x.status <> 'dead')
           -- A waiting target keeps its row (its promotion locks it without waiting).
           AND NOT EXISTS (
            SELECT 1 FROM wr_waiting q
             WHERE q.registry = t.registry AND q.repo = t.repo AND q.number = t.number)
           FOR UPDATE OF t SKIP LOCKED);
END
$$;

-- One step of releases: bare claims nobody completed within the heartbeat timeout are released
-- (on the clock: a bare claim is nobody's work to credit a stall to); released claims move to
-- the outbox (stuck tombstones are in it already); stuck tombstones whose holder died are
-- deleted. At most p_step rows of each, SKIP LOCKED. 'more' if any kind filled its step.
CREATE OR REPLACE FUNCTION wr_sweep_release(
    p_reg bigint, p_replica text, p_now bigint, p_timeout bigint, p_step integer
) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_unbound integer;
    v_released integer := 0;
    v_gone integer;
    v_moved jsonb;
BEGIN
    IF NOT wr_holds_lease(p_reg, p_replica) THEN
        RETURN jsonb_build_object('count', 0, 'released', '[]'::jsonb, 'more', false);
    END IF;
    UPDATE wr_claims SET release_reason = 'unbound'
     WHERE (registry, repo, number, delivery) IN (
        SELECT registry, repo, number, delivery FROM wr_claims
         WHERE registry = p_reg AND completed_at_ms IS NULL AND release_reason IS NULL
           AND holder IS NULL AND claimed_at_ms < p_now - p_timeout
         LIMIT p_step FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS v_unbound = ROW_COUNT;

    WITH moved AS (
        DELETE FROM wr_claims
         WHERE (registry, repo, number, delivery) IN (
            SELECT registry, repo, number, delivery FROM wr_claims
             WHERE registry = p_reg AND release_reason IN ('worker_died', 'unbound')
             LIMIT p_step FOR UPDATE SKIP LOCKED)
        RETURNING repo, number, delivery, holder, release_reason, dead_reason
    ), outbox AS (
        INSERT INTO wr_released (registry, repo, number, delivery, holder, reason,
                                 dead_reason, released_at_ms)
        SELECT p_reg, repo, number, delivery, holder, release_reason, dead_reason, p_now
          FROM moved
        RETURNING repo, number, delivery
    )
    SELECT count(*), coalesce(jsonb_agg(jsonb_build_array(repo, number, delivery)), '[]')
      INTO v_released, v_moved
      FROM outbox;

    DELETE FROM wr_claims
     WHERE (registry, repo, number, delivery) IN (
        SELECT registry, repo, number, delivery FROM wr_claims
         WHERE registry = p_reg AND release_reason = 'stuck' AND dead_reason IS NOT NULL
         LIMIT p_step FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS v_gone = ROW_COUNT;

    RETURN jsonb_build_object('count', v_released, 'released', v_moved,
                              'more', v_unbound >= p_step OR v_released >= p_step
                                      OR v_gone >= p_step);
END
$$;

-- One step of stuck deliveries: in flight on a live worker for longer than p_max_in_flight of
-- running time (a range on wr_claims_in_flight up to the exact cut-off), at most p_step; the
-- claim and its holder locked together, skipping rows others hold (judged next sweep). Each is
-- released into the outbox (reason 'stuck', the claim kept as a tombstone) and announced, and its
-- worker drained (busy: draining with p_drain_deadline; idle: exits). When the step is not full,
-- the in-flight gauge is counted too, before the drains (a claim released by an idle stuck
-- worker's exit is counted until the next sweep moves it, as in memory).
CREATE OR REPLACE FUNCTION wr_sweep_stuck(
    p_reg bigint, p_replica text, p_now bigint, p_timeout bigint, p_max_in_flight bigint,
    p_drain_deadline bigint, p_step integer
) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_starts bigint[];
    v_ends bigint[];
    v_cut bigint;
    v_stuck integer := 0;
    v_repo text[] := '{}';
    v_number bigint[] := '{}';
    v_delivery text[] := '{}';
    v_holder bigint[] := '{}';
    v_in_flight bigint;
    v_drained bigint[] := '{}';
    v_died jsonb := '[]';
    v_dead_repo text[] := '{}';
    v_dead_number bigint[] := '{}';
    w wr_workers%ROWTYPE;
BEGIN
    IF NOT wr_holds_lease(p_reg, p_replica) THEN
        RETURN jsonb_build_object('count', 0, 'released', '[]'::jsonb, 'in_flight', NULL,
                                  'drained', '[]'::jsonb, 'died', v_died,
                                  'targets', '[]'::jsonb);
    END IF;
    SELECT s.starts_ms, s.ends_ms INTO v_starts, v_ends FROM wr_stalls s WHERE s.registry = p_reg;
    v_cut := wr_run_cutoff(coalesce(v_starts, '{}'), coalesce(v_ends, '{}'), p_now,
                           p_max_in_flight);
    WITH picked AS (
        SELECT k.repo, k.number, k.delivery, k.holder
          FROM wr_claims k
          JOIN wr_workers x ON x.registry = k.registry AND x.id = k.holder
         WHERE k.registry = p_reg AND k.completed_at_ms IS NULL
           AND k.release_reason IS NULL AND k.holder IS NOT NULL
           AND k.claimed_at_ms < v_cut
           AND x.status <> 'dead'
         ORDER BY k.claimed_at_ms
         LIMIT p_step
           FOR UPDATE OF k, x SKIP LOCKED
    ), marked AS (
        UPDATE wr_claims k SET release_reason = 'stuck'
          FROM picked p
         WHERE k.registry = p_reg AND k.repo = p.repo AND k.number = p.number
           AND k.delivery = p.delivery
        RETURNING k.repo, k.number, k.delivery, k.holder
    ), outbox AS (
        INSERT INTO wr_released (registry, repo, number, delivery, holder, reason,
                                 dead_reason, released_at_ms)
        SELECT p_reg, repo, number, delivery, holder, 'stuck', NULL, p_now FROM marked
        RETURNING repo, number, delivery, holder
    ), copies AS (
        UPDATE wr_payloads y SET released = true
          FROM marked m
         WHERE y.registry = p_reg AND y.repo = m.repo AND y.number = m.number
           AND y.delivery = m.delivery
        RETURNING 1
    )
    SELECT count(*), coalesce(array_agg(repo), '{}'), coalesce(array_agg(number), '{}'),
           coalesce(array_agg(delivery), '{}'), coalesce(array_agg(holder), '{}')
      INTO v_stuck, v_repo, v_number, v_delivery, v_holder
      FROM outbox;
    FOR i IN 1..v_stuck LOOP
        PERFORM wr_notify(p_reg, 'stuck ' || v_holder[i] || ' '
                                 || wr_target_text(v_repo[i], v_number[i])
                                 || ' ' || v_delivery[i]);
    END LOOP;

    IF v_stuck < p_step THEN
        -- Read-only, on wr_claims_in_flight: proportional to the claims in flight.
        SELECT count(*) INTO v_in_flight FROM wr_claims
         WHERE registry = p_reg AND completed_at_ms IS NULL AND release_reason IS NULL
           AND NOT (holder IS NULL AND claimed_at_ms < p_now - p_timeout);
    END IF;

    FOR w IN SELECT * FROM wr_workers
              WHERE registry = p_reg AND id = ANY (v_holder) AND status <> 'dead'
              ORDER BY id LOOP
        IF wr_drain_locked(p_reg, w, p_drain_deadline, p_now) = 'draining' THEN
            IF w.status = 'active' THEN
                v_drained := v_drained || w.id;
            END IF;
        ELSE
            v_died := v_died || jsonb_build_array(jsonb_build_array(w.id, 'exited'));
            IF w.repo IS NOT NULL THEN
                v_dead_repo := v_dead_repo || w.repo;
                v_dead_number := v_dead_number || w.number;
            END IF;
        END IF;
    END LOOP;

    RETURN jsonb_build_object(
        'count', v_stuck,
        'released', (SELECT coalesce(jsonb_agg(jsonb_build_array(a, b, c)), '[]')
                       FROM unnest(v_repo, v_number, v_delivery) AS u (a, b, c)),
        'in_flight', v_in_flight, 'drained', to_jsonb(v_drained), 'died', v_died,
        'targets', (SELECT coalesce(jsonb_agg(jsonb_build_array(a, b)), '[]')
                      FROM unnest(v_dead_repo, v_dead_number) AS u (a, b)));
END
$$;

-- One step of retention: completed claims past their retention are forgotten, then the oldest
-- beyond max_retained_claims evicted, then dead workers past dead_retention purged (logged in
-- wr_purged under the next snapshot version, so replicas drop them from their cached snapshot;
-- their target rows dropped). At most p_step of each. The retained count is the counter's sum
-- (wr_retained, 17 rows) less this step's expiries; the sweep's stripe (-1) takes its deletions.
CREATE OR REPLACE FUNCTION wr_sweep_retain(
    p_reg bigint, p_replica text, p_now bigint, p_retention bigint, p_max_retained bigint,
    p_dead_retention bigint, p_step integer
) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_expired integer := 0;
    v_evicted integer := 0;
    v_purged integer := 0;
    v_retained bigint;
    v_next bigint;
    v_repo text[];
    v_number bigint[];
BEGIN
    IF NOT wr_holds_lease(p_reg, p_replica) THEN
        RETURN jsonb_build_object('expired', 0, 'evicted', 0, 'purged', 0, 'retained', NULL);
    END IF;
    WITH gone AS (
        DELETE FROM wr_claims
         WHERE (registry, repo, number, delivery) IN (
            SELECT registry, repo, number, delivery FROM wr_claims
             WHERE registry = p_reg AND completed_at_ms < p_now - p_retention
             ORDER BY completed_at_ms LIMIT p_step FOR UPDATE SKIP LOCKED)
        RETURNING 1)
    SELECT count(*) INTO v_expired FROM gone;
    SELECT coalesce(sum(n), 0) - v_expired INTO v_retained FROM wr_retained
     WHERE registry = p_reg;
    IF v_retained > p_max_retained THEN
        WITH gone AS (
            DELETE FROM wr_claims
             WHERE (registry, repo, number, delivery) IN (
                SELECT registry, repo, number, delivery FROM wr_claims
                 WHERE registry = p_reg AND completed_at_ms IS NOT NULL
                 ORDER BY completed_at_ms
                 LIMIT least(v_retained - p_max_retained, p_step) FOR UPDATE SKIP LOCKED)
            RETURNING 1)
        SELECT count(*) INTO v_evicted FROM gone;
        v_retained := v_retained - v_evicted;
    END IF;
    IF v_expired + v_evicted > 0 THEN
        UPDATE wr_retained SET n = n - (v_expired + v_evicted)
         WHERE registry = p_reg AND stripe = -1;
    END IF;

    -- The version the purges are logged under: the next one published. The snapshot row is
    -- share-locked, so no publish of that version commits before this step does.
    SELECT version + 1 INTO v_next FROM wr_snapshots WHERE registry = p_reg FOR SHARE;
    WITH gone AS (
        DELETE FROM wr_workers
         WHERE (registry, id) IN (
            SELECT registry, id FROM wr_workers
             WHERE registry = p_reg AND status = 'dead'
               AND died_at_ms < p_now - p_dead_retention
             ORDER BY died_at_ms LIMIT p_step FOR UPDATE SKIP LOCKED)
        RETURNING id, repo, number
    ), logged AS (
        INSERT INTO wr_purged (registry, version, id)
        SELECT p_reg, v_next, id FROM gone
        RETURNING id
    )
    SELECT (SELECT count(*) FROM logged),
           coalesce(array_agg(repo) FILTER (WHERE repo IS NOT NULL), '{}'),
           coalesce(array_agg(number) FILTER (WHERE repo IS NOT NULL), '{}')
      INTO v_purged, v_repo, v_number
      FROM gone;
    PERFORM wr_drop_targets(p_reg, v_repo, v_number);

    -- The event log of polling handles (0007) keeps 10 minutes of the server's clock: a poller
    -- away longer misses events, as a listener that was not connected does.
    DELETE FROM wr_events
     WHERE (registry, seq) IN (
        SELECT registry, seq FROM wr_events
         WHERE registry = p_reg
           AND at_ms < floor(date_part('epoch', clock_timestamp()) * 1000)::bigint - 600000
         ORDER BY at_ms LIMIT p_step);

    RETURN jsonb_build_object('expired', v_expired, 'evicted', v_evicted, 'purged', v_purged,
                              'retained', v_retained);
END
$$;

-- One step of versioning: at most p_step worker rows changed since they were last versioned
-- (dirty, on the wr_workers_dirty index) get the next snapshot version, skipping rows a call
-- holds (versioned by the next step or sweep). The snapshot row is share-locked, so the version
-- is published only after this step commits: a replica that sees version v sees every row
-- versioned v. Returns how many rows it versioned.
CREATE OR REPLACE FUNCTION wr_sweep_stamp(p_reg bigint, p_replica text, p_step integer)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_next bigint;
    v_n integer;
BEGIN
    IF NOT wr_holds_lease(p_reg, p_replica) THEN
        RETURN 0;
    END IF;
    SELECT version + 1 INTO v_next FROM wr_snapshots WHERE registry = p_reg FOR SHARE;
    UPDATE wr_workers SET version = v_next, dirty = false
     WHERE (registry, id) IN (
        SELECT registry, id FROM wr_workers
         WHERE registry = p_reg AND dirty
         LIMIT p_step FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;

-- Publishes the sweep: the last versioning step (at most p_step dirty worker rows, as
-- wr_sweep_stamp) and the next snapshot version (the gauges, the brake) if anything changed
-- (else the same version, its time moved on), in a transaction of its
-- own that locks only the snapshot row and the rows it versions; at most p_step purge-log rows older than
-- p_purge_keep versions trimmed (a replica further behind than that reloads whole); and one
-- TargetReleased per target that lost its worker or had deliveries released in this sweep
-- (NOTIFY payloads are limited to 8000 bytes: a long list goes in several events). Returns the
-- version published and how many rows it versioned (p_step: there may be more).
CREATE OR REPLACE FUNCTION wr_sweep_publish(
    p_reg bigint, p_replica text, p_now bigint, p_brake boolean, p_in_flight bigint,
    p_retained bigint, p_purge_keep bigint, p_step integer,
    p_rel_repo text[], p_rel_number bigint[], p_rel_delivery text[],
    p_dead_repo text[], p_dead_number bigint[]
) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    s wr_snapshots%ROWTYPE;
    v_version bigint;
    v_stamped integer;
    v_floor bigint;
    v_payload text;
    v_waiting bigint;
    v_payloads bigint;
    v_payload_bytes bigint;
    r record;
BEGIN
    IF NOT wr_holds_lease(p_reg, p_replica) THEN
        RETURN jsonb_build_object('version', NULL, 'stamped', 0);
    END IF;
    -- The waiting gauge: the room's count (one row, read without a lock).
    SELECT coalesce((SELECT m.waiting FROM wr_room m WHERE m.registry = p_reg), 0)
      INTO v_waiting;
    -- The payload gauges: the budget row (one row, read without a lock).
    SELECT coalesce(b.held, 0), coalesce(b.bytes, 0) INTO v_payloads, v_payload_bytes
      FROM (SELECT 1) one
      LEFT JOIN wr_payload_budget b ON b.registry = p_reg;
    -- The last versioning step (at most p_step rows) and the version, under the snapshot row's
    -- exclusive lock.
    SELECT * INTO s FROM wr_snapshots WHERE registry = p_reg FOR UPDATE;
    v_version := s.version + 1;
    UPDATE wr_workers SET version = v_version, dirty = false
     WHERE (registry, id) IN (
        SELECT registry, id FROM wr_workers
         WHERE registry = p_reg AND dirty
         LIMIT p_step FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS v_stamped = ROW_COUNT;
    -- The version moves only when something changed: a row versioned (here, or by an earlier
    -- stamp step of this sweep), a purge logged under it, a gauge or the brake. Otherwise only
    -- its time does (two index probes), and replicas re-date their copy (wr_snapshot_since).
    IF v_stamped = 0 AND s.brake_engaged = p_brake
       AND s.in_flight = coalesce(p_in_flight, s.in_flight)
       AND s.retained = coalesce(p_retained, s.retained)
       AND s.waiting = v_waiting
       AND s.payloads = v_payloads AND s.payload_bytes = v_payload_bytes
       AND NOT EXISTS (SELECT 1 FROM wr_workers
                        WHERE registry = p_reg AND version = v_version)
       AND NOT EXISTS (SELECT 1 FROM wr_purged
                        WHERE registry = p_reg AND version = v_version) THEN
        v_version := s.version;
        UPDATE wr_snapshots SET taken_at_ms = greatest(taken_at_ms, p_now)
         WHERE registry = p_reg;
    ELSE
        UPDATE wr_snapshots
           SET version = v_version, taken_at_ms = p_now, brake_engaged = p_brake,
               in_flight = coalesce(p_in_flight, in_flight),
               retained = coalesce(p_retained, retained), waiting = v_waiting,
               payloads = v_payloads, payload_bytes = v_payload_bytes
         WHERE registry = p_reg;
    END IF;

    WITH gone AS (
        DELETE FROM wr_purged
         WHERE (registry, version, id) IN (
            SELECT registry, version, id FROM wr_purged
             WHERE registry = p_reg AND version <= v_version - p_purge_keep
             ORDER BY version LIMIT p_step)
        RETURNING version)
    SELECT max(version) INTO v_floor FROM gone;
    IF v_floor IS NOT NULL THEN
        UPDATE wr_snapshots SET purge_floor = greatest(purge_floor, v_floor)
         WHERE registry = p_reg;
    END IF;

    FOR r IN SELECT u.repo, u.number,
                    array_agg(u.delivery) FILTER (WHERE u.delivery IS NOT NULL) AS ds
               FROM (SELECT unnest(p_rel_repo) AS repo, unnest(p_rel_number) AS number,
                            unnest(p_rel_delivery) AS delivery
                     UNION ALL
                     SELECT unnest(p_dead_repo), unnest(p_dead_number), NULL) u
              GROUP BY u.repo, u.number
              ORDER BY u.repo COLLATE "C", u.number LOOP
        v_payload := 'released ' || wr_target_text(r.repo, r.number);
        IF r.ds IS NOT NULL THEN
            FOR i IN 1..cardinality(r.ds) LOOP
                IF length(v_payload) + length(r.ds[i]) > 7800 THEN
                    PERFORM wr_notify(p_reg, v_payload);
                    v_payload := 'released ' || wr_target_text(r.repo, r.number);
                END IF;
                v_payload := v_payload || ' ' || r.ds[i];
            END LOOP;
        END IF;
        PERFORM wr_notify(p_reg, v_payload);
    END LOOP;
    RETURN jsonb_build_object('version', v_version, 'stamped', v_stamped);
END
$$;

-- Every replica's share of the outbox: rows unclaimed, or claimed longer than p_ack_timeout
-- ago, at most p_batch, claimed for p_replica with SKIP LOCKED; and, in the same round trip,
-- the snapshot's changes since p_known (wr_snapshot_since, defined below).
CREATE OR REPLACE FUNCTION wr_sweep_collect(
    p_reg bigint, p_replica text, p_ack_timeout bigint, p_batch integer, p_known bigint
) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_now bigint := wr_now(p_reg);
    v_events jsonb;
BEGIN
    -- A promoted delivery offered again (its first taker did not acknowledge it) says to start
    -- its worker only if that worker never heartbeated (else it runs: the delivery goes to it);
    -- if the worker died meanwhile, the row is done with: its claim was released with it, and
    -- comes back as that release.
    WITH picked AS (
        SELECT r.id, r.claimed_by IS NULL AS first,
               r.reason = 'promoted' AND r.claimed_by IS NOT NULL AS again,
               coalesce(w.status = 'dead', true) AS gone, coalesce(w.beaten, false) AS beaten
          FROM wr_released r
          LEFT JOIN wr_workers w ON w.registry = r.registry AND w.id = r.holder
         WHERE r.registry = p_reg
           AND (r.claimed_by IS NULL OR r.claimed_at_ms < v_now - p_ack_timeout)
         ORDER BY r.id LIMIT p_batch FOR UPDATE OF r SKIP LOCKED
    ), dropped AS (
        DELETE FROM wr_released o USING picked
         WHERE o.id = picked.id AND picked.again AND picked.gone
        RETURNING o.id
    ), claimed AS (
        UPDATE wr_released o
           SET claimed_by = p_replica, claimed_at_ms = v_now,
               assign_new = CASE WHEN picked.again THEN o.assign_new AND NOT picked.beaten
                                 ELSE o.assign_new END
          FROM picked WHERE o.id = picked.id AND NOT (picked.again AND picked.gone)
        RETURNING o.id, o.repo, o.number, o.delivery, o.holder, o.reason, o.dead_reason,
                  o.assign_seq, o.assign_new, picked.first
    )
    SELECT coalesce(jsonb_agg(to_jsonb(claimed)
                              || jsonb_build_object('payload',
                                     wr_payload_json(p_reg, claimed.repo, claimed.number,
                                                     claimed.delivery))
                              ORDER BY claimed.id), '[]') INTO v_events
      FROM claimed;
    RETURN jsonb_build_object('now', v_now, 'events', v_events,
                              'snapshot', wr_snapshot_since(p_reg, p_known));
END
$$;

-- What a replica whose cached snapshot is at p_known needs to reach the published one: nothing
-- but the version's time if it is current; else the snapshot's gauges and the worker rows versioned after p_known (on
-- wr_workers_version) with the ids purged since (wr_purged), or, for a replica with nothing yet
-- (p_known 0) or further behind than the purge log reaches, every worker row ('full').
CREATE OR REPLACE FUNCTION wr_snapshot_since(p_reg bigint, p_known bigint) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    s wr_snapshots%ROWTYPE;
    v_full boolean;
BEGIN
    SELECT * INTO s FROM wr_snapshots WHERE registry = p_reg;
    IF NOT FOUND OR s.version <= p_known THEN
        -- Nothing changed since p_known, as of taken_at_ms (the publish moves only the time
        -- when nothing changed): the replica re-dates its copy.
        RETURN jsonb_build_object('now', wr_now(p_reg), 'version', coalesce(s.version, 0),
                                  'changed', false, 'taken_at_ms', coalesce(s.taken_at_ms, 0));
    END IF;
    v_full := p_known <= 0 OR p_known < s.purge_floor;
    RETURN jsonb_build_object(
        'now', wr_now(p_reg), 'changed', true, 'full', v_full,
        'version', s.version, 'taken_at_ms', s.taken_at_ms, 'brake_engaged', s.brake_engaged,
        'in_flight', s.in_flight, 'retained', s.retained, 'waiting', s.waiting,
        'payloads', s.payloads, 'payload_bytes', s.payload_bytes,
        'workers', (SELECT coalesce(jsonb_agg(to_jsonb(x) - 'registry' ORDER BY x.id), '[]')
                      FROM wr_workers x
                     WHERE x.registry = p_reg
                       AND (v_full OR (x.version > p_known AND x.version <= s.version))),
        'purged', CASE WHEN v_full THEN '[]'::jsonb ELSE
                      (SELECT coalesce(jsonb_agg(g.id), '[]') FROM wr_purged g
                        WHERE g.registry = p_reg AND g.version > p_known
                          AND g.version <= s.version) END);
END
$$;


-- acknowledge: the outbox rows are done with.
CREATE OR REPLACE FUNCTION wr_acknowledge(p_reg bigint, p_ids bigint[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
    v_repo text[];
    v_number bigint[];
    v_delivery text[];
BEGIN
    WITH gone AS (
        DELETE FROM wr_released WHERE registry = p_reg AND id = ANY (p_ids)
        RETURNING repo, number, delivery
    )
    SELECT count(*), array_agg(repo), array_agg(number), array_agg(delivery)
      INTO v_n, v_repo, v_number, v_delivery FROM gone;
    -- The released copies of their payloads go with them (a pair admitted again since holds
    -- its payload as the claim's, no longer released, and keeps it).
    IF v_n > 0 THEN
        PERFORM wr_payload_drop(p_reg, v_repo, v_number, v_delivery, true);
    END IF;
    RETURN v_n;
END
$$;

-- Stalled time after p_from: the part of the recorded stalls that lies after it (memory's
-- `Stalls::since`).
CREATE OR REPLACE FUNCTION wr_stalled_after(p_starts bigint[], p_ends bigint[], p_from bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(sum(u.e - greatest(u.s, p_from)), 0)::bigint
      FROM unnest(p_starts, p_ends) AS u (s, e)
     WHERE u.e > p_from
$$;

-- How long the registry actually ran from p_from to p_now: the elapsed time less the stalled
-- time in between, never negative (memory's `judge(from, now) - from`, saturating).
CREATE OR REPLACE FUNCTION wr_ran(p_starts bigint[], p_ends bigint[], p_from bigint, p_now bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(greatest(p_now - wr_stalled_after(p_starts, p_ends, p_from),
                             least(p_from, p_now)) - p_from, 0)
$$;

-- The cut-off for a range scan: something based at t <= p_now has run for longer than p_len by
-- p_now (wr_ran > p_len) if and only if t < the result. Exact, because t + stalled_after(t) never
-- decreases as t grows (it is flat inside a stall and rises with t outside): the result is the
-- least t where it reaches p_now - p_len. Without stalls: p_now - p_len.
CREATE OR REPLACE FUNCTION wr_run_cutoff(p_starts bigint[], p_ends bigint[], p_now bigint, p_len bigint)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_k bigint := p_now - p_len;
    v_n integer := coalesce(cardinality(p_starts), 0);
    v_after bigint := 0;  -- the total length of the stalls after the gap being looked at
BEGIN
    FOR i IN 1..v_n LOOP
        v_after := v_after + (p_ends[i] - p_starts[i]);
    END LOOP;
    -- The gaps between stalls, oldest first: in the gap that ends where stall i starts,
    -- t + stalled_after(t) = t + v_after.
    FOR i IN 1..v_n LOOP
        IF v_k - v_after <= p_starts[i] THEN
            RETURN v_k - v_after;
        END IF;
        v_after := v_after - (p_ends[i] - p_starts[i]);
    END LOOP;
    RETURN v_k;
END
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

-- Puts a claim (holder p_holder, NULL for a bare one) in place of the pair's claim, which the
-- caller saw released or expired: false if that is no longer so (it is live: the caller answers
-- a duplicate or retries). The old claim is locked first, so what it was when replaced is known:
-- a completed one (expired) leaves the retained count. If it vanished meanwhile (the sweep moved
-- or expired it), a new claim is inserted; false if another transaction's is in the way.
CREATE OR REPLACE FUNCTION wr_replace_claim(
    p_reg bigint, p_repo text, p_number bigint, p_delivery text, p_holder bigint,
    p_now bigint, p_retention bigint, p_unbound bigint
) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    k wr_claims%ROWTYPE;
BEGIN
    SELECT * INTO k FROM wr_claims
     WHERE registry = p_reg AND repo = p_repo AND number = p_number AND delivery = p_delivery
    FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO wr_claims (registry, repo, number, delivery, holder, claimed_at_ms)
        VALUES (p_reg, p_repo, p_number, p_delivery, p_holder, p_now)
        ON CONFLICT DO NOTHING;
        RETURN FOUND;
    END IF;
    IF wr_standing(k.completed_at_ms, k.release_reason, k.holder, k.claimed_at_ms,
                   p_now, p_retention, p_unbound) NOT IN ('released', 'expired') THEN
        RETURN false;
    END IF;
    UPDATE wr_claims
       SET holder = p_holder, claimed_at_ms = p_now,
           completed_at_ms = NULL, release_reason = NULL, dead_reason = NULL
     WHERE registry = p_reg AND repo = p_repo AND number = p_number AND delivery = p_delivery;
    IF k.completed_at_ms IS NOT NULL THEN
        PERFORM wr_retained_add(p_reg, -1);
    END IF;
    RETURN true;
END
$$;

-- Whether a delivery is in flight past max_in_flight on a live worker at p_now (what
-- wr_sweep_stuck releases): one probe of wr_claims_in_flight up to the exact cut-off. Locked rows
-- count too, so a step that would skip them is still run.
CREATE OR REPLACE FUNCTION wr_stuck_due(p_reg bigint, p_now bigint, p_max_in_flight bigint)
RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_starts bigint[];
    v_ends bigint[];
    v_cut bigint;
BEGIN
    SELECT s.starts_ms, s.ends_ms INTO v_starts, v_ends FROM wr_stalls s WHERE s.registry = p_reg;
    v_cut := wr_run_cutoff(coalesce(v_starts, '{}'), coalesce(v_ends, '{}'), p_now,
                           p_max_in_flight);
    RETURN EXISTS (
        SELECT 1 FROM wr_claims k
          JOIN wr_workers x ON x.registry = k.registry AND x.id = k.holder
         WHERE k.registry = p_reg AND k.completed_at_ms IS NULL
           AND k.release_reason IS NULL AND k.holder IS NOT NULL
           AND k.claimed_at_ms < v_cut
           AND x.status <> 'dead');
END
$$;

-- The end of the lease holder's sweep, in one transaction, so that it answers one round trip
-- after its last death step: the in-flight gauge (a stuck step that finds nothing to release),
-- the publish (wr_sweep_publish) and the holder's outbox share and snapshot changes
-- (wr_sweep_collect). The released deliveries and dead targets of the earlier steps come as
-- p_rel_* and p_dead_*. If a delivery is stuck, it does nothing and says so ('stuck_due'): the
-- stuck steps may kill workers, which locks the capacity row every admit that creates a worker
-- needs, so they run in transactions of their own and the publish after them in its own, never
-- while the capacity row is locked.
CREATE OR REPLACE FUNCTION wr_sweep_finish(
    p_reg bigint, p_replica text, p_now bigint, p_brake boolean, p_retained bigint,
    p_timeout bigint, p_max_in_flight bigint, p_drain_deadline bigint, p_purge_keep bigint,
    p_step integer, p_ack_timeout bigint, p_batch integer, p_known bigint,
    p_rel_repo text[], p_rel_number bigint[], p_rel_delivery text[],
    p_dead_repo text[], p_dead_number bigint[]
) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_stuck jsonb;
    v_published jsonb;
    v_rel_repo text[];
    v_rel_number bigint[];
    v_rel_delivery text[];
    v_dead_repo text[];
    v_dead_number bigint[];
BEGIN
    IF wr_stuck_due(p_reg, p_now, p_max_in_flight) THEN
        RETURN jsonb_build_object('stuck_due', true);
    END IF;
    v_stuck := wr_sweep_stuck(p_reg, p_replica, p_now, p_timeout, p_max_in_flight,
                              p_drain_deadline, p_step);
    SELECT coalesce(array_agg(x->>0), '{}'), coalesce(array_agg((x->>1)::bigint), '{}'),
           coalesce(array_agg(x->>2), '{}')
      INTO v_rel_repo, v_rel_number, v_rel_delivery
      FROM jsonb_array_elements(v_stuck->'released') x;
    SELECT coalesce(array_agg(x->>0), '{}'), coalesce(array_agg((x->>1)::bigint), '{}')
      INTO v_dead_repo, v_dead_number
      FROM jsonb_array_elements(v_stuck->'targets') x;
    v_published := wr_sweep_publish(
        p_reg, p_replica, p_now, p_brake, (v_stuck->>'in_flight')::bigint, p_retained,
        p_purge_keep, p_step, p_rel_repo || v_rel_repo, p_rel_number || v_rel_number,
        p_rel_delivery || v_rel_delivery, p_dead_repo || v_dead_repo,
        p_dead_number || v_dead_number);
    RETURN jsonb_build_object('stuck', v_stuck, 'published', v_published,
                              'collected', wr_sweep_collect(p_reg, p_replica, p_ack_timeout,
                                                            p_batch, p_known));
END
$$;


-- expire released: outbox rows nobody acknowledged within claim_retention of their release
-- (their claim is gone by then: a redelivery is admitted as new anyway) are deleted, at most
-- p_batch a step (the caller runs steps until one finds less); the caller counts and logs them.
CREATE OR REPLACE FUNCTION wr_expire_released(p_reg bigint, p_now bigint, p_retention bigint,
                                              p_batch integer) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_rows jsonb;
    v_n integer;
BEGIN
    WITH gone AS (
        DELETE FROM wr_released
         WHERE id IN (SELECT id FROM wr_released
                       WHERE registry = p_reg AND released_at_ms <= p_now - p_retention
                       ORDER BY id LIMIT p_batch
                       FOR UPDATE SKIP LOCKED)
        RETURNING repo, number, delivery)
    SELECT coalesce(jsonb_agg(jsonb_build_array(repo, number, delivery)), '[]'), count(*)
      INTO v_rows, v_n FROM gone;
    -- The released copies of their payloads go with them.
    IF v_n > 0 THEN
        PERFORM wr_payload_drop(p_reg, array_agg(x->>0), array_agg((x->>1)::bigint),
                                array_agg(x->>2), true)
           FROM jsonb_array_elements(v_rows) x;
    END IF;
    RETURN jsonb_build_object('expired', v_rows, 'more', v_n = p_batch);
END
$$;
