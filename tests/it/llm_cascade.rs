//! The cascade (docs/behaviour.md, "The cascade") against fake providers on 127.0.0.1 (wiremock): retries,
//! key and step fallback, Retry-After, cooldowns shared across tasks, deadlines,
//! content-policy blocks, hedging and the shipped gemini-claude example.

#![expect(
    clippy::expect_used,
    reason = "test helpers outside #[test] fns: a failure is a test failure"
)]

use crate::support;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use daylog::llm::{CascadeError, Completion, Llm, NullSink, Outcome, Task};
use support::llm::*;
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// One openai-kind provider per server, named a, b, c…; each step is (provider, model).
fn config(servers: &[&MockServer], steps: &[(&str, &str)], retry: &str) -> String {
    let mut toml = retry.to_owned();
    for (i, server) in servers.iter().enumerate() {
        let name = ["a", "b", "c", "d"][i];
        toml.push_str(&provider(name, "openai", &format!("{}/v1", server.uri())));
    }
    toml.push_str(&analysis_steps(steps));
    toml
}

const KEYS: [(&str, &str); 4] = [
    ("A_API_KEY", "key-a"),
    ("B_API_KEY", "key-b"),
    ("C_API_KEY", "key-c"),
    ("D_API_KEY", "key-d"),
];

fn llm(toml: &str) -> Llm {
    Llm::new(&settings(toml, &KEYS)).expect("llm")
}

async fn status_server(status: u16) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(status).set_body_string("{\"message\":\"nope\"}"))
        .mount(&server)
        .await;
    server
}

fn retry_with(overrides: &[(&str, &str)]) -> String {
    let mut text = FAST_RETRY.to_owned();
    for (key, value) in overrides {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{key} =")))
            .unwrap_or_else(|| panic!("no {key}"))
            .to_owned();
        text = text.replace(&line, &format!("{key} = {value}"));
    }
    text
}

#[tokio::test]
async fn two_503s_then_200_is_three_calls_and_success() {
    // Arrange
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503))
        .up_to_n_times(2)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(json_reply(200, "openai/chat_completion.json"))
        .mount(&server)
        .await;
    let llm = llm(&config(&[&server], &[("a", "m1")], FAST_RETRY));
    let sink = RecordingSink::default();

    // Act
    let answer = llm
        .run(Task::Analysis, &request(false), &sink)
        .await
        .expect("answer");

    // Assert
    assert_eq!(calls(&server).await, 3);
    assert!(answer.text.starts_with("A steady day"));
    assert_eq!(
        (answer.provider.as_str(), answer.model.as_str()),
        ("a", "m1")
    );
    let outcomes: Vec<Outcome> = sink.attempts().iter().map(|a| a.outcome).collect();
    assert_eq!(
        outcomes,
        [Outcome::Retryable, Outcome::Retryable, Outcome::Ok]
    );
    let attempts = sink.attempts();
    assert_eq!(attempts[2].attempt, 3);
    assert_eq!(attempts[0].http_status, Some(503));
    assert_eq!(attempts[2].http_status, Some(200));
    assert!(attempts[1].wait_ms >= 10, "{attempts:?}");
}

#[tokio::test]
async fn a_400_is_one_call_then_the_next_step() {
    let bad = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(json_reply(400, "openai/bad_request.json"))
        .mount(&bad)
        .await;
    let good = ok_server().await;
    let llm = llm(&config(
        &[&bad, &good],
        &[("a", "m1"), ("b", "m2")],
        FAST_RETRY,
    ));
    let sink = RecordingSink::default();

    let answer = llm
        .run(Task::Analysis, &request(false), &sink)
        .await
        .expect("answer");

    assert_eq!(calls(&bad).await, 1);
    assert_eq!(answer.model, "m2");
    let first = &sink.attempts()[0];
    assert_eq!(first.outcome, Outcome::BadRequest);
    assert!(
        first
            .error
            .as_deref()
            .unwrap_or("")
            .contains("does not exist")
    );
}

#[tokio::test]
async fn a_401_moves_to_the_next_key_without_retry() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(header("authorization", "Bearer bad-key"))
        .respond_with(json_reply(401, "openai/unauthorized.json"))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(header("authorization", "Bearer good-key"))
        .respond_with(json_reply(200, "openai/chat_completion.json"))
        .mount(&server)
        .await;
    let toml = config(&[&server], &[("a", "m1")], FAST_RETRY);
    let llm = Llm::new(&settings(&toml, &[("A_API_KEY", "bad-key,good-key")])).unwrap();
    let sink = RecordingSink::default();

    llm.run(Task::Analysis, &request(false), &sink)
        .await
        .expect("answer");

    assert_eq!(calls(&server).await, 2, "one call per key");
    let attempts = sink.attempts();
    assert_eq!(
        (attempts[0].key_index, attempts[0].outcome),
        (Some(0), Outcome::BadKey)
    );
    assert_eq!(
        (attempts[1].key_index, attempts[1].outcome),
        (Some(1), Outcome::Ok)
    );
}

