-- worker-registry on PostgreSQL: one function per operation.
--
-- Each contract call is one statement, `SELECT * FROM wr_<op>(...)`, run in autocommit: one
-- round trip, one transaction, the decision taken under the locks it needs. Refusals that belong
-- to the state machine are returned as an outcome code, never raised. A conflict that a retry
-- resolves (two admits of one new delivery racing) is raised as serialization_failure (40001),
-- which the client retries a bounded number of times, as it does deadlocks (40P01).
--
-- Lock order, the same in every function: claim -> target -> capacity row -> worker. The sweep
-- takes its workers first but with SKIP LOCKED (it never waits for a worker row), and the
-- multi-worker operations (drain_all) lock all their workers in one statement before anything
-- else.

-- The registry's time: the server clock in ms since the epoch, plus the test offset. (PL/pgSQL,
-- not SQL, so that its query is planned once per connection rather than on every call.)
CREATE FUNCTION wr_now(p_reg bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN floor(date_part('epoch', clock_timestamp()) * 1000)::bigint
           + (SELECT r.test_offset_ms FROM wr_registries r WHERE r.id = p_reg);
END
$$;

-- Creates the registry's rows if they do not exist; returns its id.
CREATE FUNCTION wr_open(p_name text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    INSERT INTO wr_registries (name) VALUES (p_name) ON CONFLICT (name) DO NOTHING;
    SELECT id INTO v_id FROM wr_registries WHERE name = p_name;
    INSERT INTO wr_capacity (registry) VALUES (v_id) ON CONFLICT DO NOTHING;
    INSERT INTO wr_snapshots (registry) VALUES (v_id) ON CONFLICT DO NOTHING;
    RETURN v_id;
END
$$;

-- Lifecycle events: NOTIFY on the registry's channel, delivered to every listener at commit, in
-- commit order. The payload is space-separated (no field contains a space):
--   created <worker> <target|->          draining <worker> <target|->
--   suspect <worker> <target|->          died <worker> <target|-> <reason>
--   stuck <worker> <target> <delivery>   released <target> <delivery>...
-- where <target> is repo#number.
CREATE FUNCTION wr_notify(p_reg bigint, p_payload text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('wr_events_' || p_reg, p_payload);
END
$$;

CREATE FUNCTION wr_target_text(p_repo text, p_number bigint) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_repo IS NULL THEN '-' ELSE p_repo || '#' || p_number END
$$;

-- Where a claim stands at p_now: in_flight, completed, released or expired.
CREATE FUNCTION wr_standing(
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

-- A worker's death, its row already locked by the caller: the status, the capacity slot back,
-- its in-flight claims released, the event. A death by missed heartbeats keeps the activity the
-- worker had; every other death leaves it idle.
CREATE FUNCTION wr_kill(
    p_reg bigint, p_id bigint, p_reason text, p_now bigint, p_keep_busy boolean
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_target text;
BEGIN
    UPDATE wr_workers
       SET status = 'dead', dead_reason = p_reason, died_at_ms = p_now, suspect = false,
           busy = busy AND p_keep_busy
     WHERE registry = p_reg AND id = p_id
    RETURNING wr_target_text(repo, number) INTO v_target;
    UPDATE wr_capacity SET live = live - 1 WHERE registry = p_reg;
    UPDATE wr_claims SET release_reason = 'worker_died', dead_reason = p_reason
     WHERE registry = p_reg AND holder = p_id
       AND completed_at_ms IS NULL AND release_reason IS NULL;
    PERFORM wr_notify(p_reg, 'died ' || p_id || ' ' || v_target || ' ' || p_reason);
END
$$;

-- Reserves a capacity slot and an id and creates a worker; NULL if max_workers are alive (or the
-- ids are exhausted: o_exhausted).
CREATE FUNCTION wr_create_worker(
    p_reg bigint, p_repo text, p_number bigint, p_now bigint, p_max bigint,
    OUT o_id bigint, OUT o_exhausted boolean
)
LANGUAGE plpgsql AS $$
BEGIN
    o_exhausted := false;
    UPDATE wr_capacity SET live = live + 1, next_worker_id = next_worker_id + 1
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
    INSERT INTO wr_workers (registry, id, repo, number, busy, last_beat_ms, started_ms, assignments)
    VALUES (p_reg, o_id, p_repo, p_number, p_repo IS NOT NULL, p_now, p_now,
            CASE WHEN p_repo IS NULL THEN 0 ELSE 1 END);
    PERFORM wr_notify(p_reg, 'created ' || o_id || ' ' || wr_target_text(p_repo, p_number));
END
$$;

-- Places a target: its worker while that one is active (busy, one more assignment), 'draining'
-- while it drains, otherwise a new worker if capacity allows, else 'capacity'. Holds the
-- target's row lock from the first statement to the end of the transaction.
CREATE FUNCTION wr_place(
    p_reg bigint, p_repo text, p_number bigint, p_now bigint, p_max bigint,
    OUT o_outcome text, OUT o_worker bigint, OUT o_seq bigint, OUT o_new boolean
)
LANGUAGE plpgsql AS $$
DECLARE
    v_worker bigint;
    v_found boolean := false;
    v_status text;
    v_exhausted boolean;
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
        UPDATE wr_workers SET busy = true, assignments = assignments + 1
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

    -- No worker, or a dead one: a new worker, if capacity allows.
    SELECT c.o_id, c.o_exhausted INTO o_worker, v_exhausted
      FROM wr_create_worker(p_reg, p_repo, p_number, p_now, p_max) c;
    IF o_worker IS NULL THEN
        DELETE FROM wr_targets WHERE registry = p_reg AND repo = p_repo AND number = p_number;
        o_outcome := 'capacity';
        RETURN;
    END IF;
    UPDATE wr_targets SET worker = o_worker
     WHERE registry = p_reg AND repo = p_repo AND number = p_number;
    o_outcome := 'assigned';
    o_seq := 1;
    o_new := true;
END
$$;

-- assign: wr_place on the registry's time.
CREATE FUNCTION wr_assign(
    p_reg bigint, p_repo text, p_number bigint, p_max bigint,
    OUT o_outcome text, OUT o_worker bigint, OUT o_seq bigint, OUT o_new boolean
)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT p.o_outcome, p.o_worker, p.o_seq, p.o_new INTO o_outcome, o_worker, o_seq, o_new
      FROM wr_place(p_reg, p_repo, p_number, wr_now(p_reg), p_max) p;
END
$$;

-- admit: the duplicate check, the placement and the claim, in one transaction.
--   'duplicate' with the holder, since and state of the claim that blocks the pair;
--   'assigned' with the worker, token sequence and whether it is new;
--   'capacity' / 'draining' (no claim left behind).
CREATE FUNCTION wr_admit(
    p_reg bigint, p_repo text, p_number bigint, p_delivery text,
    p_max bigint, p_retention bigint, p_unbound bigint,
    OUT o_outcome text, OUT o_worker bigint, OUT o_seq bigint, OUT o_new boolean,
    OUT o_since bigint, OUT o_state text
)
LANGUAGE plpgsql AS $$
DECLARE
    v_now bigint;
    c record;
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
            RETURN;
        END IF;
        o_state := NULL;
    END IF;

    SELECT p.o_outcome, p.o_worker, p.o_seq, p.o_new INTO o_outcome, o_worker, o_seq, o_new
      FROM wr_place(p_reg, p_repo, p_number, v_now, p_max) p;
    IF o_outcome <> 'assigned' THEN
        RETURN;
    END IF;

    -- The claim: new, or replacing a released or expired one. A live claim here means the same
    -- pair was admitted concurrently and committed first: undo everything and retry, which then
    -- answers 'duplicate'.
    INSERT INTO wr_claims AS k (registry, repo, number, delivery, holder, claimed_at_ms)
    VALUES (p_reg, p_repo, p_number, p_delivery, o_worker, v_now)
    ON CONFLICT (registry, repo, number, delivery) DO UPDATE
       SET holder = excluded.holder, claimed_at_ms = excluded.claimed_at_ms,
           completed_at_ms = NULL, release_reason = NULL, dead_reason = NULL
     WHERE wr_standing(k.completed_at_ms, k.release_reason, k.holder, k.claimed_at_ms,
                       v_now, p_retention, p_unbound) IN ('released', 'expired');
    IF NOT FOUND THEN
        RAISE EXCEPTION 'delivery % on % was admitted concurrently', p_delivery,
            p_repo || '#' || p_number USING ERRCODE = 'serialization_failure';
    END IF;
END
$$;

-- claim: a bare claim (no worker), unless the pair is claimed. 'claimed' or 'duplicate'.
CREATE FUNCTION wr_claim(
    p_reg bigint, p_repo text, p_number bigint, p_delivery text,
    p_retention bigint, p_unbound bigint,
    OUT o_outcome text, OUT o_worker bigint, OUT o_since bigint, OUT o_state text
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
                RETURN;
            END IF;
            o_state := NULL;
        END IF;
        INSERT INTO wr_claims AS k (registry, repo, number, delivery, holder, claimed_at_ms)
        VALUES (p_reg, p_repo, p_number, p_delivery, NULL, v_now)
        ON CONFLICT (registry, repo, number, delivery) DO UPDATE
           SET holder = NULL, claimed_at_ms = excluded.claimed_at_ms,
               completed_at_ms = NULL, release_reason = NULL, dead_reason = NULL
         WHERE wr_standing(k.completed_at_ms, k.release_reason, k.holder, k.claimed_at_ms,
                           v_now, p_retention, p_unbound) IN ('released', 'expired');
        IF FOUND THEN
            o_outcome := 'claimed';
            RETURN;
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
CREATE FUNCTION wr_release(
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
CREATE FUNCTION wr_complete(
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
CREATE FUNCTION wr_heartbeat(p_reg bigint, p_id bigint, OUT o_outcome text, OUT o_reason text)
LANGUAGE plpgsql AS $$
BEGIN
    -- The registry's time is wr_now's expression, inlined (this is a hot path).
    UPDATE wr_workers
       SET last_beat_ms = greatest(last_beat_ms,
               (SELECT floor(date_part('epoch', clock_timestamp()) * 1000)::bigint + r.test_offset_ms
                  FROM wr_registries r WHERE r.id = p_reg)),
           beaten = true, suspect = false
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
CREATE FUNCTION wr_lock_live(p_reg bigint, p_id bigint, OUT w wr_workers, OUT o_refused text,
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
CREATE FUNCTION wr_loop_started(p_reg bigint, p_id bigint, OUT o_outcome text, OUT o_reason text)
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE wr_workers SET busy = true
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
CREATE FUNCTION wr_loop_finished(p_reg bigint, p_id bigint, OUT o_outcome text, OUT o_reason text)
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
        UPDATE wr_workers SET busy = false WHERE registry = p_reg AND id = p_id;
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
CREATE FUNCTION wr_drain_locked(p_reg bigint, w wr_workers, p_deadline bigint, p_now bigint)
RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    IF w.status = 'draining' OR w.busy THEN
        UPDATE wr_workers
           SET status = 'draining', drain_deadline_ms = least(drain_deadline_ms, p_now + p_deadline)
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
CREATE FUNCTION wr_drain(p_reg bigint, p_id bigint, p_deadline bigint,
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
CREATE FUNCTION wr_drain_all(p_reg bigint, p_deadline bigint,
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
CREATE FUNCTION wr_register(p_reg bigint, p_max bigint, OUT o_id bigint, OUT o_refused text)
LANGUAGE plpgsql AS $$
DECLARE
    v_exhausted boolean;
BEGIN
    SELECT c.o_id, c.o_exhausted INTO o_id, v_exhausted
      FROM wr_create_worker(p_reg, NULL, NULL, wr_now(p_reg), p_max) c;
    IF o_id IS NULL THEN
        o_refused := CASE WHEN v_exhausted THEN 'exhausted' ELSE 'capacity' END;
    END IF;
END
$$;

-- deregister: the death reason ('deregistered' if it was active, 'exited' if draining), or
-- 'refused_dead' (o_reason) / 'unknown' in o_refused.
CREATE FUNCTION wr_deregister(p_reg bigint, p_id bigint, OUT o_reason text, OUT o_refused text)
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

-- The maintenance pass. Every replica calls it; the one that gets the registry's advisory lock
-- (for this transaction) does the work: liveness with the mass-staleness brake, drain deadlines,
-- release of dead workers' claims into the outbox, retention, purge, and a new snapshot. Every
-- caller then claims its share of the outbox (rows nobody claimed, or claimed longer than
-- p_ack_timeout ago) and, if the snapshot is newer than p_known_version, gets it.
-- Bounded: at most p_batch rows of each kind are released, expired, evicted, purged, claimed.
CREATE FUNCTION wr_sweep(
    p_reg bigint, p_replica text, p_known_version bigint,
    p_timeout bigint, p_grace bigint, p_retention bigint, p_max_retained bigint,
    p_dead_retention bigint, p_suspect_grace bigint, p_brake_fraction double precision,
    p_brake_min bigint, p_ack_timeout bigint, p_batch integer
) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_now bigint := wr_now(p_reg);
    v_swept boolean;
    v_live integer;
    w wr_workers%ROWTYPE;
    v_id bigint;
    v_stale bigint[] := '{}';
    v_overdue bigint[] := '{}';
    v_brake boolean;
    v_held boolean := false;
    v_died jsonb := '[]';
    v_suspected bigint[] := '{}';
    v_dead_repo text[] := '{}';
    v_dead_number bigint[] := '{}';
    v_rel_repo text[];
    v_rel_number bigint[];
    v_rel_delivery text[];
    v_released integer := 0;
    v_expired integer := 0;
    v_evicted integer := 0;
    v_purged integer := 0;
    v_retained bigint := 0;
    v_in_flight bigint := 0;
    v_payload text;
    r record;
    v_snapshot jsonb := NULL;
    v_events jsonb;
BEGIN
    v_swept := pg_try_advisory_xact_lock(1465057280, p_reg::integer);
    IF v_swept THEN
        SELECT live INTO v_live FROM wr_capacity WHERE registry = p_reg;

        -- Candidates: live workers silent longer than the timeout, draining ones past their
        -- deadline. Rows another transaction holds (a heartbeat landing now) are skipped: they
        -- are judged by the next sweep.
        FOR w IN SELECT * FROM wr_workers
                  WHERE registry = p_reg AND status <> 'dead'
                    AND (last_beat_ms < v_now - p_timeout
                         OR (status = 'draining' AND drain_deadline_ms < v_now))
                  ORDER BY id FOR UPDATE SKIP LOCKED LOOP
            IF w.status = 'draining' AND w.drain_deadline_ms < v_now THEN
                v_overdue := v_overdue || w.id;
            ELSIF v_now - w.last_beat_ms
                  > p_timeout + (CASE WHEN w.beaten THEN 0 ELSE p_grace END) THEN
                v_stale := v_stale || w.id;
            END IF;
        END LOOP;

        -- The brake: too many silent at once means suspect ourselves, not them. A worker
        -- already suspect is judged by its own suspect grace only.
        v_brake := v_live >= p_brake_min AND cardinality(v_stale) > p_brake_fraction * v_live;
        FOREACH v_id IN ARRAY v_stale LOOP
            SELECT * INTO w FROM wr_workers WHERE registry = p_reg AND id = v_id;
            IF w.suspect AND w.suspect_since_ms IS NOT NULL
               AND v_now - w.suspect_since_ms < p_suspect_grace THEN
                v_held := true;
            ELSIF v_brake AND NOT w.suspect THEN
                UPDATE wr_workers SET suspect = true, suspect_since_ms = v_now
                 WHERE registry = p_reg AND id = v_id;
                v_suspected := v_suspected || v_id;
                PERFORM wr_notify(p_reg, 'suspect ' || v_id || ' '
                                         || wr_target_text(w.repo, w.number));
            ELSE
                PERFORM wr_kill(p_reg, v_id, 'missed_heartbeats', v_now, true);
                v_died := v_died || jsonb_build_array(jsonb_build_array(v_id, 'missed_heartbeats'));
                IF w.repo IS NOT NULL THEN
                    v_dead_repo := v_dead_repo || w.repo;
                    v_dead_number := v_dead_number || w.number;
                END IF;
            END IF;
        END LOOP;
        -- Drains past their deadline die whatever the brake says.
        FOREACH v_id IN ARRAY v_overdue LOOP
            SELECT * INTO w FROM wr_workers WHERE registry = p_reg AND id = v_id;
            PERFORM wr_kill(p_reg, v_id, 'drain_timed_out', v_now, false);
            v_died := v_died || jsonb_build_array(jsonb_build_array(v_id, 'drain_timed_out'));
            IF w.repo IS NOT NULL THEN
                v_dead_repo := v_dead_repo || w.repo;
                v_dead_number := v_dead_number || w.number;
            END IF;
        END LOOP;

        -- Bare claims nobody completed within the heartbeat timeout are released.
        UPDATE wr_claims SET release_reason = 'unbound'
         WHERE (registry, repo, number, delivery) IN (
            SELECT registry, repo, number, delivery FROM wr_claims
             WHERE registry = p_reg AND completed_at_ms IS NULL AND release_reason IS NULL
               AND holder IS NULL AND claimed_at_ms < v_now - p_timeout
             LIMIT p_batch FOR UPDATE SKIP LOCKED);

        -- Released claims move to the outbox.
        WITH moved AS (
            DELETE FROM wr_claims
             WHERE (registry, repo, number, delivery) IN (
                SELECT registry, repo, number, delivery FROM wr_claims
                 WHERE registry = p_reg AND release_reason IS NOT NULL
                 LIMIT p_batch FOR UPDATE SKIP LOCKED)
            RETURNING repo, number, delivery, holder, release_reason, dead_reason
        ), outbox AS (
            INSERT INTO wr_released (registry, repo, number, delivery, holder, reason,
                                     dead_reason, released_at_ms)
            SELECT p_reg, repo, number, delivery, holder, release_reason, dead_reason, v_now
              FROM moved
            RETURNING repo, number, delivery
        )
        SELECT count(*), coalesce(array_agg(repo), '{}'), coalesce(array_agg(number), '{}'),
               coalesce(array_agg(delivery), '{}')
          INTO v_released, v_rel_repo, v_rel_number, v_rel_delivery
          FROM outbox;

        -- Completed claims past their retention are forgotten, then the oldest beyond
        -- max_retained_claims evicted.
        WITH gone AS (
            DELETE FROM wr_claims
             WHERE (registry, repo, number, delivery) IN (
                SELECT registry, repo, number, delivery FROM wr_claims
                 WHERE registry = p_reg AND completed_at_ms < v_now - p_retention
                 ORDER BY completed_at_ms LIMIT p_batch FOR UPDATE SKIP LOCKED)
            RETURNING 1)
        SELECT count(*) INTO v_expired FROM gone;
        SELECT count(*) INTO v_retained FROM wr_claims
         WHERE registry = p_reg AND completed_at_ms IS NOT NULL;
        IF v_retained > p_max_retained THEN
            WITH gone AS (
                DELETE FROM wr_claims
                 WHERE (registry, repo, number, delivery) IN (
                    SELECT registry, repo, number, delivery FROM wr_claims
                     WHERE registry = p_reg AND completed_at_ms IS NOT NULL
                     ORDER BY completed_at_ms
                     LIMIT least(v_retained - p_max_retained, p_batch) FOR UPDATE SKIP LOCKED)
                RETURNING 1)
            SELECT count(*) INTO v_evicted FROM gone;
            v_retained := v_retained - v_evicted;
        END IF;
        SELECT count(*) INTO v_in_flight FROM wr_claims
         WHERE registry = p_reg AND completed_at_ms IS NULL AND release_reason IS NULL
           AND NOT (holder IS NULL AND claimed_at_ms < v_now - p_timeout);

        -- Dead workers past their retention are purged; target rows of dead workers dropped.
        WITH gone AS (
            DELETE FROM wr_workers
             WHERE (registry, id) IN (
                SELECT registry, id FROM wr_workers
                 WHERE registry = p_reg AND status = 'dead'
                   AND died_at_ms < v_now - p_dead_retention
                 ORDER BY died_at_ms LIMIT p_batch FOR UPDATE SKIP LOCKED)
            RETURNING 1)
        SELECT count(*) INTO v_purged FROM gone;
        DELETE FROM wr_targets
         WHERE (registry, repo, number) IN (
            SELECT t.registry, t.repo, t.number FROM wr_targets t
             WHERE t.registry = p_reg AND NOT EXISTS (
                SELECT 1 FROM wr_workers x
                 WHERE x.registry = t.registry AND x.id = t.worker AND x.status <> 'dead')
             LIMIT p_batch FOR UPDATE OF t SKIP LOCKED);

        -- One TargetReleased per target that lost its worker or had deliveries released.
        FOR r IN SELECT u.repo, u.number,
                        array_agg(u.delivery) FILTER (WHERE u.delivery IS NOT NULL) AS ds
                   FROM (SELECT unnest(v_rel_repo) AS repo, unnest(v_rel_number) AS number,
                                unnest(v_rel_delivery) AS delivery
                         UNION ALL
                         SELECT unnest(v_dead_repo), unnest(v_dead_number), NULL) u
                  GROUP BY u.repo, u.number
                  ORDER BY u.repo COLLATE "C", u.number LOOP
            -- NOTIFY payloads are limited to 8000 bytes: a long list goes in several events.
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

        -- Publish the snapshot: every worker row of the registry, as one value.
        UPDATE wr_snapshots
           SET version = version + 1, taken_at_ms = v_now,
               brake_engaged = v_held OR cardinality(v_suspected) > 0,
               in_flight = v_in_flight, retained = v_retained,
               workers = (SELECT coalesce(jsonb_agg(to_jsonb(x) - 'registry' ORDER BY x.id), '[]')
                            FROM wr_workers x WHERE x.registry = p_reg)
         WHERE registry = p_reg;
    END IF;

    SELECT CASE WHEN s.version > p_known_version THEN to_jsonb(s) - 'registry' END
      INTO v_snapshot FROM wr_snapshots s WHERE s.registry = p_reg;

    -- This caller's share of the outbox.
    WITH picked AS (
        SELECT id FROM wr_released
         WHERE registry = p_reg
           AND (claimed_by IS NULL OR claimed_at_ms < v_now - p_ack_timeout)
         ORDER BY id LIMIT p_batch FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE wr_released o SET claimed_by = p_replica, claimed_at_ms = v_now
          FROM picked WHERE o.id = picked.id
        RETURNING o.id, o.repo, o.number, o.delivery, o.holder, o.reason, o.dead_reason
    )
    SELECT coalesce(jsonb_agg(to_jsonb(claimed) ORDER BY claimed.id), '[]') INTO v_events
      FROM claimed;

    RETURN jsonb_build_object(
        'swept', v_swept, 'now', v_now, 'died', v_died,
        'suspected', to_jsonb(v_suspected), 'brake_engaged', v_held OR cardinality(v_suspected) > 0,
        'released_targets', (SELECT coalesce(jsonb_agg(jsonb_build_array(a, b)), '[]')
                               FROM unnest(v_dead_repo, v_dead_number) AS u (a, b)),
        'released_count', v_released, 'expired', v_expired, 'evicted', v_evicted,
        'purged', v_purged, 'events', v_events, 'snapshot', v_snapshot);
END
$$;

-- acknowledge: the outbox rows are done with.
CREATE FUNCTION wr_acknowledge(p_reg bigint, p_ids bigint[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
BEGIN
    DELETE FROM wr_released WHERE registry = p_reg AND id = ANY (p_ids);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
