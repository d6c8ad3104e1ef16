-- worker-registry on PostgreSQL: the sweep.
--
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
--   wr_sweep_stamp     (snapshot.sql) one step of versioning the worker rows changed since the last snapshot;
--   wr_sweep_publish   (snapshot.sql) the new snapshot version and the TargetReleased events;
--   wr_sweep_finish    (after the last death step) a stuck step, the publish and the holder's
--                      collect, in one transaction;
--   wr_sweep_collect   (outbox.sql; every replica) its share of the outbox;
--   wr_snapshot_since  (snapshot.sql; every replica) the worker rows changed since its version.
-- Only the lease holder does the maintenance steps; each re-checks the lease (one row) first, so
-- a replica whose lease was taken over stops at its next step.

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

    -- The event log of polling handles (wr_events) keeps 10 minutes of the server's clock: a poller
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
