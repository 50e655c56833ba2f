-- PostgreSQL's functions that catch errors are marked as what they are (migrations/
-- postgres/20261206000033_catching_functions_additive.sql). SQLite has no such
-- functions: nothing changes here. This file keeps the two backends' migration
-- versions in step.
SELECT 1;
