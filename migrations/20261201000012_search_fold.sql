-- Search folds ё into е (SPEC §12): Russian writes "еще" and "ещё" for the same word,
-- and unicode61's remove_diacritics leaves Cyrillic alone, so a search for one spelling
-- missed the other. The index now holds each text with ё/Ё written е/Е, and a query is
-- folded the same way (`store::fold_for_search`), so either spelling finds both.
--
-- The index's external content is the view `day_logs_search` (id, folded text), so
-- FTS5's own 'rebuild' and 'integrity-check' see exactly what was indexed. Snippets
-- come back folded; the store puts the letters of day_logs.text back (the fold swaps
-- one two-byte letter for another, so every offset agrees) and a user sees "ещё" bold
-- as they wrote it.
--
-- char(1105) is ё, char(1025) Ё, char(1077) е, char(1045) Е: spelled as code points so
-- the look-alike letters cannot be confused in this file.

CREATE VIEW day_logs_search AS
SELECT id, replace(replace(text, char(1105), char(1077)), char(1025), char(1045)) AS text
FROM day_logs;

DROP TRIGGER day_logs_fts_insert;
DROP TRIGGER day_logs_fts_delete;
DROP TRIGGER day_logs_fts_update;
DROP TABLE day_logs_fts;

CREATE VIRTUAL TABLE day_logs_fts USING fts5(
    text,
    content = 'day_logs_search',
    content_rowid = 'id',
    tokenize = 'unicode61 remove_diacritics 2'
);

CREATE TRIGGER day_logs_fts_insert AFTER INSERT ON day_logs
BEGIN
    INSERT INTO day_logs_fts (rowid, text)
    VALUES (NEW.id, replace(replace(NEW.text, char(1105), char(1077)), char(1025), char(1045)));
END;

-- A delete must name the tokens exactly as they were indexed: folded.
CREATE TRIGGER day_logs_fts_delete AFTER DELETE ON day_logs
BEGIN
    INSERT INTO day_logs_fts (day_logs_fts, rowid, text)
    VALUES ('delete', OLD.id,
            replace(replace(OLD.text, char(1105), char(1077)), char(1025), char(1045)));
END;

CREATE TRIGGER day_logs_fts_update AFTER UPDATE OF text ON day_logs
BEGIN
    INSERT INTO day_logs_fts (day_logs_fts, rowid, text)
    VALUES ('delete', OLD.id,
            replace(replace(OLD.text, char(1105), char(1077)), char(1025), char(1045)));
    INSERT INTO day_logs_fts (rowid, text)
    VALUES (NEW.id, replace(replace(NEW.text, char(1105), char(1077)), char(1025), char(1045)));
END;

-- Index every entry stored before this migration, folded.
INSERT INTO day_logs_fts (day_logs_fts) VALUES ('rebuild');
