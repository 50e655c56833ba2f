-- `day_logs_status_next` held every row of the journal, most of them under the one key
-- ('analyzed', NULL): each entry's analysis and its sent mark (neither can be a HOT
-- update) added that key again, so every write of an entry landed on the same leaf
-- page and rewrote its posting list. The queries that read it all ask for pending rows
-- (`status = 'pending'`: the worker's due entries, a provider's retries made due), so
-- it now holds only those: the same columns, the same name, a few rows at any time.
-- The rows still owed an answer are `day_logs_unreplied`'s, as before.
--
-- Additive: every statement of an older build means what it meant and reads the same
-- index (its pending rows are all here). The index is built again in this migration's
-- transaction, which holds writes to `day_logs` for one pass over the table.
DROP INDEX day_logs_status_next;
CREATE INDEX day_logs_status_next ON day_logs (status, next_attempt_at)
    WHERE status = 'pending';
