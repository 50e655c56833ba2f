-- PostgreSQL keeps an entry's metric columns and its day's activities in one trigger,
-- and reads a metrics object without a "defaulted" list as SQLite always has
-- (migrations/postgres/20261207000036_metrics_follow_additive.sql). Nothing changes
-- here. This file keeps the two backends' migration versions in step.
SELECT 1;
