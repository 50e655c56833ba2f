//! The LLM layer's errors, together: [`LlmError`] is what one attempt against one provider
//! can end in, classified once, here, exactly as the table in docs/behaviour.md, The cascade, says; [`AttemptError`] is
//! one failed attempt with where it happened; [`CascadeError`] is why a whole task got no
//! answer, with every attempt's error. What the cascade does after an attempt is decided
//! from the variant alone, in `decision.rs`.
//!
//! Error texts are short and key-free: provider bodies are cut to [`MAX_ERROR_CHARS`] and
//! any occurrence of the key that was sent is redacted before they get here.

use std::fmt;
use std::time::Duration;

use crate::llm::attempt::Outcome;

/// Longest provider error text kept (for `llm_calls.error` and logs).
pub const MAX_ERROR_CHARS: usize = 300;

/// The outcome of one failed attempt, or a problem setting the layer up.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LlmError {
    /// 429: retry this key after a backoff of at least `retry_after`.
    #[error("rate limited (HTTP 429): {message}")]
    RateLimited {
        retry_after: Option<Duration>,
        message: String,
    },
    /// 408, 5xx, 529: the provider is overloaded or broken right now; retry.
    #[error("provider unavailable (HTTP {status}): {message}")]
    Unavailable {
        status: u16,
        retry_after: Option<Duration>,
        message: String,
    },
    /// 401, 403: this key is bad; try the next one.
    #[error("the API key was refused (HTTP {status}): {message}")]
    BadKey { status: u16, message: String },
    /// 400, 404, 422 (and other 4xx): this model or request is wrong; next step.
    #[error("the provider rejected the request (HTTP {status}): {message}")]
    BadRequest { status: u16, message: String },
    /// The key cannot even be put in a header (stray characters in the environment).
    #[error("the API key contains characters not allowed in an HTTP header")]
    MalformedKey,
    /// A content-policy refusal; never retried on the same model.
    #[error("blocked by the provider's content policy: {reason}")]
    Blocked { reason: String },
    /// 2xx without usable text (no text, invalid envelope); retried once. `foreign`:
    /// the body is not the provider's envelope at all (a proxy's page, a `base_url`
    /// that names another service), as opposed to a real answer with no text in it.
    #[error("unusable answer (HTTP {status}): {reason}")]
    Unusable {
        status: u16,
        reason: String,
        foreign: bool,
    },
    /// No full answer within `request_timeout_ms`: the model is stalled for everyone.
    #[error("no answer within {}ms", .0.as_millis())]
    Timeout(Duration),
    /// The provider cannot be reached at all.
    #[error("cannot connect to the provider: {message}")]
    Connect { message: String },
    /// The connection broke mid-answer; retried like a 5xx.
    #[error("the connection failed: {message}")]
    Transport { message: String },
    /// `ping` on a provider that needs a key and has none.
    #[error("provider `{provider}` has no API key (set {key_env})")]
    MissingKey { provider: String, key_env: String },
    #[error("no provider named `{0}` is configured")]
    UnknownProvider(String),
    #[error("`{0}` has no model configured in any cascade step")]
    NoModel(String),
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

impl LlmError {
    /// A 2xx answer of the provider's own shape with nothing usable in it.
    pub fn unusable(status: reqwest::StatusCode, reason: String) -> Self {
        Self::Unusable {
            status: status.as_u16(),
            reason,
            foreign: false,
        }
    }

    /// A 2xx whose body is not the provider's envelope at all.
    pub fn not_the_api(status: reqwest::StatusCode, reason: String) -> Self {
        Self::Unusable {
            status: status.as_u16(),
            reason,
            foreign: true,
        }
    }

    /// A 2xx whose body is not the provider's API answer at all.
    pub fn is_not_the_api(&self) -> bool {
        matches!(self, Self::Unusable { foreign: true, .. })
    }

    /// Classifies a non-2xx answer. `message` is already truncated and key-free.
    pub fn from_status(status: u16, retry_after: Option<Duration>, message: String) -> Self {
        match status {
            429 => Self::RateLimited {
                retry_after,
                message,
            },
            401 | 403 => Self::BadKey { status, message },
            // 408 and every 5xx (529 is Anthropic's "overloaded") are transient. A 5xx the
            // table does not name (501, 505, …) is treated the same: the server failed,
            // not our request.
            408 | 500..=599 => Self::Unavailable {
                status,
                retry_after,
                message,
            },
            // 400, 404, 422 per the table; any other 4xx (405, 409, 413, …) is also
            // something a retry of the same request will not fix.
            _ => Self::BadRequest { status, message },
        }
    }

