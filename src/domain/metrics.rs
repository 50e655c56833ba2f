//! The metrics of one day log (docs/behaviour.md, Metrics): what an LLM said, validated,
//! clamped into range and default-filled, with the names of the fields that had to be
//! defaulted. Finding the JSON in a model's answer is the analysis layer's
//! (`analysis::metrics::from_answer`); from a JSON value on, the rules are here.
//!
//! A [`Metrics`] can only be built by the constructors here, so every value the rest of
//! daylog sees is in range. Choices where the spec is silent:
//! - `sleep_hours: null` (the entry did not say) is the default and *is* listed in
//!   `defaulted`: it is missing information, and statistics skip it either way.
//! - A list or summary that is present with the right type is not defaulted even when
//!   empty (`[]`, `""`): the model answered "none". Non-string list items are dropped.
//! - Numeric strings accept a decimal comma (`"6,5"`), as Russian text writes it.
//! - A score written as a fraction is read on the 1–5 scale: `"4/5"` is 4, `"8/10"` is
//!   4, `"3/4"` is 4 (3.75 rounded). A fraction with a zero or smaller denominator than
//!   numerator is not a score.
//! - List items have inner whitespace collapsed (`"  going   out "` → `"going out"`) so
//!   that duplicates are recognised; the first 10 distinct items are kept.
//! - A summary is trimmed and cut at 200 characters (not bytes); it keeps its newlines.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

use super::MetricField;
use crate::language::Language;

/// Field names, in the order they are stored and listed in `defaulted`: those of
/// [`MetricField::ALL`], the one list of them.
pub const FIELDS: [&str; MetricField::ALL.len()] = {
    let mut names = [""; MetricField::ALL.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = MetricField::ALL[i].name();
        i += 1;
    }
    names
};

const MAX_ITEMS: usize = 10;
const MAX_ITEM_CHARS: usize = 40;
const MAX_SUMMARY_CHARS: usize = 200;
const MAX_SLEEP_HOURS: f64 = 24.0;

/// A 1–5 score. Out-of-range input is clamped on the way in, so a `Score` is always valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Score(u8);

impl Score {
    pub const MIN: u8 = 1;
    pub const MAX: u8 = 5;
    /// The default when the model gave nothing usable.
    pub const NEUTRAL: Score = Score(3);

    /// `Some` only for a value already in 1..=5.
    pub fn new(value: u8) -> Option<Self> {
        (Self::MIN..=Self::MAX)
            .contains(&value)
            .then_some(Self(value))
    }

    /// Rounds (half away from zero) and clamps; `None` for NaN and infinities.
    pub fn from_f64(value: f64) -> Option<Self> {
        if !value.is_finite() {
            return None;
        }
        let clamped = value
            .round()
            .clamp(f64::from(Self::MIN), f64::from(Self::MAX));
        // In 1.0..=5.0 after the clamp, so the cast is exact.
        #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let value = clamped as u8;
        Some(Self(value))
    }

    pub fn get(self) -> u8 {
        self.0
    }
}

/// Validated metrics of one day log.
#[derive(Debug, Clone, PartialEq)]
pub struct Metrics {
    mood: Score,
    stress: Score,
    energy: Score,
    productivity: Score,
    sleep_hours: Option<f64>,
    activities: Vec<String>,
    emotions: Vec<String>,
    summary: String,
    /// Names from [`FIELDS`], in that order, of the fields that hold a default.
    defaulted: Vec<&'static str>,
}

/// The stored shape (docs/behaviour.md, Metrics), field order included.
#[derive(Serialize)]
struct StoredRef<'a> {
    mood: u8,
    stress: u8,
    energy: u8,
    productivity: u8,
    sleep_hours: Option<f64>,
    activities: &'a [String],
    emotions: &'a [String],
    summary: &'a str,
    defaulted: &'a [&'static str],
}

