-- `daylog_moment` and `daylog_json` catch the error of a text that is no moment or no
-- JSON with an EXCEPTION block, and such a block is a subtransaction: PostgreSQL
-- refuses to start one while a parallel plan runs ("cannot start subtransactions
-- during a parallel operation"). The initial migration marked them PARALLEL SAFE, so a
-- query the planner chose to run in parallel — a large journal read through
-- `daylog sql`, say — failed instead of answering. They are PARALLEL UNSAFE (the
-- query runs in one process), as is `daylog_default_day`, which calls `daylog_moment`.
--
-- They are also STRICT: NULL in, NULL out without entering the function (and its
-- subtransaction) at all — what they returned for NULL before, at a fraction of the
-- cost; the inbox's read calls `daylog_moment` on every waiting row, most of them NULL.
ALTER FUNCTION daylog_moment(text) STRICT PARALLEL UNSAFE;
ALTER FUNCTION daylog_json(text) STRICT PARALLEL UNSAFE;
ALTER FUNCTION daylog_default_day(text) PARALLEL UNSAFE;
