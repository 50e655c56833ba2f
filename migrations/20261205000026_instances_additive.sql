-- Several instances on one database (docs/operations.md, "Several instances").
--
-- `instances`: one row per `daylog run` process start. `id` is never reused
--   (AUTOINCREMENT), so a restarted process is a new holder of leases. `last_seen` is
--   its heartbeat (every third of `cluster.lease_ms`); `stopped_at` is set by a clean
--   stop. `version`: the build's version; `host`, `pid`: where it runs; `mode`:
--   "polling" or "webhook".
-- `chat_leases`: which instance handles and answers a chat now. `holder` is an
--   `instances.id`; `generation` goes up every time another instance takes the chat
--   over, and every write made under the lease checks it (fencing: a lease taken over
--   can no longer write); `expires_at` is UTC text with milliseconds
--   (`YYYY-MM-DD HH:MM:SS.SSS`): after it another instance may take the chat.
--
-- The name ends in "additive": it only adds tables, so instances of the build before it
-- keep running beside it (docs/operations.md, "Upgrades").
CREATE TABLE instances (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    started_at TEXT NOT NULL DEFAULT (datetime('now')),
    last_seen TEXT NOT NULL DEFAULT (datetime('now')),
    version TEXT NOT NULL,
    host TEXT NOT NULL DEFAULT '',
    pid INTEGER NOT NULL DEFAULT 0,
    mode TEXT NOT NULL DEFAULT '',
    stopped_at TEXT
);

CREATE TABLE chat_leases (
    chat_id INTEGER PRIMARY KEY,
    holder INTEGER NOT NULL,
    generation INTEGER NOT NULL DEFAULT 1,
    expires_at TEXT NOT NULL
);

-- The heartbeat renews every lease of one holder.
CREATE INDEX chat_leases_holder ON chat_leases (holder);
