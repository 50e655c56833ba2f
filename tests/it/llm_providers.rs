//! Each wire format against a fake on 127.0.0.1: what is sent (path, headers, body) and
//! that keys travel only in headers — never in a URL, a log line or a `Debug` dump.

#![expect(
    clippy::expect_used,
    reason = "test helpers outside #[test] fns: a failure is a test failure"
)]

use crate::support;

use daylog::llm::{Llm, LlmError, Outcome, Task};
use serde_json::{Value, json};
use support::llm::*;
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

async fn only_request(server: &MockServer) -> Request {
    let mut received = server.received_requests().await.expect("recording on");
    assert_eq!(received.len(), 1);
    received.remove(0)
}

fn assert_key_not_in_url(req: &Request) {
    assert!(!req.url.as_str().contains(SECRET), "{}", req.url);
    assert!(
        req.url.query().is_none(),
        "no query string at all: {}",
        req.url
    );
}

#[tokio::test]
async fn openai_wire_format() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(header("authorization", format!("Bearer {SECRET}").as_str()))
        .respond_with(json_mode_reply(
            "openai/chat_completion.json",
            "A steady day. You slept less than usual; try to be in bed by 23:00 tonight.",
        ))
        .mount(&server)
        .await;
    let toml = one_step(
        "openai",
        &format!("{}/v1/", server.uri()),
        "mistral-small-2506",
    )
    .replace(
        "model = \"mistral-small-2506\"\n",
        "model = \"mistral-small-2506\"\nmax_tokens = 300\ntemperature = 0.2\n",
    );
    let llm = Llm::new(&settings(&toml, &[("P_API_KEY", SECRET)])).unwrap();

    let answer = llm
        .run(Task::Analysis, &request(true), &daylog::llm::NullSink)
        .await
        .expect("answer");
    assert_eq!(answer.text, r#"{"mood": 4}"#);
    let req = only_request(&server).await;
    assert_key_not_in_url(&req);
    let body: Value = req.body_json().unwrap();
    assert_eq!(
        body,
        json!({
            "model": "mistral-small-2506",
            "messages": [
                {"role": "system", "content": "System prompt."},
                {"role": "user", "content": "My day was fine."}
            ],
            "max_tokens": 300,
            "temperature": 0.2,
            "response_format": {"type": "json_object"}
        })
    );
}

#[tokio::test]
async fn a_keyless_local_provider_sends_no_authorization() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(json_reply(200, "openai/chat_completion.json"))
        .mount(&server)
        .await;
    let toml = one_step("openai", &format!("{}/v1", server.uri()), "llama3.2")
        .replace("[providers.p]\n", "[providers.p]\nrequire_key = false\n");
    let llm = Llm::new(&settings(&toml, &[])).unwrap();
    let sink = RecordingSink::default();

    llm.run(Task::Analysis, &request(false), &sink)
        .await
        .expect("answer");

    let req = only_request(&server).await;
    assert!(req.headers.get("authorization").is_none());
    let body: Value = req.body_json().unwrap();
    assert!(body.get("response_format").is_none());
    assert_eq!(sink.attempts()[0].key_index, None);
}

#[tokio::test]
async fn gemini_wire_format_keeps_the_key_in_a_header() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1beta/models/gemini-2.5-flash:generateContent"))
        .and(header("x-goog-api-key", SECRET))
        .respond_with(json_mode_reply(
            "gemini/generate_content.json",
            "You seem tired but content. One idea: a 20-minute walk after lunch.",
        ))
        .mount(&server)
        .await;
    let toml = one_step(
        "gemini",
        &format!("{}/v1beta", server.uri()),
        "gemini-2.5-flash",
    );
    let llm = Llm::new(&settings(&toml, &[("P_API_KEY", SECRET)])).unwrap();

    let answer = llm
        .run(Task::Analysis, &request(true), &daylog::llm::NullSink)
        .await
        .expect("answer");

    assert_eq!(answer.text, r#"{"mood": 4}"#);
    let req = only_request(&server).await;
    assert_key_not_in_url(&req);
    let body: Value = req.body_json().unwrap();
    assert_eq!(
        body,
        json!({
            "systemInstruction": {"parts": [{"text": "System prompt."}]},
            "contents": [{"role": "user", "parts": [{"text": "My day was fine."}]}],
            "generationConfig": {"responseMimeType": "application/json"}
        })
    );
}

