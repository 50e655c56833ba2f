-- Voice notes (SPEC §11). A voice note is stored first, like text: a day log with
-- `kind = 'voice'`, the Telegram `file_id` (for `daylog chat`, the path of the file) and
-- its duration, and an empty `text` until its transcript is stored. SPEC §11 calls this
-- `source = 'voice'`, but `source` (§7) already says where a log came from (telegram,
-- chat, import) and a voice note can come from Telegram or the terminal, so what it is
-- goes into a column of its own. `transcript_sent_at` records that the transcript was
-- shown to the user, so a restart shows it once, before the analysis.

ALTER TABLE day_logs ADD COLUMN kind TEXT NOT NULL DEFAULT 'text'
    CHECK (kind IN ('text', 'voice'));
ALTER TABLE day_logs ADD COLUMN file_id TEXT;
ALTER TABLE day_logs ADD COLUMN duration_s INTEGER;
ALTER TABLE day_logs ADD COLUMN transcript_sent_at TEXT;

-- `llm_calls.task` takes 'transcription' (and 'digest', SPEC §7). SQLite cannot change
-- a CHECK constraint, so the table is rebuilt with every row kept. The outcome list is
-- SPEC §7's whole list, `skipped_budget` included.
CREATE TABLE llm_calls_new (
    id          INTEGER PRIMARY KEY,
    day_log_id  INTEGER REFERENCES day_logs(id) ON DELETE CASCADE,
    task        TEXT NOT NULL
                CHECK (task IN ('analysis', 'metrics', 'digest', 'transcription')),
    provider    TEXT NOT NULL,
    model       TEXT NOT NULL,
    key_index   INTEGER,                         -- position in the provider's key list, never the key
    attempt     INTEGER NOT NULL,
    http_status INTEGER,
    outcome     TEXT NOT NULL CHECK (outcome IN ('ok', 'retryable', 'bad_key', 'bad_request',
                    'blocked', 'timeout', 'skipped_cooldown', 'skipped_budget', 'unusable',
                    'cancelled')),
    latency_ms  INTEGER NOT NULL DEFAULT 0,
    wait_ms     INTEGER NOT NULL DEFAULT 0,
    error       TEXT,
    created_at  TEXT NOT NULL DEFAULT (datetime('now'))
);

INSERT INTO llm_calls_new (id, day_log_id, task, provider, model, key_index, attempt,
        http_status, outcome, latency_ms, wait_ms, error, created_at)
    SELECT id, day_log_id, task, provider, model, key_index, attempt,
        http_status, outcome, latency_ms, wait_ms, error, created_at
    FROM llm_calls;

DROP TABLE llm_calls;
ALTER TABLE llm_calls_new RENAME TO llm_calls;
CREATE INDEX llm_calls_day_log ON llm_calls (day_log_id);