impl Metrics {
    /// Every field default and listed in `defaulted`: for when the metrics cascade failed
    /// or nothing in the answer parsed.
    pub fn defaults() -> Self {
        Self {
            mood: Score::NEUTRAL,
            stress: Score::NEUTRAL,
            energy: Score::NEUTRAL,
            productivity: Score::NEUTRAL,
            sleep_hours: None,
            activities: Vec::new(),
            emotions: Vec::new(),
            summary: String::new(),
            defaulted: FIELDS.to_vec(),
        }
    }

    /// The metrics in the JSON value of a model's answer: the value itself, or the one
    /// object inside it that holds the metrics (`{"metrics": {"mood": 4, …}}`, a wrapper
    /// some models add), validated by [`Metrics::from_value`].
    pub fn from_answer_value(value: &Value) -> Self {
        Self::from_value(unwrapped(value))
    }

    /// Validates a JSON value field by field (docs/behaviour.md, Metrics). A value that is not an object
    /// gives all defaults; unknown fields are ignored.
    pub fn from_value(value: &Value) -> Self {
        Self::from_value_listing(value, MAX_ITEMS, MAX_ITEM_CHARS)
    }

    /// [`Metrics::from_value`] with lists of at most `max_items` of `max_chars`.
    fn from_value_listing(value: &Value, max_items: usize, max_chars: usize) -> Self {
        let Some(obj) = value.as_object() else {
            return Self::defaults();
        };
        let mut defaulted = Vec::new();
        let mut score = |name: &'static str| {
            obj.get(name)
                .and_then(|v| number(v).or_else(|| fraction(v)))
                .and_then(Score::from_f64)
                .unwrap_or_else(|| {
                    defaulted.push(name);
                    Score::NEUTRAL
                })
        };
        let mood = score("mood");
        let stress = score("stress");
        let energy = score("energy");
        let productivity = score("productivity");

