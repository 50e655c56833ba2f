-- What is said once is remembered by the database, not by a process: across restarts
-- (and, on PostgreSQL, across instances) a notice or a refusal is said once.
--
-- `what`: a fixed word naming the notice ('refused': a chat told this is a private bot;
--   'album': an album told only text is kept; 'import': a user's `/import`, waiting for
--   its document — taken, and so forgotten, by the document).
-- `key`: what it is said once for (a chat id, an album's id, a user id), as text.
-- `at`: when it was said (the store's UTC text); rows older than a month are pruned.
CREATE TABLE said_once (
    what TEXT NOT NULL,
    key TEXT NOT NULL,
    at TEXT NOT NULL DEFAULT (datetime('now')),
    PRIMARY KEY (what, key)
);
CREATE INDEX said_once_at ON said_once (at);
