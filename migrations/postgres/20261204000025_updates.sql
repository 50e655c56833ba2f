-- The update inbox, as migrations/20261204000025_updates.sql makes it on SQLite (the
-- columns' meaning is described there): every Telegram update committed here before it
-- is acknowledged, and handled from here. Moments are the store's UTC text, ids BIGINT,
-- `dead` 0/1, as on SQLite.
CREATE TABLE updates (
    bot_id      BIGINT NOT NULL,
    update_id   BIGINT NOT NULL,
    chat_id     BIGINT,
    user_id     BIGINT,
    received_at TEXT COLLATE "C" NOT NULL DEFAULT daylog_utc(now()),
    handled_at  TEXT COLLATE "C",
    dead        BIGINT NOT NULL DEFAULT 0,
    payload     TEXT,
    failures    BIGINT NOT NULL DEFAULT 0,
    next_try_at TEXT COLLATE "C",
    error       TEXT,
    UNIQUE (bot_id, update_id)
);

-- What the handling loop reads: a bot's unhandled live updates, per chat in order.
CREATE INDEX updates_unhandled ON updates (bot_id, chat_id, update_id)
    WHERE handled_at IS NULL AND dead = 0;
-- `/delete`: a user's payloads.
CREATE INDEX updates_user ON updates (user_id) WHERE payload IS NOT NULL;
-- Retention: rows by age.
CREATE INDEX updates_received ON updates (received_at);
