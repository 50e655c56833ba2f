//! Repair of the JSON object an LLM was asked for (docs/behaviour.md, Metrics).
//!
//! Free and cheap models wrap their JSON in Markdown fences, put prose or `<think>`
//! reasoning around it, stop mid-object when they hit a token limit, and leave trailing
//! commas. [`repair`] finds the outermost object and rewrites it, in one pass over the
//! bytes, into compact JSON that `serde_json` accepts; it never panics.
//!
//! Choices where the spec is silent:
//! - An unclosed `<think>` block means the model ran out of tokens while reasoning: what
//!   follows it is reasoning, not an answer, and is ignored.
//! - A truncated string that is an object *value* is closed (a cut summary is still a
//!   summary); a truncated *key* or *array item* is dropped (`"yo` is not the activity
//!   `yoga`, it is noise).
//! - A number at the very end is dropped: nothing shows it is complete (`6` may be the
//!   start of `6.5`). A comma, bracket or brace after it does (`{"mood": 4, "stre`).
//!   So is a number in quotes cut before its closing quote (`"sleep_hours": "7`).
//! - A bare word that is not JSON (`NaN`, `None`, `Infinity`, `four`) becomes `null`, so
//!   one odd field is defaulted instead of losing the whole object; `True`/`False` are
//!   read as booleans, `+4`/`.5` as numbers, bare keys (`{mood: 4}`) are quoted.
//! - Raw control characters inside strings are escaped, unknown escapes (`\'`) lose
//!   their backslash.
//! - One bad token costs one field, not the object: `//` and `/* */` comments are
//!   blank; a quote inside a string that is not followed by what may follow the
//!   string's end (`"he said "hi" and left"`) is text; `'single-quoted'` strings are
//!   strings; a bare fraction (`4/5`) is read as the string `"4/5"` (the metrics read
//!   it on their scale); and anything else that cannot be mended drops the member it
//!   stands in, from its key to the next `,` or closing bracket. A closing bracket of
//!   the wrong kind stands for the right one before a comma (`["run"}, "mood": 4`), and
//!   otherwise closes what is open up to its own kind (`[1, 2}`).
//! - The lookaheads that decide whether a quote ends a string read at most 64 bytes
//!   on, so repair stays linear on a string full of quotes and comment openers.

use std::borrow::Cow;

use serde_json::Value;

/// How many `{` in surrounding prose are tried before giving up, so that prose full of
/// braces stays linear.
const MAX_CANDIDATES: usize = 8;

/// The outermost JSON object in an LLM's answer, repaired; `None` if there is none.
pub fn repair(raw: &str) -> Option<Value> {
    let text = answer_part(raw);
    let region = fenced_part(text).unwrap_or(text);
    // Fast path: most answers are well-formed, perhaps wrapped; `serde_json` alone reads
    // them. Anything it rejects goes through the scanner, which gives the same result
    // for valid JSON.
    if let (Some(start), Some(end)) = (region.find('{'), region.rfind('}'))
        && start < end
        && let Ok(value @ Value::Object(_)) = serde_json::from_str::<Value>(&region[start..=end])
    {
        return Some(value);
    }
    let mut tried = 0;
    let mut from = 0;
    // `{good}` in prose before the answer repairs to `{}`: the object with fields may
    // come after it, and the empty one is the answer only when none does.
    let mut empty = None;
    while tried < MAX_CANDIDATES {
        let Some(offset) = region.get(from..).and_then(|rest| rest.find('{')) else {
            break;
        };
        let start = from + offset;
        tried += 1;
        if let Some(fixed) = Scanner::new(&region[start..]).run()
            && let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(&fixed)
        {
            if !fields.is_empty() {
                return Some(Value::Object(fields));
            }
            empty.get_or_insert(Value::Object(fields));
        }
        from = start + 1;
    }
    empty
}

/// The text outside `<think>…</think>` reasoning: after the last closing tag, or before
/// an unclosed opening one.
fn answer_part(raw: &str) -> &str {
    const OPEN: &str = "<think>";
    const CLOSE: &str = "</think>";
    if let Some(pos) = raw.rfind(CLOSE) {
        return &raw[pos + CLOSE.len()..];
    }
    match raw.find(OPEN) {
        Some(pos) => &raw[..pos],
        None => raw,
    }
}

/// The body of the first Markdown code fence that holds a `{`, up to its closing fence
/// or the end of the text (a truncated answer has none).
fn fenced_part(text: &str) -> Option<&str> {
    const FENCE: &str = "```";
    let mut rest = text;
    while let Some(open) = rest.find(FENCE) {
        let after = &rest[open + FENCE.len()..];
        // Skip the info string (`json`); the object may follow on the same line.
        let body = after.trim_start_matches(|c: char| c.is_ascii_alphanumeric() || c == '_');
        let (inner, next) = match body.find(FENCE) {
            Some(close) => (&body[..close], &body[close + FENCE.len()..]),
            None => (body, ""),
        };
        if inner.contains('{') {
            return Some(inner);
        }
        rest = next;
    }
    None
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Object,
    Array,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Object: a key or `}`.
    Key,
    /// Object: `:` after a key.
    Colon,
    /// A value (object after `:`, array after `[` or `,`).
    Value,
    /// `,` or the closing bracket.
    Comma,
}

struct Frame {
    kind: Kind,
    expect: Expect,
    /// Length of the output just after the opening bracket.
    open: usize,
    /// Length of the output at which this container can be cut and closed: after its
    /// opening bracket or its last complete member.
    safe: usize,
}

/// The single-pass rewriter. It copies the object into `out` token by token, dropping
/// whitespace and commas that are not followed by a member, and on running out of input
/// it cuts back to the innermost safe point and closes every open container.
struct Scanner<'a> {
    src: &'a str,
    pos: usize,
    out: String,
    stack: Vec<Frame>,
    pending_comma: bool,
}

/// What a string token is, which decides what may follow its closing quote.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Key,
    /// An object member's value.
    Member,
    /// An array item.
    Item,
}

/// What ended a string token.
enum StrEnd {
    Closed,
    Truncated,
}

impl<'a> Scanner<'a> {
    fn new(src: &'a str) -> Self {
        Self {
            src,
            pos: 0,
            out: String::with_capacity(src.len() + 8),
            stack: Vec::with_capacity(4),
            pending_comma: false,
        }
    }

