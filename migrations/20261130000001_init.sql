-- The public schema of SPEC §7. Times are UTC text 'YYYY-MM-DD HH:MM:SS' so that
-- date(created_at) works in ad-hoc queries.

CREATE TABLE users (
    user_id    INTEGER PRIMARY KEY,              -- Telegram user id
    chat_id    INTEGER NOT NULL,                 -- private chat the bot answers in
    username   TEXT,
    language   TEXT NOT NULL DEFAULT 'en',       -- 'en' or 'ru'
    timezone   TEXT NOT NULL DEFAULT 'UTC',
    created_at TEXT NOT NULL DEFAULT (datetime('now'))
);

CREATE TABLE day_logs (
    id              INTEGER PRIMARY KEY,
    user_id         INTEGER NOT NULL REFERENCES users(user_id) ON DELETE CASCADE,
    chat_id         INTEGER NOT NULL,
    message_id      INTEGER NOT NULL,
    text            TEXT NOT NULL,
    created_at      TEXT NOT NULL DEFAULT (datetime('now')),
    status          TEXT NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'analyzed', 'blocked', 'failed')),
    analysis        TEXT,                        -- the reply text, once analysed
    metrics         TEXT,                        -- JSON, see SPEC §6
    attempts        INTEGER NOT NULL DEFAULT 0,  -- analysis rounds tried so far
    next_attempt_at TEXT,                        -- when the worker may try again
    replied_at      TEXT,                        -- when the answer reached the user
    UNIQUE (chat_id, message_id)
);

-- /history, /stats and the analysis context: one user's logs by time.
CREATE INDEX day_logs_user_created ON day_logs (user_id, created_at);
-- The worker: due pending logs.
CREATE INDEX day_logs_status_next ON day_logs (status, next_attempt_at);

CREATE TABLE llm_calls (
    id          INTEGER PRIMARY KEY,
    day_log_id  INTEGER REFERENCES day_logs(id) ON DELETE CASCADE,
    task        TEXT NOT NULL CHECK (task IN ('analysis', 'metrics')),
    provider    TEXT NOT NULL,
    model       TEXT NOT NULL,
    key_index   INTEGER,                         -- position in the provider's key list, never the key
    attempt     INTEGER NOT NULL,
    http_status INTEGER,
    outcome     TEXT NOT NULL CHECK (outcome IN ('ok', 'retryable', 'bad_key', 'bad_request',
                    'blocked', 'timeout', 'skipped_cooldown', 'unusable', 'cancelled')),
    latency_ms  INTEGER NOT NULL DEFAULT 0,
    wait_ms     INTEGER NOT NULL DEFAULT 0,
    error       TEXT,
    created_at  TEXT NOT NULL DEFAULT (datetime('now'))
);

CREATE INDEX llm_calls_day_log ON llm_calls (day_log_id);

-- One row per user and UTC day. Averages skip values the extractor had to default, so
-- a missing "sleep" never drags the mean down; `logs` counts every entry of the day.
CREATE VIEW daily_metrics AS
SELECT
    user_id,
    date(created_at) AS day,
    round(avg(CASE WHEN instr(json_extract(metrics, '$.defaulted'), '"mood"') = 0
                   THEN json_extract(metrics, '$.mood') END), 2) AS mood,
    round(avg(CASE WHEN instr(json_extract(metrics, '$.defaulted'), '"stress"') = 0
                   THEN json_extract(metrics, '$.stress') END), 2) AS stress,
    round(avg(CASE WHEN instr(json_extract(metrics, '$.defaulted'), '"energy"') = 0
                   THEN json_extract(metrics, '$.energy') END), 2) AS energy,
    round(avg(CASE WHEN instr(json_extract(metrics, '$.defaulted'), '"productivity"') = 0
                   THEN json_extract(metrics, '$.productivity') END), 2) AS productivity,
    round(avg(CASE WHEN instr(json_extract(metrics, '$.defaulted'), '"sleep_hours"') = 0
                   THEN json_extract(metrics, '$.sleep_hours') END), 2) AS sleep_hours,
    count(*) AS logs
FROM day_logs
GROUP BY user_id, date(created_at);