#[tokio::test]
async fn a_429_or_503_moves_to_the_next_key_at_once() {
    // Arrange: of three keys, the first is rate limited and the second overloaded.
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(header("authorization", "Bearer k1"))
        .respond_with(json_reply(429, "openai/rate_limited.json"))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(header("authorization", "Bearer k2"))
        .respond_with(ResponseTemplate::new(503))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(header("authorization", "Bearer k3"))
        .respond_with(json_reply(200, "openai/chat_completion.json"))
        .mount(&server)
        .await;
    let toml = config(&[&server], &[("a", "m1")], FAST_RETRY);
    let llm = Llm::new(&settings(&toml, &[("A_API_KEY", "k1,k2,k3")])).unwrap();
    let sink = RecordingSink::default();

    // Act
    llm.run(Task::Analysis, &request(false), &sink)
        .await
        .expect("answer");

    // Assert: one attempt per key, in order, no pause within the round.
    let attempts: Vec<(Option<usize>, u32, u64, Outcome)> = sink
        .attempts()
        .iter()
        .map(|a| (a.key_index, a.attempt, a.wait_ms, a.outcome))
        .collect();
    assert_eq!(
        attempts,
        [
            (Some(0), 1, 0, Outcome::Retryable),
            (Some(1), 1, 0, Outcome::Retryable),
            (Some(2), 1, 0, Outcome::Ok)
        ]
    );
}

/// An OpenAI-style server whose first answer is a 429 with `Retry-After: retry_after`,
/// and every later one a completion.
async fn one_429_then_answers(retry_after: &str) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            json_reply(429, "openai/rate_limited.json").insert_header("retry-after", retry_after),
        )
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(json_reply(200, "openai/chat_completion.json"))
        .mount(&server)
        .await;
    server
}

#[tokio::test]
async fn retry_after_is_a_lower_bound_on_the_wait() {
    let server = one_429_then_answers("1").await;
    let retry = retry_with(&[("max_delay_ms", "2000")]);
    let llm = llm(&config(&[&server], &[("a", "m1")], &retry));
    let sink = RecordingSink::default();

    let started = Instant::now();
    llm.run(Task::Analysis, &request(false), &sink)
        .await
        .expect("answer");

    assert!(started.elapsed() >= Duration::from_secs(1));
    let attempts = sink.attempts();
    assert_eq!(attempts.len(), 2);
    assert!(attempts[1].wait_ms >= 1000, "{attempts:?}");
    assert_eq!(attempts[0].http_status, Some(429));
}

/// A 429 that names a wait longer than `spill_after_ms` but well within the deadline,
/// on the only step: no other step has budget, so the task waits for this one's
/// (within the deadline), rather than ending at once as if the budget would never return.
#[tokio::test]
async fn a_429_naming_a_wait_within_the_deadline_is_waited_for_when_no_step_is_left() {
    let server = one_429_then_answers("2").await;
    let toml = config(&[&server], &[("a", "m1")], FAST_RETRY);
    let llm = Llm::new(&settings(&toml, &[("A_API_KEY", "k1")])).unwrap();
    let sink = RecordingSink::default();

    llm.run(Task::Analysis, &request(false), &sink)
        .await
        .expect("answered once the named wait is over");

    let sent: Vec<_> = sink
        .attempts()
        .into_iter()
        .filter(|a| a.http_status.is_some())
        .collect();
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert!(sent[1].wait_ms >= 1900, "sent after the wait: {sent:?}");
}

#[tokio::test]
async fn a_long_retry_after_cools_the_key_and_moves_on_at_once() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(header("authorization", "Bearer k1"))
        .respond_with(
            json_reply(429, "openai/rate_limited.json").insert_header("retry-after", "30"),
        )
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(header("authorization", "Bearer k2"))
        .respond_with(json_reply(200, "openai/chat_completion.json"))
        .mount(&server)
        .await;
    let toml = config(&[&server], &[("a", "m1")], FAST_RETRY);
    let llm = Llm::new(&settings(&toml, &[("A_API_KEY", "k1,k2")])).unwrap();
    let sink = RecordingSink::default();

    llm.run(Task::Analysis, &request(false), &sink)
        .await
        .expect("first");
    llm.run(Task::Analysis, &request(false), &sink)
        .await
        .expect("second");

    let attempts = sink.attempts();
    let k1_calls = attempts
        .iter()
        .filter(|a| {
            a.key_index == Some(0)
                && !matches!(a.outcome, Outcome::SkippedCooldown | Outcome::SkippedBudget)
        })
        .count();
    assert_eq!(
        k1_calls, 1,
        "k1's budget is spent after its 30 s Retry-After: {attempts:?}"
    );
    assert_eq!(attempts[1].key_index, Some(1));
    assert_eq!(attempts[1].wait_ms, 0, "no wait before the next key");
    assert_eq!(attempts[2].outcome, Outcome::SkippedBudget);
    assert_eq!(attempts[2].key_index, Some(0));
}

