-- When the user wrote the entry: Telegram's message date (UTC, as created_at), which
-- differs from created_at (when daylog stored it) after a downtime, when Telegram hands
-- over the updates it kept. /history and /export show it. NULL means "as created_at":
-- lines typed in `daylog chat` (stored as they are typed), imports (whose created_at is
-- the export's own time), and entries stored before this column.
ALTER TABLE day_logs ADD COLUMN written_at TEXT;