    /// The repaired text of the object that starts at `src[0] == '{'`, or `None` when the
    /// structure is not recoverable (the caller then tries the next `{`).
    ///
    /// The scanner's state machine: one `match` on the next byte, each arm a token and
    /// what the open container expects of it. It stays one function, longer than the
    /// ~80 lines others keep to, so that every transition reads beside the others; the
    /// arms call out to `string`, `close_top` and `recover` for the longer steps.
    fn run(mut self) -> Option<String> {
        let bytes = self.src.as_bytes();
        while self.pos < bytes.len() {
            let b = bytes[self.pos];
            if matches!(b, b' ' | b'\t' | b'\n' | b'\r' | b'/') {
                let blank_end = skip_blank(bytes, self.pos);
                if blank_end > self.pos {
                    self.pos = blank_end;
                    continue;
                }
            }
            match b {
                b'{' | b'[' => {
                    if !self.stack.is_empty() && self.expect()? != Expect::Value {
                        self.recover();
                        continue;
                    }
                    self.emit_separator();
                    self.out.push(b as char);
                    let kind = if b == b'{' { Kind::Object } else { Kind::Array };
                    self.stack.push(Frame {
                        kind,
                        expect: first_expect(kind),
                        open: self.out.len(),
                        safe: self.out.len(),
                    });
                    self.pos += 1;
                }
                b'}' | b']' => {
                    let kind = if b == b'}' { Kind::Object } else { Kind::Array };
                    let matched = self.stack.last()?.kind == kind;
                    if !matched && !self.stack.iter().any(|f| f.kind == kind) {
                        // A stray closer, with nothing of its kind open.
                        self.pos += 1;
                        continue;
                    }
                    // `{"a":1,"b":}` or `{"a":1,"b"}`: the member that has no value goes.
                    // A closer of the wrong kind closes the innermost container: in
                    // place of its own closer when a comma follows (`["run"}, "mood": 4`),
                    // else first, and it is read again (`{"a": [1, 2}`).
                    let typo = !matched && bytes.get(skip_ws(bytes, self.pos + 1)) == Some(&b',');
                    self.close_top();
                    if matched || typo {
                        self.pos += 1;
                        if self.stack.is_empty() {
                            return Some(self.out);
                        }
                    }
                }
                b',' => {
                    // A comma after a member is held back until the next member starts,
                    // which removes trailing and doubled commas.
                    if self.expect()? == Expect::Comma {
                        self.pending_comma = true;
                        self.set_expect(first_expect(self.top_kind()));
                    }
                    self.pos += 1;
                }
                b':' => {
                    if self.expect()? != Expect::Colon {
                        self.recover();
                        continue;
                    }
                    self.out.push(':');
                    self.set_expect(Expect::Value);
                    self.pos += 1;
                }
                b'"' | b'\'' => {
                    let mut expect = self.expect()?;
                    if expect == Expect::Comma && b == b'"' {
                        // `{"a":1 "b":2}`: a forgotten comma between members.
                        self.pending_comma = true;
                        expect = first_expect(self.top_kind());
                        self.set_expect(expect);
                    }
                    if !matches!(expect, Expect::Key | Expect::Value) {
                        self.recover();
                        continue;
                    }
                    let role = match (expect, self.top_kind()) {
                        (Expect::Key, _) => Role::Key,
                        (_, Kind::Object) => Role::Member,
                        (_, Kind::Array) => Role::Item,
                    };
                    let mark = self.out.len();
                    self.emit_separator();
                    match self.string(b, role) {
                        StrEnd::Closed => {
                            if expect == Expect::Key {
                                self.set_expect(Expect::Colon);
                            } else if self.value_done() {
                                return Some(self.out);
                            }
                        }
                        StrEnd::Truncated => {
                            // A cut number in quotes (`"7` of `"7.5"`) is dropped as a
                            // bare one is: nothing shows it is complete.
                            let keep = role == Role::Member && !is_number_start(&self.out[mark..]);
                            if keep {
                                self.out.push('"');
                                self.value_done();
                            } else {
                                self.out.truncate(mark);
                            }
                            return Some(self.close_all());
                        }
                    }
                }
                _ => {
                    let expect = self.expect()?;
                    let start = self.pos;
                    while self.pos < bytes.len() && is_word_byte(bytes[self.pos]) {
                        self.pos += 1;
                    }
                    if self.pos == start {
                        // Something that cannot start a token.
                        self.recover();
                        continue;
                    }
                    if expect == Expect::Value {
                        match fraction(bytes, start, self.pos) {
                            Fraction::No => {}
                            Fraction::Whole(end) => self.pos = end,
                            Fraction::Cut => return Some(self.close_all()),
                            Fraction::Broken => {
                                self.recover();
                                continue;
                            }
                        }
                    }
                    let word = &self.src[start..self.pos];
                    let at_end = self.pos >= bytes.len();
                    match expect {
                        Expect::Key if !at_end && is_bare_key(word) => {
                            self.emit_separator();
                            self.out.push('"');
                            self.out.push_str(word);
                            self.out.push('"');
                            self.set_expect(Expect::Colon);
                        }
                        Expect::Value => {
                            let literal = if at_end {
                                truncated_literal(word)
                            } else if word.contains('/') {
                                Some(Cow::Owned(format!("\"{word}\"")))
                            } else {
                                Some(literal(word))
                            };
                            match literal {
                                Some(text) => {
                                    self.emit_separator();
                                    self.out.push_str(&text);
                                    if self.value_done() {
                                        return Some(self.out);
                                    }
                                }
                                None => return Some(self.close_all()),
                            }
                        }
                        _ if at_end => return Some(self.close_all()),
                        _ => self.recover(),
                    }
                }
            }
        }
        Some(self.close_all())
    }

    /// An unmendable token inside a container: the member (or item) it stands in is
    /// dropped, and reading goes on from the next `,` or closing bracket at this depth.
    /// A member already complete (the token came after its value) is kept.
    fn recover(&mut self) {
        if let Some(frame) = self.stack.last_mut() {
            self.out.truncate(frame.safe);
            frame.expect = if frame.safe > frame.open {
                Expect::Comma
            } else {
                first_expect(frame.kind)
            };
        }
        self.pending_comma = false;
        self.pos = member_end(self.src.as_bytes(), self.pos);
    }

