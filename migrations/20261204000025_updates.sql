-- The update inbox: every Telegram update is committed here before it is acknowledged
-- (the webhook's 2xx, or the offset long polling confirms), and handled from here.
--
-- `bot_id`: the bot the token belongs to (getMe), so that two bots never share ids.
-- `update_id`: Telegram's id; a dead letter that had none of its own gets a negative
--   one (the lowest so far minus one), so it can never stand in for a real update.
-- `chat_id`, `user_id`: where the update came from (NULL when it names none); a chat's
--   updates are handled in `update_id` order, different chats concurrently.
-- `received_at`: when the row committed. `handled_at`: when the update was handled
--   (NULL: not yet). `dead`: 1 for a dead letter, or an update given up after 5 failed
--   tries; a dead row is never handled.
-- `payload`: the update's JSON as received; dropped a day after the row was handled or
--   died, and at once by `/delete` for the user's rows (the bare ids stay).
-- `failures`, `next_try_at`, `error`: how often handling failed, when it is tried again,
--   and the kind of the last failure (a fixed word, never user text).
CREATE TABLE updates (
    bot_id INTEGER NOT NULL,
    update_id INTEGER NOT NULL,
    chat_id INTEGER,
    user_id INTEGER,
    received_at TEXT NOT NULL DEFAULT (datetime('now')),
    handled_at TEXT,
    dead INTEGER NOT NULL DEFAULT 0,
    payload TEXT,
    failures INTEGER NOT NULL DEFAULT 0,
    next_try_at TEXT,
    error TEXT,
    UNIQUE (bot_id, update_id)
);

-- What the handling loop reads: a bot's unhandled live updates, per chat in order.
CREATE INDEX updates_unhandled ON updates (bot_id, chat_id, update_id)
    WHERE handled_at IS NULL AND dead = 0;
-- `/delete`: a user's payloads.
CREATE INDEX updates_user ON updates (user_id) WHERE payload IS NOT NULL;
-- Retention: rows by age.
CREATE INDEX updates_received ON updates (received_at);
