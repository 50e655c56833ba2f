//! When a slow attempt starts the next step in parallel (docs/behaviour.md, Hedging).
//!
//! With `hedge_after_ms = "auto"` the threshold of a step comes from its own recent
//! latency: the p95 of its last [`WINDOW`] usable answers × 1.5, never below
//! [`FLOOR`] (a local fake answering in 2 ms must not hedge on every scheduler hiccup)
//! and never above half of `request_timeout_ms` (a hedge that starts when the first
//! attempt is about to give up anyway buys nothing). Until [`MIN_SAMPLES`] answers are
//! known it is [`START`], under the same cap.
//!
//! A restarted process starts from the latencies of the last answers stored in
//! `llm_calls` ([`LatencySample`]), not from [`START`].
//!
//! Only analyses and metrics (short answers) teach and use the learned threshold. A
//! digest or a transcript takes as long as its week or its recording: it hedges at
//! half the request timeout ([`Hedging::slow_threshold`]) and never marks a step
//! stalled.
//!
//! A step is stalled, not merely slow once, when an attempt passes its threshold and the
//! step has given no answer since that attempt started: then every attempt still
//! waiting on it hedges at once ([`Hedging::passed`]), instead of each waiting out its
//! own threshold. One slow answer among a loaded step's many does not do that: the
//! others keep answering.
//!
//! A hedge fires on a step that is slow, not on a process that is busy. When this
//! process's own cores are saturated (a burst of entries, other programs on the host), a
//! healthy answer that reached the socket in time waits its turn: first the connection's
//! task reads it, then the attempt's. The hedge timer waits in the same queue, so how
//! late it wakes is how far behind the process is ([`wait_more`]): the silence of the
//! step is only known up to twice that lag ago, and the hedge waits until that silence
//! covers the threshold. An idle process wakes within a millisecond and hedges at once.
//!
//! Every threshold says where it came from ([`Basis`]): the start value, latencies
//! stored by the last run, this process's own answers, a fixed setting, or the slow
//! tasks' half request timeout. Each attempt's record in the log carries it.
//!
//! Latencies are kept per step, shared by every request and both tasks (a step's number
//! is the same for equal provider/model pairs), behind one short mutex each, never held
//! across an await.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::futures::Notified;
use tokio::time::Instant;

use crate::config::HedgeAfter;

/// Answers remembered per step.
pub(crate) const WINDOW: usize = 32;
/// Answers needed before the observed latency replaces [`START`].
pub(crate) const MIN_SAMPLES: usize = 5;
/// The threshold before any latency is known.
pub(crate) const START: Duration = Duration::from_secs(2);
/// The lowest learned threshold.
pub(crate) const FLOOR: Duration = Duration::from_millis(100);

/// Where an attempt's hedging threshold came from (the `hedge_basis` of its log event).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Basis {
    /// `auto`, fewer than [`MIN_SAMPLES`] latencies known: [`START`].
    Start,
    /// `auto`, learned mostly from latencies the last run stored in `llm_calls`.
    Stored,
    /// `auto`, learned from at least [`MIN_SAMPLES`] answers of this process.
    Learned,
    /// A fixed `hedge_after_ms`.
    Fixed,
    /// `auto`, a task slow by nature: half the request timeout.
    Slow,
}

impl Basis {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Start => "start",
            Self::Stored => "stored",
            Self::Learned => "learned",
            Self::Fixed => "fixed",
            Self::Slow => "slow_task",
        }
    }
}

/// A hedging threshold and where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Threshold {
    pub after: Duration,
    pub basis: Basis,
}

/// The hedge timer of an attempt fired `elapsed` after it started, `lag` after the
/// moment it was set for: whether the attempt has been silent for `after` as seen from
/// the socket (`None`: hedge now), or how much longer to wait before asking again.
///
/// A timer that wakes `lag` late means every task of the process waits about that long
/// for its turn. An answer that reached the socket up to twice that long ago may still
/// be on its way in (the connection's turn, then the attempt's), so the silence known
/// for sure is `elapsed - 2 × lag`. In a steady lag the hedge fires about three lags
/// after the threshold; with no lag, at the threshold.
pub(crate) fn wait_more(after: Duration, elapsed: Duration, lag: Duration) -> Option<Duration> {
    let silent = elapsed.saturating_sub(lag.saturating_mul(2));
    (silent < after).then(|| after - silent)
}

/// The auto threshold from a step's recent latencies (any order).
pub(crate) fn auto_threshold(recent: &[Duration], request_timeout: Duration) -> Duration {
    threshold_of(recent.to_vec(), request_timeout)
}