    /// Whether the same key and step may be tried again after a backoff.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::RateLimited { .. }
                | Self::Unavailable { .. }
                | Self::Transport { .. }
                | Self::Unusable { .. }
        )
    }

    /// A failure that says nothing lasting about this step (a 429, 5xx, stall, unusable
    /// body): a content block elsewhere in the task is then not the final word.
    pub fn is_passing(&self) -> bool {
        self.is_retryable() || self.is_stall()
    }

    /// The row this error becomes in `llm_calls.outcome`.
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::RateLimited { .. } | Self::Unavailable { .. } | Self::Transport { .. } => {
                Outcome::Retryable
            }
            Self::BadKey { .. } | Self::MalformedKey => Outcome::BadKey,
            Self::BadRequest { .. } => Outcome::BadRequest,
            Self::Blocked { .. } => Outcome::Blocked,
            Self::Unusable { .. } => Outcome::Unusable,
            Self::Timeout(_) | Self::Connect { .. } => Outcome::Timeout,
            Self::MissingKey { .. }
            | Self::UnknownProvider(_)
            | Self::NoModel(_)
            | Self::Client(_) => Outcome::BadRequest,
        }
    }

    pub fn http_status(&self) -> Option<u16> {
        match self {
            Self::RateLimited { .. } => Some(429),
            Self::Unavailable { status, .. }
            | Self::BadKey { status, .. }
            | Self::BadRequest { status, .. }
            | Self::Unusable { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The provider's requested wait, for 429 and 5xx answers that carry one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::RateLimited { retry_after, .. } | Self::Unavailable { retry_after, .. } => {
                *retry_after
            }
            _ => None,
        }
    }

    /// This key will not work for anyone: skip it and try the next one.
    pub fn is_bad_key(&self) -> bool {
        matches!(self, Self::BadKey { .. } | Self::MalformedKey)
    }

    /// The model is stalled or unreachable for every key: the whole step cools down.
    pub fn is_stall(&self) -> bool {
        matches!(self, Self::Timeout(_) | Self::Connect { .. })
    }

    /// Turns a transport failure into the right variant, without the URL.
    pub(crate) fn from_reqwest(err: reqwest::Error, timeout: Duration) -> Self {
        if err.is_timeout() {
            return Self::Timeout(timeout);
        }
        let connect = err.is_connect();
        let err = err.without_url();
        // reqwest's own text is generic ("error sending request"); the cause is below it.
        let mut message = err.to_string();
        let mut source = std::error::Error::source(&err);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        let message = truncate(&message);
        if connect {
            Self::Connect { message }
        } else {
            Self::Transport { message }
        }
    }
}

/// One failed attempt, kept whole so a caller can see every reason the cascade gave up.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptError {
    pub provider: String,
    pub model: String,
    pub key_index: Option<usize>,
    pub attempt: u32,
    pub error: LlmError,
}

impl AttemptError {
    /// Which attempt it was (`provider/model key #i attempt n`), without why it failed.
    fn which(&self) -> String {
        let key = self
            .key_index
            .map(|i| format!(" key #{i}"))
            .unwrap_or_default();
        format!(
            "{}/{}{key} attempt {}",
            self.provider, self.model, self.attempt
        )
    }
}

impl fmt::Display for AttemptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.which(), self.error)
    }
}

/// Why a task got no answer. `Display` is one sentence without keys, user text or a
/// provider's error message (which may quote the user's text back).
#[derive(Debug, thiserror::Error)]
pub enum CascadeError {
    /// A content-policy refusal and no other step answered: not worth retrying later.
    #[error("{provider}/{model} refused this entry on content-policy grounds ({reason})")]
    Blocked {
        provider: String,
        model: String,
        reason: String,
        errors: Vec<AttemptError>,
    },
    /// Every step failed (or was cooling down); retry the task later. `settled`: no
    /// step failed for a passing reason nor was left cooling or out of budget, so none
    /// will answer later on its own (what [`CascadeError::every_key_refused`] needs).
    #[error("every provider failed ({} failed attempts){}", errors.len(), last_error(errors))]
    Exhausted {
        errors: Vec<AttemptError>,
        settled: bool,
    },
    /// `deadline_ms` passed before any step answered.
    #[error("no answer within the task deadline of {deadline_ms}ms ({} failed attempts){}", errors.len(), last_error(errors))]
    DeadlineExceeded {
        deadline_ms: u64,
        errors: Vec<AttemptError>,
    },
    /// No step of this task has a provider with a key (or one that needs none).
    #[error("no provider in this cascade has an API key; set one (see `daylog doctor`)")]
    NoUsableProvider,
}

/// The last attempt without its provider's message: an error body can quote the
/// request back, the user's text included, and this sentence goes to `warn` logs (the
/// message itself stays in `llm_calls.error` and the `debug` log).
fn last_error(errors: &[AttemptError]) -> String {
    let Some(last) = errors.last() else {
        return String::new();
    };
    let status = last
        .error
        .http_status()
        .map(|status| format!(" (HTTP {status})"))
        .unwrap_or_default();
    format!(
        "; last: {}: {}{status}",
        last.which(),
        last.error.outcome().as_str()
    )
}

impl CascadeError {
    /// A content-policy block: the entry should be marked blocked, not retried.
    pub fn is_blocked(&self) -> bool {
        matches!(self, Self::Blocked { .. })
    }

