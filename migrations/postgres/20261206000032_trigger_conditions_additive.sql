-- The triggers of `day_logs` run only when their work is due, with the same results.
-- `day_logs_before_write` ran its function on every UPDATE of a log (a reply recorded
-- as sent, a retry scheduled…) to find the metrics unchanged, and
-- `day_activities_follow` on every INSERT to find no metrics, and read the metrics'
-- JSON three times when there were some. A trigger's `WHEN` is checked without calling
-- its function. An instance of the previous release runs beside this unchanged: the
-- tables and what the triggers write are the same.

DROP TRIGGER day_logs_before_write ON day_logs;
CREATE TRIGGER day_logs_before_write BEFORE INSERT ON day_logs
    FOR EACH ROW EXECUTE FUNCTION day_logs_before_write();
CREATE TRIGGER day_logs_before_update BEFORE UPDATE ON day_logs
    FOR EACH ROW WHEN (NEW.metrics IS DISTINCT FROM OLD.metrics)
    EXECUTE FUNCTION day_logs_before_write();

-- As before, reading the metrics once.
CREATE OR REPLACE FUNCTION day_activities_follow() RETURNS trigger
    LANGUAGE plpgsql AS $$
DECLARE
    day text := coalesce(NEW.local_day, daylog_default_day(NEW.created_at));
    m jsonb;
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.metrics IS NOT NULL
       AND (NEW.metrics IS NULL OR NEW.metrics <> OLD.metrics) THEN
        DELETE FROM day_activities WHERE user_id = NEW.user_id AND local_day = day;
        INSERT INTO day_activities (user_id, local_day, activity)
        SELECT l.user_id, l.local_day, a.value #>> '{}'
        FROM day_logs l,
             jsonb_array_elements(CASE WHEN jsonb_typeof(daylog_json(l.metrics) -> 'activities') = 'array'
                                       THEN daylog_json(l.metrics) -> 'activities'
                                       ELSE '[]'::jsonb END) a
        WHERE l.user_id = NEW.user_id AND l.local_day = day
          AND jsonb_typeof(a.value) = 'string'
        ON CONFLICT DO NOTHING;
        RETURN NULL;
    END IF;
    m := daylog_json(NEW.metrics);
    IF jsonb_typeof(m -> 'activities') = 'array' THEN
        INSERT INTO day_activities (user_id, local_day, activity)
        SELECT NEW.user_id, day, a.value #>> '{}'
        FROM jsonb_array_elements(m -> 'activities') a
        WHERE jsonb_typeof(a.value) = 'string'
        ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER day_activities_follow ON day_logs;
CREATE TRIGGER day_activities_follow AFTER INSERT ON day_logs
    FOR EACH ROW WHEN (NEW.metrics IS NOT NULL)
    EXECUTE FUNCTION day_activities_follow();
CREATE TRIGGER day_activities_follow_update AFTER UPDATE OF metrics ON day_logs
    FOR EACH ROW WHEN (NEW.metrics IS DISTINCT FROM OLD.metrics)
    EXECUTE FUNCTION day_activities_follow();
