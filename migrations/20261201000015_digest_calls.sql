-- `llm_calls.digest_id`: the digest an attempt of task 'digest' was about. Those rows had
-- no owner (day_log_id is NULL for them), so a user's /delete left them behind, and a
-- provider's error text, kept in `error`, can quote the request back: the week's
-- summaries. Now a digest's calls go with it, and with its user. Rows written before
-- this migration cannot be told apart by user and stay as they were.
ALTER TABLE llm_calls ADD COLUMN digest_id INTEGER REFERENCES digests(id) ON DELETE CASCADE;
CREATE INDEX llm_calls_digest ON llm_calls (digest_id) WHERE digest_id IS NOT NULL;
