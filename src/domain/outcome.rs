//! What became of a log: the one answer to "what now?" that the analysis, the
//! transcription and the give-up produce, that the store records in one call and that
//! one function turns into the user's reply (`journal::reply`).
//!
//! An outcome is either final — [`Outcome::Analysed`], [`Outcome::Blocked`],
//! [`Outcome::Failed`]: the log's answer, sent once and recorded as sent — or
//! [`Outcome::Waiting`]: the log stays pending, the worker tries again after
//! `retry_in`, and a live answer may tell the user why (a notice, not the answer).

use std::time::Duration;

use crate::domain::Metrics;

/// What one round decided about a log's text.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Analysed: the analysis, with the metrics of the same text.
    Analysed { analysis: String, metrics: Metrics },
    /// The content filter refused the analysis; the metrics may still have come.
    Blocked { metrics: Option<Metrics> },
    /// Not now: tried again after `retry_in`, for the reason `wait` gives. Metrics that
    /// came although the analysis did not are kept, so the next round asks only for it.
    Waiting {
        wait: Wait,
        retry_in: Duration,
        metrics: Option<Metrics>,
    },
    /// Given up on, never tried again.
    Failed(Failure),
}

impl Outcome {
    /// Whether this is the log's answer (sent once and recorded as sent), rather than
    /// a wait the user may be told about.
    pub fn is_final(&self) -> bool {
        !matches!(self, Self::Waiting { .. })
    }
}

/// Why a log waits for its next try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// No provider answered (an outage): the growing retry schedule, cut short when an
    /// analysis succeeds again.
    Provider,
    /// No analysis step has a provider with a key: pending until the operator adds one.
    NoProvider,
    /// Every provider asked refused its API key: the bot's key needs fixing.
    KeysRefused,
    /// Every step's budget is spent: parked until the first returns (`retry_in`).
    Budget,
    /// The voice note could not be fetched or transcribed yet. `refused`: every step
    /// refused the request itself (a format it cannot read), not a passing outage.
    Transcription { refused: bool },
    /// Telegram has not handed over the recording yet (a download that failed, or a
    /// file id it refuses for now): nothing to transcribe, no provider at fault.
    Recording,
    /// No transcription step has a key.
    NoTranscriber,
    /// Every transcription provider asked refused its API key: the bot's transcription
    /// key needs fixing.
    TranscriberKeysRefused,
}

impl Wait {
    /// What `day_logs.waiting_for` holds for it: the schedule a log is on (`provider`
    /// logs are made due when an analysis succeeds again; the others keep their time).
    pub fn column(self) -> &'static str {
        match self {
            Self::Provider | Self::NoProvider | Self::KeysRefused => "provider",
            Self::Budget => "budget",
            Self::Transcription { .. }
            | Self::Recording
            | Self::NoTranscriber
            | Self::TranscriberKeysRefused => "transcription",
        }
    }
}

/// Why a log was given up on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Still pending past `worker.max_age_hours`.
    GaveUp,
    /// The voice note's recording cannot be fetched any more.
    RecordingGone,
    /// The recording has no words in it (silence, noise): nothing to analyse.
    NoWords,
    /// Telegram kept refusing to hand over the recording ("wrong file_id or the file
    /// is temporarily unavailable") for `voice.fetch_max_tries` tries.
    RecordingRefused,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_wait_is_not_the_answer() {
        let waiting = Outcome::Waiting {
            wait: Wait::Budget,
            retry_in: Duration::from_secs(60),
            metrics: None,
        };
        assert!(!waiting.is_final());
        assert!(Outcome::Blocked { metrics: None }.is_final());
        assert!(Outcome::Failed(Failure::NoWords).is_final());
        let analysed = Outcome::Analysed {
            analysis: "ok".to_owned(),
            metrics: Metrics::defaults(),
        };
        assert!(analysed.is_final());
    }

    #[test]
    fn only_a_provider_wait_is_on_the_schedule_a_success_cuts_short() {
        let table = [
            (Wait::Provider, "provider"),
            (Wait::NoProvider, "provider"),
            (Wait::KeysRefused, "provider"),
            (Wait::Budget, "budget"),
            (Wait::Transcription { refused: true }, "transcription"),
            (Wait::Transcription { refused: false }, "transcription"),
            (Wait::Recording, "transcription"),
            (Wait::NoTranscriber, "transcription"),
            (Wait::TranscriberKeysRefused, "transcription"),
        ];
        for (wait, column) in table {
            assert_eq!(wait.column(), column, "{wait:?}");
        }
    }
}