        let sleep_hours = obj.get("sleep_hours").and_then(number).map(sleep);
        if sleep_hours.is_none() {
            defaulted.push("sleep_hours");
        }
        let mut list = |name: &'static str| {
            obj.get(name)
                .and_then(Value::as_array)
                .map(|items| {
                    normalize(items.iter().filter_map(Value::as_str), max_items, max_chars)
                })
                .unwrap_or_else(|| {
                    defaulted.push(name);
                    Vec::new()
                })
        };
        let activities = list("activities");
        let emotions = list("emotions");
        let summary = match obj.get("summary").and_then(Value::as_str) {
            Some(s) => truncate_chars(s.trim(), MAX_SUMMARY_CHARS)
                .trim_end()
                .to_owned(),
            None => {
                defaulted.push("summary");
                String::new()
            }
        };
        Self {
            mood,
            stress,
            energy,
            productivity,
            sleep_hours,
            activities,
            emotions,
            summary,
            defaulted,
        }
    }

    /// What a Daylio row says (docs/behaviour.md, Search and Import): its mood when it names one, and every activity
    /// of its list, normalised as an answer's lists are but not cut to an answer's
    /// ten items of 40 characters: those limits guard against a model's output, and
    /// these are the user's own records. The other fields are defaults.
    pub fn imported<'a>(mood: Option<u8>, activities: impl IntoIterator<Item = &'a str>) -> Self {
        let mut object = serde_json::Map::new();
        object.insert("activities".to_owned(), Value::Array(Vec::new()));
        if let Some(mood) = mood {
            object.insert("mood".to_owned(), Value::from(mood));
        }
        let mut metrics = Self::from_value(&Value::Object(object));
        metrics.activities = normalize(activities, usize::MAX, usize::MAX);
        metrics
    }

    /// The stored JSON text (`day_logs.metrics`), fields in the order docs/behaviour.md gives under Metrics.
    pub fn to_json(&self) -> String {
        let stored = StoredRef {
            mood: self.mood.get(),
            stress: self.stress.get(),
            energy: self.energy.get(),
            productivity: self.productivity.get(),
            sleep_hours: self.sleep_hours,
            activities: &self.activities,
            emotions: &self.emotions,
            summary: &self.summary,
            defaulted: &self.defaulted,
        };
        // Plain strings, small integers and finite floats always serialize; should that
        // ever change, an empty object reads back as all defaults rather than failing.
        serde_json::to_string(&stored).unwrap_or_else(|_| String::from("{}"))
    }

    /// Reads back what [`Metrics::to_json`] stored. Values go through the same clamping
    /// constructor; a field listed in the stored `defaulted` stays defaulted. `None` if
    /// the text is not a JSON object.
    pub fn from_stored_json(text: &str) -> Option<Self> {
        let value: Value = serde_json::from_str(text).ok()?;
        let listed: Vec<&str> = value
            .as_object()?
            .get("defaulted")
            .and_then(Value::as_array)
            .map(|names| names.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        // Lists stored whole (an import's activities) are read whole.
        let mut metrics = Self::from_value_listing(&value, usize::MAX, usize::MAX);
        metrics.defaulted = FIELDS
            .iter()
            .copied()
            .filter(|f| metrics.defaulted.contains(f) || listed.contains(f))
            .collect();
        Some(metrics)
    }

    pub fn mood(&self) -> u8 {
        self.mood.get()
    }

    pub fn stress(&self) -> u8 {
        self.stress.get()
    }

    pub fn energy(&self) -> u8 {
        self.energy.get()
    }

    pub fn productivity(&self) -> u8 {
        self.productivity.get()
    }

    /// Hours of sleep, one decimal, 0–24; `None` when the entry did not say.
    pub fn sleep_hours(&self) -> Option<f64> {
        self.sleep_hours
    }

    pub fn activities(&self) -> &[String] {
        &self.activities
    }

    pub fn emotions(&self) -> &[String] {
        &self.emotions
    }

    pub fn summary(&self) -> &str {
        &self.summary
    }

    /// Names of the defaulted fields, in [`FIELDS`] order.
    pub fn defaulted(&self) -> &[&'static str] {
        &self.defaulted
    }

    /// Whether `field` had to be defaulted.
    pub fn is_defaulted(&self, field: MetricField) -> bool {
        self.defaulted.contains(&field.name())
    }

    /// True when nothing usable came from the model.
    pub fn is_all_defaulted(&self) -> bool {
        self.defaulted.len() == FIELDS.len()
    }

    /// A short line for replies, e.g. `mood 4/5 · stress 5/5 · energy 3/5 · sleep 6.5 h`;
    /// defaulted fields are left out, and it is empty when every score and sleep is.
    pub fn compact_line(&self, lang: Language) -> String {
        let (mood, stress, energy, productivity, sleep, hours) = match lang {
            Language::En => ("mood", "stress", "energy", "productivity", "sleep", "h"),
            Language::Ru => (
                "настроение",
                "стресс",
                "энергия",
                "продуктивность",
                "сон",
                "ч",
            ),
        };
        let mut line = String::new();
        let mut part = |label: &str, value: std::fmt::Arguments<'_>| {
            if !line.is_empty() {
                line.push_str(" · ");
            }
            // Writing into a String cannot fail.
            let _ = write!(line, "{label} {value}");
        };
        let scores = [
            (MetricField::Mood, mood, self.mood),
            (MetricField::Stress, stress, self.stress),
            (MetricField::Energy, energy, self.energy),
            (MetricField::Productivity, productivity, self.productivity),
        ];
        for (field, label, score) in scores {
            if !self.is_defaulted(field) {
                part(label, format_args!("{}/5", score.get()));
            }
        }
        if let Some(h) = self
            .sleep_hours
            .filter(|_| !self.is_defaulted(MetricField::SleepHours))
        {
            part(sleep, format_args!("{} {hours}", format_hours(h)));
        }
        line
    }
}

/// A number, or a string holding one (`"4"`, `" 6.5 "`, `"6,5"`); `None` for anything
/// else and for NaN and infinities.
fn number(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64().filter(|n| n.is_finite()),
        Value::String(s) => number_text(s),
        _ => None,
    }
}

/// The number a text holds (`"4"`, `" 6.5 "`, `"6,5"`); `None` for anything else and
/// for NaN and infinities.
fn number_text(s: &str) -> Option<f64> {
    let s = s.trim();
    let n = match s.parse::<f64>() {
        Ok(n) => n,
        Err(_) if s.matches(',').count() == 1 => s.replacen(',', ".", 1).parse().ok()?,
        Err(_) => return None,
    };
    n.is_finite().then_some(n)
}