    fn expect(&self) -> Option<Expect> {
        self.stack.last().map(|f| f.expect)
    }

    fn top_kind(&self) -> Kind {
        self.stack.last().map_or(Kind::Object, |f| f.kind)
    }

    fn set_expect(&mut self, expect: Expect) {
        if let Some(frame) = self.stack.last_mut() {
            frame.expect = expect;
        }
    }

    fn emit_separator(&mut self) {
        if self.pending_comma {
            self.out.push(',');
            self.pending_comma = false;
        }
    }

    /// A value just ended; returns true when it was the outermost object.
    fn value_done(&mut self) -> bool {
        match self.stack.last_mut() {
            Some(frame) => {
                frame.expect = Expect::Comma;
                frame.safe = self.out.len();
                false
            }
            None => true,
        }
    }

    /// Input ended inside the object: every open container is closed.
    fn close_all(mut self) -> String {
        while !self.stack.is_empty() {
            self.close_top();
        }
        self.out
    }

    /// Closes the innermost container, cut back to its last complete member.
    fn close_top(&mut self) {
        let Some(frame) = self.stack.pop() else {
            return;
        };
        if frame.expect != Expect::Comma {
            self.out.truncate(frame.safe);
        }
        self.pending_comma = false;
        self.out.push(match frame.kind {
            Kind::Object => '}',
            Kind::Array => ']',
        });
        self.value_done();
    }

    /// Copies a string token starting at its opening `quote` (`"` or `'`), escaping raw
    /// control characters and mending escapes. A `quote` that is not followed by what may
    /// follow a `role` string is text. On truncation the output ends without the closing
    /// quote and without a partial escape.
    fn string(&mut self, quote: u8, role: Role) -> StrEnd {
        let bytes = self.src.as_bytes();
        self.out.push('"');
        self.pos += 1;
        let mut run_start = self.pos;
        while self.pos < bytes.len() {
            let b = bytes[self.pos];
            match b {
                _ if b == quote && closes(bytes, self.pos + 1, role) => {
                    self.out.push_str(&self.src[run_start..self.pos]);
                    self.out.push('"');
                    self.pos += 1;
                    return StrEnd::Closed;
                }
                b',' if role == Role::Member && key_after_comma(bytes, self.pos, quote) => {
                    // `"ok" maybe, "mood": 2`: text after a closing quote, or a closing
                    // quote forgotten. The value ends before the next key.
                    self.out.push_str(&self.src[run_start..self.pos]);
                    self.out.push('"');
                    return StrEnd::Closed;
                }
                b'"' => {
                    // Text: a quote inside a `'` string, or one the writer forgot to
                    // escape.
                    self.out.push_str(&self.src[run_start..self.pos]);
                    self.out.push_str("\\\"");
                    self.pos += 1;
                    run_start = self.pos;
                }
                b'\\' => {
                    self.out.push_str(&self.src[run_start..self.pos]);
                    if self.escape().is_none() {
                        return StrEnd::Truncated;
                    }
                    run_start = self.pos;
                }
                0x00..=0x1f => {
                    self.out.push_str(&self.src[run_start..self.pos]);
                    match b {
                        b'\n' => self.out.push_str("\\n"),
                        b'\r' => self.out.push_str("\\r"),
                        b'\t' => self.out.push_str("\\t"),
                        _ => {
                            const HEX: &[u8; 16] = b"0123456789abcdef";
                            self.out.push_str("\\u00");
                            self.out.push(HEX[usize::from(b >> 4)] as char);
                            self.out.push(HEX[usize::from(b & 0xf)] as char);
                        }
                    }
                    self.pos += 1;
                    run_start = self.pos;
                }
                _ => self.pos += 1,
            }
        }
        self.out.push_str(&self.src[run_start..]);
        StrEnd::Truncated
    }

    /// Copies the escape at `self.pos` (a backslash), mended: a valid one as it is, a
    /// lone surrogate half as U+FFFD, `\'` and friends as their character. `None` when
    /// the input ends inside it: the partial escape is dropped, the input used up.
    fn escape(&mut self) -> Option<()> {
        let bytes = self.src.as_bytes();
        let Some(&esc) = bytes.get(self.pos + 1) else {
            self.pos = bytes.len();
            return None;
        };
        match esc {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {
                self.out.push('\\');
                self.out.push(esc as char);
                self.pos += 2;
            }
            b'u' => {
                let hex = bytes.get(self.pos + 2..self.pos + 6);
                match hex {
                    Some(h) if h.iter().all(u8::is_ascii_hexdigit) => {
                        let rest = &bytes[self.pos + 6..];
                        match (utf16_unit(h), rest.get(..6).and_then(low_escape)) {
                            // A surrogate pair, whole.
                            (0xD800..=0xDBFF, Some(_)) => {
                                self.out.push_str(&self.src[self.pos..self.pos + 12]);
                                self.pos += 12;
                            }
                            // Its second half cut by the end of the input
                            // (an answer stopped mid-emoji): both go.
                            (0xD800..=0xDBFF, None) if cut_escape(rest) => {
                                self.pos = bytes.len();
                                return None;
                            }
                            // A lone half, which serde_json refuses (and
                            // with it the whole object): the replacement
                            // character instead.
                            (0xD800..=0xDFFF, _) => {
                                self.out.push_str("\\ufffd");
                                self.pos += 6;
                            }
                            _ => {
                                self.out.push_str(&self.src[self.pos..self.pos + 6]);
                                self.pos += 6;
                            }
                        }
                    }
                    _ if self.pos + 6 > bytes.len()
                        && bytes[self.pos + 2..].iter().all(u8::is_ascii_hexdigit) =>
                    {
                        // A `\u12` cut by the end of the input.
                        self.pos = bytes.len();
                        return None;
                    }
                    // Not an escape after all: keep the `u` literally.
                    _ => self.pos += 1,
                }
            }
            // `\'` and friends: drop the backslash, keep the character.
            _ => self.pos += 1,
        }
        Some(())
    }
}

