-- The user's time zone when the entry was written (`users.timezone` as it was then:
-- the canonical IANA name or `UTC±HH:MM`), so that /history and /export keep showing
-- the hour the user saw on their clock after a `/tz` to another zone (a move, a trip):
-- `local_day` was already fixed at that moment, and the hour now is too. NULL means
-- the zone the user has now: entries stored before this column, and users whose zone
-- was never set (the default zone).
ALTER TABLE day_logs ADD COLUMN written_zone TEXT;
