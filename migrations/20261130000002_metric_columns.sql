-- Per-log metric columns, kept in step with day_logs.metrics by triggers, and a
-- covering index by user and day: /stats over a year reads the index, not every row's
-- JSON. Each column is NULL when the log has no metrics or the extractor had to default
-- that value, so plain SQL averages (and the daily_metrics view) skip guesses.

ALTER TABLE day_logs ADD COLUMN mood REAL;
ALTER TABLE day_logs ADD COLUMN stress REAL;
ALTER TABLE day_logs ADD COLUMN energy REAL;
ALTER TABLE day_logs ADD COLUMN productivity REAL;
ALTER TABLE day_logs ADD COLUMN sleep_hours REAL;

CREATE TRIGGER day_logs_metric_columns_insert AFTER INSERT ON day_logs
WHEN NEW.metrics IS NOT NULL
BEGIN
    UPDATE day_logs SET metrics = NEW.metrics WHERE id = NEW.id;
END;

CREATE TRIGGER day_logs_metric_columns_update AFTER UPDATE OF metrics ON day_logs
BEGIN
    UPDATE day_logs SET
        mood = CASE WHEN json_valid(NEW.metrics)
                     AND coalesce(instr(json_extract(NEW.metrics, '$.defaulted'), '"mood"'), 0) = 0
                    THEN json_extract(NEW.metrics, '$.mood') END,
        stress = CASE WHEN json_valid(NEW.metrics)
                     AND coalesce(instr(json_extract(NEW.metrics, '$.defaulted'), '"stress"'), 0) = 0
                    THEN json_extract(NEW.metrics, '$.stress') END,
        energy = CASE WHEN json_valid(NEW.metrics)
                     AND coalesce(instr(json_extract(NEW.metrics, '$.defaulted'), '"energy"'), 0) = 0
                    THEN json_extract(NEW.metrics, '$.energy') END,
        productivity = CASE WHEN json_valid(NEW.metrics)
                     AND coalesce(instr(json_extract(NEW.metrics, '$.defaulted'), '"productivity"'), 0) = 0
                    THEN json_extract(NEW.metrics, '$.productivity') END,
        sleep_hours = CASE WHEN json_valid(NEW.metrics)
                     AND coalesce(instr(json_extract(NEW.metrics, '$.defaulted'), '"sleep_hours"'), 0) = 0
                    THEN json_extract(NEW.metrics, '$.sleep_hours') END
    WHERE id = NEW.id;
END;

-- Fill the columns of logs stored before this migration.
UPDATE day_logs SET metrics = metrics WHERE metrics IS NOT NULL;

DROP VIEW daily_metrics;
CREATE VIEW daily_metrics AS
SELECT
    user_id,
    date(created_at) AS day,
    round(avg(mood), 2) AS mood,
    round(avg(stress), 2) AS stress,
    round(avg(energy), 2) AS energy,
    round(avg(productivity), 2) AS productivity,
    round(avg(sleep_hours), 2) AS sleep_hours,
    count(*) AS logs
FROM day_logs
GROUP BY user_id, date(created_at);

CREATE INDEX day_logs_user_day ON day_logs
    (user_id, date(created_at), created_at, mood, stress, energy, productivity, sleep_hours);
