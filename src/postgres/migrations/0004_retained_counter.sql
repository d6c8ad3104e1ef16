-- worker-registry on PostgreSQL: the retained-claims counter.
--
-- Applied once, after 0001-0003. The sweep used to count the completed claims it keeps
-- (`count(*)` over wr_claims_completed: every retained claim, every sweep) to publish the gauge
-- and to decide how many to evict over max_retained_claims. Now the number is a counter moved in
-- the transaction that changes the set of completed claims, and the sweep sums it:
--   +1  wr_complete, a claim in flight becomes completed;
--   -1  wr_admit / wr_claim replacing a completed claim past its retention (a redelivery);
--   -n  wr_sweep, the claims it expires and evicts.
-- Nothing else adds or removes a completed claim: release deletes only claims not completed,
-- wr_kill and the stuck rule mark only claims not completed, and the sweep's moves to the outbox
-- and deletion of stuck tombstones take only released claims (never completed ones). No function
-- deletes a registry; if one is deleted, its counter rows go with it (ON DELETE CASCADE).
--
-- Striped, so that completions do not serialise on one row: each hot call adds to one of 16
-- stripes picked at random (stripes 0-15); the sweep, under its advisory lock, writes its own
-- stripe (-1) and reads the sum of the 17 rows. A stripe may be negative; the sum never is. A
-- stripe row is the last lock a call takes (after claim, target, capacity row, worker) and each
-- call takes one, so it adds no lock-order cycle.
CREATE TABLE wr_retained (
    registry bigint NOT NULL REFERENCES wr_registries (id) ON DELETE CASCADE,
    stripe   smallint NOT NULL CHECK (stripe BETWEEN -1 AND 15),
    n        bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (registry, stripe)
);

-- The starting value: one count of the completed claims of every existing registry, with
-- writers of wr_claims held off until this migration commits (the old functions, which do not
-- move the counter, are replaced in the same transaction).
LOCK TABLE wr_claims IN ACCESS EXCLUSIVE MODE;
INSERT INTO wr_retained (registry, stripe, n)
SELECT r.id, s.stripe,
       CASE WHEN s.stripe = -1 THEN
           (SELECT count(*) FROM wr_claims k
             WHERE k.registry = r.id AND k.completed_at_ms IS NOT NULL)
       ELSE 0 END
  FROM wr_registries r CROSS JOIN generate_series(-1, 15) AS s (stripe);

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
    RETURN v_id;
END
$$;

