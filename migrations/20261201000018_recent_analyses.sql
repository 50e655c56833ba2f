-- The per-user limit on analyses per hour (SPEC §8) counts the analyses of the user's
-- logs written or edited in the last hour, an edit's new analyses included. Logs written
-- lately are found through day_logs_user_created; edited ones through this index, which
-- holds only logs that were ever edited.
CREATE INDEX day_logs_user_edited ON day_logs (user_id, edited_at) WHERE edited_at IS NOT NULL;