/// [`auto_threshold`] of latencies the caller already collected: sorted in place.
fn threshold_of(mut sorted: Vec<Duration>, request_timeout: Duration) -> Duration {
    let cap = request_timeout / 2;
    if sorted.len() < MIN_SAMPLES {
        return START.min(cap);
    }
    sorted.sort_unstable();
    // Nearest-rank p95: the smallest sample with at least 95 % of them at or below it.
    let rank = (sorted.len() * 95).div_ceil(100).max(1);
    let p95 = sorted[rank - 1];
    p95.mul_f64(1.5).max(FLOOR).min(cap)
}

/// One usable answer's latency as the call records keep it (`llm_calls`, outcome `ok`):
/// what a restarted process learns its hedging thresholds from before it has answers
/// of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencySample {
    pub provider: String,
    pub model: String,
    pub latency: Duration,
}

/// The recent latencies of one step, and its threshold computed from them.
#[derive(Debug)]
struct Recent {
    /// Each latency, and whether it is an answer of this process (not a stored one).
    samples: VecDeque<(Duration, bool)>,
    threshold: Duration,
    /// When the step last gave a usable answer in this process.
    last_answer: Option<Instant>,
}

/// One step's learned hedging: its recent latencies, and the signal that it stalled.
#[derive(Debug)]
struct StepHedging {
    recent: Mutex<Recent>,
    stalled: Notify,
}

/// The hedging rule of one process: fixed, off, or learned per step.
#[derive(Debug)]
pub(crate) struct Hedging {
    setting: HedgeAfter,
    request_timeout: Duration,
    /// Indexed by step number; empty unless the setting is `auto`.
    steps: Vec<StepHedging>,
}

impl Hedging {
    /// `steps` is the number of distinct steps (the highest step number + 1).
    pub fn new(setting: HedgeAfter, request_timeout: Duration, steps: usize) -> Self {
        let start = auto_threshold(&[], request_timeout);
        let steps = match setting {
            HedgeAfter::Auto => (0..steps)
                .map(|_| StepHedging {
                    recent: Mutex::new(Recent {
                        samples: VecDeque::with_capacity(WINDOW),
                        threshold: start,
                        last_answer: None,
                    }),
                    stalled: Notify::new(),
                })
                .collect(),
            HedgeAfter::Off | HedgeAfter::After(_) => Vec::new(),
        };
        Self {
            setting,
            request_timeout,
            steps,
        }
    }

    /// Whether the threshold is learned: then one attempt that passes it marks its step
    /// stalled for later requests.
    pub fn is_auto(&self) -> bool {
        self.setting == HedgeAfter::Auto
    }

    /// How long an attempt on step `no` may take before the next step starts, and
    /// where that came from.
    pub fn threshold(&self, no: usize) -> Option<Threshold> {
        match self.setting {
            HedgeAfter::Off => None,
            HedgeAfter::After(after) => Some(Threshold {
                after,
                basis: Basis::Fixed,
            }),
            HedgeAfter::Auto => Some(match self.steps.get(no) {
                Some(step) => {
                    let recent = lock(&step.recent);
                    let own = recent.samples.iter().filter(|(_, own)| *own).count();
                    let basis = if recent.samples.len() < MIN_SAMPLES {
                        Basis::Start
                    } else if own >= MIN_SAMPLES {
                        Basis::Learned
                    } else {
                        Basis::Stored
                    };
                    Threshold {
                        after: recent.threshold,
                        basis,
                    }
                }
                None => Threshold {
                    after: auto_threshold(&[], self.request_timeout),
                    basis: Basis::Start,
                },
            }),
        }
    }

    /// How long an attempt of a task slow by nature (a digest's long answer, a long
    /// recording's transcript) may take before the next step starts: learned latencies
    /// are those of analyses and metrics, so under `auto` it is half the request
    /// timeout (a stalled step still costs less than the timeout).
    pub fn slow_threshold(&self) -> Option<Threshold> {
        match self.setting {
            HedgeAfter::Off => None,
            HedgeAfter::After(after) => Some(Threshold {
                after,
                basis: Basis::Fixed,
            }),
            HedgeAfter::Auto => Some(Threshold {
                after: self.request_timeout / 2,
                basis: Basis::Slow,
            }),
        }
    }

    /// A usable answer from step `no` that took `latency`, just now.
    pub fn record(&self, no: usize, latency: Duration) {
        self.learn(no, latency, Some(Instant::now()));
    }

    /// A usable answer from step `no`, just now, of a task slow by nature: the step is
    /// not stalled, but its latency teaches nothing.
    pub fn answered(&self, no: usize) {
        if let Some(step) = self.steps.get(no) {
            lock(&step.recent).last_answer = Some(Instant::now());
        }
    }

    /// A latency of step `no` stored before a restart: it teaches the threshold, but
    /// is no answer of this process.
    pub fn restore(&self, no: usize, latency: Duration) {
        self.learn(no, latency, None);
    }

