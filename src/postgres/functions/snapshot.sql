-- worker-registry on PostgreSQL: lifecycle events (NOTIFY, and the event log for polling
-- handles) and the versioned snapshot (the sweep's stamp and publish steps, and what a replica
-- reads of it).

-- Lifecycle events: NOTIFY on the registry's channel, delivered to every listener at commit, in
-- commit order. The payload is space-separated (no field contains a space):
--   created <worker> <target|->          draining <worker> <target|->
--   suspect <worker> <target|->          died <worker> <target|-> <reason>
--   stuck <worker> <target> <delivery>   released <target> <delivery>...
--   promoted <worker> <target> <delivery>
--   waiting_expired <target> <delivery> <limit ms>
-- where <target> is repo#number.
-- For a registry a polling handle opened (wr_registries.poll_events), each
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

-- audit: what the registry holds unfinished, read now (one statement, one snapshot of the data,
-- no lock): the live workers (the capacity row), the claims in flight (bound or bare; counted
-- on wr_claims_in_flight), the deliveries released or promoted and not yet acknowledged (claims
-- a death released that no sweep has moved yet, on wr_claims_released, and the outbox rows) and
-- the deliveries waiting (the room's count). Proportional to the claims in flight and the
-- released ones: for audits and tests, not a hot path.
CREATE OR REPLACE FUNCTION wr_audit(p_reg bigint, OUT o_live bigint, OUT o_in_flight bigint,
                                    OUT o_released bigint, OUT o_waiting bigint)
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT c.live FROM wr_capacity c WHERE c.registry = p_reg), 0)::bigint,
           (SELECT count(*) FROM wr_claims k
             WHERE k.registry = p_reg AND k.completed_at_ms IS NULL AND k.release_reason IS NULL),
           (SELECT count(*) FROM wr_claims k
             WHERE k.registry = p_reg AND k.release_reason IN ('worker_died', 'unbound'))
             + (SELECT count(*) FROM wr_released o WHERE o.registry = p_reg),
           coalesce((SELECT r.waiting FROM wr_room r WHERE r.registry = p_reg), 0)::bigint
$$;
