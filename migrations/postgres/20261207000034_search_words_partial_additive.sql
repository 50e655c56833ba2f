-- The word index of `/search` holds only the entries that have words. An entry gets its
-- row in `day_logs_fts` without words when it is written (the store fills them in
-- before a search of its author's entries), and a GIN index keeps an item even for a
-- NULL: every new entry cost the index a write that no search could ever use. A search
-- reads the index only through `words @@ …`, which no row without words matches, so
-- it finds what it found; rows waiting for their words stay in
-- `day_logs_fts_unindexed`. Built again before it replaces the old one: a search during
-- the migration reads one or the other.
-- The build holds back writes to `day_logs_fts` until it is done (seconds for years of
-- entries), an instance of the previous release beside this one's too.
CREATE INDEX day_logs_fts_words_filled ON day_logs_fts USING gin (words)
    WHERE words IS NOT NULL;
DROP INDEX day_logs_fts_words;
ALTER INDEX day_logs_fts_words_filled RENAME TO day_logs_fts_words;