#[tokio::test]
async fn a_failed_step_is_skipped_by_the_next_task() {
    let dead = status_server(503).await;
    let good = ok_server().await;
    let llm = llm(&config(
        &[&dead, &good],
        &[("a", "m1"), ("b", "m2")],
        FAST_RETRY,
    ));
    let sink = RecordingSink::default();

    llm.run(Task::Analysis, &request(false), &sink)
        .await
        .expect("first");
    let after_first = calls(&dead).await;
    llm.run(Task::Analysis, &request(false), &sink)
        .await
        .expect("second");

    assert_eq!(after_first, 3, "max_attempts on the dead step");
    assert_eq!(calls(&dead).await, 3, "zero calls from the second task");
    assert_eq!(sink.count("m1", Outcome::SkippedCooldown), 1);
    assert_eq!(sink.count("m2", Outcome::Ok), 2);
}

/// "The bot's key was refused" only when no other step may still answer: a refused
/// key beside a step that was still on its way at the deadline (its attempt is in no
/// error list) is not a key to fix.
#[tokio::test]
async fn every_key_refused_only_when_no_step_can_answer_later() {
    let refused = status_server(401).await;
    let slow = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503).set_delay(Duration::from_secs(3)))
        .mount(&slow)
        .await;
    let retry = retry_with(&[("max_attempts", "1"), ("deadline_ms", "300")]);
    let only_refused = llm(&config(&[&refused], &[("a", "m1")], &retry));
    let refused_and_slow = llm(&config(
        &[&refused, &slow],
        &[("a", "m1"), ("b", "m2")],
        &retry,
    ));
    let sink = RecordingSink::default();

    let alone = only_refused
        .run(Task::Analysis, &request(false), &sink)
        .await
        .unwrap_err();
    let beside = refused_and_slow
        .run(Task::Analysis, &request(false), &sink)
        .await
        .unwrap_err();

    assert!(alone.every_key_refused(), "{alone}");
    assert!(beside.errors().iter().all(|a| a.error.is_bad_key()));
    assert!(!beside.every_key_refused(), "{beside}");
}

#[tokio::test]
async fn when_everything_cools_the_soonest_free_step_is_tried_once() {
    let first = status_server(503).await;
    let second = status_server(503).await;
    let retry = retry_with(&[("max_attempts", "2")]);
    let llm = llm(&config(
        &[&first, &second],
        &[("a", "m1"), ("b", "m2")],
        &retry,
    ));
    let sink = RecordingSink::default();

    let err = llm
        .run(Task::Analysis, &request(false), &sink)
        .await
        .unwrap_err();
    assert!(matches!(err, CascadeError::Exhausted { ref errors, .. } if errors.len() == 4));
    let err = llm
        .run(Task::Analysis, &request(false), &sink)
        .await
        .unwrap_err();

    assert!(matches!(err, CascadeError::Exhausted { ref errors, .. } if errors.len() == 1));
    assert_eq!(
        calls(&first).await,
        3,
        "m1 cooled first, so it is tried once more"
    );
    assert_eq!(calls(&second).await, 2);
}

#[tokio::test]
async fn the_deadline_bounds_a_task_with_slow_servers() {
    let slow = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            json_reply(200, "openai/chat_completion.json").set_delay(Duration::from_secs(3)),
        )
        .mount(&slow)
        .await;
    let retry = retry_with(&[("deadline_ms", "300")]);
    let llm = llm(&config(&[&slow], &[("a", "m1")], &retry));
    let sink = RecordingSink::default();

    let err = llm
        .run(Task::Analysis, &request(false), &sink)
        .await
        .unwrap_err();

    assert!(
        matches!(
            err,
            CascadeError::DeadlineExceeded {
                deadline_ms: 300,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(sink.outcomes(), [("m1".to_owned(), Outcome::Cancelled)]);
    assert!(err.to_string().contains("300ms"));
}

#[tokio::test]
async fn a_malformed_200_is_unusable_retried_once_then_next_step() {
    let broken = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_string("{\"choices\": \"oops\""))
        .mount(&broken)
        .await;
    let good = ok_server().await;
    let llm = llm(&config(
        &[&broken, &good],
        &[("a", "m1"), ("b", "m2")],
        FAST_RETRY,
    ));
    let sink = RecordingSink::default();

    let answer = llm
        .run(Task::Analysis, &request(false), &sink)
        .await
        .expect("answer");

    assert_eq!(answer.model, "m2");
    assert_eq!(calls(&broken).await, 2);
    assert_eq!(sink.count("m1", Outcome::Unusable), 2);
}

#[tokio::test]
async fn an_answer_without_the_json_asked_for_is_unusable_and_the_next_model_asked() {
    // A JSON-mode request (the metrics') answered by Qwen3 stopped by its token limit
    // inside its reasoning: a well-formed 200 whose text holds no JSON object.
    let reasoning = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
            "choices": [{"message": {"role": "assistant",
                "content": "<think>The entry says the run went well, so mood is"},
                "finish_reason": "length"}]
        })))
        .mount(&reasoning)
        .await;
    let good = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
            "choices": [{"message": {"role": "assistant", "content": "{\"mood\": 4}"},
                "finish_reason": "stop"}]
        })))
        .mount(&good)
        .await;
    let llm = llm(&config(
        &[&reasoning, &good],
        &[("a", "m1"), ("b", "m2")],
        FAST_RETRY,
    ));
    let sink = RecordingSink::default();

    let answer = llm
        .run_parsed(
            Task::Analysis,
            &request(true),
            &sink,
            &[],
            daylog::analysis::metrics::from_answer,
        )
        .await
        .expect("answer");

    assert_eq!(answer.model, "m2");
    assert_eq!(answer.value.mood(), 4);
    assert_eq!(sink.count("m1", Outcome::Unusable), 2);
    let reasons: Vec<String> = sink
        .attempts()
        .iter()
        .filter_map(|a| a.error.clone())
        .collect();
    assert!(
        reasons
            .iter()
            .all(|r| r.contains("the answer holds no JSON object")),
        "{reasons:?}"
    );
    // Prose is an answer where the caller takes any text.
    let sink = RecordingSink::default();
    let answer = llm
        .run(Task::Analysis, &request(true), &sink)
        .await
        .expect("answer");
    assert_eq!(answer.model, "m1");
}

