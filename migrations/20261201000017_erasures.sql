-- `/delete` erases a user's rows; Telegram still lets them edit the messages those rows
-- came from, and an edit of a message with no row is taken as a new entry. So the
-- moment of the erasure is kept (and nothing else): an edit of a message sent before
-- it is not stored again.
CREATE TABLE erasures (
    user_id INTEGER PRIMARY KEY,
    erased_at TEXT NOT NULL
);
