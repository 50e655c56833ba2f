//! One analysis round: the analysis and the metrics asked for at once, the outcome
//! stored ([`Outcome`]) and returned. Nothing here messages anyone; what follows from an
//! outcome (the backlog made due, the worker woken) is decided here, the reply in
//! `reply`.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::analysis::{self, UserContext};
use crate::config::WorkerSettings;
use crate::domain::Metrics;
use crate::domain::{ModelRef, Outcome, Wait};
use crate::frontend::truncate_chars;
use crate::llm::{Attempt, AttemptSink, CascadeError, Llm, Task};
use crate::store::{BeforeAnalysis, DayLog, Store, StoreError};

use super::*;

/// The logs an outage left on the retry schedule ([`Journal::resume_backlog`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Backlog {
    /// Some log may be waiting after a failure: set by each one, cleared by a resume.
    /// Set at start-up too: logs of an earlier process may be waiting.
    waits: bool,
    /// When the last resume ran.
    at: Option<tokio::time::Instant>,
    /// Resumes in a row that found logs waiting.
    in_a_row: u32,
}

impl Default for Backlog {
    fn default() -> Self {
        Self {
            waits: true,
            at: None,
            in_a_row: 0,
        }
    }
}

impl Backlog {
    /// Whether another resume may run at `now`: the first at once, then each after the
    /// retry delay of as many attempts as resumes before it found logs
    /// ([`Journal::retry_delay`]).
    fn allows(&self, now: tokio::time::Instant, retry_delay: impl Fn(i64) -> Duration) -> bool {
        match self.at {
            Some(at) if self.in_a_row > 0 => {
                now.duration_since(at) >= retry_delay(i64::from(self.in_a_row) - 1)
            }
            _ => true,
        }
    }
}

/// Passes attempts on to the store and notes each model that refused on content policy.
struct RefusalWatch<S> {
    inner: S,
    refused: Mutex<Vec<ModelRef>>,
}

impl<S: AttemptSink> RefusalWatch<S> {
    fn new(inner: S) -> Self {
        Self {
            inner,
            refused: Mutex::new(Vec::new()),
        }
    }

