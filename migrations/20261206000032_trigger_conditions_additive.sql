-- The PostgreSQL triggers of `day_logs` run only when their work is due: on
-- PostgreSQL a change of its triggers (migrations/postgres/
-- 20261206000032_trigger_conditions_additive.sql). SQLite's triggers already say when
-- they run: nothing changes here. This file keeps the two backends' migration
-- versions in step.
SELECT 1;
