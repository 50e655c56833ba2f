-- PostgreSQL's `day_logs_status_next` now holds only pending rows
-- (migrations/postgres/20261206000029_pending_index_additive.sql): there, the one key
-- most rows shared ('analyzed', NULL) made every write of an entry rewrite the same
-- leaf page's posting list. SQLite's b-tree keeps no posting lists: nothing changes
-- here. This file keeps the two backends' migration versions in step.
SELECT 1;
