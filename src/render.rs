//! Reply rendering: the one place that turns a reply into Telegram HTML (or plain text
//! for `daylog chat`) and splits it into messages Telegram accepts.
//!
//! A reply is a list of [`Piece`]s — plain text and a few styled runs — never a string of
//! HTML, so LLM and user text cannot smuggle markup in: every piece is escaped on the way
//! out. Splitting works on the *visible* text (what Telegram counts after parsing
//! entities, in UTF-16 code units) with each character's style beside it, and renders
//! every part on its own; a style that spans a split is therefore closed at the end of one
//! part and reopened at the start of the next, and a cut can never land inside a tag or an
//! entity.
//!
//! # The split invariant
//!
//! For `parts = split_message(pieces, limit)` with `limit >= 2` and `V` the visible text of
//! `pieces` (what [`to_plain`] returns):
//!
//! 1. every part is valid Telegram HTML: only `<b>`, `<i>`, `<code>`, balanced and not
//!    nested, and only the entities `&amp;`, `&lt;`, `&gt;`;
//! 2. every part's visible text is at most `limit` UTF-16 code units, is not empty, and
//!    neither starts nor ends with whitespace (`char::is_whitespace`);
//! 3. `V == W0 + P1 + W1 + P2 + … + Pn + Wn` where `Pi` is the visible text of part `i`
//!    and every `Wi` is whitespace only (possibly empty): text is only ever dropped at
//!    the split points and at the two ends of the message, and only whitespace;
//! 4. if `V` is whitespace only (or empty), there are no parts at all — Telegram rejects
//!    an empty message, so the caller decides what to send instead.
//!
//! Cuts prefer, in order, a paragraph break (a whitespace run with two or more `\n`),
//! a line break, then any whitespace, as long as the cut keeps at least half of the room
//! in the part; otherwise the latest whitespace wins. A word longer than the room left is
//! cut hard, at a character boundary that, where possible, does not split a grapheme
//! (combining marks, emoji modifiers, ZWJ sequences, flag pairs). A `limit` below 2 is
//! treated as 2, the size of one surrogate pair.

use std::fmt::Write as _;

/// Telegram's limit on the text of one message, in UTF-16 code units after entity
/// parsing.
pub const TELEGRAM_MESSAGE_LIMIT: usize = 4096;

/// One piece of a reply. Text in every variant is raw (unescaped) text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    Bold(String),
    Italic(String),
    Code(String),
    Newline,
}

/// A reply under construction: a list of [`Piece`]s, built with chained calls.
///
/// ```
/// use daylog::render::{Reply, split_message, TELEGRAM_MESSAGE_LIMIT};
/// let reply = Reply::new()
///     .bold("Day logged")
///     .paragraph()
///     .text("LLM analysis <with> & markup is escaped")
///     .paragraph()
///     .italic("mood 4 · stress 2 · energy 3");
/// let parts = split_message(reply.pieces(), TELEGRAM_MESSAGE_LIMIT);
/// assert_eq!(parts.len(), 1);
/// assert!(parts[0].starts_with("<b>Day logged</b>\n\nLLM analysis &lt;with&gt; &amp;"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reply {
    pieces: Vec<Piece>,
}

impl Reply {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn text(self, text: impl Into<String>) -> Self {
        self.push(Piece::Text(text.into()))
    }

    pub fn bold(self, text: impl Into<String>) -> Self {
        self.push(Piece::Bold(text.into()))
    }

    pub fn italic(self, text: impl Into<String>) -> Self {
        self.push(Piece::Italic(text.into()))
    }

    pub fn code(self, text: impl Into<String>) -> Self {
        self.push(Piece::Code(text.into()))
    }

    /// One line break.
    pub fn newline(self) -> Self {
        self.push(Piece::Newline)
    }

    /// An empty line between two blocks; the splitter prefers to cut here.
    pub fn paragraph(self) -> Self {
        self.push(Piece::Newline).push(Piece::Newline)
    }