    /// Resolves when step `no` is found stalled by another attempt ([`Hedging::passed`]);
    /// `None` unless the threshold is learned. Take it when the attempt starts: it is
    /// woken by every stall found after that, even before it is first polled.
    pub fn stall_signal(&self, no: usize) -> Option<Notified<'_>> {
        self.steps.get(no).map(|step| step.stalled.notified())
    }

    /// An attempt on step `no` that started at `started` passed its threshold. When
    /// the step has given no answer since then, it is stalled: every attempt waiting on
    /// it is told to hedge now. Returns whether it was.
    pub fn passed(&self, no: usize, started: Instant) -> bool {
        let Some(step) = self.steps.get(no) else {
            return false;
        };
        let silent = lock(&step.recent)
            .last_answer
            .is_none_or(|answer| answer < started);
        if silent {
            step.stalled.notify_waiters();
        }
        silent
    }

    /// `answered_at`: when the answer came, for an answer of this process.
    fn learn(&self, no: usize, latency: Duration, answered_at: Option<Instant>) {
        let Some(step) = self.steps.get(no) else {
            return;
        };
        let mut recent = lock(&step.recent);
        if answered_at.is_some() {
            recent.last_answer = answered_at;
        }
        if recent.samples.len() == WINDOW {
            recent.samples.pop_front();
        }
        recent.samples.push_back((latency, answered_at.is_some()));
        let samples: Vec<Duration> = recent.samples.iter().map(|(latency, _)| *latency).collect();
        recent.threshold = threshold_of(samples, self.request_timeout);
    }
}

