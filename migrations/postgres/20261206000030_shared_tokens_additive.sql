-- Tokens per minute shared by several instances (docs/operations.md, What instances
-- share): a budget's minute of tokens is counted in the database, in the same call as
-- its requests. Only a table and a function are added: `daylog_admit` and
-- `daylog_admit_block` stay as they were, so an instance of the previous release keeps
-- counting its requests beside a new one (its tokens it counts alone, as before).

-- The last minute's tokens of one budget (as `llm_shared_budgets`' key): `at[i]` took
-- `n[i]` tokens. A request's estimate is counted when it is admitted; what its answer
-- really took (more, or less: a 429 takes nothing) is set right with the next
-- admission of that budget by the same instance.
CREATE TABLE llm_shared_tokens (
    provider  TEXT NOT NULL,
    scope     TEXT NOT NULL DEFAULT '',
    key_index BIGINT NOT NULL DEFAULT -1,
    at        TIMESTAMPTZ[] NOT NULL DEFAULT '{}',
    n         BIGINT[] NOT NULL DEFAULT '{}',
    PRIMARY KEY (provider, scope, key_index)
);

-- As `daylog_admit` (one request), for a budget that also declares
-- `p_tokens_per_minute`: the request's estimate `p_tokens` must fit beside the last
-- minute's tokens (or the minute hold none: a request larger than the whole minute goes
-- alone), and is counted with the request in every window or in none. First the
-- corrections this instance carries for its earlier requests are applied, whatever the
-- answer: `p_add` tokens more (counted from now), `p_give_back` fewer (taken from the
-- oldest counted, which leave the minute no later than the estimates they set right).
-- The budget's tokens row is locked first, then `daylog_admit` locks the requests'
-- row: callers of this function queue on the first, in one order.
CREATE FUNCTION daylog_admit_tokens(
    p_provider TEXT, p_scope TEXT, p_key BIGINT, p_model TEXT, p_slot BIGINT,
    p_forced BOOLEAN, p_per_second BIGINT, p_per_minute BIGINT, p_per_day BIGINT,
    p_day_reset_secs BIGINT, p_tokens_per_minute BIGINT, p_tokens BIGINT,
    p_add BIGINT, p_give_back BIGINT
) RETURNS TABLE (wait_ms BIGINT, why TEXT)
LANGUAGE plpgsql AS $$
DECLARE
    t TIMESTAMPTZ;
    r llm_shared_tokens%ROWTYPE;
    ats TIMESTAMPTZ[] := '{}';
    ns BIGINT[] := '{}';
    e RECORD;
    back BIGINT := greatest(coalesce(p_give_back, 0), 0);
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
            RETURN QUERY SELECT cooled.wait_ms, cooled.why;
            RETURN;
        END IF;
    END IF;
    IF p_tokens_per_minute IS NOT NULL AND coalesce(p_tokens, 0) > 0
       AND used > 0 AND used + p_tokens > p_tokens_per_minute THEN
        -- Room again when enough of the oldest have left the minute.
        left_over := used;
        FOR e IN SELECT x.a, x.k FROM unnest(ats, ns) AS x(a, k) ORDER BY x.a LOOP
            left_over := left_over - e.k;
            until_at := e.a + interval '1 minute';
            EXIT WHEN left_over + p_tokens <= p_tokens_per_minute;
        END LOOP;
        RETURN QUERY SELECT greatest(ceil(extract(epoch FROM until_at - t) * 1000), 1)::BIGINT,
            'budget'::TEXT;
        RETURN;
    END IF;
    -- The cooldowns were looked at above: the requests' windows only.
    SELECT * INTO admitted FROM daylog_admit(p_provider, p_scope, p_key, p_model, p_slot, true,
        p_per_second, p_per_minute, p_per_day, p_day_reset_secs);
    IF admitted.why = 'ok' AND coalesce(p_tokens, 0) > 0 THEN
        UPDATE llm_shared_tokens SET at = at || clock_timestamp(), n = n || p_tokens
         WHERE provider = p_provider AND scope = p_scope AND key_index = p_key;
    END IF;
    RETURN QUERY SELECT admitted.wait_ms, admitted.why;
END;
$$;