#[tokio::test]
async fn a_server_that_never_answers_gets_one_attempt_then_the_next_step() {
    let stalled = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(30)))
        .mount(&stalled)
        .await;
    let good = ok_server().await;
    let retry = retry_with(&[("request_timeout_ms", "200")]);
    let llm = llm(&config(
        &[&stalled, &good],
        &[("a", "m1"), ("b", "m2")],
        &retry,
    ));
    let sink = RecordingSink::default();

    let answer = llm
        .run(Task::Analysis, &request(false), &sink)
        .await
        .expect("answer");
    llm.run(Task::Analysis, &request(false), &sink)
        .await
        .expect("second");

    assert_eq!(answer.model, "m2");
    assert_eq!(
        calls(&stalled).await,
        1,
        "no retry, and the step cools for everyone"
    );
    let attempts = sink.attempts();
    assert_eq!(attempts[0].outcome, Outcome::Timeout);
    assert_eq!(attempts[1].wait_ms, 0);
    assert_eq!(sink.count("m1", Outcome::SkippedCooldown), 1);
}

#[tokio::test]
async fn a_refused_connection_cools_the_step() {
    // A port that was just free: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let good = ok_server().await;
    let mut toml = FAST_RETRY.to_owned();
    toml.push_str(&provider(
        "a",
        "openai",
        &format!("http://127.0.0.1:{port}/v1"),
    ));
    toml.push_str(&provider("b", "openai", &format!("{}/v1", good.uri())));
    toml.push_str(&analysis_steps(&[("a", "m1"), ("b", "m2")]));
    let llm = llm(&toml);
    let sink = RecordingSink::default();

    let answer = llm
        .run(Task::Analysis, &request(false), &sink)
        .await
        .expect("answer");

    assert_eq!(answer.model, "m2");
    assert_eq!(sink.count("m1", Outcome::Timeout), 1);
}

#[tokio::test]
async fn hedging_answers_from_the_next_step_and_cancels_the_slow_one() {
    let slow = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            json_reply(200, "openai/chat_completion.json").set_delay(Duration::from_secs(3)),
        )
        .mount(&slow)
        .await;
    let fast = ok_server().await;
    let retry = retry_with(&[("hedge_after_ms", "300")]);
    let llm = llm(&config(
        &[&slow, &fast],
        &[("a", "m1"), ("b", "m2")],
        &retry,
    ));
    let sink = RecordingSink::default();

    let started = Instant::now();
    let answer = llm
        .run(Task::Analysis, &request(false), &sink)
        .await
        .expect("answer");
    let took = started.elapsed();

    assert_eq!(answer.model, "m2");
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert!(took >= Duration::from_millis(300), "took {took:?}");
    assert_eq!(
        sink.count("m1", Outcome::Cancelled),
        1,
        "{:?}",
        sink.attempts()
    );
    assert_eq!(sink.count("m2", Outcome::Ok), 1);
}

/// `primary` (model m1) before `fast` (m2), with auto hedging and `request_timeout_ms`.
fn auto_hedged(primary: &MockServer, fast: &MockServer, request_timeout_ms: u64) -> Llm {
    let timeout = request_timeout_ms.to_string();
    let retry = retry_with(&[
        ("hedge_after_ms", "\"auto\""),
        ("request_timeout_ms", timeout.as_str()),
    ]);
    llm(&config(
        &[primary, fast],
        &[("a", "m1"), ("b", "m2")],
        &retry,
    ))
}

#[tokio::test]
async fn auto_hedging_learns_a_steps_latency_and_hedges_when_it_turns_slow() {
    // Arrange: the primary answers five times at once, then takes 1.5 s. Before it has
    // learned, auto hedges only after 2 s, so the slow answer would still win.
    let primary = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(json_reply(200, "openai/chat_completion.json"))
        .up_to_n_times(5)
        .with_priority(1)
        .mount(&primary)
        .await;
    Mock::given(method("POST"))
        .respond_with(
            json_reply(200, "openai/chat_completion.json").set_delay(Duration::from_millis(1500)),
        )
        .mount(&primary)
        .await;
    let fast = ok_server().await;
    let llm = auto_hedged(&primary, &fast, 10000);
    let sink = RecordingSink::default();

    // Act
    let mut models = Vec::new();
    for _ in 0..6 {
        let answer = llm
            .run(Task::Analysis, &request(false), &sink)
            .await
            .expect("answer");
        models.push(answer.model);
    }

    // Assert: five answers from the primary taught it; the sixth, far slower, hedged.
    assert_eq!(models, ["m1", "m1", "m1", "m1", "m1", "m2"]);
    assert_eq!(
        sink.count("m1", Outcome::Cancelled),
        1,
        "{:?}",
        sink.attempts()
    );
}