/// The first kind of token a container opened with this bracket expects, and again
/// after each comma.
fn first_expect(kind: Kind) -> Expect {
    match kind {
        Kind::Object => Expect::Key,
        Kind::Array => Expect::Value,
    }
}

/// The first position at or after `i` that is neither whitespace nor in a `//` or
/// `/* */` comment.
fn skip_blank(bytes: &[u8], mut i: usize) -> usize {
    loop {
        match (bytes.get(i), bytes.get(i + 1)) {
            (Some(b' ' | b'\t' | b'\n' | b'\r'), _) => i += 1,
            (Some(b'/'), Some(b'/')) => {
                i = bytes[i..]
                    .iter()
                    .position(|&b| b == b'\n')
                    .map_or(bytes.len(), |n| i + n);
            }
            (Some(b'/'), Some(b'*')) => {
                i = bytes[i + 2..]
                    .windows(2)
                    .position(|w| w == b"*/")
                    .map_or(bytes.len(), |n| i + 2 + n + 2);
            }
            _ => return i,
        }
    }
}

/// How far the lookaheads from a quote or a comma inside a string read: far enough
/// for a key and the indentation of pretty-printed JSON, and no farther, so that a
/// string full of quotes and commas is still read in linear time.
const LOOKAHEAD: usize = 64;

/// The first position at or after `i` whose byte is not `skipped`, looking at most
/// [`LOOKAHEAD`] bytes ahead (past that, a position among the skipped bytes).
fn skip_bounded(bytes: &[u8], i: usize, skipped: fn(u8) -> bool) -> usize {
    let limit = bytes.len().min(i.saturating_add(LOOKAHEAD));
    (i..limit).find(|&j| !skipped(bytes[j])).unwrap_or(limit)
}

/// [`skip_bounded`] over whitespace.
fn skip_ws(bytes: &[u8], i: usize) -> usize {
    skip_bounded(bytes, i, |b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
}

/// Whether a `//` or `/*` comment starts at `i`.
fn starts_comment(bytes: &[u8], i: usize) -> bool {
    bytes.get(i) == Some(&b'/') && matches!(bytes.get(i + 1), Some(b'/' | b'*'))
}

/// Whether a quote just before `at` ends a `role` string: what follows it (whitespace
/// skipped) is what may follow such a string, a comment, or the end of the input. A
/// key holds no quotes: its first one ends it.
fn closes(bytes: &[u8], at: usize, role: Role) -> bool {
    if role == Role::Key {
        return true;
    }
    let i = skip_ws(bytes, at);
    let Some(&next) = bytes.get(i) else {
        return true;
    };
    if starts_comment(bytes, i) {
        return true;
    }
    if role == Role::Item {
        // `"` as well: a forgotten comma between items.
        return matches!(next, b',' | b']' | b'}' | b'"');
    }
    match next {
        b'}' | b']' => true,
        b',' => {
            let j = skip_ws(bytes, i + 1);
            match bytes.get(j) {
                None | Some(b'}') => true,
                Some(&quote @ (b'"' | b'\'')) => key_follows(bytes, j, quote, false),
                Some(_) => key_follows(bytes, j, b'"', true),
            }
        }
        // A forgotten comma before the next key.
        b'"' => key_follows(bytes, i, b'"', false),
        _ => false,
    }
}

/// Whether the comma at `i` inside a member's string value comes before the next key
/// (`"ok" maybe, "mood": 2` or `"ok, "mood": 2`): a key quoted as the string is, whose
/// opening quote does not itself end the string (`{"b": ",", ":": 1}` is valid JSON).
fn key_after_comma(bytes: &[u8], i: usize, quote: u8) -> bool {
    let j = skip_ws(bytes, i + 1);
    bytes.get(j) == Some(&quote)
        && key_follows(bytes, j, quote, false)
        && !closes(bytes, j + 1, Role::Member)
}

/// The position in `text` of the first `quote` that no backslash escapes.
fn closing_quote(text: &[u8], quote: u8) -> Option<usize> {
    let mut i = 0;
    while let Some(&b) = text.get(i) {
        if b == quote {
            return Some(i);
        }
        i += if b == b'\\' { 2 } else { 1 };
    }
    None
}

/// Whether a key and its `:` start at `i`: quoted with `quote`, or a bare word when
/// `bare` is set. A key cut by the end of the input counts: a cut answer's last key.
fn key_follows(bytes: &[u8], i: usize, quote: u8, bare: bool) -> bool {
    let len = bytes.len();
    let window = &bytes[i.min(len)..len.min(i.saturating_add(LOOKAHEAD))];
    let cut = i.saturating_add(LOOKAHEAD) >= len;
    let key_len = match window.first() {
        Some(&b) if b == quote => closing_quote(&window[1..], quote).map(|n| n + 2),
        Some(&b) if bare && (b.is_ascii_alphabetic() || b == b'_') => Some(
            window
                .iter()
                .position(|&b| !(b.is_ascii_alphanumeric() || b == b'_'))
                .unwrap_or(window.len()),
        ),
        _ => return false,
    };
    match key_len {
        Some(n) => bytes.get(skip_ws(bytes, i + n)).is_none_or(|&b| b == b':'),
        None => cut,
    }
}

/// Where the member that an unmendable token at `i` stands in ends: the next `,` or
/// closing bracket outside the brackets and strings it holds, or the end of the input.
fn member_end(bytes: &[u8], mut i: usize) -> usize {
    let mut depth = 0usize;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'"' => match closing_quote(&bytes[i + 1..], b'"') {
                Some(n) => i += n + 1,
                None => return bytes.len(),
            },
            b'{' | b'[' => depth += 1,
            b'}' | b']' | b',' if depth == 0 => return i,
            b'}' | b']' => depth -= 1,
            _ => {}
        }
        i += 1;
    }
    bytes.len()
}

/// What follows a bare number in value position.
enum Fraction {
    /// Not a fraction.
    No,
    /// A fraction (`4/5`, `7.5 / 10`) that ends here.
    Whole(usize),
    /// A fraction cut by the end of the input: `4/1` may be `4/10`.
    Cut,
    /// A slash after the number, and no number after it.
    Broken,
}

