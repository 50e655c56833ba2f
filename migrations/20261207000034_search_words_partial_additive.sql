-- PostgreSQL's word index of `/search` leaves out the entries that have no words yet
-- (migrations/postgres/20261207000034_search_words_partial_additive.sql). SQLite's
-- search is FTS5's, whose index holds only words: nothing changes here. This file
-- keeps the two backends' migration versions in step.
SELECT 1;
