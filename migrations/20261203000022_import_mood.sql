-- An imported Daylio row is the same row again by its date, time, text and now its
-- mood's *name* (lower case; a default name in any language as Daylio's English one):
-- two custom moods at one minute, which a CSV cannot give a level, are two entries, not
-- one; and a backup (.daylio) sent after the CSV finds the CSV's rows by that name and
-- gives them their moods. Rows imported before keep NULL and are found by their score,
-- as before, getting the name at their next import.
ALTER TABLE day_logs ADD COLUMN import_mood TEXT;
