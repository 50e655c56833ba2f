-- What several instances share through the database (one instance on SQLite keeps the
-- LLM budgets, cooldowns and Telegram's holds in memory; `said_once` is on both).

-- As migrations/20261205000027_shared_limits.sql on SQLite (described there).
CREATE TABLE said_once (
    what TEXT NOT NULL,
    key  TEXT NOT NULL,
    at   TEXT COLLATE "C" NOT NULL DEFAULT daylog_utc(now()),
    PRIMARY KEY (what, key)
);
CREATE INDEX said_once_at ON said_once (at);

-- One LLM budget (a provider's key, or key and model where the provider counts per
-- model: `scope`), shared by every instance. `key_index` -1: a provider with no key
-- list. `sends`: the sends of the last minute (the sliding windows of a second and a
-- minute are counted from it); `day`, `day_sends`: the sends of the current free-tier
-- day (days restart at the provider's reset, see daylog_admit). `spent_until`: known
-- spent until then (a reset the provider named, a penalty after a 429 that named
-- none); `daily`: that spend is a per-day quota. `factor`: the declared rates as
-- 429s lowered them (1: as declared). Moments here are the server's own timestamptz:
-- the windows need sub-second precision and one clock for every instance.
CREATE TABLE llm_shared_budgets (
    provider    TEXT NOT NULL,
    scope       TEXT NOT NULL DEFAULT '',
    key_index   BIGINT NOT NULL DEFAULT -1,
    spent_until TIMESTAMPTZ,
    daily       BIGINT NOT NULL DEFAULT 0,
    factor      DOUBLE PRECISION NOT NULL DEFAULT 1,
    sends       TIMESTAMPTZ[] NOT NULL DEFAULT '{}',
    day         BIGINT NOT NULL DEFAULT 0,
    day_sends   BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (provider, scope, key_index)
);

-- Cooldowns every instance honours: one key of one model (`key_index` ≥ 0, or -1 for
-- a provider with no key list) or the whole model (`key_index` -2), skipped until
-- `until`; `refused` 1 when the provider refused the key (401/403).
CREATE TABLE llm_shared_cooldowns (
    provider  TEXT NOT NULL,
    model     TEXT NOT NULL,
    key_index BIGINT NOT NULL,
    until     TIMESTAMPTZ NOT NULL,
    refused   BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (provider, model, key_index)
);

-- Telegram's 429s: nothing is sent to `chat_id` (0: to any chat) before `until`.
CREATE TABLE telegram_holds (
    chat_id BIGINT PRIMARY KEY,
    until   TIMESTAMPTZ NOT NULL
);

-- Check-and-spend of one request on one budget, in one call: the budget's row is
-- taken (created if new) and locked, so that concurrent callers queue on it and each
-- sees the sends of those before it; the request is counted in every window (second,
-- minute, day) or in none. Before that, unless `p_forced`, the model's and the key's
-- shared cooldowns are looked at (`p_model`, `p_slot`: the cooldown's key index).
-- Returns `wait_ms` 0 and `why` 'ok' when counted; else how long until it could be
-- and why not: 'cooling', 'refused' (a refused key) or 'budget'. Declared limits come
-- from the caller (its settings), scaled by the row's `factor`, at least 1.
CREATE FUNCTION daylog_admit(
    p_provider TEXT, p_scope TEXT, p_key BIGINT, p_model TEXT, p_slot BIGINT,
    p_forced BOOLEAN, p_per_second BIGINT, p_per_minute BIGINT, p_per_day BIGINT,
    p_day_reset_secs BIGINT
) RETURNS TABLE (wait_ms BIGINT, why TEXT)
LANGUAGE plpgsql AS $$
DECLARE
    t TIMESTAMPTZ := clock_timestamp();
    b llm_shared_budgets%ROWTYPE;
    recent TIMESTAMPTZ[];
    today BIGINT;
    until_at TIMESTAMPTZ;
    cooling_until TIMESTAMPTZ;
    was_refused BOOLEAN;
    lim BIGINT;
    filling TIMESTAMPTZ;
BEGIN
    -- Not worth a disk flush per request: a server crash can lose only the last few
    -- counted sends (a few requests over a budget, once), never a row's consistency.
    PERFORM set_config('synchronous_commit', 'off', true);
    IF NOT p_forced THEN
        SELECT max(c.until), bool_and(c.refused = 1 AND c.key_index <> -2)
          INTO cooling_until, was_refused
          FROM llm_shared_cooldowns c
         WHERE c.provider = p_provider AND c.model = p_model
           AND c.key_index IN (p_slot, -2) AND c.until > t;
        IF cooling_until IS NOT NULL THEN
            RETURN QUERY SELECT ceil(extract(epoch FROM cooling_until - t) * 1000)::BIGINT,
                CASE WHEN was_refused THEN 'refused' ELSE 'cooling' END;
            RETURN;
        END IF;
    END IF;
    INSERT INTO llm_shared_budgets AS s (provider, scope, key_index)
    VALUES (p_provider, p_scope, p_key)
    ON CONFLICT (provider, scope, key_index) DO UPDATE SET provider = s.provider
    RETURNING * INTO b;
    -- Only what a window can still count is kept: the sends of the longest declared
    -- window (none when no rate is declared), at most the largest limit of them.
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
    END IF;
    IF p_per_minute IS NOT NULL THEN
        filling := NULL;
        lim := greatest(floor(p_per_minute * b.factor), 1)::BIGINT;
        SELECT x INTO filling FROM unnest(recent) x ORDER BY x DESC OFFSET lim - 1 LIMIT 1;
        IF filling IS NOT NULL THEN
            until_at := greatest(until_at, filling + interval '1 minute');
        END IF;
    END IF;
    IF p_per_day IS NOT NULL AND b.day = today AND b.day_sends >= p_per_day THEN
        until_at := greatest(until_at, to_timestamp((today + 1) * 86400 + p_day_reset_secs));
    END IF;
    IF until_at IS NOT NULL THEN
        UPDATE llm_shared_budgets SET sends = recent
         WHERE provider = p_provider AND scope = p_scope AND key_index = p_key;
        RETURN QUERY SELECT greatest(ceil(extract(epoch FROM until_at - t) * 1000), 1)::BIGINT,
            'budget'::TEXT;
        RETURN;
    END IF;
    UPDATE llm_shared_budgets
       SET sends = CASE WHEN p_per_minute IS NULL AND p_per_second IS NULL THEN recent
                        ELSE recent || t END,
           day = today,
           day_sends = CASE WHEN b.day = today THEN b.day_sends + 1 ELSE 1 END
     WHERE provider = p_provider AND scope = p_scope AND key_index = p_key;
    RETURN QUERY SELECT 0::BIGINT, 'ok'::TEXT;
END;
$$;