    fn refused(&self) -> Vec<ModelRef> {
        self.refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl<S: AttemptSink> AttemptSink for RefusalWatch<S> {
    fn record(&self, attempt: Attempt) {
        if attempt.outcome == crate::llm::Outcome::Blocked {
            let model = ModelRef::new(attempt.provider.clone(), attempt.model.clone());
            let mut refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
            if !refused.contains(&model) {
                refused.push(model);
            }
        }
        self.inner.record(attempt);
    }
}

/// The metrics of one analysis round.
enum RoundMetrics {
    /// Kept from an earlier round of the same text: not asked for again.
    Kept(Metrics),
    /// Asked for in this round and answered.
    Answered(Metrics),
    Failed(CascadeError),
}

impl RoundMetrics {
    /// The metrics to store with an answer: defaults when none came.
    fn or_defaults(self, log: &DayLog) -> Metrics {
        match self {
            Self::Kept(metrics) | Self::Answered(metrics) => metrics,
            Self::Failed(error) => {
                tracing::warn!(log_id = log.id.get(), %error, "metrics cascade failed; defaults stored");
                Metrics::defaults()
            }
        }
    }

    /// The metrics this round got, if it asked for them.
    fn answered(self) -> Option<Metrics> {
        match self {
            Self::Answered(metrics) => Some(metrics),
            Self::Kept(_) | Self::Failed(_) => None,
        }
    }
}

impl Journal {
    /// One analysis round: analysis and metrics concurrently, the outcome stored and
    /// returned; `None` when the log was edited meanwhile (nothing stored). It never
    /// messages anyone: the answer is [`Journal::answer_outcome`]'s.
    pub(super) async fn analyse(
        &self,
        log: &DayLog,
        author: &Author,
        known: Known,
        before: &BeforeAnalysis,
        under: Under<'_>,
    ) -> Result<Option<Outcome>, StoreError> {
        let text = truncate_chars(&log.text, self.settings.telegram.max_text_chars());
        let context = self.context(log, author, known, before).await?;
        // Models that refused this text before are not asked again (docs/behaviour.md, The cascade); new
        // refusals are remembered before the outcome is stored, so the worker's next
        // round already leaves them out.
        let refused = if known.new {
            Vec::new()
        } else {
            self.store.refusals(log.id).await?
        };
        let sink = RefusalWatch::new(self.store.call_sink(Some(log.id)));
        let (analysis, metrics) = self.ask(log, &context, text, &sink, &refused).await;
        keep_spent_budgets(&self.llm, &self.store).await;
        let newly_refused = sink.refused();
        if !newly_refused.is_empty() {
            self.store
                .record_refusals(log.id, &log.text, &newly_refused)
                .await?;
        }
        let outcome = match analysis {
            Ok(completion) => {
                tracing::info!(log_id = log.id.get(), provider = %completion.provider, model = %completion.model, "day log analysed");
                Outcome::Analysed {
                    analysis: completion.text.trim().to_owned(),
                    metrics: metrics.or_defaults(log),
                }
            }
            Err(error) if error.is_blocked() => {
                tracing::info!(
                    log_id = log.id.get(),
                    "analysis refused by the content filter"
                );
                Outcome::Blocked {
                    metrics: Some(metrics.or_defaults(log)),
                }
            }
            Err(error) => {
                let refused: Vec<ModelRef> = refused.into_iter().chain(newly_refused).collect();
                self.waiting(log, &error, &refused, metrics.answered())
            }
        };
        let fence = under.fence();
        if !self
            .store
            .record_under(log.id, &log.text, &outcome, fence.as_ref())
            .await?
        {
            tracing::info!(
                log_id = log.id.get(),
                "log edited during its analysis (the new text is analysed next), or its chat taken over by another instance; not answered here"
            );
            return Ok(None);
        }
        self.after_recording(log, &outcome).await;
        Ok(Some(outcome))
    }

    /// Asks for the analysis and the metrics of `text` at once. Metrics an earlier
    /// round of this very text got (its analysis failed) are not asked for again: they
    /// cost a request, and in an outage they might be lost to defaults on the round
    /// that finally has an analysis.
    async fn ask<S: AttemptSink>(
        &self,
        log: &DayLog,
        context: &UserContext,
        text: &str,
        sink: &S,
        refused: &[ModelRef],
    ) -> (Result<crate::llm::Completion, CascadeError>, RoundMetrics) {
        let analysis_request = analysis::analysis_request(context, text);
        let metrics_request = analysis::metrics_request(text);
        let earlier = log.metrics.clone().filter(|m| !m.is_all_defaulted());
        let metrics_round = async {
            if let Some(stored) = earlier {
                return RoundMetrics::Kept(stored);
            }
            match self
                .llm
                .run_parsed(
                    Task::Metrics,
                    &metrics_request,
                    sink,
                    refused,
                    analysis::metrics::from_answer,
                )
                .await
            {
                Ok(parsed) => RoundMetrics::Answered(parsed.value),
                Err(error) => RoundMetrics::Failed(error),
            }
        };
        tokio::join!(
            self.llm
                .run_excluding(Task::Analysis, &analysis_request, sink, refused),
            metrics_round,
        )
    }

    /// The wait after an analysis that failed for `error`: until a budget returns when
    /// budgets are the whole story, else on the failure schedule. Metrics this round
    /// `answered` are kept with the log.
    fn waiting(
        &self,
        log: &DayLog,
        error: &CascadeError,
        refused: &[ModelRef],
        answered: Option<Metrics>,
    ) -> Outcome {
        // A step that failed for another reason (5xx, a stall) puts the log on the
        // failure schedule.
        let only_budgets = error
            .errors()
            .iter()
            .all(|e| matches!(e.error, crate::llm::LlmError::RateLimited { .. }));
        let budget_wait = self
            .llm
            .budget_wait_excluding(Task::Analysis, refused)
            .filter(|_| only_budgets);
        let (wait, retry_in) = match budget_wait {
            Some(back_in) => (Wait::Budget, back_in),
            None => {
                let wait = match error {
                    CascadeError::NoUsableProvider => Wait::NoProvider,
                    error if error.every_key_refused() => Wait::KeysRefused,
                    _ => Wait::Provider,
                };
                (wait, self.retry_delay(log.attempts))
            }
        };
        if wait != Wait::Budget {
            tracing::warn!(log_id = log.id.get(), %error, retry_in_s = retry_in.as_secs(), "analysis cascade failed; log stays pending");
        }
        Outcome::Waiting {
            wait,
            retry_in,
            metrics: answered.filter(|m| !m.is_all_defaulted()),
        }
    }

    /// What follows from an outcome once it is stored: a success makes the backlog
    /// due; a budget wait wakes the worker when it ends; a failure marks a backlog.
    async fn after_recording(&self, log: &DayLog, outcome: &Outcome) {
        match outcome {
            Outcome::Analysed { .. } => {
                // The store takes writes again: logs left alone after a failed write
                // are due as soon as the backlog is.
                self.unrecorded().failed.clear();
                self.resume_backlog().await;
            }
            Outcome::Waiting {
                wait: Wait::Budget,
                retry_in,
                ..
            } => {
                // Stored as due no later than this (the store rounds down): the
                // worker is woken then, not at its next poll.
                self.llm.wake_at(tokio::time::Instant::now() + *retry_in);
                tracing::info!(
                    log_id = log.id.get(),
                    back_in_s = retry_in.as_secs(),
                    "every budget is spent; log parked until one returns"
                );
            }
            Outcome::Waiting { .. } => self.backlog().waits = true,
            Outcome::Blocked { .. } | Outcome::Failed(_) => {}
        }
    }

    /// An analysis has just succeeded. When logs may be waiting out their retry schedule
    /// after a failure (one since the last time, or a start-up), the outage that put
    /// them there is over for at least one step: they are made due now and the worker
    /// is woken, so the backlog is answered, oldest first, within moments of the first
    /// answer, not each at its own next try (up to `worker.retry_max_ms` away). Logs
    /// waiting for a budget, a transcription or the hourly limit keep their time.
    ///
    /// A provider that answers one request in twenty would otherwise have the whole
    /// backlog tried after each of its answers, so the resumes that keep finding logs
    /// are spaced like one log's retries: `worker.retry_min_ms`, doubling, up to
    /// `worker.retry_max_ms`. One that finds none (the backlog is gone) starts over.
    async fn resume_backlog(&self) {
        let now = tokio::time::Instant::now();
        {
            let mut backlog = self.backlog();
            if !backlog.waits || !backlog.allows(now, |n| self.retry_delay(n)) {
                return;
            }
            // Counted now, not after the update: a success that comes while it runs
            // sees this resume and waits its spacing. And cleared now: a failure marks
            // its log before it sets `waits`, so one this clears is made due below.
            *backlog = Backlog {
                waits: false,
                at: Some(now),
                in_a_row: backlog.in_a_row.saturating_add(1),
            };
        }
        match self.store.retry_pending_now().await {
            Ok(0) => {
                // Nothing was waiting: the backlog is gone, the next outage starts over
                // (unless another resume has been counted since).
                let mut backlog = self.backlog();
                if backlog.at == Some(now) {
                    backlog.at = None;
                    backlog.in_a_row = 0;
                }
            }
            Ok(due) => {
                tracing::info!(
                    logs = due,
                    "an analysis succeeded again; the logs waiting to retry are due now"
                );
                self.llm.wake_at(now);
            }
            Err(error) => {
                self.backlog().waits = true;
                tracing::warn!(%error, "could not make the waiting logs due; they keep their schedule");
            }
        }
    }

    fn backlog(&self) -> std::sync::MutexGuard<'_, Backlog> {
        self.backlog.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The background retry interval after `attempts` failed rounds ([`retry_delay`]).
    pub fn retry_delay(&self, attempts: i64) -> Duration {
        retry_delay(&self.settings.worker, attempts)
    }

    /// What the analysis of `log` and its answer read about the author, in one
    /// statement ([`Store::before_analysis`]): the hourly count when `count_use`, the
    /// week of metrics up to the entry's own day (an entry answered days late, after an
    /// outage, is compared with the days before it, not with days written after it),
    /// the last three summaries and the days with an entry.
    pub(super) async fn before_analysis(
        &self,
        log: &DayLog,
        author: &Author,
        count_use: bool,
    ) -> Result<BeforeAnalysis, StoreError> {
        let day = log
            .local_day
            .unwrap_or_else(|| self.local_day(&author.zone, self.now()));
        let week_start = day.checked_sub(jiff::Span::new().days(6)).unwrap_or(day);
        let mut before = self
            .store
            .before_analysis(log.user_id, log.id, week_start, 3, count_use)
            .await?;
        before.days.retain(|metrics| metrics.day <= day);
        Ok(before)
    }

    async fn context(
        &self,
        log: &DayLog,
        author: &Author,
        known: Known,
        before: &BeforeAnalysis,
    ) -> Result<UserContext, StoreError> {
        let spoken = match known.spoken {
            Some(spoken) => spoken,
            None => self.store.voice_note(log.id).await?.is_some(),
        };
        let mut summaries = before.summaries.clone();
        summaries.reverse();
        Ok(UserContext {
            language: author.language,
            recent_days: before.days.clone(),
            recent_summaries: summaries,
            spoken,
        })
    }

    pub(super) fn was_truncated(&self, log: &DayLog) -> bool {
        log.text.chars().count() > self.settings.telegram.max_text_chars()
    }
}

/// The background retry interval after `attempts` failed rounds: doubling from
/// `worker.retry_min_ms`, capped at `worker.retry_max_ms` (a log's, and a digest's).
pub fn retry_delay(worker: &WorkerSettings, attempts: i64) -> Duration {
    let factor = 2u64.saturating_pow(u32::try_from(attempts.max(0)).unwrap_or(u32::MAX).min(40));
    let ms = worker
        .retry_min()
        .as_millis()
        .saturating_mul(u128::from(factor))
        .min(worker.retry_max().as_millis());
    Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

/// Stores the daily budgets that became spent since the last call, whichever task spent
/// them — an analysis, metrics, a digest, a transcription — so that a restart does not
/// spend a dead daily quota again. Called after every cascade run that may have met one.
pub(crate) async fn keep_spent_budgets(llm: &Llm, store: &Store) {
    let spent = llm.take_new_daily_budgets();
    if !spent.is_empty()
        && let Err(error) = store.save_spent_budgets(&spent).await
    {
        // Only a restart would pay for it: worth a warning, not the entry.
        tracing::warn!(%error, "could not store a spent daily budget");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resumes_that_keep_finding_logs_are_spaced_like_one_logs_retries() {
        let start = tokio::time::Instant::now();
        let delay = |attempts: i64| Duration::from_secs(30 << attempts.min(7));
        let after = |secs| start + Duration::from_secs(secs);
        assert!(Backlog::default().allows(start, delay), "the first at once");
        let once = Backlog {
            at: Some(start),
            in_a_row: 1,
            ..Backlog::default()
        };
        assert!(!once.allows(after(29), delay));
        assert!(once.allows(after(30), delay));
        let thrice = Backlog {
            at: Some(start),
            in_a_row: 3,
            ..Backlog::default()
        };
        assert!(!thrice.allows(after(119), delay), "30 s, doubled twice");
        assert!(thrice.allows(after(120), delay));
    }
}
