//! `/search` on PostgreSQL, computed in Rust where SQLite's FTS5 computes it, so that
//! both backends find the same entries for the same data (docs/behaviour.md, Search):
//!
//! - [`tokens`]: the words of a text as FTS5's `unicode61 remove_diacritics 2`
//!   tokenizer makes them (split at anything that is no letter, number or private-use
//!   character; case folded; Latin diacritics dropped), after the store's `ё` → `е`
//!   fold. PostgreSQL's own parser and `lower()` split and fold by the server's
//!   locale, so the store writes these tokens itself ([`tsvector`], into
//!   `day_logs_fts.words`).
//! - [`tsquery`]: the query of [`super::query_clauses`] (the same word forms as on
//!   SQLite) in PostgreSQL's syntax: a word of several tokens is a phrase (`<->`), a
//!   stem a prefix (`:*`).
//! - [`bm25`] and [`snippet`]: FTS5's ranking and snippet, over the few candidates
//!   PostgreSQL's index found.

use unicode_normalization::char::decompose_canonical;

use super::logs::{Alternative, is_token_char};

/// The tokens of a (folded) text with their byte ranges in it.
pub(super) fn tokens(text: &str) -> Vec<(std::ops::Range<usize>, String)> {
    let mut found = Vec::new();
    let mut start = None;
    for (at, c) in text
        .char_indices()
        .chain(std::iter::once((text.len(), ' ')))
    {
        match (is_token_char(c) && at < text.len(), start) {
            (true, None) => start = Some(at),
            (false, Some(from)) => {
                found.push((from..at, fold_token(&text[from..at])));
                start = None;
            }
            _ => {}
        }
    }
    found
}

/// A token as unicode61 holds it: lower case, a Latin letter without its diacritics
/// (`é` → `e`; Cyrillic `й` stays, as FTS5 leaves every other script alone).
fn fold_token(token: &str) -> String {
    let mut folded = String::with_capacity(token.len());
    for c in token.chars().flat_map(char::to_lowercase) {
        let mut base = None;
        let mut marks_only = true;
        decompose_canonical(c, |part| {
            if base.is_none() {
                base = Some(part);
            } else if !matches!(part, '\u{0300}'..='\u{036F}') {
                marks_only = false;
            }
        });
        match base {
            Some(base) if base != c && base.is_ascii_alphabetic() && marks_only => {
                folded.push(base);
            }
            _ => folded.push(c),
        }
    }
    folded
}

/// The longest lexeme PostgreSQL takes (bytes); a longer token is not indexed there.
const MAX_LEXEME: usize = 2046;
/// The highest position a tsvector holds, and the most positions of one lexeme.
const MAX_POSITION: usize = 16383;
const MAX_POSITIONS: usize = 256;

/// A tsvector literal of a text's tokens with their positions (1-based), and the
/// number of tokens (the length bm25 reads).
pub(super) fn tsvector(text: &str) -> (String, i64) {
    let found = tokens(text);
    let mut positions: std::collections::BTreeMap<&str, Vec<usize>> = Default::default();
    for (i, (_, token)) in found.iter().enumerate() {
        if token.len() <= MAX_LEXEME {
            let list = positions.entry(token.as_str()).or_default();
            let at = (i + 1).min(MAX_POSITION);
            if list.len() < MAX_POSITIONS && list.last() != Some(&at) {
                list.push(at);
            }
        }
    }
    let literal = positions
        .iter()
        .map(|(token, at)| {
            let at: Vec<String> = at.iter().map(ToString::to_string).collect();
            format!("{}:{}", quoted(token), at.join(","))
        })
        .collect::<Vec<_>>()
        .join(" ");
    (literal, i64::try_from(found.len()).unwrap_or(i64::MAX))
}

/// A lexeme in tsvector/tsquery input syntax.
fn quoted(token: &str) -> String {
    format!("'{}'", token.replace('\\', "\\\\").replace('\'', "''"))
}

/// One phrase of a query as tokens: the alternative's tokens, the last one a prefix
/// when the alternative is a stem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Phrase {
    tokens: Vec<String>,
    prefix: bool,
}

impl Phrase {
    pub(super) fn of(alternative: &Alternative) -> Option<Self> {
        let (text, prefix) = match alternative {
            Alternative::Word(word) => (word, false),
            Alternative::Prefix(stem) => (stem, true),
        };
        let tokens: Vec<String> = tokens(text).into_iter().map(|(_, t)| t).collect();
        (!tokens.is_empty()).then_some(Self { tokens, prefix })
    }

