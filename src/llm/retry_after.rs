//! `Retry-After` parsing: how long a provider asks us to wait before the next attempt.
//!
//! Three forms are understood: `retry-after-ms: 1500` (OpenAI-style, milliseconds),
//! `Retry-After: 2` (delta seconds, fractions tolerated) and `Retry-After: <HTTP date>`.
//! The millisecond header wins when both are present because it is the more precise.
//! Anything unparsable is ignored: a garbled header must not stop a retry.

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, RETRY_AFTER};

/// The longest wait a provider can ask for. Anything longer (`Retry-After: 1e19`, a date
/// in the year 9999) is read as this: a day is "cool down and move on" either way, and
/// an unbounded value would overflow the clock arithmetic that schedules the wait.
pub const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

/// Seconds as a bounded wait; `None` for negative or non-finite values.
pub fn from_secs(secs: f64) -> Option<Duration> {
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    Some(Duration::try_from_secs_f64(secs).map_or(MAX_WAIT, |d| d.min(MAX_WAIT)))
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
    Some(
        when.duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(MAX_WAIT),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absurd_waits_are_bounded_not_a_panic() {
        let now = SystemTime::now();
        for raw in [
            "1e20",
            "1e19",
            "18446744073709551616",
            "1.7976931348623157e308",
        ] {
            assert_eq!(parse_value(raw, now), Some(MAX_WAIT), "{raw}");
        }
        assert_eq!(
            parse(&headers(&[("retry-after-ms", "1e30")]), now),
            Some(MAX_WAIT)
        );
        assert_eq!(
            parse_value("Fri, 31 Dec 9999 23:59:59 GMT", now),
            Some(MAX_WAIT)
        );
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
}
