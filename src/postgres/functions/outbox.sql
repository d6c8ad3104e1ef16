-- worker-registry on PostgreSQL: the outbox of released and promoted deliveries (wr_released):
-- each replica's share collected, acknowledged, and expired past its retention.

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