    /// Whether PostgreSQL can look for it: a token longer than a lexeme is in no index
    /// there (and no query may hold it).
    fn searchable(&self) -> bool {
        self.tokens.iter().all(|token| token.len() <= MAX_LEXEME)
    }

    /// This phrase as a tsquery.
    pub(super) fn tsquery(&self) -> String {
        let last = self.tokens.len() - 1;
        let parts: Vec<String> = self
            .tokens
            .iter()
            .enumerate()
            .map(|(i, token)| {
                if self.prefix && i == last {
                    format!("{}:*", quoted(token))
                } else {
                    quoted(token)
                }
            })
            .collect();
        match parts.as_slice() {
            [one] => one.clone(),
            _ => format!("({})", parts.join(" <-> ")),
        }
    }

    /// Where this phrase begins in a row's tokens.
    fn starts(&self, row: &[String]) -> Vec<usize> {
        let n = self.tokens.len();
        (0..row.len().saturating_sub(n - 1))
            .filter(|&at| {
                self.tokens.iter().enumerate().all(|(i, token)| {
                    let have = &row[at + i];
                    if self.prefix && i == n - 1 {
                        have.starts_with(token.as_str())
                    } else {
                        have == token
                    }
                })
            })
            .collect()
    }
}

/// The clauses as phrases (a clause's alternatives with no token left out; an empty
/// clause dropped, as FTS5 skips an empty string). `None` when a clause can match
/// nothing on PostgreSQL (each of its phrases holds a word too long to index there):
/// the search finds nothing, rather than more than was asked for.
pub(super) fn phrases(clauses: &[Vec<Alternative>]) -> Option<Vec<Vec<Phrase>>> {
    let mut found = Vec::new();
    for clause in clauses {
        let phrases: Vec<Phrase> = clause.iter().filter_map(Phrase::of).collect();
        if phrases.is_empty() {
            continue;
        }
        let searchable: Vec<Phrase> = phrases.into_iter().filter(Phrase::searchable).collect();
        if searchable.is_empty() {
            return None;
        }
        found.push(searchable);
    }
    Some(found)
}

/// The whole query as a tsquery: each clause an OR of its phrases, AND between them.
pub(super) fn tsquery(clauses: &[Vec<Phrase>]) -> String {
    clauses
        .iter()
        .map(|clause| {
            let parts: Vec<String> = clause.iter().map(Phrase::tsquery).collect();
            format!("({})", parts.join(" | "))
        })
        .collect::<Vec<_>>()
        .join(" & ")
}

/// What bm25 reads of the whole index: its rows, their tokens, and how many rows hold
/// each phrase (in the order of the query's phrases).
pub(super) struct Corpus {
    pub rows: i64,
    pub tokens: i64,
    pub hits: Vec<i64>,
}

/// FTS5's `bm25()` of one row (lower is better): the sum over every phrase of the
/// query of its IDF times its saturated frequency in the row, negated.
pub(super) fn bm25(phrases: &[&Phrase], corpus: &Corpus, row: &[String]) -> f64 {
    const K1: f64 = 1.2;
    const B: f64 = 0.75;
    let rows = corpus.rows.max(1) as f64;
    let average = (corpus.tokens.max(1) as f64) / rows;
    let length = row.len() as f64;
    let mut score = 0.0;
    for (i, phrase) in phrases.iter().enumerate() {
        let hits = corpus.hits.get(i).copied().unwrap_or(0) as f64;
        let mut idf = ((rows - hits + 0.5) / (hits + 0.5)).ln();
        if idf <= 0.0 {
            idf = 1e-6;
        }
        let f = phrase.starts(row).len() as f64;
        score += idf * (f * (K1 + 1.0)) / (f + K1 * (1.0 - B + B * length / average));
    }
    -score
}

/// Tokens in a snippet, as FTS5's `snippet(…, 16)`.
const SNIPPET_TOKENS: usize = 16;

