//! The Gemini `generateContent` wire format: `POST {base_url}/models/{model}:generateContent`
//! with the key only in the `x-goog-api-key` header (never `?key=`, which would put it in
//! URLs and access logs). Content-policy blocks are detected here, from
//! `promptFeedback.blockReason` and from candidates that stopped for safety with no text.

use std::time::Duration;

use reqwest::header::HeaderMap;
use reqwest::{Client, RequestBuilder, StatusCode};
use serde::{Deserialize, Serialize};

use crate::config::ApiKey;
use crate::llm::error::{LlmError, body_message};
use crate::llm::retry_after;
use crate::llm::wire::{Call, WireFormat, body_count, header_wait, secret_header};

/// The Gemini `generateContent` wire format.
#[derive(Debug)]
pub(crate) struct Gemini;

impl WireFormat for Gemini {
    fn request(
        &self,
        client: &Client,
        base_url: &str,
        key: Option<&ApiKey>,
        call: &Call<'_>,
    ) -> Result<RequestBuilder, LlmError> {
        request(client, base_url, key, call)
    }

    fn used_tokens(&self, body: &[u8]) -> Option<u64> {
        body_count(body, &[&["usageMetadata", "totalTokenCount"]])
    }

    fn parse_success(
        &self,
        status: StatusCode,
        body: &[u8],
        _call: &Call<'_>,
    ) -> Result<String, LlmError> {
        parse_success(status, body)
    }

    /// A header wins; else the body's `RetryInfo.retryDelay`, where Gemini puts it.
    fn retry_after(&self, headers: &HeaderMap, body: &str) -> Option<Duration> {
        header_wait(headers).or_else(|| retry_info(body))
    }

    fn classify_error(
        &self,
        status: StatusCode,
        body: &str,
        retry_after: Option<Duration>,
    ) -> LlmError {
        handle_gemini_error(status, body, retry_after)
    }
}

/// `finishReason`s that mean the answer was withheld on policy grounds.
const BLOCKING_FINISH_REASONS: [&str; 6] = [
    "SAFETY",
    "PROHIBITED_CONTENT",
    "BLOCKLIST",
    "RECITATION",
    "SPII",
    "IMAGE_SAFETY",
];

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GenerateContentRequest<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    system_instruction: Option<SystemInstruction<'a>>,
    contents: [Content<'a>; 1],
    generation_config: GenerationConfig,
}

#[derive(Serialize)]
struct SystemInstruction<'a> {
    parts: [Part<'a>; 1],
}

#[derive(Serialize)]
struct Content<'a> {
    role: &'static str,
    parts: [Part<'a>; 1],
}

