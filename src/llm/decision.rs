//! What the cascade does after one failed attempt, and after one round of a step, as
//! pure functions of what it knows at that moment — the table in docs/behaviour.md, The cascade, read from the step's
//! side. The executor (`cascade.rs`) gathers the facts (the error, the shared cooldowns,
//! the backoff, the clock), asks [`next`] or [`after_round`], and carries out the one
//! answer it gets; the rules themselves live here and are tested as tables, row by row.
//!
//! A step works in rounds: a round tries each of its keys still in play once, in order;
//! a passing failure (429, 408/5xx/529, an unusable body) moves to the next key at once
//! and keeps the key for the next round. Between rounds the step backs off (from
//! `min_delay_ms`, doubling, jittered, capped at `max_delay_ms`; a `Retry-After` is a
//! lower bound); `max_attempts` bounds the rounds, so the attempts per key.

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
    /// This was the step's last round (`max_attempts`): the key has no attempt left.
    pub last_round: bool,
    /// `max_delay_ms`: a provider wait longer than this is not waited for.
    pub max_delay: Duration,
    /// The budget registry knows this key's budget is spent for longer than
    /// `budgets.spill_after_ms` (what the 429 said, or a declared limit).
    pub budget_spent: bool,
}

/// The one thing to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// The next key at once; this key again in the next round, which starts no sooner
    /// than `wait_at_least` (the provider's `Retry-After`) from the end of this one.
    Again { wait_at_least: Option<Duration> },
    /// The next key at once; this key is done for this task. When `cool` says so it
    /// is cooled for every request first.
    Retire { cool: Option<Cool> },
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
        return Next::Retire {
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
    // A 429 on a budget that stays spent for a while: the key leaves this task's rounds
    // at once; the budget, not a cooldown, keeps every request off it until its reset.
    if matches!(error, LlmError::RateLimited { .. }) && facts.budget_spent {
        return Next::Retire { cool: None };
    }
    let retry_after = error.retry_after();
    if let Some(long) = retry_after.filter(|ra| *ra > facts.max_delay) {
        return Next::Retire {
            cool: Some(Cool::For(long)),
        };
    }
    if facts.last_round {
        // This key's attempts are used up: every request skips it for a while.
        return Next::Retire {
            cool: Some(Cool::Standard),
        };
    }
    if facts.tripped || facts.key_cooling {
        // Someone (maybe we) cooled the key meanwhile: it is already cooling.
        return Next::Retire { cool: None };
    }
    Next::Again {
        wait_at_least: retry_after,
    }
}

/// Everything the decision at the end of a round depends on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RoundFacts {
    /// Keys still in play for the next round.
    pub keys_left: usize,
    /// The backoff's next wait, already raised to the round's longest `Retry-After`;
    /// `None` once `max_attempts` rounds are done.
    pub backoff: Option<Duration>,
    /// What is left of the task's `deadline_ms`.
    pub time_left: Duration,
}

/// What follows a round that ended without an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Round {
    /// Sleep this long, then the next round.
    Wait(Duration),
    /// The step is done for this task: the next step.
    End,
}

pub(crate) fn after_round(facts: &RoundFacts) -> Round {
    match facts.backoff {
        // No key left, or no round left.
        _ if facts.keys_left == 0 => Round::End,
        None => Round::End,
        // The wait would outlast the task: another step is the better bet.
        Some(wait) if wait >= facts.time_left => Round::End,
        Some(wait) => Round::Wait(wait),
    }
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
                foreign: false,
            },
            "blocked" => LlmError::Blocked { reason: message },
            other => panic!("no error named {other}"),
        }
    }

    /// The facts of a fresh key in a first round of several, changed by `tweak`.
    fn facts<'e>(error: &'e LlmError, tweak: &str) -> Facts<'e> {
        let mut facts = Facts {
            error,
            unusable_before: false,
            tripped: false,
            key_cooling: false,
            last_round: false,
            max_delay: ms(2000),
            budget_spent: false,
        };
        for word in tweak.split_whitespace() {
            match word {
                "unusable-before" => facts.unusable_before = true,
                "tripped" => facts.tripped = true,
                "cooling" => facts.key_cooling = true,
                "last-round" => facts.last_round = true,
                "budget-spent" => facts.budget_spent = true,
                other => panic!("no tweak named {other}"),
            }
        }
        facts
    }

    #[test]
    fn the_decision_table() {
        use Next::*;
        let again = Again {
            wait_at_least: None,
        };
        let standard = Retire {
            cool: Some(Cool::Standard),
        };
        let for_5s = Retire {
            cool: Some(Cool::For(ms(5000))),
        };
        // (error, facts, what happens)
        let rows: &[(&str, &str, Next)] = &[
            // Passing failures: the next key at once, this one again next round.
            ("429", "", again),
            ("503", "", again),
            ("408", "", again),
            ("529", "", again),
            ("transport", "", again),
            // A Retry-After is a lower bound on the pause before the next round…
            (
                "429 ra=1s",
                "",
                Again {
                    wait_at_least: Some(ms(1000)),
                },
            ),
            // …and one longer than max_delay cools the key until then, at once.
            ("429 ra=5s", "", for_5s),
            ("503 ra=5s", "", for_5s),
            ("429 ra=5s", "last-round", for_5s),
            // The key's last round: it cools down for every request.
            ("429", "last-round", standard),
            ("503", "last-round", standard),
            ("503", "tripped last-round", standard),
            // Someone cooled the key meanwhile: it leaves this task's rounds.
            ("503", "tripped", Retire { cool: None }),
            ("429", "cooling", Retire { cool: None }),
            // A 429 on a budget known to be spent for a while: the key is left, no
            // cooldown (the budget says until when); other failures keep their rules.
            ("429", "budget-spent", Retire { cool: None }),
            (
                "429 ra=5s",
                "budget-spent last-round",
                Retire { cool: None },
            ),
            ("503", "budget-spent", again),
            // An unusable body: retried once per step, then the next step.
            ("unusable", "", again),
            ("unusable", "unusable-before", Step),
            ("unusable", "last-round", standard),
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
            ("connect", "last-round", CoolStep),
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

    #[test]
    fn the_round_table() {
        let round = |keys_left, backoff: Option<u64>, time_left| RoundFacts {
            keys_left,
            backoff: backoff.map(ms),
            time_left: ms(time_left),
        };
        // (facts, what happens)
        let rows = [
            // Keys left, rounds left, time left: pause, then the next round.
            (round(3, Some(100), 10_000), Round::Wait(ms(100))),
            (round(1, Some(2000), 10_000), Round::Wait(ms(2000))),
            // Every key retired (bad, cooled, tripped): the next step at once.
            (round(0, Some(100), 10_000), Round::End),
            // `max_attempts` rounds done.
            (round(2, None, 10_000), Round::End),
            // The pause would outlast the task's deadline.
            (round(2, Some(100), 100), Round::End),
            (round(2, Some(100), 50), Round::End),
        ];
        for (facts, expected) in rows {
            assert_eq!(after_round(&facts), expected, "{facts:?}");
        }
    }
}
