-- Tokens per minute claimed in blocks: on PostgreSQL a function
-- (migrations/postgres/20261206000031_token_blocks_additive.sql). One SQLite instance
-- counts its tokens in memory: nothing changes here. This file keeps the two backends'
-- migration versions in step.
SELECT 1;