fn lock(recent: &Mutex<Recent>) -> MutexGuard<'_, Recent> {
    // A panic elsewhere cannot leave it inconsistent: the threshold is rewritten whole.
    recent
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn after(hedging: &Hedging, no: usize) -> Option<Duration> {
        hedging.threshold(no).map(|t| t.after)
    }

    /// Issue 31 item 7: in a burst the process's own busy cores made healthy answers
    /// look slow, and 17 % of tasks hedged. The hedge timer's own lateness is the lag.
    #[test]
    fn a_busy_process_waits_out_its_own_lag_before_it_hedges() {
        let after = ms(300);
        // (elapsed when the timer fired, how late it fired, what happens)
        let rows = [
            // An idle process: the timer on time, hedge now; a millisecond late, one more
            // millisecond's look, then hedge.
            (ms(300), ms(0), None),
            (ms(301), ms(1), Some(ms(1))),
            (ms(303), ms(1), None),
            // Busy: the timer woke 120 ms late, so an answer that reached the socket
            // since 180 ms may not be read yet. Wait until the silence covers 300 ms.
            (ms(420), ms(120), Some(ms(120))),
            // The second look, the process still 120 ms behind: 540 - 240 = 300, hedge.
            (ms(540), ms(120), None),
            // It fell further behind meanwhile: wait again.
            (ms(540), ms(200), Some(ms(160))),
            // The runtime was blocked for a second: nothing is known of the step's
            // silence yet, so the whole threshold again (the answer is likely in).
            (ms(1300), ms(1000), Some(ms(300))),
        ];
        for (elapsed, lag, expected) in rows {
            assert_eq!(
                wait_more(after, elapsed, lag),
                expected,
                "{elapsed:?} late by {lag:?}"
            );
        }
    }

    #[test]
    fn every_threshold_says_where_it_came_from() {
        let basis = |hedging: &Hedging| hedging.threshold(0).map(|t| t.basis);
        let auto = Hedging::new(HedgeAfter::Auto, ms(30_000), 1);
        assert_eq!(basis(&auto), Some(Basis::Start));
        for _ in 0..MIN_SAMPLES {
            auto.restore(0, ms(400));
        }
        assert_eq!(basis(&auto), Some(Basis::Stored));
        for _ in 0..MIN_SAMPLES - 1 {
            auto.record(0, ms(400));
        }
        assert_eq!(basis(&auto), Some(Basis::Stored), "mostly the last run's");
        auto.record(0, ms(400));
        assert_eq!(basis(&auto), Some(Basis::Learned));
        let fresh = Hedging::new(HedgeAfter::Auto, ms(30_000), 1);
        for _ in 0..MIN_SAMPLES {
            fresh.record(0, ms(400));
        }
        assert_eq!(basis(&fresh), Some(Basis::Learned));
        let fixed = Hedging::new(HedgeAfter::After(ms(8000)), ms(30_000), 1);
        assert_eq!(basis(&fixed), Some(Basis::Fixed));
        assert_eq!(fixed.slow_threshold().map(|t| t.basis), Some(Basis::Fixed));
    }

    #[test]
    fn the_threshold_table() {
        let timeout = ms(30_000);
        let twenty: Vec<Duration> = (1..=20).map(|i| ms(i * 100)).collect();
        // (recent latencies, request timeout, threshold)
        let rows: Vec<(Vec<Duration>, Duration, Duration)> = vec![
            // Nothing known yet: the start, capped at half the request timeout.
            (vec![], timeout, START),
            (vec![ms(200); MIN_SAMPLES - 1], timeout, START),
            (vec![], ms(2000), ms(1000)),
            // Known: p95 × 1.5.
            (vec![ms(200); MIN_SAMPLES], timeout, ms(300)),
            // Nearest rank over 20: the 19th, 1.9 s.
            (twenty.clone(), timeout, ms(2850)),
            // One slow answer in forty does not move it.
            (
                [vec![ms(100); 39], vec![ms(9000)]].concat(),
                timeout,
                ms(150),
            ),
            // Bounded: below by the floor, above by half the request timeout.
            (vec![ms(2); 10], timeout, FLOOR),
            (vec![ms(25_000); 10], timeout, ms(15_000)),
            (twenty, ms(4000), ms(2000)),
        ];
        for (recent, timeout, expected) in rows {
            assert_eq!(
                auto_threshold(&recent, timeout),
                expected,
                "{recent:?} / {timeout:?}"
            );
        }
    }

    #[test]
    fn a_step_learns_from_its_own_answers_only() {
        let hedging = Hedging::new(HedgeAfter::Auto, ms(30_000), 2);
        assert_eq!(after(&hedging, 0), Some(START));
        for _ in 0..MIN_SAMPLES {
            hedging.record(0, ms(400));
        }
        assert_eq!(after(&hedging, 0), Some(ms(600)));
        assert_eq!(
            after(&hedging, 1),
            Some(START),
            "the other step knows nothing"
        );
        // The window forgets: a step that got fast is judged by its recent answers.
        for _ in 0..WINDOW {
            hedging.record(0, ms(200));
        }
        assert_eq!(after(&hedging, 0), Some(ms(300)));
    }

    #[tokio::test]
    async fn a_step_silent_since_an_attempt_started_is_stalled_for_every_attempt() {
        use std::future::Future;
        use std::pin::pin;
        use std::task::{Context, Waker};

        let hedging = Hedging::new(HedgeAfter::Auto, ms(30_000), 2);
        let woken = |signal: &mut std::pin::Pin<&mut Notified<'_>>| {
            let mut cx = Context::from_waker(Waker::noop());
            signal.as_mut().poll(&mut cx).is_ready()
        };
        // (answers of this process before the attempt started, stored ones, stalled?)
        let rows = [
            (false, false, true),
            (false, true, true),
            (true, false, false),
        ];
        for (answered, restored, stalled) in rows {
            let hedging = Hedging::new(HedgeAfter::Auto, ms(30_000), 1);
            if restored {
                hedging.restore(0, ms(200));
            }
            if answered {
                hedging.record(0, ms(200));
            }
            let started = Instant::now();
            if answered {
                hedging.record(0, ms(200));
            }
            // Taken when a waiting attempt started, never polled before the finding.
            let mut signal = pin!(hedging.stall_signal(0).expect("auto"));
            assert_eq!(hedging.passed(0, started), stalled);
            assert_eq!(woken(&mut signal), stalled, "{answered} {restored}");
        }
        // Another step, and a fixed threshold, have no signal to give.
        let mut other = pin!(hedging.stall_signal(1).expect("auto"));
        assert!(hedging.passed(0, Instant::now()));
        assert!(!woken(&mut other));
        let fixed = Hedging::new(HedgeAfter::After(ms(8000)), ms(30_000), 1);
        assert!(fixed.stall_signal(0).is_none());
        assert!(!fixed.passed(0, Instant::now()));
    }

    #[test]
    fn fixed_and_off_do_not_learn() {
        let fixed = Hedging::new(HedgeAfter::After(ms(8000)), ms(30_000), 1);
        fixed.record(0, ms(10));
        assert_eq!(fixed.threshold(0).map(|t| t.after), Some(ms(8000)));
        assert!(!fixed.is_auto());
        let off = Hedging::new(HedgeAfter::Off, ms(30_000), 1);
        assert_eq!(off.threshold(0), None);
        assert_eq!(off.slow_threshold(), None);
        assert_eq!(fixed.slow_threshold().map(|t| t.after), Some(ms(8000)));
        let auto = Hedging::new(HedgeAfter::Auto, ms(30_000), 1);
        auto.record(0, ms(10));
        assert_eq!(
            auto.slow_threshold(),
            Some(Threshold {
                after: ms(15_000),
                basis: Basis::Slow
            }),
            "not learned"
        );
    }
}
