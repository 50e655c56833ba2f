//! The other forms of a `/search` word (docs/behaviour.md, Search and Import): "друзья" should find "с друзьями",
//! "run" should find "running". The index holds words as written (folded, see
//! [`super::fold_for_search`]), so the forms are found on the query side, from the
//! word's Snowball stem ([`rust_stemmers`]); [`super::fts_query`] turns them into FTS5.
//!
//! - The stemmer is picked by the word's letters: only letters of the Russian alphabet →
//!   Russian; only ASCII letters → English; anything else (digits, punctuation, a mix
//!   of scripts, other alphabets, Latin letters with diacritics) → the word only.
//!   rust-stemmers 1.2.0 is known to panic on some Greek words (it cuts a multi-byte
//!   letter in two; fixed in Snowball since, not in this crate), so it is given these
//!   two alphabets only, which the tests below feed it at random; should it panic all
//!   the same, the word loses its forms, not the search.
//! - The stem is taken of the folded, lower-cased word: the Russian stemmer does not
//!   know `ё` (it leaves "ёлка" whole), and the index holds `е` anyway.
//! - A stem of [`PREFIX_STEM_CHARS`] or more letters stands for every word that begins
//!   with it ("друз" → "друзья", "друзьями", "друзей").
//! - A stem of [`LISTED_STEM_CHARS`] letters is too short for that: "кот" would find
//!   "который" and "котлета", "вод" "водитель". It stands for itself and itself followed
//!   by one ending of its language ([`RUSSIAN_ENDINGS`], [`ENGLISH_ENDINGS`]): "кот" →
//!   "кота", "котом", "коты", never "который"; "бег" → "бега", "бегал"; "run" → "runs",
//!   "running" (English doubles a last consonant before some endings).
//! - A shorter stem ("ещ" of "еще", "он" of "она") would find almost anything: the word
//!   only.

use rust_stemmers::{Algorithm, Stemmer};

/// A stem at least this long is searched as a prefix.
pub const PREFIX_STEM_CHARS: usize = 4;

/// A stem this long is searched with the endings of its language only.
pub const LISTED_STEM_CHARS: usize = 3;

/// What a search word matches besides itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forms {
    /// Nothing else: the word only.
    Exact,
    /// Every word that begins with one of these (lower case): the stem, and for an
    /// English stem that ends in the `i` the stemmer made of a `y`, the stem with its
    /// `y` ("cities" → "citi", "city": `citi*` alone misses "city").
    Prefix(Vec<String>),
    /// These words (lower case): the stem, and the stem with each ending of its language.
    Listed(Vec<String>),
}

/// The forms of one search word, already folded ([`super::fold_for_search`]).
pub fn forms(folded: &str) -> Forms {
    let Some(alphabet) = Alphabet::of(folded) else {
        return Forms::Exact;
    };
    let lower = folded.to_lowercase();
    // A stemmer bug (see the module doc) must cost the word its forms, not the search.
    let Ok(stem) = std::panic::catch_unwind(|| alphabet.stem(&lower)) else {
        // The word is the user's text: at debug only.
        tracing::warn!("the stemmer failed on a search word; searching it as written");
        tracing::debug!(word = %lower, "the word the stemmer failed on");
        return Forms::Exact;
    };
    match stem.chars().count() {
        n if n >= PREFIX_STEM_CHARS => {
            let y_form = alphabet.y_form(&stem);
            Forms::Prefix(std::iter::once(stem).chain(y_form).collect())
        }
        LISTED_STEM_CHARS => Forms::Listed(alphabet.listed(&stem)),
        _ => Forms::Exact,
    }
}

/// The alphabets that have a stemmer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Alphabet {
    Russian,
    English,
}

impl Alphabet {
    /// The alphabet all of a word's letters are of, if it has a stemmer.
    fn of(word: &str) -> Option<Self> {
        let russian = |c: char| matches!(c, 'а'..='я' | 'А'..='Я' | 'ё' | 'Ё');
        if word.is_empty() {
            None
        } else if word.chars().all(russian) {
            Some(Self::Russian)
        } else if word.chars().all(|c| c.is_ascii_alphabetic()) {
            Some(Self::English)
        } else {
            None
        }
    }

    /// The Snowball stem of a lower-case word of this alphabet.
    fn stem(self, lower: &str) -> String {
        let algorithm = match self {
            Self::Russian => Algorithm::Russian,
            Self::English => Algorithm::English,
        };
        Stemmer::create(algorithm).stem(lower).into_owned()
    }