    pub fn push(mut self, piece: Piece) -> Self {
        self.pieces.push(piece);
        self
    }

    pub fn pieces(&self) -> &[Piece] {
        &self.pieces
    }
}

impl From<Vec<Piece>> for Reply {
    fn from(pieces: Vec<Piece>) -> Self {
        Self { pieces }
    }
}

/// Escapes text for Telegram's HTML parse mode. Only `&`, `<` and `>` need it; quotes
/// are left alone because replies never put text inside attributes.
pub fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

/// The visible text of one rendered part (tags dropped, entities decoded): the fallback
/// when Telegram refuses a part's HTML.
pub fn html_to_plain(html: &str) -> String {
    let mut out = String::with_capacity(html.len());
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&amp;", "&")
}

/// The visible text of a reply, for the terminal (`daylog chat`) and for logs.
pub fn to_plain(pieces: &[Piece]) -> String {
    styled_chars(pieces).into_iter().map(|(c, _)| c).collect()
}

/// The whole reply as one HTML string, unsplit and untrimmed.
pub fn to_html(pieces: &[Piece]) -> String {
    render(&styled_chars(pieces))
}

/// Splits a reply into Telegram HTML messages of at most `limit` visible UTF-16 code
/// units each (use [`TELEGRAM_MESSAGE_LIMIT`]). See the module documentation for the
/// exact guarantees.
pub fn split_message(pieces: &[Piece], limit: usize) -> Vec<String> {
    let limit = limit.max(2);
    let chars = styled_chars(pieces);
    let mut parts = Vec::new();
    let mut start = skip_whitespace(&chars, 0);
    while start < chars.len() {
        let (end, next) = next_cut(&chars, start, limit);
        parts.push(render(&chars[start..end]));
        start = skip_whitespace(&chars, next);
    }
    parts
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    Plain,
    Bold,
    Italic,
    Code,
}

impl Style {
    fn tag(self) -> Option<&'static str> {
        match self {
            Self::Plain => None,
            Self::Bold => Some("b"),
            Self::Italic => Some("i"),
            Self::Code => Some("code"),
        }
    }
}

type StyledChar = (char, Style);

fn styled_chars(pieces: &[Piece]) -> Vec<StyledChar> {
    let mut out = Vec::new();
    for piece in pieces {
        let (text, style) = match piece {
            Piece::Text(t) => (t.as_str(), Style::Plain),
            Piece::Bold(t) => (t.as_str(), Style::Bold),
            Piece::Italic(t) => (t.as_str(), Style::Italic),
            Piece::Code(t) => (t.as_str(), Style::Code),
            Piece::Newline => ("\n", Style::Plain),
        };
        out.extend(text.chars().map(|c| (c, style)));
    }
    out
}

