-- Budgets claimed in blocks (docs/behaviour.md, Several instances): one call counts up
-- to `p_want` requests of a budget at once, so that an instance under load asks the
-- database once for several requests instead of once for each. Only a function is
-- added: `daylog_admit` (migration 27) stays as it was for instances of the previous
-- release, and both write `sends` the same way (one moment per request), so old and
-- new instances running side by side count one budget together.

-- What cools a model's key `p_slot` at `t` (a cooldown another instance set, a key the
-- provider refused, or the whole model, slot -2): the wait and why ('model', 'refused'
-- or 'cooling', as `daylog_admit` answers), or no row when nothing cools. The check
-- `daylog_admit` makes before counting (migration 27 keeps its own copy, released
-- before this one), shared by the functions added since.
CREATE FUNCTION daylog_cooling(p_provider TEXT, p_model TEXT, p_slot BIGINT, t TIMESTAMPTZ)
RETURNS TABLE (wait_ms BIGINT, why TEXT)
LANGUAGE sql STABLE AS $$
    SELECT ceil(extract(epoch FROM coalesce(max(c.until) FILTER (WHERE c.key_index = -2),
                                            max(c.until)) - t) * 1000)::BIGINT,
           CASE WHEN max(c.until) FILTER (WHERE c.key_index = -2) IS NOT NULL THEN 'model'
                WHEN bool_and(c.refused = 1 AND c.key_index <> -2) THEN 'refused'
                ELSE 'cooling' END
      FROM llm_shared_cooldowns c
     WHERE c.provider = p_provider AND c.model = p_model
       AND c.key_index IN (p_slot, -2) AND c.until > t
    HAVING count(*) > 0
$$;

-- As `daylog_admit`, for up to `p_want` requests (at least 1): counts as many as every
-- window of the budget has room for, `granted`, or refuses as `daylog_admit` does
-- (`granted` 0). The first request is stamped now, as `daylog_admit` stamps its one;
-- the others `p_hold_ms` later: the caller sends them within that time, so each is
-- stamped no earlier than it is sent, and a window never opens before the provider's.
CREATE FUNCTION daylog_admit_block(
    p_provider TEXT, p_scope TEXT, p_key BIGINT, p_model TEXT, p_slot BIGINT,
    p_forced BOOLEAN, p_per_second BIGINT, p_per_minute BIGINT, p_per_day BIGINT,
    p_day_reset_secs BIGINT, p_want BIGINT, p_hold_ms BIGINT
) RETURNS TABLE (wait_ms BIGINT, why TEXT, granted BIGINT)
LANGUAGE plpgsql AS $$
DECLARE
    t TIMESTAMPTZ := clock_timestamp();  -- again once the row is locked (below)
    b llm_shared_budgets%ROWTYPE;
    recent TIMESTAMPTZ[];
    today BIGINT;
    until_at TIMESTAMPTZ;
    cooled RECORD;
    lim BIGINT;
    filling TIMESTAMPTZ;
    room BIGINT := greatest(p_want, 1);
BEGIN
    -- As in daylog_admit: a server crash can lose only the last few counted sends.
    PERFORM set_config('synchronous_commit', 'off', true);
    IF NOT p_forced THEN
        SELECT c.wait_ms, c.why INTO cooled FROM daylog_cooling(p_provider, p_model, p_slot, t) c;
        IF FOUND THEN
            RETURN QUERY SELECT cooled.wait_ms, cooled.why, 0::BIGINT;
            RETURN;
        END IF;
    END IF;
    INSERT INTO llm_shared_budgets AS s (provider, scope, key_index)
    VALUES (p_provider, p_scope, p_key)
    ON CONFLICT (provider, scope, key_index) DO UPDATE SET provider = s.provider
    RETURNING * INTO b;
    t := clock_timestamp();
    recent := ARRAY(
        SELECT x FROM (
            SELECT x FROM unnest(b.sends) x
             WHERE x > t - CASE WHEN p_per_minute IS NOT NULL THEN interval '1 minute'
                                ELSE interval '1 second' END
               AND (p_per_minute IS NOT NULL OR p_per_second IS NOT NULL)
             ORDER BY x DESC
             LIMIT greatest(coalesce(p_per_minute, 0), coalesce(p_per_second, 0))
        ) kept ORDER BY x);
    today := floor((extract(epoch FROM t) - p_day_reset_secs) / 86400)::BIGINT;
    IF b.spent_until > t THEN
        until_at := b.spent_until;
    END IF;
    IF p_per_second IS NOT NULL THEN
        lim := greatest(floor(p_per_second * b.factor), 1)::BIGINT;
        SELECT x INTO filling FROM unnest(recent) x WHERE x > t - interval '1 second'
         ORDER BY x DESC OFFSET lim - 1 LIMIT 1;
        IF filling IS NOT NULL THEN
            until_at := greatest(until_at, filling + interval '1 second');
        END IF;
        room := least(room, lim - (SELECT count(*) FROM unnest(recent) x
                                    WHERE x > t - interval '1 second'));
    END IF;
    IF p_per_minute IS NOT NULL THEN
        filling := NULL;
        lim := greatest(floor(p_per_minute * b.factor), 1)::BIGINT;
        SELECT x INTO filling FROM unnest(recent) x ORDER BY x DESC OFFSET lim - 1 LIMIT 1;
        IF filling IS NOT NULL THEN
            until_at := greatest(until_at, filling + interval '1 minute');
        END IF;
        room := least(room, lim - cardinality(recent));
    END IF;
    IF p_per_day IS NOT NULL THEN
        IF b.day = today AND b.day_sends >= p_per_day THEN
            until_at := greatest(until_at, to_timestamp((today + 1) * 86400 + p_day_reset_secs));
        END IF;
        room := least(room, p_per_day - CASE WHEN b.day = today THEN b.day_sends ELSE 0 END);
    END IF;
    IF until_at IS NOT NULL OR room < 1 THEN
        UPDATE llm_shared_budgets SET sends = recent
         WHERE provider = p_provider AND scope = p_scope AND key_index = p_key;
        RETURN QUERY SELECT greatest(ceil(extract(epoch FROM coalesce(until_at, t) - t) * 1000), 1)::BIGINT,
            'budget'::TEXT, 0::BIGINT;
        RETURN;
    END IF;
    UPDATE llm_shared_budgets
       SET sends = CASE WHEN p_per_minute IS NULL AND p_per_second IS NULL THEN recent
                        ELSE recent || t || array_fill(t + make_interval(secs => p_hold_ms / 1000.0),
                                                       ARRAY[(room - 1)::INT]) END,
           day = today,
           day_sends = CASE WHEN b.day = today THEN b.day_sends + room ELSE room END
     WHERE provider = p_provider AND scope = p_scope AND key_index = p_key;
    RETURN QUERY SELECT 0::BIGINT, 'ok'::TEXT, room;
END;
$$;