    /// The English stem with the `y` the stemmer turned into its last `i` ("citi" →
    /// "city", "happi" → "happy", "tri" → "try"); `None` for any other stem. A stem of a
    /// word that had an `i` of its own ("ski") gets it too: one word more to look for.
    fn y_form(self, stem: &str) -> Option<String> {
        match self {
            Self::English => stem
                .strip_suffix('i')
                .filter(|base| !base.is_empty())
                .map(|base| format!("{base}y")),
            Self::Russian => None,
        }
    }

    /// A short stem, and the stem with each ending of this alphabet's language.
    fn listed(self, stem: &str) -> Vec<String> {
        let with = |endings: &[&str], stem: &str| -> Vec<String> {
            endings
                .iter()
                .map(|ending| format!("{stem}{ending}"))
                .collect()
        };
        let mut words = vec![stem.to_owned()];
        match self {
            Self::Russian => words.extend(with(RUSSIAN_ENDINGS, stem)),
            Self::English => {
                words.extend(with(ENGLISH_ENDINGS, stem));
                if let Some(doubled) = doubled_consonant(stem) {
                    words.extend(with(ENGLISH_DOUBLED_ENDINGS, &doubled));
                }
                // "tries" → "tri": "try", "trying" and "trys" have the `y` back.
                if let Some(y_form) = self.y_form(stem) {
                    words.extend(with(ENGLISH_Y_ENDINGS, &y_form));
                }
            }
        }
        words
    }
}

/// A short English stem written with its last consonant twice, as before `-ing` and
/// `-ed` when it ends in one consonant after one vowel: "run" → "runn" (running), "sit"
/// → "sitt"; not "and", "eat", nor before w, x or y ("box" → boxing).
fn doubled_consonant(stem: &str) -> Option<String> {
    let vowel = |c: char| "aeiou".contains(c);
    let [first, middle, last] = <[char; 3]>::try_from(stem.chars().collect::<Vec<_>>()).ok()?;
    (!vowel(first) && vowel(middle) && !vowel(last) && !"wxy".contains(last))
        .then(|| format!("{stem}{last}"))
}

/// The endings that the Russian Snowball stemmer takes off a noun, an adjective, a verb
/// or a perfective gerund, from its lists; those it takes off only after `а` or `я` are
/// written with each. Folded (`е` for `ё`). Reflexive (`-ся`) and participle forms of a
/// short word are not among them.
#[rustfmt::skip]
pub const RUSSIAN_ENDINGS: &[&str] = &[
    // nouns
    "а", "ев", "ов", "ие", "ье", "е", "иями", "ями", "ами", "еи", "ии", "и", "ией", "ей",
    "ой", "ий", "й", "иям", "ям", "ием", "ем", "ам", "ом", "о", "у", "ах", "иях", "ях", "ы",
    "ь", "ию", "ью", "ю", "ия", "ья", "я",
    // adjectives (those not above)
    "ее", "ые", "ое", "ими", "ыми", "ый", "им", "ым", "его", "ого", "ему", "ому", "их", "ых",
    "ую", "юю", "ая", "яя", "ою", "ею",
    // verbs (those not above)
    "ила", "ыла", "ена", "ейте", "уйте", "ите", "или", "ыли", "уй", "ил", "ыл", "ен", "ило",
    "ыло", "ено", "ят", "ует", "уют", "ит", "ыт", "ены", "ить", "ыть", "ишь",
    // verbs after а or я
    "ала", "ана", "аете", "айте", "али", "ай", "ал", "аем", "ан", "ало", "ано", "ает", "ают",
    "аны", "ать", "аешь", "анно",
    "яла", "яна", "яете", "яйте", "яли", "яй", "ял", "яем", "ян", "яло", "яно", "яет", "яют",
    "яны", "ять", "яешь", "янно",
    // perfective gerunds
    "ав", "авши", "яв", "явши", "ив", "ивши", "ыв", "ывши",
];

/// English endings after a short stem: plurals and verb forms, the comparative, and the
/// `y` → `i` forms ("try" → "tri" → "tries", "tried").
pub const ENGLISH_ENDINGS: &[&str] = &[
    "s", "es", "ed", "ing", "ings", "er", "ers", "est", "ly", "y", "ies", "ied",
];