/// A string holding a fraction (`"4/5"`, `"7.5 / 10"`), as a 1–5 score: the fraction
/// of 5. `None` unless `0 ≤ numerator ≤ denominator` and the denominator is not zero.
fn fraction(value: &Value) -> Option<f64> {
    let (numerator, denominator) = value.as_str()?.split_once('/')?;
    let (n, d) = (number_text(numerator)?, number_text(denominator)?);
    (d > 0.0 && (0.0..=d).contains(&n)).then(|| n / d * f64::from(Score::MAX))
}

/// Clamped to 0–24 and rounded to one decimal.
fn sleep(hours: f64) -> f64 {
    let rounded = (hours.clamp(0.0, MAX_SLEEP_HOURS) * 10.0).round() / 10.0;
    // `-0.0` would be stored as `-0.0`.
    if rounded == 0.0 { 0.0 } else { rounded }
}

/// `7` for 7.0, `6.5` for 6.5.
fn format_hours(hours: f64) -> String {
    if hours.fract() == 0.0 {
        format!("{hours:.0}")
    } else {
        format!("{hours:.1}")
    }
}

/// The object that holds the metrics: `value` itself, or the one object among its
/// values when it has no metric field of its own (`{"metrics": {"mood": 4, …}}`, a
/// wrapper some models add).
fn unwrapped(value: &Value) -> &Value {
    let Some(obj) = value.as_object() else {
        return value;
    };
    if FIELDS.iter().any(|field| obj.contains_key(*field)) {
        return value;
    }
    let mut inner = obj.values().filter(|v| {
        v.as_object()
            .is_some_and(|o| FIELDS.iter().any(|field| o.contains_key(*field)))
    });
    match (inner.next(), inner.next()) {
        (Some(only), None) => only,
        _ => value,
    }
}

/// Trimmed, inner whitespace collapsed, lower-case, at most `max_chars` characters,
/// empties dropped, unique, at most `max_items` (an answer's: 40 and 10).
fn normalize<'a>(
    items: impl IntoIterator<Item = &'a str>,
    max_items: usize,
    max_chars: usize,
) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in items {
        if out.len() == max_items {
            break;
        }
        let mut norm = String::with_capacity(s.len());
        for word in s.split_whitespace() {
            if !norm.is_empty() {
                norm.push(' ');
            }
            norm.extend(word.chars().flat_map(char::to_lowercase));
        }
        let norm = truncate_chars(&norm, max_chars).trim_end();
        if !norm.is_empty() && !out.iter().any(|o| o == norm) {
            out.push(norm.to_owned());
        }
    }
    out
}

