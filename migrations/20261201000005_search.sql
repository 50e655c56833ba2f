-- Full-text search over entries (SPEC §12): an FTS5 index of day_logs.text, kept in
-- step by the schema itself, so every write path (new entries, edits, transcripts,
-- deletes, /delete and the ON DELETE CASCADE from users) updates it without the code
-- having to remember.
--
-- External content: the index stores only tokens; snippets are read back from
-- day_logs through content_rowid, so the text is not kept twice. The 'delete' command
-- of an external content table must be given the text exactly as it was indexed,
-- which the triggers below do with OLD.text.
--
-- unicode61 folds case for every script and, with remove_diacritics 2, drops the
-- marks of Latin letters (café = cafe); Cyrillic ё and е stay different letters.

CREATE VIRTUAL TABLE day_logs_fts USING fts5(
    text,
    content = 'day_logs',
    content_rowid = 'id',
    tokenize = 'unicode61 remove_diacritics 2'
);

CREATE TRIGGER day_logs_fts_insert AFTER INSERT ON day_logs
BEGIN
    INSERT INTO day_logs_fts (rowid, text) VALUES (NEW.id, NEW.text);
END;

CREATE TRIGGER day_logs_fts_delete AFTER DELETE ON day_logs
BEGIN
    INSERT INTO day_logs_fts (day_logs_fts, rowid, text) VALUES ('delete', OLD.id, OLD.text);
END;

CREATE TRIGGER day_logs_fts_update AFTER UPDATE OF text ON day_logs
BEGIN
    INSERT INTO day_logs_fts (day_logs_fts, rowid, text) VALUES ('delete', OLD.id, OLD.text);
    INSERT INTO day_logs_fts (rowid, text) VALUES (NEW.id, NEW.text);
END;

-- Index the entries stored before this migration.
INSERT INTO day_logs_fts (day_logs_fts) VALUES ('rebuild');
