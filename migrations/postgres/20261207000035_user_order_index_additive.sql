-- A user's entries in the order they were written: `day_logs_user_created` ends with
-- the entry's id, as SQLite's index of the same name does by itself (its rows end with
-- the rowid, which is `id`). The reads that want a user's latest entries sort by
-- (created_at, id); with the index ending at `created_at`, PostgreSQL read every entry
-- of the latest second (a busy chat writes several in one) and tested each before it
-- could sort them and keep the first — the last summaries an analysis reads parsed
-- the metrics of each. Now the index hands them over in order and the read stops at
-- the last one it keeps. Built before the old one goes: a read during the migration
-- uses one or the other.
-- The build holds back writes to `day_logs` until it is done (seconds for years of
-- entries), an instance of the previous release beside this one's too.
CREATE INDEX day_logs_user_created_id ON day_logs (user_id, created_at, id);
DROP INDEX day_logs_user_created;
ALTER INDEX day_logs_user_created_id RENAME TO day_logs_user_created;
