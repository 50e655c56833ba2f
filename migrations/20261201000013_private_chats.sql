-- users.chat_id is the chat that reminders and the Sunday digest go to: the user's
-- private chat, whose id in Telegram is the user's id. Until now every message set it
-- to the chat it came from, so one entry or command written in a group sent that user's
-- reminders and digests (a summary of their journal) to the group from then on. The
-- bot now records the private chat; rows a group message left behind are put back.
UPDATE users SET chat_id = user_id WHERE chat_id <> user_id;
-- A Sunday digest already written for such a chat and not yet delivered goes to the
-- private chat too (a `/week`, which has the message it answers, stays where it was
-- asked).
UPDATE digests SET chat_id = user_id
WHERE status = 'pending' AND message_id IS NULL AND chat_id <> user_id;
