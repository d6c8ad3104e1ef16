-- worker-registry on PostgreSQL: claims and admission (the duplicate check, the placement of a
-- target on a worker, the claim), completion and release.

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
