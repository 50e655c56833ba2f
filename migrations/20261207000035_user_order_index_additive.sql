-- PostgreSQL's `day_logs_user_created` ends with the entry's id
-- (migrations/postgres/20261207000035_user_order_index_additive.sql), as this one's
-- rows already do: a SQLite index ends with the rowid, which is `id`. Nothing changes
-- here. This file keeps the two backends' migration versions in step.
SELECT 1;
