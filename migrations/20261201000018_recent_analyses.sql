-- The per-user limit on analyses per hour (SPEC §8) counts the answers of the last hour
-- in `llm_calls`, edits' new analyses and deferred entries' included. Only successful
-- analyses are in this index, by time: the check reads the last hour's, not the table.
CREATE INDEX llm_calls_recent_analyses ON llm_calls (created_at)
    WHERE task = 'analysis' AND outcome = 'ok';
