//! What a provider says about its budget (docs/behaviour.md, Budgets), read by pure functions:
//! the `x-ratelimit-*` headers (Groq's resets such as `2m59.56s`, `7.66s`, `1h2m`),
//! `Retry-After` / `retry-after-ms`, and Gemini's 429 body (`google.rpc.RetryInfo`'s
//! `retryDelay`, a `QuotaFailure` naming a per-day quota). Nonsense — negative, huge,
//! unparsable values, a reset in the past, a wait past [`MAX_WAIT`] — is never a panic:
//! it is ignored, and the 429 rules apply as if nothing had been said.

use std::time::{Duration, SystemTime};

use reqwest::header::HeaderMap;

use crate::llm::retry_after::{self, MAX_WAIT};

/// What one answer says about the budget it was sent on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hint {
    /// `x-ratelimit-remaining-requests`.
    pub remaining_requests: Option<u64>,
    /// `x-ratelimit-reset-requests`: when the request budget is whole again.
    pub reset_requests: Option<Duration>,
    /// `x-ratelimit-remaining-tokens`.
    pub remaining_tokens: Option<u64>,
    /// `x-ratelimit-reset-tokens`.
    pub reset_tokens: Option<Duration>,
    /// `Retry-After` / `retry-after-ms`, or Gemini's `RetryInfo.retryDelay`.
    pub retry_after: Option<Duration>,
    /// The answer named a per-day quota as the one exceeded.
    pub per_day: bool,
    /// The tokens a usable answer says it took (its body's `usage`): what its request
    /// really cost a tokens-per-minute budget.
    pub used_tokens: Option<u64>,
}

impl Hint {
    /// For how long, from now, the budget this answer was sent on is known to be spent;
    /// `None` when the answer does not say (a 429 without a hint: the caller lowers the
    /// rate instead). A per-day quota is spent until `daily_reset`.
    pub fn spent_for(&self, rate_limited: bool, daily_reset: Duration) -> Option<Duration> {
        if rate_limited && self.per_day {
            return Some(daily_reset.max(self.retry_after.unwrap_or_default()));
        }
        let requests = self
            .reset_requests
            .filter(|_| self.remaining_requests == Some(0));
        let tokens = self
            .reset_tokens
            .filter(|_| self.remaining_tokens == Some(0));
        let said = [requests, tokens, self.retry_after.filter(|_| rate_limited)]
            .into_iter()
            .flatten()
            .max();
        match said {
            // A reset "now" or in the past on a 429 says nothing usable.
            Some(d) if d.is_zero() => None,
            other => other,
        }
    }

