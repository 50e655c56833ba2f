-- What goes with good days (SPEC §10) compares local days with and without each
-- activity. Reading every entry's metrics JSON for that made /stats over a year of a
-- busy journal parse tens of thousands of documents; this table keeps the distinct
-- activities of each user's local day, in step with day_logs.metrics, so /stats reads
-- a few hundred rows instead.

CREATE TABLE day_activities (
    user_id   INTEGER NOT NULL REFERENCES users(user_id) ON DELETE CASCADE,
    local_day TEXT NOT NULL,
    activity  TEXT NOT NULL,
    PRIMARY KEY (user_id, local_day, activity)
) WITHOUT ROWID;

-- New metrics add their activities to the day.
CREATE TRIGGER day_activities_add AFTER UPDATE OF metrics ON day_logs
WHEN NEW.metrics IS NOT NULL AND json_valid(NEW.metrics)
BEGIN
    INSERT OR IGNORE INTO day_activities (user_id, local_day, activity)
    SELECT NEW.user_id, coalesce(NEW.local_day, date(NEW.created_at, '-4 hours')), value
    FROM json_each(NEW.metrics, '$.activities')
    WHERE type = 'text';
END;

-- Metrics that changed or went away (an edit): the day is rebuilt from its entries.
CREATE TRIGGER day_activities_rebuild AFTER UPDATE OF metrics ON day_logs
WHEN OLD.metrics IS NOT NULL AND (NEW.metrics IS NULL OR NEW.metrics <> OLD.metrics)
BEGIN
    DELETE FROM day_activities
    WHERE user_id = NEW.user_id AND local_day = coalesce(NEW.local_day, date(NEW.created_at, '-4 hours'));
    INSERT OR IGNORE INTO day_activities (user_id, local_day, activity)
    SELECT l.user_id, l.local_day, j.value
    FROM day_logs l, json_each(l.metrics, '$.activities') j
    WHERE l.user_id = NEW.user_id
      AND l.local_day = coalesce(NEW.local_day, date(NEW.created_at, '-4 hours'))
      AND l.metrics IS NOT NULL AND json_valid(l.metrics) AND j.type = 'text';
END;

-- Entries go only all at once (/delete), and the user's rows go with them (the foreign
-- key), so there is no per-entry delete trigger.

INSERT OR IGNORE INTO day_activities (user_id, local_day, activity)
SELECT l.user_id, l.local_day, j.value
FROM day_logs l, json_each(l.metrics, '$.activities') j
WHERE l.metrics IS NOT NULL AND json_valid(l.metrics) AND l.local_day IS NOT NULL
  AND j.type = 'text';
