-- Free tiers as budgets, and content-policy refusals that are remembered (SPEC §5, §7).
--
-- llm_refusals: a model that refused a log on content policy is never asked about that
-- log again — not by a later request, not by the worker. One row per (log, provider,
-- model). An edit of the log's text is a new question: its refusals are forgotten.
CREATE TABLE llm_refusals (
    day_log_id INTEGER NOT NULL REFERENCES day_logs(id) ON DELETE CASCADE,
    provider   TEXT NOT NULL,
    model      TEXT NOT NULL,
    created_at TEXT NOT NULL DEFAULT (datetime('now')),
    PRIMARY KEY (day_log_id, provider, model)
);

CREATE TRIGGER llm_refusals_forget_on_edit
AFTER UPDATE OF text ON day_logs
WHEN old.text IS NOT new.text
BEGIN
    DELETE FROM llm_refusals WHERE day_log_id = new.id;
END;

-- llm_budgets: budgets known to be spent until a time (a per-day quota, a long reset),
-- so that a restart does not spend a dead daily quota again. `scope` is the model for
-- providers that count per model, '' for those that count per key (workspace);
-- `key_index` is the key's position in the provider's key list (-1: no key), never
-- the key. Rows whose `spent_until` has passed mean nothing and are pruned.
CREATE TABLE llm_budgets (
    provider    TEXT NOT NULL,
    scope       TEXT NOT NULL DEFAULT '',
    key_index   INTEGER NOT NULL DEFAULT -1,
    spent_until TEXT NOT NULL,                   -- UTC 'YYYY-MM-DD HH:MM:SS'
    reason      TEXT NOT NULL DEFAULT '',        -- e.g. 'per-day quota', never a key
    updated_at  TEXT NOT NULL DEFAULT (datetime('now')),
    PRIMARY KEY (provider, scope, key_index)
);

-- llm_calls.outcome gains 'skipped_budget' (a step or key skipped because its budget
-- is known to be spent: no request was sent). SQLite cannot alter a CHECK: the table
-- is rebuilt with the same columns and rows.
CREATE TABLE llm_calls_new (
    id          INTEGER PRIMARY KEY,
    day_log_id  INTEGER REFERENCES day_logs(id) ON DELETE CASCADE,
    task        TEXT NOT NULL CHECK (task IN ('analysis', 'metrics')),
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
INSERT INTO llm_calls_new SELECT id, day_log_id, task, provider, model, key_index, attempt,
    http_status, outcome, latency_ms, wait_ms, error, created_at FROM llm_calls;
DROP TABLE llm_calls;
ALTER TABLE llm_calls_new RENAME TO llm_calls;
CREATE INDEX llm_calls_day_log ON llm_calls (day_log_id);
