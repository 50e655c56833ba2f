-- `digests.written_from`: the week's entries as they were when the digest's text was
-- written, as a fingerprint (their count and a hash of their ids and texts). A `/week`
-- asked again compares it with the entries now: one created or edited since (or a
-- digest written before this column, NULL) has its digest written again in the same
-- row, its text and `sent_at` renewed, instead of the earlier text sent again without
-- that day's later entries. `UNIQUE (user_id, week_start)` stays: a week is one row.
ALTER TABLE digests ADD COLUMN written_from TEXT;
