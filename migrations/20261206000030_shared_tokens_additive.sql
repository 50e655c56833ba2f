-- Tokens per minute shared by several instances: on PostgreSQL a table and a function
-- (migrations/postgres/20261206000030_shared_tokens_additive.sql). One SQLite instance
-- counts its tokens in memory: nothing changes here. This file keeps the two backends'
-- migration versions in step.
SELECT 1;