/// Whether the number `bytes[start..end]` is the numerator of a bare fraction.
fn fraction(bytes: &[u8], start: usize, end: usize) -> Fraction {
    let is_number = |part: &[u8]| {
        part.first().is_some_and(u8::is_ascii_digit)
            && part.iter().all(|&b| b.is_ascii_digit() || b == b'.')
    };
    let slash = skip_spaces(bytes, end);
    if !is_number(&bytes[start..end]) || bytes.get(slash) != Some(&b'/') {
        return Fraction::No;
    }
    if starts_comment(bytes, slash) {
        return Fraction::No;
    }
    let from = skip_spaces(bytes, slash + 1);
    let digits = bytes[from..]
        .iter()
        .take_while(|&&b| b.is_ascii_digit() || b == b'.')
        .count();
    let to = from + digits;
    if to >= bytes.len() {
        Fraction::Cut
    } else if is_number(&bytes[from..to]) {
        Fraction::Whole(to)
    } else {
        Fraction::Broken
    }
}

/// [`skip_bounded`] over spaces and tabs (a fraction stays on its line).
fn skip_spaces(bytes: &[u8], i: usize) -> usize {
    skip_bounded(bytes, i, |b| matches!(b, b' ' | b'\t'))
}

/// The UTF-16 unit of a `\u` escape's four hex digits.
fn utf16_unit(hex: &[u8]) -> u16 {
    hex.iter().fold(0, |unit, &digit| {
        let value = char::from(digit).to_digit(16).unwrap_or(0);
        (unit << 4) | u16::try_from(value).unwrap_or(0)
    })
}

/// A whole `\uDC00`–`\uDFFF` escape (the second half of a surrogate pair).
fn low_escape(escape: &[u8]) -> Option<u16> {
    let hex = escape.strip_prefix(b"\\u")?;
    (hex.len() == 4 && hex.iter().all(u8::is_ascii_hexdigit))
        .then(|| utf16_unit(hex))
        .filter(|unit| (0xDC00..=0xDFFF).contains(unit))
}

/// Whether `rest` is all that is left of the input and the start of a `\u` escape, or
/// nothing: the end came inside it.
fn cut_escape(rest: &[u8]) -> bool {
    rest.len() < 6
        && rest.first().is_none_or(|&b| b == b'\\')
        && rest.get(1).is_none_or(|&b| b == b'u')
        && rest.iter().skip(2).all(u8::is_ascii_hexdigit)
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.' | b'_')
}

fn is_bare_key(word: &str) -> bool {
    word.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && word.bytes().next().is_some_and(|b| !b.is_ascii_digit())
}

/// The JSON text for a complete bare word in value position.
fn literal(word: &str) -> Cow<'_, str> {
    match word {
        "true" | "false" | "null" => Cow::Borrowed(word),
        "True" | "TRUE" => Cow::Borrowed("true"),
        "False" | "FALSE" => Cow::Borrowed("false"),
        _ if is_finite_json_number(word) => Cow::Borrowed(word),
        _ => match word.parse::<f64>() {
            // `+4`, `.5`, `4.`, `007`: numbers a lenient reader accepts.
            Ok(n) if n.is_finite() && word.bytes().any(|b| b.is_ascii_digit()) => {
                serde_json::Number::from_f64(n)
                    .map_or(Cow::Borrowed("null"), |n| Cow::Owned(n.to_string()))
            }
            _ => Cow::Borrowed("null"),
        },
    }
}

/// Whether the start of a string value cut off (its separator and opening quote
/// included) is the start of a number: digits, with a sign, point or comma.
fn is_number_start(emitted: &str) -> bool {
    let text = emitted.trim_start_matches([',', '"']).trim();
    text.bytes().any(|b| b.is_ascii_digit())
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b',' | b'+' | b'-' | b' '))
}

/// A bare word cut by the end of the input. Only a literal that cannot grow is kept: a
/// number with nothing after it may be the `6` of `6.5` or the `1` of `15`, and storing
/// a wrong value is worse than a default.
fn truncated_literal(word: &str) -> Option<Cow<'_, str>> {
    matches!(word, "true" | "false" | "null").then_some(Cow::Borrowed(word))
}

/// A JSON number that `serde_json` reads without overflowing (`1e400` is not one).
fn is_finite_json_number(s: &str) -> bool {
    is_json_number(s) && s.parse::<f64>().is_ok_and(f64::is_finite)
}

