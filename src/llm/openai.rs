//! The OpenAI-compatible chat-completions wire format, spoken by Mistral, Groq and a local
//! Ollama: `POST {base_url}/chat/completions` with `Authorization: Bearer <key>` (no
//! header at all for a keyless provider), JSON mode through `response_format`. Speech
//! to text is one more request shape of the same format (Groq's Whisper, docs/behaviour.md, Voice notes):
//! `POST {base_url}/audio/transcriptions`, multipart with `file`, `model` and
//! `response_format=json` (no `language`: Whisper detects it), answered `{"text": …}`.

use std::time::Duration;

use reqwest::header::AUTHORIZATION;
use reqwest::multipart::{Form, Part};
use reqwest::{Body, Client, RequestBuilder, StatusCode};
use serde::{Deserialize, Serialize};

use crate::config::ApiKey;
use crate::llm::error::{LlmError, body_message};
use crate::llm::task::Audio;
use crate::llm::wire::{Call, WireFormat, body_count, secret_header};

/// The OpenAI-compatible wire format.
#[derive(Debug)]
pub(crate) struct OpenAi;

impl WireFormat for OpenAi {
    fn request(
        &self,
        client: &Client,
        base_url: &str,
        key: Option<&ApiKey>,
        call: &Call<'_>,
    ) -> Result<RequestBuilder, LlmError> {
        request(client, base_url, key, call)
    }

    fn parse_success(
        &self,
        status: StatusCode,
        body: &[u8],
        _call: &Call<'_>,
    ) -> Result<String, LlmError> {
        parse_success(status, body)
    }

    fn used_tokens(&self, body: &[u8]) -> Option<u64> {
        body_count(body, &[&["usage", "total_tokens"]])
    }

    fn transcription_request(
        &self,
        client: &Client,
        base_url: &str,
        key: Option<&ApiKey>,
        model: &str,
        audio: &Audio,
    ) -> Result<RequestBuilder, LlmError> {
        transcription_request(client, base_url, key, model, audio)
    }

    fn parse_transcription(&self, status: StatusCode, body: &[u8]) -> Result<String, LlmError> {
        parse_transcription(status, body)
    }

    fn classify_error(
        &self,
        status: StatusCode,
        body: &str,
        retry_after: Option<Duration>,
    ) -> LlmError {
        handle_openai_error(status, body, retry_after)
    }
}

#[derive(Serialize)]
struct ChatCompletionRequest<'a> {
    model: &'a str,
    messages: Vec<Message<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<ResponseFormat>,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'static str,
    content: &'a str,
}

#[derive(Serialize)]
struct ResponseFormat {
    #[serde(rename = "type")]
    kind: &'static str,
}

#[derive(Deserialize)]
struct ChatCompletionResponse {
    choices: Vec<Choice>,
}

#[derive(Deserialize)]
struct Choice {
    message: ChoiceMessage,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct ChoiceMessage {
    #[serde(default)]
    content: Option<Content>,
}

/// Mistral may answer with a list of typed chunks instead of a plain string.
#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Chunks(Vec<Chunk>),
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(rename = "type", default)]
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
    let mut messages = Vec::with_capacity(2);
    if !call.request.system.is_empty() {
        messages.push(Message {
            role: "system",
            content: &call.request.system,
        });
    }
    messages.push(Message {
        role: "user",
        content: &call.request.user,
    });
    let body = ChatCompletionRequest {
        model: call.model,
        messages,
        max_tokens: call.max_tokens,
        temperature: call.temperature,
        response_format: call.request.json.then_some(ResponseFormat {
            kind: "json_object",
        }),
    };
    with_bearer(
        client
            .post(format!("{base_url}/chat/completions"))
            .json(&body),
        key,
    )
}

#[derive(Deserialize)]
struct TranscriptionResponse {
    text: String,
}

fn with_bearer(builder: RequestBuilder, key: Option<&ApiKey>) -> Result<RequestBuilder, LlmError> {
    Ok(match key {
        Some(key) => builder.header(
            AUTHORIZATION,
            secret_header(&format!("Bearer {}", key.expose()))?,
        ),
        None => builder,
    })
}

fn transcription_request(
    client: &Client,
    base_url: &str,
    key: Option<&ApiKey>,
    model: &str,
    audio: &Audio,
) -> Result<RequestBuilder, LlmError> {
    // The bytes are shared, not copied, by every attempt's body.
    let length = u64::try_from(audio.bytes.len()).unwrap_or(u64::MAX);
    let file = Part::stream_with_length(Body::from(audio.bytes.clone()), length)
        .file_name(audio.file_name.clone())
        .mime_str(&audio.mime)
        .or_else(|_| {
            Part::stream_with_length(Body::from(audio.bytes.clone()), length)
                .file_name(audio.file_name.clone())
                .mime_str("application/octet-stream")
        })
        .map_err(|e| LlmError::Client(e.without_url().to_string()))?;
    let form = Form::new()
        .part("file", file)
        .text("model", model.to_owned())
        .text("response_format", "json");
    with_bearer(
        client
            .post(format!("{base_url}/audio/transcriptions"))
            .multipart(form),
        key,
    )
}

