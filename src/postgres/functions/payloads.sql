-- worker-registry on PostgreSQL: payloads.
--
-- Payloads (the table is in the baseline; the design in `docs::postgres`, "Payloads"): one wr_payloads row per
-- pair with work left, and the registry's count in wr_payload_budget, which every call that
-- stores or deletes one writes as the last lock of its transaction (after the payload row).

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