/// English endings after a short stem's `y` form ("try"): itself, `-ing`, `-s`.
pub const ENGLISH_Y_ENDINGS: &[&str] = &["", "ing", "s"];

/// English endings after a short stem whose last consonant is doubled.
pub const ENGLISH_DOUBLED_ENDINGS: &[&str] = &["ing", "ings", "ed", "er", "ers", "est", "y"];

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use proptest::prelude::*;

    use super::*;

    fn listed_words(word: &str) -> Vec<String> {
        match forms(word) {
            Forms::Listed(words) => words,
            other => panic!("{word}: {other:?}"),
        }
    }

    #[test]
    fn the_stem_decides_between_a_prefix_a_list_and_the_word_only() {
        let table: &[(&str, Forms)] = &[
            ("друзья", Forms::Prefix(vec!["друз".into()])),
            ("Работа", Forms::Prefix(vec!["работ".into()])),
            ("walked", Forms::Prefix(vec!["walk".into()])),
            ("coffee", Forms::Prefix(vec!["coffe".into()])),
            // Short stems: a list (checked below).
            // Too short a stem, and words the stemmers are not given.
            ("еще", Forms::Exact),
            ("она", Forms::Exact),
            ("a", Forms::Exact),
            ("café", Forms::Exact),
            ("morning20", Forms::Exact),
            ("Ёж-ик", Forms::Exact),
            ("park*", Forms::Exact),
            ("\"quoted\"", Forms::Exact),
            ("\u{456}нший", Forms::Exact),
            ("їжак", Forms::Exact),
            ("καλημέρα", Forms::Exact),
            ("", Forms::Exact),
        ];
        for (word, expected) in table {
            assert_eq!(&forms(word), expected, "{word}");
        }
    }

    #[test]
    fn a_short_stem_lists_its_forms_not_every_word_it_begins() {
        let cat = listed_words("кот");
        let run = listed_words("RUN");
        let fir = listed_words("елка");

        for form in ["кот", "кота", "коту", "котом", "коты", "котов"] {
            assert!(cat.iter().any(|w| w == form), "{form}: {cat:?}");
        }
        for stranger in ["который", "котлета", "коттедж"] {
            assert!(!cat.iter().any(|w| w == stranger), "{stranger}");
        }
        for form in ["run", "runs", "running", "runner"] {
            assert!(run.iter().any(|w| w == form), "{form}: {run:?}");
        }
        assert_eq!(listed_words("running"), run);
        assert!(fir.iter().any(|w| w == "елку"), "{fir:?}");
        assert!(listed_words("бег").iter().any(|w| w == "бегал"));
        // No doubling after two vowels, two consonants, or before w, x, y.
        for (word, not) in [("eat", "eatting"), ("and", "andding"), ("box", "boxxing")] {
            assert!(!listed_words(word).iter().any(|w| w == not), "{word}");
        }
    }

    #[test]
    fn the_ending_lists_are_folded_and_without_repeats() {
        for list in [RUSSIAN_ENDINGS, ENGLISH_ENDINGS, ENGLISH_DOUBLED_ENDINGS] {
            let unique: HashSet<&&str> = list.iter().collect();
            assert_eq!(unique.len(), list.len(), "{list:?}");
            assert!(list.iter().all(|e| !e.is_empty() && !e.contains('ё')));
        }
    }

    proptest! {
        /// Whatever letters of its alphabet it is given, a stemmer answers (the panic
        /// that `forms` would catch is not there to catch) ...
        #[test]
        fn the_stemmers_answer_any_word_of_their_alphabet(
            russian in "[а-яё]{1,24}",
            english in "[a-z]{1,24}",
        ) {
            Alphabet::Russian.stem(&russian);
            Alphabet::English.stem(&english);
        }

        /// ... and a prefix is never shorter than promised.
        #[test]
        fn any_word_has_forms(
            word in prop_oneof![
                "[а-яёА-ЯЁ]{1,24}",
                "[a-zA-Z]{1,24}",
                "[а-яёa-z0-9'\\-]{1,12}",
            ]
        ) {
            match forms(&word) {
                Forms::Exact => {}
                Forms::Prefix(stems) => prop_assert!(stems.iter().all(|stem| stem.chars().count() >= PREFIX_STEM_CHARS)),
                Forms::Listed(words) => {
                    prop_assert_eq!(words[0].chars().count(), LISTED_STEM_CHARS);
                }
            }
        }
    }
}