/// A digest takes as long as its week: its slow answer is not judged by the latency
/// learned from analyses (it would hedge, and mark the step stalled for them) and does
/// not teach it.
#[tokio::test]
async fn auto_hedging_does_not_judge_a_digest_by_the_analyses_latency() {
    // Arrange: the primary answers analyses at once and the digest after 1.5 s.
    let primary = MockServer::start().await;
    Mock::given(method("POST"))
        .and(wiremock::matchers::body_string_contains("the-week"))
        .respond_with(
            json_reply(200, "openai/chat_completion.json").set_delay(Duration::from_millis(1500)),
        )
        .with_priority(1)
        .mount(&primary)
        .await;
    Mock::given(method("POST"))
        .respond_with(json_reply(200, "openai/chat_completion.json"))
        .mount(&primary)
        .await;
    let fast = ok_server().await;
    let llm = auto_hedged(&primary, &fast, 10000);
    let sink = RecordingSink::default();
    for _ in 0..5 {
        llm.run(Task::Analysis, &request(false), &sink)
            .await
            .expect("answer");
    }
    let week = daylog::llm::ChatRequest {
        user: "the-week".to_owned(),
        ..request(false)
    };

    // Act
    let digest = llm.run(Task::Digest, &week, &sink).await.expect("digest");
    let analysis = llm
        .run(Task::Analysis, &request(false), &sink)
        .await
        .expect("answer");

    // Assert: no hedge, and the primary still answers analyses.
    assert_eq!(digest.model, "m1", "{:?}", sink.attempts());
    assert_eq!(analysis.model, "m1", "{:?}", sink.attempts());
    assert_eq!(sink.count("m1", Outcome::Cancelled), 0);
    assert_eq!(calls(&fast).await, 0);
}

#[tokio::test]
async fn with_auto_hedging_one_request_that_finds_a_step_stalled_spares_the_next_ones() {
    // Arrange: the primary never answers in time; auto starts at half the request
    // timeout, before any latency is known.
    let stalled = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            json_reply(200, "openai/chat_completion.json").set_delay(Duration::from_secs(10)),
        )
        .mount(&stalled)
        .await;
    let fast = ok_server().await;
    let llm = auto_hedged(&stalled, &fast, 2000);
    let sink = RecordingSink::default();

    // Act: one request after another.
    for _ in 0..3 {
        let answer = llm
            .run(Task::Analysis, &request(false), &sink)
            .await
            .expect("answer");
        assert_eq!(answer.model, "m2");
    }

    // Assert: only the first request started on the stalled step (with a fixed
    // threshold it takes `failures_to_trip` of them, see the test below).
    assert_eq!(calls(&stalled).await, 1, "{:?}", sink.attempts());
    assert_eq!(sink.count("m1", Outcome::Cancelled), 1);
    assert_eq!(sink.count("m1", Outcome::SkippedCooldown), 2);
}

/// Entries sent to a primary that answers each one (by a word its request carries)
/// after its own delay, with a fast second step and auto hedging that has learned
/// nothing yet, so hedges at 2 s.
struct ByEntry {
    llm: Arc<Llm>,
    sink: Arc<RecordingSink>,
    _servers: (MockServer, MockServer),
}

impl ByEntry {
    async fn start(delays: &[(&str, Duration)]) -> Self {
        let primary = MockServer::start().await;
        for (word, delay) in delays {
            Mock::given(method("POST"))
                .and(wiremock::matchers::body_string_contains(*word))
                .respond_with(json_reply(200, "openai/chat_completion.json").set_delay(*delay))
                .mount(&primary)
                .await;
        }
        let fast = ok_server().await;
        let llm = Arc::new(auto_hedged(&primary, &fast, 30000));
        Self {
            llm,
            sink: Arc::new(RecordingSink::default()),
            _servers: (primary, fast),
        }
    }

    fn send(&self, word: &str) -> tokio::task::JoinHandle<Result<Completion, CascadeError>> {
        let (llm, sink) = (Arc::clone(&self.llm), Arc::clone(&self.sink));
        let request = daylog::llm::ChatRequest {
            user: word.to_owned(),
            ..request(false)
        };
        tokio::spawn(async move { llm.run(Task::Analysis, &request, &*sink).await })
    }
}

async fn model(task: tokio::task::JoinHandle<Result<Completion, CascadeError>>) -> String {
    task.await.expect("task").expect("answer").model
}