#[tokio::test]
async fn gemini_retry_info_over_max_delay_cools_the_key() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(json_reply(429, "gemini/resource_exhausted.json"))
        .mount(&server)
        .await;
    let toml = one_step("gemini", &server.uri(), "gemini-2.5-flash");
    let llm = Llm::new(&settings(&toml, &[("P_API_KEY", SECRET)])).unwrap();
    let sink = RecordingSink::default();

    let err = llm
        .run(Task::Analysis, &request(false), &sink)
        .await
        .unwrap_err();

    assert_eq!(
        server.received_requests().await.unwrap().len(),
        1,
        "37 s > max_delay: no retry"
    );
    // The provider's message is kept with the attempt (and `llm_calls.error`), not in
    // the cascade's one sentence, which goes to warn logs.
    let last = &err.errors().last().expect("an attempt").error;
    assert!(last.to_string().contains("RESOURCE_EXHAUSTED"), "{last}");
    assert!(err.to_string().contains("(HTTP 429)"), "{err}");
}

#[tokio::test]
async fn anthropic_wire_format() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .and(header("x-api-key", SECRET))
        .and(header("anthropic-version", "2023-06-01"))
        .respond_with(json_reply(200, "anthropic/message.json"))
        .mount(&server)
        .await;
    let toml = one_step(
        "anthropic",
        &format!("{}/v1", server.uri()),
        "claude-haiku-4-5",
    );
    let llm = Llm::new(&settings(&toml, &[("P_API_KEY", SECRET)])).unwrap();

    let answer = llm
        .run(Task::Analysis, &request(false), &daylog::llm::NullSink)
        .await
        .expect("answer");

    assert!(answer.text.starts_with("Sounds like a full day"));
    let req = only_request(&server).await;
    assert_key_not_in_url(&req);
    let body: Value = req.body_json().unwrap();
    assert_eq!(
        body,
        json!({
            "model": "claude-haiku-4-5",
            "max_tokens": 1024,
            "system": "System prompt.",
            "messages": [{"role": "user", "content": "My day was fine."}]
        })
    );
}

#[tokio::test]
async fn anthropic_overloaded_529_is_retried() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(json_reply(529, "anthropic/overloaded.json"))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(json_reply(200, "anthropic/message.json"))
        .mount(&server)
        .await;
    let toml = one_step("anthropic", &server.uri(), "claude-haiku-4-5");
    let llm = Llm::new(&settings(&toml, &[("P_API_KEY", SECRET)])).unwrap();
    let sink = RecordingSink::default();

    llm.run(Task::Analysis, &request(false), &sink)
        .await
        .expect("answer");

    let outcomes: Vec<Outcome> = sink.attempts().iter().map(|a| a.outcome).collect();
    assert_eq!(outcomes, [Outcome::Retryable, Outcome::Ok]);
    assert!(
        sink.attempts()[0]
            .error
            .as_deref()
            .unwrap()
            .contains("overloaded_error")
    );
}

#[tokio::test]
async fn ping_tries_each_key_on_the_first_model() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/models/gemini-2.5-flash:generateContent"))
        .and(header("x-goog-api-key", "first"))
        .respond_with(json_reply(200, "gemini/generate_content.json"))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(header("x-goog-api-key", "second"))
        .respond_with(ResponseTemplate::new(403).set_body_string("revoked"))
        .expect(1)
        .mount(&server)
        .await;
    let toml = one_step("gemini", &server.uri(), "gemini-2.5-flash");
    let llm = Llm::new(&settings(&toml, &[("P_API_KEY", "first,second")])).unwrap();

    let pings = llm.ping("p").await;

    let keys: Vec<_> = pings.iter().map(|p| p.key.clone()).collect();
    assert_eq!(
        keys,
        [
            Some((0, "P_API_KEY, 1st of 2".to_owned())),
            Some((1, "P_API_KEY, 2nd of 2".to_owned()))
        ]
    );
    assert!(pings[0].answer.is_ok());
    assert!(matches!(
        pings[1].answer,
        Err(LlmError::BadKey { status: 403, .. })
    ));
    let unknown = llm.ping("nope").await;
    assert!(unknown.len() == 1 && unknown[0].key.is_none() && unknown[0].answer.is_err());
    let no_key = Llm::new(&settings(&toml, &[])).unwrap().ping("p").await;
    let err = no_key[0].answer.as_ref().unwrap_err();
    assert!(err.to_string().contains("P_API_KEY"), "{err}");
}

/// How one wire format names its endpoint and carries its key.
struct Wire {
    kind: &'static str,
    /// Appended to the server's address to make the provider's `base_url`.
    base: &'static str,
    endpoint: &'static str,
    model: &'static str,
    key_header: &'static str,
    key_prefix: &'static str,
    rate_limited: &'static str,
    ok: &'static str,
}