-- Moves the retained-claims counter by p_delta, on a stripe (0-15) picked at random. (The stripe
-- is picked into a variable first: random() in the WHERE clause would be drawn once per row.)
CREATE FUNCTION wr_retained_add(p_reg bigint, p_delta bigint) RETURNS void
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
CREATE FUNCTION wr_replace_claim(
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

-- admit: the duplicate check, the placement and the claim, in one transaction.
--   'duplicate' with the holder, since and state of the claim that blocks the pair;
--   'assigned' with the worker, token sequence and whether it is new;
--   'capacity' / 'draining' (no claim left behind).
CREATE OR REPLACE FUNCTION wr_admit(
    p_reg bigint, p_repo text, p_number bigint, p_delivery text,
    p_max bigint, p_retention bigint, p_unbound bigint,
    OUT o_outcome text, OUT o_worker bigint, OUT o_seq bigint, OUT o_new boolean,
    OUT o_since bigint, OUT o_state text
)
LANGUAGE plpgsql AS $$
DECLARE
    v_now bigint;
    c record;
    v_put boolean;
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
END
$$;

-- claim: a bare claim (no worker), unless the pair is claimed. 'claimed' or 'duplicate'.
CREATE OR REPLACE FUNCTION wr_claim(
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

-- The maintenance pass, as in 0003, except that the retained count is the counter's sum (step
-- 5), not a count of wr_claims: the sweep reads what changed, not what is kept. Same signature.
CREATE OR REPLACE FUNCTION wr_sweep(
    p_reg bigint, p_replica text, p_known_version bigint,
    p_timeout bigint, p_grace bigint, p_retention bigint, p_max_retained bigint,
    p_dead_retention bigint, p_suspect_grace bigint, p_brake_fraction double precision,
    p_brake_min bigint, p_ack_timeout bigint, p_batch integer,
    p_interval bigint, p_max_in_flight bigint, p_drain_deadline bigint, p_horizon bigint
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
    -- The stall rule.
    v_last bigint;
    v_starts bigint[] := '{}';
    v_ends bigint[] := '{}';
    v_stall_start bigint;
    v_stall_len bigint := 0;
    v_keep integer;
    v_later bigint;
    -- Stuck deliveries.
    v_stuck integer := 0;
    v_stuck_repo text[] := '{}';
    v_stuck_number bigint[] := '{}';
    v_stuck_delivery text[] := '{}';
    v_stuck_holder bigint[] := '{}';
    v_drained bigint[] := '{}';
    -- Range-scan bounds (wr_run_cutoff) for silence and for time in flight.
    v_cut_silent bigint;
    v_cut_stuck bigint;
BEGIN
    v_swept := pg_try_advisory_xact_lock(1465057280, p_reg::integer);
    IF v_swept THEN
        -- 1. The stall rule (memory's StallWatch::begin): measure, record, forget.
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
            -- Forget the stalls nothing still judged can be based before: the first kept is
            -- the oldest that ended at most p_horizon of running time ago.
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
            -- A draining worker could not report its loop's end while the registry did not
            -- run: a deadline still ahead when the stall began moves out by its length. (Only
            -- in the sweep that measures a stall; proportional to the draining workers.)
            UPDATE wr_workers SET drain_deadline_ms = drain_deadline_ms + v_stall_len
             WHERE registry = p_reg AND status = 'draining'
               AND drain_deadline_ms > v_stall_start;
        END IF;

        v_cut_silent := wr_run_cutoff(v_starts, v_ends, v_now, p_timeout);
        v_cut_stuck := wr_run_cutoff(v_starts, v_ends, v_now, p_max_in_flight);

        SELECT live INTO v_live FROM wr_capacity WHERE registry = p_reg;

        -- 2. Candidates: live workers silent for longer than the timeout of running time (the
        -- cut-off is exact), draining ones past their deadline. Rows another transaction holds
        -- (a heartbeat landing now) are skipped: they are judged by the next sweep.
        FOR w IN SELECT * FROM wr_workers
                  WHERE registry = p_reg AND status <> 'dead'
                    AND (last_beat_ms < v_cut_silent
                         OR (status = 'draining' AND drain_deadline_ms < v_now))
                  ORDER BY id FOR UPDATE SKIP LOCKED LOOP
            IF w.status = 'draining' AND w.drain_deadline_ms < v_now THEN
                v_overdue := v_overdue || w.id;
            ELSIF wr_ran(v_starts, v_ends, w.last_beat_ms, v_now)
                  > p_timeout + (CASE WHEN w.beaten THEN 0 ELSE p_grace END) THEN
                v_stale := v_stale || w.id;
            END IF;
        END LOOP;

        -- The brake: too many silent at once means suspect ourselves, not them. A worker
        -- already suspect is judged by its own suspect grace only (on running time too).
        v_brake := v_live >= p_brake_min AND cardinality(v_stale) > p_brake_fraction * v_live;
        FOREACH v_id IN ARRAY v_stale LOOP
            SELECT * INTO w FROM wr_workers WHERE registry = p_reg AND id = v_id;
            IF w.suspect AND w.suspect_since_ms IS NOT NULL
               AND wr_ran(v_starts, v_ends, w.suspect_since_ms, v_now) < p_suspect_grace THEN
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

        -- 3. Bare claims nobody completed within the heartbeat timeout are released (on the
        -- clock: a bare claim is nobody's work to credit a stall to).
        UPDATE wr_claims SET release_reason = 'unbound'
         WHERE (registry, repo, number, delivery) IN (
            SELECT registry, repo, number, delivery FROM wr_claims
             WHERE registry = p_reg AND completed_at_ms IS NULL AND release_reason IS NULL
               AND holder IS NULL AND claimed_at_ms < v_now - p_timeout
             LIMIT p_batch FOR UPDATE SKIP LOCKED);

        -- Released claims move to the outbox (stuck tombstones are in it already).
        WITH moved AS (
            DELETE FROM wr_claims
             WHERE (registry, repo, number, delivery) IN (
                SELECT registry, repo, number, delivery FROM wr_claims
                 WHERE registry = p_reg AND release_reason IN ('worker_died', 'unbound')
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

        -- Stuck tombstones whose holder died have nothing left to refuse.
        DELETE FROM wr_claims
         WHERE (registry, repo, number, delivery) IN (
            SELECT registry, repo, number, delivery FROM wr_claims
             WHERE registry = p_reg AND release_reason = 'stuck' AND dead_reason IS NOT NULL
             LIMIT p_batch FOR UPDATE SKIP LOCKED);

        -- 4. Stuck deliveries: in flight on a live worker for longer than p_max_in_flight of
        -- running time (a range on wr_claims_in_flight up to the exact cut-off). The claim and
        -- its holder are locked together, skipping rows others hold (judged next sweep).
        WITH picked AS (
            SELECT k.repo, k.number, k.delivery, k.holder
              FROM wr_claims k
              JOIN wr_workers x ON x.registry = k.registry AND x.id = k.holder
             WHERE k.registry = p_reg AND k.completed_at_ms IS NULL
               AND k.release_reason IS NULL AND k.holder IS NOT NULL
               AND k.claimed_at_ms < v_cut_stuck
               AND x.status <> 'dead'
             ORDER BY k.claimed_at_ms
             LIMIT p_batch
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
            SELECT p_reg, repo, number, delivery, holder, 'stuck', NULL, v_now FROM marked
            RETURNING repo, number, delivery, holder
        )
        SELECT count(*), coalesce(array_agg(repo), '{}'), coalesce(array_agg(number), '{}'),
               coalesce(array_agg(delivery), '{}'), coalesce(array_agg(holder), '{}')
          INTO v_stuck, v_stuck_repo, v_stuck_number, v_stuck_delivery, v_stuck_holder
          FROM outbox;
        FOR i IN 1..v_stuck LOOP
            PERFORM wr_notify(p_reg, 'stuck ' || v_stuck_holder[i] || ' '
                                     || wr_target_text(v_stuck_repo[i], v_stuck_number[i])
                                     || ' ' || v_stuck_delivery[i]);
        END LOOP;
        v_rel_repo := v_rel_repo || v_stuck_repo;
        v_rel_number := v_rel_number || v_stuck_number;
        v_rel_delivery := v_rel_delivery || v_stuck_delivery;

        -- In flight as the snapshot counts it: taken before the stuck workers' drains, so a
        -- claim released by an idle stuck worker's exit just below is counted until the next
        -- sweep moves it, as in memory.
        SELECT count(*) INTO v_in_flight FROM wr_claims
         WHERE registry = p_reg AND completed_at_ms IS NULL AND release_reason IS NULL
           AND NOT (holder IS NULL AND claimed_at_ms < v_now - p_timeout);

        -- Their workers are drained (rows locked above): busy ones drain, idle ones exit.
        FOR w IN SELECT * FROM wr_workers
                  WHERE registry = p_reg AND id = ANY (v_stuck_holder) AND status <> 'dead'
                  ORDER BY id LOOP
            IF wr_drain_locked(p_reg, w, p_drain_deadline, v_now) = 'draining' THEN
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

        -- 5. Completed claims past their retention are forgotten, then the oldest beyond
        -- max_retained_claims evicted.
        WITH gone AS (
            DELETE FROM wr_claims
             WHERE (registry, repo, number, delivery) IN (
                SELECT registry, repo, number, delivery FROM wr_claims
                 WHERE registry = p_reg AND completed_at_ms < v_now - p_retention
                 ORDER BY completed_at_ms LIMIT p_batch FOR UPDATE SKIP LOCKED)
            RETURNING 1)
        SELECT count(*) INTO v_expired FROM gone;
        -- Retained: the counter's stripes summed (wr_retained, 17 rows), less this sweep's
        -- expiries (its own stripe is written below). Equal to a count of the completed
        -- claims at this statement's snapshot: every change to that set moves the counter in
        -- the transaction that makes it.
        SELECT coalesce(sum(n), 0) - v_expired INTO v_retained FROM wr_retained
         WHERE registry = p_reg;
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
        -- The sweep's stripe (-1) takes its own deletions; only the sweep, under the advisory
        -- lock, writes it, so this never waits for a hot call.
        IF v_expired + v_evicted > 0 THEN
            UPDATE wr_retained SET n = n - (v_expired + v_evicted)
             WHERE registry = p_reg AND stripe = -1;
        END IF;

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
        'purged', v_purged, 'events', v_events, 'snapshot', v_snapshot,
        'stall_ms', v_stall_len, 'stuck_count', v_stuck, 'drained_stuck', to_jsonb(v_drained));
END
$$;