#[tokio::test]
async fn when_one_attempt_finds_a_step_stalled_the_attempts_waiting_on_it_hedge_too() {
    // Arrange: the primary holds the first entry for 10 s and would answer the second,
    // sent a second later, after 1.5 s.
    let run = ByEntry::start(&[
        ("first-entry", Duration::from_secs(10)),
        ("second-entry", Duration::from_millis(1500)),
    ])
    .await;

    // Act
    let first = run.send("first-entry");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let second = run.send("second-entry");

    // Assert: at 2 s the first attempt finds the step silent since it started, so the
    // second hedges then too, rather than at its own 2 s (3 s), after its answer (2.5 s).
    let models = [model(first).await, model(second).await];
    assert_eq!(models, ["m2", "m2"], "{:?}", run.sink.attempts());
    assert_eq!(run.sink.count("m1", Outcome::Cancelled), 2);
}

#[tokio::test]
async fn one_slow_attempt_on_a_step_that_keeps_answering_does_not_make_the_others_hedge() {
    // Arrange: as above, but a third entry, sent just after the first, is answered at
    // once: the step is slow for one request, not stalled.
    let run = ByEntry::start(&[
        ("first-entry", Duration::from_secs(10)),
        ("second-entry", Duration::from_millis(1500)),
        ("quick-entry", Duration::ZERO),
    ])
    .await;

    // Act
    let first = run.send("first-entry");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let quick = run.send("quick-entry");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let second = run.send("second-entry");

    // Assert: the first hedges on its own at 2 s; the second, still waiting on a step
    // that answered since the first started, keeps its own threshold and is answered.
    let models = [model(first).await, model(quick).await, model(second).await];
    assert_eq!(models, ["m2", "m1", "m1"], "{:?}", run.sink.attempts());
    assert_eq!(run.sink.count("m1", Outcome::Cancelled), 1);
}

#[tokio::test]
async fn twenty_concurrent_tasks_pay_for_a_dead_primary_once() {
    const TASKS: usize = 20;
    const MAX_ATTEMPTS: usize = 3;
    const FAILURES_TO_TRIP: usize = 3;
    let dead = status_server(503).await;
    let good = ok_server().await;
    let retry = retry_with(&[
        ("max_attempts", &MAX_ATTEMPTS.to_string()),
        ("failures_to_trip", &FAILURES_TO_TRIP.to_string()),
        ("duration_ms", "60000"),
    ]);
    // No concurrency cap (the default): every task may reach the dead primary at once,
    // the worst case for the bound.
    let toml = config(&[&dead, &good], &[("a", "m1"), ("b", "m2")], &retry);
    let llm = Arc::new(llm(&toml));
    let sink = Arc::new(RecordingSink::default());

    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (llm, sink) = (Arc::clone(&llm), Arc::clone(&sink));
            tokio::spawn(async move { llm.run(Task::Analysis, &request(false), &*sink).await })
        })
        .collect();
    for task in futures::future::join_all(tasks).await {
        assert_eq!(task.unwrap().expect("answer").model, "m2");
    }

    // The most the dead primary can be asked, and why:
    // - every task's first attempt may be sent before any answer came back (no cap):
    //   TASKS calls, which no cooldown can prevent;
    // - a retry is sent only after that task's own failure and a fresh look at the shared
    //   cooldown. The one key trips at the FAILURES_TO_TRIP-th failure in a row across
    //   all tasks and then stays cool for the whole test (60 s), so only the failures
    //   before the trip, FAILURES_TO_TRIP - 1 of them, can each lead to one more call
    //   (a failure that follows the trip changes nothing);
    // - MAX_ATTEMPTS caps the retries per task at MAX_ATTEMPTS - 1, which does not bind
    //   here: one task may make both extra calls.
    // 20 + 2 = 22; typically it is 20, as the first answers trip the key long before any
    // backoff (10–50 ms) ends. And at least FAILURES_TO_TRIP: nothing cools the key
    // before that many failures (a task's rounds run out only after as many).
    let bound = TASKS + (FAILURES_TO_TRIP - 1).min(TASKS * (MAX_ATTEMPTS - 1));
    let dead_calls = calls(&dead).await;
    assert!(
        (FAILURES_TO_TRIP..=bound).contains(&dead_calls),
        "{dead_calls} calls to the dead primary, expected {FAILURES_TO_TRIP}..={bound}"
    );
}

#[tokio::test]
async fn a_gemini_prompt_block_ends_the_task_as_blocked_without_retry() {
    let gemini = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(json_reply(200, "gemini/blocked_prompt.json"))
        .mount(&gemini)
        .await;
    let mut toml = FAST_RETRY.to_owned();
    toml.push_str(&provider("gemini", "gemini", &gemini.uri()));
    toml.push_str(&analysis_steps(&[("gemini", "gemini-2.5-flash")]));
    let llm = Llm::new(&settings(&toml, &[("GEMINI_API_KEY", "g1,g2")])).unwrap();
    let sink = RecordingSink::default();

    let err = llm
        .run(Task::Analysis, &request(false), &sink)
        .await
        .unwrap_err();

    assert!(err.is_blocked(), "{err}");
    assert!(err.to_string().contains("SAFETY"), "{err}");
    assert_eq!(
        calls(&gemini).await,
        1,
        "no retry, not even with the second key"
    );
    assert_eq!(
        sink.outcomes(),
        [("gemini-2.5-flash".to_owned(), Outcome::Blocked)]
    );
}