#[derive(Serialize)]
struct Part<'a> {
    text: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GenerationConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    max_output_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_mime_type: Option<&'static str>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct GenerateContentResponse {
    #[serde(default)]
    candidates: Vec<Candidate>,
    #[serde(default)]
    prompt_feedback: Option<PromptFeedback>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PromptFeedback {
    #[serde(default)]
    block_reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Candidate {
    #[serde(default)]
    content: Option<CandidateContent>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct CandidateContent {
    #[serde(default)]
    parts: Vec<CandidatePart>,
}

#[derive(Deserialize)]
struct CandidatePart {
    #[serde(default)]
    text: Option<String>,
    /// Thought summaries are not the answer.
    #[serde(default)]
    thought: bool,
}

fn request(
    client: &Client,
    base_url: &str,
    key: Option<&ApiKey>,
    call: &Call<'_>,
) -> Result<RequestBuilder, LlmError> {
    let system = &call.request.system;
    let body = GenerateContentRequest {
        system_instruction: (!system.is_empty()).then_some(SystemInstruction {
            parts: [Part { text: system }],
        }),
        contents: [Content {
            role: "user",
            parts: [Part {
                text: &call.request.user,
            }],
        }],
        generation_config: GenerationConfig {
            max_output_tokens: call.max_tokens,
            temperature: call.temperature,
            response_mime_type: call.request.json.then_some("application/json"),
        },
    };
    let mut builder = client
        .post(format!("{base_url}/models/{}:generateContent", call.model))
        .json(&body);
    if let Some(key) = key {
        builder = builder.header("x-goog-api-key", secret_header(key.expose())?);
    }
    Ok(builder)
}

fn parse_success(status: StatusCode, body: &[u8]) -> Result<String, LlmError> {
    let unusable = |reason: String| LlmError::unusable(status, reason);
    let foreign = |reason: String| LlmError::not_the_api(status, reason);
    let response: GenerateContentResponse = serde_json::from_slice(body)
        .map_err(|e| foreign(format!("not a generateContent answer: {e}")))?;
    let block_reason = response.prompt_feedback.and_then(|f| f.block_reason);
    let Some(candidate) = response.candidates.into_iter().next() else {
        return Err(match block_reason {
            Some(reason) => LlmError::Blocked {
                reason: format!("prompt blocked: {reason}"),
            },
            None => unusable("no candidates".to_owned()),
        });
    };
    let text: String = candidate
        .content
        .map(|c| c.parts)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| !p.thought)
        .filter_map(|p| p.text)
        .collect();
    if !text.trim().is_empty() {
        return Ok(text);
    }
    match candidate.finish_reason {
        Some(reason) if BLOCKING_FINISH_REASONS.contains(&reason.as_str()) => {
            Err(LlmError::Blocked {
                reason: format!("answer blocked: {reason}"),
            })
        }
        other => Err(unusable(format!(
            "no text (finishReason {})",
            other.as_deref().unwrap_or("none")
        ))),
    }
}

/// Google errors: `{"error": {"code", "message", "status", "details": [...]}}`. A Gemini
/// quirk: a bad key is a 400 with reason `API_KEY_INVALID`.
fn handle_gemini_error(status: StatusCode, body: &str, retry_after: Option<Duration>) -> LlmError {
    let message = body_message(body, |v| {
        let message = v.pointer("/error/message")?.as_str()?;
        Some(match v.pointer("/error/status").and_then(|s| s.as_str()) {
            Some(code) => format!("{code}: {message}"),
            None => message.to_owned(),
        })
    });
    let key_invalid = error_details(body)
        .iter()
        .any(|d| d.get("reason").and_then(|r| r.as_str()) == Some("API_KEY_INVALID"));
    if status == StatusCode::BAD_REQUEST && key_invalid {
        return LlmError::BadKey {
            status: status.as_u16(),
            message,
        };
    }
    LlmError::from_status(status.as_u16(), retry_after, message)
}

/// The `error.details` of a Google error body; empty when there are none.
fn error_details(body: &str) -> Vec<serde_json::Value> {
    let json: Option<serde_json::Value> = serde_json::from_str(body).ok();
    json.as_ref()
        .and_then(|v| v.pointer("/error/details"))
        .and_then(|d| d.as_array())
        .cloned()
        .unwrap_or_default()
}

/// A 429 from Gemini carries its wait as a `RetryInfo.retryDelay` detail ("37s") rather
/// than a header.
fn retry_info(body: &str) -> Option<Duration> {
    error_details(body).iter().find_map(|d| {
        let is_retry_info = d
            .get("@type")
            .and_then(|t| t.as_str())
            .is_some_and(|t| t.ends_with("RetryInfo"));
        is_retry_info
            .then(|| d.get("retryDelay")?.as_str().and_then(parse_proto_duration))
            .flatten()
    })
}

/// A protobuf JSON duration: `"37s"`, `"0.5s"`.
fn parse_proto_duration(raw: &str) -> Option<Duration> {
    let secs: f64 = raw.trim().strip_suffix('s')?.parse().ok()?;
    retry_after::from_secs(secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thought_parts_are_not_the_answer() {
        let body = br#"{"candidates":[{"content":{"parts":[{"text":"hmm","thought":true},{"text":"answer"}],"role":"model"},"finishReason":"STOP"}]}"#;
        assert_eq!(parse_success(StatusCode::OK, body).unwrap(), "answer");
    }

    #[test]
    fn blocks_and_unusable_answers() {
        let prompt = br#"{"promptFeedback":{"blockReason":"PROHIBITED_CONTENT"}}"#;
        assert!(matches!(
            parse_success(StatusCode::OK, prompt),
            Err(LlmError::Blocked { .. })
        ));
        let answer = br#"{"candidates":[{"finishReason":"RECITATION","index":0}]}"#;
        assert!(matches!(
            parse_success(StatusCode::OK, answer),
            Err(LlmError::Blocked { .. })
        ));
        let empty = br#"{"candidates":[{"content":{"parts":[]},"finishReason":"MAX_TOKENS"}]}"#;
        assert!(matches!(
            parse_success(StatusCode::OK, empty),
            Err(LlmError::Unusable { .. })
        ));
    }

    #[test]
    fn invalid_key_400_is_a_bad_key() {
        let body = r#"{"error":{"code":400,"message":"API key not valid. Please pass a valid API key.","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"API_KEY_INVALID","domain":"googleapis.com"}]}}"#;
        let err = handle_gemini_error(StatusCode::BAD_REQUEST, body, None);
        assert!(err.is_bad_key(), "{err:?}");
    }

    #[test]
    fn retry_info_gives_the_wait() {
        let body = r#"{"error":{"code":429,"message":"Quota exceeded","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"37s"}]}}"#;
        let wait = Gemini.retry_after(&HeaderMap::new(), body);
        assert_eq!(wait, Some(Duration::from_secs(37)));
        let err = Gemini.classify_error(StatusCode::TOO_MANY_REQUESTS, body, wait);
        assert_eq!(err.retry_after(), Some(Duration::from_secs(37)));
        assert!(err.to_string().contains("RESOURCE_EXHAUSTED"));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Whatever a 429 body's `retryDelay` says — text, huge, negative, exponents —
            /// the wait the cascade honours is never a panic and never above a day.
            #[test]
            fn any_retry_delay_is_a_bounded_wait(
                delay in ".{0,24}|-?[0-9]{1,40}(\\.[0-9]{0,6})?([eE][-+]?[0-9]{1,4})?s",
                status in prop_oneof![Just(429u16), Just(503u16)],
            ) {
                let body = serde_json::json!({"error": {"code": status, "details": [
                    {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}
                ]}})
                .to_string();
                let wait = Gemini.retry_after(&HeaderMap::new(), &body);
                prop_assert!(wait.is_none_or(|d| d <= retry_after::MAX_WAIT), "{wait:?}");
                let status = StatusCode::from_u16(status).unwrap_or(StatusCode::TOO_MANY_REQUESTS);
                let err = Gemini.classify_error(status, &body, wait);
                prop_assert_eq!(err.retry_after(), wait);
            }
        }
    }
}
