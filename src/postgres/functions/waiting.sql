-- worker-registry on PostgreSQL: the waiting room.
--
-- The waiting room (the design in `docs::postgres`, "The waiting room"). Lock order, the same as
-- the rest: target -> capacity row -> owner's live row -> waiting rows -> claims / outbox ->
-- owner's waiting row -> room row. A death (worker -> capacity row -> ...) promotes into the
-- slot it freed, taking the target's row and any other worker's row with SKIP LOCKED only, so
-- it never waits for an admit that waits for the capacity row it holds; what it skips the
-- sweep's catch-up promotes, each step its own transaction.

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