#[tokio::test]
async fn a_gemini_blocked_candidate_falls_through_to_the_next_step() {
    let gemini = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(json_reply(200, "gemini/blocked_candidate.json"))
        .mount(&gemini)
        .await;
    let good = ok_server().await;
    let mut toml = FAST_RETRY.to_owned();
    toml.push_str(&provider("gemini", "gemini", &gemini.uri()));
    toml.push_str(&provider("a", "openai", &format!("{}/v1", good.uri())));
    toml.push_str(&analysis_steps(&[
        ("gemini", "gemini-2.5-flash"),
        ("a", "m2"),
    ]));
    let llm = Llm::new(&settings(
        &toml,
        &[("GEMINI_API_KEY", "g1"), ("A_API_KEY", "k")],
    ))
    .unwrap();
    let sink = RecordingSink::default();

    let answer = llm
        .run(Task::Analysis, &request(false), &sink)
        .await
        .expect("answer");

    assert_eq!(answer.model, "m2");
    assert_eq!(calls(&gemini).await, 1);
    assert_eq!(sink.count("gemini-2.5-flash", Outcome::Blocked), 1);
}

#[tokio::test]
async fn missing_keys_mean_no_usable_provider() {
    let server = ok_server().await;
    let toml = config(&[&server], &[("a", "m1")], FAST_RETRY);
    let llm = Llm::new(&settings(&toml, &[])).unwrap();

    let err = llm
        .run(Task::Analysis, &request(false), &daylog::llm::NullSink)
        .await
        .unwrap_err();

    assert!(matches!(err, CascadeError::NoUsableProvider));
    assert_eq!(calls(&server).await, 0);
}

#[tokio::test]
async fn the_gemini_claude_example_falls_back_to_claude() {
    // Arrange: the shipped example, pointed at fakes, with its 2 s pause shortened.
    let gemini = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/models/gemini-2.5-flash:generateContent"))
        .respond_with(json_reply(503, "gemini/unavailable.json"))
        .mount(&gemini)
        .await;
    let claude = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .respond_with(json_reply(200, "anthropic/message.json"))
        .mount(&claude)
        .await;
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/examples/gemini-claude.toml");
    let claude_url = format!("{}/v1", claude.uri());
    let settings = settings_from_file(
        &example,
        &[
            ("DAYLOG__PROVIDERS__GEMINI__BASE_URL", gemini.uri().as_str()),
            (
                "DAYLOG__PROVIDERS__ANTHROPIC__BASE_URL",
                claude_url.as_str(),
            ),
            ("DAYLOG__RETRY__MIN_DELAY_MS", "20"),
            ("DAYLOG__RETRY__MAX_DELAY_MS", "20"),
            ("GEMINI_API_KEY", "g1"),
            ("GEMINI_API_KEY_2", "g2"),
            ("GEMINI_API_KEY_3", "g3"),
            ("ANTHROPIC_API_KEY", "a1"),
        ],
    );
    let llm = Llm::new(&settings).unwrap();
    let sink = RecordingSink::default();

    // Act
    let answer = llm
        .run(Task::Analysis, &request(false), &sink)
        .await
        .expect("answer");

    // Assert: keys 1–3, one pause, keys 1–3, then Claude answered.
    assert_eq!(answer.provider, "anthropic");
    assert!(answer.text.starts_with("Sounds like a full day"));
    assert_eq!(calls(&gemini).await, 6);
    let per_key: Vec<(Option<usize>, u32, bool)> = sink
        .attempts()
        .iter()
        .filter(|a| a.provider == "gemini")
        .map(|a| (a.key_index, a.attempt, a.wait_ms > 0))
        .collect();
    assert_eq!(
        per_key,
        [
            (Some(0), 1, false),
            (Some(1), 1, false),
            (Some(2), 1, false),
            (Some(0), 2, true),
            (Some(1), 2, false),
            (Some(2), 2, false)
        ],
        "(key, round, paused before it)"
    );
    assert_eq!(calls(&claude).await, 1);
}

#[tokio::test]
async fn a_stalled_primary_that_hedging_always_outruns_still_cools_down() {
    // Arrange: the primary never answers in time; the hedge always wins.
    let stalled = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            json_reply(200, "openai/chat_completion.json").set_delay(Duration::from_secs(10)),
        )
        .mount(&stalled)
        .await;
    let fast = ok_server().await;
    let retry = retry_with(&[("hedge_after_ms", "100")]);
    let llm = llm(&config(
        &[&stalled, &fast],
        &[("a", "m1"), ("b", "m2")],
        &retry,
    ));

    // Act: more requests than `failures_to_trip`, one after another.
    for _ in 0..5 {
        let answer = llm
            .run(Task::Analysis, &request(false), &NullSink)
            .await
            .expect("answer");
        assert_eq!(answer.model, "m2");
    }

    // Assert: after three slow, out-raced attempts the primary is skipped.
    assert_eq!(calls(&stalled).await, 3, "tripped after failures_to_trip");
}