/// The first `max` characters of `s`, cut on a character boundary.
fn truncate_chars(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    /// A model's raw answer as the journal reads it: repaired, then validated here.
    fn from_llm_text(raw: &str) -> Metrics {
        crate::analysis::metrics::from_llm_text(raw)
    }

    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn from(v: Value) -> Metrics {
        Metrics::from_value(&v)
    }

    fn full(overrides: Value) -> Value {
        let mut base = json!({
            "mood": 4, "stress": 2, "energy": 3, "productivity": 3, "sleep_hours": 7.5,
            "activities": ["run"], "emotions": ["calm"], "summary": "ok"
        });
        if let (Some(b), Some(o)) = (base.as_object_mut(), overrides.as_object()) {
            for (k, v) in o {
                b.insert(k.clone(), v.clone());
            }
        }
        base
    }

    #[test]
    fn a_wrapper_object_is_looked_into() {
        // Two objects with fields: which one is meant is not known, so neither.
        let two = r#"{"a": {"mood": 4}, "b": {"mood": 2}}"#;
        assert!(from_llm_text(two).is_all_defaulted());
        let wrapped = r#"{"metrics": {"mood": 4, "stress": 2, "activities": ["run"]}}"#;
        let m = from_llm_text(wrapped);
        assert_eq!((m.mood(), m.stress()), (4, 2));
        assert_eq!(m.activities(), ["run"]);
        // A field of its own: the object itself, whatever else it holds.
        let own = r#"{"mood": 5, "extra": {"mood": 1}}"#;
        assert_eq!(from_llm_text(own).mood(), 5);
    }

    #[test]
    fn score_is_valid_by_construction() {
        assert_eq!(Score::new(0), None);
        assert_eq!(Score::new(6), None);
        assert_eq!(Score::new(5).map(Score::get), Some(5));
        assert_eq!(Score::from_f64(f64::NAN), None);
        assert_eq!(Score::from_f64(-1e9).map(Score::get), Some(1));
        assert_eq!(Score::from_f64(2.5).map(Score::get), Some(3));
    }

    #[test]
    fn complete_answer_has_nothing_defaulted() {
        let m = from(full(json!({})));
        assert_eq!(m.defaulted(), &[] as &[&str]);
        assert_eq!(
            (m.mood(), m.stress(), m.energy(), m.productivity()),
            (4, 2, 3, 3)
        );
        assert_eq!(m.sleep_hours(), Some(7.5));
    }

    #[test]
    fn score_rules() {
        let cases: &[(&str, Value, u8, bool)] = &[
            ("in range", json!(4), 4, false),
            ("above range clamps", json!(10), 5, false),
            ("zero clamps", json!(0), 1, false),
            ("negative clamps", json!(-3), 1, false),
            ("huge clamps", json!(1e300), 5, false),
            ("numeric string", json!("4"), 4, false),
            ("padded numeric string", json!(" 2 "), 2, false),
            ("float rounds down", json!(3.4), 3, false),
            ("float rounds half up", json!(3.5), 4, false),
            ("float string rounds", json!("4.6"), 5, false),
            ("NaN string", json!("NaN"), 3, true),
            ("inf string", json!("inf"), 3, true),
            ("word string", json!("good"), 3, true),
            ("empty string", json!(""), 3, true),
            ("null", json!(null), 3, true),
            ("bool", json!(true), 3, true),
            ("array", json!([4]), 3, true),
            ("object", json!({"v": 4}), 3, true),
            ("fraction of five", json!("4/5"), 4, false),
            ("fraction of ten", json!("8/10"), 4, false),
            ("fraction of four rounds", json!("3/4"), 4, false),
            ("spaced decimal fraction", json!(" 7.5 / 10 "), 4, false),
            ("zero of five clamps", json!("0/5"), 1, false),
            ("more than the whole", json!("6/5"), 3, true),
            ("zero denominator", json!("4/0"), 3, true),
            ("date-like", json!("4/5/2026"), 3, true),
        ];
        for (name, value, want, defaulted) in cases {
            let m = from(full(json!({ "stress": value })));
            assert_eq!(m.stress(), *want, "case `{name}`");
            assert_eq!(
                m.is_defaulted(MetricField::Stress),
                *defaulted,
                "case `{name}`"
            );
            assert!(
                !m.is_defaulted(MetricField::Mood),
                "case `{name}`: other fields untouched"
            );
        }
    }

    #[test]
    fn missing_fields_are_defaulted_in_field_order() {
        let m = from(json!({"summary": "x", "mood": 5}));
        assert_eq!(
            m.defaulted(),
            &[
                "stress",
                "energy",
                "productivity",
                "sleep_hours",
                "activities",
                "emotions"
            ]
        );
        assert_eq!(m.mood(), 5);
        assert_eq!(m.stress(), 3);
    }

    #[test]
    fn sleep_rules() {
        let cases: &[(&str, Value, Option<f64>, bool)] = &[
            ("one decimal", json!(6.5), Some(6.5), false),
            ("rounded to one decimal", json!(6.46), Some(6.5), false),
            ("above 24 clamps", json!(30), Some(24.0), false),
            ("negative clamps to 0", json!(-2), Some(0.0), false),
            (
                "tiny negative is plain zero",
                json!(-0.01),
                Some(0.0),
                false,
            ),
            ("numeric string", json!("6.5"), Some(6.5), false),
            ("decimal comma", json!("6,5"), Some(6.5), false),
            ("null is missing info", json!(null), None, true),
            ("word", json!("a lot"), None, true),
            ("NaN string", json!("NaN"), None, true),
            ("list", json!([7]), None, true),
        ];
        for (name, value, want, defaulted) in cases {
            let m = from(full(json!({ "sleep_hours": value })));
            assert_eq!(m.sleep_hours(), *want, "case `{name}`");
            assert_eq!(
                m.is_defaulted(MetricField::SleepHours),
                *defaulted,
                "case `{name}`"
            );
        }
        let m = from(full(json!({"sleep_hours": -1})));
        let stored = m.to_json();
        assert!(stored.contains(r#""sleep_hours":0.0"#), "{stored}");
    }

    #[test]
    fn list_rules() {
        let m = from(full(json!({
            "activities": ["  Running ", "running", "", "   ", 5, null, {"a": 1}, "Going   OUT", "ЙОГА"],
            "emotions": "anxious",
        })));
        assert_eq!(m.activities(), &["running", "going out", "йога"]);
        assert!(!m.is_defaulted(MetricField::Activities));
        assert_eq!(m.emotions(), &[] as &[String]);
        assert!(
            m.is_defaulted(MetricField::Emotions),
            "a string is not a list"
        );
    }

    #[test]
    fn lists_are_capped_at_ten_items_of_forty_chars() {
        let many: Vec<String> = (0..15).map(|i| format!("item {i}")).collect();
        let long = "Ж".repeat(50);
        let m = from(full(json!({"activities": many, "emotions": [long, "a"]})));
        assert_eq!(m.activities().len(), 10);
        assert_eq!(m.activities()[9], "item 9");
        assert_eq!(m.emotions()[0], "ж".repeat(40));
        assert_eq!(m.emotions()[1], "a");
    }

    #[test]
    fn empty_list_is_an_answer_not_a_default() {
        let m = from(full(json!({"activities": [], "summary": ""})));
        assert!(!m.is_defaulted(MetricField::Activities));
        assert!(!m.is_defaulted(MetricField::Summary));
    }

    #[test]
    fn summary_is_trimmed_and_cut_at_200_chars_on_char_boundaries() {
        let text = format!("  {}  ", "Привет, мир! 🙂 ".repeat(30));
        let m = from(full(json!({ "summary": text })));
        assert!(m.summary().chars().count() <= 200);
        assert!(m.summary().starts_with("Привет"));
        assert!(!m.summary().ends_with(' '));
        let m = from(full(json!({ "summary": 42 })));
        assert_eq!(m.summary(), "");
        assert!(m.is_defaulted(MetricField::Summary));
    }

    #[test]
    fn unknown_fields_are_dropped() {
        let m = from(full(json!({"weather": "rain", "mood_note": 1})));
        let stored = m.to_json();
        assert!(!stored.contains("weather"));
        assert!(!stored.contains("mood_note"));
    }

    #[test]
    fn not_an_object_is_all_defaults() {
        for v in [json!(null), json!([1, 2]), json!("mood 4"), json!(4)] {
            assert_eq!(from(v), Metrics::defaults());
        }
        assert!(Metrics::defaults().is_all_defaulted());
        assert_eq!(from_llm_text("Sorry, I can't."), Metrics::defaults());
    }

    #[test]
    fn stored_json_has_the_documented_shape() {
        let m = from(json!({
            "mood": 4, "stress": 5, "energy": 3, "sleep_hours": 6.5,
            "activities": ["run"], "emotions": ["anxious"], "summary": "…"
        }));
        assert_eq!(
            m.to_json(),
            r#"{"mood":4,"stress":5,"energy":3,"productivity":3,"sleep_hours":6.5,"activities":["run"],"emotions":["anxious"],"summary":"…","defaulted":["productivity"]}"#
        );
    }

    #[test]
    fn stored_json_round_trips() {
        let samples = [
            Metrics::defaults(),
            from(full(json!({}))),
            from(full(
                json!({"productivity": "x", "sleep_hours": null, "summary": "Ночь — 5 ч"}),
            )),
        ];
        for m in samples {
            assert_eq!(Metrics::from_stored_json(&m.to_json()), Some(m.clone()));
        }
    }

    #[test]
    fn stored_defaulted_flag_survives_a_default_looking_value() {
        let stored = r#"{"mood":3,"stress":3,"energy":3,"productivity":3,"sleep_hours":7.0,"activities":[],"emotions":[],"summary":"","defaulted":["mood","bogus",7]}"#;
        let m = Metrics::from_stored_json(stored);
        assert_eq!(
            m.as_ref().map(|m| m.defaulted().to_vec()),
            Some(vec!["mood"])
        );
        assert_eq!(Metrics::from_stored_json("not json"), None);
        assert_eq!(Metrics::from_stored_json("[1]"), None);
    }

    #[test]
    fn compact_line_leaves_out_defaulted_fields() {
        let m = from(json!({"mood": 4, "stress": 5, "energy": 3, "sleep_hours": 6.5}));
        assert_eq!(
            m.compact_line(Language::En),
            "mood 4/5 · stress 5/5 · energy 3/5 · sleep 6.5 h"
        );
        assert_eq!(
            m.compact_line(Language::Ru),
            "настроение 4/5 · стресс 5/5 · энергия 3/5 · сон 6.5 ч"
        );
        let m = from(json!({"productivity": 2, "sleep_hours": 8}));
        assert_eq!(m.compact_line(Language::En), "productivity 2/5 · sleep 8 h");
        assert_eq!(Metrics::defaults().compact_line(Language::En), "");
    }

    /// Name, raw answer, expected mood, sleep and defaulted fields.
    type Fixture<'a> = (&'a str, &'a str, u8, Option<f64>, &'a [&'a str]);

    #[test]
    fn one_bad_token_defaults_one_field_only() {
        let cases: &[(&str, &str, &[&str])] = &[
            (
                "a comment",
                "{\"mood\": 4, // fine\n\"stress\": 2, \"energy\": 3, \"productivity\": 4, \"sleep_hours\": 7, \"activities\": [], \"emotions\": [], \"summary\": \"ok\"}",
                &[],
            ),
            (
                "a fraction",
                r#"{"mood": 4/5, "stress": 2, "energy": 3, "productivity": 4, "sleep_hours": 7, "activities": [], "emotions": [], "summary": "ok"}"#,
                &[],
            ),
            (
                "an unescaped quote",
                r#"{"mood": 4, "stress": 2, "energy": 3, "productivity": 4, "sleep_hours": 7, "activities": [], "emotions": [], "summary": "the "plan" held"}"#,
                &[],
            ),
            (
                "a word that is not a value",
                r#"{"mood": 4, "stress": high!, "energy": 3, "productivity": 4, "sleep_hours": 7, "activities": [], "emotions": [], "summary": "ok"}"#,
                &["stress"],
            ),
        ];
        for (name, raw, defaulted) in cases {
            let m = from_llm_text(raw);
            assert_eq!(m.defaulted(), *defaulted, "case `{name}`");
            assert_eq!(m.mood(), 4, "case `{name}`");
        }
        let m = from_llm_text(cases[2].1);
        assert_eq!(m.summary(), "the \"plan\" held");
    }

    #[test]
    fn llm_text_fixtures() {
        let cases: &[Fixture<'_>] = &[
            (
                "fenced",
                include_str!("../../tests/fixtures/metrics/fenced.txt"),
                2,
                Some(5.5),
                &[],
            ),
            (
                "prose",
                include_str!("../../tests/fixtures/metrics/prose.txt"),
                4,
                None,
                &["sleep_hours"],
            ),
            (
                "think",
                include_str!("../../tests/fixtures/metrics/think.txt"),
                4,
                Some(7.0),
                &[],
            ),
            (
                "truncated",
                include_str!("../../tests/fixtures/metrics/truncated.txt"),
                3,
                Some(6.0),
                &["emotions", "summary"],
            ),
            (
                "sloppy",
                include_str!("../../tests/fixtures/metrics/sloppy.txt"),
                5,
                Some(8.0),
                &["energy"],
            ),
            (
                "one bad token",
                include_str!("../../tests/fixtures/metrics/one_bad_token.txt"),
                4,
                Some(7.5),
                &[],
            ),
            (
                "refusal",
                include_str!("../../tests/fixtures/metrics/refusal.txt"),
                3,
                None,
                &FIELDS,
            ),
        ];
        for (name, raw, mood, sleep, defaulted) in cases {
            let m = from_llm_text(raw);
            assert_eq!(m.mood(), *mood, "fixture `{name}`");
            assert_eq!(m.sleep_hours(), *sleep, "fixture `{name}`");
            assert_eq!(m.defaulted(), *defaulted, "fixture `{name}`");
        }
    }

    #[test]
    fn every_truncation_agrees_with_the_full_answer() {
        // Whatever a cut answer yields must be what the full answer says: scores and
        // sleep equal or defaulted, lists a prefix, the summary a prefix.
        let raw = include_str!("../../tests/fixtures/metrics/fenced.txt");
        let full = from_llm_text(raw);
        assert!(full.defaulted().is_empty());
        for (cut, _) in raw.char_indices() {
            let m = from_llm_text(&raw[..cut]);
            let at = format!("cut at {cut}: {:?}", &raw[..cut]);
            for (field, got, want) in [
                (MetricField::Mood, m.mood(), full.mood()),
                (MetricField::Stress, m.stress(), full.stress()),
                (MetricField::Energy, m.energy(), full.energy()),
                (
                    MetricField::Productivity,
                    m.productivity(),
                    full.productivity(),
                ),
            ] {
                let name = field.name();
                assert!(m.is_defaulted(field) || got == want, "{name} {at}");
            }
            assert!(
                m.sleep_hours().is_none() || m.sleep_hours() == full.sleep_hours(),
                "{at}"
            );
            assert!(full.activities().starts_with(m.activities()), "{at}");
            assert!(full.emotions().starts_with(m.emotions()), "{at}");
            assert!(full.summary().starts_with(m.summary()), "{at}");
        }
    }

    fn assert_in_range(m: &Metrics) -> Result<(), TestCaseError> {
        for s in [m.mood(), m.stress(), m.energy(), m.productivity()] {
            prop_assert!((1..=5).contains(&s));
        }
        if let Some(h) = m.sleep_hours() {
            prop_assert!((0.0..=24.0).contains(&h));
            prop_assert!(((h * 10.0).round() - h * 10.0).abs() < 1e-9);
        }
        for list in [m.activities(), m.emotions()] {
            prop_assert!(list.len() <= 10);
            for item in list {
                prop_assert!(!item.is_empty() && item.chars().count() <= 40);
                prop_assert_eq!(item.trim(), item.as_str());
                prop_assert_eq!(&item.to_lowercase(), item);
                prop_assert_eq!(list.iter().filter(|o| *o == item).count(), 1);
            }
        }
        prop_assert!(m.summary().chars().count() <= 200);
        let back = Metrics::from_stored_json(&m.to_json());
        prop_assert_eq!(back.as_ref(), Some(m));
        Ok(())
    }

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            "\\PC{0,60}".prop_map(Value::from),
            "[0-9 .,-]{0,6}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 12, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..14).prop_map(Value::Array),
                prop::collection::vec((prop::sample::select(FIELDS.to_vec()), inner), 0..10)
                    .prop_map(|kv| Value::Object(
                        kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
                    )),
            ]
        })
    }

    proptest! {
        #[test]
        fn from_llm_text_never_panics_and_stays_in_range(s in "\\PC*") {
            assert_in_range(&from_llm_text(&s))?;
        }

        #[test]
        fn from_value_is_always_in_range(v in any_json()) {
            assert_in_range(&Metrics::from_value(&v))?;
        }

        #[test]
        fn truncated_answers_stay_in_range(cut in 0usize..400) {
            let raw = include_str!("../../tests/fixtures/metrics/fenced.txt");
            let cut = cut.min(raw.len());
            let cut = (0..=cut).rev().find(|&i| raw.is_char_boundary(i)).unwrap_or(0);
            assert_in_range(&from_llm_text(&raw[..cut]))?;
        }
    }
}
