-- The per-user hourly limit (SPEC §8) queues the entries beyond it: each waits for a
-- slot an hour after the analysis of the entry `limit` places before it. Entries of an
-- older burst still waiting for their slot count against the limit too, however long
-- ago they were written, so that a new entry queues behind them; this index finds a
-- user's waiting ones without reading the user's other entries.
--
-- `waiting_for = 'deferred'` now means only that (the hourly limit). A pending voice
-- entry whose transcript could not be shown yet waits as 'delivery' (one waiting so
-- when this runs keeps 'deferred' until its next try, seconds away).
CREATE INDEX day_logs_deferred ON day_logs (user_id, next_attempt_at)
WHERE status = 'pending' AND waiting_for = 'deferred';
