-- A tokens-per-minute budget claimed in blocks (docs/operations.md, What instances
-- share): as `daylog_admit_block` for requests, one call counts up to `p_want` requests
-- of a budget that declares tokens a minute, with `p_tokens` tokens each, so that an
-- instance under load asks the database once for several requests instead of once for
-- each. A function is added and `daylog_admit_tokens` (migration 30) becomes this one
-- for a single request, with the same answers: an instance of the previous release
-- keeps calling it beside a new one, and both count one budget in one table.

-- As `daylog_admit_tokens`, for up to `p_want` requests (at least 1) of `p_tokens`
-- each: first the corrections this instance carries are applied (`p_add` tokens more,
-- `p_give_back` fewer, from the oldest counted), whatever the answer; then as many
-- requests are counted, `granted`, as both the minute's tokens and every request
-- window have room for, with their tokens, or none. A request larger than the whole
-- minute goes alone when the minute holds nothing. The first request is stamped now;
-- when there are more, the block's tokens are stamped `p_hold_ms` later, as
-- `daylog_admit_block` stamps its requests after the first: they leave the minute no
-- earlier than the provider lets them. The budget's tokens row is locked first, then
-- `daylog_admit_block` locks the requests' row: callers queue on the first, in one
-- order.
CREATE FUNCTION daylog_admit_tokens_block(
    p_provider TEXT, p_scope TEXT, p_key BIGINT, p_model TEXT, p_slot BIGINT,
    p_forced BOOLEAN, p_per_second BIGINT, p_per_minute BIGINT, p_per_day BIGINT,
    p_day_reset_secs BIGINT, p_tokens_per_minute BIGINT, p_tokens BIGINT,
    p_add BIGINT, p_give_back BIGINT, p_want BIGINT, p_hold_ms BIGINT
) RETURNS TABLE (wait_ms BIGINT, why TEXT, granted BIGINT)
LANGUAGE plpgsql AS $$
DECLARE
    t TIMESTAMPTZ;
    r llm_shared_tokens%ROWTYPE;
    ats TIMESTAMPTZ[] := '{}';
    ns BIGINT[] := '{}';
    e RECORD;
    back BIGINT := greatest(coalesce(p_give_back, 0), 0);
    per_request BIGINT := greatest(coalesce(p_tokens, 0), 0);
    want BIGINT := greatest(p_want, 1);
    used BIGINT := 0;
    left_over BIGINT;
    until_at TIMESTAMPTZ;
    cooled RECORD;
    admitted RECORD;
BEGIN
    -- As in daylog_admit: a server crash can lose only the last few counted sends.
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO llm_shared_tokens AS s (provider, scope, key_index)
    VALUES (p_provider, p_scope, p_key)
    ON CONFLICT (provider, scope, key_index) DO UPDATE SET provider = s.provider
    RETURNING * INTO r;
    t := clock_timestamp();
    -- The last minute's tokens, oldest first, less what is given back.
    FOR e IN SELECT x.a, x.k FROM unnest(r.at, r.n) AS x(a, k)
              WHERE x.a > t - interval '1 minute' ORDER BY x.a LOOP
        IF back > 0 THEN
            left_over := greatest(e.k - back, 0);
            back := back - (e.k - left_over);
        ELSE
            left_over := e.k;
        END IF;
        IF left_over > 0 THEN
            ats := ats || e.a;
            ns := ns || left_over;
            used := used + left_over;
        END IF;
    END LOOP;
    IF coalesce(p_add, 0) > 0 THEN
        ats := ats || t;
        ns := ns || p_add;
        used := used + p_add;
    END IF;
    UPDATE llm_shared_tokens SET at = ats, n = ns
     WHERE provider = p_provider AND scope = p_scope AND key_index = p_key;
    IF NOT p_forced THEN
        SELECT c.wait_ms, c.why INTO cooled FROM daylog_cooling(p_provider, p_model, p_slot, t) c;
        IF FOUND THEN
            RETURN QUERY SELECT cooled.wait_ms, cooled.why, 0::BIGINT;
            RETURN;
        END IF;
    END IF;
    IF p_tokens_per_minute IS NOT NULL AND per_request > 0 AND used > 0 THEN
        IF used + per_request > p_tokens_per_minute THEN
            -- Room again when enough of the oldest have left the minute.
            left_over := used;
            FOR e IN SELECT x.a, x.k FROM unnest(ats, ns) AS x(a, k) ORDER BY x.a LOOP
                left_over := left_over - e.k;
                until_at := e.a + interval '1 minute';
                EXIT WHEN left_over + per_request <= p_tokens_per_minute;
            END LOOP;
            RETURN QUERY SELECT greatest(ceil(extract(epoch FROM until_at - t) * 1000), 1)::BIGINT,
                'budget'::TEXT, 0::BIGINT;
            RETURN;
        END IF;
        want := least(want, (p_tokens_per_minute - used) / per_request);
    ELSIF p_tokens_per_minute IS NOT NULL AND per_request > 0 THEN
        want := least(want, greatest(p_tokens_per_minute / per_request, 1));
    END IF;
    -- The cooldowns were looked at above: the requests' windows only.
    SELECT * INTO admitted FROM daylog_admit_block(p_provider, p_scope, p_key, p_model, p_slot,
        true, p_per_second, p_per_minute, p_per_day, p_day_reset_secs, want, p_hold_ms);
    IF admitted.why = 'ok' AND per_request > 0 THEN
        UPDATE llm_shared_tokens
           SET at = at || CASE WHEN admitted.granted > 1
                               THEN clock_timestamp() + make_interval(secs => p_hold_ms / 1000.0)
                               ELSE clock_timestamp() END,
               n = n || (admitted.granted * per_request)
         WHERE provider = p_provider AND scope = p_scope AND key_index = p_key;
    END IF;
    RETURN QUERY SELECT admitted.wait_ms, admitted.why, admitted.granted;
END;
$$;

-- The previous release's call: one request, now through the function above.
CREATE OR REPLACE FUNCTION daylog_admit_tokens(
    p_provider TEXT, p_scope TEXT, p_key BIGINT, p_model TEXT, p_slot BIGINT,
    p_forced BOOLEAN, p_per_second BIGINT, p_per_minute BIGINT, p_per_day BIGINT,
    p_day_reset_secs BIGINT, p_tokens_per_minute BIGINT, p_tokens BIGINT,
    p_add BIGINT, p_give_back BIGINT
) RETURNS TABLE (wait_ms BIGINT, why TEXT)
LANGUAGE sql AS $$
    SELECT b.wait_ms, b.why
      FROM daylog_admit_tokens_block(p_provider, p_scope, p_key, p_model, p_slot, p_forced,
          p_per_second, p_per_minute, p_per_day, p_day_reset_secs, p_tokens_per_minute,
          p_tokens, p_add, p_give_back, 1, 0) b
$$;