    /// Every attempt was refused as a request (400, 413, 415, 422: a format or a
    /// size the provider will not take), none failed for a passing reason. Kept
    /// pending all the same, as a wrong model name answers so too; only said so.
    pub fn every_attempt_refused(&self) -> bool {
        let errors = self.errors();
        !errors.is_empty()
            && errors.iter().all(|attempt| {
                matches!(
                    attempt.error,
                    LlmError::BadRequest {
                        status: 400 | 413 | 415 | 422,
                        ..
                    }
                )
            })
    }

    /// Every step was asked and refused its keys (401, 403, a key that cannot be sent),
    /// and no other step is left that may answer later (one out of budget, cooling,
    /// failing for a passing reason, or cut off by the deadline): no answer comes until
    /// the operator fixes a key. Kept pending all the same; only said so.
    pub fn every_key_refused(&self) -> bool {
        match self {
            Self::Exhausted {
                errors,
                settled: true,
            } => !errors.is_empty() && errors.iter().all(|attempt| attempt.error.is_bad_key()),
            _ => false,
        }
    }

    /// Every failed attempt, in the order they ended.
    pub fn errors(&self) -> &[AttemptError] {
        match self {
            Self::Blocked { errors, .. }
            | Self::Exhausted { errors, .. }
            | Self::DeadlineExceeded { errors, .. } => errors,
            Self::NoUsableProvider => &[],
        }
    }
}

/// Cuts `text` to [`MAX_ERROR_CHARS`] characters on a character boundary.
pub fn truncate(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(MAX_ERROR_CHARS) {
        None => text.to_owned(),
        Some((cut, _)) => format!("{}…", &text[..cut]),
    }
}

/// The text kept from a provider's error body: its own message when the JSON has one,
/// else the raw body; truncated either way.
pub(crate) fn body_message(
    body: &str,
    extract: impl Fn(&serde_json::Value) -> Option<String>,
) -> String {
    let from_json = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| extract(&v))
        .filter(|m| !m.trim().is_empty());
    truncate(from_json.as_deref().unwrap_or(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cascade_error_does_not_repeat_what_the_provider_said() {
        let echo = "validation failed: input 'I argued with Anna about money'";
        let error = CascadeError::Exhausted {
            settled: true,
            errors: vec![AttemptError {
                provider: "mistral".into(),
                model: "mistral-small-latest".into(),
                key_index: Some(1),
                attempt: 3,
                error: LlmError::from_status(422, None, echo.into()),
            }],
        };
        let said = error.to_string();
        assert!(!said.contains("Anna"), "{said}");
        assert!(
            said.ends_with(
                "last: mistral/mistral-small-latest key #1 attempt 3: bad_request (HTTP 422)"
            ),
            "{said}"
        );
    }

    #[test]
    fn the_spec_table() {
        let cases: [(u16, Outcome, bool); 12] = [
            (429, Outcome::Retryable, true),
            (408, Outcome::Retryable, true),
            (500, Outcome::Retryable, true),
            (502, Outcome::Retryable, true),
            (503, Outcome::Retryable, true),
            (504, Outcome::Retryable, true),
            (529, Outcome::Retryable, true),
            (401, Outcome::BadKey, false),
            (403, Outcome::BadKey, false),
            (400, Outcome::BadRequest, false),
            (404, Outcome::BadRequest, false),
            (422, Outcome::BadRequest, false),
        ];
        for (status, outcome, retryable) in cases {
            let err = LlmError::from_status(status, None, String::new());
            assert_eq!(err.outcome(), outcome, "{status}");
            assert_eq!(err.is_retryable(), retryable, "{status}");
            assert_eq!(err.http_status(), Some(status));
        }
    }

    #[test]
    fn stalls_are_not_retried_but_cool_the_step() {
        let t = LlmError::Timeout(Duration::from_secs(1));
        assert!(!t.is_retryable());
        assert!(t.is_stall());
        assert_eq!(t.outcome(), Outcome::Timeout);
        assert_eq!(t.to_string(), "no answer within 1000ms");
    }

    #[test]
    fn unusable_and_blocked() {
        let u = LlmError::Unusable {
            status: 200,
            reason: "no text".into(),
            foreign: false,
        };
        assert!(u.is_retryable());
        let b = LlmError::Blocked {
            reason: "SAFETY".into(),
        };
        assert!(!b.is_retryable());
        assert_eq!(b.outcome(), Outcome::Blocked);
    }

    #[test]
    fn truncation_respects_characters() {
        let long = "й".repeat(MAX_ERROR_CHARS + 10);
        let cut = truncate(&long);
        assert_eq!(cut.chars().count(), MAX_ERROR_CHARS + 1);
        assert!(cut.ends_with('…'));
        assert_eq!(truncate("short"), "short");
    }

    #[test]
    fn body_message_prefers_the_json_message() {
        let body = r#"{"error":{"message":"model not found"}}"#;
        let m = body_message(body, |v| {
            v.pointer("/error/message")?.as_str().map(str::to_owned)
        });
        assert_eq!(m, "model not found");
        assert_eq!(
            body_message("<html>oops</html>", |_| None),
            "<html>oops</html>"
        );
    }
}
