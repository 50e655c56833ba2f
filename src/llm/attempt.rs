//! The record of every attempt the cascade makes (a row of `llm_calls`): its
//! [`Outcome`], the [`Attempt`] itself, and the [`AttemptSink`] it is reported to.

use std::fmt;

use crate::llm::task::Task;

/// The outcome of one attempt, as stored in `llm_calls.outcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Ok,
    Retryable,
    BadKey,
    BadRequest,
    Blocked,
    Timeout,
    SkippedCooldown,
    /// The budget of the key (or of every key of the step) is known to be spent: no
    /// request was sent.
    SkippedBudget,
    Unusable,
    /// A hedged attempt that lost the race.
    Cancelled,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Retryable => "retryable",
            Self::BadKey => "bad_key",
            Self::BadRequest => "bad_request",
            Self::Blocked => "blocked",
            Self::Timeout => "timeout",
            Self::SkippedCooldown => "skipped_cooldown",
            Self::SkippedBudget => "skipped_budget",
            Self::Unusable => "unusable",
            Self::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One recorded attempt (a row of `llm_calls`, without the log it belongs to).
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub task: Task,
    pub provider: String,
    pub model: String,
    /// Index of the key in the provider's key list; never the key.
    pub key_index: Option<usize>,
    /// 1-based attempt number on this key and step.
    pub attempt: u32,
    pub http_status: Option<u16>,
    pub outcome: Outcome,
    pub latency_ms: u64,
    /// How long the cascade waited before this attempt (backoff, Retry-After).
    pub wait_ms: u64,
    /// A short, key-free description of what went wrong.
    pub error: Option<String>,
}

/// Where the cascade reports attempts. `record` must not block: the store's sink queues.
pub trait AttemptSink: Send + Sync {
    fn record(&self, attempt: Attempt);
}

/// A sink that drops every attempt.
pub struct NullSink;

impl AttemptSink for NullSink {
    fn record(&self, _attempt: Attempt) {}
}
