//! [`WireFormat`]: what differs between provider APIs, behind one trait. A wire format
//! builds the HTTP request for one attempt, reads a 2xx body into the answer's text, and
//! turns a non-2xx answer into an [`LlmError`] together with the wait it asks for.
//!
//! One implementation per file (`openai.rs`, `gemini.rs`, `anthropic.rs`); each depends on
//! this module and on [`crate::llm::error`] only. The transport they share (timeouts,
//! reading the body, redacting the key) lives in `provider.rs`, which picks the wire
//! format once, when the provider is built.

use std::fmt;
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Client, RequestBuilder, StatusCode};

use crate::config::ApiKey;
use crate::llm::error::LlmError;
use crate::llm::retry_after;
use crate::llm::task::Audio;
use crate::llm_request::ChatRequest;

/// What one attempt asks of a model.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call<'a> {
    pub model: &'a str,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub request: &'a ChatRequest,
    /// Whether the answer's `usage` is wanted: its budget counts tokens. Otherwise the
    /// body is read for its text only.
    pub count_tokens: bool,
}

/// What a task sends: a chat request, or a recording to transcribe.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Input<'a> {
    Chat(&'a ChatRequest),
    Audio(&'a Audio),
}

/// One provider API. Implementations hold no per-request state: one value serves every
/// request of its provider, from any task.
pub(crate) trait WireFormat: fmt::Debug + Send + Sync {
    /// The request for one attempt. `base_url` has no trailing slash; `key` is `None`
    /// for a keyless provider (a local Ollama), which then gets no credential header.
    fn request(
        &self,
        client: &Client,
        base_url: &str,
        key: Option<&ApiKey>,
        call: &Call<'_>,
    ) -> Result<RequestBuilder, LlmError>;

    /// The answer's text from a 2xx body; `Unusable` or `Blocked` when there is none.
    fn parse_success(
        &self,
        status: StatusCode,
        body: &[u8],
        call: &Call<'_>,
    ) -> Result<String, LlmError>;

    /// The tokens a 2xx body says its request took (`usage`), for a tokens-per-minute
    /// budget; `None` when it does not say. Read apart from [`WireFormat::parse_success`],
    /// so that an answer whose text is unusable is counted at what it took too.
    fn used_tokens(&self, body: &[u8]) -> Option<u64>;

    /// The request for one transcription attempt (docs/behaviour.md, Voice notes). Only the `openai` wire
    /// format has one; a step of another kind answers `BadRequest`, so the cascade moves
    /// on to the next step.
    fn transcription_request(
        &self,
        _client: &Client,
        _base_url: &str,
        _key: Option<&ApiKey>,
        _model: &str,
        _audio: &Audio,
    ) -> Result<RequestBuilder, LlmError> {
        Err(LlmError::BadRequest {
            status: 0,
            message: "this provider kind has no transcription endpoint".to_owned(),
        })
    }

    /// The transcript from a 2xx transcription body; `Unusable` when there is none.
    fn parse_transcription(&self, status: StatusCode, _body: &[u8]) -> Result<String, LlmError> {
        Err(LlmError::Unusable {
            status: status.as_u16(),
            reason: "this provider kind has no transcription endpoint".to_owned(),
            foreign: false,
        })
    }

    /// How long a non-2xx answer asks us to wait. By default the `Retry-After` /
    /// `retry-after-ms` headers; a wire format that also says it in the body (Gemini's
    /// `RetryInfo`) adds that.
    fn retry_after(&self, headers: &HeaderMap, _body: &str) -> Option<Duration> {
        header_wait(headers)
    }

    /// Classifies a non-2xx answer. `body` is already key-free; `retry_after` is what
    /// [`WireFormat::retry_after`] found.
    fn classify_error(
        &self,
        status: StatusCode,
        body: &str,
        retry_after: Option<Duration>,
    ) -> LlmError;
}

/// The sum of the numbers at `paths` (each a list of object keys) in a JSON body;
/// `None` when none of them is there.
pub(crate) fn body_count(body: &[u8], paths: &[&[&str]]) -> Option<u64> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    paths
        .iter()
        .filter_map(|path| {
            path.iter()
                .try_fold(&value, |v, key| v.get(key))
                .and_then(serde_json::Value::as_u64)
        })
        .reduce(u64::saturating_add)
}

/// The wait the `Retry-After` / `retry-after-ms` headers ask for.
pub(crate) fn header_wait(headers: &HeaderMap) -> Option<Duration> {
    retry_after::parse(headers, SystemTime::now())
}

/// A header value carrying a key: marked sensitive so hyper and any debug output of the
/// request hide it.
pub(crate) fn secret_header(value: &str) -> Result<HeaderValue, LlmError> {
    let mut value = HeaderValue::from_str(value).map_err(|_| LlmError::MalformedKey)?;
    value.set_sensitive(true);
    Ok(value)
}
