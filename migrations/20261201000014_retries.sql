-- Two facts about a pending entry's next try.
--
-- `edited_at`: an edit sends an entry back to pending (SPEC §4), and the worker gives a
-- pending entry up after `worker.max_age_hours`. It measured that age from
-- `created_at`, so an entry edited days after it was written was given up at its first
-- failed retry, and the user told the AI had been unavailable for too long. It is the
-- moment of the last edit that changed the text (NULL: never edited); the age counts
-- from it.
--
-- `waiting_for`: why a pending entry waits for its `next_attempt_at`: 'provider' (its
-- analysis failed for a reason other than budget: the growing retry schedule),
-- 'budget' (parked until a budget returns), 'transcription' (its voice note could not
-- be fetched or transcribed yet) or 'deferred' (the hourly limit, or a transcript to
-- deliver). The first analysis that succeeds after an outage makes the 'provider' ones
-- due at once, and only those. NULL for a row that never waited; read it while the
-- row is pending.
ALTER TABLE day_logs ADD COLUMN edited_at TEXT;
ALTER TABLE day_logs ADD COLUMN waiting_for TEXT;

-- Entries an earlier version left waiting for a retry: taken as waiting after a failed
-- analysis, so the first answer after the upgrade brings them forward (one parked for
-- a budget among them is only looked at again: its budget still decides).
UPDATE day_logs SET waiting_for = 'provider'
WHERE status = 'pending' AND attempts > 0 AND next_attempt_at > datetime('now');
