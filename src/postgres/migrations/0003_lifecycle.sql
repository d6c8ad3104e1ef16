-- worker-registry on PostgreSQL: the stall rule and stuck deliveries (see `Maintenance::sweep`).
--
-- Applied once, after 0001 and 0002: a table for the stall rule's memory, two partial indexes
-- for stuck claims, and new versions of the functions that change (CREATE OR REPLACE; wr_sweep
-- takes more parameters, so its old signature is dropped first).

-- The stall rule's memory, one row per registry, written only by the sweep that holds the
-- registry's advisory lock: when the last sweep (of any replica) ran, and the stalls measured so
-- far that can still matter, oldest first, disjoint and increasing ([starts_ms[i], ends_ms[i]]),
-- at most 64 of them (as MAX_STALLS in memory: the oldest is dropped first).
CREATE TABLE wr_stalls (
    registry      bigint PRIMARY KEY REFERENCES wr_registries (id) ON DELETE CASCADE,
    last_sweep_ms bigint,
    starts_ms     bigint[] NOT NULL DEFAULT '{}',
    ends_ms       bigint[] NOT NULL DEFAULT '{}',
    CHECK (cardinality(starts_ms) = cardinality(ends_ms) AND cardinality(starts_ms) <= 64)
);
INSERT INTO wr_stalls (registry) SELECT id FROM wr_registries ON CONFLICT DO NOTHING;

-- A claim released as stuck stays in wr_claims (release_reason 'stuck') as a tombstone, so that
-- the stuck worker's late completion is refused as released; its row went to the outbox when it
-- was released. When its holder dies, wr_kill sets its dead_reason and the next sweep deletes it.
-- So the sweep's move of released claims to the outbox leaves tombstones out, through its index:
DROP INDEX wr_claims_released;
CREATE INDEX wr_claims_released ON wr_claims (registry)
    WHERE release_reason IN ('worker_died', 'unbound');
CREATE INDEX wr_claims_stuck_gone ON wr_claims (registry)
    WHERE release_reason = 'stuck' AND dead_reason IS NOT NULL;
-- (wr_claims_in_flight, from 0001, finds claims in flight too long: a range on claimed_at_ms.)

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
    RETURN v_id;
END
$$;

-- Stalled time after p_from: the part of the recorded stalls that lies after it (memory's
-- `Stalls::since`).
CREATE FUNCTION wr_stalled_after(p_starts bigint[], p_ends bigint[], p_from bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(sum(u.e - greatest(u.s, p_from)), 0)::bigint
      FROM unnest(p_starts, p_ends) AS u (s, e)
     WHERE u.e > p_from
$$;

-- How long the registry actually ran from p_from to p_now: the elapsed time less the stalled
-- time in between, never negative (memory's `judge(from, now) - from`, saturating).
CREATE FUNCTION wr_ran(p_starts bigint[], p_ends bigint[], p_from bigint, p_now bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(greatest(p_now - wr_stalled_after(p_starts, p_ends, p_from),
                             least(p_from, p_now)) - p_from, 0)
$$;

-- The cut-off for a range scan: something based at t <= p_now has run for longer than p_len by
-- p_now (wr_ran > p_len) if and only if t < the result. Exact, because t + stalled_after(t) never
-- decreases as t grows (it is flat inside a stall and rises with t outside): the result is the
-- least t where it reaches p_now - p_len. Without stalls: p_now - p_len.
CREATE FUNCTION wr_run_cutoff(p_starts bigint[], p_ends bigint[], p_now bigint, p_len bigint)
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

-- A worker's death (as in 0002), and: the stuck tombstones it held are marked (dead_reason) for
-- the next sweep to delete. One statement over the worker's claims either way (wr_claims_holder).
CREATE OR REPLACE FUNCTION wr_kill(
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
    UPDATE wr_claims SET release_reason = coalesce(release_reason, 'worker_died'),
                         dead_reason = p_reason
     WHERE registry = p_reg AND holder = p_id AND completed_at_ms IS NULL
       AND (release_reason IS NULL OR release_reason = 'stuck');
    PERFORM wr_notify(p_reg, 'died ' || p_id || ' ' || v_target || ' ' || p_reason);
END
$$;

DROP FUNCTION wr_sweep(bigint, text, bigint, bigint, bigint, bigint, bigint, bigint, bigint,
                       double precision, bigint, bigint, integer);

-- The maintenance pass. Every replica calls it; the one that gets the registry's advisory lock
-- (for this transaction) does the work, in memory's order:
--   1. the stall rule: a sweep more than two intervals after the previous one (wr_stalls) records
--      the stall and moves the drain deadlines it overlapped out by its length;
--   2. liveness with the mass-staleness brake, drain deadlines, every silence judged on registry
--      running time (wr_ran: the recorded stalls left out);
--   3. release of bare claims past the timeout, of dead workers' claims into the outbox; stuck
--      tombstones whose holder died deleted;
--   4. stuck deliveries: in flight on a live worker longer than p_max_in_flight of running time,
--      released into the outbox (reason 'stuck', the claim kept as a tombstone), published, and
--      their workers drained with p_drain_deadline;
--   5. retention, purge, and a new snapshot.
-- Every caller then claims its share of the outbox (rows nobody claimed, or claimed longer than
-- p_ack_timeout ago) and, if the snapshot is newer than p_known_version, gets it.
-- Bounded: at most p_batch rows of each kind are released, expired, evicted, purged, claimed.
--
-- Cost: the candidates are range scans on partial indexes whose bound is wr_run_cutoff (exact:
-- only what is due is read), so a normal sweep reads what changed, stalls or not. The one extra
-- cost of a stall is in the sweep that measures it: it rewrites the deadline of every draining
-- worker whose deadline lies after the stall's start (a range on wr_workers_draining).
CREATE FUNCTION wr_sweep(
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
