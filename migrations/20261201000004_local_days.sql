-- SPEC §10: every entry belongs to a local day of its user, fixed when it is stored
-- (from the Telegram message date, the user's zone and journal.day_starts_hour).
-- Changing the zone later moves nothing, so the day is a column, not a computation.

ALTER TABLE day_logs ADD COLUMN local_day TEXT;

-- Entries stored before this migration: their users had no zone (nothing set or read
-- users.timezone), so their day is the UTC date with the default 4-hour rule — what
-- the bot would have filed them under with the defaults.
UPDATE day_logs SET local_day = date(created_at, '-4 hours') WHERE local_day IS NULL;

-- A row written without a day (a raw INSERT from a script, an older code path) still
-- gets one, by the same UTC rule, so no entry ever falls out of the statistics.
CREATE TRIGGER day_logs_local_day_default AFTER INSERT ON day_logs
WHEN NEW.local_day IS NULL
BEGIN
    UPDATE day_logs SET local_day = date(NEW.created_at, '-4 hours') WHERE id = NEW.id;
END;

-- The covering index of the per-day view, now by local day: /stats reads the index,
-- not the rows. It keeps its name, so the query-plan checks stay meaningful.
DROP INDEX day_logs_user_day;
CREATE INDEX day_logs_user_day ON day_logs
    (user_id, local_day, mood, stress, energy, productivity, sleep_hours);

DROP VIEW daily_metrics;
CREATE VIEW daily_metrics AS
SELECT
    user_id,
    local_day AS day,
    round(avg(mood), 2) AS mood,
    round(avg(stress), 2) AS stress,
    round(avg(energy), 2) AS energy,
    round(avg(productivity), 2) AS productivity,
    round(avg(sleep_hours), 2) AS sleep_hours,
    count(*) AS logs
FROM day_logs
GROUP BY user_id, local_day;
