-- worker-registry on PostgreSQL: workers (register, heartbeat, the loop, drain, deregister) and
-- their deaths (the capacity slot given back, their claims released, the targets behind them
-- promoted).

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
