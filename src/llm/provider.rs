//! One configured provider (its wire format, base URL, keys and concurrency limit) and
//! the transport every wire format shares: send, bound by `request_timeout_ms`, read the
//! body, redact the key from it, then hand it to the wire module to parse or classify.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Client, RequestBuilder, StatusCode};
use tokio::sync::Semaphore;

use crate::config::{ApiKey, ProviderKind, ProviderSettings};
use crate::llm::error::LlmError;
use crate::llm::types::ChatRequest;
use crate::llm::{anthropic, gemini, openai, retry_after};

/// What one attempt asks of a model.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call<'a> {
    pub model: &'a str,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub request: &'a ChatRequest,
}

/// A configured provider. Its keys are [`ApiKey`]s, so `Debug` never shows them.
#[derive(Debug)]
pub(crate) struct Provider {
    pub kind: ProviderKind,
    /// Base URL without a trailing slash, so paths can be appended.
    pub base_url: String,
    pub keys: Vec<ApiKey>,
    pub require_key: bool,
    pub key_env: String,
    /// Requests in flight to this provider across all tasks (`max_concurrency`).
    pub permits: Arc<Semaphore>,
}

impl Provider {
    pub fn new(name: &str, settings: &ProviderSettings, keys: &[ApiKey]) -> Self {
        Self {
            kind: settings.kind,
            base_url: settings.base_url.as_str().trim_end_matches('/').to_owned(),
            keys: keys.to_vec(),
            require_key: settings.require_key,
            key_env: settings.key_env(name),
            permits: Arc::new(Semaphore::new(settings.max_concurrency)),
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
        let builder = match self.kind {
            ProviderKind::Openai => openai::request(client, &self.base_url, key, call)?,
            ProviderKind::Gemini => gemini::request(client, &self.base_url, key, call)?,
            ProviderKind::Anthropic => anthropic::request(client, &self.base_url, key, call)?,
        };
        let (status, headers, body) = tokio::time::timeout(timeout, send(builder, timeout))
            .await
            .map_err(|_| LlmError::Timeout(timeout))??;
        if status.is_success() {
            let text = match self.kind {
                ProviderKind::Openai => openai::parse_success(status, &body),
                ProviderKind::Gemini => gemini::parse_success(status, &body),
                ProviderKind::Anthropic => {
                    anthropic::parse_success(status, &body, call.request.json)
                }
            }?;
            Ok((status.as_u16(), text))
        } else {
            let text = redact(&String::from_utf8_lossy(&body), key);
            Err(match self.kind {
                ProviderKind::Openai => openai::handle_openai_error(status, &headers, &text),
                ProviderKind::Gemini => gemini::handle_gemini_error(status, &headers, &text),
                ProviderKind::Anthropic => {
                    anthropic::handle_anthropic_error(status, &headers, &text)
                }
            })
        }
    }
}

async fn send(
    builder: RequestBuilder,
    timeout: Duration,
) -> Result<(StatusCode, HeaderMap, Vec<u8>), LlmError> {
    // Per request, so a shared client's own total timeout (17 s for the Bot API) never
    // cuts an attempt short.
    let response = builder
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| LlmError::from_reqwest(e, timeout))?;
    let status = response.status();
    // Only error answers need their headers (Retry-After); don't copy them otherwise.
    let headers = if status.is_success() {
        HeaderMap::new()
    } else {
        response.headers().clone()
    };
    let body = response
        .bytes()
        .await
        .map_err(|e| LlmError::from_reqwest(e, timeout))?;
    Ok((status, headers, body.to_vec()))
}

/// A header value carrying a key: marked sensitive so hyper and any debug output of the
/// request hide it.
pub(crate) fn secret_header(value: &str) -> Result<HeaderValue, LlmError> {
    let mut value = HeaderValue::from_str(value).map_err(|_| LlmError::MalformedKey)?;
    value.set_sensitive(true);
    Ok(value)
}

/// Providers sometimes echo what they were sent; the key never goes further than here.
fn redact(text: &str, key: Option<&ApiKey>) -> String {
    match key.map(ApiKey::expose).filter(|k| !k.is_empty()) {
        Some(k) if text.contains(k) => text.replace(k, "<redacted>"),
        _ => text.to_owned(),
    }
}

/// The wait a response asks for, from its headers.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    retry_after::parse(headers, SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

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
