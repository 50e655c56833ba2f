-- What follows a change of an entry's metrics, in one trigger. Until now two did it:
-- `day_logs_before_update` set the metric columns and `day_activities_follow_update`,
-- after the row, kept the day's activities; each was a call of a PL/pgSQL function
-- and each parsed the metrics' JSON, for every analysis recorded. One BEFORE trigger
-- now does both with one parse. Its rebuild of a day whose metrics changed or went
-- away reads the day's other entries as stored and this entry's new metrics, which
-- is what the AFTER trigger read with the row in place. The tables and every write
-- daylog makes come out the same, so an instance of the previous release runs beside
-- this unchanged. Only hand-written statements can tell: one that changes several
-- entries of a day at once, some their day and others their metrics, rebuilds the day
-- from the entries as each row reaches the trigger (as SQLite's row triggers do); a
-- row without a local day files its own activities under its default day; a row with
-- no day at all keeps none (it made the update fail).
--
-- And a correction: a metrics object without a "defaulted" list (a hand edit, or
-- metrics written by something else than daylog, which always writes the list) gave
-- every metric column NULL, as if each were defaulted; SQLite's columns read such
-- metrics as given. `daylog_metric` now does too, and the rows it read wrong are
-- read again.

CREATE OR REPLACE FUNCTION daylog_metric(m jsonb, name text) RETURNS double precision
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
SELECT CASE
    WHEN jsonb_typeof(m -> name) = 'number'
         AND NOT coalesce(jsonb_typeof(m -> 'defaulted') = 'array' AND (m -> 'defaulted') ? name,
                          false)
    -- A number no double holds (1e400) is no metric, rather than an error that would
    -- refuse the row's write.
    THEN CASE WHEN abs((m -> name)::numeric) BETWEEN 1e-300 AND 1e300
                   OR (m -> name)::numeric = 0
              THEN (m ->> name)::double precision END
END $$;

UPDATE day_logs AS l
   SET mood = daylog_metric(j.m, 'mood'),
       stress = daylog_metric(j.m, 'stress'),
       energy = daylog_metric(j.m, 'energy'),
       productivity = daylog_metric(j.m, 'productivity'),
       sleep_hours = daylog_metric(j.m, 'sleep_hours')
  FROM (SELECT id, daylog_json(metrics) AS m FROM day_logs WHERE metrics IS NOT NULL) AS j
 WHERE l.id = j.id AND jsonb_typeof(j.m) = 'object' AND NOT j.m ? 'defaulted';

CREATE FUNCTION day_logs_metrics_follow() RETURNS trigger
    LANGUAGE plpgsql AS $$
DECLARE
    m jsonb := daylog_json(NEW.metrics);
    day text := coalesce(NEW.local_day, daylog_default_day(NEW.created_at));
BEGIN
    NEW.mood := daylog_metric(m, 'mood');
    NEW.stress := daylog_metric(m, 'stress');
    NEW.energy := daylog_metric(m, 'energy');
    NEW.productivity := daylog_metric(m, 'productivity');
    NEW.sleep_hours := daylog_metric(m, 'sleep_hours');
    IF day IS NULL THEN
        -- No day to file activities under (a hand-written row with neither a local day
        -- nor a moment): SQLite's insert of such a row is ignored too.
        RETURN NEW;
    END IF;
    IF OLD.metrics IS NOT NULL THEN
        -- Metrics that changed or went away: the day is built again from its other
        -- entries as stored, then this one's new activities are added as for new metrics.
        DELETE FROM day_activities WHERE user_id = NEW.user_id AND local_day = day;
        INSERT INTO day_activities (user_id, local_day, activity)
        SELECT NEW.user_id, day, a.value #>> '{}'
        FROM day_logs l,
             jsonb_array_elements(CASE WHEN jsonb_typeof(daylog_json(l.metrics) -> 'activities') = 'array'
                                       THEN daylog_json(l.metrics) -> 'activities'
                                       ELSE '[]'::jsonb END) a
        WHERE l.user_id = NEW.user_id AND l.local_day = day AND l.id <> NEW.id
          AND jsonb_typeof(a.value) = 'string'
        ON CONFLICT DO NOTHING;
    END IF;
    IF jsonb_typeof(m -> 'activities') = 'array' THEN
        INSERT INTO day_activities (user_id, local_day, activity)
        SELECT NEW.user_id, day, a.value #>> '{}'
        FROM jsonb_array_elements(m -> 'activities') a
        WHERE jsonb_typeof(a.value) = 'string'
        ON CONFLICT DO NOTHING;
    END IF;
    RETURN NEW;
END $$;

DROP TRIGGER day_logs_before_update ON day_logs;
DROP TRIGGER day_activities_follow_update ON day_logs;
CREATE TRIGGER day_logs_metrics_follow BEFORE UPDATE ON day_logs
    FOR EACH ROW WHEN (NEW.metrics IS DISTINCT FROM OLD.metrics)
    EXECUTE FUNCTION day_logs_metrics_follow();