/// Renders a run of styled characters as self-contained HTML: every styled run is opened
/// and closed within it.
fn render(chars: &[StyledChar]) -> String {
    let mut out = String::with_capacity(chars.len() + 16);
    let mut current = Style::Plain;
    for &(c, style) in chars {
        if style != current {
            if let Some(tag) = current.tag() {
                let _ = write!(out, "</{tag}>");
            }
            if let Some(tag) = style.tag() {
                let _ = write!(out, "<{tag}>");
            }
            current = style;
        }
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    if let Some(tag) = current.tag() {
        let _ = write!(out, "</{tag}>");
    }
    out
}

fn skip_whitespace(chars: &[StyledChar], mut i: usize) -> usize {
    while i < chars.len() && chars[i].0.is_whitespace() {
        i += 1;
    }
    i
}

/// Where the part that starts at `start` (a non-whitespace character) ends: returns
/// `(end, next)` — the part is `chars[start..end]`, and the following part starts at
/// `next` after its leading whitespace is skipped. `chars[start..end]` never ends with
/// whitespace, and `chars[end..next]` is whitespace only.
fn next_cut(chars: &[StyledChar], start: usize, limit: usize) -> (usize, usize) {
    // The furthest end that fits: chars[start..max_end] is at most `limit` units.
    let mut units = 0;
    let mut max_end = start;
    while max_end < chars.len() {
        let w = chars[max_end].0.len_utf16();
        if units + w > limit {
            break;
        }
        units += w;
        max_end += 1;
    }
    if max_end == chars.len() {
        let mut end = chars.len();
        while end > start && chars[end - 1].0.is_whitespace() {
            end -= 1;
        }
        return (end, chars.len());
    }
    if max_end == start {
        // Cannot happen with limit >= 2 (a char is at most 2 units); keep progress anyway.
        return (start + 1, start + 1);
    }

    // Whitespace runs that start inside the room, ranked by the break they make.
    let half = start + (max_end - start).div_ceil(2);
    let mut best: [Option<usize>; 3] = [None; 3]; // latest cut per rank, at or past half
    let mut latest_any: Option<usize> = None;
    let mut i = start + 1;
    while i <= max_end {
        if chars[i].0.is_whitespace() {
            let run_start = i;
            let mut newlines = 0;
            while i < chars.len() && chars[i].0.is_whitespace() {
                if chars[i].0 == '\n' {
                    newlines += 1;
                }
                i += 1;
            }
            let rank = newlines.min(2);
            latest_any = Some(run_start);
            if run_start >= half {
                best[rank] = Some(run_start);
            }
        } else {
            i += 1;
        }
    }
    if let Some(cut) = best.iter().rev().flatten().next().copied().or(latest_any) {
        return (cut, cut);
    }

    // One word longer than the room: cut it, ideally between graphemes.
    let cut = grapheme_cut(chars, start, max_end);
    (cut, cut)
}

/// The latest cut in `(start, max_end]` that does not split a grapheme cluster, by a
/// small approximation of UAX #29; `max_end` if there is none.
fn grapheme_cut(chars: &[StyledChar], start: usize, max_end: usize) -> usize {
    let mut cut = max_end;
    while cut > start + 1 && !is_grapheme_boundary(chars, cut) {
        cut -= 1;
    }
    if is_grapheme_boundary(chars, cut) {
        cut
    } else {
        max_end
    }
}

fn is_grapheme_boundary(chars: &[StyledChar], at: usize) -> bool {
    let (Some(&(before, _)), Some(&(after, _))) = (chars.get(at.wrapping_sub(1)), chars.get(at))
    else {
        return true;
    };
    if before == '\u{200D}' || extends(after) {
        return false;
    }
    if is_regional_indicator(before) && is_regional_indicator(after) {
        // Flags are pairs: a cut is inside one when an odd number of indicators precede it.
        let run = chars[..at]
            .iter()
            .rev()
            .take_while(|(c, _)| is_regional_indicator(*c))
            .count();
        return run % 2 == 0;
    }
    true
}

/// Characters that attach to the one before them.
fn extends(c: char) -> bool {
    matches!(c,
        '\u{0300}'..='\u{036F}'     // combining diacritics
        | '\u{0483}'..='\u{0489}'   // Cyrillic combining marks
        | '\u{1AB0}'..='\u{1AFF}'
        | '\u{1DC0}'..='\u{1DFF}'
        | '\u{200C}'..='\u{200D}'   // ZWNJ, ZWJ
        | '\u{20D0}'..='\u{20FF}'   // combining marks for symbols (keycaps)
        | '\u{FE00}'..='\u{FE0F}'   // variation selectors
        | '\u{FE20}'..='\u{FE2F}'
        | '\u{1F3FB}'..='\u{1F3FF}' // skin tones
        | '\u{E0020}'..='\u{E007F}' // tag sequences (subdivision flags)
        | '\u{E0100}'..='\u{E01EF}'
    )
}

fn is_regional_indicator(c: char) -> bool {
    ('\u{1F1E6}'..='\u{1F1FF}').contains(&c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What a Telegram client would see: parses one message of our HTML subset, checking
    /// it on the way, and returns its visible text.
    fn parse_telegram_html(html: &str) -> Result<String, String> {
        let mut visible = String::new();
        let mut open: Option<&str> = None;
        let mut rest = html;
        while let Some(c) = rest.chars().next() {
            match c {
                '<' => {
                    let close = rest.find('>').ok_or("unterminated tag")?;
                    let tag = &rest[1..close];
                    match tag {
                        "b" | "i" | "code" => {
                            if let Some(outer) = open {
                                return Err(format!("<{tag}> inside <{outer}>"));
                            }
                            open = Some(tag);
                        }
                        "/b" | "/i" | "/code" => {
                            if open != Some(&tag[1..]) {
                                return Err(format!("<{tag}> closes {open:?}"));
                            }
                            open = None;
                        }
                        _ => return Err(format!("tag not allowed: <{tag}>")),
                    }
                    rest = &rest[close + 1..];
                }
                '&' => {
                    let (entity, decoded) = [("&amp;", '&'), ("&lt;", '<'), ("&gt;", '>')]
                        .into_iter()
                        .find(|(e, _)| rest.starts_with(e))
                        .ok_or_else(|| format!("bad entity at {:?}", &rest[..rest.len().min(8)]))?;
                    visible.push(decoded);
                    rest = &rest[entity.len()..];
                }
                '>' => return Err("raw '>'".into()),
                c => {
                    visible.push(c);
                    rest = &rest[c.len_utf8()..];
                }
            }
        }
        if let Some(tag) = open {
            return Err(format!("<{tag}> left open"));
        }
        Ok(visible)
    }

    fn utf16_len(s: &str) -> usize {
        s.encode_utf16().count()
    }

    /// Checks every clause of the split invariant in the module docs.
    fn check_split(pieces: &[Piece], limit: usize) -> Result<Vec<String>, String> {
        let parts = split_message(pieces, limit);
        let input = to_plain(pieces);
        let mut rest = input.as_str();
        for (n, part) in parts.iter().enumerate() {
            let visible = parse_telegram_html(part).map_err(|e| format!("part {n}: {e}"))?;
            if visible.is_empty() {
                return Err(format!("part {n} is empty"));
            }
            if utf16_len(&visible) > limit.max(2) {
                return Err(format!("part {n} has {} units", utf16_len(&visible)));
            }
            if visible.starts_with(char::is_whitespace) || visible.ends_with(char::is_whitespace) {
                return Err(format!("part {n} has whitespace at an end: {visible:?}"));
            }
            rest = rest.trim_start();
            rest = rest
                .strip_prefix(visible.as_str())
                .ok_or_else(|| format!("part {n} {visible:?} is not next in {rest:?}"))?;
        }
        if !rest.trim().is_empty() {
            return Err(format!("text left over after the last part: {rest:?}"));
        }
        Ok(parts)
    }

    #[test]
    fn escape_html_escapes_the_three_markup_characters() {
        assert_eq!(
            escape_html(r#"<b>x</b> & "y" &amp;"#),
            r#"&lt;b&gt;x&lt;/b&gt; &amp; "y" &amp;amp;"#
        );
    }

    #[test]
    fn a_short_reply_is_one_message_with_its_tags() {
        let reply = Reply::new()
            .bold("Title")
            .paragraph()
            .text("Analysis.")
            .newline()
            .italic("mood 4")
            .text(" ")
            .code("x<y");

        let parts = split_message(reply.pieces(), TELEGRAM_MESSAGE_LIMIT);

        assert_eq!(
            parts,
            vec!["<b>Title</b>\n\nAnalysis.\n<i>mood 4</i> <code>x&lt;y</code>"]
        );
        assert_eq!(to_plain(reply.pieces()), "Title\n\nAnalysis.\nmood 4 x<y");
        assert_eq!(to_html(reply.pieces()), parts[0]);
    }

    #[test]
    fn hostile_text_is_escaped_in_every_piece() {
        let hostile = r#"<script>alert(1)</script> </b> &lt; <a href="http://x">y</a> &"#;
        let reply = Reply::new()
            .text(hostile)
            .bold(hostile)
            .italic(hostile)
            .code(hostile);

        let parts = check_split(reply.pieces(), TELEGRAM_MESSAGE_LIMIT).unwrap();

        assert_eq!(parts.len(), 1);
        assert!(!parts[0].contains("<script>"));
        assert!(!parts[0].contains("<a "));
        assert!(parts[0].starts_with(
            "&lt;script&gt;alert(1)&lt;/script&gt; &lt;/b&gt; &amp;lt; &lt;a href=\"http://x\"&gt;"
        ));
        assert_eq!(parse_telegram_html(&parts[0]).unwrap(), hostile.repeat(4));
    }

    #[test]
    fn nine_thousand_characters_make_three_messages() {
        let text = "lorem ipsum dolor sit amet ".repeat(334); // 9018 chars
        assert!(text.chars().count() > 9000);

        let parts = check_split(&[Piece::Text(text)], TELEGRAM_MESSAGE_LIMIT).unwrap();

        assert_eq!(parts.len(), 3);
        assert!(parts.iter().all(|p| utf16_len(p) <= TELEGRAM_MESSAGE_LIMIT));
        // Word boundaries: every part ends with a whole word.
        assert!(parts.iter().all(|p| p.ends_with("amet")
            || p.ends_with("sit")
            || p.ends_with("dolor")
            || p.ends_with("ipsum")
            || p.ends_with("lorem")));
    }

    #[test]
    fn entities_count_as_one_visible_character() {
        // 4096 '&' are 4096 visible characters though the HTML is five times longer.
        let parts = check_split(&[Piece::Text("&".repeat(4096))], 4096).unwrap();

        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].len(), 4096 * 5);
    }

    #[test]
    fn paragraph_breaks_win_over_line_breaks_and_words() {
        let first = "a".repeat(60);
        let text = format!("{first}\n\nsecond paragraph line\nmore words here");

        let parts = check_split(&[Piece::Text(text)], 90).unwrap();

        assert_eq!(parts[0], first);
        assert_eq!(parts[1], "second paragraph line\nmore words here");
    }

    #[test]
    fn an_early_paragraph_break_does_not_make_a_tiny_part() {
        let text = format!("hi\n\n{}", "word ".repeat(40));

        let parts = check_split(&[Piece::Text(text)], 100).unwrap();

        assert!(utf16_len(&parts[0]) > 50, "{parts:?}");
    }

    #[test]
    fn line_breaks_win_over_spaces() {
        let text = format!("{}\n{}", "ab ".repeat(20).trim_end(), "cd ".repeat(20));

        let parts = check_split(&[Piece::Text(text)], 70).unwrap();

        assert_eq!(parts[0], "ab ".repeat(20).trim_end());
    }

    #[test]
    fn an_overlong_word_is_cut_hard() {
        let word = "x".repeat(250);

        let parts = check_split(&[Piece::Text(format!("short {word} end"))], 100).unwrap();

        assert_eq!(parts[0], "short");
        assert_eq!(parts[1], "x".repeat(100));
        assert_eq!(parts[2], "x".repeat(100));
        assert_eq!(parts[3], "x".repeat(50) + " end");
    }

    #[test]
    fn emoji_are_never_cut_in_half() {
        // Each 😀 is two UTF-16 units; with an odd limit a naive cut would split one.
        let parts = check_split(&[Piece::Text("😀".repeat(10))], 5).unwrap();

        assert!(parts.iter().all(|p| p == "😀😀"), "{parts:?}");
        assert_eq!(parts.len(), 5);
    }

    #[test]
    fn flags_and_skin_tones_stay_whole_when_possible() {
        let flags = "🇷🇺🇬🇧🇫🇷"; // three flags, four units each
        let parts = check_split(&[Piece::Text(flags.into())], 6).unwrap();
        assert_eq!(parts, vec!["🇷🇺", "🇬🇧", "🇫🇷"]);

        let thumbs = "👍🏽👍🏽"; // four units each
        let parts = check_split(&[Piece::Text(thumbs.into())], 6).unwrap();
        assert_eq!(parts, vec!["👍🏽", "👍🏽"]);
    }

    #[test]
    fn cyrillic_at_a_boundary_counts_one_unit_per_letter() {
        let text = "привет ".repeat(20);

        // 19 units end inside the third word, so the cut goes back to the space before it.
        let parts = check_split(&[Piece::Text(text)], 19).unwrap();

        assert!(parts.iter().all(|p| p == "привет привет"), "{parts:?}");
        assert_eq!(parts.len(), 10);
    }

    #[test]
    fn bold_across_a_boundary_is_closed_and_reopened() {
        let reply = Reply::new()
            .text("intro ")
            .bold("one two three four five six");

        let parts = check_split(reply.pieces(), 16).unwrap();

        assert_eq!(
            parts,
            vec![
                "intro <b>one two</b>",
                "<b>three four five</b>",
                "<b>six</b>"
            ]
        );
    }

    #[test]
    fn whitespace_only_input_gives_no_parts() {
        assert!(split_message(&[], 10).is_empty());
        assert!(split_message(&[Piece::Text("  \n ".into()), Piece::Newline], 10).is_empty());
        assert!(split_message(&[Piece::Bold(String::new())], 10).is_empty());
    }

    #[test]
    fn a_limit_below_two_still_keeps_surrogate_pairs_whole() {
        let parts = check_split(&[Piece::Text("a😀b".into())], 1).unwrap();

        assert_eq!(parts, vec!["a", "😀", "b"]);
    }

    fn hostile_char() -> impl Strategy<Value = char> {
        prop_oneof![
            4 => prop::sample::select(vec![
                '<', '>', '&', ';', ' ', ' ', '\n', '\n', '\t', 'a', 'b', 'я', 'Ж', '😀', '👍',
                '\u{1F3FD}', '\u{200D}', '\u{FE0F}', '\u{0301}', '\u{1F1F7}', '\u{1F1FA}',
                '\u{00A0}', '/', '"',
            ]),
            1 => any::<char>(),
        ]
    }

    fn text() -> impl Strategy<Value = String> {
        prop::collection::vec(hostile_char(), 0..60).prop_map(|cs| cs.into_iter().collect())
    }

    fn piece() -> impl Strategy<Value = Piece> {
        prop_oneof![
            3 => text().prop_map(Piece::Text),
            1 => text().prop_map(Piece::Bold),
            1 => text().prop_map(Piece::Italic),
            1 => text().prop_map(Piece::Code),
            1 => Just(Piece::Newline),
        ]
    }

    proptest! {
        // 256 cases by default; PROPTEST_CASES=20000 for a longer hunt.
        #![proptest_config(ProptestConfig::default())]

        #[test]
        fn every_split_keeps_the_invariant(
            pieces in prop::collection::vec(piece(), 0..12),
            limit in 1usize..80,
        ) {
            if let Err(e) = check_split(&pieces, limit) {
                prop_assert!(false, "{e}\npieces: {pieces:?}\nlimit: {limit}");
            }
        }

        #[test]
        fn unsplit_html_parses_back_to_the_plain_text(pieces in prop::collection::vec(piece(), 0..12)) {
            prop_assert_eq!(parse_telegram_html(&to_html(&pieces)), Ok(to_plain(&pieces)));
        }
    }
}