#[tokio::test]
async fn when_the_hedge_fails_fast_the_third_step_does_not_wait_for_the_stalled_first() {
    let stalled = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            json_reply(200, "openai/chat_completion.json").set_delay(Duration::from_secs(10)),
        )
        .mount(&stalled)
        .await;
    let broken = status_server(400).await;
    let good = ok_server().await;
    let retry = retry_with(&[("hedge_after_ms", "200")]);
    let llm = llm(&config(
        &[&stalled, &broken, &good],
        &[("a", "m1"), ("b", "m2"), ("c", "m3")],
        &retry,
    ));

    let sink = RecordingSink::default();
    let answer = llm
        .run(Task::Analysis, &request(false), &sink)
        .await
        .expect("answer");

    assert_eq!(answer.model, "m3");
    // Had m3 waited for m1, m1 would have run into its request timeout first.
    assert_eq!(
        sink.count("m1", Outcome::Cancelled),
        1,
        "{:?}",
        sink.attempts()
    );
    assert_eq!(
        sink.count("m1", Outcome::Timeout),
        0,
        "{:?}",
        sink.attempts()
    );
}

#[tokio::test]
async fn a_block_is_not_final_while_another_step_failed_only_for_now() {
    let gemini = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(json_reply(200, "gemini/blocked_prompt.json"))
        .mount(&gemini)
        .await;
    let overloaded = status_server(503).await;
    let mut toml = FAST_RETRY.to_owned();
    toml.push_str(&provider("gemini", "gemini", &gemini.uri()));
    toml.push_str(&provider(
        "a",
        "openai",
        &format!("{}/v1", overloaded.uri()),
    ));
    toml.push_str(&analysis_steps(&[
        ("gemini", "gemini-2.5-flash"),
        ("a", "m2"),
    ]));
    let llm = Llm::new(&settings(
        &toml,
        &[("GEMINI_API_KEY", "g1"), ("A_API_KEY", "k")],
    ))
    .unwrap();

    let err = llm
        .run(Task::Analysis, &request(false), &NullSink)
        .await
        .unwrap_err();

    assert!(
        !err.is_blocked(),
        "the 503 step may answer on a later round, so the log must stay pending: {err}"
    );
    // Its key now cools down: skipped, not asked, and still no reason for a final block.
    let sink = RecordingSink::default();
    let err = llm
        .run(Task::Analysis, &request(false), &sink)
        .await
        .unwrap_err();
    assert_eq!(
        sink.count("m2", Outcome::SkippedCooldown),
        1,
        "{:?}",
        sink.attempts()
    );
    assert!(
        !err.is_blocked(),
        "a step cooling down may answer later, so the log must stay pending: {err}"
    );
}

/// A step skipped while cooling, then asked after all (the forced attempt, as no other
/// step is left) and refusing: it has had its say, and the block is final.
#[tokio::test]
async fn a_block_is_final_when_the_cooling_step_is_asked_after_all_and_refuses() {
    let gemini = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503).set_body_string("{\"message\":\"busy\"}"))
        .mount(&gemini)
        .await;
    let mut toml = FAST_RETRY.to_owned();
    toml.push_str(&provider("gemini", "gemini", &gemini.uri()));
    toml.push_str(&analysis_steps(&[("gemini", "gemini-2.5-flash")]));
    let llm = Llm::new(&settings(&toml, &[("GEMINI_API_KEY", "g1")])).unwrap();
    let first = llm
        .run(Task::Analysis, &request(false), &NullSink)
        .await
        .unwrap_err();
    assert!(!first.is_blocked(), "{first}");

    // Its key now cools down; the model refuses the text.
    gemini.reset().await;
    Mock::given(method("POST"))
        .respond_with(json_reply(200, "gemini/blocked_prompt.json"))
        .mount(&gemini)
        .await;
    let sink = RecordingSink::default();
    let second = llm
        .run(Task::Analysis, &request(false), &sink)
        .await
        .unwrap_err();
    assert_eq!(
        sink.count("gemini-2.5-flash", Outcome::Blocked),
        1,
        "{:?}",
        sink.attempts()
    );
    assert!(second.is_blocked(), "the only step refused: {second}");
}

#[tokio::test]
async fn a_block_stays_final_when_the_other_step_was_only_skipped_for_a_bad_key() {
    // Step 1's key is refused (cooled for every later request); Gemini blocks.
    let refused = status_server(401).await;
    let gemini = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(json_reply(200, "gemini/blocked_prompt.json"))
        .mount(&gemini)
        .await;
    let mut toml = FAST_RETRY.to_owned();
    toml.push_str(&provider("a", "openai", &format!("{}/v1", refused.uri())));
    toml.push_str(&provider("gemini", "gemini", &gemini.uri()));
    toml.push_str(&analysis_steps(&[
        ("a", "m1"),
        ("gemini", "gemini-2.5-flash"),
    ]));
    let llm = Llm::new(&settings(
        &toml,
        &[("A_API_KEY", "revoked"), ("GEMINI_API_KEY", "g")],
    ))
    .unwrap();

    let first = llm
        .run(Task::Analysis, &request(false), &NullSink)
        .await
        .unwrap_err();
    let second = llm
        .run(Task::Analysis, &request(false), &NullSink)
        .await
        .unwrap_err();

    assert!(first.is_blocked(), "{first}");
    assert!(
        second.is_blocked(),
        "the bad key's cooldown is no reason to retry: {second}"
    );
}
