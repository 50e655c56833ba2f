-- The words of the search index, for `/search` to list a stem's words rather than
-- search the stem as a prefix (SPEC §12; `store::fts_query_with`): FTS5 must read the
-- whole doclist of every term a prefix covers before it can give the newest matches,
-- where an OR of listed words is read lazily, newest first — 35 ms against ~5 ms for
-- a word in every one of 100 000 entries (BENCHMARKS.md). A read-only view of the
-- index; it stores nothing.
CREATE VIRTUAL TABLE day_logs_fts_vocab USING fts5vocab(day_logs_fts, 'row');
