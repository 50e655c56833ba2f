-- Budgets claimed in blocks: on PostgreSQL a function for several instances
-- (migrations/postgres/20261206000028_admit_blocks_additive.sql). One SQLite instance
-- keeps its budgets in memory: nothing changes here. This file keeps the two
-- backends' migration versions in step.
SELECT 1;
