//! One configured provider (its wire format, base URL, keys and concurrency limit) and
//! the transport every wire format shares: send, bound by `request_timeout_ms`, read the
//! body, redact the key from it, then hand it to the wire format to parse or classify.
//!
//! The wire format is chosen here, once, when the provider is built ([`wire_format`]);
//! nothing else in the layer looks at a provider's kind.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reqwest::header::HeaderMap;
use reqwest::{Client, RequestBuilder, StatusCode};
use tokio::sync::Semaphore;

use crate::config::{ApiKey, ProviderKind, ProviderSettings};
use crate::llm::anthropic::Anthropic;
use crate::llm::budget_hint::{self, Hint};
use crate::llm::error::LlmError;
use crate::llm::gemini::Gemini;
use crate::llm::openai::OpenAi;
use crate::llm::task::Audio;
use crate::llm::wire::{Call, WireFormat};

/// The one place a provider kind becomes behaviour: a new wire format is a file with a
/// [`WireFormat`] implementation and one line here.
fn wire_format(kind: ProviderKind) -> Box<dyn WireFormat> {
    match kind {
        ProviderKind::Openai => Box::new(OpenAi),
        ProviderKind::Gemini => Box::new(Gemini),
        ProviderKind::Anthropic => Box::new(Anthropic),
    }
}

/// A configured provider. Its keys are [`ApiKey`]s, so `Debug` never shows them.
#[derive(Debug)]
pub(crate) struct Provider {
    wire: Box<dyn WireFormat>,
    /// Base URL without a trailing slash, so paths can be appended.
    pub base_url: String,
    pub keys: Vec<ApiKey>,
    pub require_key: bool,
    pub key_env: String,
    /// The optional cap on requests in flight to this provider across all tasks
    /// (`max_concurrency`); `None` when it is 0, the default.
    pub permits: Option<Arc<Semaphore>>,
}

impl Provider {
    pub fn new(name: &str, settings: &ProviderSettings, keys: &[ApiKey]) -> Self {
        Self {
            wire: wire_format(settings.kind()),
            base_url: settings
                .base_url()
                .as_str()
                .trim_end_matches('/')
                .to_owned(),
            keys: keys.to_vec(),
            require_key: settings.require_key(),
            key_env: settings.key_env(name),
            permits: (settings.max_concurrency() > 0)
                .then(|| Arc::new(Semaphore::new(settings.max_concurrency()))),
        }
    }

    /// Whether the provider can be called at all.
    pub fn usable(&self) -> bool {
        !self.keys.is_empty() || !self.require_key
    }

    /// The key slots a step walks through, in order: each key by index, or one keyless
    /// slot (`None`) for a provider that needs no key and has none (a local Ollama).
    pub fn key_slots(&self) -> Vec<Option<usize>> {
        if self.keys.is_empty() {
            if self.require_key { vec![] } else { vec![None] }
        } else {
            (0..self.keys.len()).map(Some).collect()
        }
    }

    pub fn key(&self, slot: Option<usize>) -> Option<&ApiKey> {
        slot.and_then(|i| self.keys.get(i))
    }

    /// One HTTP attempt: the answer's text and status, or what went wrong, classified.
    pub async fn complete(
        &self,
        client: &Client,
        key: Option<&ApiKey>,
        call: &Call<'_>,
        timeout: Duration,
    ) -> Result<(u16, String), LlmError> {
        self.complete_hinted(client, key, call, timeout).await.0
    }

    /// [`Provider::complete`], with what the answer said about the budget it was sent
    /// on (rate-limit headers, a 429 body); an empty [`Hint`] when nothing came back.
    pub async fn complete_hinted(
        &self,
        client: &Client,
        key: Option<&ApiKey>,
        call: &Call<'_>,
        timeout: Duration,
    ) -> (Result<(u16, String), LlmError>, Hint) {
        let builder = match self.wire.request(client, &self.base_url, key, call) {
            Ok(builder) => builder,
            Err(e) => return (Err(e), Hint::default()),
        };
        self.exchange(builder, key, timeout, call.count_tokens, |status, body| {
            self.wire.parse_success(status, body, call)
        })
        .await
    }