/// The JSON number grammar: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
fn is_json_number(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    match b.get(i) {
        Some(b'0') => i += 1,
        Some(c) if c.is_ascii_digit() => {
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
        }
        _ => return false,
    }
    if b.get(i) == Some(&b'.') {
        i += 1;
        let digits = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == digits {
            return false;
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let digits = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == digits {
            return false;
        }
    }
    i == b.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn repaired(raw: &str) -> Option<Value> {
        repair(raw)
    }

    #[test]
    fn repair_finds_the_object_in_the_answer() {
        let cases: &[(&str, &str, Option<Value>)] = &[
            ("plain object", r#"{"mood": 4}"#, Some(json!({"mood": 4}))),
            (
                "markdown fence",
                "```json\n{\"mood\": 4, \"stress\": 2}\n```",
                Some(json!({"mood": 4, "stress": 2})),
            ),
            (
                "fence without language",
                "```\n{\"mood\": 4}\n```",
                Some(json!({"mood": 4})),
            ),
            (
                "prose around",
                "Sure! Here is the JSON:\n{\"mood\": 4}\nHope it helps.",
                Some(json!({"mood": 4})),
            ),
            (
                "think block with braces",
                "<think>The user seems {tired}, mood maybe {\"mood\": 1}</think>\n{\"mood\": 2}",
                Some(json!({"mood": 2})),
            ),
            (
                "unclosed think is reasoning",
                "<think>I guess {\"mood\": 1}",
                None,
            ),
        ];
        check(cases);
    }

    #[test]
    fn repair_mends_an_answer_cut_short() {
        let cases: &[(&str, &str, Option<Value>)] = &[
            (
                "truncated after comma in key",
                r#"{"mood": 4, "stre"#,
                Some(json!({"mood": 4})),
            ),
            (
                "truncated after colon",
                r#"{"mood": 4, "stress":"#,
                Some(json!({"mood": 4})),
            ),
            (
                "truncated after key",
                r#"{"mood": 4, "stress""#,
                Some(json!({"mood": 4})),
            ),
            (
                "truncated after comma",
                r#"{"mood": 4,"#,
                Some(json!({"mood": 4})),
            ),
            (
                "number at the end may be partial",
                r#"{"mood": 4, "sleep_hours": 6"#,
                Some(json!({"mood": 4})),
            ),
            (
                "truncated number in quotes dropped, as a bare one is",
                r#"{"mood": "4", "sleep_hours": "7"#,
                Some(json!({"mood": "4"})),
            ),
            (
                "truncated quoted decimal dropped",
                r#"{"mood": "4", "sleep_hours": "7."#,
                Some(json!({"mood": "4"})),
            ),
            (
                "truncated summary with a number in it kept",
                r#"{"mood": 4, "summary": "slept 7 hours and"#,
                Some(json!({"mood": 4, "summary": "slept 7 hours and"})),
            ),
            (
                "truncated decimal point",
                r#"{"sleep_hours": 6."#,
                Some(json!({})),
            ),
            (
                "number ended by whitespace",
                "{\"mood\": 4\n",
                Some(json!({"mood": 4})),
            ),
            (
                "complete literal at the end",
                r#"{"a": null"#,
                Some(json!({"a": null})),
            ),
            (
                "truncated literal dropped",
                r#"{"mood": 4, "x": tru"#,
                Some(json!({"mood": 4})),
            ),
            (
                "open string value closed",
                r#"{"mood": 4, "summary": "Ran 5 km and"#,
                Some(json!({"mood": 4, "summary": "Ran 5 km and"})),
            ),
            (
                "open array closed, partial item dropped",
                r#"{"activities": ["run", "yo"#,
                Some(json!({"activities": ["run"]})),
            ),
            (
                "open array after comma",
                r#"{"activities": ["run", "#,
                Some(json!({"activities": ["run"]})),
            ),
            (
                "nested truncation",
                r#"{"a": {"b": 1, "c": [1, 2"#,
                Some(json!({"a": {"b": 1, "c": [1]}})),
            ),
            (
                "dangling escape dropped",
                r#"{"summary": "a \"quote\" and \"#,
                Some(json!({"summary": "a \"quote\" and "})),
            ),
            (
                "partial unicode escape dropped",
                r#"{"summary": "caf\u00"#,
                Some(json!({"summary": "caf"})),
            ),
        ];
        check(cases);
    }

    #[test]
    fn repair_mends_escapes_commas_and_values() {
        let cases: &[(&str, &str, Option<Value>)] = &[
            (
                "a {word} in prose before the object",
                "Mood seems {good}. JSON: {\"mood\": 4, \"stress\": 2}",
                Some(json!({"mood": 4, "stress": 2})),
            ),
            ("an empty object", "Here: {}", Some(json!({}))),
            (
                "a surrogate pair cut by the end goes whole",
                r#"{"mood": 4, "summary": "great day \ud83d\ude"#,
                Some(json!({"mood": 4, "summary": "great day "})),
            ),
            (
                "a surrogate pair kept",
                r#"{"summary": "run \ud83c\udfc3", "mood": 4}"#,
                Some(json!({"summary": "run \u{1f3c3}", "mood": 4})),
            ),
            (
                "a lone surrogate half is the replacement character",
                r#"{"summary": "a \ud83d b \udc00", "mood": 4}"#,
                Some(json!({"summary": "a \u{fffd} b \u{fffd}", "mood": 4})),
            ),
            (
                "braces inside strings are text",
                r#"{"summary": "a } and { b", "mood": 2}"#,
                Some(json!({"summary": "a } and { b", "mood": 2})),
            ),
            (
                "trailing comma in array",
                r#"{"a": [1,2,]}"#,
                Some(json!({"a": [1, 2]})),
            ),
            (
                "trailing comma in object",
                r#"{"a":1,}"#,
                Some(json!({"a": 1})),
            ),
            (
                "missing comma",
                r#"{"a":1 "b":2}"#,
                Some(json!({"a": 1, "b": 2})),
            ),
            (
                "overflowing number",
                r#"{"a": 1e400, "b": 2}"#,
                Some(json!({"a": null, "b": 2})),
            ),
            (
                "doubled comma",
                r#"{"a":1,,"b":2}"#,
                Some(json!({"a": 1, "b": 2})),
            ),
            (
                "member without value",
                r#"{"a":1,"b":}"#,
                Some(json!({"a": 1})),
            ),
        ];
        check(cases);
    }

    #[test]
    fn repair_reads_the_literals_models_write() {
        let cases: &[(&str, &str, Option<Value>)] = &[
            (
                "NaN becomes null",
                r#"{"mood": NaN, "stress": 2}"#,
                Some(json!({"mood": null, "stress": 2})),
            ),
            (
                "python literals",
                r#"{"a": True, "b": None}"#,
                Some(json!({"a": true, "b": null})),
            ),
            (
                "lenient numbers",
                r#"{"a": +4, "b": .5}"#,
                Some(json!({"a": 4.0, "b": 0.5})),
            ),
            ("bare keys", r#"{mood: 4}"#, Some(json!({"mood": 4}))),
            (
                "raw newline in string",
                "{\"summary\": \"line one\nline two\"}",
                Some(json!({"summary": "line one\nline two"})),
            ),
            (
                "unknown escape",
                r#"{"s": "it\'s"}"#,
                Some(json!({"s": "it's"})),
            ),
            (
                "multi-byte text",
                r#"{"summary": "Пробежка 5 км — отлично"#,
                Some(json!({"summary": "Пробежка 5 км — отлично"})),
            ),
            (
                "first object wins",
                r#"{"a":1} {"b":2}"#,
                Some(json!({"a": 1})),
            ),
            (
                "prose braces then object",
                r#"Use {this format}: {"a": 1}"#,
                Some(json!({"a": 1})),
            ),
        ];
        check(cases);
    }

    #[test]
    fn repair_mends_comments_quotes_and_stray_tokens() {
        let cases: &[(&str, &str, Option<Value>)] = &[
            (
                "line comments are blank",
                "{\"mood\": 4, // a good day, \"x\": 1\n \"stress\": 2}",
                Some(json!({"mood": 4, "stress": 2})),
            ),
            (
                "block comments are blank",
                r#"{"mood": /* a guess */ 4, "stress": 2 /* low */}"#,
                Some(json!({"mood": 4, "stress": 2})),
            ),
            (
                "a comment cut by the end",
                r#"{"mood": 4, /* and then"#,
                Some(json!({"mood": 4})),
            ),
            (
                "a slash in a string is text",
                r#"{"summary": "w/o coffee // tired", "mood": 2}"#,
                Some(json!({"summary": "w/o coffee // tired", "mood": 2})),
            ),
            (
                "quotes left unescaped in a summary",
                r#"{"summary": "he said "hi" and left", "mood": 2}"#,
                Some(json!({"summary": "he said \"hi\" and left", "mood": 2})),
            ),
            (
                "an unescaped quote before a comma in the text",
                r#"{"summary": "a "big", then calm day", "mood": 1}"#,
                Some(json!({"summary": "a \"big\", then calm day", "mood": 1})),
            ),
            (
                "an unescaped quote in the last member",
                r#"{"mood": 1, "summary": "the "plan" failed"}"#,
                Some(json!({"mood": 1, "summary": "the \"plan\" failed"})),
            ),
            (
                "an unescaped quote in a list item",
                r#"{"activities": ["the "big" run", "yoga"]}"#,
                Some(json!({"activities": ["the \"big\" run", "yoga"]})),
            ),
            (
                "an unescaped quote in a string cut by the end",
                r#"{"mood": 3, "summary": "she said "no"#,
                Some(json!({"mood": 3, "summary": "she said \"no"})),
            ),
            (
                "a forgotten comma after a string value",
                r#"{"summary": "ok" "mood": 2}"#,
                Some(json!({"summary": "ok", "mood": 2})),
            ),
            (
                "single-quoted strings, an apostrophe inside",
                r#"{'mood': 4, 'summary': 'it's "fine"', 'activities': ['run']}"#,
                Some(json!({"mood": 4, "summary": "it's \"fine\"", "activities": ["run"]})),
            ),
            (
                "a bare fraction is a string",
                r#"{"mood": 4/5, "stress": 7.5/10}"#,
                Some(json!({"mood": "4/5", "stress": "7.5/10"})),
            ),
            (
                "a fraction cut by the end is dropped",
                r#"{"stress": 2, "mood": 4/1"#,
                Some(json!({"stress": 2})),
            ),
        ];
        check(cases);
    }

    #[test]
    fn repair_costs_an_unmendable_value_its_member_only() {
        let cases: &[(&str, &str, Option<Value>)] = &[
            (
                "an unmendable value costs its member only",
                r#"{"mood": 4, "stress": @high, "energy": 2}"#,
                Some(json!({"mood": 4, "energy": 2})),
            ),
            (
                "a value with brackets in it goes whole",
                r#"{"mood": 4, "stress": <b>{"x": [1, "]"]}</b>, "energy": 2}"#,
                Some(json!({"mood": 4, "energy": 2})),
            ),
            (
                "garbage after a complete value keeps the value",
                r#"{"mood": 4 (good), "stress": 2}"#,
                Some(json!({"mood": 4, "stress": 2})),
            ),
            (
                "a word after a string value",
                r#"{"summary": "ok" maybe, "mood": 2}"#,
                Some(json!({"summary": "ok\" maybe", "mood": 2})),
            ),
            (
                "an unmendable key costs its member only",
                r#"{"mood": 4, ~weird~: 1, "stress": 2}"#,
                Some(json!({"mood": 4, "stress": 2})),
            ),
            (
                "a closing quote forgotten before the next key",
                r#"{"summary": "ok, "mood": 2}"#,
                Some(json!({"summary": "ok", "mood": 2})),
            ),
        ];
        check(cases);
    }

    #[test]
    fn repair_mends_keys_colons_and_closers() {
        let cases: &[(&str, &str, Option<Value>)] = &[
            (
                "a key without a colon",
                r#"{"mood" 4, "stress": 2}"#,
                Some(json!({"stress": 2})),
            ),
            (
                "a doubled colon",
                r#"{"mood":: 4, "stress": 2}"#,
                Some(json!({"stress": 2})),
            ),
            (
                "the wrong closer closes the array first",
                r#"{"activities": ["run", "yoga"}"#,
                Some(json!({"activities": ["run", "yoga"]})),
            ),
            (
                "a stray closer is ignored",
                r#"{"mood": 4]}"#,
                Some(json!({"mood": 4})),
            ),
            (
                "doubled braces of a template",
                r#"{{"mood": 4}}"#,
                Some(json!({"mood": 4})),
            ),
            (
                "a comment-like text after a comma in a string",
                "{\n \"summary\": \"Shipped the fix, // then tests\",\n \"mood\": 3,\n \"act",
                Some(json!({"summary": "Shipped the fix, // then tests", "mood": 3})),
            ),
            (
                "quoted titles in a summary",
                r#"{"summary": "watched "Up", "Coco" and more", "mood": 2}"#,
                Some(json!({"summary": "watched \"Up\", \"Coco\" and more", "mood": 2})),
            ),
            (
                "a string value before a key cut by the end",
                r#"{"summary": "ok", "stre"#,
                Some(json!({"summary": "ok"})),
            ),
            (
                "a string value before a bare key cut by the end",
                r#"{"summary": "ok", mo"#,
                Some(json!({"summary": "ok"})),
            ),
            (
                "a fraction cut after its slash is dropped",
                r#"{"stress": 2, "mood": 4/"#,
                Some(json!({"stress": 2})),
            ),
            (
                "a spaced fraction",
                r#"{"stress": 7 / 10, "mood": 4}"#,
                Some(json!({"stress": "7 / 10", "mood": 4})),
            ),
            (
                "a slash and no denominator costs the member",
                r#"{"mood": 4/, "stress": 2}"#,
                Some(json!({"stress": 2})),
            ),
            (
                "a number and a comment after it",
                r#"{"mood": 4 /* of 5 */, "stress": 2}"#,
                Some(json!({"mood": 4, "stress": 2})),
            ),
            (
                "the wrong closer in the middle stands for the right one",
                r#"{"activities": ["run", "yoga"}, "mood": 4}"#,
                Some(json!({"activities": ["run", "yoga"], "mood": 4})),
            ),
            ("no object", "I cannot help with that.", None),
            ("empty", "", None),
            ("only open brace", "{", Some(json!({}))),
            ("array only", "[1, 2]", None),
        ];
        check(cases);
    }

    /// Each case: its name, the answer, and what the repair must give.
    fn check(cases: &[(&str, &str, Option<Value>)]) {
        for (name, raw, want) in cases {
            assert_eq!(&repaired(raw), want, "case `{name}`: {raw:?}");
        }
    }

    /// Valid JSON that the heuristics for unescaped quotes must not read as broken.
    #[test]
    fn the_scanner_keeps_valid_json_that_looks_broken() {
        for text in [
            r#"{"b":",",":":1}"#,
            r#"{"a": "x, \"y\": z", "b": "'q', 'r': s"}"#,
            r#"{"a": ["p\", \"q", "r"], "b": "/* c */ // d"}"#,
            r#"{"a": "1/2", "b": "} ] ,"}"#,
        ] {
            let scanned = Scanner::new(text).run();
            assert_eq!(
                scanned.and_then(|s| serde_json::from_str::<Value>(&s).ok()),
                serde_json::from_str::<Value>(text).ok(),
                "{text}"
            );
        }
    }

    #[test]
    fn fence_on_one_line_with_braces_in_the_prose_before() {
        let raw = "Format: {mood}. ```json {\"mood\": 4, \"a\": [1,]}``` done";
        assert_eq!(repaired(raw), Some(json!({"mood": 4, "a": [1]})));
    }

    #[test]
    fn fence_cut_inside_the_object() {
        // The closing fence must not be read as the rest of an open string.
        let raw = "```json\n{\"mood\": 4, \"summary\": \"ok\n```\nAnything else?";
        assert_eq!(repaired(raw), Some(json!({"mood": 4, "summary": "ok\n"})));
    }

    const VALID: &str = r#"{"mood": 4, "stress": 5, "energy": 3, "productivity": 2, "sleep_hours": 6.5, "activities": ["run", "work"], "emotions": ["anxious", "тревога"], "summary": "Пробежка \"утром\", потом работа."}"#;

    #[test]
    fn every_prefix_of_valid_json_repairs_to_an_object_or_nothing() {
        for (i, _) in VALID.char_indices() {
            let prefix = &VALID[..i];
            let got = repair(prefix);
            if i > 0 {
                assert!(got.is_some(), "prefix {prefix:?} did not repair");
            }
        }
        assert_eq!(repair(VALID), serde_json::from_str(VALID).ok());
    }

    fn any_object() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            (-1e6f64..1e6).prop_map(Value::from),
            "\\PC{0,20}".prop_map(Value::from),
            "[\"\\\\{}\\[\\],:\n\t\u{1}/*' ]{0,8}".prop_map(Value::from),
        ];
        let tree = leaf.prop_recursive(3, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map("[a-z_]{1,8}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        });
        prop::collection::btree_map("\\PC{0,10}", tree, 0..6)
            .prop_map(|m| Value::Object(m.into_iter().collect()))
    }

    /// Values a model writes that are not JSON, each one token of one member.
    const BAD_VALUES: &[&str] = &[
        "@high",
        "4 (good)",
        "4/5",
        "/* a guess */ 3",
        "3 // a guess\n",
        "'it's fine'",
        r#""the "plan" failed""#,
        r#""a "big", then calm day""#,
        r#""ok" maybe"#,
        r#""watched "Up", "Coco" and more""#,
        "7 / 10",
        "4/",
        "<b>{\"x\": [1, \"]\"]}</b>",
        "~",
        "#5",
        "NaN",
        "%",
        "::",
    ];

    proptest! {
        /// One bad token costs at most the member it stands in: every other member of
        /// the object comes back as it was written.
        #[test]
        fn one_bad_value_costs_one_member_at_most(
            bad in 0..8usize,
            garbage in prop::sample::select(BAD_VALUES),
            pretty in any::<bool>(),
        ) {
            let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(VALID) else {
                panic!("VALID is an object");
            };
            let sep = if pretty { ",\n  " } else { ", " };
            let members: Vec<String> = fields
                .iter()
                .enumerate()
                .map(|(i, (key, value))| {
                    let value = if i == bad { garbage.to_owned() } else { value.to_string() };
                    format!("\"{key}\": {value}")
                })
                .collect();
            let raw = format!("{{{}}}", members.join(sep));
            let got = repair(&raw);
            prop_assert!(got.is_some(), "{raw}");
            let got = got.unwrap_or_default();
            for (i, (key, value)) in fields.iter().enumerate() {
                if i != bad {
                    prop_assert_eq!(got.get(key), Some(value), "{}", raw);
                }
            }
        }

        /// The fast path in `repair` relies on the scanner agreeing with `serde_json`
        /// on valid JSON, compact or pretty.
        #[test]
        fn scanner_keeps_valid_json_as_is(v in any_object(), pretty in any::<bool>()) {
            let text = if pretty {
                serde_json::to_string_pretty(&v).unwrap()
            } else {
                serde_json::to_string(&v).unwrap()
            };
            let scanned = Scanner::new(&text).run().unwrap();
            // Compared with serde_json's reading of the same text, not with `v`: without
            // `float_roundtrip` it does not read every float back bit for bit.
            let direct = serde_json::from_str::<Value>(&text).ok();
            prop_assert!(direct.is_some());
            prop_assert_eq!(serde_json::from_str::<Value>(&scanned).ok(), direct);
        }

        #[test]
        fn repair_never_panics(s in "\\PC*") {
            let _ = repair(&s);
        }

        #[test]
        fn repair_never_panics_on_json_like_noise(s in r#"[{}\[\]",:\\a-z0-9 .\-<>/`\n]{0,80}"#) {
            if let Some(v) = repair(&s) {
                prop_assert!(v.is_object());
            }
        }

        #[test]
        fn truncations_of_valid_json_repair(cut in 0usize..VALID.len(), prose in "[a-zA-Z .!]{0,20}") {
            let cut = (0..=cut).rev().find(|&i| VALID.is_char_boundary(i)).unwrap_or(0);
            let raw = format!("{prose}{}", &VALID[..cut]);
            let got = repair(&raw);
            prop_assert!(cut == 0 || got.as_ref().is_some_and(Value::is_object));
        }
    }
}
