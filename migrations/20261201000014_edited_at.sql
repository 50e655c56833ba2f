-- An edit sends an entry back to pending (SPEC §4), and the worker gives a pending
-- entry up after `worker.max_age_hours`. It measured that age from `created_at`, so an
-- entry edited days after it was written was given up at its first failed retry, and
-- the user told the AI had been unavailable for too long. `edited_at` is the moment of
-- the last edit that changed the text (NULL: never edited); the age counts from it.
ALTER TABLE day_logs ADD COLUMN edited_at TEXT;
