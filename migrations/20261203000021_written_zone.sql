-- The user's time zone when the entry was written (`users.timezone` as it was then:
-- the canonical IANA name or `UTC±HH:MM`), so that /history and /export keep showing
-- the hour the user saw on their clock after a `/tz` to another zone (a move, a trip):
-- `local_day` was already fixed at that moment, and the hour now is too.
--
-- Only a zone the user chose counts (`users.timezone_chosen`, set by `/tz`): a new
-- user has the default zone until they tell theirs, and their first entries are shown on
-- the clock they set then, as before. NULL means "the zone the user has now": entries
-- stored before this column, and entries of a user who had not chosen a zone yet.
ALTER TABLE day_logs ADD COLUMN written_zone TEXT;

-- Whether `users.timezone` was set by the user (`/tz`, a shared location) rather than
-- given as the default. Users from before this column who have a zone other than UTC,
-- the shipped default, chose it.
ALTER TABLE users ADD COLUMN timezone_chosen INTEGER NOT NULL DEFAULT 0;
UPDATE users SET timezone_chosen = 1 WHERE timezone IS NOT NULL AND timezone <> 'UTC';
