//! The Anthropic Messages wire format: `POST {base_url}/messages` with `x-api-key` and
//! `anthropic-version: 2023-06-01`. The API has no JSON mode, so a JSON request is
//! pre-filled with an assistant turn starting `{` and the brace is put back on the answer.

use std::time::Duration;

use reqwest::{Client, RequestBuilder, StatusCode};
use serde::{Deserialize, Serialize};

use crate::config::ApiKey;
use crate::llm::error::{LlmError, body_message};
use crate::llm::wire::{Call, WireFormat, body_count, secret_header};

const API_VERSION: &str = "2023-06-01";
/// The Messages API requires `max_tokens`; used when the step sets none.
const DEFAULT_MAX_TOKENS: u32 = 1024;
const JSON_PREFILL: &str = "{";

/// The Anthropic Messages wire format.
#[derive(Debug)]
pub(crate) struct Anthropic;

impl WireFormat for Anthropic {
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
        body_count(
            body,
            &[&["usage", "input_tokens"], &["usage", "output_tokens"]],
        )
    }

    fn parse_success(
        &self,
        status: StatusCode,
        body: &[u8],
        call: &Call<'_>,
    ) -> Result<String, LlmError> {
        parse_success(status, body, call.request.json)
    }

    fn classify_error(
        &self,
        status: StatusCode,
        body: &str,
        retry_after: Option<Duration>,
    ) -> LlmError {
        handle_anthropic_error(status, body, retry_after)
    }
}

#[derive(Serialize)]
struct MessagesRequest<'a> {
    model: &'a str,
    max_tokens: u32,
    #[serde(skip_serializing_if = "str::is_empty")]
    system: &'a str,
    messages: Vec<Message<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'static str,
    content: &'a str,
}

#[derive(Deserialize)]
struct MessagesResponse {
    #[serde(default)]
    content: Vec<ContentBlock>,
    #[serde(default)]
    stop_reason: Option<String>,
}

#[derive(Deserialize)]
struct ContentBlock {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

fn request(
    client: &Client,
    base_url: &str,
    key: Option<&ApiKey>,
    call: &Call<'_>,
) -> Result<RequestBuilder, LlmError> {
    let mut messages = vec![Message {
        role: "user",
        content: &call.request.user,
    }];
    if call.request.json {
        messages.push(Message {
            role: "assistant",
            content: JSON_PREFILL,
        });
    }
    let body = MessagesRequest {
        model: call.model,
        max_tokens: call.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        system: &call.request.system,
        messages,
        temperature: call.temperature,
    };
    let mut builder = client
        .post(format!("{base_url}/messages"))
        .header("anthropic-version", API_VERSION)
        .json(&body);
    if let Some(key) = key {
        builder = builder.header("x-api-key", secret_header(key.expose())?);
    }
    Ok(builder)
}

/// The answer's text. `json` says whether the request was pre-filled with `{`.
fn parse_success(status: StatusCode, body: &[u8], json: bool) -> Result<String, LlmError> {
    let unusable = |reason: String| LlmError::unusable(status, reason);
    let foreign = |reason: String| LlmError::not_the_api(status, reason);
    let response: MessagesResponse =
        serde_json::from_slice(body).map_err(|e| foreign(format!("not a Messages answer: {e}")))?;
    let text: String = response
        .content
        .into_iter()
        .filter(|b| b.kind == "text")
        .filter_map(|b| b.text)
        .collect();
    if response.stop_reason.as_deref() == Some("refusal") && text.trim().is_empty() {
        return Err(LlmError::Blocked {
            reason: "refusal".to_owned(),
        });
    }
    if text.trim().is_empty() {
        return Err(unusable(format!(
            "no text (stop_reason {})",
            response.stop_reason.as_deref().unwrap_or("none")
        )));
    }
    Ok(if json && !text.trim_start().starts_with('{') {
        format!("{JSON_PREFILL}{text}")
    } else {
        text
    })
}

/// Anthropic errors: `{"type": "error", "error": {"type": "overloaded_error", "message": …}}`.
fn handle_anthropic_error(
    status: StatusCode,
    body: &str,
    retry_after: Option<Duration>,
) -> LlmError {
    let message = body_message(body, |v| {
        let message = v.pointer("/error/message")?.as_str()?;
        Some(match v.pointer("/error/type").and_then(|t| t.as_str()) {
            Some(kind) => format!("{kind}: {message}"),
            None => message.to_owned(),
        })
    });
    LlmError::from_status(status.as_u16(), retry_after, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_blocks_are_joined_and_prefill_restored() {
        let body =
            br#"{"content":[{"type":"text","text":"\"mood\": 4}"}],"stop_reason":"end_turn"}"#;
        assert_eq!(
            parse_success(StatusCode::OK, body, true).unwrap(),
            "{\"mood\": 4}"
        );
        let plain =
            br#"{"content":[{"type":"text","text":"Hello"},{"type":"text","text":" there"}]}"#;
        assert_eq!(
            parse_success(StatusCode::OK, plain, false).unwrap(),
            "Hello there"
        );
    }

    #[test]
    fn refusal_is_a_block_and_empty_is_unusable() {
        let refusal = br#"{"content":[],"stop_reason":"refusal"}"#;
        assert!(matches!(
            parse_success(StatusCode::OK, refusal, false),
            Err(LlmError::Blocked { .. })
        ));
        let empty = br#"{"content":[],"stop_reason":"max_tokens"}"#;
        assert!(matches!(
            parse_success(StatusCode::OK, empty, false),
            Err(LlmError::Unusable { .. })
        ));
    }

    #[test]
    fn overloaded_529_is_retryable() {
        let body = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        let err = handle_anthropic_error(StatusCode::from_u16(529).unwrap(), body, None);
        assert!(err.is_retryable());
        assert!(err.to_string().contains("overloaded_error: Overloaded"));
    }
}