/// The snippet of `text` around the phrases' matches, FTS5's way: the window of
/// [`SNIPPET_TOKENS`] tokens that holds the most different phrases (then the most
/// matches), centred on them; matches wrapped in `open`…`close`, a cut marked `cut`.
pub(super) fn snippet(text: &str, phrases: &[&Phrase], marks: (char, char, char)) -> String {
    let (open, close, cut) = marks;
    let found = tokens(text);
    let row: Vec<String> = found.iter().map(|(_, t)| t.clone()).collect();
    // Each match: (first token, last token, phrase).
    let mut matches: Vec<(usize, usize, usize)> = Vec::new();
    for (p, phrase) in phrases.iter().enumerate() {
        for at in phrase.starts(&row) {
            matches.push((at, at + phrase.tokens.len() - 1, p));
        }
    }
    matches.sort_unstable();
    let n = row.len();
    let (first, last) = if n <= SNIPPET_TOKENS {
        (0, n.saturating_sub(1))
    } else {
        let mut best = (0usize, 0usize);
        for &(begin, ..) in &matches {
            let inside: Vec<&(usize, usize, usize)> = matches
                .iter()
                .filter(|m| m.0 >= begin && m.1 < begin + SNIPPET_TOKENS)
                .collect();
            let mut seen = std::collections::HashSet::new();
            let score: usize = inside
                .iter()
                .map(|m| if seen.insert(m.2) { 1000 } else { 1 })
                .sum();
            let span_end = inside.iter().map(|m| m.1).max().unwrap_or(begin);
            let centred = begin.saturating_sub((SNIPPET_TOKENS - (span_end - begin + 1)) / 2);
            let start = centred.min(n - SNIPPET_TOKENS);
            if score > best.1 {
                best = (start, score);
            }
        }
        (best.0, best.0 + SNIPPET_TOKENS - 1)
    };
    let mut marked = vec![false; n];
    for &(begin, end, _) in &matches {
        for flag in marked.iter_mut().take(end + 1).skip(begin) {
            *flag = true;
        }
    }
    let mut out = String::new();
    let from = if first == 0 {
        0
    } else {
        out.push(cut);
        found.get(first).map_or(0, |(range, _)| range.start)
    };
    let mut at = from;
    let mut open_now = false;
    for (i, (range, _)) in found.iter().enumerate().take(last + 1).skip(first) {
        out.push_str(text.get(at..range.start).unwrap_or(""));
        let starts = marked[i] && !open_now;
        // A match's tokens and what is between them are one marked run.
        if starts {
            out.push(open);
            open_now = true;
        }
        out.push_str(text.get(range.clone()).unwrap_or(""));
        // The next token in the same match keeps the run open.
        let joined = matches.iter().any(|m| m.0 <= i && m.1 > i);
        if open_now && !joined {
            out.push(close);
            open_now = false;
        }
        at = range.end;
    }
    if last + 1 >= n {
        out.push_str(text.get(at..).unwrap_or(""));
    } else {
        out.push(cut);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_split_and_fold_as_unicode61() {
        let words: Vec<String> = tokens("Un café CRÈME, à Zürich; e-mail 3.5 Йога")
            .into_iter()
            .map(|(_, t)| t)
            .collect();
        assert_eq!(
            words,
            [
                "un", "cafe", "creme", "a", "zurich", "e", "mail", "3", "5", "йога"
            ]
        );
    }

    #[test]
    fn a_tsvector_lists_each_token_with_its_positions() {
        assert_eq!(
            tsvector("Tired, tired o'clock"),
            ("'clock':4 'o':3 'tired':1,2".to_owned(), 4)
        );
    }

    #[test]
    fn a_word_of_several_tokens_is_a_phrase_and_a_stem_a_prefix() {
        let clauses = phrases(&[
            vec![
                Alternative::Word("E-mail".into()),
                Alternative::Prefix("mail".into()),
            ],
            vec![Alternative::Word("-".into())],
        ])
        .expect("searchable");
        assert_eq!(tsquery(&clauses), "(('e' <-> 'mail') | 'mail':*)");
    }

    #[test]
    fn a_word_too_long_for_a_lexeme_finds_nothing_rather_than_everything() {
        let long = "a".repeat(MAX_LEXEME + 1);
        assert_eq!(
            phrases(&[
                vec![Alternative::Word("coffee".into())],
                vec![Alternative::Word(long.clone())],
            ]),
            None
        );
        let (vector, length) = tsvector(&format!("coffee {long}"));
        assert_eq!((vector.as_str(), length), ("'coffee':1", 2));
    }

    #[test]
    fn a_short_text_is_its_own_snippet_with_its_matches_marked() {
        let clauses = phrases(&[vec![Alternative::Word("coffee".into())]]).expect("searchable");
        let all: Vec<&Phrase> = clauses.iter().flatten().collect();
        assert_eq!(
            snippet("Ran, then coffee.", &all, ('[', ']', '~')),
            "Ran, then [coffee]."
        );
    }
}