    /// One transcription attempt (docs/behaviour.md, Voice notes): the transcript and status, or what went
    /// wrong, classified exactly as a chat attempt's, with the same budget hints.
    pub async fn transcribe_hinted(
        &self,
        client: &Client,
        key: Option<&ApiKey>,
        model: &str,
        audio: &Audio,
        timeout: Duration,
    ) -> (Result<(u16, String), LlmError>, Hint) {
        let builder =
            match self
                .wire
                .transcription_request(client, &self.base_url, key, model, audio)
            {
                Ok(builder) => builder,
                Err(e) => return (Err(e), Hint::default()),
            };
        // Transcriptions are budgeted in requests and audio seconds, not tokens.
        self.exchange(builder, key, timeout, false, |status, body| {
            self.wire.parse_transcription(status, body)
        })
        .await
    }

    /// Sends one request and reads its answer: `parse` for a 2xx body, the wire format's
    /// classification (with the key redacted from the body) otherwise; and what the
    /// answer said about the budget (the tokens it took only when `count_tokens`).
    async fn exchange(
        &self,
        builder: RequestBuilder,
        key: Option<&ApiKey>,
        timeout: Duration,
        count_tokens: bool,
        parse: impl FnOnce(StatusCode, &[u8]) -> Result<String, LlmError>,
    ) -> (Result<(u16, String), LlmError>, Hint) {
        let sent = tokio::time::timeout(timeout, send(builder, timeout))
            .await
            .map_err(|_| LlmError::Timeout(timeout))
            .and_then(|r| r);
        let (status, headers, body) = match sent {
            Ok(answer) => answer,
            Err(e) => return (Err(e), Hint::default()),
        };
        let mut hint = budget_hint::from_headers(&headers, SystemTime::now());
        if status.is_success() {
            if count_tokens {
                hint.used_tokens = self.wire.used_tokens(&body);
            }
            let result = parse(status, &body).map(|text| (status.as_u16(), text));
            (result, hint)
        } else {
            let text = redact(&String::from_utf8_lossy(&body), key);
            let hint = if status == StatusCode::TOO_MANY_REQUESTS {
                budget_hint::with_body(hint, &text)
            } else {
                hint
            };
            let retry_after = self.wire.retry_after(&headers, &text);
            (
                Err(self.wire.classify_error(status, &text, retry_after)),
                hint,
            )
        }
    }
}

async fn send(
    builder: RequestBuilder,
    timeout: Duration,
) -> Result<(StatusCode, HeaderMap, Vec<u8>), LlmError> {
    // Per request, so the client's own total timeout (teloxide's 17 s) never
    // cuts an attempt short.
    let response = builder
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| LlmError::from_reqwest(e, timeout))?;
    let status = response.status();
    // Error answers need their headers (Retry-After); a success only its budget's.
    let headers = if status.is_success() {
        response
            .headers()
            .iter()
            .filter(|(name, _)| name.as_str().starts_with("x-ratelimit-"))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect()
    } else {
        response.headers().clone()
    };
    let body = response
        .bytes()
        .await
        .map_err(|e| LlmError::from_reqwest(e, timeout))?;
    Ok((status, headers, body.to_vec()))
}

/// Providers sometimes echo what they were sent; the key never goes further than here.
fn redact(text: &str, key: Option<&ApiKey>) -> String {
    match key.map(ApiKey::expose).filter(|k| !k.is_empty()) {
        Some(k) if text.contains(k) => text.replace(k, "<redacted>"),
        _ => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_wire_format_reads_the_tokens_an_answer_took() {
        let fixture = |name: &str| {
            std::fs::read(format!(
                "{}/tests/fixtures/{name}",
                env!("CARGO_MANIFEST_DIR")
            ))
            .unwrap_or_default()
        };
        let rows = [
            (
                ProviderKind::Openai,
                fixture("openai/chat_completion.json"),
                Some(50),
            ),
            (
                ProviderKind::Gemini,
                fixture("gemini/generate_content.json"),
                Some(30),
            ),
            (
                ProviderKind::Anthropic,
                fixture("anthropic/message.json"),
                Some(45),
            ),
            // No usage, a usage that is no number, no JSON: nothing said.
            (ProviderKind::Openai, br#"{"choices":[]}"#.to_vec(), None),
            (
                ProviderKind::Openai,
                br#"{"usage":{"total_tokens":"many"}}"#.to_vec(),
                None,
            ),
            (ProviderKind::Gemini, b"<html>".to_vec(), None),
        ];
        for (kind, body, expected) in rows {
            assert_eq!(wire_format(kind).used_tokens(&body), expected, "{kind:?}");
        }
    }

    #[test]
    fn redaction_removes_an_echoed_key() {
        let key = ApiKey::new("sk-secret-123");
        assert_eq!(
            redact("invalid key sk-secret-123 given", Some(&key)),
            "invalid key <redacted> given"
        );
        assert_eq!(redact("fine", None), "fine");
    }
}
