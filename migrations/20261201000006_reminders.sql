-- SPEC §7 and §10: one daily reminder per user at a local wall-clock time.
-- next_due_at is the UTC moment the reminder is next due, computed in the user's zone
-- (DST included) whenever the time, the zone or a sending changes it; the scheduler
-- reads only the due rows through reminders_due instead of scanning every user.
-- last_sent_day is written before (or instead of) sending, so a restart never sends a
-- second reminder for the same local day.

CREATE TABLE reminders (
    user_id       INTEGER PRIMARY KEY REFERENCES users(user_id) ON DELETE CASCADE,
    local_time    TEXT NOT NULL,                 -- 'HH:MM' on the user's wall clock
    enabled       INTEGER NOT NULL DEFAULT 1 CHECK (enabled IN (0, 1)),
    last_sent_day TEXT,                          -- local day 'YYYY-MM-DD' of the last one sent
    next_due_at   TEXT                           -- UTC 'YYYY-MM-DD HH:MM:SS'; NULL when off
);

CREATE INDEX reminders_due ON reminders (next_due_at) WHERE enabled = 1;