/// A 429 whose only word on the wait is a `Retry-After` header of 30 s, more than
/// `max_delay_ms` (50 ms here): that key is not asked again for 30 s — the next key
/// answers at once, and a second task skips it. If the wire format ignored the header,
/// the 429 would say nothing and the key would be asked again after a short backoff or
/// by the next task.
async fn a_retry_after_header_cools_the_key(wire: Wire) {
    let refusal = wire.rate_limited;
    a_refusal_with_retry_after_cools_the_key(wire, 429, refusal).await;
}

/// As [`a_retry_after_header_cools_the_key`], for a refusal of any `status` (a 5xx: an
/// overloaded provider that says when to come back) with the body `fixture`.
async fn a_refusal_with_retry_after_cools_the_key(wire: Wire, status: u16, fixture: &str) {
    let server = MockServer::start().await;
    let key = |k: &str| format!("{}{k}", wire.key_prefix);
    Mock::given(method("POST"))
        .and(path(wire.endpoint))
        .and(header(wire.key_header, key("k1").as_str()))
        .respond_with(json_reply(status, fixture).insert_header("retry-after", "30"))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path(wire.endpoint))
        .and(header(wire.key_header, key("k2").as_str()))
        .respond_with(json_reply(200, wire.ok))
        .mount(&server)
        .await;
    let toml = one_step(
        wire.kind,
        &format!("{}{}", server.uri(), wire.base),
        wire.model,
    );
    let llm = Llm::new(&settings(&toml, &[("P_API_KEY", "k1,k2")])).expect("llm");
    let sink = RecordingSink::default();

    llm.run(Task::Analysis, &request(false), &sink)
        .await
        .expect("first task");
    llm.run(Task::Analysis, &request(false), &sink)
        .await
        .expect("second task");

    let received = server.received_requests().await.expect("recording on");
    let asked = |k: &str| {
        received
            .iter()
            .filter(|r| {
                r.headers
                    .get(wire.key_header)
                    .is_some_and(|v| v.as_bytes() == key(k).as_bytes())
            })
            .count()
    };
    let attempts = sink.attempts();
    assert_eq!(
        (asked("k1"), asked("k2")),
        (1, 2),
        "{}: k1 is left alone for 30 s: {attempts:?}",
        wire.kind
    );
    let first_answer = attempts
        .iter()
        .find(|a| a.outcome == Outcome::Ok)
        .expect("an answer");
    assert_eq!(
        (first_answer.key_index, first_answer.wait_ms),
        (Some(1), 0),
        "{}: k2 at once, no backoff: {attempts:?}",
        wire.kind
    );
}

#[tokio::test]
async fn openai_reads_the_retry_after_header() {
    a_retry_after_header_cools_the_key(Wire {
        kind: "openai",
        base: "/v1",
        endpoint: "/v1/chat/completions",
        model: "mistral-small-2506",
        key_header: "authorization",
        key_prefix: "Bearer ",
        rate_limited: "openai/rate_limited.json",
        ok: "openai/chat_completion.json",
    })
    .await;
}

/// Gemini usually puts the wait in the body (`RetryInfo`); this 429 has none, so only
/// the header can say it.
#[tokio::test]
async fn gemini_reads_the_retry_after_header() {
    a_retry_after_header_cools_the_key(gemini_wire()).await;
}

#[tokio::test]
async fn anthropic_reads_the_retry_after_header() {
    a_retry_after_header_cools_the_key(anthropic_wire()).await;
}

fn gemini_wire() -> Wire {
    Wire {
        kind: "gemini",
        base: "/v1beta",
        endpoint: "/v1beta/models/gemini-2.5-flash:generateContent",
        model: "gemini-2.5-flash",
        key_header: "x-goog-api-key",
        key_prefix: "",
        rate_limited: "gemini/rate_limited.json",
        ok: "gemini/generate_content.json",
    }
}

fn anthropic_wire() -> Wire {
    Wire {
        kind: "anthropic",
        base: "/v1",
        endpoint: "/v1/messages",
        model: "claude-haiku-4-5",
        key_header: "x-api-key",
        key_prefix: "",
        rate_limited: "anthropic/rate_limited.json",
        ok: "anthropic/message.json",
    }
}

/// A Gemini 503 ("the model is overloaded") with `Retry-After: 30`: the budget code
/// reads that header only on a 429, so here only the wire format's own reading of it
/// can leave the key alone for the next task.
#[tokio::test]
async fn gemini_reads_the_retry_after_header_of_a_503() {
    a_refusal_with_retry_after_cools_the_key(gemini_wire(), 503, "gemini/unavailable.json").await;
}

/// Anthropic's 529 ("overloaded_error") with `Retry-After: 30`, as for Gemini's 503.
#[tokio::test]
async fn anthropic_reads_the_retry_after_header_of_a_529() {
    a_refusal_with_retry_after_cools_the_key(anthropic_wire(), 529, "anthropic/overloaded.json")
        .await;
}
