//! The retry policy of one cascade step: how many rounds over its keys it gets (so how
//! many attempts each key gets) and how long to wait between the rounds. Waits come from `backon`'s exponential backoff (from `min_delay_ms`,
//! doubling, with jitter so concurrent requests do not wake together), clamped to
//! `max_delay_ms`. A provider's `Retry-After` raises a wait but never adds an attempt.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

use crate::config::RetrySettings;

/// The retry settings, as the cascade uses them.
#[derive(Debug, Clone)]
pub(crate) struct RetryPolicy {
    pub max_attempts: u32,
    pub min_delay: Duration,
    pub max_delay: Duration,
    pub request_timeout: Duration,
    pub deadline: Duration,
}

impl RetryPolicy {
    pub fn new(settings: &RetrySettings) -> Self {
        Self {
            max_attempts: settings.max_attempts(),
            min_delay: settings.min_delay(),
            max_delay: settings.max_delay(),
            request_timeout: settings.request_timeout(),
            deadline: settings.deadline(),
        }
    }

    /// The pauses between the rounds of one step: `max_attempts - 1` of them.
    pub fn backoff(&self) -> Backoff {
        let retries = usize::try_from(self.max_attempts.saturating_sub(1)).unwrap_or(usize::MAX);
        let inner = ExponentialBuilder::default()
            .with_min_delay(self.min_delay)
            .with_max_delay(self.max_delay)
            .with_factor(2.0)
            .with_max_times(retries)
            .with_jitter()
            .build();
        Backoff {
            inner,
            max_delay: self.max_delay,
        }
    }
}

/// The remaining pauses of one step.
#[derive(Debug)]
pub(crate) struct Backoff {
    inner: ExponentialBackoff,
    max_delay: Duration,
}

impl Backoff {
    /// The wait before the next attempt, at least `retry_after`; `None` once the attempt
    /// budget is spent (a `Retry-After` never buys an extra attempt).
    pub fn next_wait(&mut self, retry_after: Option<Duration>) -> Option<Duration> {
        // backon's jitter adds up to one more delay on top. Clamping that to the cap
        // would give every wait at the cap the same length, so many requests waiting
        // there would wake together: past the cap, the overshoot picks a point in the
        // top quarter below it instead.
        let jittered = self.inner.next()?;
        let wait = if jittered > self.max_delay && !self.max_delay.is_zero() {
            let over = (jittered - self.max_delay).as_secs_f64() / self.max_delay.as_secs_f64();
            self.max_delay.mul_f64(1.0 - 0.25 * over.fract())
        } else {
            jittered
        };
        Some(retry_after.map_or(wait, |ra| wait.max(ra)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(max_attempts: u32, min_ms: u64, max_ms: u64) -> RetryPolicy {
        RetryPolicy {
            max_attempts,
            min_delay: Duration::from_millis(min_ms),
            max_delay: Duration::from_millis(max_ms),
            request_timeout: Duration::from_secs(1),
            deadline: Duration::from_secs(10),
        }
    }

    #[test]
    fn budget_is_attempts_minus_one() {
        let mut b = policy(3, 10, 100).backoff();
        assert!(b.next_wait(None).is_some());
        assert!(b.next_wait(Some(Duration::from_secs(5))).is_some());
        assert_eq!(b.next_wait(None), None);
        assert_eq!(policy(1, 10, 100).backoff().next_wait(None), None);
    }

    #[test]
    fn waits_double_with_jitter_within_the_cap() {
        for _ in 0..200 {
            let mut b = policy(6, 100, 1000).backoff();
            let waits: Vec<Duration> = std::iter::from_fn(|| b.next_wait(None)).collect();
            assert_eq!(waits.len(), 5);
            let floors = [100, 200, 400, 750, 750];
            for (w, floor) in waits.iter().zip(floors) {
                assert!(*w >= Duration::from_millis(floor), "{waits:?}");
                assert!(*w <= Duration::from_millis(1000), "{waits:?}");
            }
            assert!(waits[0] < Duration::from_millis(200), "{waits:?}");
        }
    }

    #[test]
    fn waits_at_the_cap_are_still_spread() {
        // min = max, as in the gemini-claude example: every wait is at the cap.
        let waits: std::collections::HashSet<Duration> = (0..20)
            .filter_map(|_| policy(2, 2000, 2000).backoff().next_wait(None))
            .collect();
        assert!(waits.len() > 1, "no jitter at the cap: {waits:?}");
        for w in &waits {
            assert!(
                *w > Duration::from_millis(1500) && *w <= Duration::from_millis(2000),
                "{w:?}"
            );
        }
    }

    #[test]
    fn jitter_spreads_waits() {
        let firsts: std::collections::HashSet<Duration> = (0..20)
            .filter_map(|_| policy(2, 100, 1000).backoff().next_wait(None))
            .collect();
        assert!(firsts.len() > 1, "no jitter: {firsts:?}");
    }

    #[test]
    fn retry_after_is_a_lower_bound() {
        let p = policy(3, 10, 2000);
        let mut b = p.backoff();
        assert_eq!(
            b.next_wait(Some(Duration::from_secs(1))),
            Some(Duration::from_secs(1))
        );
    }
}
