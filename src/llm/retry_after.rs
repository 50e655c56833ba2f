//! `Retry-After` parsing: how long a provider asks us to wait before the next attempt.
//!
//! Three forms are understood: `retry-after-ms: 1500` (OpenAI-style, milliseconds),
//! `Retry-After: 2` (delta seconds, fractions tolerated) and `Retry-After: <HTTP date>`.
//! The millisecond header wins when both are present because it is the more precise.
//! Anything unparsable is ignored: a garbled header must not stop a retry.

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, RETRY_AFTER};

/// The longest wait a provider can mean: a daily quota resets within a day. Anything
/// longer (`Retry-After: 1e19`, a date in the year 9999) is nonsense and read as no
/// hint at all, so the 429 rules apply (issue 10), rather than one bogus header taking
/// a key out for a day; the bound also keeps the clock arithmetic from overflowing.
pub const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

/// Seconds as a wait; `None` for negative, non-finite or implausible (past
/// [`MAX_WAIT`]) values.
pub fn from_secs(secs: f64) -> Option<Duration> {
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| *d <= MAX_WAIT)
}

/// The wait a response asks for, if it asks for one. `now` is injected for tests.
pub fn parse(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    if let Some(ms) = headers
        .get("retry-after-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .and_then(|ms| from_secs(ms / 1000.0))
    {
        return Some(ms);
    }
    let raw = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    parse_value(raw, now)
}

/// One `Retry-After` value: delta seconds or an HTTP date (past dates mean "now").
pub fn parse_value(raw: &str, now: SystemTime) -> Option<Duration> {
    if let Ok(secs) = raw.parse::<f64>() {
        return from_secs(secs);
    }
    let when = httpdate::parse_http_date(raw).ok()?;
    Some(when.duration_since(now).unwrap_or(Duration::ZERO)).filter(|d| *d <= MAX_WAIT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absurd_waits_are_no_hint_not_a_panic() {
        let now = SystemTime::now();
        for raw in [
            "1e20",
            "1e19",
            "18446744073709551616",
            "1.7976931348623157e308",
            "86401",
        ] {
            assert_eq!(parse_value(raw, now), None, "{raw}");
        }
        assert_eq!(parse_value("86400", now), Some(MAX_WAIT));
        assert_eq!(parse(&headers(&[("retry-after-ms", "1e30")]), now), None);
        assert_eq!(parse_value("Fri, 31 Dec 9999 23:59:59 GMT", now), None);
        assert_eq!(parse_value("-5", now), None);
        assert_eq!(parse_value("NaN", now), None);
        assert_eq!(parse_value("inf", now), None);
    }
    use reqwest::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn delta_seconds() {
        let now = SystemTime::now();
        assert_eq!(
            parse(&headers(&[("retry-after", "7")]), now),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            parse(&headers(&[("retry-after", " 0.5 ")]), now),
            Some(Duration::from_millis(500))
        );
    }

    #[test]
    fn http_date_in_the_future_and_past() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(
            parse(
                &headers(&[("retry-after", "Sun, 06 Nov 1994 08:50:07 GMT")]),
                now
            ),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse(
                &headers(&[("retry-after", "Sun, 06 Nov 1994 08:00:00 GMT")]),
                now
            ),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn milliseconds_header_wins() {
        let h = headers(&[("retry-after", "10"), ("retry-after-ms", "1500")]);
        assert_eq!(
            parse(&h, SystemTime::now()),
            Some(Duration::from_millis(1500))
        );
    }

    #[test]
    fn garbage_and_absence_are_ignored() {
        let now = SystemTime::now();
        assert_eq!(parse(&HeaderMap::new(), now), None);
        assert_eq!(parse(&headers(&[("retry-after", "soon")]), now), None);
        assert_eq!(parse(&headers(&[("retry-after", "-3")]), now), None);
        assert_eq!(
            parse(
                &headers(&[("retry-after-ms", "x"), ("retry-after", "2")]),
                now
            ),
            Some(Duration::from_secs(2))
        );
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn any_header_value_never_panics(raw in "\\PC{0,40}", ms in "\\PC{0,40}") {
                let now = SystemTime::now();
                let _ = parse_value(&raw, now);
                let mut map = HeaderMap::new();
                if let Ok(v) = HeaderValue::from_str(&raw) {
                    map.insert(RETRY_AFTER, v);
                }
                if let Ok(v) = HeaderValue::from_str(&ms) {
                    map.insert("retry-after-ms", v);
                }
                let _ = parse(&map, now);
            }

            #[test]
            fn numbers_of_any_size_never_panic(
                x in prop_oneof![any::<f64>(), (0u32..400).prop_map(|e| 10f64.powi(e as i32))],
            ) {
                let now = SystemTime::now();
                for raw in [x.to_string(), format!("{x:e}")] {
                    for got in [
                        parse_value(&raw, now),
                        parse(&headers(&[("retry-after-ms", &raw)]), now),
                    ] {
                        // Bounded, so `Instant::now() + wait` in the cascade cannot overflow.
                        prop_assert!(got.is_none_or(|d| d <= MAX_WAIT
                            && std::time::Instant::now().checked_add(d).is_some()));
                    }
                }
            }

            #[test]
            fn delta_seconds_round_trip(secs in 0u32..86_400) {
                prop_assert_eq!(
                    parse_value(&secs.to_string(), SystemTime::now()),
                    Some(Duration::from_secs(u64::from(secs)))
                );
            }

            #[test]
            fn http_dates_in_the_past_mean_now(ago in 0u64..1_700_000_000) {
                let now = SystemTime::now();
                let when = now - Duration::from_secs(ago);
                let got = parse_value(&httpdate::fmt_http_date(when), now);
                prop_assert!(got.is_none_or(|d| d.is_zero()), "{got:?}");
            }

            #[test]
            fn http_dates_in_the_future_round_trip_to_the_second(ahead in 1u64..86_400) {
                let now = SystemTime::now();
                let got = parse_value(&httpdate::fmt_http_date(now + Duration::from_secs(ahead)), now)
                    .expect("a future date parses");
                prop_assert!(got.as_secs().abs_diff(ahead) <= 1, "{got:?} for {ahead}");
            }
        }

        /// Found by `numbers_of_any_size_never_panic`: `Duration::from_secs_f64`
        /// panics above u64::MAX seconds, and a wait of `1e19` s made the cascade's
        /// `Instant::now() + wait` overflow, so one header from a broken or hostile
        /// provider could crash the analysis task.
        #[test]
        fn regression_huge_delays_do_not_panic() {
            let now = SystemTime::now();
            for raw in [
                "1e19",
                "1e20",
                "1e300",
                "18446744073709551616",
                "1.8446744073709552e19",
            ] {
                let _ = parse_value(raw, now);
                let _ = parse(&headers(&[("retry-after-ms", raw)]), now);
                let _ = parse(&headers(&[("retry-after", raw)]), now);
            }
            assert_eq!(parse_value("1e19", now), None);
            assert_eq!(parse_value("Fri, 31 Dec 9999 23:59:59 GMT", now), None);
        }
    }
}