    /// Whether the answer said anything at all about the budget.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Reads the rate-limit headers of any answer (2xx included). `now` is injected for the
/// HTTP-date form of `Retry-After`.
pub fn from_headers(headers: &HeaderMap, now: SystemTime) -> Hint {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    Hint {
        remaining_requests: text("x-ratelimit-remaining-requests").and_then(parse_count),
        reset_requests: text("x-ratelimit-reset-requests").and_then(parse_reset),
        remaining_tokens: text("x-ratelimit-remaining-tokens").and_then(parse_count),
        reset_tokens: text("x-ratelimit-reset-tokens").and_then(parse_reset),
        retry_after: retry_after::parse(headers, now),
        per_day: false,
        used_tokens: None,
    }
}

/// Adds what a 429 body says (Gemini's `error.details`) to `hint`. Any other body, or
/// one that does not parse, leaves it as it is.
pub fn with_body(mut hint: Hint, body: &str) -> Hint {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(body) else {
        return hint;
    };
    let Some(details) = value.pointer("/error/details").and_then(|d| d.as_array()) else {
        return hint;
    };
    for detail in details {
        let kind = detail.get("@type").and_then(|t| t.as_str()).unwrap_or("");
        if kind.ends_with("google.rpc.RetryInfo") {
            if let Some(delay) = detail
                .get("retryDelay")
                .and_then(|d| d.as_str())
                .and_then(parse_reset)
            {
                hint.retry_after = Some(hint.retry_after.unwrap_or_default().max(delay));
            }
        } else if kind.ends_with("google.rpc.QuotaFailure") {
            let violations = detail.get("violations").and_then(|v| v.as_array());
            hint.per_day |= violations.into_iter().flatten().any(names_a_day);
        }
    }
    hint
}

/// A `QuotaFailure` violation about a per-day quota: Gemini names them like
/// `GenerateRequestsPerDayPerProjectPerModel-FreeTier`.
fn names_a_day(violation: &serde_json::Value) -> bool {
    ["quotaId", "quotaMetric", "description"]
        .iter()
        .filter_map(|field| violation.get(*field).and_then(|v| v.as_str()))
        .any(|text| {
            let text = text.to_ascii_lowercase();
            text.contains("perday") || text.contains("per_day") || text.contains("per day")
        })
}

/// A non-negative integer count; anything else is ignored.
pub fn parse_count(raw: &str) -> Option<u64> {
    raw.trim().parse::<u64>().ok()
}

/// A reset or delay: Groq's Go-style durations (`2m59.56s`, `7.66s`, `1h2m`, `250ms`),
/// Gemini's `"52s"`, or plain seconds (`12`, `0.5`). Bounded by [`MAX_WAIT`]; `None`
/// for anything unparsable or negative.
pub fn parse_reset(raw: &str) -> Option<Duration> {
    let raw = raw.trim();
    if raw.is_empty() {
        return None;
    }
    if let Ok(secs) = raw.parse::<f64>() {
        return retry_after::from_secs(secs);
    }
    let mut total = 0.0_f64;
    let mut rest = raw;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            "us" | "µs" => 0.000_001,
            "ns" => 0.000_000_001,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += number * scale;
    }
    retry_after::from_secs(total).map(|d| d.min(MAX_WAIT))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use reqwest::header::{HeaderName, HeaderValue};

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                map.insert(n, v);
            }
        }
        map
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn resets_in_every_shape() {
        let cases: &[(&str, Option<Duration>)] = &[
            ("2m59.56s", Some(ms(179_560))),
            ("7.66s", Some(ms(7_660))),
            ("1h2m", Some(Duration::from_secs(3_720))),
            ("250ms", Some(ms(250))),
            ("52s", Some(Duration::from_secs(52))),
            ("12", Some(Duration::from_secs(12))),
            ("0.5", Some(ms(500))),
            ("0s", Some(Duration::ZERO)),
            ("", None),
            ("-3s", None),
            ("-1", None),
            ("soon", None),
            ("5 minutes", None),
            ("1x", None),
            ("s", None),
            ("1..2s", None),
            ("99999999h", None),
            ("24h", Some(MAX_WAIT)),
            ("1e400", None),
        ];
        for (raw, want) in cases {
            assert_eq!(parse_reset(raw), *want, "{raw:?}");
        }
    }

    #[test]
    fn groq_headers_say_when_the_budget_is_back() {
        let now = SystemTime::now();
        let spent = from_headers(
            &headers(&[
                ("x-ratelimit-remaining-requests", "0"),
                ("x-ratelimit-reset-requests", "2m59.56s"),
                ("x-ratelimit-remaining-tokens", "5000"),
                ("x-ratelimit-reset-tokens", "7.66s"),
            ]),
            now,
        );
        assert_eq!(spent.remaining_requests, Some(0));
        assert_eq!(spent.spent_for(false, ms(1)), Some(ms(179_560)));
        // Budget left: nothing is spent, whatever the resets say.
        let left = from_headers(
            &headers(&[
                ("x-ratelimit-remaining-requests", "14"),
                ("x-ratelimit-reset-requests", "2s"),
            ]),
            now,
        );
        assert_eq!(left.spent_for(false, ms(1)), None);
        // Tokens spent count as well.
        let tokens = from_headers(
            &headers(&[
                ("x-ratelimit-remaining-tokens", "0"),
                ("x-ratelimit-reset-tokens", "7.66s"),
            ]),
            now,
        );
        assert_eq!(tokens.spent_for(false, ms(1)), Some(ms(7_660)));
    }

    #[test]
    fn retry_after_counts_on_a_429_only() {
        let now = SystemTime::now();
        let hint = from_headers(&headers(&[("retry-after", "3")]), now);
        assert_eq!(hint.spent_for(true, ms(1)), Some(Duration::from_secs(3)));
        assert_eq!(hint.spent_for(false, ms(1)), None);
        let hint = from_headers(&headers(&[("retry-after-ms", "1500")]), now);
        assert_eq!(hint.spent_for(true, ms(1)), Some(ms(1500)));
        // "Retry now" is no hint: the 429 rules apply.
        let hint = from_headers(&headers(&[("retry-after", "0")]), now);
        assert_eq!(hint.spent_for(true, ms(1)), None);
    }

    #[test]
    fn gemini_bodies() {
        let minute = r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[
            {"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[
              {"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests",
               "quotaId":"GenerateRequestsPerMinutePerProjectPerModel-FreeTier"}]},
            {"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"52s"}]}}"#;
        let hint = with_body(Hint::default(), minute);
        assert_eq!(hint.retry_after, Some(Duration::from_secs(52)));
        assert!(!hint.per_day);
        assert_eq!(
            hint.spent_for(true, Duration::from_secs(9_000)),
            Some(Duration::from_secs(52))
        );

        let day = r#"{"error":{"code":429,"details":[
            {"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[
              {"quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]},
            {"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"20s"}]}}"#;
        let hint = with_body(Hint::default(), day);
        assert!(hint.per_day);
        assert_eq!(
            hint.spent_for(true, Duration::from_secs(9_000)),
            Some(Duration::from_secs(9_000)),
            "spent until the daily reset, not for 20 s"
        );

        for nonsense in [
            "",
            "not json",
            r#"{"error":{"details":"x"}}"#,
            r#"{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"-5s"}]}}"#,
            r#"{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":12}]}}"#,
        ] {
            assert_eq!(
                with_body(Hint::default(), nonsense),
                Hint::default(),
                "{nonsense}"
            );
        }
    }

    #[test]
    fn a_hintless_429_says_nothing() {
        let hint = from_headers(&HeaderMap::new(), SystemTime::now());
        assert!(hint.is_empty());
        assert_eq!(hint.spent_for(true, ms(1)), None);
    }

    /// Rate-limit values as a broken or hostile provider might send them.
    fn nonsense() -> impl Strategy<Value = String> {
        prop_oneof![
            ".{0,24}",
            "-?[0-9]{1,40}(\\.[0-9]{0,8})?([eE][-+]?[0-9]{1,4})?",
            "-?([0-9]{1,30}(\\.[0-9]{0,4})?(h|m|s|ms|us|µs|ns|d|x)){1,5}",
            Just("NaN".to_owned()),
            Just("inf".to_owned()),
            Just("Sun, 06 Nov 1994 08:49:37 GMT".to_owned()),
            Just("Fri, 31 Dec 9999 23:59:59 GMT".to_owned()),
        ]
    }

    /// A remaining count: often 0 (so that the resets count), else anything.
    fn count() -> impl Strategy<Value = String> {
        prop_oneof![Just("0".to_owned()), "-?[0-9]{1,25}", ".{0,8}"]
    }

    proptest! {
        #[test]
        fn nonsense_never_panics_and_stays_bounded(
            raw in ".{0,24}",
            count in ".{0,12}",
            body in ".{0,64}",
            delay in ".{0,16}",
        ) {
            let _ = parse_reset(&raw);
            let map = headers(&[
                ("x-ratelimit-remaining-requests", count.as_str()),
                ("x-ratelimit-reset-requests", raw.as_str()),
                ("x-ratelimit-reset-tokens", raw.as_str()),
                ("retry-after", raw.as_str()),
                ("retry-after-ms", count.as_str()),
            ]);
            let hint = from_headers(&map, SystemTime::now());
            let gemini = format!(
                r#"{{"error":{{"details":[{{"@type":"google.rpc.RetryInfo","retryDelay":{}}}]}}}}"#,
                serde_json::Value::String(delay.clone())
            );
            let hint = with_body(with_body(hint, &body), &gemini);
            for rate_limited in [true, false] {
                if let Some(d) = hint.spent_for(rate_limited, MAX_WAIT) {
                    prop_assert!(d <= MAX_WAIT);
                }
            }
        }

        /// Arbitrary strings and number-like nonsense (huge, negative, exponents, Go
        /// durations with absurd parts): a reset is never a panic, and a parsed one is a
        /// finite wait within [`MAX_WAIT`] that the clock can add.
        #[test]
        fn any_reset_is_a_bounded_finite_wait(raw in nonsense()) {
            if let Some(d) = parse_reset(&raw) {
                prop_assert!(d <= MAX_WAIT, "{raw:?}: {d:?}");
                prop_assert!(std::time::Instant::now().checked_add(d).is_some());
            }
        }

        /// Every header and body shape at once, filled with nonsense, through to the
        /// budget registry: the wait it learns is bounded, and learning never panics.
        #[test]
        fn any_hint_teaches_a_bounded_wait(
            remaining_requests in count(),
            reset_requests in nonsense(),
            remaining_tokens in count(),
            reset_tokens in nonsense(),
            retry_after in nonsense(),
            retry_after_ms in nonsense(),
            delay in nonsense(),
            quota in ".{0,24}",
            rate_limited in any::<bool>(),
        ) {
            let map = headers(&[
                ("x-ratelimit-remaining-requests", remaining_requests.as_str()),
                ("x-ratelimit-reset-requests", reset_requests.as_str()),
                ("x-ratelimit-remaining-tokens", remaining_tokens.as_str()),
                ("x-ratelimit-reset-tokens", reset_tokens.as_str()),
                ("retry-after", retry_after.as_str()),
                ("retry-after-ms", retry_after_ms.as_str()),
            ]);
            let body = serde_json::json!({"error": {"code": 429, "details": [
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay},
                {"@type": "type.googleapis.com/google.rpc.QuotaFailure",
                 "violations": [{"quotaId": quota}]},
            ]}});
            let hint = with_body(from_headers(&map, SystemTime::now()), &body.to_string());
            for wait in [hint.reset_requests, hint.reset_tokens, hint.retry_after].into_iter().flatten() {
                prop_assert!(wait <= MAX_WAIT, "{hint:?}");
            }
            let daily_reset = crate::llm::budget::until_daily_reset(SystemTime::now());
            if let Some(d) = hint.spent_for(rate_limited, daily_reset) {
                prop_assert!(d <= MAX_WAIT && !d.is_zero(), "{hint:?}: {d:?}");
            }
            let budgets = crate::llm::budget::Budgets::new(std::collections::HashMap::new());
            let step = crate::llm::cooldown::StepId {
                no: 0,
                provider: "p".to_owned(),
                model: "m".to_owned(),
            };
            if let Some(d) = budgets.learn(&step, Some(0), &hint, rate_limited) {
                prop_assert!(d <= MAX_WAIT, "{hint:?}: {d:?}");
            }
            let _ = budgets.admit(&step, Some(0), 0);
        }

        #[test]
        fn any_go_duration_parses_within_bounds(h in 0u64..100, m in 0u64..60, s in 0u64..60, frac in 0u64..100) {
            let raw = format!("{h}h{m}m{s}.{frac:02}s");
            let parsed = parse_reset(&raw);
            // Up to a day it is a reset; past a day, no hint.
            let secs = (h * 3600 + m * 60 + s) as f64 + frac as f64 / 100.0;
            prop_assert_eq!(parsed.is_some(), secs <= MAX_WAIT.as_secs_f64(), "{}", raw);
            prop_assert!(parsed.unwrap_or_default() <= MAX_WAIT);
        }
    }
}
