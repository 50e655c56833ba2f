-- Where each day log came from (SPEC §7): a Telegram message, a line typed in
-- `daylog chat`, or an imported history. Each front end's worker answers only its own
-- logs (SPEC §4.6). Every log stored before this column existed is counted as Telegram's.
-- Terminal entries take negative message ids (allocated by the insert itself), so they
-- never meet Telegram's, which are positive.

ALTER TABLE day_logs ADD COLUMN source TEXT NOT NULL DEFAULT 'telegram'
    CHECK (source IN ('telegram', 'chat', 'import'));
