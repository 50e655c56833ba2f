-- SPEC §7 and §10: the weekly digest, stored before it is written or sent.
-- A row is 'pending' from the moment it is decided until it reached the user; `text` is
-- NULL until the cascade wrote it (so a pending row with text is "written, not sent
-- yet" and is sent again without asking a provider). attempts / next_attempt_at follow
-- day_logs: the worker comes back on a growing schedule while providers are down.
-- UNIQUE (user_id, week_start) is what keeps a week from being digested twice: a
-- `/week` on a Sunday and the scheduled digest of that evening are the same row.
-- `front_end` says who delivers it: the daemon ('telegram') or `daylog chat` ('chat').
-- `message_id` is the Telegram message of the `/week` that asked for it, so that the same
-- update re-delivered after a crash is not answered a second time.

CREATE TABLE digests (
    id              INTEGER PRIMARY KEY,
    user_id         INTEGER NOT NULL REFERENCES users(user_id) ON DELETE CASCADE,
    chat_id         INTEGER NOT NULL,
    week_start      TEXT NOT NULL,                -- local day 'YYYY-MM-DD', first of the 7
    status          TEXT NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'sent', 'failed')),
    text            TEXT,                         -- the digest, once written
    front_end       TEXT NOT NULL DEFAULT 'telegram' CHECK (front_end IN ('telegram', 'chat')),
    message_id      INTEGER,                      -- the `/week` that asked (NULL: the schedule)
    attempts        INTEGER NOT NULL DEFAULT 0,   -- writing or sending rounds that failed
    next_attempt_at TEXT,                         -- when the worker may try again
    created_at      TEXT NOT NULL DEFAULT (datetime('now')),
    sent_at         TEXT,
    UNIQUE (user_id, week_start)
);

-- The worker: due pending digests only.
CREATE INDEX digests_pending ON digests (next_attempt_at) WHERE status = 'pending';

-- The Sunday digest is off by default; while it is on, digest_next_at is the UTC moment
-- of the next one (Sunday at the reminder time, 19:00 local without one), so the
-- scheduler reads only the due users through users_digest_due.
ALTER TABLE users ADD COLUMN digest_enabled INTEGER NOT NULL DEFAULT 0
    CHECK (digest_enabled IN (0, 1));
ALTER TABLE users ADD COLUMN digest_next_at TEXT;

CREATE INDEX users_digest_due ON users (digest_next_at) WHERE digest_enabled = 1;
