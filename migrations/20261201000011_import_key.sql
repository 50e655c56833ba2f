-- What makes an imported Daylio row "the same row again" (SPEC §12): what the export
-- says — the local date, the wall-clock time, the mood and the text — not the UTC
-- `created_at`, which depends on the zone the user had when importing (a `/tz` change
-- between two imports of the same file would otherwise import every row again).
--
-- `import_time` is the export's wall-clock time of an imported entry ('HH:MM'); NULL
-- for every other entry. Rows imported before this column existed have NULL too: the
-- next import still recognises them by their `created_at` (the zone cannot have
-- changed for them to match) and fills their `import_time` then.

ALTER TABLE day_logs ADD COLUMN import_time TEXT;

-- The import's lookup: one user's imported rows of one local day and time.
CREATE INDEX day_logs_import_key ON day_logs (user_id, local_day, import_time)
    WHERE source = 'import';
