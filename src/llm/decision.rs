//! What the cascade does after one failed attempt, as a pure function of what it knows at
//! that moment ([`Facts`]) — SPEC §5's table read from the step's side. The executor
//! (`cascade.rs`) gathers the facts (the error, the shared cooldowns, the backoff, the
//! clock), asks [`next`], and carries out the one [`Next`] it gets; the rules themselves
//! live here and are tested as a table, row by row.

use std::time::Duration;

use crate::llm::error::LlmError;

/// Everything the decision after a failed attempt depends on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Facts<'e> {
    /// How the attempt failed.
    pub error: &'e LlmError,
    /// An earlier attempt of this step, in this task, was already `Unusable`.
    pub unusable_before: bool,
    /// This failure made `failures_to_trip` in a row: the shared registry has just
    /// cooled the key down.
    pub tripped: bool,
    /// The key is cooling in the shared registry right now (maybe another request put
    /// it there while this attempt ran).
    pub key_cooling: bool,
    /// The backoff's next wait for this key, already raised to the provider's
    /// `Retry-After`; `None` once the key's `max_attempts` are used up.
    pub backoff: Option<Duration>,
    /// `max_delay_ms`: a provider wait longer than this is not waited for.
    pub max_delay: Duration,
    /// What is left of the task's `deadline_ms`.
    pub time_left: Duration,
}

/// The one thing to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Sleep this long, then try the same key again.
    RetryAfter(Duration),
    /// Move on to the step's next key at once, cooling this one for every request first
    /// when `cool` says so.
    Key { cool: Option<Cool> },
    /// The model is stalled or unreachable for everyone: cool the whole step down and
    /// start the next step at once.
    CoolStep,
    /// This step cannot answer this request: the next step.
    Step,
    /// A content-policy refusal: never retried on this model.
    Blocked,
}

/// How long a key cools down in the shared registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cool {
    /// `cooldown.duration_ms`.
    Standard,
    /// Until the wait the provider asked for is over.
    For(Duration),
}