/// The transcript, trimmed. An empty one is an answer, not a failure: Whisper heard no
/// words (silence, noise), and asking again would hear none either.
fn parse_transcription(status: StatusCode, body: &[u8]) -> Result<String, LlmError> {
    let response: TranscriptionResponse = serde_json::from_slice(body)
        .map_err(|e| LlmError::not_the_api(status, format!("not a transcription: {e}")))?;
    Ok(response.text.trim().to_owned())
}

fn parse_success(status: StatusCode, body: &[u8]) -> Result<String, LlmError> {
    let unusable = |reason: String| LlmError::unusable(status, reason);
    let foreign = |reason: String| LlmError::not_the_api(status, reason);
    let response: ChatCompletionResponse =
        serde_json::from_slice(body).map_err(|e| foreign(format!("not a chat completion: {e}")))?;
    let choice = response
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| unusable("no choices".to_owned()))?;
    let text = match choice.message.content {
        Some(Content::Text(t)) => t,
        Some(Content::Chunks(chunks)) => chunks
            .into_iter()
            .filter(|c| c.kind == "text")
            .filter_map(|c| c.text)
            .collect(),
        None => String::new(),
    };
    if !text.trim().is_empty() {
        return Ok(text);
    }
    match choice.finish_reason.as_deref() {
        // Mistral and Azure-style moderation stop the answer with this reason.
        Some("content_filter") => Err(LlmError::Blocked {
            reason: "content_filter".to_owned(),
        }),
        other => Err(unusable(format!(
            "empty answer (finish_reason {})",
            other.unwrap_or("none")
        ))),
    }
}

/// OpenAI-style errors: `{"error": {"message": …}}`; Mistral also uses `{"message": …}`
/// and `{"detail": …}`.
fn handle_openai_error(status: StatusCode, body: &str, retry_after: Option<Duration>) -> LlmError {
    let message = body_message(body, |v| {
        v.pointer("/error/message")
            .or_else(|| v.get("message"))
            .or_else(|| v.get("detail"))
            .or_else(|| v.get("error"))
            .map(|m| match m.as_str() {
                Some(s) => s.to_owned(),
                None => m.to_string(),
            })
    });
    LlmError::from_status(status.as_u16(), retry_after, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_chunk_answers() {
        let plain = br#"{"choices":[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}"#;
        assert_eq!(parse_success(StatusCode::OK, plain).unwrap(), "hi");
        let chunks = br#"{"choices":[{"message":{"content":[{"type":"thinking","thinking":[]},{"type":"text","text":"a"},{"type":"text","text":"b"}]}}]}"#;
        assert_eq!(parse_success(StatusCode::OK, chunks).unwrap(), "ab");
    }

    #[test]
    fn empty_or_malformed_is_unusable_and_filtered_is_blocked() {
        for body in [
            &br#"{"choices":[]}"#[..],
            br#"{"choices":[{"message":{"content":null},"finish_reason":"length"}]}"#,
            b"<html>",
        ] {
            let err = parse_success(StatusCode::OK, body).unwrap_err();
            assert!(matches!(err, LlmError::Unusable { .. }), "{err:?}");
        }
        let filtered =
            br#"{"choices":[{"message":{"content":""},"finish_reason":"content_filter"}]}"#;
        assert!(matches!(
            parse_success(StatusCode::OK, filtered),
            Err(LlmError::Blocked { .. })
        ));
    }

    #[test]
    fn a_transcript_is_its_text_and_a_malformed_one_is_unusable() {
        let ok = br#"{"text":" I ran ten kilometres today. ","x_groq":{"id":"req_1"}}"#;
        assert_eq!(
            parse_transcription(StatusCode::OK, ok).unwrap(),
            "I ran ten kilometres today."
        );
        assert_eq!(
            parse_transcription(StatusCode::OK, br#"{"text":"  "}"#).unwrap(),
            "",
            "no words heard is an answer"
        );
        for body in [&br#"{"error":"x"}"#[..], br#"{"text":null}"#, b"<html>"] {
            let err = parse_transcription(StatusCode::OK, body).unwrap_err();
            assert!(matches!(err, LlmError::Unusable { .. }), "{err:?}");
        }
    }

    #[test]
    fn error_message_is_extracted() {
        let err = handle_openai_error(
            StatusCode::UNAUTHORIZED,
            r#"{"message":"Unauthorized","request_id":"x"}"#,
            None,
        );
        assert_eq!(
            err,
            LlmError::BadKey {
                status: 401,
                message: "Unauthorized".into()
            }
        );
    }
}