/// The decision after a failed attempt. The order of the rules is the precedence.
pub(crate) fn next(facts: &Facts<'_>) -> Next {
    let error = facts.error;
    if matches!(error, LlmError::Blocked { .. }) {
        return Next::Blocked;
    }
    if error.is_stall() {
        return Next::CoolStep;
    }
    if error.is_bad_key() {
        return Next::Key {
            cool: Some(Cool::Standard),
        };
    }
    if !error.is_retryable() {
        return Next::Step;
    }
    // An unusable body is retried once per step: a second one says the model cannot
    // produce what we ask, whichever key asks.
    if matches!(error, LlmError::Unusable { .. }) && facts.unusable_before {
        return Next::Step;
    }
    if let Some(long) = error.retry_after().filter(|ra| *ra > facts.max_delay) {
        return Next::Key {
            cool: Some(Cool::For(long)),
        };
    }
    let Some(wait) = facts.backoff else {
        // This key's attempts are used up.
        return Next::Key {
            cool: Some(Cool::Standard),
        };
    };
    if facts.tripped || facts.key_cooling || wait >= facts.time_left {
        // Someone (maybe we) cooled the key, or the wait would outlast the task: the next
        // key or step is the better bet. A tripped key is already cooling.
        return Next::Key { cool: None };
    }
    Next::RetryAfter(wait)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn error(name: &str) -> LlmError {
        let message = String::new();
        match name {
            "429" => LlmError::from_status(429, None, message),
            "429 ra=5s" => LlmError::from_status(429, Some(Duration::from_secs(5)), message),
            "429 ra=1s" => LlmError::from_status(429, Some(Duration::from_secs(1)), message),
            "503" => LlmError::from_status(503, None, message),
            "503 ra=5s" => LlmError::from_status(503, Some(Duration::from_secs(5)), message),
            "408" => LlmError::from_status(408, None, message),
            "529" => LlmError::from_status(529, None, message),
            "401" => LlmError::from_status(401, None, message),
            "403" => LlmError::from_status(403, None, message),
            "400" => LlmError::from_status(400, None, message),
            "404" => LlmError::from_status(404, None, message),
            "422" => LlmError::from_status(422, None, message),
            "malformed key" => LlmError::MalformedKey,
            "timeout" => LlmError::Timeout(Duration::from_secs(1)),
            "connect" => LlmError::Connect { message },
            "transport" => LlmError::Transport { message },
            "unusable" => LlmError::Unusable {
                status: 200,
                reason: message,
            },
            "blocked" => LlmError::Blocked { reason: message },
            other => panic!("no error named {other}"),
        }
    }

    /// The facts of a fresh key with time to spare, changed by `tweak`.
    fn facts<'e>(error: &'e LlmError, tweak: &str) -> Facts<'e> {
        let mut facts = Facts {
            error,
            unusable_before: false,
            tripped: false,
            key_cooling: false,
            backoff: Some(ms(100)),
            max_delay: ms(2000),
            time_left: ms(10_000),
        };
        for word in tweak.split_whitespace() {
            match word {
                "unusable-before" => facts.unusable_before = true,
                "tripped" => facts.tripped = true,
                "cooling" => facts.key_cooling = true,
                "no-attempts-left" => facts.backoff = None,
                "wait=1s" => facts.backoff = Some(ms(1000)),
                "deadline-near" => facts.time_left = ms(50),
                other => panic!("no tweak named {other}"),
            }
        }
        facts
    }

    #[test]
    fn the_decision_table() {
        use Next::*;
        let standard = Key {
            cool: Some(Cool::Standard),
        };
        let move_on = Key { cool: None };
        // (error, facts, what happens)
        let rows: &[(&str, &str, Next)] = &[
            // Passing failures: back off and retry the key while it has attempts.
            ("429", "", RetryAfter(ms(100))),
            ("503", "", RetryAfter(ms(100))),
            ("408", "", RetryAfter(ms(100))),
            ("529", "", RetryAfter(ms(100))),
            ("transport", "", RetryAfter(ms(100))),
            // Retry-After is a lower bound on the wait (the backoff already took it in)…
            ("429 ra=1s", "wait=1s", RetryAfter(ms(1000))),
            // …and one longer than max_delay cools the key until then, at once.
            (
                "429 ra=5s",
                "",
                Key {
                    cool: Some(Cool::For(ms(5000))),
                },
            ),
            (
                "503 ra=5s",
                "",
                Key {
                    cool: Some(Cool::For(ms(5000))),
                },
            ),
            (
                "429 ra=5s",
                "no-attempts-left",
                Key {
                    cool: Some(Cool::For(ms(5000))),
                },
            ),
            // The key's attempts used up: it cools down, the next key goes.
            ("429", "no-attempts-left", standard),
            ("503", "no-attempts-left", standard),
            // Someone cooled the key meanwhile, or the wait outlasts the task: next key.
            ("503", "tripped", move_on),
            ("429", "cooling", move_on),
            ("503", "deadline-near", move_on),
            ("503", "tripped no-attempts-left", standard),
            // An unusable body: retried once per step, then the next step.
            ("unusable", "", RetryAfter(ms(100))),
            ("unusable", "unusable-before", Step),
            ("unusable", "no-attempts-left", standard),
            // Bad keys: next key, never retried, cooled for everyone.
            ("401", "", standard),
            ("403", "", standard),
            ("malformed key", "", standard),
            // A wrong request or model: the next step, whatever else holds.
            ("400", "", Step),
            ("404", "", Step),
            ("422", "cooling", Step),
            // A stalled or unreachable model: the whole step cools, no retry.
            ("timeout", "", CoolStep),
            ("connect", "no-attempts-left", CoolStep),
            // A content-policy refusal: never retried on this model.
            ("blocked", "", Blocked),
            ("blocked", "unusable-before tripped", Blocked),
        ];
        for (name, tweak, expected) in rows {
            let error = error(name);
            let got = next(&facts(&error, tweak));
            assert_eq!(got, *expected, "{name} [{tweak}]");
        }
    }
}
